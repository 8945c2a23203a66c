"""Python with other processes: the Rust CLI as publisher and
subscriber, failover between two node processes, Ctrl-C interrupting a
blocking wait."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

import skiff
from conftest import skiff_bin


def test_python_publishes_rust_cli_subscribes(node, cli):
    subj = "ip" + uuid.uuid4().hex[:8]
    sub = subprocess.Popen(
        [skiff_bin(), "sub", "-n", node.locator, f"{subj}.>", "--count", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    with skiff.connect(node.locator) as c:
        # Until the CLI's subscription is in the node, publishes find nobody.
        deadline = time.time() + 10
        while time.time() < deadline:
            subs = [s for cl in c.stats()["clients"] for s in cl.get("subscriptions", [])]
            if any(subj in str(s) for s in subs):
                break
            time.sleep(0.05)
        for i in range(3):
            c.publish(f"{subj}.x", f"from python {i}".encode(), type="py")
        c.flush()
    out, err = sub.communicate(timeout=20)
    assert sub.returncode == 0, err
    assert out.splitlines() == [f"{subj}.x [py] from python {i}" for i in range(3)]


def test_rust_cli_publishes_and_requests_python_answers(node, cli):
    subj = "ir" + uuid.uuid4().hex[:8]
    with skiff.connect(node.locator) as c:
        sub = c.subscribe(f"{subj}.data")
        svc = c.subscribe(f"{subj}.svc")

        def serve():
            for r in svc:
                r.respond(b"python says " + r.data)

        threading.Thread(target=serve, daemon=True).start()
        r = cli("pub", "-n", node.locator, f"{subj}.data", "from rust", "--count", "2", "--type", "rs")
        assert r.returncode == 0, r.stderr
        for _ in range(2):
            m = sub.next(timeout=10)
            assert (m.data, m.type) == (b"from rust", "rs")
        r = cli("req", "-n", node.locator, f"{subj}.svc", "hi")
        assert r.returncode == 0, r.stderr
        assert "python says hi" in r.stdout


def test_failover_to_the_second_node(make_node):
    a, b = make_node(), make_node()
    subj = "fo" + uuid.uuid4().hex[:8]
    with skiff.connect(f"skiff://{a.addr},{b.addr}", ping="100ms", ping_timeout="400ms") as c:
        sub = c.subscribe(subj)
        c.publish(subj, b"before")
        assert sub.next(timeout=5).data == b"before"
        a.kill()
        # Publish until the client is on b and the message comes back.
        deadline = time.time() + 20
        got = None
        while time.time() < deadline and got is None:
            try:
                c.publish(subj, b"after")
                got = sub.next(timeout=0.5)
            except (skiff.TimeoutError, skiff.NodeLost):
                continue
        assert got is not None and got.data == b"after"
        assert got.gap is not None and b.addr in got.gap["to"]
        assert c.link_stats()["failovers"] == 1
        assert sub.gaps == 1


CTRL_C = textwrap.dedent(
    """
    import sys, skiff
    c = skiff.connect("mem://ctrlc")
    sub = c.subscribe("never")
    print("waiting", flush=True)
    try:
        sub.next()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
    """
)


@pytest.mark.parametrize("what", ["next", "request"])
def test_ctrl_c_interrupts_a_blocking_wait(what):
    code = CTRL_C if what == "next" else CTRL_C.replace(
        "sub.next()", "s2 = c.subscribe('svc'); c.request('svc', b'', timeout=600)"
    )
    # SIGINT back to its default in the child: a test run started in the
    # background by a non-interactive shell inherits it ignored, and Python
    # then installs no KeyboardInterrupt handler.
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "waiting"
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 3, (out, err)
    assert "interrupted" in out
    assert time.monotonic() - t0 < 5


MEMORY = textwrap.dedent(
    """
    import resource, skiff, sys
    N = int(sys.argv[1])
    c = skiff.connect("mem://memory")
    sub = c.subscribe("m", policy="block")
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    payload = b"x" * 64
    marks = []
    for i in range(N):
        c.publish("m", payload)
        m = sub.next(timeout=10)
        m.data; m.view
        if i in (N // 10, N - 1):
            marks.append(rss())
    print(marks[0], marks[1])
    """
)


def test_memory_held_flat_over_a_million_messages():
    n = int(os.environ.get("SKIFF_PY_MEMORY_MESSAGES", "1000000"))
    r = subprocess.run([sys.executable, "-c", MEMORY, str(n)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    first, last = map(int, r.stdout.split())
    # After a tenth of the run everything is warm; the rest must not grow
    # (a leak of even 8 bytes per message would add megabytes).
    assert last - first < 4 << 20, f"RSS grew {last - first} bytes over {n - n // 10} messages"


def test_interpreter_exit_flushes_and_closes_cleanly(node):
    subj = "ex" + uuid.uuid4().hex[:8]
    code = textwrap.dedent(
        f"""
        import threading, skiff
        c = skiff.connect({node.locator!r})
        s = c.subscribe("{subj}.idle")
        threading.Thread(target=lambda: [m for m in s], daemon=True).start()
        for i in range(1000):
            c.publish("{subj}", str(i).encode())
        # no flush, no close: the interpreter's exit does both
        """
    )
    with skiff.connect(node.locator) as c:
        sub = c.subscribe(subj)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""
        got = [int(sub.next(timeout=10).data) for _ in range(1000)]
        assert got == list(range(1000))


def test_credentials_and_permissions(tmp_path):
    from conftest import Node

    h = subprocess.run([skiff_bin(), "passwd"], input="pw-alice\n", capture_output=True, text=True, timeout=30)
    assert h.returncode == 0, h.stderr
    cfg = tmp_path / "node.toml"
    cfg.write_text(
        textwrap.dedent(
            f"""
            [auth]
            token = "tok-123"
            [[auth.users]]
            name = "alice"
            {h.stdout.strip()}
            [auth.users.permissions]
            publish = {{ allow = ["orders.>"] }}
            subscribe = {{ allow = ["orders.>"] }}
            """
        )
    )
    n = Node("--config", str(cfg))
    try:
        with pytest.raises(skiff.AuthenticationFailed) as e:
            skiff.connect(n.locator).flush(timeout=5)
        assert isinstance(e.value, PermissionError)
        with pytest.raises(skiff.AuthenticationFailed):
            skiff.connect(n.locator, user="alice", password="wrong", connect_timeout="20s").flush(timeout=5)
        with skiff.connect(n.locator, token="tok-123") as c:
            c.flush(timeout=5)
        # An argon2 check on a loaded 2-core machine can overrun the default 1.5 s.
        with skiff.connect(n.locator, user="alice", password="pw-alice", connect_timeout="20s") as c:
            with pytest.raises(skiff.PermissionDenied):
                c.subscribe("status.x")
            sub = c.subscribe("orders.>")
            c.publish("orders.1", b"ok")
            assert sub.next(timeout=5).data == b"ok"
    finally:
        n.kill()


def test_a_client_name_shows_in_the_nodes_stats(node, cli):
    with skiff.connect(node.locator, name="py-worker 1") as c, \
            skiff.connect(node.locator, ping="1s") as unnamed:
        clients = {cl["id"]: cl for cl in c.stats()["clients"]}
        assert clients[c.id]["name"] == "py-worker 1"
        assert "name" not in clients[unnamed.id]
        r = cli("stats", "-n", node.locator)
        assert r.returncode == 0, r.stderr
        assert f"client {c.id} py-worker 1 " in r.stdout
    with pytest.raises(Exception, match="name"):
        skiff.connect(node.locator, name="bad\nname")


def _nats_member(port, pattern, group):
    """A raw NATS connection in queue group `group`; a list its messages'
    payloads are appended to (by a thread of its own)."""
    import socket as so
    deadline = time.time() + 10
    while True:
        try:
            s = so.create_connection(("127.0.0.1", port), timeout=10)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    s.sendall(f'CONNECT {{"verbose":false}}\r\nSUB {pattern} {group} 1\r\nPING\r\n'.encode())
    f = s.makefile("rb")
    while not f.readline().startswith(b"PONG"):
        pass
    got = []

    def read():
        while True:
            line = f.readline()
            if not line:
                return
            if line.startswith(b"MSG "):
                n = int(line.split()[-1])
                got.append(f.read(n + 2)[:n])

    threading.Thread(target=read, daemon=True).start()
    return s, got


def test_queue_group_shared_with_a_nats_queue_subscriber(make_node):
    from conftest import free_port
    port = free_port()
    n = make_node("--nats", f"127.0.0.1:{port}")
    subj = "qg" + uuid.uuid4().hex[:8]
    conn, nats_got = _nats_member(port, f"{subj}.>", "g")
    with skiff.connect(n.locator) as c:
        a = c.subscribe(f"{subj}.>", queue_group="g")
        b = c.subscribe(f"{subj}.>", queue_group="g")
        plain = c.subscribe(f"{subj}.>")
        total = 60
        for i in range(total):
            c.publish(f"{subj}.x", str(i).encode())
        c.flush()
        got_a, got_b = [], []
        for _ in range(total):
            plain.next(timeout=10)
        deadline = time.time() + 10
        while len(got_a) + len(got_b) + len(nats_got) < total and time.time() < deadline:
            for s, into in ((a, got_a), (b, got_b)):
                try:
                    into.append(s.next(timeout=0.05).data)
                except skiff.TimeoutError:
                    pass
        time.sleep(0.3)
        for s in (a, b):
            with pytest.raises(skiff.TimeoutError):
                s.next(timeout=0.1)
        everything = sorted(int(d) for d in got_a + got_b + nats_got)
        assert everything == list(range(total)), "each message once to the group"
        assert got_a and got_b and nats_got, (len(got_a), len(got_b), len(nats_got))
    conn.close()
