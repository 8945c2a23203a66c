"""Request/reply: a responder thread answers; request and scatter-gather.
    python examples/python/request_reply.py [locator]"""
import sys
import threading

import skiff

with skiff.connect(sys.argv[1] if len(sys.argv) > 1 else "mem://") as c:
    svc = c.subscribe("svc.echo")
    threading.Thread(target=lambda: [r.respond(b"echo: " + r.data) for r in svc], daemon=True).start()
    print(c.request("svc.echo", b"hello", timeout=2).data)
    print([m.data for m in c.request_many("svc.echo", b"all", timeout=0.5)])
    try:
        c.request("svc.nobody", b"?", timeout=1)
    except skiff.NoResponders as e:
        print("no responders:", e)
