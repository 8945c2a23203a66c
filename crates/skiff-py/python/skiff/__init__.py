"""skiff from Python: publish/subscribe, request/reply, clusters,
broadcasts, tunnels, CMQ queues and shared-memory buffers, over skiff's
Rust client.

Blocking API here; the same names as coroutines and async iterators in
:mod:`skiff.aio`; shared-memory buffers in :mod:`skiff.shm`::

    import skiff
    with skiff.connect("skiff://127.0.0.1:4747") as c:   # or "mem://"
        sub = c.subscribe("daq.>")
        c.publish("daq.hallb.rate", b"42")
        m = sub.next(timeout=1.0)
        print(m.subject, m.data)

Every wait releases the GIL and lets Ctrl-C through; errors are
exceptions by cause (see :mod:`skiff._errors`); data may be ``bytes``,
``bytearray`` or ``memoryview``. Clients still open at interpreter exit
are flushed and closed.
"""

import atexit as _atexit

from skiff._errors import (
    AuthenticationFailed,
    ConnectionClosed,
    InvalidName,
    IoError,
    LimitExceeded,
    LocatorError,
    NodeLost,
    NoResponders,
    NotFound,
    PeerLost,
    PermissionDenied,
    ProtocolError,
    Refused,
    SkiffError,
    SlowConsumer,
    TimeoutError,
    UsageError,
    WouldBlock,
)
from skiff._io import TunnelFile
from skiff._skiff import (
    Client,
    Member,
    Message,
    Queue,
    Subscription,
    Tunnel,
    connect,
)
from skiff._skiff import shutdown as _shutdown

__all__ = [
    "connect",
    "Client",
    "Subscription",
    "Member",
    "Message",
    "Tunnel",
    "TunnelFile",
    "Queue",
    "SkiffError",
    "TimeoutError",
    "NoResponders",
    "PermissionDenied",
    "AuthenticationFailed",
    "ConnectionClosed",
    "NodeLost",
    "SlowConsumer",
    "Refused",
    "LimitExceeded",
    "NotFound",
    "InvalidName",
    "LocatorError",
    "UsageError",
    "ProtocolError",
    "IoError",
    "WouldBlock",
    "PeerLost",
]

_atexit.register(_shutdown)
