"""``benchmarks/bench_threads.py``'s load arrangements: where its hogs run and the fair share (the floor) it reports
for each. Speed is not asserted here: the benchmark prints figures (docs/benchmarks.md, "Threads under load")."""

from __future__ import annotations

import importlib
import os
import sys
import time

import pytest

from tests.conftest import ROOT


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    yield importlib.import_module("bench_threads")
    sys.modules.pop("bench_threads", None)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not hasattr(os, "getsid") or not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")
@pytest.mark.parametrize("where", ["same", "other"])
def test_hogs_run_where_the_arrangement_says_and_stop(bench, where: str):
    hogs, pids = bench.start_hogs(2, where)
    try:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        sessions = {os.getsid(p) for p in pids}
        if where == "same":
            assert sessions == {os.getsid(0)}
        else:  # one job, both hogs in its new session, not this one
            assert len(sessions) == 1 and sessions != {os.getsid(0)}
            assert sessions == {hogs[0].pid}
    finally:
        bench.stop_hogs(hogs)
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)
    assert bench.start_hogs(0, where) == ([], [])


def test_fair_share_per_thread_or_per_session(bench):
    # per thread: a one-thread stage beside h busy processes on 2 CPUs gets 2 / (h + 1) of a CPU
    assert bench.fair_share(2, 2, "same", autogroup=True) == pytest.approx(2 / 3)
    assert bench.fair_share(2, 4, "same", autogroup=True) == pytest.approx(0.4)
    assert bench.fair_share(2, 1, "same", autogroup=False) == 1.0
    # another session's job under autogroup: two sessions share 2 CPUs, one each, however many hogs the job has
    assert bench.fair_share(2, 2, "other", autogroup=True) == 1.0
    assert bench.fair_share(2, 4, "other", autogroup=True) == 1.0
    assert bench.fair_share(1, 4, "other", autogroup=True) == 0.5
    # without autogroup another session is shared per thread like the stage's own
    assert bench.fair_share(2, 4, "other", autogroup=False) == pytest.approx(0.4)
    assert bench._load_name(2, "other") == "2 hogs, other session" and bench._load_name(0, "same") == "idle"
