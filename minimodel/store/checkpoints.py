"""Checkpoint files: atomic writes, loads with clear errors, RNG state, and the typed payloads.

Three payloads are minimodel's own, each a dataclass with a ``format`` version written with it and
checked when read:

* ``TrainingMeta``: the ``minimodel`` entry of a Lightning training checkpoint (steps 1, 1b, 2, 3);
* ``Adaptation``: an adaptation checkpoint ``embeddings/step{N}.pt`` (what step 4 plugs in);
* ``Finetuned``: a finished step-3 model ``model.pt``.

``FORMAT`` is the version this code writes. Files written before versions were checked (format 1, or
no ``format`` at all) are migrated when read; a newer or unknown format is refused with an error that
names the file. Bump ``FORMAT`` and add a migration in ``_migrate`` whenever a payload changes."""

from __future__ import annotations

import pickle
import random
import re
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from minimodel.errors import CheckpointError
from minimodel.models.families import build, of
from minimodel.models.model import POOLS, ClassificationHead, ModelConfig, RobertaMLM, SpanHead
from minimodel.store import atomic

FORMAT = 3  # 1: before typed payloads (adaptation checkpoints wrote format 1, the others none); 2: before a
# finetuned model recorded its readout (``Finetuned.readout``; read as the family's token of the last layer)

__all__ = ["FORMAT", "CheckpointError", "TrainingMeta", "Adaptation", "Finetuned", "atomic_torch_save",
           "load_checkpoint", "load_trained_model", "load_final_model", "load_adaptation", "load_finetuned", "link_or_copy", "rng_state", "set_rng_state"]


# ------------------------------------------------------------------------------------------------ files


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``atomic.save_torch``: torch.save to a temporary file beside ``path``, fsync, rename over it; a crash, a full
    disk (a ``WriteError`` naming the bytes needed and free) or Ctrl-C leaves the previous file and no partial one."""
    atomic.save_torch(obj, Path(path))


def _numpy_array_globals() -> list[Any]:
    """What the safe unpickler needs to rebuild a plain numpy array: checkpoints written before RNG states
    were stored as tensors hold numpy's RNG key array (uint32)."""
    core = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
    return [np.ndarray, np.dtype, core.multiarray._reconstruct, type(np.dtype(np.uint32))]


def load_checkpoint(path: Path) -> dict:
    """torch.load as data only (``weights_only=True``: tensors, numbers, strings, lists, dicts; no code runs),
    with clear errors for missing, truncated, corrupt and unsafe files. The message says what is wrong, not what to
    do: only the caller knows whether the file is one minimodel wrote and what rebuilds it (``load_final_model``,
    ``stages.bridge.load_primary``; a stage's resume falls back to an earlier checkpoint by itself)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        unsafe = re.search(r"unsupported global:? (GLOBAL )?(\S+)", str(e), re.IGNORECASE)
        if unsafe:
            raise CheckpointError(
                f"refusing to load {path}: it holds a Python object ({unsafe.group(2)}) whose loading could run "
                f"code; minimodel reads checkpoints as plain data (tensors, numbers, strings, lists) only. "
                f"Do not use files of unknown origin") from e
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({_first_line(e)})") from e
    except Exception as e:  # truncated zip, bad magic number, ...
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({type(e).__name__}: {_first_line(e)})"
                              ) from e
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"checkpoint {path} does not hold a checkpoint dictionary")
    return ckpt


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[-1].strip() if isinstance(e, pickle.UnpicklingError) and lines else (lines[0] if lines else "")


link_or_copy = atomic.link_or_copy  # ``dst`` becomes the same file as ``src`` (a hard link where possible), whole


def rng_state() -> dict:
    """The RNG states of torch, numpy and Python, as data the safe unpickler reads (tensors, ints, tuples)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
    state = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, *rest = state["numpy"]  # keys: a tensor, or a numpy array in checkpoints before format 2
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((kind, keys.astype(np.uint32), *rest))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------------------ payloads

P = TypeVar("P", bound="Payload")


@dataclass
class Payload:
    """A versioned record saved as a plain dict (``kind`` and ``format`` included)."""

    KIND: ClassVar[str] = ""
    WHAT: ClassVar[str] = ""  # for messages: "an adaptation checkpoint"
    REQUIRED: ClassVar[tuple[str, ...]] = ()  # keys without which an old file is not this payload

    def to_dict(self) -> dict:
        return {"kind": self.KIND, "format": FORMAT, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_dict(cls: type[P], d: Any, where: str | Path) -> P:
        if not isinstance(d, dict):
            raise CheckpointError(f"{where} is not {cls.WHAT}")
        d = _migrate(cls, dict(d), where)
        names = {f.name for f in fields(cls)}
        missing = [f.name for f in fields(cls)
                   if f.name not in d and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise CheckpointError(f"{where} is not a complete {cls.KIND} payload (missing {sorted(missing)})")
        return cls(**{k: v for k, v in d.items() if k in names})


def _migrate(cls: type[Payload], d: dict, where: str | Path) -> dict:
    """Bring a payload read from ``where`` to ``FORMAT``, or refuse it clearly."""
    version = d.get("format", 1)
    kind = d.get("kind", cls.KIND if version == 1 else None)
    if not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{where}: unknown checkpoint format {version!r}")
    if version > FORMAT:
        raise CheckpointError(f"{where} was written by a newer minimodel (format {version}; this one reads up to "
                              f"{FORMAT}): upgrade minimodel to read it")
    if kind != cls.KIND:
        raise CheckpointError(f"{where} holds a '{kind}' payload: it is not {cls.WHAT}")
    if version == 1:  # written before payloads were typed: same fields, no kind; check it is what it claims
        missing = [k for k in cls.REQUIRED if k not in d]
        if missing:
            raise CheckpointError(f"{where} is not {cls.WHAT} (missing {sorted(missing)})")
        d = {**d, "kind": cls.KIND, "format": FORMAT}
    return d


@dataclass
class TrainingMeta(Payload):
    """The ``minimodel`` entry of a Lightning training checkpoint."""

    KIND: ClassVar[str] = "training"
    WHAT: ClassVar[str] = "minimodel training metadata"
    REQUIRED: ClassVar[tuple[str, ...]] = ("stage", "system", "model_config")

    stage: str
    system: str
    model_config: dict
    lang: str = ""
    tokenizer: dict = field(default_factory=dict)  # path, sha256 (and vocab_size for adaptation)
    step: int = 0
    flops: float = 0.0
    extra: dict = field(default_factory=dict)  # what one stage adds (bridge depth, task labels, body source, ...)

    @classmethod
    def from_checkpoint(cls, ckpt: dict, where: str | Path) -> TrainingMeta:
        meta = ckpt.get("minimodel")
        if not isinstance(meta, dict) or "model_config" not in meta:
            raise CheckpointError(f"{where} is not a minimodel training checkpoint (no 'minimodel' metadata)")
        if meta.get("format", 1) == 1:  # before: one flat dict, stage-specific keys beside the common ones
            common = {f.name for f in fields(cls)} | {"format", "kind"}
            meta = {**{k: v for k, v in meta.items() if k in common},
                    "extra": {k: v for k, v in meta.items() if k not in common}}
        return cls.from_dict(meta, where)


@dataclass
class Adaptation(Payload):
    """An adaptation checkpoint: the target-language embeddings and output bias at one update of step 2."""

    KIND: ClassVar[str] = "adaptation"
    WHAT: ClassVar[str] = "an adaptation checkpoint"
    REQUIRED: ClassVar[tuple[str, ...]] = ("embeddings", "bias", "tokenizer", "step", "flops", "lang", "system")

    system: str
    lang: str
    embeddings: torch.Tensor  # (V_trg, h)
    bias: torch.Tensor  # (V_trg,)
    tokenizer: dict  # path, sha256, vocab_size of the target tokenizer
    step: int
    flops: float  # cumulative adaptation FLOPs up to ``step`` (A3)
    v100_days: float = 0.0
    stage: str = "adapt"
    body: str = ""  # the checkpoint the frozen body came from
    body_layers: int = 0
    primary: str = ""  # the primary model the embeddings are meant for
    overlapping_pieces: int = 0
    phase: str = ""  # progressive adaptation: the head of the phase the last update (``step``) belonged to
    # the output projection (V_trg, h) of a model whose heads do not project with the embeddings (a causal LM with
    # model.tie_embeddings: false); None otherwise. ``bias`` is empty where the heads have no output bias
    output: torch.Tensor | None = None
    # adapt.vocabulary=extend: the first ``kept`` rows are the source model's own pieces, as they were (the target
    # tokenizer is the source's plus new pieces); 0: a vocabulary of its own (the paper)
    kept: int = 0


@dataclass
class Finetuned(Payload):
    """A finished step-3 model: body and task head weights, labels, tokenizer and English scores."""

    KIND: ClassVar[str] = "finetuned"
    WHAT: ClassVar[str] = "a finetuned model"
    REQUIRED: ClassVar[tuple[str, ...]] = ("body_state", "head_state", "model_config", "labels", "qa")

    system: str
    task: str
    seed: int
    model_config: dict
    labels: list
    qa: bool
    body_state: dict
    head_state: dict
    body: str = "primary"
    source: str = ""  # the checkpoint the finetuned body came from
    tokenizer: dict = field(default_factory=dict)
    train_sha256: str = ""  # of the local train file finetuned on ("" for hub data and older files)
    english: dict = field(default_factory=dict)  # {"dev": {metric: value}, "test": {...}}
    step: int = 0
    stage: str = "finetune"
    # what the task head reads (finetune.pool, finetune.layer, resolved): {"pool": first | last | mean, "layer": 1..L};
    # empty in files written before (format 2 and older): the family's token of the last layer
    readout: dict = field(default_factory=dict)



# ------------------------------------------------------------------------------------------------ models


def load_trained_model(path: Path) -> tuple[RobertaMLM, TrainingMeta]:
    """The ``RobertaMLM`` and metadata of a training checkpoint (step 1 or 1b)."""
    ckpt = load_checkpoint(path)
    meta = TrainingMeta.from_checkpoint(ckpt, path)
    model = build(ModelConfig(**meta.model_config))
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit the model config stored with them: {e}") from e
    model.tie_weights()
    return model, meta


def rebuild_advice(path: Path, stage: str) -> str:
    """What rebuilds ``path``, the final checkpoint (``last.ckpt``) of a finished ``stage`` run (pretrain, bridge):
    rerunning the stage rebuilds a missing or cut one from the run's newest intact step checkpoint, exactly (the same
    weights and identity: nothing built on it is redone); one damaged in place is deleted first, so that the rerun
    sees it missing (minimodel wrote it: nothing of the user's is lost)."""
    if path.is_dir():  # never "delete" a directory: a caller gave the run (or another folder), not its checkpoint
        return (f"{path} is a directory, not the final checkpoint file of a {stage} run (its "
                f"checkpoints/last.ckpt): give that file")
    rerun = (f"rerun `minimodel {stage} ...` with this configuration: it rebuilds {path.name} from the run's newest "
             f"intact step checkpoint, exactly (the same weights and identity, so nothing built on it is redone), "
             f"then rerun this step")
    return (f"{path} is the final checkpoint of a finished {stage} run (minimodel wrote it): "
            + (rerun if not path.exists() else f"delete {path} and {rerun}"))


def load_final_model(path: Path, stage: str) -> tuple[RobertaMLM, TrainingMeta]:
    """``load_trained_model`` of the final checkpoint of a finished ``stage`` run (a consumer's read): a missing or
    damaged one is an error that says how to rebuild it (``rebuild_advice``)."""
    try:
        return load_trained_model(path)
    except CheckpointError as e:
        if str(e).startswith("refusing to load"):  # a file that would run code: not minimodel's, not rebuilt
            raise
        raise CheckpointError(f"{e}. {rebuild_advice(Path(path), stage)}") from e


def load_adaptation(path: Path) -> Adaptation:
    return Adaptation.from_dict(load_checkpoint(path), path)


def load_finetuned(path: Path) -> tuple[RobertaMLM, torch.nn.Module, Finetuned]:
    """Body and task head of a finished step-3 run (``model.pt``)."""
    ft = Finetuned.from_dict(load_checkpoint(path), path)
    body = build(ModelConfig(**ft.model_config))
    body.load_state_dict(ft.body_state)
    body.tie_weights()
    cfg = body.cfg
    pool, layer = ft.readout.get("pool") or of(cfg).pooling, int(ft.readout.get("layer") or cfg.layers)
    if pool not in POOLS or not 1 <= layer <= cfg.layers:
        raise CheckpointError(f"{path}: readout {ft.readout} is not one of this {cfg.layers}-layer model (pool "
                              f"{', '.join(POOLS)}; layer 1..{cfg.layers})")
    head: torch.nn.Module = (SpanHead(cfg.hidden, layer) if ft.qa else
                             ClassificationHead(cfg.hidden, len(ft.labels), cfg.dropout, pool, layer))
    head.load_state_dict(ft.head_state)
    return body, head, ft
