"""CMQ's queue: push to an address (batched, never waits), pop what came.
    python examples/python/queue.py"""
import skiff

with skiff.Queue("udp://127.0.0.1:0") as a, skiff.Queue("udp://127.0.0.1:0") as b:
    for i in range(10):
        a.push(b.local_addr, f"message {i}".encode(), subject="daq.rate")
    a.flush()
    for _ in range(10):
        print(b.pop(timeout=2).data)
    print(b.stats())
