"""skiff for asyncio: the blocking API's names as coroutines and async
iterators, native to the event loop.

No thread per call: each call is a Rust future on skiff's runtime, and
the runtime resolves the awaiting asyncio future with the loop's
``call_soon_threadsafe`` when it finishes. A subscription hands over
every message already here per wake-up, so an ``async for`` costs one
loop wake-up per batch, not per message::

    import asyncio, skiff.aio

    async def main():
        async with await skiff.aio.connect("mem://") as c:
            sub = await c.subscribe("daq.>")
            await c.publish("daq.rate", b"42")
            async for m in sub:
                print(m.subject, m.data)
                break

    asyncio.run(main())
"""

import asyncio
import collections
import json
from typing import Any, AsyncIterator, Callable, Deque, Dict, List, Optional, Tuple, Union

from skiff import _skiff
from skiff._errors import ConnectionClosed, TimeoutError
from skiff._skiff import Message

__all__ = ["connect", "Client", "Subscription", "Member", "Tunnel", "Queue", "Message"]

Buffer = Union[bytes, bytearray, memoryview]
_BATCH = 1024


async def connect(locator: Optional[str] = None, **options: Any) -> "Client":
    """Connects to a node (``skiff://host:port[,host:port...]``,
    ``unix:///path``, ``shm://name``, ``mem://``, ``file:///path``);
    options ride as query parameters (``ping=100ms``...). The default is
    $SKIFF_NODE, else ``skiff://127.0.0.1:4747``."""
    raw = await _skiff.connect_async(locator, **options)
    return Client(raw)


class Client:
    """A connection to a node, for asyncio. ``async with`` closes it."""

    def __init__(self, raw: "_skiff.Client") -> None:
        self._c = raw

    @property
    def raw(self) -> "_skiff.Client":
        """The blocking :class:`skiff.Client` underneath (same connection)."""
        return self._c

    @property
    def id(self) -> int:
        return int(self._c.id)

    @property
    def max_payload(self) -> int:
        return int(self._c.max_payload)

    async def publish(self, subject: str, data: Buffer, *, type: Optional[str] = None,
                      fields: Optional[Dict[str, Any]] = None, reliable: bool = True) -> None:
        """Publishes ``data`` on ``subject``; returns at once when the
        message fits the write buffer, else waits for room. ``reliable=False``:
        best effort between nodes (datagrams, loss counted)."""
        fut = self._c.publish_async(subject, data, type=type, fields=fields, reliable=reliable)
        if fut is not None:
            await fut

    async def flush(self) -> None:
        """Waits until the node handled everything sent before."""
        await self._c.flush_async()

    async def subscribe(self, pattern: str, *, type: Optional[str] = None, policy: Optional[str] = None,
                        queue: int = 65536, window: int = 4096,
                        callback: Optional[Callable[[Message], Any]] = None,
                        cmsg: bool = False, reliable: bool = True,
                        queue_group: Optional[str] = None) -> "Subscription":
        """Subscribes (see :meth:`skiff.Client.subscribe`). With
        ``callback`` (a function or a coroutine function), a task calls it
        for each message."""
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable, not {type(callback).__name__}")
        raw = await self._c.subscribe_async(pattern, type=type, policy=policy, queue=queue, window=window,
                                            cmsg=cmsg, reliable=reliable, queue_group=queue_group)
        sub = Subscription(raw)
        if callback is not None:
            sub._task = asyncio.get_running_loop().create_task(sub._run(callback))
        return sub

    async def request(self, subject: str, data: Buffer = b"", *, timeout: float = 5.0,
                      type: Optional[str] = None, fields: Optional[Dict[str, Any]] = None,
                      cluster: bool = False, key: Optional[Buffer] = None) -> Message:
        """The first reply (see :meth:`skiff.Client.request`)."""
        return await self._c.request_async(subject, data, timeout=timeout, type=type, fields=fields,  # type: ignore[no-any-return]
                                           cluster=cluster, key=key)

    async def request_many(self, subject: str, data: Buffer = b"", *, timeout: float = 1.0,
                           max: int = 65535, type: Optional[str] = None,
                           fields: Optional[Dict[str, Any]] = None, cluster: bool = False) -> List[Message]:
        """Scatter-gather (see :meth:`skiff.Client.request_many`)."""
        return await self._c.request_many_async(subject, data, timeout=timeout, max=max,  # type: ignore[no-any-return]
                                                type=type, fields=fields, cluster=cluster)

    async def join(self, cluster: str, *, capacity: int = 1) -> "Member":
        """Joins ``cluster`` (see :meth:`skiff.Client.join`)."""
        return Member(await self._c.join_async(cluster, capacity=capacity))

    async def broadcast(self, cluster: str, data: Buffer, *, type: Optional[str] = None,
                        fields: Optional[Dict[str, Any]] = None) -> None:
        """Sends ``data`` to every member of ``cluster``, at most once each."""
        await self._c.broadcast_async(cluster, data, type=type, fields=fields)

    async def tunnel(self, cluster: str, *, timeout: float = 5.0, key: Optional[Buffer] = None) -> "Tunnel":
        """Opens a tunnel to one member of ``cluster``."""
        return Tunnel(await self._c.tunnel_raw_async(cluster, timeout=timeout, key=key))

    async def stats(self) -> Dict[str, Any]:
        """The node's counters as a dict."""
        return json.loads(await self._c.stats_json_async())  # type: ignore[no-any-return]

    def link_stats(self) -> Dict[str, Any]:
        """This client's own counters (failovers, held, refused)."""
        return self._c.link_stats()  # type: ignore[no-any-return]

    def unconfirmed(self) -> List[Tuple[int, Message]]:
        """Takes back the publishes a lost node may not have taken (see
        :meth:`skiff.Client.unconfirmed`)."""
        return self._c.unconfirmed()  # type: ignore[no-any-return]

    async def close(self, timeout: float = 1.0) -> None:
        """Flushes (at most ``timeout`` seconds) and closes."""
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        self._c.close(0)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class Subscription:
    """A subscription as an async iterator (``async for m in sub``), with
    ``await next(timeout)``, ``pause``, ``resume``, ``unsubscribe``."""

    def __init__(self, raw: "_skiff.Subscription") -> None:
        self._s = raw
        self._buf: Deque[Message] = collections.deque()
        self._task: Optional["asyncio.Task[None]"] = None

    @property
    def raw(self) -> "_skiff.Subscription":
        return self._s

    async def _next(self) -> Optional[Message]:
        s = self._s
        while True:
            if not s.paused:
                if self._buf:
                    return self._buf.popleft()
                got = s.take(_BATCH)
                if got:
                    self._buf.extend(got)
                    continue
            if await s.wait_async() is None:
                return None

    async def next(self, timeout: Optional[float] = None) -> Message:
        """The next message; raises skiff.TimeoutError after ``timeout``
        seconds and ConnectionClosed once the subscription ended."""
        try:
            m = await asyncio.wait_for(self._next(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError("no message within the timeout") from None
        if m is None:
            raise ConnectionClosed("the subscription ended")
        return m

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        m = await self._next()
        if m is None:
            raise StopAsyncIteration
        return m

    async def _run(self, callback: Callable[[Message], Any]) -> None:
        async for m in self:
            r = callback(m)
            if asyncio.iscoroutine(r):
                await r

    def pause(self) -> None:
        self._s.pause()

    def resume(self) -> None:
        self._s.resume()

    @property
    def paused(self) -> bool:
        return bool(self._s.paused)

    def unsubscribe(self) -> None:
        self._buf.clear()
        self._s.unsubscribe()
        if self._task is not None:
            self._task.cancel()

    @property
    def dropped(self) -> int:
        return int(self._s.dropped)

    @property
    def gaps(self) -> int:
        return int(self._s.gaps)

    @property
    def pending(self) -> int:
        return len(self._buf) + int(self._s.pending)

    @property
    def id(self) -> int:
        return int(self._s.id)

    @property
    def pattern(self) -> str:
        return str(self._s.pattern)

    async def __aenter__(self) -> "Subscription":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.unsubscribe()


class Member:
    """Membership in a cluster: ``async for item in member`` yields
    requests (Messages with ``reply``: ``await m.respond_async(...)`` or
    :func:`respond`), broadcasts (Messages) and tunnels (:class:`Tunnel`)."""

    def __init__(self, raw: "_skiff.Member") -> None:
        self._m = raw

    async def _next(self) -> Any:
        while True:
            item = self._m.try_next()
            if item is None and await self._m.wait_async() is None:
                return None
            if item is not None:
                return Tunnel(item) if isinstance(item, _skiff.Tunnel) else item

    async def next(self, timeout: Optional[float] = None) -> Any:
        try:
            item = await asyncio.wait_for(self._next(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError("nothing within the timeout") from None
        if item is None:
            raise ConnectionClosed("the membership ended")
        return item

    def __aiter__(self) -> "Member":
        return self

    async def __anext__(self) -> Any:
        item = await self._next()
        if item is None:
            raise StopAsyncIteration
        return item

    def leave(self) -> None:
        self._m.leave()

    @property
    def cluster(self) -> str:
        return str(self._m.cluster)

    async def __aenter__(self) -> "Member":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.leave()


async def respond(message: Message, data: Buffer, *, type: Optional[str] = None,
                  fields: Optional[Dict[str, Any]] = None) -> None:
    """Answers a request received on a subscription or a membership."""
    await message.respond_async(data, type=type, fields=fields)


class Tunnel:
    """A tunnel for asyncio: ``await send(data)`` / ``await recv()``
    whole messages, or ``await write(data)`` / ``await read(n)`` bytes;
    ``async for data in tunnel`` until the peer closes."""

    def __init__(self, raw: "_skiff.Tunnel") -> None:
        self._t = raw
        self._left = memoryview(b"")

    async def send(self, data: Buffer) -> None:
        await self._t.send_async(data)

    async def recv(self, timeout: Optional[float] = None) -> Optional[bytes]:
        if self._left:
            data, self._left = bytes(self._left), memoryview(b"")
            return data
        try:
            return await asyncio.wait_for(self._recv(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError("nothing within the timeout") from None

    async def _recv(self) -> Optional[bytes]:
        while True:
            got = self._t.try_recv()
            if got is False:
                return None
            if got is not None:
                return got  # type: ignore[no-any-return]
            await self._t.wait_async()

    async def write(self, data: Buffer) -> int:
        n = memoryview(data).nbytes
        if n:
            await self._t.send_async(data)
        return n

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (-1: one message's worth), b"" once closed."""
        while not self._left:
            data = await self._recv()
            if data is None:
                return b""
            self._left = memoryview(data)
        k = len(self._left) if n < 0 else min(n, len(self._left))
        out, self._left = bytes(self._left[:k]), self._left[k:]
        return out

    def __aiter__(self) -> "Tunnel":
        return self

    async def __anext__(self) -> bytes:
        data = await self.recv()
        if data is None:
            raise StopAsyncIteration
        return data

    def close(self) -> None:
        self._t.close()

    @property
    def id(self) -> int:
        return int(self._t.id)

    async def __aenter__(self) -> "Tunnel":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class Queue:
    """CMQ's queue for asyncio: ``push`` never waits; ``await pop()``."""

    def __init__(self, locator: str) -> None:
        self._q = _skiff.Queue(locator)

    def push(self, dest: Union[str, tuple], data: Buffer, *, subject: str = "",
             type: Optional[str] = None, fields: Optional[Dict[str, Any]] = None) -> None:
        self._q.push(dest, data, subject=subject, type=type, fields=fields)

    def try_pop(self) -> Optional[Message]:
        return self._q.try_pop()

    async def pop(self, timeout: Optional[float] = None) -> Message:
        m = self._q.try_pop()
        if m is not None:
            return m
        try:
            return await asyncio.wait_for(self._q.pop_async(), timeout)  # type: ignore[no-any-return]
        except asyncio.TimeoutError:
            raise TimeoutError("no message within the timeout") from None

    async def flush(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._q.flush)

    def stats(self) -> Dict[str, Any]:
        return self._q.stats()  # type: ignore[no-any-return]

    @property
    def local_addr(self) -> tuple:
        return self._q.local_addr  # type: ignore[no-any-return]


