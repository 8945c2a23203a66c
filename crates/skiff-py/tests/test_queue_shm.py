"""skiff.Queue (CMQ over UDP) and skiff.shm buffers."""

import os
import uuid

import pytest

import skiff
import skiff.shm


def test_queue_push_pop_try_pop_flush_stats():
    with skiff.Queue("udp://127.0.0.1:0") as a, skiff.Queue("udp://127.0.0.1:0?qthresh=512") as b:
        host, port = b.local_addr
        for i in range(100):
            a.push((host, port), str(i).encode(), subject="q.n", type="n", fields={"i": i})
        a.push(f"{host}:{port}", bytearray(b"last"))
        a.flush()
        got = [b.pop(timeout=5)]
        while len(got) < 101:
            m = b.try_pop() or b.pop(timeout=5)
            got.append(m)
        assert [int(m.data) for m in got[:100]] == list(range(100))
        assert got[0].subject == "q.n" and got[0].fields == {"i": 0}
        assert got[100].data == b"last"
        assert got[0].sender[1] == a.local_addr[1]
        assert b.try_pop() is None
        with pytest.raises(skiff.TimeoutError):
            b.pop(timeout=0.1)
        assert a.stats()["sent_messages"] == 101
        assert b.stats()["recv_messages"] == 101 and b.stats()["lost"] == 0


def test_queue_bad_input():
    with pytest.raises(skiff.LocatorError):
        skiff.Queue("udp://127.0.0.1:0?qthresh=lots")
    q = skiff.Queue("udp://127.0.0.1:0")
    with pytest.raises(TypeError, match="dest"):
        q.push(42, b"x")
    with pytest.raises(ValueError, match="dest"):
        q.push("no-port", b"x")
    with pytest.raises(skiff.UsageError):
        q.push("127.0.0.1:9", b"x" * 70000)


@pytest.fixture
def shm_loc(tmp_path):
    return f"shm://py{uuid.uuid4().hex[:8]}?dir={tmp_path}"


def test_shm_segments_are_memoryviews_of_the_ring(shm_loc):
    out = skiff.shm.Output(shm_loc)
    out.create_buffer(7, 4096)
    inp = skiff.shm.Input(shm_loc)
    inp.subscribe(7, 4096)
    seg = out.segment(7, 11)
    views = seg.views
    assert all(isinstance(v, memoryview) and not v.readonly for v in views)
    with views[0] as mv:
        mv[:11] = b"hello world"
    del views
    out.deliver(seg)
    s = inp.recv(timeout=5)
    assert (s.id, len(s), s.intact) == (7, 11, True)
    v = s.views[0]
    assert v.readonly and bytes(v) == b"hello world" and s.data == b"hello world"
    inp.consumed(7, len(s))
    out.send(7, memoryview(b"second"))
    assert inp.recv(timeout=5).data == b"second"
    assert out.stats(7)["segments"] == 2
    assert inp.stats(7)["unconsumed"] == 6


def test_shm_deliver_refuses_while_a_view_is_exported(shm_loc):
    out = skiff.shm.Output(shm_loc)
    out.create_buffer(1, 1024)
    seg = out.segment(1, 4)
    mv = seg.views[0]
    mv[:4] = b"abcd"
    with pytest.raises(skiff.UsageError, match="release"):
        out.deliver(seg)
    mv.release()
    out.deliver(seg)
    with pytest.raises(skiff.UsageError):
        out.deliver(seg)
    with pytest.raises(ValueError, match="size"):
        out.create_buffer(2, -1)
    with pytest.raises(skiff.WouldBlock):
        inp = skiff.shm.Input(shm_loc)
        inp.subscribe(1, 1024)
        for _ in range(1000):
            out.send(1, b"x" * 100, block=False)
