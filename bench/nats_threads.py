#!/usr/bin/env python3
"""Per-thread CPU of a NATS server and of the load generator during one
natsbench row: for each thread, the time on a CPU and the time runnable but
waiting for one (/proc/PID/task/*/schedstat) and its voluntary and
involuntary context switches, over one second in the middle of a 3 s run.
Says whether a row is CPU-bound (threads waiting for a CPU) or waits on
something else (threads asleep), and which thread is busiest.

    bench/nats_threads.py SERVER "NATSBENCH ARGS" [SERVER ARGS...]

SERVER: nats ($NATS_SERVER), skiff ($SKIFF; `skiff node --tcp none --nats
...` plus SERVER ARGS, e.g. `--spin-us 0`) or floor (bench/nats_floor_relay.c,
compiled into $CARGO_TARGET_DIR, else target/; SERVER ARGS its mode, e.g.
`threads`). NATSBENCH ARGS as bench/nats_front.sh's cases, e.g.
"request -conc 16 -size 8". Needs bench/nats/natsbench (bench/nats/build.sh).
"""
import json, os, socket, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from nats_cost import floor_relay, port as free_port  # noqa: E402  (the relay's build and a free port, shared)


def snap(pid):
    """thread id -> (name, ns on CPU, ns runnable waiting, voluntary, involuntary switches)."""
    d = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            run, wait, _ = open(f"/proc/{pid}/task/{t}/schedstat").read().split()
            name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
            sw = [int(l.split()[1]) for l in open(f"/proc/{pid}/task/{t}/status")
                  if l.startswith(("voluntary_ctxt", "nonvoluntary_ctxt"))]
            d[t] = (name, int(run), int(wait), sw[0], sw[1])
        except (OSError, ValueError, IndexError):
            pass
    return d


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("nats", "skiff", "floor"):
        sys.exit(__doc__)
    which, nb_args, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    port = free_port()
    if which == "nats":
        cmd = [os.environ["NATS_SERVER"], "-a", "127.0.0.1", "-p", str(port), *extra]
    elif which == "skiff":
        cmd = [os.environ["SKIFF"], "node", "--tcp", "none", "--nats", f"127.0.0.1:{port}", *extra]
    else:
        cmd = [floor_relay(), str(port), *extra]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            time.sleep(0.05)
    nb = subprocess.Popen([os.path.join(HERE, "nats", "natsbench"), *nb_args.split(),
                           "-url", f"nats://127.0.0.1:{port}", "-duration", "3s"],
                          stdout=subprocess.PIPE)
    time.sleep(1.2)
    a = {pid: snap(pid) for pid in (srv.pid, nb.pid)}
    t0 = time.time()
    time.sleep(1.0)
    dt = time.time() - t0
    b = {pid: snap(pid) for pid in (srv.pid, nb.pid)}
    out = nb.communicate()[0]
    srv.terminate()
    srv.wait()
    row = json.loads(out)
    print(f"{which} {nb_args}: {row['msgs_per_s']:,.0f} msg/s, p50 {row.get('p50_us')} µs")
    for pid, label in ((srv.pid, "server"), (nb.pid, "natsbench")):
        on = waiting = 0.0
        lines = []
        for t, (name, run, wait, vol, inv) in sorted(b[pid].items()):
            if t not in a[pid]:
                continue
            o = a[pid][t]
            r, w = (run - o[1]) / 1e9 / dt, (wait - o[2]) / 1e9 / dt
            on += r
            waiting += w
            if r > 0.01:
                lines.append(f"    {name}/{t}: on CPU {r:.2f}, waiting {w:.2f} cores;"
                             f" {(vol - o[3]) / dt:,.0f} voluntary, {(inv - o[4]) / dt:,.0f} involuntary switches/s")
        print(f"  {label}: on CPU {on:.2f} cores, runnable and waiting {waiting:.2f} cores")
        print("\n".join(lines))


main()
