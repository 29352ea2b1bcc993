"""stoker.torch datasets and `stoker pack`: DataLoaders with several workers read
every sample exactly once per epoch, shuffled, byte-identical to the sources; packed
shards read back identical; damaged or clashing input refused."""
import os
import pickle
import random
import struct

import pytest

from pyhelp import client, stoker  # noqa: F401 (fixture)

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, DataLoader, RandomSampler  # noqa: E402

from stoker.shards import parse_index, shard_names  # noqa: E402
from stoker.torch import ShardDataset, StokerDataset  # noqa: E402


@pytest.fixture
def samples(tmp_path):
    """A local folder of 240 files in nested folders, sizes 0..40 KiB; {relpath: bytes}."""
    rng = random.Random(5)
    src = tmp_path / "src"
    want = {}
    for i in range(240):
        rel = "class%d/%s/s%04d.bin" % (i % 4, "ab"[i % 2], i)
        data = rng.randbytes(rng.choice([0, 1, 100, 4096, 16384, 40000, rng.randrange(40000)]))
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        want[rel] = data
    return src, want


def epoch(loader):
    """{name: bytes} of one pass, checking no name comes twice; and the order seen."""
    seen, order = {}, []
    for names, datas in loader:
        for n, d in zip(names, datas):
            assert n not in seen, "sample %s read twice in one epoch" % n
            seen[n] = d
            order.append(n)
    return seen, order


def check_loader(ds, want, workers):
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers)
    seen1, order1 = epoch(loader)
    assert seen1 == want
    seen2, order2 = epoch(loader)
    assert seen2 == want
    assert order1 != sorted(order1) and order1 != order2   # shuffled, differently per epoch


def test_pack_shards_read_back_identical(cluster, client, samples, tmp_path):
    src, want = samples
    p = cluster.cli("pack", str(src), cluster.url + "/shards", "--shard-size", "200K")
    assert b"packed 240 files" in p.stdout
    bases = shard_names(client.listdir("/shards"))
    assert len(bases) > 5
    got = {}
    for b in bases:
        ix = parse_index(client.read_file("/shards/%s.index" % b))
        data = client.read_file("/shards/%s.data" % b)
        assert ix.data_size == len(data)
        assert len(data) <= 200 * 1024 or ix.count == 1
        for i in range(ix.count):
            o, n = int(ix.offsets[i]), int(ix.lengths[i])
            got[ix.name(i)] = data[o:o + n]
    assert got == want
    # packed in byte order of the names
    order = [n for b in bases for n in parse_index(
        client.read_file("/shards/%s.index" % b)).names()]
    assert order == sorted(want)
    # from Stoker to a local folder, the same shards byte for byte
    client.makedirs("/srcdir/sub")
    for rel in list(want)[:30]:
        client.makedirs("/srcdir/" + os.path.dirname(rel), exist_ok=True)
        client.write_file("/srcdir/" + rel, want[rel])
    cluster.cli("pack", cluster.url + "/srcdir", str(tmp_path / "local"), "--shard-size", "1M")
    local = {}
    for b in shard_names(os.listdir(tmp_path / "local")):
        ix = parse_index((tmp_path / "local" / (b + ".index")).read_bytes())
        data = (tmp_path / "local" / (b + ".data")).read_bytes()
        for i in range(ix.count):
            local[ix.name(i)] = data[int(ix.offsets[i]):int(ix.offsets[i] + ix.lengths[i])]
    assert local == {rel: want[rel] for rel in list(want)[:30]}


def test_pack_refuses_bad_input(cluster, samples, tmp_path):
    src, _ = samples
    cluster.cli("pack", str(src), cluster.url + "/twice")
    p = cluster.cli("pack", str(src), cluster.url + "/twice", check=False)
    assert p.returncode == 1 and b"already holds shards" in p.stderr
    p = cluster.cli("pack", str(tmp_path / "missing"), cluster.url + "/x", check=False)
    assert p.returncode == 1 and b"No such file" in p.stderr
    p = cluster.cli("pack", str(src), check=False)
    assert p.returncode == 2
    p = cluster.cli("pack", str(src), cluster.url + "/y", "--shard-size", "lots", check=False)
    assert p.returncode == 2


def test_damaged_index_is_refused():
    good = struct.pack("<8sIIQQQ", b"STKSHARD", 1, 0, 1, 10, 1) + \
        struct.pack("<QQQII", 0, 10, 0, 1, 0) + b"a"
    assert parse_index(good).name(0) == "a"
    for bad in (good[:-1], b"XTKSHARD" + good[8:],
                good[:40] + struct.pack("<QQQII", 5, 10, 0, 1, 0) + b"a",
                good[:40] + struct.pack("<QQQII", 0, 10, 0, 2, 0) + b"a"):
        with pytest.raises(ValueError):
            parse_index(bad)


def test_directory_dataset_with_workers(cluster, client, samples):
    src, want = samples
    for rel, data in want.items():
        client.makedirs("/ds/" + os.path.dirname(rel), exist_ok=True)
        client.write_file("/ds/" + rel, data)
    ds = StokerDataset(cluster.url + "/ds", return_names=True)
    assert len(ds) == len(want) and ds.names == sorted(want)
    name, data = ds[7]
    assert data == want[name]
    assert ds[-1][0] == sorted(want)[-1]
    with pytest.raises(IndexError):
        ds[len(want)]
    check_loader(ds, want, workers=3)
    # a transform, and a batch sampler handing whole batches to __getitem__
    ds2 = StokerDataset(cluster.url + "/ds", transform=len)
    batches = DataLoader(ds2, sampler=BatchSampler(RandomSampler(ds2), 50, False),
                         batch_size=None, num_workers=2)
    assert sorted(n for b in batches for n in b) == sorted(len(d) for d in want.values())
    # pickles without its connection (spawn-started workers) and reconnects
    ds3 = pickle.loads(pickle.dumps(ds))
    assert ds3[3] == ds[3]


def test_shard_dataset_with_workers(cluster, client, samples):
    src, want = samples
    cluster.cli("pack", str(src), cluster.url + "/sh", "--shard-size", "256K")
    ds = ShardDataset(cluster.url + "/sh", return_names=True)
    assert len(ds) == len(want)
    assert ds[[0, 5]] == [(sorted(want)[0], want[sorted(want)[0]]),
                          (sorted(want)[5], want[sorted(want)[5]])]
    check_loader(ds, want, workers=3)
    tensors = ShardDataset(cluster.url + "/sh",
                           transform=lambda b: torch.frombuffer(bytearray(b) or bytearray(1),
                                                                dtype=torch.uint8))
    total = sum(int(t.numel()) for b in DataLoader(tensors, batch_size=20, num_workers=2,
                                                    collate_fn=list) for t in b)
    assert total == sum(max(len(d), 1) for d in want.values())
    ds3 = pickle.loads(pickle.dumps(ds))
    assert ds3[9] == ds[9]
