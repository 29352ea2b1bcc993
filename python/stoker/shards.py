"""Packed shards, as `stoker pack` writes them: reading the index format.

A shard is shard-NNNNN.data (the samples' bytes back to back) and shard-NNNNN.index
(where each sample is and its name). The index format is in docs/python.md and
src/cli/shard.h; a shard whose .index is missing is incomplete and ignored.
"""
import struct

import numpy as np

MAGIC = b"STKSHARD"
VERSION = 1
HEADER = struct.Struct("<8sIIQQQ")          # magic, version, flags, count, data_size, names_size
ENTRY = np.dtype([("offset", "<u8"), ("length", "<u8"), ("name_off", "<u8"),
                  ("name_len", "<u4"), ("reserved", "<u4")])
PREFIX = "shard-"

__all__ = ["ShardIndex", "ShardSet", "parse_index", "shard_names"]


class ShardIndex:
    """One shard's index: offsets, lengths (numpy uint64 arrays) and names."""

    def __init__(self, count, data_size, entries, names_blob):
        self.count = count
        self.data_size = data_size
        self.offsets = entries["offset"].astype(np.uint64)
        self.lengths = entries["length"].astype(np.uint64)
        self._name_off = entries["name_off"]
        self._name_len = entries["name_len"]
        self._names = names_blob

    def name(self, i):
        o = int(self._name_off[i])
        return self._names[o:o + int(self._name_len[i])].decode("utf-8", "surrogateescape")

    def names(self):
        return [self.name(i) for i in range(self.count)]


def parse_index(buf):
    """Parses and checks an index; ValueError if it is damaged."""
    buf = bytes(buf)
    if len(buf) < HEADER.size:
        raise ValueError("shard index too short")
    magic, version, _flags, count, data_size, names_size = HEADER.unpack_from(buf)
    if magic != MAGIC or version != VERSION:
        raise ValueError("not a Stoker shard index (version %d)" % version)
    if HEADER.size + ENTRY.itemsize * count + names_size != len(buf):
        raise ValueError("shard index sizes do not add up")
    entries = np.frombuffer(buf, dtype=ENTRY, count=count, offset=HEADER.size)
    names = buf[HEADER.size + ENTRY.itemsize * count:]
    end = entries["offset"] + entries["length"]
    if count and (end.max() > data_size or (end < entries["offset"]).any() or
                  (entries["name_off"] + entries["name_len"]).max() > names_size):
        raise ValueError("shard index entry out of bounds")
    return ShardIndex(count, data_size, entries, names)


def shard_names(listing):
    """Sorted base names (shard-NNNNN) of the complete shards in a directory listing."""
    have = set(listing)
    return sorted(n[:-6] for n in listing
                  if n.startswith(PREFIX) and n.endswith(".index") and n[:-6] + ".data" in have)


class ShardSet:
    """Every sample of the shards in one directory of a Stoker cluster, numbered
    0..len-1 in shard order. Arrays: shard (int32), offset, length (uint64)."""

    def __init__(self, client, directory):
        self.directory = directory.rstrip("/") or "/"
        bases = shard_names(client.listdir(self.directory))
        self.data_paths = ["%s/%s.data" % (self.directory, b) for b in bases]
        indexes = [parse_index(client.read_file("%s/%s.index" % (self.directory, b)))
                   for b in bases]
        self._indexes = indexes
        counts = [ix.count for ix in indexes]
        self.starts = np.cumsum([0] + counts)[:-1] if counts else np.zeros(0, dtype=np.int64)
        self.shard = np.concatenate([np.full(c, i, dtype=np.int32)
                                     for i, c in enumerate(counts)]) if counts else \
            np.zeros(0, dtype=np.int32)
        self.offset = np.concatenate([ix.offsets for ix in indexes]) if counts else \
            np.zeros(0, dtype=np.uint64)
        self.length = np.concatenate([ix.lengths for ix in indexes]) if counts else \
            np.zeros(0, dtype=np.uint64)

    def __len__(self):
        return len(self.shard)

    def name(self, i):
        s = int(self.shard[i])
        return self._indexes[s].name(i - int(self.starts[s]))

    def names(self):
        return [n for ix in self._indexes for n in ix.names()]
