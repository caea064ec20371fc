#!/usr/bin/env python3
"""Grow a strata store into one whose sweep has millions of objects to mark.

    synth_store.py STORE SET REACHABLE UNREACHABLE [PER_MANIFEST]

STORE must hold generation 1 of SET (a real commit). Generations 2, 3, ...
are added as COMMITTED index records, each naming a base manifest copied
from generation 1's (its segment and pack) with PER_MANIFEST (default
100,000) standalone blobs of its own, REACHABLE blobs in all; UNREACHABLE
more blobs are named by no manifest. Blobs are empty files named by a
SHA-256 of a counter: a sweep lists and marks objects by name and never
reads a blob, so only names, manifests and index records must be valid
(manifests are named by the SHA-256 of their bytes). Not a store to read
files from: the blobs hold no content their names promise.
"""
import copy, glob, hashlib, json, os, sys


def touch(store, name):
    d = f"{store}/blobs/{name[:2]}"
    os.close(os.open(f"{d}/{name}", os.O_CREAT | os.O_WRONLY, 0o644))


def blob_name(n):
    return hashlib.sha256(f"synthetic blob {n}".encode()).hexdigest()


def first_generation(store, set_name):
    records = sorted(glob.glob(f"{store}/sets/{set_name}/index/{1:020}.*.json"))
    record = json.load(open(records[-1]))
    name = record["representations"][0]["manifest"]
    manifest = json.load(open(f"{store}/manifests/{name}.json"))
    return record, manifest


def add_generation(store, set_name, g, record, manifest, blobs):
    m = copy.deepcopy(manifest)
    m["generation"] = g
    m["parent"] = None
    m["blobs"] = [{"name": b, "size": 0} for b in blobs]
    body = json.dumps(m, separators=(",", ":")).encode()
    name = hashlib.sha256(body).hexdigest()
    with open(f"{store}/manifests/{name}.json", "wb") as f:
        f.write(body)
    r = copy.deepcopy(record)
    r.update(generation=g, record=1, parent=g - 1)
    r["representations"][0]["manifest"] = name
    with open(f"{store}/sets/{set_name}/index/{g:020}.{1:06}.json", "w") as f:
        json.dump(r, f, indent=2)


def main():
    store, set_name, reachable, unreachable = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    per = int(sys.argv[5]) if len(sys.argv) > 5 else 100_000
    for i in range(256):
        os.makedirs(f"{store}/blobs/{i:02x}", exist_ok=True)
    record, manifest = first_generation(store, set_name)
    n, g = 0, 2
    while n < reachable:
        blobs = [blob_name(n + i) for i in range(min(per, reachable - n))]
        for b in blobs:
            touch(store, b)
        add_generation(store, set_name, g, record, manifest, blobs)
        n, g = n + len(blobs), g + 1
        print(f"\r{n} reachable blobs, {g - 2} generations added", end="", file=sys.stderr)
    for i in range(unreachable):
        touch(store, blob_name(reachable + i))
    print(f"\n{unreachable} unreachable blobs", file=sys.stderr)


main()
