"""What stoker.jobs.JobMonitor.wrap costs per batch (docs/python.md, "Cost").

    PYTHONPATH=build/python /usr/bin/python3 scripts/jobmonitor-overhead.py

Iterates over ready-made batches with and without wrap(), five rounds each,
alternated, and prints the medians and their difference per batch: the time wrap
adds to a training loop (two clock reads, counting the batch, a few additions).
No storage is read: only the monitor's own cost is measured.
"""
import time, statistics, torch
from stoker.jobs import JobMonitor
mon = JobMonitor("overhead", report=False, interval=600)
def bench(batches, wrapped):
    t0 = time.perf_counter()
    it = mon.wrap(batches) if wrapped else iter(batches)
    for b in it:
        pass
    return (time.perf_counter() - t0) / len(batches) * 1e9
cases = {
    "tensor batch [images(256x3x224x224 uint8), labels]": [[torch.zeros(256, 3, 224, 224, dtype=torch.uint8), torch.zeros(256)]] * 20000,
    "list of 400 bytes samples (StokerDataset, collate_fn=list)": [[b"x" * 100] * 400] * 20000,
}
for name, batches in cases.items():
    plain, wrap = [], []
    for r in range(5):
        plain.append(bench(batches, False)); wrap.append(bench(batches, True))
    print("%s: plain %.0f ns, wrapped %.0f ns, overhead %.1f us per batch" % (name, statistics.median(plain), statistics.median(wrap), (statistics.median(wrap) - statistics.median(plain)) / 1000))
mon.close()
