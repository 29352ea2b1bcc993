"""Host identity (src/common/host.h): a client reads chunk files itself (short-circuit
reads) only from a storage node that is ONLINE with the client's own host id, never
because the node's address is on 127.0.0.0/8; and free space is counted once per
device over the whole cluster, however many targets of however many storage nodes
share it (df on a mount, `stoker status` totals, mgmtd's cluster metrics).

Nodes on this one machine are made distinct hosts with `--host-id`, a client with
STOKER_HOST_ID."""
import os

from conftest import Mount, have_fuse, run, STOKER

MiB = 1 << 20


def size_words(n):
    """`stoker status`'s rendering of a byte count (stk_format_size)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return ["%d" % n, unit] if unit == "B" else ["%.1f" % n, unit]
        n /= 1024


def total_line(status):
    return [l for l in status.splitlines() if l.strip().startswith("total")][0]


def test_df_counts_a_shared_device_once(role_cluster, tmp_path):
    """Three storage nodes, two targets each, all on this test's file system: the
    mount's df and `stoker status`'s total show that file system once, not six
    targets' (or three nodes') worth of it. (The mount's part needs FUSE.)"""
    rc = role_cluster
    rc.add_meta("meta1")
    for i in range(3):
        rc.add_storage("st%d" % (i + 1), targets=2)
    rc.start_all()
    rc.wait_serving()
    tdir = rc.nodes["st1"].targets[0]
    before = os.statvfs(tdir)

    status = rc.status()
    line = total_line(status)
    assert line.split()[1:3] == size_words(before.f_blocks * before.f_frsize), status
    assert "on 1 device" in line, status

    got = None
    if have_fuse():
        m = Mount(rc, tmp_path / "mnt")
        m.start()
        try:
            got = os.statvfs(m.path)
        finally:
            m.stop()
        assert not m.sanitizer_reports(), m.log()
    after = os.statvfs(tdir)
    if got is not None:
        disk_total = before.f_blocks * before.f_frsize
        mnt_total = got.f_blocks * got.f_frsize
        assert disk_total - 4096 <= mnt_total <= disk_total, (mnt_total, disk_total)
        # Free space moves under the other programs of this machine: compare with
        # the most the disk had around the call, with a little room.
        avail_max = max(before.f_bavail, after.f_bavail) * before.f_frsize
        avail_min = min(before.f_bavail, after.f_bavail) * before.f_frsize
        mnt_avail = got.f_bavail * got.f_frsize
        slack = max(avail_max // 20, 256 * MiB)
        assert mnt_avail <= avail_max + slack, (mnt_avail, avail_max)
        assert mnt_avail >= avail_min - slack, (mnt_avail, avail_min)
        assert got.f_bfree >= got.f_bavail


def test_bad_host_ids_are_refused(role_cluster):
    rc = role_cluster
    p = run([STOKER, "storage", "--data", os.path.join(rc.dir, "x"), "--target",
             os.path.join(rc.dir, "x", "t0"), "--host-id", "two words"], check=False)
    assert p.returncode == 2 and b"bad --host-id" in p.stderr, p.stderr
    p = run([STOKER, "storage", "--data", os.path.join(rc.dir, "x"), "--target",
             os.path.join(rc.dir, "x", "t0"), "--host-id", "h" * 64], check=False)
    assert p.returncode == 2 and b"bad --host-id" in p.stderr, p.stderr
