#!/usr/bin/env python3
"""sqlite_wal.py: a SQLite database in WAL mode, written every step, for checkpoint/restart tests.

WORKDIR/data.db is opened in WAL mode with frequent WAL checkpoints (so the database file itself
is changed in place, not only the -wal file appended to; the -shm index is a shared mapping).
Each step inserts one row i in its own transaction and checks that the table holds exactly the
rows this program inserted (count and sum, which it also keeps in memory). A restart whose files
are newer than its memory (the job wrote on after the checkpoint, then crashed) shows rows the
restored memory never inserted: FAIL. At the end, PRAGMA integrity_check must say ok. RESULT is
a hash of the table.

Usage: sqlite_wal.py WORKDIR [SECONDS=4]
"""
import hashlib
import sqlite3
import sys
import time

STEP = 0.02


def main():
    work = sys.argv[1]
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
    steps = max(1, int(secs / STEP))
    db = sqlite3.connect(f"{work}/data.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=20")
    db.execute("CREATE TABLE t (i INTEGER PRIMARY KEY, v TEXT)")
    print("START", flush=True)
    bad = 0
    total = 0
    for i in range(steps):
        v = hashlib.sha256(str(i).encode()).hexdigest() * 8
        db.execute("BEGIN")
        db.execute("INSERT INTO t VALUES (?, ?)", (i, v))
        db.execute("COMMIT")
        total += i
        n, s = db.execute("SELECT count(*), coalesce(sum(i), 0) FROM t").fetchone()
        if (n, s) != (i + 1, total):
            bad += 1
            if bad <= 3:
                print(f"FAIL step {i}: the table holds {n} rows (sum {s}), this program inserted {i + 1} (sum {total})", flush=True)
        time.sleep(STEP)
    ok = db.execute("PRAGMA integrity_check").fetchone()[0]
    if ok != "ok":
        bad += 1
        print(f"FAIL integrity_check: {ok}", flush=True)
    h = hashlib.sha256()
    for row in db.execute("SELECT i, v FROM t ORDER BY i"):
        h.update(f"{row[0]}:{row[1]}".encode())
    print(f"RESULT {h.hexdigest()[:16]}", flush=True)
    print("PASS" if bad == 0 else f"FAIL {bad} check(s) failed", flush=True)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
