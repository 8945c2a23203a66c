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

from skiff import _errors
from skiff._errors import *  # noqa: F401,F403 (every exception, listed once in _errors)
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
] + _errors.__all__

_atexit.register(_shutdown)
