"""Fixtures: real `skiff node` processes (the binary from this workspace's
target directory, or $SKIFF_BIN) and the locators every suite runs
against: the embedded node (`mem://`) and a node over TCP."""

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


def skiff_bin() -> str:
    if os.environ.get("SKIFF_BIN"):
        return os.environ["SKIFF_BIN"]
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    for profile in ("debug", "release"):
        p = target / profile / "skiff"
        if p.exists():
            return str(p)
    found = shutil.which("skiff")
    if found:
        return found
    pytest.fail("no skiff binary: build it (cargo build -p skiff-cli) or set SKIFF_BIN")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """A `skiff node` process listening on TCP at `addr`."""

    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.locator = f"skiff://{self.addr}"
        self.proc = subprocess.Popen(
            [skiff_bin(), "node", "--tcp", self.addr, *extra],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        seen = ""
        deadline = time.time() + 20
        assert self.proc.stderr is not None
        while "listening on tcp" not in seen:
            line = self.proc.stderr.readline()
            if not line or time.time() > deadline:
                self.kill()
                raise RuntimeError(f"skiff node did not start: {seen}")
            seen += line

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def node():
    n = Node()
    yield n
    n.stop()


@pytest.fixture(params=["mem", "tcp"])
def locator(request):
    """Each test that takes it runs against the embedded node (a fresh
    name per test) and a real node process over TCP."""
    if request.param == "mem":
        return f"mem://{request.node.name.replace('[', '-').replace(']', '')}"
    return request.getfixturevalue("node").locator


@pytest.fixture
def make_node():
    made = []

    def make(*extra: str) -> Node:
        n = Node(*extra)
        made.append(n)
        return n

    yield make
    for n in made:
        n.kill()


@pytest.fixture
def cli():
    """Runs the skiff binary."""

    def run(*args: str, **kw):
        return subprocess.run([skiff_bin(), *args], capture_output=True, text=True, timeout=30, **kw)

    return run


PY = sys.executable
