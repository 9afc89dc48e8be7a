"""Callbacks of every training stage: scheduled checkpoints and clean early stops, FLOP and throughput
accounting, and a progress bar that stays readable in log files."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from minimodel import signals
from minimodel.errors import REQUEUE_EXIT
from minimodel.flops import FlopSchedule, v100_days
from minimodel.log import PREFIX, PROGRESS_EVERY_S, clock_time, get_logger, stamp
from minimodel.store.atomic import link_or_copy
from minimodel.store.checkpoints import rng_state, set_rng_state
from minimodel.store.layout import LAST

log = get_logger(__name__)


class ScheduledCheckpoints(Callback):
    """``step{N:07d}.ckpt`` every ``every`` updates and at ``extra`` updates, ``last.ckpt`` beside each, and a
    final one when training ends. Also stops cleanly (checkpoint first) on SIGTERM/SIGUSR1, a wall-time cap
    or ``stop_at``; ``stop_requested`` then says why. ``export(step)``, when given, runs on rank 0 at every
    save and at the start of a fresh run (adaptation writes its small embedding checkpoints there).

    Ctrl-C (SIGINT) is a stop request like SIGTERM (exit 3 after the checkpoint); a second Ctrl-C stops at once
    (KeyboardInterrupt: the command exits 130, the last checkpoint written stays)."""

    def __init__(self, dirpath: Path, every: int, extra: Iterable[int] = (), max_minutes: float = 0.0,
                 stop_at: int = 0, keep_steps: bool = True, export: Callable[[int], Any] | None = None) -> None:
        self.dirpath, self.every, self.extra = Path(dirpath), every, set(extra)
        self.keep_steps = keep_steps  # False: only last.ckpt (``export`` keeps the history)
        self.export = export
        self.max_seconds, self.stop_at = max_minutes * 60, stop_at
        self.started = time.monotonic()
        self.last_step = -1
        self.last_saved = -1
        self.stop_requested: str | None = None
        self.signalled = False  # stopped by a signal (here or on another rank), not by stop_at or the time cap
        self._old_handlers: dict[int, Any] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.last_step = trainer.global_step
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
        fresh = trainer.ckpt_path is None  # on resume, global_step is not restored yet at this point
        if fresh and self.export is not None and trainer.is_global_zero:
            self.export(0)  # the starting point of the curve

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After Lightning registered its own handlers (which would raise SIGTERMException mid-epoch and
        # requeue from a hpc checkpoint): ours let the current update finish, checkpoint, then stop.
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            try:
                self._old_handlers[sig] = signal.signal(sig, self._request_stop)
            except ValueError:  # not in the main thread
                pass
        # global_step is restored by now (not yet at on_fit_start): a resumed run's first micro-batch is inside the
        # update after its checkpoint, not a boundary that would save that checkpoint again mid-accumulation
        self.last_step = trainer.global_step
        if trainer.ckpt_path is not None:
            self.last_saved = trainer.global_step
            if self.stop_at and trainer.global_step >= self.stop_at:  # resumed at or past stop_at: no update more
                self.stop_requested, trainer.should_stop = f"stop_at={self.stop_at}", True
        early = signals.take()  # a signal while the stage was getting ready: stop after the first update
        if early is not None:
            self.stop_requested, self.signalled = f"{early} (received before training started)", True

    def _restore_handlers(self, keep_sigint_ignored: bool = False) -> None:
        for sig, handler in self._old_handlers.items():
            if not (keep_sigint_ignored and sig == signal.SIGINT):
                signal.signal(sig, handler)
        self._old_handlers = {}

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_handlers()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        interrupted = isinstance(exception, KeyboardInterrupt)
        if interrupted:  # Lightning ignores further Ctrl-C while it shuts down, then calls sys.exit(1)
            signals.note_interrupt()
        self._restore_handlers(keep_sigint_ignored=interrupted)

    def _request_stop(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.signalled:  # a second Ctrl-C: stop at once (the last checkpoint stays)
            raise KeyboardInterrupt
        self.stop_requested = signal.Signals(signum).name
        self.signalled = True
        if signum == signal.SIGINT:  # os.write: no logging lock inside a signal handler
            os.write(2, f"{stamp()} {PREFIX} Ctrl-C: stopping after this update, with a checkpoint (exit {REQUEUE_EXIT}; "
                        f"rerun to resume); Ctrl-C again stops at once\n".encode())

    def save(self, trainer: L.Trainer, pl_module: L.LightningModule, export: bool = True) -> None:
        """A checkpoint at this update; ``export``: also the stage's export (an adaptation checkpoint, a point of step
        4's curves), which a stop between scheduled updates does not write: the curves keep the scheduled points."""
        step = trainer.global_step
        if export and self.export is not None and trainer.is_global_zero:
            self.export(step)
        if not self.keep_steps:
            trainer.save_checkpoint(self.dirpath / LAST, weights_only=False)  # full state: resumable
        else:
            path = self.dirpath / f"step{step:07d}.ckpt"
            trainer.save_checkpoint(path, weights_only=False)
            if trainer.is_global_zero:
                link_or_copy(path, self.dirpath / LAST)
            trainer.strategy.barrier()
        self.last_saved = step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if step == self.last_step:  # inside gradient accumulation: not an update boundary
            return
        self.last_step = step
        if step % self.every == 0 or step in self.extra:
            self.save(trainer, pl_module)
        if trainer.world_size > 1:  # every rank must stop at the same update
            stop = trainer.strategy.reduce_boolean_decision(self.stop_requested is not None, all=False)
            if stop and self.stop_requested is None:
                self.stop_requested, self.signalled = "a signal on another rank", True
        if self.stop_at and step >= self.stop_at:
            self.stop_requested = self.stop_requested or f"stop_at={self.stop_at}"
        if self.max_seconds and time.monotonic() - self.started > self.max_seconds:
            self.stop_requested = self.stop_requested or f"wall-time cap of {self.max_seconds / 60:g} min"
        if self.stop_requested:
            if self.last_saved != step:
                self.save(trainer, pl_module, export=False)
            trainer.should_stop = True

    def state_dict(self) -> dict:
        """RNG states travel with the checkpoint so that dropout after a resume continues exactly."""
        return {"rng": rng_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        if "rng" in state_dict:
            set_rng_state(state_dict["rng"])

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.stop_requested:
            log.info(f"stopped at update {trainer.global_step} ({self.stop_requested}); rerun the same command to resume")
        if self.last_saved != trainer.global_step:
            self.save(trainer, pl_module, export=not self.stop_requested)


class StageProgress(Callback):
    """Logs, at each update boundary: cumulative FLOPs and V100-days, tokens seen and throughput."""

    def __init__(self, flops: float | FlopSchedule, tokens_per_update: int, flops_offset: float = 0.0,
                 log_every: int = 10) -> None:
        self.flops = flops if isinstance(flops, FlopSchedule) else FlopSchedule.constant(flops)
        self.tokens_per_update = tokens_per_update
        self.flops_offset, self.log_every = flops_offset, log_every
        self.last_step, self.t0, self.step0 = -1, 0.0, 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.last_step = self.step0 = trainer.global_step
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if step == self.last_step:
            return
        self.last_step = step
        if step % self.log_every and step != trainer.max_steps:
            return
        now = time.perf_counter()
        flops = self.flops_offset + self.flops.at(step)
        metrics = {
            "flops/cumulative": flops,
            "flops/v100_days": v100_days(flops),
            "train/tokens": float(step * self.tokens_per_update),
            "train/updates": float(step),
        }
        if step > self.step0 and now > self.t0:
            rate = (step - self.step0) * self.tokens_per_update / (now - self.t0)
            metrics["perf/tokens_per_sec"] = rate
            metrics["perf/flops_per_sec"] = rate * self.flops.rate(step - 1) / self.tokens_per_update
        self.t0, self.step0 = now, step
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, rank_zero_only=True)


SHOWN = ("train/loss", "train/loss_mini", "perf/tokens_per_sec")  # what the bar and the log lines show


def shown_metrics(metrics: dict) -> dict[str, str]:
    """``SHOWN`` metrics present in ``metrics``, by short name (``loss``, ``loss_mini``, ``tok/s``), formatted."""
    out: dict[str, str] = {}
    for key in SHOWN:
        if key in metrics:
            value = float(metrics[key])
            out[key.split("/")[-1].replace("tokens_per_sec", "tok/s")] = (f"{value:,.0f}" if "tokens" in key
                                                                          else f"{value:.3f}")
    return out


class StageLines(Callback):
    """Where no bar is drawn (a log file, ``--no-progress``): a line every ``every`` seconds and at the last update,
    with the update count, the loss(es), tokens/s and an ETA, instead of a bar redrawn into one endless line."""

    def __init__(self, stage: str, every: float = PROGRESS_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.stage, self.every, self.clock = stage, every, clock
        self.t0 = self.last = 0.0
        self.step0 = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.t0 = self.last = self.clock()
        self.step0 = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        step, now = trainer.global_step, self.clock()
        if step == self.step0 or (now - self.last < self.every and step != trainer.max_steps):
            return
        self.last = now
        log.info(self.line(step, trainer.max_steps, now, trainer.callback_metrics))

    def line(self, step: int, total: int, now: float, metrics: dict) -> str:
        parts = [f"{self.stage}: update {step:,}/{total:,} ({step / max(total, 1):.0%})"]
        parts += [f"{value} {name}" if name == "tok/s" else f"{name} {value}"
                  for name, value in shown_metrics(metrics).items()]
        done = step - self.step0
        if done > 0 and total > step:
            parts.append(f"ETA {clock_time((now - self.t0) / done * (total - step))}")
        return ", ".join(parts)


class StageBar(TQDMProgressBar):
    """One bar per stage, counted in optimiser updates (resumed runs start where they stopped), showing the
    loss(es) and tokens/s. Validation runs without a bar of its own (no nested bars spilling into log files),
    and the bar redraws at most twice a second."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage
        self._drawn = 0.0  # when the bar was last redrawn

    def init_train_tqdm(self) -> Tqdm:
        # delay: nothing is drawn before the first update (no empty "Training: 0/?" line in log files)
        return Tqdm(desc=self.stage, position=2 * self.process_position, disable=self.is_disabled, leave=True,
                    dynamic_ncols=True, file=sys.stdout, smoothing=0, bar_format=self.BAR_FORMAT, delay=1e-6)

    def on_train_start(self, trainer: L.Trainer, *_: Any) -> None:
        super().on_train_start(trainer)
        self._count_updates(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        self._count_updates(trainer)  # not Lightning's: it would restart the count and rename the bar "Epoch N"

    def _count_updates(self, trainer: L.Trainer) -> None:
        bar = self.train_progress_bar
        bar.total, bar.n, bar.initial = trainer.max_steps, trainer.global_step, trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        bar, step = self.train_progress_bar, trainer.global_step
        now = time.monotonic()
        if bar.disable or step == bar.n or (now - self._drawn < 0.5 and step != trainer.max_steps):
            return
        self._drawn = now
        bar.n = step
        bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
        bar.refresh()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        bar = self.train_progress_bar
        if not bar.disable and bar.n != trainer.global_step:  # the last update (e.g. before a stop) is shown
            bar.n = trainer.global_step
            bar.refresh()
        super().on_train_end(trainer, pl_module)

    def init_validation_tqdm(self):  # type: ignore[no-untyped-def]
        return Tqdm(disable=True)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        return shown_metrics({**super().get_metrics(trainer, pl_module), **trainer.callback_metrics})  # tok/s too


class FrozenRows(Callback):
    """``adapt.vocabulary=extend``: the first ``rows`` rows of some parameters (the token embeddings, an untied output
    projection, the output bias: the source model's own pieces) stay bit-identical while the rows after them train.

    Their gradient is zeroed as it is computed (a hook on the parameter), so gradient clipping, the all-reduce and
    AdamW's moments see the new rows alone; and after every optimiser step they are written back from the values
    they started with, because AdamW's decoupled weight decay shrinks every row of a parameter, gradient or not.
    Nothing of this is in a checkpoint: the rows are the model's own, and a resumed run sets the hooks again."""

    def __init__(self, names: list[str], rows: int, model: Any) -> None:
        params = dict(model.named_parameters())
        self.names, self.rows = names, rows
        self.values = [params[n].detach().cpu()[:rows].clone() for n in names]
        self._handles: list[Any] = []

    def _params(self, module: Any) -> list[Any]:
        params = dict(module.model.named_parameters())
        return [params[n] for n in self.names]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        import torch

        params = self._params(pl_module)
        values = [v.to(device=p.device, dtype=p.dtype) for p, v in zip(params, self.values)]
        rows = self.rows

        def mask(grad: torch.Tensor) -> torch.Tensor:
            grad = grad.clone()
            grad[:rows] = 0
            return grad

        def restore(*_: Any) -> None:
            with torch.no_grad():
                for p, v in zip(params, values):
                    p[:rows].copy_(v)

        self._handles = [p.register_hook(mask) for p in params]
        self._handles += [opt.register_step_post_hook(restore) for opt in trainer.optimizers]

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
