"""A step built on another records which finished run it consumed, and nothing built on an older run is used
silently; a stop signal that comes while a stage is still getting ready is a clean stop (exit 3), not a crash."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from minimodel import signals
from minimodel.cli import main
from minimodel.errors import UserError
from minimodel.experiment import load_experiment
from minimodel.store.layout import write_done
from minimodel.store.provenance import stamp
from tests.conftest import ROOT, stage_overrides, tiny_overrides

pytestmark = pytest.mark.slow


@pytest.fixture
def copied_chain(tiny_finetuned, tmp_path):
    """A copy of the tiny finished chain (pretraining, de/tr adaptations, two finetunings, results)."""
    _, cfg, args = tiny_finetuned
    runs = tmp_path / "runs"
    shutil.copytree(Path(cfg.runs_dir), runs, ignore=shutil.ignore_patterns("wandb", ".lock"))
    overrides = [*args[1:], f"runs_dir={runs}"]
    return runs / cfg.name / "bl_base", args[0], overrides


def test_consumers_record_the_run_they_were_built_on(copied_chain):
    system, _, _ = copied_chain
    pre = stamp(system / "pretrain")
    for consumer, role in (("adapt/de", "body"), ("adapt/tr", "body"), ("finetune/lohelp/seed1", "pretrain")):
        done = json.loads((system / consumer / "done.json").read_text())
        assert done["inputs"][role]["sha256"] == pre["sha256"] and done["inputs"][role]["step"] == 8, consumer
        assert done["finished_at"]


def test_nothing_built_on_an_earlier_pretraining_is_used(copied_chain, capsys):
    system, experiment, overrides = copied_chain
    results = (system / "results.jsonl").read_text()
    # the pretraining is redone (another identity: other weights), finishing at another time
    done = json.loads((system / "pretrain" / "done.json").read_text())
    write_done(system / "pretrain", {**done, "finished_at": "2030-01-01T00:00:00+00:00", "identity": "0" * 16})

    from minimodel.stages.adapt import run_adapt
    from minimodel.stages.evaluate import run_evaluate

    with pytest.raises(UserError, match=r"adapt/de was built on the body run .*pretrain as it finished at update 8 "
                                        r"\(.*\), but that run was redone since \(update 8, 2030-01-01.*delete"):
        run_adapt(load_experiment(experiment, [*overrides, "lang=de"]), progress_bar=False)
    with pytest.raises(UserError, match=r"finetune/lohelp/seed1 was built on the pretrain run"):
        run_evaluate(load_experiment(experiment, overrides), progress=False)
    assert main(["evaluate", experiment, *overrides, "lang=tr"]) == 2  # the command: exit 2, the message
    assert "was built on the pretrain run" in capsys.readouterr().err
    assert (system / "results.jsonl").read_text() == results  # nothing appended

    # restored: used again
    write_done(system / "pretrain", done)
    run_adapt(load_experiment(experiment, [*overrides, "lang=de"]), progress_bar=False)  # skipped: complete
    run_evaluate(load_experiment(experiment, overrides), progress=False)
    assert (system / "results.jsonl").read_text() == results


def test_a_signal_before_training_starts_stops_cleanly_after_the_first_update(tmp_path, prepared, corpus_dir, capsys):
    args = ["pretrain", str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(tmp_path, corpus_dir, prepared),
            "data.num_workers=0", *stage_overrides(["pretrain"], updates=6, global_batch=8, micro_batch=4,
                                                   ckpt_every=2, log_every=2), "--no-progress"]
    old = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    real_catch = signals.catch_early

    def catch_then_signalled() -> dict:  # USR1 while the command is still loading: what SLURM may do
        replaced = real_catch()
        os.kill(os.getpid(), signal.SIGUSR1)
        return replaced

    try:
        signals.catch_early = catch_then_signalled
        assert main(args) == 3  # requeue, not a crash
        assert all(signal.getsignal(s) == h for s, h in old.items())  # the command put its handlers back
        assert signals.take() is None  # and what it recorded is not left for another command
    finally:
        signals.catch_early = real_catch
        signals._received.clear()
        for s, h in old.items():
            signal.signal(s, h)
    err = capsys.readouterr().err
    assert "stopped at update 1 (SIGUSR1 (received before training started))" in err
    run_dir = tmp_path / "runs" / "tiny" / "minijoint" / "pretrain"
    assert (run_dir / "checkpoints" / "step0000001.ckpt").is_file() and not (run_dir / "done.json").exists()
    assert main(args) == 0 and (run_dir / "done.json").exists()  # the rerun resumes and finishes


def test_a_signal_while_the_config_loads_is_caught_by_the_command(tmp_path, prepared, corpus_dir, capsys, monkeypatch):
    """SLURM may send USR1 as the task starts: the command line catches stop signals before it reads its config."""
    import minimodel.cli as cli

    args = ["pretrain", str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(tmp_path, corpus_dir, prepared),
            "data.num_workers=0", *stage_overrides(["pretrain"], updates=4, global_batch=8, micro_batch=4,
                                                   ckpt_every=2, log_every=2), "--no-progress"]
    missed: list[int] = []  # stands for the default action (death): a signal the command had not caught yet
    old = {s: signal.signal(s, lambda signum, frame: missed.append(signum)) for s in signals.STOP_SIGNALS}
    real_load = cli.load_experiment

    def signalled_while_loading(*a, **k):
        os.kill(os.getpid(), signal.SIGUSR1)
        return real_load(*a, **k)

    monkeypatch.setattr(cli, "load_experiment", signalled_while_loading)
    try:
        assert main(args) == 3 and not missed
    finally:
        signals._received.clear()
        for s, h in old.items():
            signal.signal(s, h)
    assert "stopped at update 1 (SIGUSR1 (received before training started))" in capsys.readouterr().err
