"""The one stage runner: skip a finished run, write its config, seed, build, train or resume, record
``done.json``, and say how it ended.

A stage module supplies two functions: ``prepare()`` reads what the stage needs (checkpoints,
tokenizers, task data; it runs before seeding) and ``build(inputs)`` constructs what trains (it runs
right after ``seed_everything``, so every random draw of model and head construction is seeded).
Everything else is here, the same for every stage."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Generic, TypeVar

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from minimodel.config.load import save_config
from minimodel.config.schema import ExperimentConfig, OptimConfig, TrainerConfig
from minimodel.errors import ConfigError, UserError
from minimodel.flops import FlopSchedule
from minimodel.log import bar_wanted, get_logger, process_rank, quiet_lightning
from minimodel.store import atomic
from minimodel.store.checkpoints import CheckpointError, load_checkpoint
from minimodel.store.identity import check_finished, started_precision
from minimodel.store.layout import (
    CONFIG,
    DONE,
    INPUTS,
    PRECISION,
    Layout,
    checkpoints,
    is_done,
    last_checkpoint,
    read_done,
    write_done,
    write_precision,
)
from minimodel.store.locks import exclusive
from minimodel.store.provenance import (
    Outside,
    check_inputs,
    check_producer,
    identity,
    record_inputs,
    recorded_inputs,
    settings_of,
    weights_digest,
)
from minimodel.training.callbacks import ScheduledCheckpoints, StageBar, StageLines, StageProgress
from minimodel.training.checkpoint_io import AtomicCheckpointIO
from minimodel.training.device import (
    PrecisionChoice,
    PrecisionError,
    check_precision,
    compile_layers,
    resolve_precision,
    stage_device,
)
from minimodel.training.loggers import drop_stop_rows, make_loggers, truncate_metrics
from minimodel.training.optim import accumulation

log = get_logger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Stage:
    """One stage run: its name (``pretrain``, ``adapt/de``, ``finetune/xnli/seed1``), directory and seed."""

    name: str
    run_dir: Path
    seed: int
    # the finished runs and outside inputs it reads ({"pretrain": dir, "target_data": Outside}): recorded, checked
    inputs: dict[str, Path | Outside] = field(default_factory=dict)


@dataclass
class Training:
    """What a stage's ``build`` hands the runner."""

    module: L.LightningModule
    datamodule: L.LightningDataModule
    optim: OptimConfig
    trainer: TrainerConfig
    flops_per_update: float | FlopSchedule = 0.0  # 0: no FLOP accounting (finetuning); a schedule: by phase
    tokens_per_update: int = 0
    keep_steps: bool = True  # keep step{N}.ckpt files (False: last.ckpt only)
    export: Callable[[int], Any] | None = None  # rank 0, at every checkpoint and at update 0 of a fresh run
    finish: Callable[[L.Trainer], dict] | None = None  # rank 0, after the last update: more done.json fields
    callbacks: list[Callback] = field(default_factory=list)  # more of the stage's own (adaptation: FrozenRows)


class Outcome(Enum):
    FINISHED = "finished"  # ran to its last update; done.json written
    SKIPPED = "skipped"  # was already finished
    INTERRUPTED = "interrupted"  # stopped by a signal (SIGTERM/SIGUSR1) after a checkpoint: requeue, rerun to resume
    STOPPED = "stopped"  # stopped early by trainer.stop_at or trainer.max_minutes after a checkpoint; rerun to resume


@dataclass
class StageResult:
    run_dir: Path
    outcome: Outcome
    step: int = 0
    reason: str = ""  # why a stopped run stopped
    done: dict = field(default_factory=dict)  # the contents of done.json


def world_size(t: TrainerConfig) -> int:
    """Processes the trainer will run (devices x nodes), without starting anything."""
    if isinstance(t.devices, int):
        devices = t.devices
    elif isinstance(t.devices, (list, tuple)):
        devices = len(t.devices)
    elif str(t.devices).isdigit():
        devices = int(t.devices)
    elif t.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        devices = torch.cuda.device_count()
    else:
        devices = 1
    return max(1, devices) * t.num_nodes


def trainer_plugins() -> list[Any]:
    """Atomic checkpoint writes; under SLURM, Lightning's cluster environment with its auto-requeue off: the
    sbatch script (``sbatch.py``) owns the signal and the requeue, one mechanism only."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    plugins: list[Any] = [AtomicCheckpointIO()]
    if SLURMEnvironment.detect():
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return plugins


def make_trainer(cfg: ExperimentConfig, stage: Stage, training: Training, callbacks: list[Callback],
                 progress_bar: bool) -> L.Trainer:
    t, o = training.trainer, training.optim
    accum = accumulation(o, world_size(t))
    bar = bar_wanted(progress_bar, sys.stdout)  # StageBar draws on stdout
    callbacks = [*callbacks, StageBar(stage.name) if bar else StageLines(stage.name)]
    return L.Trainer(
        accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
        precision=t.precision, max_steps=o.updates, max_epochs=-1,
        accumulate_grad_batches=accum,  # clipping: the module's UpdateGuard (optim.py), not Lightning's
        val_check_interval=t.val_every * accum, check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches or 1.0, num_sanity_val_steps=0,
        log_every_n_steps=t.log_every,  # counted in optimiser updates
        logger=make_loggers(cfg, stage.run_dir, f"{cfg.system}/{stage.name}"),
        callbacks=callbacks, enable_progress_bar=bar, enable_checkpointing=False,
        enable_model_summary=False, use_distributed_sampler=False, plugins=trainer_plugins(),
        default_root_dir=str(stage.run_dir), deterministic=False, benchmark=False,
    )


RESUME_KEYS = ("global_step", "state_dict", "loops", "optimizer_states", "callbacks", "minimodel")
"""What a full (resumable) Lightning checkpoint of a stage holds."""


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a training checkpoint (``last.ckpt`` or a step's), intact or not."""
    return last_checkpoint(run_dir).exists() or any(checkpoints(run_dir).glob("step*.ckpt"))


def resume_point(run_dir: Path) -> tuple[Path, int] | None:
    """The checkpoint to resume from and its update count, or None for a fresh run: ``last.ckpt``, or when it is
    missing, truncated or not resumable, the newest intact ``step{N}.ckpt`` (said in the log). A run with
    checkpoints none of which can resume fails naming them."""
    last = last_checkpoint(run_dir)
    steps = sorted(checkpoints(run_dir).glob("step*.ckpt"), key=lambda p: p.name, reverse=True)
    candidates = ([last] if last.exists() else []) + steps
    problems: list[str] = []
    for path in candidates:
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as e:
            problems.append(str(e).split("; ")[0])
            continue
        missing = [k for k in RESUME_KEYS if k not in ckpt]
        if missing:
            problems.append(f"{path} cannot resume training: it lacks {', '.join(missing)} (a weights-only or "
                            f"edited file?)")
            continue
        step = int(ckpt["global_step"])
        if path != last:
            why = "; ".join(problems) if problems else f"{last} is missing"
            log.warning(f"{why}: resuming from the newest intact checkpoint, {path} (update {step})")
        return path, step
    if problems:
        raise CheckpointError("; ".join(problems) + f": no checkpoint of {run_dir} can resume it. Delete {run_dir} "
                              f"to start the stage again")
    return None


CHECKPOINT_PRODUCTS = ("pretrain", "bridge")
"""Stages whose product is their final checkpoint (``last.ckpt``: the primary model, the mini-model); the others'
are files of their own (embeddings, model.pt), their last.ckpt only a resume point."""
REBUILT = "done.before-rebuild.json"


def final_checkpoint_problem(stage: str, run_dir: Path, done: dict) -> str:
    """What is wrong with a finished ``stage`` run's product, checked cheaply (no load): its final checkpoint missing,
    or cut short of the size recorded when it finished; "" when nothing is (or the stage's product is another file).
    Its step checkpoint at the last update is the same file (a hard link: one model's bytes on disk, not two),
    so the rebuild resumes from the newest intact earlier one; exact resume makes the rebuilt weights the same."""
    if stage.partition("/")[0] not in CHECKPOINT_PRODUCTS:
        return ""
    last = last_checkpoint(run_dir)
    if not last.is_file():
        return f"its final checkpoint {last} is missing"
    size, recorded = last.stat().st_size, done.get("checkpoint_bytes")
    if isinstance(recorded, int) and size != recorded:
        return f"its final checkpoint {last} is {size:,} bytes where {recorded:,} were written (cut short or replaced)"
    return ""


def clear_leftovers(run_dir: Path, step: int) -> None:
    """Before a run starts (``step`` 0) or resumes from an earlier checkpoint than its newest files (``step``):
    what an earlier attempt wrote after ``step`` (adaptation checkpoints, step checkpoints, metrics rows) would
    otherwise join this run's curve. They are removed, said in the log; the run writes them again."""
    from minimodel.store.layout import adaptation_checkpoints, checkpoint_step

    stale = [p for p in adaptation_checkpoints(run_dir) if checkpoint_step(p) > step]
    stale += [p for p in checkpoints(run_dir).glob("step*.ckpt") if checkpoint_step(p) > step]
    for p in stale:
        p.unlink()
    if stale:
        log.warning(f"{run_dir}: removed {len(stale)} file(s) an earlier attempt wrote after update {step} "
                    f"({', '.join(p.name for p in stale[:4])}{', ...' if len(stale) > 4 else ''}): this run "
                    f"writes them again")
    truncate_metrics(run_dir, step)


class Runner(Generic[T]):
    """Runs one stage: ``Runner(cfg, stage, prepare, build).run(progress_bar)``."""

    def __init__(self, cfg: ExperimentConfig, stage: Stage, prepare: Callable[[], T],
                 build: Callable[[T], Training]) -> None:
        self.cfg, self.stage, self.prepare, self.build = cfg, stage, prepare, build

    def run(self, progress_bar: bool = True) -> StageResult:
        """The stage, holding its directory's lock (a second copy of the same command fails at once)."""
        root = Layout.of(self.cfg).root
        if self.cfg.models_from and not self.stage.run_dir.resolve().is_relative_to(root.resolve()):
            raise ConfigError(f"{self.stage.name}: {self.stage.run_dir} belongs to experiment {self.cfg.models_from}, "
                              f"whose models this one reuses (models_from) and never writes to: run this step in "
                              f"that experiment")
        run_dir = self.stage.run_dir
        with exclusive(run_dir, f"stage {self.stage.name}"):
            fresh = not (run_dir / CONFIG).is_file() and not has_checkpoint(run_dir)  # no earlier attempt here
            try:
                return self._run(progress_bar)
            except UserError:  # refused before its first checkpoint (no prepared shards, ...): what this attempt
                if fresh and process_rank() == 0 and not has_checkpoint(run_dir):  # recorded goes, else the next
                    for name in (CONFIG, INPUTS, PRECISION):  # is taken for a run stopped before its end
                        (run_dir / name).unlink(missing_ok=True)
                raise

    def _finished(self) -> StageResult | None:
        """The result of a finished run this configuration's (skipped), None when there is none to skip: not finished,
        or finished but its product is damaged (``final_checkpoint_problem``: the run is then rebuilt)."""
        stage, run_dir = self.stage, self.stage.run_dir
        if not is_done(run_dir):
            return None
        done = read_done(run_dir) or {}  # a corrupt done.json: a UserError naming it
        check_finished(self.cfg, stage.name, run_dir)  # finished with other settings: a ConfigError listing them
        problem = final_checkpoint_problem(stage.name, run_dir, done)
        if problem:
            log.warning(f"{run_dir} finished, but {problem}: rebuilding it, resumed from the newest intact checkpoint "
                        f"(an exact resume: the same weights; its done.json is kept as {REBUILT})")
            os.replace(run_dir / DONE, run_dir / REBUILT)
            return None
        check_inputs(run_dir, stage.inputs)  # built on a run that finished again since: a UserError naming both
        log.info(f"{run_dir} is complete; skipping")
        return StageResult(run_dir, Outcome.SKIPPED, done=done)

    def _run(self, progress_bar: bool) -> StageResult:
        stage, run_dir = self.stage, self.stage.run_dir
        skipped = self._finished()
        if skipped is not None:
            return skipped
        resume = resume_point(run_dir)
        if resume is not None or (run_dir / CONFIG).is_file():
            # resuming, or starting again over an earlier attempt's files: only with the settings it ran with
            check_finished(self.cfg, stage.name, run_dir, finished=False)
        if resume is not None:
            check_inputs(run_dir, stage.inputs)
        for producer in stage.inputs.values():  # what it reads ran with the settings this configuration expects
            if not isinstance(producer, Outside):
                check_producer(self.cfg, producer, f"stage {stage.name}")
        kind = stage.name.partition("/")[0]  # pretrain, bridge, adapt, finetune: the section of its settings
        planned, key = getattr(self.cfg, kind).trainer, f"{kind}.trainer.precision"
        chosen = self._precision(planned, key, resume)
        check_precision(chosen.precision, planned.accelerator, key)  # before anything is written
        quiet_lightning()
        inputs = self.prepare()
        if process_rank() == 0:  # the other ranks of a distributed run write nothing but their share of checkpoints
            run_dir.mkdir(parents=True, exist_ok=True)
            save_config(self.cfg, run_dir / CONFIG)  # trainer.precision as configured (auto stays auto) ...
            if resume is None:  # a fresh run: what it is built on, as it is now
                record_inputs(run_dir, stage.inputs)
                if planned.precision == "auto":  # ... and what auto chose, kept for a resume on another machine
                    write_precision(run_dir, planned.precision, chosen.precision, chosen.why)
            clear_leftovers(run_dir, resume[1] if resume else 0)
        L.seed_everything(stage.seed, workers=True, verbose=False)
        training = self.build(inputs)
        training.trainer = replace(training.trainer, precision=chosen.precision)
        t = training.trainer
        if t.compile:
            log.info(f"{stage.name}: compiling {compile_layers(training.module)} transformer layers (trainer.compile)")
        ckpts = ScheduledCheckpoints(checkpoints(run_dir), t.ckpt_every, t.ckpt_steps, t.max_minutes, t.stop_at,
                                     keep_steps=training.keep_steps, export=training.export)
        callbacks: list[Callback] = [*training.callbacks, ckpts]
        f = training.flops_per_update
        flops = f if isinstance(f, FlopSchedule) else FlopSchedule.constant(f) if f else None
        if flops is not None:
            callbacks.append(StageProgress(flops, training.tokens_per_update,
                                           log_every=t.log_every))
        trainer = make_trainer(self.cfg, stage, training, callbacks, progress_bar)
        if resume is not None and trainer.is_global_zero:
            log.info(f"resuming from {resume[0]} (update {resume[1]})")
        elif resume is None:
            log.info(f"{stage.name}: {training.optim.updates:,} updates of {training.optim.global_batch} sequences "
                     f"-> {run_dir}")
        trainer.fit(training.module, datamodule=training.datamodule, ckpt_path=str(resume[0]) if resume else None)
        step = trainer.global_step
        if step < training.optim.updates:
            if trainer.is_global_zero:
                drop_stop_rows(run_dir, step, t.log_every, t.val_every)
            outcome = Outcome.INTERRUPTED if ckpts.signalled else Outcome.STOPPED
            return StageResult(run_dir, outcome, step, ckpts.stop_requested or "stopped early")
        done = self._write_done(trainer, training, flops, resume) if trainer.is_global_zero else {}
        return StageResult(run_dir, Outcome.FINISHED, step, done=done)

    def _precision(self, planned: TrainerConfig, key: str, resume: tuple[Path, int] | None) -> PrecisionChoice:
        """The precision the stage runs in: as configured; ``auto`` resolved on the stage's device
        (``resolve_precision``), said in the log; a resumed run in the precision it started in (an exact resume),
        which ``auto`` never changes."""
        if planned.precision != "auto":
            return PrecisionChoice(planned.precision, "as configured")
        run_dir = self.stage.run_dir
        if resume is not None:
            started = started_precision(run_dir, self.stage.name)
            if started is None:
                raise PrecisionError(
                    f"{key}=auto: {run_dir} resumes from {resume[0]}, but {run_dir / PRECISION}, the precision it "
                    f"started in, is missing: an exact resume needs the same one. Restore the file, or delete "
                    f"{run_dir} to start the stage again")
            chosen = PrecisionChoice(started[0], f"the precision this run started in ({started[1]}), kept for an "
                                                 f"exact resume")
        else:
            chosen = resolve_precision(stage_device(planned.accelerator))
        log.info(chosen.line(key))
        return chosen

    def _write_done(self, trainer: L.Trainer, training: Training, flops: FlopSchedule | None,
                    resume: tuple[Path, int] | None) -> dict:
        """The finished run's ``done.json`` (rank 0), with the size of its final checkpoint."""
        stage, run_dir, step = self.stage, self.stage.run_dir, trainer.global_step
        last = last_checkpoint(run_dir)
        if not last.is_file() and resume is not None and resume[1] == step:  # resumed at the end: no update ran
            atomic.link_or_copy(resume[0], last)  # its final checkpoint is the step file it resumed from
        done = {"stage": stage.name, "step": step, "checkpoint": str(last),
                "checkpoint_bytes": last.stat().st_size if last.is_file() else None,
                "flops": flops.at(step) if flops is not None else 0.0,
                "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
                "inputs": recorded_inputs(run_dir),
                "identity": identity(settings_of(self.cfg, stage.name), recorded_inputs(run_dir),
                                     weights_digest(training.module.state_dict())),
                "precision": training.trainer.precision,  # what it ran in (trainer.precision=auto resolved)
                "skipped_updates": getattr(getattr(training.module, "guard", None), "skipped", 0),
                "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if training.finish is not None:
            done.update(training.finish(trainer))
        write_done(run_dir, done)
        return done
