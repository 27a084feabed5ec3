#!/usr/bin/env python3
"""Issue 45's small-file tree: N files of 0.5-8 KiB in N/11 directories
under ROOT (each file's first 8 bytes its number, the rest shared bytes).
With --change SEED: rewrites 1% of that tree's files instead (new random
bytes, 1-8 KiB, an mtime a minute ahead), the files chosen by SEED.

Usage: tree-45.py ROOT N [--change SEED]
"""
import os
import random
import sys
import time

root, n = sys.argv[1], int(sys.argv[2])
dirs = max(1, n // 11)


def path(i):
    return f"{root}/d{i % dirs:05d}/f{i:06d}"


if len(sys.argv) > 3 and sys.argv[3] == "--change":
    rng = random.Random(sys.argv[4])
    later = time.time() + 60
    for i in rng.sample(range(n), max(1, n // 100)):
        with open(path(i), "wb") as f:
            f.write(os.urandom(rng.randint(1024, 8192)))
        os.utime(path(i), (later, later))
else:
    rng = random.Random(45)
    blob = os.urandom(8192)
    for i in range(n):
        os.makedirs(os.path.dirname(path(i)), exist_ok=True)
        size = rng.randint(512, 8192)
        with open(path(i), "wb") as f:
            f.write(i.to_bytes(8, "little") + blob[8:size])
