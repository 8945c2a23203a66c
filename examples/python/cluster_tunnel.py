"""Clusters: a member answers requests, hears broadcasts and serves a
tunnel (a file-like object) that upper-cases lines.
    python examples/python/cluster_tunnel.py [locator]"""
import io
import sys
import threading

import skiff

loc = sys.argv[1] if len(sys.argv) > 1 else "mem://"
with skiff.connect(loc) as c, skiff.connect(loc) as worker:
    member = worker.join("upper", capacity=1)

    def serve():
        for item in member:
            if isinstance(item, skiff.TunnelFile):
                with item:
                    for line in io.BufferedReader(item):
                        item.write(line.upper())
            elif item.reply:
                item.respond(item.data.upper())
            else:
                print("broadcast:", item.data)

    threading.Thread(target=serve, daemon=True).start()
    print(c.request("upper", b"one member answers", cluster=True, timeout=2).data)
    c.broadcast("upper", b"to every member")
    with c.tunnel("upper", timeout=2) as t:
        t.write(b"through a tunnel\n")
        print(t.read(100))
