#!/usr/bin/env python3
"""CPU and syscalls per message, of the server and of the load generator,
for bench/nats_front.sh's cases on nats-server and on skiff's NATS port in
one run (alternating per case, fresh servers). Says what the two cores
allow: with the load generator's CPU per message measured, 2 cores /
(its CPU per message) is the rate no server can exceed on this machine.

    bench/nats_cost.py [--duration-secs 2] [--strace] [--cases 1,2,3] [--servers nats,skiff,floor]

Needs NATS_SERVER, SKIFF (SKIFF_ARGS: more `skiff node` options) and bench/nats/natsbench (bench/nats_front.sh
builds them). --strace adds a second, shorter run per case under
`strace -c -f -p SERVER` (syscalls per message; strace slows the server,
so rates from that run are not reported). The server's reads and writes
are counted only there (skiff's sockets use send/recv, which
/proc/PID/io does not count); natsbench's (Go: read/write) from
/proc/PID/io. One JSON object per case and server on standard output, a
line each on standard error.

Server `floor` (not run unless named in --servers): bench/nats_floor_relay.c,
the least a NATS server can do (one thread, no hand-offs, trivial parsing),
compiled with cc into $CARGO_TARGET_DIR (else target/) on first use
($FLOOR_ARGS: its mode, e.g. `threads`): how fast the load generator runs
against a server that costs almost nothing.
"""
import argparse, json, os, re, socket, subprocess, sys, time

HZ = os.sysconf("SC_CLK_TCK")
CASES = [
    ("pubsub 1->1 8 B", "pubsub -pubs 1 -subs 1 -size 8", 1),
    ("pubsub 1->1 256 B", "pubsub -pubs 1 -subs 1 -size 256", 1),
    ("pubsub 1->4 8 B", "pubsub -pubs 1 -subs 4 -size 8", 4),
    ("pubsub 1->4 256 B", "pubsub -pubs 1 -subs 4 -size 256", 4),
    ("request 1 requester 8 B", "request -conc 1 -size 8", 1),
    ("request 16 requesters 8 B", "request -conc 16 -size 8", 1),
    ("request 16 requesters 8 B, a connection each", "request -conc 16 -size 8 -conns per-requester", 1),
]


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu(pid):
    """utime + stime of every thread of pid, seconds."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / HZ


def ctxsw(pid):
    v = n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        for line in open(f"/proc/{pid}/task/{t}/status"):
            if line.startswith("voluntary_ctxt_switches"):
                v += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                n += int(line.split()[1])
    return v, n


def hwm(pid):
    """Peak RSS (VmHWM) of pid, kB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1])
    return 0


def io(pid):
    """/proc/PID/io: read and write calls and bytes (rchar, wchar, syscr, syscw)."""
    d = {}
    try:
        for line in open(f"/proc/{pid}/io"):
            k, v = line.split(":")
            d[k] = int(v)
    except OSError:
        pass
    return d


def start(which, args):
    p = port()
    if which == "nats":
        cmd = [args.nats_server, "-a", "127.0.0.1", "-p", str(p)]
    elif which == "floor":
        cmd = [floor_relay(), str(p), *os.environ.get("FLOOR_ARGS", "").split()]
    else:
        cmd = [args.skiff, "node", "--tcp", "none", "--nats", f"127.0.0.1:{p}",
               *os.environ.get("SKIFF_ARGS", "").split()]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", p)).close()
            return proc, f"nats://127.0.0.1:{p}"
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{which} did not start")


def floor_relay():
    """bench/nats_floor_relay.c, compiled into $CARGO_TARGET_DIR (else target/)
    when older than its source."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.environ.get("CARGO_TARGET_DIR") or os.path.join(here, "..", "target")
    os.makedirs(out, exist_ok=True)
    src, exe = os.path.join(here, "nats_floor_relay.c"), os.path.join(out, "nats_floor_relay")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        subprocess.run(["cc", "-O2", "-pthread", "-o", exe, src], check=True)
    return exe


def run_nb(nb, case_args, url, dur):
    """natsbench's row, its own CPU seconds (user+sys, all threads) and
    its read/write counts (/proc/PID/io, last seen before it ended)."""
    p = subprocess.Popen([nb, *case_args.split(), "-url", url, "-duration", f"{dur}s"],
                         stdout=subprocess.PIPE)
    os.set_blocking(p.stdout.fileno(), False)
    out, last = b"", {}
    while True:
        got = io(p.pid)
        if got:
            last = got
        try:
            chunk = p.stdout.read()
        except BlockingIOError:
            chunk = None
        if chunk:
            out += chunk
        elif chunk == b"":
            break
        time.sleep(0.02)
    _, status, ru = os.wait4(p.pid, 0)
    return json.loads(out), ru.ru_utime + ru.ru_stime, last


def delivered(row, fan):
    if row["test"].startswith("nats-request"):
        return row["messages"]
    return row["msgs_per_s"] * row["elapsed_s"]


def measure(which, case, args):
    name, case_args, fan = case
    proc, url = start(which, args)
    c0, s0 = cpu(proc.pid), ctxsw(proc.pid)
    t0 = time.time()
    row, nb_cpu, nb_io = run_nb(args.nb, case_args, url, args.duration_secs)
    wall = time.time() - t0
    c1, s1 = cpu(proc.pid), ctxsw(proc.pid)
    rss_kb = hwm(proc.pid)
    proc.terminate()
    proc.wait()
    n = delivered(row, fan)
    r = {
        "server": which, "case": name, "msgs_per_s": row["msgs_per_s"], "delivered": n,
        "server_cpu_s": c1 - c0, "nb_cpu_s": nb_cpu, "wall_s": wall,
        "server_ns_per_msg": (c1 - c0) / n * 1e9, "nb_ns_per_msg": nb_cpu / n * 1e9,
        "server_ctxsw_per_msg": ((s1[0] - s0[0]) + (s1[1] - s0[1])) / n,
        "p50_us": row.get("p50_us"), "lost": row.get("lost", 0), "peak_rss_kb": rss_kb,
        "nb_reads_per_msg": nb_io.get("syscr", 0) / n,
        "nb_writes_per_msg": nb_io.get("syscw", 0) / n,
        "nb_bytes_per_read": nb_io.get("rchar", 0) / max(1, nb_io.get("syscr", 0)),
        "nb_bytes_per_write": nb_io.get("wchar", 0) / max(1, nb_io.get("syscw", 0)),
    }
    if args.strace:
        proc, url = start(which, args)
        st = subprocess.Popen(["strace", "-c", "-f", "-q", "-p", str(proc.pid), "-o", "/dev/stderr"],
                              stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        row2, _, _ = run_nb(args.nb, case_args, url, max(1, args.duration_secs // 2))
        st.terminate()
        text = st.stderr.read()
        st.wait()
        proc.terminate()
        proc.wait()
        n2 = delivered(row2, fan)
        calls = {}
        for line in text.splitlines():
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
            if m and m.group(2) != "total":
                calls[m.group(2)] = int(m.group(1))
        r["strace_delivered"] = n2
        r["syscalls_per_msg"] = sum(calls.values()) / n2
        r["top_syscalls_per_msg"] = {k: round(v / n2, 4) for k, v in
                                     sorted(calls.items(), key=lambda kv: -kv[1])[:6]}
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration-secs", type=int, default=2)
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--cases", default="1,2,3,4,5,6,7")
    ap.add_argument("--servers", default="nats,skiff")
    args = ap.parse_args()
    servers = args.servers.split(",")
    args.nats_server = os.environ["NATS_SERVER"] if "nats" in servers else None
    args.skiff = os.environ["SKIFF"] if "skiff" in servers else None
    args.nb = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nats", "natsbench")
    for i in args.cases.split(","):
        case = CASES[int(i) - 1]
        for s in args.servers.split(","):
            r = measure(s, case, args)
            print(json.dumps(r), flush=True)
            ceiling = 2e9 / r["nb_ns_per_msg"]
            sys.stderr.write(
                f"{s:5} {case[0]:26} {r['msgs_per_s']:>12,.0f}/s  server {r['server_ns_per_msg']:7.0f} ns/msg"
                f"  natsbench {r['nb_ns_per_msg']:7.0f} ns/msg  ctxsw/msg {r['server_ctxsw_per_msg']:.3f}"
                f"  nb r/w per msg {r['nb_reads_per_msg']:.4f}/{r['nb_writes_per_msg']:.4f}"
                f" ({r['nb_bytes_per_read']:,.0f}/{r['nb_bytes_per_write']:,.0f} B)  lost {r['lost']:,}"
                f"  ceiling(2 cores/nb) {ceiling:>12,.0f}/s  peak RSS {r['peak_rss_kb'] / 1024:.1f} MB"
                + (f"  syscalls/msg {r['syscalls_per_msg']:.3f} {r['top_syscalls_per_msg']}" if args.strace else "")
                + "\n")


if __name__ == "__main__":
    main()
