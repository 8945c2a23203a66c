"""Python pub->sub (8 B, 256 B) and sequential request/reply p50: skiff's
Python package through a skiff node, nats-py through nats-server, pyzmq
PUSH/PULL over TCP (no broker; no request row). Publisher and subscriber
are separate processes; the subscriber times from its first message to
its last. Run by bench/python.sh, which installs the peers.

    python bench/python_bench.py SKIFF_LOCATOR NATS_URL N
"""

import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import time


def skiff_sub(loc, subject, n, ready, out):
    import skiff

    c = skiff.connect(loc)
    sub = c.subscribe(subject, policy="block")
    ready.set()
    sub.next()
    t0 = time.perf_counter()
    for _ in range(n - 1):
        sub.next()
    out.put((n, time.perf_counter() - t0))


def skiff_pub(loc, subject, n, size):
    import skiff

    c = skiff.connect(loc)
    data = b"x" * size
    for _ in range(n):
        c.publish(subject, data)
    c.flush()
    c.close()


def nats_sub(url, subject, n, ready, out):
    import nats

    # The callback form: nats-py's fastest way to receive (next_msg costs
    # a future and a timer per message).
    async def main():
        nc = await nats.connect(url, pending_size=1 << 30)
        done = asyncio.Event()
        seen = [0, 0.0]

        async def cb(_m):
            seen[0] += 1
            if seen[0] == 1:
                seen[1] = time.perf_counter()
            elif seen[0] == n:
                done.set()

        await nc.subscribe(subject, cb=cb, pending_msgs_limit=n + 10, pending_bytes_limit=1 << 30)
        await nc.flush()
        ready.set()
        # nats-server drops for a slow consumer: stop after 3 s without
        # progress and report what arrived (the lost count is shown).
        last, last_t = -1, time.perf_counter()
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
            if seen[0] != last:
                last, last_t = seen[0], time.perf_counter()
            elif time.perf_counter() - last_t > 3:
                break
        end = last_t if not done.is_set() else time.perf_counter()
        out.put((seen[0], end - seen[1]))
        await nc.close()

    asyncio.run(main())


def nats_pub(url, subject, n, size):
    import nats

    async def main():
        nc = await nats.connect(url, pending_size=1 << 30)
        data = b"x" * size
        for _ in range(n):
            await nc.publish(subject, data)
        await nc.flush()
        await nc.close()

    asyncio.run(main())


def zmq_sub(port, _subject, n, ready, out):
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.setsockopt(zmq.RCVHWM, 0)
    s.bind(f"tcp://127.0.0.1:{port}")
    ready.set()
    s.recv()
    t0 = time.perf_counter()
    for _ in range(n - 1):
        s.recv()
    out.put((n, time.perf_counter() - t0))


def zmq_pub(port, _subject, n, size):
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.SNDHWM, 0)
    s.connect(f"tcp://127.0.0.1:{port}")
    data = b"x" * size
    for _ in range(n):
        s.send(data)
    s.close(linger=-1)
    ctx.term()


def pubsub(sub_fn, pub_fn, target, n, size):
    ready, out = mp.Event(), mp.Queue()
    p = mp.Process(target=sub_fn, args=(target, "bench.ps", n, ready, out))
    p.start()
    ready.wait(30)
    time.sleep(0.2)
    pub_fn(target, "bench.ps", n, size)
    got, secs = out.get(timeout=600)
    p.join()
    if got < n:
        print(f"{sub_fn.__name__}: {n - got} of {n} messages lost", file=sys.stderr)
    return (got - 1) / secs


def skiff_responder(loc, ready):
    import skiff

    c = skiff.connect(loc)
    sub = c.subscribe("bench.req")
    ready.set()
    for m in sub:
        m.respond(m.data)


def nats_responder(url, ready):
    import nats

    async def main():
        nc = await nats.connect(url)

        async def cb(m):
            await m.respond(m.data)

        await nc.subscribe("bench.req", cb=cb)
        await nc.flush()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def skiff_requests(loc, n):
    import skiff

    c = skiff.connect(loc)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.request("bench.req", b"12345678", timeout=5)
        lat.append(time.perf_counter() - t0)
    return lat


def nats_requests(url, n):
    import nats

    async def main():
        nc = await nats.connect(url)
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            await nc.request("bench.req", b"12345678", timeout=5)
            lat.append(time.perf_counter() - t0)
        await nc.close()
        return lat

    return asyncio.run(main())


def request_p50(responder, requests, target, n):
    ready = mp.Event()
    p = mp.Process(target=responder, args=(target, ready), daemon=True)
    p.start()
    ready.wait(30)
    time.sleep(0.2)
    requests(target, 200)  # warm up
    lat = requests(target, n)
    p.terminate()
    return statistics.median(lat) * 1e6


def main():
    # Each peer's client runs threads (skiff's runtime, pyzmq's I/O thread):
    # children are spawned, never forked from a process that has them.
    mp.set_start_method("spawn")
    loc, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        zport = s.getsockname()[1]
    rows = []
    for size in (8, 256):
        rows.append({"what": f"pub->sub {size} B msgs/s", "skiff": pubsub(skiff_sub, skiff_pub, loc, n, size),
                     "nats-py": pubsub(nats_sub, nats_pub, url, n, size),
                     "pyzmq": pubsub(zmq_sub, zmq_pub, zport, n, size)})
    rows.append({"what": "request p50 us", "skiff": request_p50(skiff_responder, skiff_requests, loc, 5000),
                 "nats-py": request_p50(nats_responder, nats_requests, url, 5000), "pyzmq": None})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
