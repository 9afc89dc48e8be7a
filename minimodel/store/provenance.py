"""Identity by content, checked by the consumer: the one place that says which run made an artifact and whether
what a consumer reads is still what it expects.

- A finished stage run has an **identity** (``done.json``'s ``identity``): a hash of the settings that decide it
  (``identity.stage_identity``, paths left out), the identities of the runs it was built on, and its final weights.
  It follows content, not the time of writing: a stage finished again from the same checkpoint (its
  ``done.json`` deleted, say) gets the same identity, and nothing built on it turns stale.
- A consumer records the **stamp** of each run it reads (``inputs.json``, then ``done.json``'s ``inputs``) and
  refuses to go on when one of them finished again with another identity (``check_inputs``).
- A consumer compares a producer's recorded **settings** (its ``config.yaml``) with what its own configuration
  expects of that producer (``check_producer``): a finetuning over a pretraining that ran 4 updates while the
  configuration says 30 is refused, naming the keys; evaluation the same for finetuning (task featurisation
  included) and adaptation runs.
- Every **result row** records the identities of the adaptation and finetuning runs it came from
  (``adapt_id``, ``finetune_id``); evaluation treats a row whose runs were redone since as stale: it is removed
  (with its predictions file) and evaluated again (``stale_rows``).
- An **unfinished** run is never read as finished (``require_finished``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from minimodel.errors import UserError
from minimodel.store import atomic
from minimodel.store.layout import CONFIG, INPUTS, _write_json, read_done

IDENTITY_FIELDS = {"adapt": "adapt_id", "finetune": "finetune_id", "data": "data_id"}
"""The result row's field that holds the identity of each kind of run it came from, and of the evaluation data it
was computed on (``data_identity``)."""


def data_identity(split_file: str, settings: Mapping[str, Any], tokenizer_sha256: str) -> str:
    """What a zero-shot score was computed on: the evaluation file's bytes (sha256; "" for hub data, whose version
    the datasets cache decides), the settings that featurise it (``max_len``, text and label fields, stride), and the
    target tokenizer. A row whose data identity differs from the current one is evaluated again."""
    file = atomic.file_sha256(split_file) if split_file and Path(split_file).is_file() else ""
    payload = {"file": file, "settings": dict(settings), "tokenizer": tokenizer_sha256}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------ identity of a finished run


def weights_digest(tensors: Mapping[str, Any]) -> str:
    """sha256 of named tensors (names, dtypes, shapes and bytes, in name order): the content of a model."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def settings_of(cfg: Any, stage: str) -> dict[str, Any]:
    """The values of the keys that decide ``stage`` (``identity.stage_identity``) in ``cfg``, paths left out (a
    run moved with its directory is the same run)."""
    from minimodel.store.identity import _PATHS, _flatten, stage_identity

    flat = _flatten(OmegaConf.to_container(OmegaConf.structured(cfg)))
    keys = stage_identity(stage)
    return {k: v for k, v in sorted(flat.items())
            if any(k == i or k.startswith(i + ".") for i in keys) and not any(fnmatchcase(k, p) for p in _PATHS)}


def identity(settings: Mapping[str, Any], inputs: Mapping[str, Mapping], weights: str) -> str:
    """A finished run's identity from its settings, the stamps of its inputs and its weights digest."""
    payload = {"settings": dict(settings), "inputs": {k: v.get("identity", v.get("sha256")) for k, v in inputs.items()},
               "weights": weights}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_identity(run_dir: Path) -> str | None:
    """The identity of a finished run (None when it is not finished). Runs finished before identities were
    recorded: a hash of their done.json."""
    done = read_done(run_dir)
    if done is None:
        return None
    if isinstance(done.get("identity"), str):
        return done["identity"]
    return hashlib.sha256(json.dumps(done, indent=1, default=str).encode()).hexdigest()[:16]


def stamp(run_dir: Path) -> dict | None:
    """How a run built on the finished run ``run_dir`` records it: its last update and its identity. None when
    ``run_dir`` is not finished."""
    done = read_done(run_dir)
    if done is None:
        return None
    ident = run_identity(run_dir)
    return {"run": str(run_dir), "step": done.get("step"), "finished_at": done.get("finished_at"),
            "identity": ident, "sha256": ident}


def producers(**runs: Path | None) -> dict[str, Path]:
    """The finished runs a stage reads, by role, leaving out those that are not runs (an external model: None)."""
    return {name: Path(p) for name, p in runs.items() if p is not None}


def record_inputs(run_dir: Path, producers: dict[str, Path]) -> dict[str, dict]:
    """Write ``inputs.json``: the stamp of each finished run this stage run reads (e.g. ``{"pretrain": ...}``)."""
    stamps = {name: s for name, p in producers.items() if (s := stamp(Path(p))) is not None}
    _write_json(run_dir / INPUTS, stamps)
    return stamps


def recorded_inputs(run_dir: Path) -> dict[str, dict]:
    """The stamps a run recorded of what it was built on (done.json's ``inputs``, else ``inputs.json`` of a run
    still going); {} for runs written before minimodel recorded them."""
    done = read_done(run_dir)
    if done is not None and isinstance(done.get("inputs"), dict):
        return done["inputs"]
    path = run_dir / INPUTS
    if path.is_file():
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(f"{path} is not valid JSON ({e}): delete {run_dir} to redo this stage") from e
        return info if isinstance(info, dict) else {}
    return {}


def stale_inputs(run_dir: Path, producers: dict[str, Path]) -> list[str]:
    """Why ``run_dir`` no longer matches the runs it was built on (``producers``: role -> the run the experiment
    names for it now): one finished again since with another identity, or lost its done.json. [] when all are
    as recorded (or nothing was recorded: a run written before minimodel recorded its inputs)."""
    recorded = recorded_inputs(run_dir)
    problems: list[str] = []
    for name, producer in producers.items():
        old = recorded.get(name)
        if not isinstance(old, dict):
            continue
        now = stamp(producer)
        if now is None:
            problems.append(f"{run_dir} was built on the {name} run {producer}, which is no longer finished "
                            f"(no done.json)")
        elif now["identity"] != old.get("identity", old.get("sha256")):
            problems.append(f"{run_dir} was built on the {name} run {producer} as it finished at update "
                            f"{old.get('step')} ({old.get('finished_at') or 'time not recorded'}), but that run "
                            f"was redone since (update {now['step']}, {now['finished_at'] or 'time not recorded'}; "
                            f"other settings or weights)")
    return problems


def check_inputs(run_dir: Path, producers: dict[str, Path]) -> None:
    """A ``UserError`` when ``run_dir`` was built on runs that changed since (``stale_inputs``): what it holds
    would not match the model it is used with."""
    problems = stale_inputs(run_dir, producers)
    if problems:
        raise UserError("; ".join(problems) + f". What {run_dir} holds would not match the model it is used with: "
                        f"delete {run_dir} (and the runs built on it) and rerun to redo it on the current model, or "
                        f"restore the earlier run")


# ------------------------------------------------------------------------------------ a producer, as the consumer expects


def check_producer(cfg: Any, run_dir: Path, consumer: str) -> None:
    """The finished run ``run_dir`` ran with the settings this configuration expects of it (its stage's identity
    keys, from its ``config.yaml``); a ``ConfigError`` naming the keys otherwise. ``consumer`` says who reads it."""
    from minimodel.errors import ConfigError
    from minimodel.store.identity import _PATHS, stage_changes

    done = read_done(run_dir)
    path = run_dir / CONFIG
    if done is None or not path.is_file() or not isinstance(done.get("stage"), str):
        return  # not finished (the caller says so), or finished before runs kept their settings
    try:
        saved = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as e:  # yaml / omegaconf errors
        raise ConfigError(f"{path}: not valid YAML ({e}); it records the settings {run_dir} ran with") from e
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: expected a mapping (the settings {run_dir} ran with)")
    changes = stage_changes(saved, OmegaConf.to_container(OmegaConf.structured(cfg)), done["stage"])  # type: ignore[arg-type]
    # where data is read from may differ (a copied prepared dir, a moved source): what was read is checked by
    # content where it is loaded (tokenizer sha256, train file sha256), not by its path
    changes = [c for c in changes if not any(fnmatchcase(c[0], p) for p in _PATHS)]
    if changes:
        listed = "; ".join(f"{k}: {b!r} there, {a!r} here" for k, b, a in changes)
        raise ConfigError(f"{consumer} reads {run_dir}, which ran with other settings than this configuration "
                          f"expects of it ({path}): {listed}. Use the settings it ran with, or redo it with these "
                          f"(delete {run_dir} and rerun its step)")


def require_finished(run_dir: Path, what: str, command: str) -> dict:
    """``done.json`` of ``run_dir``, or a ``UserError``: an unfinished run (stopped at ``stop_at``, by a signal or
    a wall-time cap, or still running) is never read as finished."""
    done = read_done(run_dir)
    if done is None and not Path(run_dir).exists():
        raise UserError(f"{what} {run_dir} does not exist: that step never ran; run `{command}` first")
    if done is None:
        raise UserError(f"{what} {run_dir} is not finished (no done.json: stopped early, or still running): "
                        f"finish it first (rerun `{command}` to resume it)")
    return done


# ------------------------------------------------------------------------------------ result rows


def row_producers(row: Mapping[str, Any]) -> dict[str, str]:
    """The identities a result row records, by field (``adapt_id``, ``finetune_id``)."""
    return {f: row[f] for f in IDENTITY_FIELDS.values() if isinstance(row.get(f), str)}


def stale_rows(rows: Iterable[dict], current: Mapping[tuple, Mapping[str, str | None]],
               key: Any) -> list[dict]:
    """The rows whose recorded producers differ from the current ones. ``current``: ``key(row)`` -> the
    identities the row's runs have now (a field missing from a row, from rows written before identities were
    recorded, is not compared)."""
    stale = []
    for row in rows:
        now = current.get(key(row))
        if now is None:
            continue
        recorded = row_producers(row)
        if any(field in recorded and recorded[field] != ident for field, ident in now.items()):
            stale.append(row)
    return stale
