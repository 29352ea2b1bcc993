"""Shared by the Python-package tests (test_python*.py, test_torch.py,
test_checkpoint.py, test_bench_loader.py): puts the built package on sys.path and
gives the environment subprocesses need to import it.

The package always comes from the release build (build/python), also when the
daemons come from the sanitizer build (STOKER_BUILD=build-asan): an ASan-built
extension cannot be loaded into an uninstrumented python. $STOKER_PYDIR names
another release build's package (a copy of build/ tested while build/ is rebuilt)."""
import os
import sys

import pytest

from conftest import ROOT

PYDIR = os.environ.get("STOKER_PYDIR") or os.path.join(ROOT, "build", "python")
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)

try:
    import stoker  # noqa: E402
except ImportError as e:  # pragma: no cover - the build is missing
    raise ImportError("stoker package not built (make python): %s" % e)

PYTHON = "/usr/bin/python3"
# `stoker checkpoint resume` runs the package too: the release build's, whichever
# stoker binary runs it.
os.environ.setdefault("STOKER_PYTHONPATH", PYDIR)


def env_for(cluster, **extra):
    """Environment for a child python that imports stoker and talks to cluster."""
    env = dict(os.environ, STOKER_CLUSTER=cluster.url)
    env["PYTHONPATH"] = PYDIR + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


@pytest.fixture
def client(cluster):
    c = stoker.connect(cluster.url)
    yield c
    c.close()
