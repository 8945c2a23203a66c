"""skiff's exceptions, by cause.

Every exception skiff raises derives from :class:`SkiffError`; most also
derive from the built-in exception a Python caller would catch for that
cause (``skiff.TimeoutError`` is a ``TimeoutError``, ``ConnectionClosed``
a ``ConnectionError``, ``LocatorError`` a ``ValueError``, ...). The text is
the Rust error's message. Wrong argument types and values raise the
built-in ``TypeError``/``ValueError`` naming the parameter.
"""

import builtins

__all__ = [
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


class SkiffError(Exception):
    """Base of every skiff error."""


class TimeoutError(SkiffError, builtins.TimeoutError):
    """Nothing arrived in time (a request, ``next(timeout=...)``, a pop)."""


class NoResponders(SkiffError):
    """A request or tunnel found nobody to answer: no subscription matches
    the subject, or the cluster has no member with capacity."""


class Refused(SkiffError):
    """The node refused a call; ``code`` names the node's reason."""

    code = "refused"


class PermissionDenied(Refused, builtins.PermissionError):
    """The node does not allow this client the call (authorization)."""

    code = "permission"


class AuthenticationFailed(PermissionDenied):
    """The node refused this client's credentials, or asked for some
    (``token=``, ``user=`` and ``password=``, ``key=`` options of
    ``connect``)."""

    code = "auth"


class LimitExceeded(Refused):
    """A configured limit was reached (the node's or this process's)."""

    code = "limit"


class NotFound(Refused):
    """The tunnel, request or subscription named does not exist."""

    code = "not_found"


class ConnectionClosed(SkiffError, builtins.ConnectionError):
    """The client, subscription, tunnel or buffer is closed (by this
    process, the node, or the peer)."""


class NodeLost(ConnectionClosed):
    """The client lost its node; with a failover list it moves to the next
    node on its own, so the call may be retried."""


class SlowConsumer(ConnectionClosed):
    """The node closed a ``disconnect``-policy subscriber that fell behind."""


class PeerLost(ConnectionClosed):
    """A buffer's producer or network peer went away without closing."""


class InvalidName(SkiffError, builtins.ValueError):
    """A subject, pattern, type or cluster name is not valid."""


class LocatorError(SkiffError, builtins.ValueError):
    """The locator string or one of its options is wrong."""


class UsageError(SkiffError, builtins.ValueError):
    """The call can never succeed as made (e.g. a message too large)."""


class ProtocolError(SkiffError):
    """The peer sent what this client cannot read."""


class IoError(SkiffError, builtins.OSError):
    """The operating system refused; the message says which call."""


class WouldBlock(SkiffError, builtins.BlockingIOError):
    """A buffer is full until its subscribers consume (``block=False``)."""
