"""`stoker bench loader`: runs on Stoker and on a local folder, generates its data
set when the path has none, reads shards and one-sample-per-file folders, and
reports the AU-90 accelerator count. Performance is the benchmark's business; this
checks that it runs and that its report is well-formed."""
import json


def bench(cluster, path, *args):
    p = cluster.cli("bench", "loader", "--json", "--steps", "3", "--max-accelerators", "2",
                    *args, path, timeout=300)
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def test_bench_loader_on_stoker_and_local(cluster, tmp_path):
    small = ["--samples", "64", "--sample-size", "20K", "--batch", "8", "--compute-ms", "20"]
    r = bench(cluster, cluster.url + "/img", "--preset", "image", *small)
    assert r["fs"] == "stoker" and r["samples"] == 64 and r["batch"] == 8
    assert 0 <= r["au90_accelerators"] <= 2
    if r["au90_accelerators"]:
        assert r["samples_per_s"] > 0 and r["mb_per_s"] > 0 and r["au_min"] >= 0.9
    # the generated shards are read again, not regenerated
    assert any(n.startswith("shard-") for n in
               cluster.cli("ls", "/img").stdout.decode().split())
    r2 = bench(cluster, cluster.url + "/img", "--preset", "image", *small)
    assert r2["samples"] == 64

    seg = ["--samples", "4", "--sample-size", "3M", "--batch", "2", "--compute-ms", "30"]
    r = bench(cluster, cluster.url + "/seg", "--preset", "segmentation", *seg)
    assert r["fs"] == "stoker" and r["samples"] == 4
    r = bench(cluster, str(tmp_path / "seg"), "--preset", "segmentation", *seg)
    assert r["fs"] == "local" and r["samples"] == 4
    assert len(list((tmp_path / "seg").iterdir())) == 4

    # a human-readable run with a fixed accelerator count
    p = cluster.cli("bench", "loader", "--steps", "3", "--accelerators", "1", *small,
                    str(tmp_path / "img"), timeout=300)
    assert b"accelerators at AU >= 90%" in p.stdout
    # bad arguments
    assert cluster.cli("bench", "loader", "--preset", "nope", "x", check=False).returncode == 2
    assert cluster.cli("bench", "loader", check=False).returncode == 2
