#!/usr/bin/env python3
"""compute.py: a deterministic Python computation in steps, for checkpoint/restart tests.

Checks that a running CPython interpreter (heap objects, a dict, a hashlib object held in C
memory, the interpreter's frame) survives checkpoint/restart: each step extends a SHA-256 hash
chain, records it in a dict and sieves one more slice of primes, then sleeps 10 ms. Prints
START, then RESULT <hex> (equal to an uninterrupted run's) and PASS if the dict and the sieve
agree with what the loop recorded.

Usage: compute.py [SECONDS=5]
"""
import hashlib
import sys
import time

STEP = 0.01


def main():
    print("START", flush=True)
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    steps = max(1, int(secs / STEP))
    chain = hashlib.sha256(b"ckpt")
    seen = {}
    limit = 200 * steps
    sieve = bytearray([1]) * limit
    sieve[0:2] = b"\x00\x00"
    primes = []
    for s in range(steps):
        for _ in range(50):
            chain.update(chain.digest())
        seen[s % 997] = chain.hexdigest()
        # sieve the slice [200*s, 200*s + 200) using the primes found so far
        lo, hi = 200 * s, 200 * s + 200
        for n in range(max(lo, 2), hi):
            if sieve[n]:
                primes.append(n)
                sieve[n * n : limit : n] = bytes(len(range(n * n, limit, n)))
        time.sleep(STEP)  # PEP 475: restarted after a signal
    ok = len(seen) == min(steps, 997) and all(
        all(p % q for q in primes[:50] if q * q <= p and q != p) for p in primes[-100:]
    )
    result = hashlib.sha256(chain.digest() + repr(sorted(seen.items())).encode() + str(primes[-10:]).encode())
    print("RESULT", result.hexdigest()[:16], flush=True)
    print("PASS" if ok else "FAIL dict or sieve inconsistent", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
