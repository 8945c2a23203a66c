"""Shared-memory buffers: write a segment in place through a memoryview,
read it in place on the other side (no copies).
    python examples/python/shm_buffers.py"""
import skiff.shm

out = skiff.shm.Output("shm://pydemo")
out.create_buffer(1, 1 << 16)
inp = skiff.shm.Input("shm://pydemo")
inp.subscribe(1, 1 << 16)
seg = out.segment(1, 12)
with seg.views[0] as mv:
    mv[:12] = b"zero copies!"
out.deliver(seg)
s = inp.recv(timeout=2)
with s.views[0] as v:
    print(bytes(v))
inp.consumed(s.id, len(s))
