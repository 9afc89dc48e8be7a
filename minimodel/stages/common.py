"""What every training stage shares: optimiser and schedule, checkpoint schedule and atomic writes,
loggers, progress and FLOP accounting, and the run-or-resume entry point."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import lightning as L
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter as _CSVWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.plugins.io import TorchCheckpointIO

from torch import nn
from torchmetrics import MeanMetric

from minimodel.config import ExperimentConfig, OptimConfig, TrainerConfig
from minimodel.flops import v100_days
from minimodel.model import IGNORE_INDEX, PRIMARY, ModelConfig, RobertaMLM

DONE = "done.json"
REQUEUE_EXIT = 3  # the CLI's exit code after a signal-triggered checkpoint: requeue and rerun to resume
INTERRUPTED: list[str] = []  # reasons runs in this process stopped early on a signal (read by the CLI)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used, with a message naming the file."""


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss."""


# --------------------------------------------------------------------------------------------- optimiser


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig, total_updates: int | None = None,
                    warmup: int | None = None) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (all trainable parameters, decoupled weight decay as fairseq) with linear warmup then linear decay."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("nothing to train: no parameter requires a gradient")
    fused = all(p.is_cuda for p in params)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,  # type: ignore[arg-type]
                            weight_decay=cfg.weight_decay, fused=fused or None)
    total = total_updates if total_updates is not None else cfg.updates
    warm = warmup if warmup is not None else cfg.warmup_updates

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / max(1, warm)
        return max(0.0, (total - step) / max(1, total - warm))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def lightning_optim(opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler) -> dict:
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}


def check_finite(loss: torch.Tensor, step: int, what: str = "loss") -> None:
    if not bool(torch.isfinite(loss.detach())):
        raise NonFiniteLossError(
            f"{what} is {loss.item()} at update {step}: stopping; the last checkpoint written before it is kept "
            f"(lower the learning rate or check the data, then rerun the same command to resume)")


# --------------------------------------------------------------------------------------------- MLM steps


def head_metric(head: str, heads: list[str]) -> str:
    """primary -> loss; the one secondary head -> loss_mini; several -> loss_l{N}."""
    if head == PRIMARY:
        return "loss"
    return "loss_mini" if len(heads) == 2 else f"loss_{head}"


def mlm_train_step(module: L.LightningModule, model: RobertaMLM, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean of the MLM losses of all the model's heads; logs each head's loss and the lr."""
    losses = model.mlm_losses(batch["input_ids"], batch["labels"])
    loss = torch.stack(list(losses.values())).mean()
    check_finite(loss, module.global_step)
    heads = list(losses)
    logs = {f"train/{head_metric(h, heads)}": v.detach() for h, v in losses.items()}
    if len(losses) > 1:
        logs["train/loss_total"] = loss.detach()
    module.log_dict(logs, prog_bar=True, on_step=True, on_epoch=False)
    module.log("train/lr", module.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
    return loss


class MLMValidation(nn.Module):
    """Token-weighted validation loss and perplexity per head, reduced over processes."""

    def __init__(self, heads: list[str]) -> None:
        super().__init__()
        self.heads = heads
        self.loss = nn.ModuleDict({h: MeanMetric() for h in heads})

    def update(self, model: RobertaMLM, batch: dict[str, torch.Tensor]) -> None:
        losses = model.mlm_losses(batch["input_ids"], batch["labels"], self.heads)
        n = batch["labels"].ne(IGNORE_INDEX).sum()
        for h, v in losses.items():
            self.loss[h].update(v, n)

    def log(self, module: L.LightningModule) -> None:
        for h in self.heads:
            value = float(self.loss[h].compute())
            name = head_metric(h, self.heads)
            module.log(f"val/{name}", value)
            module.log(f"val/{name.replace('loss', 'ppl')}", perplexity(value))
            self.loss[h].reset()


class MLMModule(L.LightningModule):
    """Trains the parameters of ``model`` that require a gradient on the mean MLM loss of its heads.

    The stages (pretrain, bridge, adapt) derive from this base and differ in the model they are
    handed, what it freezes, and what their checkpoints carry; they do not derive from each other."""

    def __init__(self, model: RobertaMLM, optim: OptimConfig, meta: dict, flops_per_update: float) -> None:
        super().__init__()
        self.model, self.optim_cfg, self.meta = model, optim, meta
        self.flops_per_update = flops_per_update
        self.val = MLMValidation(model.cfg.head_names)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return mlm_train_step(self, self.model, batch)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.val.update(self.model, batch)

    def on_validation_epoch_end(self) -> None:
        self.val.log(self)

    def configure_optimizers(self) -> dict:
        return lightning_optim(*build_optimizer(self.model.parameters(), self.optim_cfg))

    def cumulative_flops(self, step: int | None = None) -> float:
        return (self.global_step if step is None else step) * self.flops_per_update

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["minimodel"] = {**self.meta, "step": self.global_step, "flops": self.cumulative_flops()}


def load_model(path: Path) -> tuple[RobertaMLM, dict]:
    """The ``RobertaMLM`` and metadata of a pretraining or bridge checkpoint."""
    ckpt = load_checkpoint(path)
    meta = ckpt.get("minimodel")
    if not isinstance(meta, dict) or "model_config" not in meta:
        raise CheckpointError(f"{path} is not a minimodel training checkpoint (no 'minimodel' metadata)")
    model = RobertaMLM(ModelConfig(**meta["model_config"]))
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit the model config stored with them: {e}") from e
    model.tie_weights()
    return model, meta


# --------------------------------------------------------------------------------------------- checkpoints


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save to a temporary file in the same folder, fsync, then rename over the target.

    A crash or a full disk leaves the previous checkpoint untouched and no partial file behind."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(checkpoint, path)

    def load_checkpoint(self, path: _PATH, map_location: Any = None, weights_only: bool | None = None) -> dict:
        return load_checkpoint(Path(path))


def atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"writing checkpoint {path} failed: {e}; the previous checkpoint is untouched") from e


def load_checkpoint(path: Path) -> dict:
    """torch.load with a clear error for missing, truncated or corrupt files."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated zip, bad pickle, ...
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({type(e).__name__}: {e}); "
                              f"delete it to fall back to an earlier one") from e
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"checkpoint {path} does not hold a checkpoint dictionary")
    return ckpt


class ScheduledCheckpoints(Callback):
    """``step{N:07d}.ckpt`` every ``every`` updates and at ``extra`` updates, ``last.ckpt`` beside each, and a
    final one when training ends. Also stops cleanly (checkpoint first) on SIGTERM/SIGUSR1 or a wall-time cap."""

    def __init__(self, dirpath: Path, every: int, extra: Iterable[int] = (), max_minutes: float = 0.0,
                 stop_at: int = 0, keep_steps: bool = True) -> None:
        self.dirpath, self.every, self.extra = Path(dirpath), every, set(extra)
        self.keep_steps = keep_steps  # False: only last.ckpt (the module's export() keeps the history)
        self.max_seconds, self.stop_at = max_minutes * 60, stop_at
        self.started = time.monotonic()
        self.last_step = -1
        self.last_saved = -1
        self.stop_requested: str | None = None
        self._old_handlers: dict[int, Any] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.last_step = trainer.global_step
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
        fresh = trainer.ckpt_path is None  # on resume, global_step is not restored yet at this point
        if fresh and getattr(pl_module, "export", None) is not None and trainer.is_global_zero:
            pl_module.export(0)  # the starting point of the curve

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After Lightning registered its own handlers (which would raise SIGTERMException mid-epoch and
        # requeue from a hpc checkpoint): ours let the current update finish, checkpoint, then stop.
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            try:
                self._old_handlers[sig] = signal.signal(sig, self._request_stop)
            except ValueError:  # not in the main thread
                pass

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)

    def _request_stop(self, signum: int, frame: Any) -> None:
        self.stop_requested = signal.Signals(signum).name
        INTERRUPTED.append(self.stop_requested)

    def save(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        export = getattr(pl_module, "export", None)
        if export is not None and trainer.is_global_zero:
            export(step)
        if not self.keep_steps:
            trainer.save_checkpoint(self.dirpath / "last.ckpt", weights_only=False)  # full state: resumable
            return
        path = self.dirpath / f"step{step:07d}.ckpt"
        trainer.save_checkpoint(path, weights_only=False)
        if trainer.is_global_zero:
            link_or_copy(path, self.dirpath / "last.ckpt")
        trainer.strategy.barrier()

    def saved(self, step: int) -> bool:
        return self.last_saved == step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if step == self.last_step:  # inside gradient accumulation: not an update boundary
            return
        self.last_step = step
        if step % self.every == 0 or step in self.extra:
            self.save(trainer, pl_module)
            self.last_saved = step
        if trainer.world_size > 1:  # every rank must stop at the same update
            stop = trainer.strategy.reduce_boolean_decision(self.stop_requested is not None, all=False)
            if stop and self.stop_requested is None:
                self.stop_requested = "a signal on another rank"
        if self.stop_at and step >= self.stop_at:
            self.stop_requested = self.stop_requested or f"stop_at={self.stop_at}"
        if self.max_seconds and time.monotonic() - self.started > self.max_seconds:
            self.stop_requested = self.stop_requested or f"wall-time cap of {self.max_seconds / 60:g} min"
        if self.stop_requested:
            if not self.saved(step):
                self.save(trainer, pl_module)
                self.last_saved = step
            trainer.should_stop = True

    def state_dict(self) -> dict:
        """RNG states travel with the checkpoint so that dropout after a resume continues exactly."""
        return {"rng": rng_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        if "rng" in state_dict:
            set_rng_state(state_dict["rng"])

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.stop_requested:
            print(f"[minimodel] stopped at update {trainer.global_step} ({self.stop_requested}); "
                  f"rerun the same command to resume", flush=True)
        if not self.saved(trainer.global_step):
            self.save(trainer, pl_module)
            self.last_saved = trainer.global_step


def rng_state() -> dict:
    import random

    import numpy as np

    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def link_or_copy(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f".{dst.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        import shutil

        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


# --------------------------------------------------------------------------------------------- progress


class StageProgress(Callback):
    """Logs, at each update boundary: cumulative FLOPs and V100-days, tokens seen and throughput."""

    def __init__(self, flops_per_update: float, tokens_per_update: int, flops_offset: float = 0.0,
                 log_every: int = 10) -> None:
        self.flops_per_update, self.tokens_per_update = flops_per_update, tokens_per_update
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
        flops = self.flops_offset + step * self.flops_per_update
        metrics = {
            "flops/cumulative": flops,
            "flops/v100_days": v100_days(flops),
            "train/tokens": float(step * self.tokens_per_update),
            "train/updates": float(step),
        }
        if step > self.step0 and now > self.t0:
            rate = (step - self.step0) * self.tokens_per_update / (now - self.t0)
            metrics["perf/tokens_per_sec"] = rate
            metrics["perf/flops_per_sec"] = rate * self.flops_per_update / self.tokens_per_update
        self.t0, self.step0 = now, step
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, rank_zero_only=True)


# --------------------------------------------------------------------------------------------- loggers


def wandb_mode(requested: str) -> str:
    """auto -> online only when an API key is configured (env or netrc), else offline."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "online"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


class _AppendingWriter(_CSVWriter):
    """Lightning's CSV writer deletes an existing metrics.csv; this one keeps it and appends."""

    def _check_log_dir_exists(self) -> None:
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                self.metrics_keys = sorted(csv.DictReader(f).fieldnames or [])


class MetricsCSV(CSVLogger):
    """``{run_dir}/metrics.csv``, one row per logging step, kept across resumes."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(save_dir=str(run_dir), name="", version="")

    @property
    @rank_zero_experiment
    def experiment(self) -> _CSVWriter:
        if self._experiment is None:
            os.makedirs(self.log_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def truncate_metrics(run_dir: Path, step: int) -> None:
    """Drop rows logged at or after ``step`` (they belong to updates after the checkpoint we resume from).

    Known gap: Lightning writes the row of the update that completes checkpoint ``step`` right after the
    callbacks that saved it; a process killed in that window (about a millisecond) loses that one row,
    since the resumed run starts after the update. Weights, optimiser, data position and RNG are exact."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames or [], [r for r in reader if r.get("step") and int(r["step"]) < step]
    tmp = path.with_name(".metrics.csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def make_loggers(cfg: ExperimentConfig, run_dir: Path, run_name: str) -> list[Logger]:
    loggers: list[Logger] = [MetricsCSV(run_dir)]
    mode = wandb_mode(cfg.logging.wandb)
    if mode != "disabled":
        from lightning.pytorch.loggers import WandbLogger

        id_file = run_dir / "wandb_id.txt"
        if id_file.exists():
            run_id = id_file.read_text().strip()
        else:
            import uuid

            run_id = uuid.uuid4().hex[:12]
            id_file.write_text(run_id)
        loggers.append(WandbLogger(
            project=cfg.logging.project or f"minimodel-{cfg.name}", entity=cfg.logging.entity or None,
            group=cfg.system, name=run_name, id=run_id, resume="allow", save_dir=str(run_dir), mode=mode,
            config={"run_dir": str(run_dir)},
        ))
    return loggers


# --------------------------------------------------------------------------------------------- run


@dataclass
class StageRun:
    """Where a stage writes and how it trains."""

    run_dir: Path
    run_name: str
    trainer_cfg: TrainerConfig
    optim_cfg: OptimConfig

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"


def accumulation(optim: OptimConfig, world: int) -> int:
    per_pass = optim.micro_batch * world
    if optim.global_batch % per_pass:
        raise ValueError(f"global_batch {optim.global_batch} is not a multiple of micro_batch x devices "
                         f"({optim.micro_batch} x {world})")
    return optim.global_batch // per_pass


def make_trainer(cfg: ExperimentConfig, run: StageRun, callbacks: list[Callback], world: int = 1,
                 progress_bar: bool = True) -> L.Trainer:
    t, o = run.trainer_cfg, run.optim_cfg
    accum = accumulation(o, world)
    return L.Trainer(
        accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
        precision=t.precision, max_steps=o.updates, max_epochs=-1,
        accumulate_grad_batches=accum, gradient_clip_val=o.grad_clip or None,
        val_check_interval=t.val_every * accum, check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches or 1.0, num_sanity_val_steps=0,
        log_every_n_steps=t.log_every,  # counted in optimiser updates
        logger=make_loggers(cfg, run.run_dir, run.run_name),
        callbacks=[*callbacks, TQDMProgressBar(refresh_rate=max(1, accum))] if progress_bar else callbacks,
        enable_progress_bar=progress_bar, enable_checkpointing=False, enable_model_summary=False,
        use_distributed_sampler=False, plugins=[AtomicCheckpointIO()], default_root_dir=str(run.run_dir),
        deterministic=False, benchmark=False,
    )


def world_size(t: TrainerConfig) -> int:
    """Processes the trainer will run (devices x nodes), without starting anything."""
    if isinstance(t.devices, int):
        devices = t.devices
    elif isinstance(t.devices, (list, tuple)):
        devices = len(t.devices)
    elif str(t.devices).isdigit():
        devices = int(t.devices)
    else:
        accel = t.accelerator
        if accel in ("auto", "gpu", "cuda") and torch.cuda.is_available():
            devices = torch.cuda.device_count()
        else:
            devices = 1
    return max(1, devices) * t.num_nodes


def resume_point(run: StageRun) -> tuple[Path, int] | None:
    """``last.ckpt`` and its update count, or None for a fresh run. Fails clearly on a corrupt file."""
    last = run.ckpt_dir / "last.ckpt"
    if not last.exists():
        return None
    return last, int(load_checkpoint(last)["global_step"])


def is_done(run_dir: Path) -> bool:
    return (run_dir / DONE).is_file()


def read_done(run_dir: Path) -> dict | None:
    path = run_dir / DONE
    return json.loads(path.read_text()) if path.is_file() else None


def write_done(run_dir: Path, info: dict) -> None:
    tmp = run_dir / f".{DONE}.tmp"
    tmp.write_text(json.dumps(info, indent=1, default=str))
    os.replace(tmp, run_dir / DONE)


def fit(trainer: L.Trainer, module: L.LightningModule, datamodule: L.LightningDataModule, run: StageRun) -> None:
    resume = resume_point(run)
    if resume is not None and trainer.is_global_zero:
        print(f"[minimodel] resuming from {resume[0]} (update {resume[1]})", flush=True)
        truncate_metrics(run.run_dir, resume[1])
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume[0]) if resume else None)


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))
