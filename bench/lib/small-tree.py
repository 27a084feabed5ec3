#!/usr/bin/env python3
"""The small-file tree of the issue-15 benchmarks: N files of 1-64 KiB
(uniform, random bytes) in 100 directories under ROOT/small.

Usage: small-tree.py ROOT N
"""
import os
import random
import sys

root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(15)
for i in range(n):
    d = f"{root}/small/d{i % 100:03d}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{i:06d}", "wb") as f:
        f.write(os.urandom(rng.randint(1024, 65536)))
