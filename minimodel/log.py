"""minimodel's console messages: the ``minimodel`` logger, rank-zero filtered, one prefix.

Modules call ``log = get_logger(__name__)`` and ``log.info(...)``. The command line calls
``setup()`` once: messages go to stderr as ``[minimodel] ...``; processes other than rank 0 of a
distributed run print warnings and errors only; Lightning's start-up banners and tips are silenced.
Nothing here imports torch."""

from __future__ import annotations

import logging
import os
import sys
import warnings

PREFIX = "[minimodel]"
_RANK_VARS = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "JSM_NAMESPACE_RANK")


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("minimodel") else f"minimodel.{name}")


def process_rank() -> int:
    """This process's global rank, from the variables DDP launchers and SLURM set (0 when none is set)."""
    for var in _RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class RankZero(logging.Filter):
    """Info and below only from rank 0; warnings and errors from every rank, tagged with it."""

    def filter(self, record: logging.LogRecord) -> bool:
        rank = process_rank()
        if rank and record.levelno < logging.WARNING:
            return False
        record.rank_tag = f" (rank {rank})" if rank else ""
        return True


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a message is emitted (pytest and notebooks swap it)."""

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup(level: int = logging.INFO) -> None:
    """Configure the ``minimodel`` logger once per process (idempotent)."""
    root = logging.getLogger("minimodel")
    if not any(getattr(h, "_minimodel", False) for h in root.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter(f"{PREFIX}%(rank_tag)s %(message)s"))
        handler.addFilter(RankZero())
        handler._minimodel = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(level)
    quiet_lightning()


def quiet_lightning() -> None:
    """Lightning announces devices, tips and `max_steps reached` at INFO on every start: keep warnings only
    (and drop one deprecation notice its own code triggers in torch's pytree, which no user can act on)."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
