#!/usr/bin/env python3
"""Deterministic benchmark trees.

  gentree.py mixed DIR        30,000 files, ~1.5 GiB, one 512 MiB file
  gentree.py wide DIR         300,000 small files in 3,000 directories
  gentree.py wide1m DIR       1,000,000 small files in 1,000 directories
  gentree.py tiny100k DIR     100,000 files of 50-2,000 bytes in 100 directories
  gentree.py change DIR PCT LIST
                              rewrite PCT% of the files (every Nth, sorted),
                              write their relative paths to LIST
Half of the content is incompressible, half is text-like.
"""
import os
import random
import sys


def content(rng, size):
    if rng.random() < 0.5:
        return os.urandom(size)
    words = [b"strata", b"generation", b"delta", b"base", b"segment", b"pin", b"sweep", b"journal"]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + (b" " if rng.random() < 0.9 else b"\n")
    return bytes(out[:size])


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def mixed(root):
    rng = random.Random(1)
    big = os.path.join(root, "media", "big.bin")
    os.makedirs(os.path.dirname(big), exist_ok=True)
    with open(big, "wb") as f:
        for _ in range(512):
            f.write(os.urandom(1 << 20))
    budget = 1024 << 20
    n = 29_999
    for i in range(n):
        d = os.path.join(root, f"proj{i % 40:02d}", f"mod{(i // 40) % 25:02d}")
        if i % 1000 == 0:
            size = rng.randint(2 << 20, 6 << 20)
        else:
            size = min(int(rng.lognormvariate(9.6, 1.2)), 1 << 20)
        size = max(0, min(size, budget // max(1, (n - i)) * 4))
        budget -= size
        write(os.path.join(d, f"file{i:05d}.dat"), content(rng, size))


def wide(root):
    rng = random.Random(2)
    for i in range(300_000):
        d = os.path.join(root, f"d{i % 3000:04d}")
        if i < 3000:
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:06d}.txt"), "wb") as f:
            f.write(content(rng, rng.randint(100, 4000)))


def small_files(root, seed, files, dirs, lo, hi):
    """`files` files of lo..hi bytes spread over `dirs` directories."""
    rng = random.Random(seed)
    dw, fw = len(str(dirs - 1)), len(str(files))
    for i in range(files):
        d = os.path.join(root, f"d{i % dirs:0{dw}d}")
        if i < dirs:
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:0{fw}d}.txt"), "wb") as f:
            f.write(content(rng, rng.randint(lo, hi)))


def wide1m(root):
    small_files(root, 4, 1_000_000, 1000, 10, 400)


def tiny100k(root):
    small_files(root, 5, 100_000, 100, 50, 2000)


def change(root, pct, listfile):
    files = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            files.append(os.path.relpath(os.path.join(dirpath, n), root))
    files.sort()
    step = max(1, int(100 / float(pct)))
    rng = random.Random(3)
    chosen = files[::step]
    with open(listfile, "w") as out:
        for rel in chosen:
            p = os.path.join(root, rel)
            size = os.path.getsize(p)
            write(p, content(rng, max(1, min(size, 1 << 20))))
            out.write(rel + "\n")
    print(len(chosen))


if __name__ == "__main__":
    kind = sys.argv[1]
    if kind == "mixed":
        mixed(sys.argv[2])
    elif kind == "wide":
        wide(sys.argv[2])
    elif kind == "wide1m":
        wide1m(sys.argv[2])
    elif kind == "tiny100k":
        tiny100k(sys.argv[2])
    elif kind == "change":
        change(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
