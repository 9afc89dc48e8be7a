"""An experiment's configuration checked for its system: what every command loads (``load_experiment``).

``config.load.load_config`` composes the YAML files and overrides and runs the checks that hold for every system;
``systems.validate`` adds the system's own. They meet here so that the ``config`` package knows nothing of the
systems (``systems`` reads the schema)."""

from __future__ import annotations

from pathlib import Path

from minimodel import systems
from minimodel.config.load import load_config
from minimodel.config.schema import ExperimentConfig


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Compose, override, validate: the checks that hold for every system, then the system's own
    (``systems.validate``). Returns a typed ``ExperimentConfig`` (an OmegaConf-backed object)."""
    path = Path(path)
    cfg = load_config(path, overrides)
    systems.validate(cfg, str(path))
    return cfg
