"""The one owner of every path minimodel reads or writes under ``runs_dir`` and ``data.prepared_dir``.

::

    {runs_dir}/{name}/                          one experiment (every system of a study shares ``name``)
        report.md, plots/{task}.png             `minimodel report`
        slurm/                                  `minimodel submit`: batch scripts and job logs
        {label}/                                one system (``minijoint``, or ``minijoint-n6`` in a sweep)
            pretrain/ bridge/                   steps 1 and 1b         (a *stage run*, see below)
            adapt/{lang}/                       step 2 per language    (+ embeddings/step{N:07d}.pt, adapt_info.json;
                                                with models_from: a language the reused experiment lacks)
            finetune/{task}/seed{S}/            step 3                 (+ model.pt)
            finetune_mini/{task}/seed{S}/       step 3 of MiniJoint's mini-model alone (Table 5)
            results.jsonl                       step 4
            predictions/{task}/{lang}/          step 4's saved predictions (seed{S}-step{N:07d}.jsonl)
            truncation/{task}/{split}.{lang}.json   examples of a task file cut to max_len (``truncation.py``)
        {label}@{head}/                         a MiniJoint model with several heads: step 2 over one head
            adapt/{lang}/ finetune_mini/ results.jsonl   (its pretraining and finetuned primary models are {label}'s)
    stage run: config.yaml, metrics.csv, done.json, checkpoints/{last,step{N:07d}}.ckpt, wandb/
               (+ precision.json where trainer.precision is auto: what it became)

    {prepared_dir}/{lang}/spm.model, shards/    `minimodel prepare` (SentencePiece)
    {prepared_dir}/{lang}/hf-{name}/shards/     the source language encoded with a Hugging Face tokenizer
    {prepared_dir}/{lang}/focus/aux-{key}.*     adapt.init=focus: fastText vectors of the pieces (cached by step 2)

Which system's directories another system *shares* (MiniPost reuses BL_BASE's pretraining and
finetuned models) is a property of the systems, decided in ``systems.py``; this module only knows
how paths are spelled. Nothing here imports torch."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from minimodel.errors import UserError
from minimodel.store import atomic

if TYPE_CHECKING:
    from minimodel.config.schema import ExperimentConfig

DONE = "done.json"
CONFIG = "config.yaml"
INPUTS = "inputs.json"  # the finished runs a stage run was built on, as they were when it started
METRICS = "metrics.csv"
LAST = "last.ckpt"
FINETUNED = "model.pt"
ADAPT_INFO = "adapt_info.json"
BRIDGE_INFO = "bridge_info.json"  # how step 1b built its mini-model and its loss before any update
RESULTS = "results.jsonl"
PRECISION = "precision.json"  # trainer.precision=auto: the precision the run started in, and why


@dataclass(frozen=True)
class Layout:
    """Paths of one experiment: ``{runs_dir}/{name}``."""

    runs_dir: Path
    name: str
    models_from: str = ""  # another experiment whose pretrained, bridged and adapted runs this one reuses

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> Layout:
        return cls(Path(cfg.runs_dir), cfg.name, cfg.models_from)

    @property
    def models_root(self) -> Path:
        """Where the runs of steps 1, 1b and 2 live: this experiment's, or ``models_from``'s (read only)."""
        return self.runs_dir / (self.models_from or self.name)

    @property
    def root(self) -> Path:
        return self.runs_dir / self.name

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def slurm(self) -> Path:
        return self.root / "slurm"

    def system(self, label: str) -> Path:
        return self.root / label

    def pretrain(self, label: str) -> Path:
        return self.models_root / label / "pretrain"

    def bridge(self, label: str) -> Path:
        return self.models_root / label / "bridge"

    def adapt(self, label: str, lang: str) -> Path:
        """Step 2's run of ``lang``. With ``models_from``: the reused experiment's where it has one (its directory
        exists) and this experiment has none; a language it lacks is adapted in this experiment's own directory
        (``{runs_dir}/{name}/{label}/adapt/{lang}``): a reused run is never written by the experiment that reuses
        it. (The one path here that looks at the disk: which of the two runs exists.)"""
        own = self.root / label / "adapt" / lang
        if not self.models_from:
            return own
        reused = self.models_root / label / "adapt" / lang
        return reused if reused.exists() and not own.exists() else own

    def finetune(self, label: str, task: str, seed: int, body: str = "primary") -> Path:
        return self.system(label) / ("finetune" if body == "primary" else f"finetune_{body}") / task / f"seed{seed}"

    def results(self, label: str) -> Path:
        return self.system(label) / RESULTS

    def predictions(self, label: str, task: str, lang: str, seed: int, step: int, split: str = "test") -> Path:
        """Saved predictions of one evaluation (``evaluate.save_predictions``), beside the system's results."""
        suffix = "" if split == "test" else f".{split}"
        return self.system(label) / "predictions" / task / lang / f"seed{seed}-step{step:07d}{suffix}.jsonl"

    def truncation(self, label: str, task: str, split: str, lang: str) -> Path:
        """How many examples of one task file featurisation cut to ``max_len`` (``truncation.py``), beside the results."""
        return self.system(label) / "truncation" / task / f"{split}.{lang}.json"

    def report_of(self, split: str) -> Path:
        """``report.md`` for the test sets, ``report.dev.md`` for the target dev sets (``evaluate.split=dev``)."""
        return self.report if split == "test" else self.root / f"report.{split}.md"

    def all_results(self) -> list[Path]:
        return sorted(self.root.glob(f"*/{RESULTS}"))


# ------------------------------------------------------------------------------------ inside a stage run


def checkpoints(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def last_checkpoint(run_dir: Path) -> Path:
    return checkpoints(run_dir) / LAST


def step_checkpoint(run_dir: Path, step: int) -> Path:
    return checkpoints(run_dir) / f"step{step:07d}.ckpt"


def embeddings_dir(adapt_run: Path) -> Path:
    """Adaptation checkpoints of one language's step-2 run."""
    return adapt_run / "embeddings"


def adaptation_checkpoint(adapt_run: Path, step: int) -> Path:
    return embeddings_dir(adapt_run) / f"step{step:07d}.pt"


def adaptation_checkpoints(adapt_run: Path) -> list[Path]:
    """The adaptation checkpoints of one language's step-2 run, by step."""
    return sorted(embeddings_dir(adapt_run).glob("step*.pt"))


def checkpoint_step(path: Path) -> int:
    """The update count in a ``step{N}`` file name."""
    return int(path.stem.removeprefix("step"))


def finetuned_model(finetune_run: Path) -> Path:
    return finetune_run / FINETUNED


def is_done(run_dir: Path) -> bool:
    return (run_dir / DONE).is_file()


def read_done(run_dir: Path) -> dict | None:
    """What a finished stage run recorded (stage, step, checkpoint, flops, final metrics, ...), or None.

    A ``done.json`` that is not a JSON object (cut short, edited, another file) raises a ``UserError`` naming it."""
    path = run_dir / DONE
    if not path.is_file():
        return None
    try:
        info = atomic.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); this file marks the stage run as finished: "
                        f"{_redo_done(run_dir)}") from e
    if not isinstance(info, dict):
        raise UserError(f"{path} holds a JSON {type(info).__name__}, not the object a finished stage run records; "
                        f"{_redo_done(run_dir)}")
    return info


def stage_command(run_dir: Path) -> str:
    """The command that writes the stage run ``run_dir``, from its place in the layout (``minimodel adapt ...
    lang=de``); "" where the layout does not say."""
    parts = Path(run_dir).parts
    if parts and parts[-1] in ("pretrain", "bridge"):
        return f"minimodel {parts[-1]} ..."
    if len(parts) >= 2 and parts[-2] == "adapt":
        return f"minimodel adapt ... lang={parts[-1]}"
    if len(parts) >= 3 and parts[-3] == "finetune" and parts[-1].startswith("seed"):
        return f"minimodel finetune ... task={parts[-2]} seed={parts[-1][4:]}"
    return ""


def _redo_done(run_dir: Path) -> str:
    """The advice for a damaged ``done.json`` of ``run_dir``: whichever command read it (the stage itself, a later
    stage, evaluate, export), rerunning the stage that wrote it finishes it again."""
    command = stage_command(run_dir)
    stage = f"`{command}` (the stage that wrote it)" if command else "the stage that wrote it"
    return (f"delete it and rerun {stage} to finish the stage again from its last checkpoint, then the command that "
            f"stopped here if it was another (or restore the file)")


def write_done(run_dir: Path, info: dict) -> None:
    _write_json(run_dir / DONE, info)


def read_precision(run_dir: Path) -> str | None:
    """The precision a stage run configured with ``trainer.precision=auto`` started in (``precision.json``), or None
    where it has no such record. A file that is not such a record raises a ``UserError`` naming it."""
    path = run_dir / PRECISION
    if not path.is_file():
        return None
    try:
        info = atomic.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); it records the precision trainer.precision=auto chose when "
                        f"{run_dir} started: restore it, or delete {run_dir} to start the stage again") from e
    if not isinstance(info, dict) or not isinstance(info.get("precision"), str):
        raise UserError(f"{path} holds no \"precision\" string (the precision trainer.precision=auto chose when "
                        f"{run_dir} started): restore it, or delete {run_dir} to start the stage again")
    return info["precision"]


def write_precision(run_dir: Path, configured: str, precision: str, why: str) -> None:
    _write_json(run_dir / PRECISION, {"configured": configured, "precision": precision, "why": why})


def _write_json(path: Path, info: dict) -> None:
    atomic.write_json(path, info, default=str)


# ------------------------------------------------------------------------------------ prepared data


@dataclass(frozen=True)
class Prepared:
    lang: str
    tokenizer: str  # a SentencePiece .model path, or a Hugging Face tokenizer directory / hub id
    shards: Path
    hf: bool = False
    # adapt.vocabulary=extend: the language's own SentencePiece model, whose pieces the source tokenizer is extended
    # with (``data.extend``); "" for a language's own tokenizer
    base: str = ""
    # the language's text in another language's SentencePiece model (``bridge.langs``: the source language's), which
    # prepare reads and never trains
    borrowed: bool = False

    @property
    def done(self) -> Path:
        """``done.json`` of this language's prepare step (beside its shards), written when the tokenizer and every
        shard are there."""
        return self.shards.parent / DONE

    @property
    def aux_embeddings(self) -> Path:
        """FOCUS's auxiliary fastText vectors of this language's pieces (``adapt.init=focus``), one pair of files
        per key (``aux-{key}.npy`` and ``.json``): shared by every system and seed that adapts with the same text."""
        return self.shards.parent / "focus"


def _slug(ref: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(ref.rstrip("/")).name or "tokenizer")
    return f"{name}-{hashlib.sha1(ref.encode()).hexdigest()[:8]}"


def prepared(prepared_dir: str | Path, lang: str, hf_tokenizer: str = "", extends: str | None = None,
             in_source: str = "") -> Prepared:
    """Tokenizer and shards of ``lang``; ``hf_tokenizer``: the Hugging Face tokenizer of the source language.
    ``extends`` (``adapt.vocabulary: extend``, a target language): the source tokenizer it extends, a Hugging Face
    one's reference or "" for the source language's SentencePiece model; the extended tokenizer and the shards it
    encodes live apart, in ``{lang}/extend-{source}/``, beside the language's own SentencePiece model.
    ``in_source`` (``bridge.langs``): the source language, whose tokenizer encodes ``lang``'s text here: a Hugging
    Face one's shards in ``{lang}/hf-{name}/`` (as the source language's own), the source language's SentencePiece
    model's in ``{lang}/in-{source}-spm/``."""
    root = Path(prepared_dir) / lang
    if in_source and not hf_tokenizer:
        return Prepared(lang, str(Path(prepared_dir) / in_source / "spm.model"), root / f"in-{in_source}-spm" / "shards",
                        borrowed=True)
    if extends is not None:
        d = root / f"extend-{_slug(extends) if extends else 'spm'}"
        return Prepared(lang, str(d / ("tokenizer" if extends else "spm.model")), d / "shards", hf=bool(extends),
                        base=str(root / "spm.model"))
    if hf_tokenizer:
        return Prepared(lang, hf_tokenizer, root / f"hf-{_slug(hf_tokenizer)}" / "shards", hf=True)
    return Prepared(lang, str(root / "spm.model"), root / "shards")
