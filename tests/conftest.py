"""Shared fixtures: small slices of the bundled real corpora, and the real configs shrunk for CPU."""

from __future__ import annotations

import lzma
import os
from pathlib import Path

import pytest

from minimodel.config import ExperimentConfig, load_config

ROOT = Path(__file__).resolve().parent.parent
DEMO_CORPUS = ROOT / "data" / "demo" / "corpus"

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")


def real_text(lang: str, max_bytes: int) -> str:
    """The first ``max_bytes`` (cut at a document boundary) of the bundled corpus of ``lang``."""
    path = DEMO_CORPUS / f"{lang}.txt.xz"
    with lzma.open(path, "rt", encoding="utf-8") as f:
        text = f.read(max_bytes * 2)
    text = text[:max_bytes]
    cut = text.rfind("\n\n")
    return text[: cut + 1] if cut > 0 else text


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """en / de / tr corpora of ~400 KB of real text each (CC-100 layout)."""
    d = tmp_path_factory.mktemp("corpus")
    for lang in ("en", "de", "tr"):
        (d / f"{lang}.txt").write_text(real_text(lang, 400_000), encoding="utf-8")
    return d


def tiny_config(tmp: Path, corpus: Path, *overrides: str, experiment: str = "tiny") -> ExperimentConfig:
    """experiments/tiny.yaml (or another experiment) shrunk to seconds on a CPU, writing under ``tmp``."""
    base = [
        f"data.corpus_dir={corpus}", f"data.prepared_dir={tmp / 'prepared'}", f"runs_dir={tmp / 'runs'}",
        "data.vocab_size=1000", "data.seq_len=64", "data.val_blocks=8", "data.num_workers=0",
        "model.max_positions=66", "logging.wandb=disabled",
    ]
    return load_config(ROOT / "experiments" / f"{experiment}.yaml", [*base, *overrides])


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Path:
    """A session-wide prepared dir (tokenizers + shards for en, de, tr) built once; returns its parent."""
    from minimodel.data.prepare import prepare_language

    tmp = tmp_path_factory.mktemp("prep")
    cfg = tiny_config(tmp, corpus_dir)
    for lang in ("en", "de", "tr"):
        prepare_language(cfg, lang, progress=False)
    return tmp
