"""PyTorch datasets over Stoker, read through batched reads.

    from torch.utils.data import DataLoader
    from stoker.torch import StokerDataset, ShardDataset

    ds = ShardDataset("stk://HOST:PORT/imagenet-shards", transform=decode)
    for batch in DataLoader(ds, batch_size=400, shuffle=True, num_workers=4):
        ...

Both datasets are map-style. A DataLoader with batch_size fetches a whole batch
with one call to the dataset's __getitems__, which reads every sample of the batch
with one Client.read_batch: one submit of many reads, spread over the cluster's
chains, instead of one read per sample. Indexing with a list (ds[[3, 1, 4]]) does
the same, so a BatchSampler passed as `sampler` with batch_size=None also works.

Workers: each DataLoader worker process (fork, or spawn: the datasets pickle
without their connection) gets a connection of its own on its first read; shard
files are reopened per process.

Items are the samples' bytes, or transform(bytes) when a transform is given;
with return_names=True, (name, item) where name is the path relative to the root.

JobMonitor (stoker.jobs) records how long the training loop waits on a DataLoader
and reports it to the cluster's dashboard: `for batch in mon.wrap(loader)`.
"""
import os

import numpy as np
import torch.utils.data

import stoker
from stoker.jobs import JobMonitor
from stoker.shards import ShardSet

__all__ = ["StokerDataset", "ShardDataset", "JobMonitor"]


def _indices(idx, n):
    if isinstance(idx, (int, np.integer)):
        return None
    if hasattr(idx, "tolist"):
        idx = idx.tolist()
    return list(idx)


class _Base(torch.utils.data.Dataset):
    def __init__(self, root, transform=None, client=None, return_names=False, **connect_opts):
        cluster, path = stoker.split_url(root)
        if client is not None and cluster is None:
            cluster = client.address
        self.root = path.rstrip("/") or "/"
        self.cluster = cluster
        self.transform = transform
        self.return_names = return_names
        self._opts = connect_opts
        self._client = client

    @property
    def client(self):
        if self._client is None or self._client.closed:
            self._client = stoker.connect(self.cluster, **self._opts)
        return self._client

    def __getstate__(self):
        # A connection does not cross a pickle (spawn-started workers): reconnect there.
        st = dict(self.__dict__)
        st["_client"] = None
        st.pop("_files", None)
        return st

    def _finish(self, names, datas):
        out = []
        for name, data in zip(names, datas):
            item = self.transform(data) if self.transform is not None else data
            out.append((name, item) if self.return_names else item)
        return out

    def _check(self, idx):
        n = len(self)
        i = int(idx)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("index %d out of range for %d samples" % (int(idx), n))
        return i

    def __getitem__(self, idx):
        many = _indices(idx, len(self))
        if many is not None:
            return self.__getitems__(many)
        return self.__getitems__([idx])[0]

    def __getitems__(self, indices):
        raise NotImplementedError


class StokerDataset(_Base):
    """One sample per file: every regular file under root (recursively), in byte
    order of their paths relative to root. The file list is taken once, at
    construction."""

    def __init__(self, root, transform=None, client=None, return_names=False, **connect_opts):
        super().__init__(root, transform, client, return_names, **connect_opts)
        names = []
        for dirpath, dirs, files in self.client.walk(self.root):
            rel = os.path.relpath(dirpath, self.root) if dirpath != self.root else ""
            names.extend(os.path.join(rel, f) if rel else f for f in files)
        names.sort(key=lambda s: s.encode("utf-8", "surrogateescape"))
        self.names = names

    def __len__(self):
        return len(self.names)

    def path(self, i):
        return self.root.rstrip("/") + "/" + self.names[i]

    def __getitems__(self, indices):
        idx = [self._check(i) for i in indices]
        datas = self.client.read_batch([(self.path(i), 0, None) for i in idx])
        return self._finish([self.names[i] for i in idx], datas)


class ShardDataset(_Base):
    """Samples packed by `stoker pack` into the shards of one directory, numbered in
    shard order. Shard files stay open (one handle per shard per process)."""

    def __init__(self, shards_dir, transform=None, client=None, return_names=False,
                 **connect_opts):
        super().__init__(shards_dir, transform, client, return_names, **connect_opts)
        self.shards = ShardSet(self.client, self.root)
        self._files = None

    def __len__(self):
        return len(self.shards)

    def name(self, i):
        return self.shards.name(self._check(i))

    def _open_files(self):
        files = getattr(self, "_files", None)
        if files is None or files[0] != os.getpid() or self.client is not files[2]:
            c = self.client
            files = (os.getpid(), [c.open(p) for p in self.shards.data_paths], c)
            self._files = files
        return files[1]

    def __getitems__(self, indices):
        idx = [self._check(i) for i in indices]
        files = self._open_files()
        s = self.shards
        reqs = [(files[s.shard[i]], int(s.offset[i]), int(s.length[i])) for i in idx]
        datas = self.client.read_batch(reqs)
        names = [s.name(i) for i in idx] if self.return_names else [None] * len(idx)
        return self._finish(names, datas)
