"""RocketBufs buffers from Python: an :class:`Output` creates buffers and
delivers segments to every subscriber; an :class:`Input` subscribes and
reads them. ``shm://name`` maps one ring per buffer shared between
processes; ``tcp://host:port`` and ``udp://host:port?reliable=true``
carry the same buffers over a network.

Segments are ``memoryview``s of the ring itself, without copies::

    out = skiff.shm.Output("shm://demo")
    out.create_buffer(1, 1 << 20)
    seg = out.segment(1, 5)
    with seg.views[0] as mv:          # release the view before deliver
        mv[:5] = b"hello"
    out.deliver(seg)

    inp = skiff.shm.Input("shm://demo")
    inp.subscribe(1, 1 << 20)
    s = inp.recv(timeout=1.0)
    bytes(s.views[0])                 # read in place
    inp.consumed(s.id, len(s))        # give the space back
"""

from skiff._skiff import InSegment, Input, OutSegment, Output

__all__ = ["Output", "Input", "OutSegment", "InSegment"]
