"""Lightning's checkpoint I/O, made atomic and with clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

from minimodel.store import atomic
from minimodel.store.checkpoints import load_checkpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes through ``atomic.save_torch`` (a crash, a full disk or Ctrl-C leaves the previous checkpoint untouched)
    and reads through ``load_checkpoint`` (a truncated file is a clear error naming it)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        atomic.save_torch(checkpoint, Path(path))

    def load_checkpoint(self, path: _PATH, map_location: Any = None, weights_only: bool | None = None) -> dict:
        return load_checkpoint(Path(path))
