"""asyncio: the same calls as coroutines and async iterators.
    python examples/python/aio_pubsub.py [locator]"""
import asyncio
import sys

import skiff.aio


async def main(loc: str) -> None:
    async with await skiff.aio.connect(loc) as c:
        sub = await c.subscribe("daq.>")
        svc = await c.subscribe("svc.time")

        async def serve():
            async for r in svc:
                await skiff.aio.respond(r, b"now")

        task = asyncio.create_task(serve())
        for i in range(3):
            await c.publish("daq.rate", str(i).encode())
        async for m in sub:
            print(m.subject, m.data)
            if m.data == b"2":
                break
        print((await c.request("svc.time", b"", timeout=2)).data)
        task.cancel()


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "mem://"))
