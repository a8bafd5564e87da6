#!/usr/bin/env python3
"""threads.py: a pool of Python threads in steps, for checkpoint/restart tests.

Four worker threads take numbered jobs from a queue and extend a SHA-256 chain of their own
for each; the main thread hands out four jobs a step, waits for their answers, folds them into
its own chain in job order, then sleeps 10 ms. Prints START, then RESULT <hex> (equal to an
uninterrupted run's) and PASS if the answers equal the same work done again on the main thread.

Usage: threads.py [SECONDS=5]
"""
import hashlib
import queue
import sys
import threading
import time

WORKERS = 4


def work(n):
    h = hashlib.sha256(str(n).encode())
    for _ in range(200):
        h = hashlib.sha256(h.digest())
    return h.digest()


def worker(jobs, answers):
    while True:
        n = jobs.get()
        if n is None:
            return
        answers.put((n, work(n)))


def main():
    print("START", flush=True)
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    steps = max(1, int(secs / 0.01))
    jobs, answers = queue.Queue(), queue.Queue()
    pool = [threading.Thread(target=worker, args=(jobs, answers)) for _ in range(WORKERS)]
    for t in pool:
        t.start()
    chain = hashlib.sha256(b"ckpt")
    for s in range(steps):
        for w in range(WORKERS):
            jobs.put(s * WORKERS + w)
        got = dict(answers.get() for _ in range(WORKERS))
        for n in sorted(got):
            chain.update(got[n])
        time.sleep(0.01)
    for _ in pool:
        jobs.put(None)
    for t in pool:
        t.join()
    again = hashlib.sha256(b"ckpt")
    for n in range(steps * WORKERS):
        again.update(work(n))
    ok = again.digest() == chain.digest()
    print("RESULT", chain.hexdigest()[:16], flush=True)
    print("PASS" if ok else "FAIL the pool's answers differ from the work done again", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
