#!/usr/bin/env python3
# The datagram floor beside TCP, for the tunnel's bulk row (issue 16 item 7):
# BYTES (default 1 GiB) sent as UDP GSO runs of 1472-byte segments
# (UDP_SEGMENT, 44 segments a send) to a socket receiving with UDP_GRO into a
# 64 KiB buffer, then the same bytes over one TCP connection in 64 KiB
# writes and reads; sender and receiver are separate processes. The UDP
# sender is not flow controlled, so the receiver gets what it keeps up with:
# its figure is the receive rate of what arrived (the kernel's datagram
# path with no protocol above it), not a goodput. Run it where the tunnel
# row runs, e.g. in a namespace whose loopback has MTU 1500:
#
#   ip netns add fl && ip -n fl link set lo mtu 1500 up
#   ip netns exec fl python3 bench/udp_floor.py [BYTES]; ip netns del fl
import os, socket, sys, time
N = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30
SEG, RUN = 1472, 44  # 44 * 1472 = 64,768 bytes per GSO send
UDP_SEGMENT, UDP_GRO = 103, 104

def udp():
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    r.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
    r.bind(("127.0.0.1", 0)); addr = r.getsockname()
    pid = os.fork()
    if pid == 0:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.setsockopt(socket.IPPROTO_UDP, UDP_SEGMENT, SEG)
        s.connect(addr)
        buf = b"\xa5" * (SEG * RUN); sent = 0
        while sent < N:
            try:
                sent += s.send(buf)
            except BlockingIOError:
                pass
            except OSError:  # ENOBUFS: back off a little
                time.sleep(0.0001)
        os._exit(0)
    buf = bytearray(65536); got = 0; r.settimeout(1.0); t0 = None; t1 = None
    try:
        while got < N:
            n = r.recv_into(buf)
            if t0 is None: t0 = time.perf_counter()
            got += n; t1 = time.perf_counter()
    except socket.timeout:
        pass
    os.waitpid(pid, 0)
    return got, t1 - t0

def tcp():
    l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1); addr = l.getsockname()
    pid = os.fork()
    if pid == 0:
        s = socket.create_connection(addr); buf = b"\xa5" * 65536; sent = 0
        while sent < N:
            s.sendall(buf); sent += len(buf)
        s.close(); os._exit(0)
    c, _ = l.accept(); buf = bytearray(65536); got = 0; t0 = time.perf_counter()
    while True:
        n = c.recv_into(buf)
        if n == 0: break
        got += n
    t = time.perf_counter() - t0
    os.waitpid(pid, 0)
    return got, t

for name, f in (("udp gso/gro 1472", udp), ("tcp", tcp)):
    got, t = f()
    print(f"{name}: {got/1e6:.0f} MB received of {N/1e6:.0f} in {t:.3f} s = {got/t/1e6:.0f} MB/s")
