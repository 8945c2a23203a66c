"""skiff.aio against mem:// and a real node: coroutines and async
iterators driven by the event loop (no thread per call)."""

import asyncio
import threading
import uuid

import pytest

import skiff
import skiff.aio


@pytest.fixture
def subj():
    return "a" + uuid.uuid4().hex[:12]


async def test_publish_subscribe_async_for(locator, subj):
    async with await skiff.aio.connect(locator) as c:
        sub = await c.subscribe(f"{subj}.>")
        for i in range(2000):
            await c.publish(f"{subj}.x", str(i).encode(), type="n", fields={"i": i})
        got = []
        async for m in sub:
            assert m.fields["i"] == int(m.data)
            got.append(int(m.data))
            if len(got) == 2000:
                break
        assert got == list(range(2000))
        with pytest.raises(skiff.TimeoutError):
            await sub.next(timeout=0.1)
        sub.unsubscribe()
        with pytest.raises(skiff.ConnectionClosed):
            await sub.next(timeout=1)


async def test_no_thread_per_call(locator, subj):
    async with await skiff.aio.connect(locator) as c:
        sub = await c.subscribe(subj)
        before = threading.active_count()
        for i in range(200):
            await c.publish(subj, b"x")
            await sub.next(timeout=5)
            await c.flush()
        assert threading.active_count() <= before


async def test_pause_resume_and_callback(locator, subj):
    async with await skiff.aio.connect(locator) as c:
        sub = await c.subscribe(subj)
        sub.pause()
        await c.publish(subj, b"1")
        await c.flush()
        with pytest.raises(skiff.TimeoutError):
            await sub.next(timeout=0.2)
        asyncio.get_running_loop().call_later(0.1, sub.resume)
        assert (await sub.next(timeout=5)).data == b"1"

        got = asyncio.Queue()

        async def on(m):
            await got.put(m.data)

        cb = await c.subscribe(f"{subj}.cb", callback=on)
        await c.publish(f"{subj}.cb", b"via callback")
        assert await asyncio.wait_for(got.get(), 5) == b"via callback"
        cb.unsubscribe()


async def test_request_respond_many_and_no_responders(locator, subj):
    async with await skiff.aio.connect(locator) as c:
        svc = await c.subscribe(f"{subj}.svc")

        async def serve():
            async for r in svc:
                await skiff.aio.respond(r, b"re:" + r.data)

        task = asyncio.create_task(serve())
        assert (await c.request(f"{subj}.svc", b"q", timeout=5)).data == b"re:q"
        many = await c.request_many(f"{subj}.svc", b"m", timeout=1, max=5)
        assert [m.data for m in many] == [b"re:m"]
        with pytest.raises(skiff.NoResponders):
            await c.request(f"{subj}.none", b"", timeout=2)
        task.cancel()


async def test_cluster_broadcast_tunnel_and_stats(locator, subj):
    cl = f"{subj}.cl"
    async with await skiff.aio.connect(locator) as c, await skiff.aio.connect(locator) as other:
        member = await other.join(cl, capacity=2)
        seen = []

        async def serve():
            async for item in member:
                if isinstance(item, skiff.aio.Tunnel):
                    async for data in item:
                        await item.send(data[::-1])
                elif item.reply:
                    await item.respond_async(b"ok")
                else:
                    seen.append(item.data)

        task = asyncio.create_task(serve())
        assert (await c.request(cl, b"", cluster=True, timeout=5)).data == b"ok"
        await c.broadcast(cl, b"b")
        t = await c.tunnel(cl, timeout=5)
        await t.write(b"abc")
        assert await t.read() == b"cba"
        await t.send(b"xyz")
        assert await t.recv(timeout=5) == b"zyx"
        t.close()
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
        assert seen == [b"b"]
        s = await c.stats()
        assert "clients" in s
        member.leave()
        task.cancel()


async def test_async_queue(subj):
    a = skiff.aio.Queue("udp://127.0.0.1:0")
    b = skiff.aio.Queue("udp://127.0.0.1:0")
    a.push(b.local_addr, b"over udp", subject="q")
    await a.flush()
    m = await b.pop(timeout=5)
    assert (m.subject, m.data) == ("q", b"over udp")
    with pytest.raises(skiff.TimeoutError):
        await b.pop(timeout=0.1)
