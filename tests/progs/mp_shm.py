"""mp_shm: a multiprocessing pool of 2 workers filling an array in shared memory
(multiprocessing.Array, lock-free) and a SharedMemory block; each task computes one slot and
sleeps a little, so a checkpoint lands while the pool works. RESULT hashes both.

Usage: mp_shm.py [SECONDS=4]
"""
import hashlib
import multiprocessing as mp
import struct
import sys
import time
from multiprocessing import shared_memory

arr = None
shm = None


def init(a, name):
    global arr, shm
    arr = a
    shm = shared_memory.SharedMemory(name=name)


def work(i):
    x = i
    for _ in range(2000):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    arr[i] = x % 1000003
    struct.pack_into("<Q", shm.buf, i * 8, x)
    time.sleep(0.04)
    return i


def main():
    print("START", flush=True)
    n = int(float(sys.argv[1]) * 40) if len(sys.argv) > 1 else 160
    a = mp.Array("q", n, lock=False)
    block = shared_memory.SharedMemory(create=True, size=n * 8)
    try:
        with mp.get_context("fork").Pool(2, initializer=init, initargs=(a, block.name)) as pool:
            done = sorted(pool.imap_unordered(work, range(n), chunksize=1))
        h = hashlib.sha256()
        h.update(struct.pack("<%dq" % n, *a))
        h.update(bytes(block.buf[: n * 8]))
        ok = done == list(range(n)) and all(v != 0 for v in a[:])
        print("RESULT " + h.hexdigest()[:16])
        print("PASS" if ok else "FAIL a task is missing")
    finally:
        block.close()
        block.unlink()


if __name__ == "__main__":
    main()
