#!/usr/bin/python3
"""One client of the metadata storm (test_meta_storm.py), run in the client's network
namespace: random creates, renames (onto new names and over existing files), unlinks,
mkdir/rmdir and (through a mount) hard links in a folder of its own, for a given time,
while the test kills, restarts and cuts off meta nodes.

It keeps the model of what it was told: each operation acknowledged is applied to
it; one that failed (its answer lost in a failover, or an error a retry on the new
leader gave, docs/meta-replication.md "Limits") may have happened or not, so the
names it touched leave the model for a group of alternatives (the state before and
the state after) and are never used again. At the end it writes the model as JSON:

    {"certain": {name: ["f", content] | ["d"]},
     "groups": [[{name: ["f", content] | ["d"] | null}, ...alternatives], ...],
     "links": [[name, name, ...], ...],   # names of one inode (hard links), all certain
     "done": n, "failed": [[op, name, error], ...]}

Usage: storm_worker.py (--native URL | --mount DIR) --top /NAME --seconds S [--stop FILE]
                       --seed N --out FILE
       storm_worker.py --dump URL --top /A,/B --out FILE
(--dump: what a native client reads of the folders, {top: {name: [type, content,
inode, links]}}, for the test to hold against the models.)
"""
import argparse
import json
import os
import random
import sys
import time


class Native:
    def __init__(self, url, top):
        sys.path.insert(0, os.environ["STOKER_PY"])
        import stoker
        self.c = stoker.connect(url)
        self.top = top

    def p(self, name):
        return self.top + "/" + name

    def setup(self):
        self.c.makedirs(self.top, exist_ok=True)

    def create(self, name, data):
        self.c.write_file(self.p(name), data)

    def unlink(self, name):
        self.c.unlink(self.p(name))

    def rename(self, a, b):
        self.c.rename(self.p(a), self.p(b))

    def mkdir(self, name):
        self.c.mkdir(self.p(name))

    def rmdir(self, name):
        self.c.rmdir(self.p(name))

    link = None


class Mounted:
    def __init__(self, mnt, top):
        self.top = mnt.rstrip("/") + top

    def p(self, name):
        return os.path.join(self.top, name)

    def setup(self):
        os.makedirs(self.top, exist_ok=True)

    def create(self, name, data):
        with open(self.p(name), "xb") as f:
            f.write(data)

    def unlink(self, name):
        os.unlink(self.p(name))

    def rename(self, a, b):
        os.rename(self.p(a), self.p(b))

    def mkdir(self, name):
        os.mkdir(self.p(name))

    def rmdir(self, name):
        os.rmdir(self.p(name))

    def link(self, a, b):
        os.link(self.p(a), self.p(b))


def dump(url, tops, out):
    sys.path.insert(0, os.environ["STOKER_PY"])
    import stat
    import stoker
    c = stoker.connect(url)
    seen = {}
    for top in tops.split(","):
        seen[top] = {}
        for name in c.listdir(top):
            st = c.stat(top + "/" + name)
            if stat.S_ISDIR(st.st_mode):
                seen[top][name] = ["d", None, st.st_ino, st.st_nlink]
            else:
                seen[top][name] = ["f", c.read_file(top + "/" + name).decode(errors="replace"),
                                   st.st_ino, st.st_nlink]
    c.close()
    with open(out, "w") as f:
        json.dump(seen, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump")
    ap.add_argument("--native")
    ap.add_argument("--mount")
    ap.add_argument("--top", required=True)
    ap.add_argument("--seconds", type=float, default=0)  # at most
    ap.add_argument("--stop")  # ends once this file exists
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.dump:
        return dump(a.dump, a.top, a.out)
    fs = Native(a.native, a.top) if a.native else Mounted(a.mount, a.top)
    fs.setup()
    rnd = random.Random(a.seed)
    files = {}  # name -> content (certain, usable)
    dirs = set()  # certain, usable, empty
    inode = {}  # name -> inode group id (files)
    groups, failed = [], []
    done, n = 0, 0
    end = time.monotonic() + a.seconds

    def new(prefix):
        nonlocal n
        n += 1
        return "%s%d" % (prefix, n)

    def retire(names, alternatives, op, err):
        for x in names:
            files.pop(x, None)
            dirs.discard(x)
            inode.pop(x, None)
        groups.append(alternatives)
        failed.append([op, names[0], err])

    while time.monotonic() < end and not (a.stop and os.path.exists(a.stop)):
        kinds = ["create"] * 4 + ["unlink", "rename", "rename_over", "mkdir", "rmdir"]
        if fs.link:
            kinds += ["link"]
        kind = rnd.choice(kinds)
        try:
            if kind == "create" or (kind in ("unlink", "rename", "rename_over", "link")
                                    and not files):
                kind = "create"
                name = new("f")
                data = ("%s-%s" % (a.top, name)).encode()
                try:
                    fs.create(name, data)
                except OSError as e:
                    # made or not; made, perhaps without its bytes: the create was
                    # done, its answer lost, and the retry said EEXIST (an exclusive
                    # create, docs/meta-replication.md "Limits"), so nothing was written
                    retire([name], [{name: None}, {name: ["f", ""]},
                                    {name: ["f", data.decode()]}], kind, str(e))
                    continue
                files[name] = data.decode()
                inode[name] = name
            elif kind == "unlink":
                name = rnd.choice(sorted(files))
                before = files[name]
                try:
                    fs.unlink(name)
                except OSError as e:
                    retire([name], [{name: ["f", before]}, {name: None}], kind, str(e))
                    # the other names of its inode stay: only the count could differ
                    continue
                del files[name]
                inode.pop(name, None)
            elif kind in ("rename", "rename_over"):
                src = rnd.choice(sorted(files))
                others = sorted(x for x in files if x != src)
                dst = rnd.choice(others) if kind == "rename_over" and others else new("f")
                # a rename over another name of the same inode does nothing (POSIX)
                if dst in files and inode.get(dst) == inode.get(src):
                    continue
                x, y = files[src], files.get(dst)
                try:
                    fs.rename(src, dst)
                except OSError as e:
                    retire([src, dst], [{src: ["f", x], dst: ["f", y] if y else None},
                                        {src: None, dst: ["f", x]}], kind, str(e))
                    continue
                del files[src]
                files[dst] = x
                inode[dst] = inode.pop(src)
            elif kind == "mkdir":
                name = new("d")
                try:
                    fs.mkdir(name)
                except OSError as e:
                    retire([name], [{name: None}, {name: ["d"]}], kind, str(e))
                    continue
                dirs.add(name)
            elif kind == "rmdir":
                if not dirs:
                    continue
                name = rnd.choice(sorted(dirs))
                try:
                    fs.rmdir(name)
                except OSError as e:
                    retire([name], [{name: ["d"]}, {name: None}], kind, str(e))
                    continue
                dirs.discard(name)
            elif kind == "link":
                src = rnd.choice(sorted(files))
                dst = new("f")
                try:
                    fs.link(src, dst)
                except OSError as e:
                    retire([dst], [{dst: None}, {dst: ["f", files[src]]}], kind, str(e))
                    continue
                files[dst] = files[src]
                inode[dst] = inode[src]
            done += 1
        except Exception as e:  # a bug in this script, not a storm's effect
            failed.append([kind, "", "unexpected: %r" % e])
            break
    by_inode = {}
    for name, g in inode.items():
        by_inode.setdefault(g, []).append(name)
    model = {"certain": dict({k: ["f", v] for k, v in files.items()},
                             **{d: ["d"] for d in dirs}),
             "groups": groups,
             "links": [sorted(v) for v in by_inode.values() if len(v) > 1],
             "done": done, "failed": failed}
    with open(a.out + ".tmp", "w") as f:
        json.dump(model, f)
    os.rename(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
