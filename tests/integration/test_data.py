"""Data through the native client and the CLI: sizes around chunk boundaries,
many files, directories, rename, links, concurrent writers, the full API."""
import hashlib
import os

import pytest

MiB = 1 << 20
SIZES = [0, 1, 4095, 4096, 4097, MiB - 1, MiB, MiB + 1, 4 * MiB + 123, 17 * MiB - 5]


@pytest.mark.parametrize("size", SIZES)
def test_put_get_round_trip(cluster, rand_file, tmp_path, size):
    src = rand_file(size)
    cluster.cli("put", str(src), "/f.bin")
    out = tmp_path / "out.bin"
    cluster.cli("get", "/f.bin", str(out))
    assert out.read_bytes() == src.read_bytes()
    st = cluster.cli("stat", "/f.bin").stdout.decode()
    assert "Size: %d " % size in st


def test_large_file_round_trip(cluster, tmp_path):
    size = 300 * MiB + 12345
    cluster.check("write", "/big.bin", str(size), "42", str(3 * MiB + 7))
    cluster.check("verify", "/big.bin", str(size), "42")
    # and through the CLI, byte for byte
    out = tmp_path / "big.out"
    cluster.cli("get", "/big.bin", str(out))
    assert out.stat().st_size == size


def test_stdin_and_stdout(cluster):
    cluster.cli("put", "-", "/from-stdin", input=b"piped bytes\n" * 1000)
    assert cluster.cli("cat", "/from-stdin").stdout == b"piped bytes\n" * 1000
    assert cluster.cli("get", "/from-stdin", "-").stdout == b"piped bytes\n" * 1000


def test_api_conformance(cluster):
    """Every libstoker call, with the errno each misuse must give."""
    cluster.check("api", "/api")


def test_concurrent_writers(cluster):
    cluster.check("concurrent", "/conc", "8", str(5 * MiB + 3))


def test_many_files_and_directories(cluster, tmp_path):
    cluster.cli("mkdir", "-p", "/many/a/b/c")
    for i in range(200):
        cluster.cli("put", "-", "/many/a/f%03d" % i, input=b"%d" % i)
    names = cluster.cli("ls", "/many/a").stdout.decode().split()
    assert sorted(names) == sorted(["b"] + ["f%03d" % i for i in range(200)])
    assert cluster.cli("cat", "/many/a/f123").stdout == b"123"
    long_ls = cluster.cli("ls", "-l", "/many/a").stdout.decode()
    assert long_ls.startswith("d") or "\nd" in long_ls
    cluster.cli("rm", "-r", "/many")
    p = cluster.cli("ls", "/many", check=False)
    assert p.returncode == 1 and b"No such file" in p.stderr


def test_mkdir_rm_mv_errors(cluster):
    p = cluster.cli("mkdir", "/no/such/parent", check=False)
    assert p.returncode == 1 and b"No such file" in p.stderr
    cluster.cli("mkdir", "/d")
    p = cluster.cli("mkdir", "/d", check=False)
    assert p.returncode == 1 and b"File exists" in p.stderr
    cluster.cli("mkdir", "-p", "/d")  # -p: fine when it exists
    cluster.cli("put", "-", "/d/x", input=b"x")
    p = cluster.cli("rm", "/d", check=False)
    assert p.returncode == 1 and b"use -r" in p.stderr
    p = cluster.cli("rm", "/nope", check=False)
    assert p.returncode == 1
    cluster.cli("rm", "-f", "/nope")
    cluster.cli("mkdir", "/e")
    cluster.cli("mv", "/d/x", "/e")  # into a directory, like mv(1)
    assert cluster.cli("cat", "/e/x").stdout == b"x"
    cluster.cli("mv", "/e/x", "/e/y")
    assert cluster.cli("ls", "/e").stdout == b"y\n"
    p = cluster.cli("mv", "/e", "/e/y/z", check=False)
    assert p.returncode == 1


def test_unlink_frees_chunks(cluster, rand_file):
    src = rand_file(8 * MiB)
    cluster.cli("put", str(src), "/gone.bin")
    assert len(cluster.chunk_files()) == 8
    cluster.cli("rm", "/gone.bin")
    assert cluster.chunk_files() == []


def test_overwrite_with_truncate_drops_old_tail(cluster, rand_file):
    big = rand_file(6 * MiB, seed=3)
    small = rand_file(100, seed=4)
    cluster.cli("put", str(big), "/t.bin")
    cluster.cli("put", str(small), "/t.bin")
    assert cluster.cli("cat", "/t.bin").stdout == small.read_bytes()
    assert len(cluster.chunk_files()) == 1


def test_data_is_striped_over_targets(cluster, rand_file):
    src = rand_file(16 * MiB)
    cluster.cli("put", str(src), "/striped.bin")
    per_target = [sum(1 for f in cluster.chunk_files() if f.startswith(t + "/"))
                  for t in cluster.target_dirs()]
    assert sum(per_target) == 16
    assert all(n == 4 for n in per_target), per_target


def test_special_files_and_holes_through_libstoker(cluster):
    """stk_mknod and stk_fallocate without a mount: fifo, socket and device inodes
    with their type and rdev (data calls refused with EINVAL), a sparse file whose
    st_blocks counts the 1 MiB written, punch-hole and zero-range bytes and blocks."""
    if os.geteuid() != 0:
        pytest.skip("device nodes need root")
    cluster.check("special", "/special")
