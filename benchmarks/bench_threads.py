"""Threads under load: the demo's pretraining stage idle and beside CPU hogs, with the old thread setting and the new.

old: what minimodel did before it chose threads: torch's default team (one thread per core: ``cpu.threads`` = the
usable CPUs) and OpenMP's default wait policy (torch imported before the command runs, so nothing sets it). new: the
default configuration (``cpu.threads: 0``: ``threads.choose_threads`` and ``threads.wait_policy`` decide, as the
command line does). Loaded: ``--hogs`` processes spinning in pure Python beside the stage (2 on this 2-core machine:
loaded twice over). Each run is one ``minimodel pretrain`` of the demo's BL_BASE (4 layers of width 64, 32 x 128
tokens per update) in a fresh process, stopped cleanly after ``--minutes``; its speed is the median tokens/s of its
logged intervals after the first. The figure of merit: each setting's loaded speed against the idle speed of the
default setting of its time (idle old), as a slowdown ratio.

The floor: a process with one thread beside ``--hogs`` busy processes gets at best its fair share of one CPU
(``fair_share``: ``cpus / (hogs + 1)`` beside hogs of its own session, 2/3 here; ``cpus / (groups + 1)`` beside
hogs in scheduling groups of their own, ``hog_groups``: one for another session's job where the kernel shares between
sessions first), so no such setting runs faster, loaded, than the idle
one-thread speed (the third idle setting, ``one``: ``cpu.threads=1``) times that share. The floor ratio is idle old
over that speed. Beside hogs of the stage's own session on 2 CPUs it is 1.5x times what the second thread gains idle,
so issue 44's target, 1.5x, is out of reach there wherever two threads beat one; beside another session's hogs it is
what the second thread gains idle, and the target is within reach. Also reported: the new setting against its floor
(within 1.2x of it: a restatement proposed in an earlier stop). A third loaded setting, ``all``, keeps one thread per
CPU with the new wait policy: a larger team may take more than a fair share of a busy machine, at the cost of waits.

Each loaded run also records the CPU it and the hogs got (their CPU seconds over the run's wall time, in CPUs): what a
setting takes from the other work on the machine. ``--hogs`` takes several counts (``--hogs 2 4``: the issue's load and
twice it); the figure of merit and the floor are given for each.

Where the other work runs (``--sessions``): ``same``, the hogs are children of this benchmark, in the stage's own
session; ``other``, they are one job of their own, started in a new session (``setsid``), as work started from another
terminal, login or service is. Linux's scheduler shares the CPU fairly between threads within a session but, where
autogroup is on (``/proc/sys/kernel/sched_autogroup_enabled`` = 1, recorded; on by default in kernels built with it,
as many distributions' are), between sessions first: a one-thread stage beside another session's two hogs then has a fair share of a
whole CPU, and its floor is the idle one-thread speed (where autogroup is off, ``other`` is ``same`` again). ``same``
is the worst case: the other work counted as the stage's own.

    .venv/bin/python benchmarks/bench_threads.py [--minutes 1.0] [--hogs 2 [4 ...]] [--sessions same [other]]
        [--reps 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
DEMO = str(ROOT / "experiments" / "demo.yaml")
OLD = "import sys, torch; from minimodel.cli import main; sys.exit(main(sys.argv[1:]))"  # torch first: no policy set
NEW = "import sys; from minimodel.cli import main; sys.exit(main(sys.argv[1:]))"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")}
    env["WANDB_MODE"] = "disabled"
    return env


def _cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat's ``cpu`` line: user nice system idle iowait irq softirq steal ...)."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return []


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (/proc/PID/stat's fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_stage(work: Path, name: str, setting: str, minutes: float, cpus: int, hogs: list[int]) -> dict[str, float]:
    runs = work / "runs" / name
    args = [DEMO, "system=bl_base", f"runs_dir={runs}", f"data.prepared_dir={work / 'prepared'}", "data.num_workers=0",
            "logging.wandb=disabled", "pretrain.trainer.log_every=5", f"pretrain.trainer.max_minutes={minutes}",
            "pretrain.trainer.val_every=100000", "pretrain.trainer.ckpt_every=100000", "--no-progress"]
    # old and all: every CPU (all with the new wait policy: PASSIVE when the machine is busy at the start); new: chosen
    threads = {"old": cpus, "all": cpus, "one": 1}.get(setting)
    if threads:
        args.append(f"cpu.threads={threads}")
    start, before = time.monotonic(), _cpu_times()
    own_before, hogs_before = _children_cpu_s(), sum(_proc_cpu_s(h) for h in hogs)
    proc = subprocess.run([PY, "-c", OLD if setting == "old" else NEW, "pretrain", *args], env=_env(), cwd=ROOT,
                          capture_output=True, text=True)
    wall, after = time.monotonic() - start, _cpu_times()
    own_cpus = (_children_cpu_s() - own_before) / wall
    hogs_cpus = (sum(_proc_cpu_s(h) for h in hogs) - hogs_before) / wall
    # the share of CPU time the hypervisor gave other machines (steal): a virtual machine's idle speed moves with it
    spent = [b - a for a, b in zip(before, after)]
    steal = 100.0 * spent[7] / sum(spent) if len(spent) > 7 and sum(spent) else 0.0
    if proc.returncode not in (0, 3):
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    chose = next((line.split("pretrain: ", 1)[1] for line in proc.stderr.splitlines() if "CPU thread" in line), "?")
    metrics = next(runs.glob("**/pretrain/metrics.csv"))
    with metrics.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("perf/tokens_per_sec")]
    speeds = [float(r["perf/tokens_per_sec"]) for r in rows[1:]] or [float(r["perf/tokens_per_sec"]) for r in rows]
    updates = max(float(r["train/updates"]) for r in rows) if rows else 0.0
    return {"tokens_per_s": statistics.median(speeds) if speeds else 0.0, "updates": updates, "wall_s": wall,
            "threads": chose, "steal_pct": steal, "stage_cpus": own_cpus, "hogs_cpus": hogs_cpus}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=1.0)
    p.add_argument("--hogs", type=int, nargs="+", default=[2])
    p.add_argument("--sessions", nargs="+", choices=("same", "other"), default=["same"])
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    for sig in (signal.SIGTERM, signal.SIGHUP):  # stopped (timeout, a closed terminal): the hogs are still stopped
        signal.signal(sig, lambda *_: sys.exit(143))
    cpus = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([PY, "-m", "minimodel.cli", "prepare", DEMO, f"data.prepared_dir={work / 'prepared'}",
                        "--langs=en", "--no-progress"], env=_env(), cwd=ROOT, check=True, capture_output=True)
        rows = []
        loads = [(0, "same")] + [(n, where) for where in args.sessions for n in args.hogs]
        for rep in range(args.reps):
            for n_hogs, where in loads:
                load = _load_name(n_hogs, where)
                hogs: list[subprocess.Popen] = []
                try:
                    hogs, pids = start_hogs(n_hogs, where)
                    time.sleep(2 if hogs else 0)
                    groups = hog_groups(pids)
                    for setting in ("old", "new", "all") if hogs else ("old", "new", "one"):
                        row = {"rep": rep, "load": load, "hogs": n_hogs, "session": where, "hog_groups": groups,
                               "setting": setting,
                               **run_stage(work, f"{n_hogs}-{where}-{setting}-{rep}", setting, args.minutes, cpus,
                                           pids)}
                        rows.append(row)
                        print(f"{load:20} {setting}: {row['tokens_per_s']:9,.0f} tokens/s, {row['updates']:5.0f} "
                              f"updates in {row['wall_s']:.0f} s (CPUs: stage {row['stage_cpus']:.2f}, hogs "
                              f"{row['hogs_cpus']:.2f}; steal {row['steal_pct']:.1f}%); {row['threads']}", flush=True)
                finally:
                    stop_hogs(hogs)

    def median(key: str, load: str, setting: str) -> float:
        return statistics.median(r[key] for r in rows if (r["load"], r["setting"]) == (load, setting))

    idle = median("tokens_per_s", "idle", "old")
    one = median("tokens_per_s", "idle", "one")
    summary: dict[str, dict[str, float]] = {}
    autogroup = _autogroup()
    cgroup = _cpu_cgroup("self")
    print(f"\nslowdown against idle old ({idle:,.0f} tokens/s) on {cpus} CPUs; idle one thread "
          f"{idle / one:.2f}x, idle new {idle / median('tokens_per_s', 'idle', 'new'):.2f}x; autogroup "
          f"{'on' if autogroup else 'off'}, cpu cgroup {cgroup}")
    for n_hogs, where in loads[1:]:
        load = _load_name(n_hogs, where)
        groups = min(r["hog_groups"] for r in rows if r["load"] == load)
        share = fair_share(cpus, n_hogs, groups)
        floor = idle / (one * share)
        entry = {"hogs": n_hogs, "session": where, "hog_groups": groups, "fair_share": share, "floor": floor}
        for setting in ("old", "new", "all"):
            entry[setting] = idle / median("tokens_per_s", load, setting)
            entry[f"{setting}_stage_cpus"] = median("stage_cpus", load, setting)
            entry[f"{setting}_hogs_cpus"] = median("hogs_cpus", load, setting)
            print(f"  {load:20} {setting}: {entry[setting]:5.2f}x (CPUs: stage {entry[f'{setting}_stage_cpus']:.2f}, "
                  f"hogs {entry[f'{setting}_hogs_cpus']:.2f})")
        entry["new_over_floor"] = entry["new"] / floor
        print(f"  {load:20} floor {floor:.2f}x (one thread at a fair share of {share:.2f} CPU); new is "
              f"{entry['new_over_floor']:.2f}x the floor: within 1.2x of it "
              f"{'met' if entry['new_over_floor'] <= 1.2 else 'NOT met'}; 1.5x of idle "
              f"{'met' if entry['new'] <= 1.5 else 'not met'}")
        summary[load] = entry
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cpus": cpus, "hogs": args.hogs, "sessions": args.sessions,
                                         "autogroup": autogroup, "cpu_cgroup": cgroup, "minutes": args.minutes, "reps": args.reps,
                                         "idle_old": idle, "idle_one": one, "rows": rows, "summary": summary,
                                         "target_over_floor": 1.2, "first_target": 1.5,
                                         "cpu": _cpu_name()}, indent=1))


def _load_name(n_hogs: int, where: str) -> str:
    if not n_hogs:
        return "idle"
    return f"{n_hogs} hogs" + (", other session" if where == "other" else "")


def start_hogs(n: int, where: str) -> tuple[list[subprocess.Popen], list[int]]:
    """``n`` busy processes: children of this process (``same``), or one job of ``n`` in a new session (``other``).
    Returns what to stop and the hogs' pids (for their CPU time). Every hog dies with its parent (``PDEATHSIG``), so
    a benchmark killed outright leaves none behind."""
    if not n:
        return [], []
    if where == "same":
        hogs: list[subprocess.Popen] = []
        try:
            for _ in range(n):
                hogs.append(subprocess.Popen([PY, "-c", "while True: pass"], preexec_fn=_die_with_parent))
        except BaseException:
            stop_hogs(hogs)
            raise
        return hogs, [h.pid for h in hogs]
    job = subprocess.Popen([PY, "-c", _JOB, str(n)], stdout=subprocess.PIPE, text=True, start_new_session=True,
                           preexec_fn=_die_with_parent)
    assert job.stdout is not None
    try:
        pids = [int(x) for x in job.stdout.readline().split()]
    except ValueError:
        pids = []
    if len(pids) != n:
        stop_hogs([job])
        raise SystemExit(f"the other session's job started {len(pids)} busy processes, not {n}")
    return [job], pids


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# the other session's job: n busy children, their pids on one line; they die with it (killed as its process group, or
# by PDEATHSIG when it dies)
_JOB = """import ctypes, signal, subprocess, sys
die = lambda: ctypes.CDLL(None).prctl(1, signal.SIGKILL)
kids = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=die) for _ in range(int(sys.argv[1]))]
print(" ".join(str(k.pid) for k in kids), flush=True)
for k in kids:
    k.wait()
"""


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for h in hogs:
        try:
            if h.stdout is not None:  # the other session's job: it and its children are one process group
                os.killpg(h.pid, signal.SIGKILL)
                h.stdout.close()
            else:
                h.kill()
        except ProcessLookupError:
            pass
        h.wait()


def _autogroup() -> bool:
    """Whether the kernel may share CPU between sessions first (``sched_autogroup_enabled``)."""
    return (_read("/proc/sys/kernel/sched_autogroup_enabled") or "").strip() == "1"


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _cpu_cgroup(pid: int | str) -> str | None:
    """The cgroup that holds a process for CPU time (the ``cpu`` controller's line, else cgroup v2's)."""
    text = _read(f"/proc/{pid}/cgroup")
    if text is None:
        return None
    v2 = None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
        if not controllers:
            v2 = path
    return v2


def hog_groups(pids: list[int]) -> int:
    """How many scheduling groups of their own the hogs are in: their autogroups, where autogroup is on, every
    process involved is in the root CPU cgroup (autogroup applies only there) and none shares this process's
    autogroup; else 0 (the kernel shares the CPU between the stage and the hogs per thread, as far as this can tell)."""
    if not pids or not _autogroup():
        return 0
    if any(_cpu_cgroup(p) != "/" for p in ("self", *pids)):
        return 0
    own = _autogroup_id("self")
    groups = {_autogroup_id(p) for p in pids}
    if own is None or None in groups or own in groups:
        return 0
    return len(groups)


def _autogroup_id(pid: int | str) -> str | None:
    """The autogroup a process is in (``/autogroup-631`` from ``/autogroup-631 nice 0``), or None where the file is
    missing, empty or not in that form (seen in CI: one read empty on a kernel with autogroup on)."""
    match = re.match(r"(/autogroup-\d+)\b", _read(f"/proc/{pid}/autogroup") or "")
    return match.group(1) if match else None


def fair_share(cpus: int, n_hogs: int, groups: int) -> float:
    """The fair share, in CPUs (at most one), of a one-thread stage beside ``n_hogs`` busy processes: per thread
    (``cpus / (hogs + 1)``) where they share its scheduling group, else per group (``cpus / (groups + 1)``: another
    session's job under autogroup is one group, however many processes it runs)."""
    if groups:
        return min(1.0, cpus / (groups + 1))
    return min(1.0, cpus / (n_hogs + 1))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
