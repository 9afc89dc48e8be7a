"""How many CPU threads a stage's torch operations use (intra-op threads: OpenMP's team).

torch's default is one thread per core of the machine. On a machine that other work also uses (a shared workstation,
a cluster login node, a test suite, two experiments side by side) a team that size is oversubscribed, and its
threads spin at every barrier waiting for a descheduled team-mate: stages then run 10-20x slower than their share of
the CPU explains (docs/benchmarks.md, "Threads under load"). So each stage chooses, once, logged:

1. ``cpu.threads`` when set (> 0): the configuration's word;
2. else ``OMP_NUM_THREADS`` from the environment (a SLURM job's launcher sets it to ``--cpus-per-task``);
3. else chosen: the CPUs this process may use (``os.sched_getaffinity``: a job's or ``taskset``'s share), less
   the CPUs other work keeps busy right now (runnable tasks other than this one, the median of a few instantaneous
   samples of ``/proc/loadavg``; never all of them; measured only where this process may use every CPU of the
   machine, since a pinned share is its own), divided among the ``cpu.side_by_side`` minimodel processes that
   share the machine; at least 1.

OpenMP's wait policy (``OMP_WAIT_POLICY``: whether idle team threads spin or sleep) is read once, when torch loads
its OpenMP library: ``cli.main`` sets it to ``PASSIVE`` before torch is imported where the machine is already busy at
start and the environment does not say (``wait_policy``); it is logged with the thread choice.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from minimodel.log import get_logger

log = get_logger(__name__)


def usable_cpus() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where it does not exist)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _runnable_now() -> int:
    """Runnable tasks on the machine now, this one included (the fourth field of ``/proc/loadavg``: running/total)."""
    with open("/proc/loadavg", encoding="ascii") as f:
        return int(f.read().split()[3].split("/")[0])


def busy_cpus(samples: int = 5, gap_s: float = 0.04, read: Callable[[], int] = _runnable_now) -> int:
    """CPUs other work keeps busy now: the median over ``samples`` readings of the runnable tasks, less this one
    (0 where ``/proc/loadavg`` cannot be read)."""
    try:
        counts = []
        for i in range(samples):
            if i:
                time.sleep(gap_s)
            counts.append(read())
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, round(statistics.median(counts)) - 1)


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    source: str  # cpu.threads | OMP_NUM_THREADS | chosen
    cpus: int  # the CPUs this process may use
    busy: int  # of those (or of the machine's), busy with other work when chosen; -1: not measured
    side_by_side: int

    def describe(self) -> str:
        if self.source != "chosen":
            return f"{self.threads} CPU thread(s) ({self.source}; {self.cpus} CPU(s) usable)"
        share = f", shared by {self.side_by_side} minimodel processes" if self.side_by_side > 1 else ""
        return (f"{self.threads} CPU thread(s) (chosen: {self.cpus} CPU(s) usable, {self.busy} busy with other "
                f"work{share}; set cpu.threads or OMP_NUM_THREADS to choose)")


def choose_threads(configured: int, side_by_side: int, env: Mapping[str, str], cpus: int,
                   busy: Callable[[], int]) -> ThreadChoice:
    """The rule of the module docstring, for a pretend machine in tests: ``cpus`` usable, ``busy()`` measured only
    when nothing else decides."""
    if configured > 0:
        return ThreadChoice(configured, "cpu.threads", cpus, -1, side_by_side)
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return ThreadChoice(int(omp), "OMP_NUM_THREADS", cpus, -1, side_by_side)
    others = busy()
    free = cpus - min(others, cpus - 1)
    return ThreadChoice(max(1, free // max(1, side_by_side)), "chosen", cpus, others, side_by_side)


def wait_policy(env: Mapping[str, str], cpus: int, busy: Callable[[], int]) -> str:
    """The ``OMP_WAIT_POLICY`` to set before torch loads: the environment's where it says; ``PASSIVE`` (idle threads
    sleep) where other work already keeps at least half of the usable CPUs busy; else "" (OpenMP's default)."""
    if env.get("OMP_WAIT_POLICY"):
        return env["OMP_WAIT_POLICY"]
    return "PASSIVE" if 2 * busy() >= cpus else ""


def measured_busy(cpus: int) -> Callable[[], int]:
    """``busy_cpus`` for this machine, measured at most once: the machine's load says something about this process's
    ``cpus`` only where it may use all of them (a job pinned to its share, SLURM's --cpus-per-task, has them to
    itself: 0)."""
    if cpus < (os.cpu_count() or 1):
        return lambda: 0
    return functools.cache(busy_cpus)


def apply(configured: int, side_by_side: int, stage: str, busy: Callable[[], int] | None = None) -> ThreadChoice:
    """Choose (``choose_threads`` on this machine; ``busy``: a ``measured_busy`` already made), set
    ``torch.set_num_threads`` and log the choice once for ``stage``."""
    import torch

    cpus = usable_cpus()
    choice = choose_threads(configured, side_by_side, os.environ, cpus, busy or measured_busy(cpus))
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    policy = os.environ.get("OMP_WAIT_POLICY", "") or "default (spin, then sleep)"
    log.info(f"{stage}: {choice.describe()}; OpenMP wait policy {policy}")
    return choice
