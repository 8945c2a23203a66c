"""nats-py (PyPI) against skiff nodes' NATS listeners: run by tests/nats/run.sh.

Environment: NATS_A, NATS_B (two meshed nodes), SKIFF_A, SKIFF_B (the same
nodes for skiff's own clients), SKIFF (the skiff binary), NATS_C, NATS_D and
KILL_C (two more nodes, the pid of the first, for reconnection).
"""
import asyncio
import os
import signal
import ssl
import subprocess
import sys

import nats
from nats.errors import NoRespondersError

E = os.environ
SKIFF = E["SKIFF"]
passed = 0


def check(cond, what):
    global passed
    if not cond:
        print(f"FAIL nats-py: {what}", flush=True)
        sys.exit(1)
    passed += 1


async def until(pred, what, secs=5.0):
    for _ in range(int(secs / 0.05)):
        if pred():
            return
        await asyncio.sleep(0.05)
    check(False, f"timed out: {what}")


async def skiff(*args):
    """Runs the skiff CLI without blocking the event loop; its output."""
    p = await asyncio.create_subprocess_exec(SKIFF, *args, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(p.communicate(), 15)
    return out.decode()


async def collect(nc, subject, queue=""):
    got = []

    async def cb(m):
        got.append(m)

    sub = await nc.subscribe(subject, queue=queue, cb=cb)
    await nc.flush()
    return sub, got


async def local(nc):
    # Wildcards.
    _, star = await collect(nc, "py.*.x")
    _, tail = await collect(nc, "py.>")
    for s in ["py.a.x", "py.b.x", "py.a.y", "other"]:
        await nc.publish(s, s.encode())
    await until(lambda: len(star) == 2 and len(tail) == 3, "wildcards")
    check(sorted(m.subject for m in star) == ["py.a.x", "py.b.x"], "* matches one token")

    # Queue groups: each message to one member.
    _, q1 = await collect(nc, "py.q", queue="workers")
    _, q2 = await collect(nc, "py.q", queue="workers")
    _, plain = await collect(nc, "py.q")
    for i in range(100):
        await nc.publish("py.q", str(i).encode())
    await until(lambda: len(q1) + len(q2) == 100 and len(plain) == 100, "queue group")
    check(q1 and q2, "both members of the queue group got messages")
    check(sorted(int(m.data) for m in q1 + q2) == list(range(100)), "each message once to the group")

    # Request/reply and no responders.
    async def answer(m):
        await m.respond(b"re:" + m.data)

    await nc.subscribe("py.svc", cb=answer)
    r = await nc.request("py.svc", b"one", timeout=3)
    check(r.data == b"re:one", "request/reply")
    try:
        await nc.request("nobody.py", b"x", timeout=3)
        check(False, "no responders error")
    except NoRespondersError:
        check(True, "no responders")

    # Headers both ways.
    _, h = await collect(nc, "py.h")
    await nc.publish("py.h", b"b", headers={"Trace-Id": "abc", "K": "v"})
    await until(lambda: h, "headers")
    check(h[0].headers == {"Trace-Id": "abc", "K": "v"}, f"headers kept: {h[0].headers}")

    # UNSUB with a count.
    got = []

    async def cb(m):
        got.append(m)

    s = await nc.subscribe("py.max", cb=cb)
    await s.unsubscribe(limit=3)
    for i in range(10):
        await nc.publish("py.max", b"m")
    await nc.flush()
    await asyncio.sleep(0.3)
    check(len(got) == 3, f"UNSUB 3 delivered {len(got)}")

    # A large payload (1 MiB less headroom, under max_payload).
    big = os.urandom(1000 * 1000)
    _, b = await collect(nc, "py.big")
    await nc.publish("py.big", big)
    await until(lambda: b, "large payload")
    check(b[0].data == big, "large payload intact")

    # Drain: a subscription drained gets what was published before.
    nc2 = await nats.connect(E["NATS_A"])
    _, d = await collect(nc2, "py.drain")
    for i in range(50):
        await nc.publish("py.drain", b"d")
    await nc.flush()
    await asyncio.sleep(0.2)
    await nc2.drain()
    check(len(d) == 50, f"drain delivered {len(d)} of 50")


async def skiff_interop(nc):
    # skiff -> NATS, with the type as a header.
    _, got = await collect(nc, "py.s2n")
    await skiff("pub", "-n", E["SKIFF_A"], "py.s2n", "from-skiff", "--type", "greet")
    await until(lambda: got, "skiff pub -> nats sub")
    check(got[0].data == b"from-skiff", "skiff payload")
    check((got[0].headers or {}).get("Skiff-Type") == "greet", f"skiff type as header: {got[0].headers}")

    # NATS -> skiff.
    p = subprocess.Popen([SKIFF, "sub", "-n", E["SKIFF_A"], "py.n2s", "--count", "1"], stdout=subprocess.PIPE, text=True)
    for _ in range(100):
        await nc.publish("py.n2s", b"from-nats")
        await asyncio.sleep(0.05)
        if p.poll() is not None:
            break
    out = p.communicate(timeout=5)[0]
    check("from-nats" in out, f"nats pub -> skiff sub: {out!r}")

    # skiff request -> NATS responder.
    async def answer(m):
        await m.respond(b"nats-answer")

    await nc.subscribe("py.ask-nats", cb=answer)
    await nc.flush()
    out = await skiff("req", "-n", E["SKIFF_A"], "py.ask-nats", "q")
    check("nats-answer" in out, f"skiff req -> nats: {out!r}")

    # NATS request -> skiff responder.
    p = subprocess.Popen([SKIFF, "reply", "-n", E["SKIFF_A"], "py.ask-skiff", "skiff-answer", "--count", "1"])
    for _ in range(100):
        try:
            r = await nc.request("py.ask-skiff", b"q", timeout=1)
            break
        except (NoRespondersError, nats.errors.TimeoutError):
            await asyncio.sleep(0.05)
    check(r.data == b"skiff-answer", "nats req -> skiff reply")
    p.wait(timeout=5)


async def mesh():
    a = await nats.connect(E["NATS_A"])
    b = await nats.connect(E["NATS_B"])
    _, got = await collect(b, "py.mesh")

    async def answer(m):
        await m.respond(b"from-b")

    await b.subscribe("py.mesh.svc", cb=answer)
    await b.flush()
    for _ in range(200):
        await a.publish("py.mesh", b"x")
        await asyncio.sleep(0.05)
        if got:
            break
    check(got, "nats A -> nats B across the mesh")
    r = None
    for _ in range(100):
        try:
            r = await a.request("py.mesh.svc", b"q", timeout=1)
            break
        except (NoRespondersError, nats.errors.TimeoutError):
            await asyncio.sleep(0.05)
    check(r is not None and r.data == b"from-b", "request across the mesh")
    # skiff on A -> NATS on B, NATS on B -> skiff on A.
    _, got2 = await collect(b, "py.mesh.s2n")
    for _ in range(100):
        await skiff("pub", "-n", E["SKIFF_A"], "py.mesh.s2n", "m")
        await asyncio.sleep(0.05)
        if got2:
            break
    check(got2, "skiff A -> nats B")
    p = subprocess.Popen([SKIFF, "sub", "-n", E["SKIFF_A"], "py.mesh.n2s", "--count", "1"], stdout=subprocess.PIPE, text=True)
    for _ in range(200):
        await b.publish("py.mesh.n2s", b"from-b")
        await asyncio.sleep(0.05)
        if p.poll() is not None:
            break
    check("from-b" in p.communicate(timeout=5)[0], "nats B -> skiff A")
    await a.close()
    await b.close()


async def quiet(e):
    """nats-py prints every error it meets unless given a callback."""


async def auth():
    url = E["NATS_AUTH"]
    for bad in [{}, {"token": "nope"}, {"user": "alice", "password": "nope"}]:
        try:
            nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, error_cb=quiet, **bad)
            await nc.close()
            check(False, f"refused: {bad}")
        except Exception:
            check(True, "refused")
    tok = await nats.connect(url, token="tok")
    _, got = await collect(tok, "alice.>")
    alice = await nats.connect(url, user="alice", password="alice-pw")
    await alice.publish("alice.py", b"ok")
    await until(lambda: got, "alice's publish")
    await alice.close()
    await tok.close()


async def secure():
    """TLS: NATS_TLS requires it after INFO, NATS_TLS_FIRST wants it first."""
    ctx = ssl.create_default_context(cafile=E["NATS_CA"])
    try:
        nc = await nats.connect(E["NATS_TLS"], allow_reconnect=False, max_reconnect_attempts=0, error_cb=quiet)
        await nc.close()
        check(False, "a client without TLS refused on a TLS port")
    except Exception:
        check(True, "refused")
    nc = await nats.connect(E["NATS_TLS"], tls=ctx, error_cb=quiet)
    _, got = await collect(nc, "py.tls.*")

    async def answer(m):
        await m.respond(b"tls:" + m.data)

    await nc.subscribe("py.tlssvc", cb=answer)
    await nc.publish("py.tls.x", b"secret")
    await until(lambda: got, "publish/subscribe over TLS")
    check(got[0].data == b"secret", "payload over TLS")
    r = await nc.request("py.tlssvc", b"q", timeout=3)
    check(r.data == b"tls:q", f"request over TLS: {r.data!r}")
    await nc.close()
    first = await nats.connect(E["NATS_TLS_FIRST"], tls=ctx, tls_handshake_first=True, error_cb=quiet)
    _, got = await collect(first, "py.first")
    await first.publish("py.first", b"f")
    await until(lambda: got, "handshake_first")
    await first.close()


async def mesh_queue():
    """Queue subscribers on both meshed nodes: each message once to the group."""
    conns = [await nats.connect(E["NATS_A"])] + [await nats.connect(E["NATS_B"]) for _ in range(3)]
    boxes = [(await collect(c, "py.mq", queue="mq"))[1] for c in conns]
    _, plain = await collect(conns[1], "py.mq")
    pub = await nats.connect(E["NATS_A"])
    _, probe = await collect(conns[1], "py.mq.probe")
    for _ in range(200):
        await pub.publish("py.mq.probe", b"p")
        await asyncio.sleep(0.025)
        if probe:
            break
    await asyncio.sleep(0.5)
    n = 400
    for i in range(n):
        await pub.publish("py.mq", str(i).encode())
    await pub.flush()
    await until(lambda: sum(map(len, boxes)) >= n and len(plain) == n, "queue group across the mesh", 10)
    await asyncio.sleep(0.3)
    got = sorted(int(m.data) for b in boxes for m in b)
    check(got == list(range(n)), f"each message once to the group across the mesh ({len(got)} copies)")
    on_a = len(boxes[0])
    check(n // 10 <= on_a <= n * 2 // 5, f"A's member got {on_a} of {n}: {[len(b) for b in boxes]}")

    # Requests to a queue group: one member in the whole mesh is handed
    # each, and its reply crosses back.
    handed = [[] for _ in conns]
    rsubs = []
    for i, c in enumerate(conns):
        async def answer(m, i=i):
            handed[i].append(m.data)
            await m.respond(m.data)
        rsubs.append(await c.subscribe("py.mqr", queue="mqr", cb=answer))
        await c.flush()
    _, probe2 = await collect(conns[1], "py.mqr.probe")
    for _ in range(200):
        await pub.publish("py.mqr.probe", b"p")
        await asyncio.sleep(0.025)
        if probe2:
            break
    await asyncio.sleep(0.5)
    nr = 200
    for i in range(nr):
        r = await pub.request("py.mqr", str(i).encode(), timeout=5)
        check(r.data == str(i).encode(), f"the reply to request {i}")
    await asyncio.sleep(0.3)
    got = sorted(int(d) for h in handed for d in h)
    check(got == list(range(nr)), f"each request to one member of the group across the mesh ({len(got)} handed)")
    on_a = len(handed[0])
    check(nr // 10 <= on_a <= nr * 2 // 5, f"A's member was handed {on_a} of {nr}: {[len(h) for h in handed]}")
    for s in rsubs:
        await s.unsubscribe()
    for c in conns:
        await c.flush()
    none = False
    for _ in range(200):
        try:
            await pub.request("py.mqr", b"x", timeout=2)
        except NoRespondersError:
            none = True
            break
        await asyncio.sleep(0.025)
    check(none, "no responders once the group has no member")
    for c in conns + [pub]:
        await c.close()


async def reconnect():
    reconnected = asyncio.Event()

    async def on_reconnect():
        reconnected.set()

    nc = await nats.connect(servers=[E["NATS_C"], E["NATS_D"]], dont_randomize=True,
                            reconnected_cb=on_reconnect, error_cb=quiet, reconnect_time_wait=0.1, max_reconnect_attempts=50)
    _, got = await collect(nc, "py.re")
    os.kill(int(E["KILL_C"]), signal.SIGKILL)
    await asyncio.wait_for(reconnected.wait(), 10)
    check(nc.connected_url.port == int(E["NATS_D"].rsplit(":", 1)[1]), "reconnected to the second node")
    await nc.publish("py.re", b"after")
    await until(lambda: got, "subscription restored after reconnect")
    await nc.close()


async def main():
    nc = await nats.connect(E["NATS_A"])
    await local(nc)
    await skiff_interop(nc)
    await nc.close()
    await mesh()
    await mesh_queue()
    await secure()
    await auth()
    await reconnect()
    print(f"nats-py: {passed} checks passed", flush=True)


asyncio.run(main())
