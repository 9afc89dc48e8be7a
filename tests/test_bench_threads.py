"""``benchmarks/bench_threads.py``'s load arrangements: where its hogs run and the fair share (the floor) it reports
for each. Speed is not asserted here: the benchmark prints figures (docs/benchmarks.md, "Threads under load")."""

from __future__ import annotations

import importlib
import os
import subprocess
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


def test_fair_share_per_thread_or_per_group(bench):
    # per thread: a one-thread stage beside h busy processes on 2 CPUs gets 2 / (h + 1) of a CPU
    assert bench.fair_share(2, 2, groups=0) == pytest.approx(2 / 3)
    assert bench.fair_share(2, 4, groups=0) == pytest.approx(0.4)
    assert bench.fair_share(2, 1, groups=0) == 1.0
    # another session's job under autogroup is one group: the stage's group and it share 2 CPUs, one each
    assert bench.fair_share(2, 2, groups=1) == 1.0
    assert bench.fair_share(2, 4, groups=1) == 1.0
    assert bench.fair_share(1, 4, groups=1) == 0.5
    # two other sessions with two hogs each: three groups
    assert bench.fair_share(2, 4, groups=2) == pytest.approx(2 / 3)
    assert bench._load_name(2, "other") == "2 hogs, other session" and bench._load_name(0, "same") == "idle"


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="the kernel has no autogroup")
def test_hog_groups_count_sessions_only_where_the_kernel_does(bench):
    """The floor's group count: 0 for hogs of this session; 1 for another session's job where autogroup is on and
    every process is in the root CPU cgroup (where it applies); 0 wherever that cannot be told."""
    root = bench._cpu_cgroup("self") == "/"
    for where in ("same", "other"):
        hogs, pids = bench.start_hogs(2, where)
        try:
            readable = all(bench._autogroup_id(p) is not None for p in ("self", *pids))
            expected = 1 if where == "other" and bench._autogroup() and root and readable else 0
            assert bench.hog_groups(pids) == expected
        finally:
            bench.stop_hogs(hogs)
    assert bench.hog_groups([]) == 0


def test_hog_groups_is_zero_where_the_autogroup_files_cannot_be_read(bench, monkeypatch):
    """An autogroup file that is missing, empty or garbled (a CI sandbox's read empty) means "cannot be told": no group
    is counted, and nothing raises. Well-formed files in distinct groups count one per group."""
    files = {"/proc/sys/kernel/sched_autogroup_enabled": "1\n"}
    monkeypatch.setattr(bench, "_read", lambda path: files.get(path))
    monkeypatch.setattr(bench, "_cpu_cgroup", lambda pid: "/")
    files |= {"/proc/self/autogroup": "/autogroup-5 nice 0\n", "/proc/11/autogroup": "/autogroup-9 nice 0\n",
              "/proc/12/autogroup": "/autogroup-9 nice 0\n", "/proc/13/autogroup": "/autogroup-10 nice 0\n"}
    assert bench.hog_groups([11, 12]) == 1
    assert bench.hog_groups([11, 13]) == 2
    files["/proc/14/autogroup"] = "/autogroup-5 nice 0\n"  # shares the stage's group
    assert bench.hog_groups([11, 14]) == 0
    for bad in ("", "\n", "garbage", "autogroup-9"):
        files["/proc/self/autogroup"] = bad
        assert bench.hog_groups([11, 12]) == 0, bad
    files["/proc/self/autogroup"] = "/autogroup-5 nice 0\n"
    files["/proc/12/autogroup"] = ""
    assert bench.hog_groups([11, 12]) == 0
    assert bench._autogroup_id(99) is None  # no such file


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")
@pytest.mark.parametrize("where", ["same", "other"])
def test_hogs_die_with_a_benchmark_killed_outright(where: str):
    """A benchmark killed with SIGKILL (no cleanup runs) leaves no busy process behind."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import bench_threads as b; "
            f"h, p = b.start_hogs(2, {where!r}); print(*p, flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = [int(x) for x in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def test_demo_loaded_script_parses_and_refuses_an_unknown_load(tmp_path):
    script = ROOT / "benchmarks" / "demo_loaded.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    out = tmp_path / "out.txt"
    proc = subprocess.run(["bash", str(script), "busy", str(out)], capture_output=True, text=True)
    assert proc.returncode == 2 and "'idle', 'same' or 'other', not 'busy'" in proc.stderr
    assert not out.exists()
