"""`stoker plan`: the worked example of docs/plan.md, cases checked by hand, and
bad input refused with a reason."""
import json

from conftest import STOKER, run


def plan(*args):
    return json.loads(run([STOKER, "plan", "--json", *args]).stdout)


def test_the_worked_example():
    # 1 TB kept as it came, 2 TB preprocessed, 5 x 20 GB checkpoints, 200 GB scratch,
    # x 1.3: 4.29 TB usable; 3 copies: 12.87 TB raw
    p = plan()
    assert p["usable_bytes"] == 4.29e12
    assert p["raw_bytes"] == 12.87e12
    assert p["nodes"] == 3 and p["bound_by"] == "one node per copy"
    out = run([STOKER, "plan"]).stdout.decode()
    assert "4.29 TB" in out and "12.87 TB" in out and "=> 3 nodes" in out, out


def test_cases_worked_by_hand():
    # growth: (500 + 1000) TB x 1.5^2 = 3375 TB, + 0.3 TB, x 1.3 = 4387.89 TB usable;
    # 4+2 erasure coding: x 1.5 raw = 6581.835 TB; / (61.44 TB x 0.8) = 133.9 -> 134
    p = plan("--dataset", "500T", "--growth", "50", "--years", "2", "--ec", "4+2")
    assert round(p["usable_bytes_at_horizon"] / 1e9) == 4387890
    assert round(p["raw_bytes"] / 1e9) == 6581835
    assert p["nodes"] == 134 and p["bound_by"] == "capacity"
    # reads: 512 GPUs x 2000 samples/s x 115 KB = 117.76 GB/s: 5 nodes of 25 GB/s;
    # 1,024,000 IOPS: 2 nodes of a million; a small data set: bound by reads
    p = plan("--dataset", "10G", "--gpus", "512", "--rate", "2000")
    assert p["read_bytes_per_s"] == 117.76e9 and p["read_iops"] == 1024000
    assert p["nodes_for"]["read"] == 5 and p["nodes_for"]["iops"] == 2
    assert p["nodes"] == 5 and p["bound_by"] == "read bandwidth"
    # a 2 TB checkpoint saved within 100 s, 3 copies: 60 GB/s onto disks, 6 nodes
    p = plan("--checkpoint", "2T", "--keep", "1", "--save-within", "100")
    assert p["disk_write_bytes_per_s"] == 60e9 and p["nodes"] == 6
    assert p["bound_by"] == "checkpoint write bandwidth"
    # binary units, no raw copy kept
    p = plan("--dataset", "1Ti", "--no-raw", "--expand", "1", "--keep", "0",
             "--scratch", "0", "--overhead", "1", "--replicas", "1")
    assert p["usable_bytes"] == 1 << 40 and p["nodes"] == 1


def test_bad_input_is_refused_with_a_reason():
    for args, why in ((["--dataset", "1x"], b"with a unit"),
                      (["--ec", "4"], b"K+M"),
                      (["--overhead", "0.5"], b"at least 1"),
                      (["--fill", "2"], b"at most 1"),
                      (["--replicas", "0"], b"1 to 8"),
                      (["--gpus", "-3"], b"non-negative"),
                      (["extra"], b"unexpected argument")):
        p = run([STOKER, "plan", *args], check=False)
        assert p.returncode == 2 and why in p.stderr, (args, p.stderr)
