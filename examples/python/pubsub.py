"""Publish/subscribe: a subscription iterated, and the callback form.
Run a node first (`skiff node`) or pass mem:// for one in this process:
    python examples/python/pubsub.py [locator]"""
import sys
import time

import skiff

with skiff.connect(sys.argv[1] if len(sys.argv) > 1 else "mem://") as c:
    sub = c.subscribe("daq.*.rate")
    c.subscribe("daq.>", callback=lambda m: print("callback:", m.subject, m.data))
    for hall in ("a", "b", "c"):
        c.publish(f"daq.hall{hall}.rate", b"42", type="rate", fields={"unit": "Hz"})
    for _ in range(3):
        m = sub.next(timeout=5)
        print(m.subject, m.type, m.fields, m.data, bytes(m.view))
    time.sleep(0.2)
