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
- What a step reads that no minimodel run wrote (``Outside``) is stamped by content too: an outside model
  (``bridge.source``: the digest of its weight and config files, cached by path, size and mtime in
  ``{runs_dir}/.file-digests.json`` so a large file is hashed once) and a language's prepared data (its tokenizer's
  sha256, its shards as their manifest records them, and the corpus ``prepare`` made them from). They are recorded
  and checked with the runs (``check_inputs``): one that changed since is named, with what changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from minimodel.errors import UserError
from minimodel.store import atomic
from minimodel.store.layout import CONFIG, INPUTS, Prepared, _write_json, read_done

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


DIGESTS = ".file-digests.json"
"""Beside the runs (``{runs_dir}/.file-digests.json``): the sha256 of outside files by path, size and mtime."""

SOURCE_FILES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt")
"""The files of an outside model directory that hold its weights (with its ``config.json``): its identity."""


def _read_cache(path: Path) -> dict:
    try:
        cache = atomic.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or damaged: hashed again (the cache only saves time)
        return {}
    return cache if isinstance(cache, dict) else {}


def file_digest(path: str | Path, cache_dir: str | Path | None = None) -> str:
    """The sha256 of a file's bytes, computed once per (path, size, mtime) when ``cache_dir`` is given: remembered in
    ``{cache_dir}/.file-digests.json``, so a 500 MB model file is not read again by every stage that checks it."""
    p = Path(path).expanduser().resolve()
    st = p.stat()
    key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}
    cache_path = Path(cache_dir) / DIGESTS if cache_dir else None
    if cache_path is not None:
        hit = _read_cache(cache_path).get(str(p))
        if isinstance(hit, dict) and all(hit.get(k) == v for k, v in key.items()) and isinstance(hit.get("sha256"), str):
            return hit["sha256"]
    digest = atomic.file_sha256(p)
    if cache_path is not None and cache_path.parent.is_dir():
        cache = _read_cache(cache_path)  # read again: another process may have added entries meanwhile
        cache[str(p)] = {**key, "sha256": digest}
        try:
            atomic.write_json(cache_path, cache)
        except (OSError, UserError):  # a full disk, a read-only runs_dir: hashed again next time, nothing lost
            pass
    return digest


def _digest(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(parts), sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Outside:
    """An input no minimodel run wrote, identified by its content: ``kind`` ``source`` (an outside model,
    ``bridge.source``: a Hugging Face directory or a GGUF file) or ``data`` (a language's prepared data: tokenizer,
    shards and the corpus they came from). ``cache``: where file digests are remembered (``runs_dir``)."""

    kind: str
    where: str
    cache: str = ""

    @property
    def what(self) -> str:
        return f"the outside model {self.where}" if self.kind == "source" else f"the prepared data {self.where}"

    def stamp(self) -> dict | None:
        """What a step records of it: its parts (by name) and an identity over them. None for what has no local
        content to read (a hub id: the hub's cache decides its version)."""
        parts = self._source() if self.kind == "source" else self._data()
        if parts is None:
            return None
        ident = _digest(parts)
        return {"run": self.where, "kind": self.kind, "parts": parts, "identity": ident, "sha256": ident}

    def _source(self) -> dict | None:
        p = Path(self.where).expanduser()
        if p.is_file():
            files = [p]
        elif p.is_dir():
            files = sorted(f for f in p.iterdir()
                           if f.is_file() and (f.suffix.lower() in SOURCE_FILES or f.name == "config.json"))
        else:
            return None
        return {f.name: file_digest(f, self.cache or None) for f in files}

    def _data(self) -> dict | None:
        shards = Path(self.where) / "shards"
        done = Path(self.where) / "done.json"
        try:
            recorded = atomic.loads(done.read_text(encoding="utf-8"))
            manifest = atomic.loads((shards / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # not prepared: the stage that reads it says so
        if not isinstance(recorded, dict) or not isinstance(manifest, dict):
            return None
        settings = recorded.get("settings") if isinstance(recorded.get("settings"), dict) else {}
        entries = [{k: e.get(k) for k in ("file", "tokens", "bytes", "sha256")} if isinstance(e, dict) else e
                   for e in manifest.get("shards", [])]
        tokenizer = recorded.get("tokenizer_sha256", "")
        spm = Path(self.where) / "spm.model"
        if spm.is_file():
            tokenizer = atomic.file_sha256(spm)  # the file as it is now (a few MB): a replaced one is seen
        return {"tokenizer": tokenizer, "shards": _digest({"shards": entries}),
                "corpus": {"file": settings.get("corpus", ""), "bytes": settings.get("corpus_bytes"),
                           "sha256": recorded.get("corpus_sha256", "")}}

    @classmethod
    def of_stamp(cls, stamp: Mapping[str, Any], cache: str = "") -> Outside | None:
        """The input a recorded stamp names (``inputs.json``), or None for a run's stamp."""
        if stamp.get("kind") in ("source", "data") and isinstance(stamp.get("run"), str):
            return cls(str(stamp["kind"]), str(stamp["run"]), cache)
        return None


def source_input(source: str, runs_dir: str | Path) -> Outside | None:
    """``bridge.source`` as an input of a step (None when unset)."""
    return Outside("source", source, str(runs_dir)) if source else None


def primary_source(cfg: Any, runs: Any) -> Outside | None:
    """The outside model a system's primary model is (``bridge.source`` with no step 1: ``runs.pretrain`` None), as an
    input of the steps that read it (bridge, adapt, finetune; evaluation checks it), None otherwise."""
    if runs.pretrain is not None or not cfg.bridge.source:
        return None
    return source_input(cfg.bridge.source, cfg.runs_dir)


def data_input(paths: Prepared) -> Outside:
    """A language's prepared data (``layout.prepared``) as an input of a step: ``{prepared_dir}/{lang}[/...]``."""
    return Outside("data", str(Path(paths.shards).parent))


def producers(**runs: Path | Outside | None) -> dict[str, Path | Outside]:
    """What a stage reads, by role: finished runs (their directories) and outside inputs (``Outside``), leaving out
    what is neither (an external model that is a hub id, a run the system does not have: None)."""
    return {name: (p if isinstance(p, Outside) else Path(p)) for name, p in runs.items() if p is not None}


def stamp_of(x: Path | Outside) -> dict | None:
    return x.stamp() if isinstance(x, Outside) else stamp(Path(x))


def record_inputs(run_dir: Path, producers: Mapping[str, Path | Outside]) -> dict[str, dict]:
    """Write ``inputs.json``: the stamp of each finished run and outside input this stage run reads (e.g.
    ``{"pretrain": ..., "target_data": ...}``)."""
    stamps = {name: s for name, p in producers.items() if (s := stamp_of(p)) is not None}
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
            info = atomic.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(f"{path} is not valid JSON ({e}): delete {run_dir} to redo this stage") from e
        return info if isinstance(info, dict) else {}
    return {}


def recorded_producers(run_dir: Path, cache: str = "") -> dict[str, Path | Outside]:
    """What ``run_dir`` recorded it read, as ``producers`` gives it (runs by the directory recorded)."""
    out: dict[str, Path | Outside] = {}
    for name, v in recorded_inputs(run_dir).items():
        if isinstance(v, dict) and isinstance(v.get("run"), str) and v["run"]:
            out[name] = Outside.of_stamp(v, cache) or Path(v["run"])
    return out


def _changed_parts(old: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """Which parts of an outside input differ between two stamps, with the values (digests shortened)."""
    def short(v: Any) -> str:
        if isinstance(v, dict):
            v = v.get("sha256") or v.get("bytes")
        return str(v)[:12] if v not in ("", None) else "not recorded"

    a, b = old.get("parts"), now.get("parts")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return "its content"
    names = [k for k in sorted({*a, *b}) if a.get(k) != b.get(k)]
    if not names:
        return "its content"
    return ", ".join(f"{k} ({short(a.get(k)) if k in a else 'absent'} then, {short(b.get(k)) if k in b else 'absent'}"
                     f" now)" for k in names)


def stale_inputs(run_dir: Path, producers: Mapping[str, Path | Outside]) -> list[str]:
    """Why ``run_dir`` no longer matches what it was built on (``producers``: role -> the run or outside input the
    experiment names for it now): a run finished again since with another identity, or lost its done.json; an
    outside input whose content changed (naming what changed). [] when all are as recorded (or nothing was recorded:
    a run written before minimodel recorded its inputs, or this kind of input)."""
    recorded = recorded_inputs(run_dir)
    problems: list[str] = []
    for name, producer in producers.items():
        old = recorded.get(name)
        if not isinstance(old, dict):
            continue
        if isinstance(producer, Outside):
            now = producer.stamp()
            if now is None:
                if producer.kind == "data":  # not prepared any more: the stage reading it says so
                    continue
                problems.append(f"{run_dir} was built on {producer.what}, which is no longer there")
            elif now["identity"] != old.get("identity"):
                problems.append(f"{run_dir} was built on {producer.what}, which changed since: "
                                f"{_changed_parts(old, now)}")
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


def check_inputs(run_dir: Path, producers: Mapping[str, Path | Outside]) -> None:
    """A ``UserError`` when ``run_dir`` was built on runs or outside inputs that changed since (``stale_inputs``):
    what it holds would not match the model or data it is used with."""
    problems = stale_inputs(run_dir, producers)
    if problems:
        outside = any(isinstance(p, Outside) and p.what in m for m in problems for p in producers.values())
        what = "the model and data it is used with" if outside else "the model it is used with"
        again = "the current inputs" if outside else "the current model"
        restore = "restore what it was built on" if outside else "restore the earlier run"
        raise UserError("; ".join(problems) + f". What {run_dir} holds would not match {what}: delete {run_dir} "
                        f"(and the runs built on it) and rerun to redo it on {again}, or {restore}")


# ------------------------------------------------------------------------------------ a producer, as the consumer expects


def check_producer(cfg: Any, run_dir: Path, consumer: str) -> None:
    """The finished run ``run_dir`` ran with the settings this configuration expects of it (its stage's identity
    keys, from its ``config.yaml``); a ``ConfigError`` naming the keys otherwise. ``consumer`` says who reads it."""
    from minimodel.errors import ConfigError
    from minimodel.store.identity import _PATHS, as_started, stage_changes

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
    saved = as_started(saved, run_dir, done["stage"])
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
