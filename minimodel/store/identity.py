"""What decides a stage run, and whether a finished (or stopped) run is this configuration's.

``stage_identity`` names the config keys that decide what a stage run produces, ``stage_changes`` compares them with
those a run recorded (its ``config.yaml``), ``check_finished`` refuses to reuse or resume a run that ran with other
settings. (Outside the ``config`` package: it reads ``layout``, which reads the schema.)"""

from __future__ import annotations

from dataclasses import fields
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from minimodel.config.load import value_problem
from minimodel.config.schema import PRECISIONS, ExperimentConfig, TaskConfig
from minimodel.errors import ConfigError
from minimodel.store.layout import CONFIG, PRECISION, read_precision

_DATA_READ = ("data.prepared_dir", "data.vocab_size", "data.source_tokenizer")  # tokenizers and shards a stage reads
_MLM_DATA = (*_DATA_READ, "data.seq_len", "data.mask_prob", "data.val_blocks")
_OPTIM = ("lr", "betas", "eps", "weight_decay", "warmup_updates", "updates", "global_batch", "grad_clip")
_TRAINER = ("precision", "seed")  # numerics, the random stream
_FINETUNE = ("epochs", "warmup_ratio", "batch_size", "weight_decay", "betas", "eps", "grad_clip", "pool", "layer")
# not what a finetuning produces: langs (the evaluation languages) and id_field (the ids of saved predictions), step 4's
_TASK = tuple(f.name for f in fields(TaskConfig) if f.name not in ("langs", "id_field"))
_PATHS = ("data.prepared_dir", "data.source_tokenizer", "bridge.source", "tasks.*.source", "tasks.*.train_source")
LENGTH = {"pretrain": "pretrain.optim.updates", "bridge": "bridge.optim.updates", "adapt": "adapt.optim.updates",
          "finetune": "finetune.epochs"}
"""The key that says how long a stage trains (its learning rate decays to 0 at the end of it)."""


def stage_identity(stage: str) -> tuple[str, ...]:
    """The config keys (a section stands for every key under it) that decide what the stage run ``stage``
    (``pretrain``, ``bridge``, ``adapt/de``, ``finetune/xnli/seed1[/mini]``) produces.

    Adaptation's checkpoint schedule is part of it (its checkpoints are the points of step 4's curves); not
    part of it: where and how fast it runs (accelerator, devices, nodes, strategy, compile, micro-batches, data
    workers), how often it logs, validates and (other stages) checkpoints, when one command stops it
    (``trainer.stop_at``, ``trainer.max_minutes``), logging and wandb, the corpus (a stage reads
    ``data.prepared_dir``), the command's selectors (lang, task, seed, body: the run directory spells them), the
    system and tag (MiniPost finetunes in BL_BASE's directories), and the settings of the runs it reads
    (checked when those run)."""
    kind, _, rest = stage.partition("/")
    trainer = tuple(f"{kind}.trainer.{k}" for k in _TRAINER)
    if kind == "finetune":
        task = rest.split("/")[0]
        return ("source_lang", "model", *_DATA_READ, "bridge.source", *(f"finetune.{k}" for k in _FINETUNE),
                *trainer, *(f"tasks.{task}.{k}" for k in _TASK))
    extra = {"pretrain": ("pretrain.head_weights", "pretrain.forget_every", "pretrain.forget_lr_restart"),
             "bridge": ("bridge.depth", "bridge.layers", "bridge.source", "bridge.init", "bridge.fit_tokens",
                        "bridge.objective", "bridge.distill_mse", "bridge.langs"),
             "adapt": ("adapt.init", "adapt.vocabulary", "adapt.focus", "adapt.head", "adapt.schedule",
                       "adapt.data_fraction", "adapt.trainer.ckpt_every",
                       "adapt.trainer.ckpt_steps")}.get(kind, ())
    return ("source_lang", "model", *_MLM_DATA, *(f"{kind}.optim.{k}" for k in _OPTIM), *trainer, *extra)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _same(key: str, old: Any, new: Any) -> bool:
    if old == new:
        return True
    if key.endswith(".trainer.precision") and new == "auto" and old in PRECISIONS:
        return True  # auto leaves the precision to the machine: a run made in any one of them is its result
    if any(fnmatchcase(key, p) for p in _PATHS) and isinstance(old, str) and isinstance(new, str) and old and new:
        return Path(old).expanduser().resolve() == Path(new).expanduser().resolve()
    return False


_NOT_SET = "(not set)"


def _readout_spelled(flat: dict[str, Any], defaults: dict[str, Any], stage: str) -> dict[str, Any]:
    """``flat`` with the default readout spelled as its default: ``finetune.pool`` naming the family's own token
    (``families.ModelFamily.pooling``) is "", and (the primary model's runs) ``finetune.layer`` naming the last layer
    is 0, so spelling out the default does not make a finished finetuning another run."""
    from minimodel.models.families import REGISTRY

    family = REGISTRY.get(str(flat.get("model.family", defaults["model.family"])))
    out = dict(flat)
    if family is not None and out.get("finetune.pool") == family.pooling:
        out["finetune.pool"] = ""
    mini = stage.startswith("finetune/") and stage.endswith("/mini")
    if not mini and out.get("finetune.layer") == flat.get("model.layers", defaults["model.layers"]):
        out["finetune.layer"] = 0
    return out


def stage_changes(saved: dict, current: dict, stage: str) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, current value)`` for each key of ``stage_identity(stage)`` that differs between
    ``saved`` (a stage run's ``config.yaml`` as a plain dict) and ``current`` (a config as a plain dict).

    A key the saved file lacks (written by an older version) counts as its default; a key the schema no longer
    has is ignored; paths that resolve to the same place are the same, and so are a readout's default and its value
    spelled out (``_readout_spelled``; the values listed are those written); a current ``trainer.precision=auto``
    is the same as any precision a run was made in (pass ``saved`` through ``as_started`` for a run that was auto
    too)."""
    identity = stage_identity(stage)
    defaults = _flatten(OmegaConf.to_container(OmegaConf.structured(ExperimentConfig)))
    old, new = _flatten(saved), _flatten(current)
    old_as, new_as = _readout_spelled(old, defaults, stage), _readout_spelled(new, defaults, stage)
    changes = []
    for key in sorted(new):
        if not any(key == k or key.startswith(k + ".") for k in identity):
            continue
        before = old_as.get(key, defaults.get(key, _NOT_SET))
        if not _same(key, before, new_as[key]):
            changes.append((key, old.get(key, defaults.get(key, _NOT_SET)), new[key]))
    return changes


def as_started(saved: dict, run_dir: Path, stage: str) -> dict:
    """``saved`` (a stage run's ``config.yaml`` as a plain dict) with ``trainer.precision=auto`` replaced by the
    precision it chose when the run started (``precision.json``), where recorded: a finished or stopped run is
    compared by the precision it ran in."""
    kind = stage.partition("/")[0]
    trainer = saved.get(kind, {}).get("trainer") if isinstance(saved.get(kind), dict) else None
    if not isinstance(trainer, dict) or trainer.get("precision") != "auto":
        return saved
    started = read_precision(run_dir)
    if started is None:
        return saved
    return {**saved, kind: {**saved[kind], "trainer": {**trainer, "precision": started}}}


def started_precision(run_dir: Path, stage: str) -> tuple[str, Path] | None:
    """The precision the stage run in ``run_dir`` started in and the file that says so: the one its ``config.yaml``
    names, or where that says ``auto`` (or is missing) what auto chose (``precision.json``); None when neither
    says (a resume needs it)."""
    path, kind = run_dir / CONFIG, stage.partition("/")[0]
    saved = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else None
    value = _flatten(saved).get(f"{kind}.trainer.precision") if isinstance(saved, dict) else None
    if value in PRECISIONS:
        return value, path
    recorded = read_precision(run_dir)
    return (recorded, run_dir / PRECISION) if recorded is not None else None


def check_finished(cfg: ExperimentConfig, stage: str, run_dir: Path, finished: bool = True) -> None:
    """A finished stage run is this configuration's result only when the settings that decide it (see
    ``stage_identity``) are those it ran with (its ``config.yaml``); otherwise a ``ConfigError`` lists them.
    The same holds for a run stopped before its end (``finished=False``): resuming it with other settings
    would mix two runs in one.

    A finished run is never extended: its learning rate has decayed to 0 at its last update
    (``training/optim.py``), so more updates on top of it are not the schedule of a longer run."""
    path = run_dir / CONFIG
    if not path.is_file():  # finished before runs kept their config: nothing to compare with
        return
    try:
        saved = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as e:  # yaml / omegaconf errors
        raise ConfigError(f"{path}: not valid YAML ({value_problem(e)}); it records the settings the finished run "
                          f"{run_dir} ran with: restore it, or delete {run_dir} to train the stage again") from e
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: expected a mapping (the settings the finished run {run_dir} ran with): "
                          f"restore it, or delete {run_dir} to train the stage again")
    saved = as_started(saved, run_dir, stage)
    changes = stage_changes(saved, OmegaConf.to_container(OmegaConf.structured(cfg)), stage)  # type: ignore[arg-type]
    if not changes:
        return
    elsewhere = f"set another name= or runs_dir= (or delete {run_dir} to train it again)"
    key, before, after = changes[0]
    longer = key == LENGTH.get(stage.partition("/")[0]) and isinstance(before, (int, float)) and after > before
    if not finished:
        listed = "; ".join(f"{k}: {b!r} -> {a!r}" for k, b, a in changes)
        raise ConfigError(
            f"{run_dir} holds a run stopped before its end that ran with other settings than this configuration's "
            f"({path}): {listed}. Resuming it would mix the two; rerun with the settings it ran with to finish it, "
            f"or train the new ones in a new run: {elsewhere}")
    if len(changes) == 1 and longer:
        raise ConfigError(
            f"{run_dir} is finished with {key}={before} and cannot be continued to {after}: its learning rate "
            f"decayed linearly to 0 at its last update, so more updates on top of it would not follow the "
            f"schedule of a {key}={after} run. Train {key}={after} in a new run: {elsewhere}; or keep "
            f"{key}={before} to use the finished run")
    listed = "; ".join(f"{k}: {b!r} -> {a!r}" for k, b, a in changes)
    raise ConfigError(
        f"{run_dir} is finished, but it ran with other settings than this configuration's ({path}): {listed}. "
        f"Rerun with the settings it ran with, or train the new ones in a new run: {elsewhere}")
