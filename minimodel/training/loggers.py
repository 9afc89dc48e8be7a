"""Where a stage's metrics go: ``metrics.csv`` in its run directory (kept across resumes) and wandb."""

from __future__ import annotations

import csv
import hashlib
import io
import os
from collections.abc import Callable
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter as _CSVWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from minimodel.config.schema import ExperimentConfig
from minimodel.store import atomic
from minimodel.store.layout import METRICS
from minimodel.store.wandb_results import wandb_mode


def wandb_run_id(run_dir: Path) -> str:
    """The wandb run of a stage run: derived from its directory, so that every rank and every requeue of the
    same run logs to the same wandb run (a run started by older code keeps the id it wrote to wandb_id.txt)."""
    legacy = run_dir / "wandb_id.txt"
    if legacy.is_file():
        return legacy.read_text().strip()
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]


def _csv(fields: list[str], rows: list[dict], header: bool) -> str:
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=fields)
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


class _AppendingWriter(_CSVWriter):
    """Lightning's CSV writer deletes an existing metrics.csv; this one keeps it and appends. Every write goes
    through ``atomic``: rows are appended whole or not at all, a new column rewrites the file whole."""

    def _check_log_dir_exists(self) -> None:
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                self.metrics_keys = sorted(csv.DictReader(f).fieldnames or [])

    def save(self) -> None:
        if not self.metrics:
            return
        path = Path(self.metrics_file_path)
        self._record_new_keys()
        old: list[dict] = []
        header: list[str] | None = None
        if path.is_file():
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                header = list(reader.fieldnames or [])
                old = [] if header == self.metrics_keys else list(reader)
        if header == self.metrics_keys:  # the usual case: the new rows go at the end
            atomic.append_text(path, _csv(self.metrics_keys, self.metrics, header=False))
        else:  # a new file, or a new column (judged from the file: a failed write is retried right): all again
            self.metrics_keys = sorted({*self.metrics_keys, *(header or [])})
            atomic.write_text(path, _csv(self.metrics_keys, [*old, *self.metrics], header=True))
        self.metrics = []


class MetricsCSV(CSVLogger):
    """``{run_dir}/metrics.csv``, one row per logging step, kept across resumes (rank 0 writes it)."""

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
    _keep_rows(run_dir, lambda r: bool(r.get("step")) and int(r["step"]) < step)


def _keep_rows(run_dir: Path, keep: Callable[[dict], bool]) -> None:
    """Rewrite metrics.csv (atomically) with the rows ``keep`` accepts; untouched when it accepts them all."""
    path = run_dir / METRICS
    if not path.is_file():
        return
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames or [], list(reader)
    kept = [r for r in rows if keep(r)]
    if len(kept) == len(rows):
        return
    atomic.write_text(path, _csv(fields, kept, header=True))


def drop_stop_rows(run_dir: Path, update: int, log_every: int, val_every: int) -> None:
    """After a run stopped at ``update`` (a signal, ``stop_at``, the wall-time cap): Lightning writes a row for the
    stopping update, with whatever was last logged for the metrics not logged at every update (FLOPs, throughput
    of an earlier update), and validates once more. An uninterrupted run has neither row unless ``update`` is on
    its logging / validation grid: drop them, so that a resumed run's metrics.csv is the uninterrupted run's."""
    def scheduled(row: dict) -> bool:
        if not row.get("step") or int(row["step"]) != update - 1:  # Lightning's step column: update - 1
            return True
        validation = bool(row.get("val/loss")) and not row.get("train/loss")
        return update % (val_every if validation else log_every) == 0

    _keep_rows(run_dir, scheduled)


def make_loggers(cfg: ExperimentConfig, run_dir: Path, run_name: str) -> list[Logger]:
    """metrics.csv, and wandb unless disabled (Lightning creates the wandb run on rank 0 only)."""
    loggers: list[Logger] = [MetricsCSV(run_dir)]
    mode = wandb_mode(cfg.logging.wandb)
    if mode != "disabled":
        from lightning.pytorch.loggers import WandbLogger

        loggers.append(WandbLogger(
            project=cfg.logging.project or f"minimodel-{cfg.name}", entity=cfg.logging.entity or None,
            group=cfg.system, name=run_name, id=wandb_run_id(run_dir), resume="allow", save_dir=str(run_dir),
            mode=mode, config={"run_dir": str(run_dir)},
        ))
    return loggers
