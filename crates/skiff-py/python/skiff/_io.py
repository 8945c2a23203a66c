"""The Python side of tunnels and callbacks: :class:`TunnelFile`, a
tunnel as a binary file-like object, and the thread that runs a
subscription's callback."""

import io
import sys
import threading
from typing import Any, Callable, Optional, Union

Buffer = Union[bytes, bytearray, memoryview]


class TunnelFile(io.RawIOBase):
    """A tunnel as a binary file: ``write`` sends the bytes as one
    message (waiting, with the GIL released, while the peer's window is
    full); ``read``/``readinto`` return bytes as they arrive, ``b""`` once
    the peer closed. ``send``/``recv`` move whole messages. Ordered and
    exactly once while both ends live. Closing it closes the tunnel."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self._raw = raw
        self._left = memoryview(b"")

    @property
    def raw(self) -> Any:
        """The underlying :class:`skiff.Tunnel`."""
        return self._raw

    @property
    def id(self) -> int:
        """The node's id for the tunnel."""
        return int(self._raw.id)

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:  # type: ignore[override]
        while not self._left:
            data = self._raw.recv()
            if data is None:
                return 0
            self._left = memoryview(data)
        out = memoryview(b).cast("B")
        n = min(len(out), len(self._left))
        out[:n] = self._left[:n]
        self._left = self._left[n:]
        return n

    def write(self, b: Buffer) -> int:  # type: ignore[override]
        n = memoryview(b).nbytes
        if n:
            self._raw.send(b)
        return n

    def send(self, data: Buffer) -> None:
        """Sends ``data`` as one message."""
        self._raw.send(data)

    def recv(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The next whole message (bytes), None once the tunnel closed;
        raises skiff.TimeoutError after ``timeout`` seconds."""
        if self._left:
            data, self._left = bytes(self._left), memoryview(b"")
            return data
        return self._raw.recv(timeout)  # type: ignore[no-any-return]

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()

    def __repr__(self) -> str:
        return f"<skiff.TunnelFile id={self._raw.id}>"


def start_callback(sub: Any, callback: Callable[[Any], Any]) -> threading.Thread:
    """Calls ``callback(message)`` for each message of ``sub`` on a daemon
    thread until the subscription ends. An exception in the callback is
    reported through ``sys.excepthook`` and the thread goes on."""

    def run() -> None:
        for m in sub:
            try:
                callback(m)
            except Exception:  # noqa: BLE001 - reported, the loop goes on
                sys.excepthook(*sys.exc_info())

    t = threading.Thread(target=run, name=f"skiff-callback-{sub.pattern}", daemon=True)
    t.start()
    return t
