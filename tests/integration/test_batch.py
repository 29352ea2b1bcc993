"""The batched asynchronous API of libstoker (stk_batch_*), through stk_check:
every completion reaped exactly once with the right bytes, short reads at the end
of a file, per-request errors (-EBADF, -EINVAL, -EISDIR, -EFAULT), queue limits,
batched writes read back, and destroy with requests in flight."""


def test_batch_api(cluster):
    p = cluster.check("batch", "/batch", timeout=300)
    assert b"batch: ok" in p.stdout
