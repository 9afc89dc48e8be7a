"""The CPU threads a stage chooses (minimodel/cluster/threads.py): decisions under a pretend affinity and load."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from minimodel.cli import _cpu
from minimodel.cluster import threads
from minimodel.cluster.threads import busy_cpus, choose_threads, wait_policy
from minimodel.config.schema import CpuConfig
from tests.conftest import tiny_config


def busy(n: int):
    return lambda: n


@pytest.mark.parametrize("cpus,others,side,expected", [
    (8, 0, 1, 8),  # an idle machine: every usable CPU
    (8, 3, 1, 5),  # three busy with other work: the rest
    (8, 20, 1, 1),  # loaded many times over: one thread, never none
    (2, 2, 1, 1),  # this machine with two CPU hogs: one thread (torch's default, 2, spins at every barrier)
    (2, 1, 1, 1),
    (8, 0, 2, 4),  # two minimodel processes side by side: half each
    (8, 2, 2, 3),
    (1, 0, 1, 1),
])
def test_the_chosen_threads_are_the_free_cpus_shared_among_side_by_side_processes(cpus, others, side, expected):
    choice = choose_threads(0, side, {}, cpus, busy(others))
    assert (choice.threads, choice.source, choice.busy) == (expected, "chosen", others)
    assert f"{others} busy" in choice.describe()


def test_the_configuration_then_the_environment_decide_before_the_load_is_measured():
    def never() -> int:
        raise AssertionError("the load is not measured when the configuration or environment decides")

    assert choose_threads(3, 1, {"OMP_NUM_THREADS": "5"}, 8, never).threads == 3
    env = choose_threads(0, 1, {"OMP_NUM_THREADS": "5"}, 8, never)
    assert (env.threads, env.source) == (5, "OMP_NUM_THREADS") and "OMP_NUM_THREADS" in env.describe()
    for unset in ("", " ", "0", "two"):  # not a positive count: the choice is made
        assert choose_threads(0, 1, {"OMP_NUM_THREADS": unset}, 8, busy(0)).source == "chosen"


def test_the_load_is_the_median_of_instantaneous_readings_less_this_process():
    readings = iter([3, 3, 12, 3, 2])  # a passing burst does not count
    assert busy_cpus(gap_s=0, read=lambda: next(readings)) == 2
    assert busy_cpus(gap_s=0, read=lambda: 1) == 0  # only this process runs

    def unreadable() -> int:
        raise OSError("no /proc here")

    assert busy_cpus(gap_s=0, read=unreadable) == 0
    assert busy_cpus(samples=1) >= 0  # this machine's /proc/loadavg parses


def test_openmp_sleeps_while_waiting_when_the_machine_is_busy_at_start():
    assert wait_policy({"OMP_WAIT_POLICY": "ACTIVE"}, 2, busy(9)) == "ACTIVE"  # the environment's word
    assert wait_policy({}, 2, busy(1)) == "PASSIVE"
    assert wait_policy({}, 8, busy(3)) == ""
    assert wait_policy({}, 8, busy(4)) == "PASSIVE"


def test_a_stage_sets_and_logs_its_threads(tmp_path, corpus_dir, caplog, monkeypatch):
    """What ``minimodel adapt`` (any command of cli.THREADED) does before its stage: torch's threads set, the choice
    logged once; cpu.threads wins over OMP_NUM_THREADS."""
    tiny_cfg = tiny_config(tmp_path, corpus_dir)
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    try:
        with caplog.at_level(logging.INFO, logger="minimodel"):
            _cpu("adapt", replace(tiny_cfg, cpu=CpuConfig(threads=1)))
        assert torch.get_num_threads() == 1
        lines = [r.getMessage() for r in caplog.records if "CPU thread" in r.getMessage()]
        assert lines == ["adapt: 1 CPU thread(s) (cpu.threads; "
                         f"{threads.usable_cpus()} CPU(s) usable); OpenMP wait policy "
                         f"{__import__('os').environ.get('OMP_WAIT_POLICY') or 'default (spin, then sleep)'}"]
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="minimodel"):
            _cpu("report", tiny_cfg)  # not a torch command: nothing chosen
        assert not [r for r in caplog.records if "CPU thread" in r.getMessage()]
        _cpu("finetune", tiny_cfg)
        assert torch.get_num_threads() == 2  # OMP_NUM_THREADS
    finally:
        torch.set_num_threads(before)
