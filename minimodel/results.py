"""The tidy results table of an experiment: one JSON object per line, appended safely.

Row: system, body, task, lang, seed, step (adaptation step; -1 = source-language embeddings),
flops and v100_days (of adaptation up to that step), split, metric, value; pretrain_seed (the system's pretraining
seed, also in its label as ``-ps{seed}`` unless 1; rows written before it existed are of pretraining seed 1).
``seed`` is the finetuning seed."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable
from pathlib import Path

from minimodel.log import get_logger

log = get_logger(__name__)

KEY = ("system", "body", "task", "lang", "seed", "step")
FIELDS = {**dict.fromkeys(("system", "body", "task", "lang", "split", "metric"), str),
          **dict.fromkeys(("seed", "step"), int), **dict.fromkeys(("flops", "v100_days", "value"), float)}
"""Every row's keys and their types (an int is a float too); what the report reads."""


def is_row(r: object) -> bool:
    """A JSON object with every field of ``FIELDS``, of its type."""
    if not isinstance(r, dict):
        return False
    for key, kind in FIELDS.items():
        value = r.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
            return False
    seed = r.get("pretrain_seed", 1)  # optional: rows written before it existed are of pretraining seed 1
    return isinstance(seed, int) and not isinstance(seed, bool)


_WARNED: set[tuple[str, int, int]] = set()


class ResultsTable:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def rows(self) -> list[dict]:
        """Every complete row. A last line cut short by an interruption is ignored (the next append cuts it);
        lines that are not a row (not JSON, not an object with every field of ``FIELDS``) are skipped with one
        warning per file that counts them."""
        if not self.path.exists():
            return []
        out, cut, bad = [], False, 0
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.endswith("\n"):
                    cut = True  # a partial last line: the next append cuts it (see _repair)
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    row = None
                if is_row(row):
                    out.append(row)
                else:
                    bad += 1
        seen = (str(self.path.resolve()), self.path.stat().st_size, bad)
        if bad and seen not in _WARNED:  # (once per process and file: the report reads the results twice)
            _WARNED.add(seen)
            log.warning(f"{self.path}: skipped {bad} line(s) that are not result rows (not JSON, or not an object "
                        f"with {', '.join(FIELDS)})" + (" and a last line cut short" if cut else "")
                        + "; the other rows are used (remove those lines, or rerun `minimodel evaluate` for "
                        "the rows they held)")
        return out

    def keys(self) -> set[tuple]:
        return {tuple(r[k] for k in KEY) for r in self.rows()}

    def _repair(self) -> None:
        """Cut a partial last line (from a killed writer) so that appends start on a fresh line."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)

    def append(self, rows: Iterable[dict]) -> list[dict]:
        """Append the rows (all of one evaluation together) that the file does not hold yet, and make them durable.
        Several processes may append to one file (one evaluation per language, one per GPU): each append holds the
        file's lock, so rows never interleave and a row another process wrote meanwhile is not written twice.
        Returns the rows written."""
        rows = list(rows)
        if not rows:
            return []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+", encoding="utf-8") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                self._repair()
                held = self._held_ids()
                new = [r for r in rows if row_id(r) not in held]
                text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in new)
                if text:
                    f.seek(0, os.SEEK_END)
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                    held.update(row_id(r) for r in new)
                    self._offset = f.tell()
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return new

    def _held_ids(self) -> set[tuple]:
        """The ids of the rows in the file, reading only what was appended since the last call (others may append)."""
        if not hasattr(self, "_held"):
            self._held: set[tuple] = set()
            self._offset = 0
        size = self.path.stat().st_size if self.path.exists() else 0
        if size < self._offset:  # cut by a repair: read again
            self._held, self._offset = set(), 0
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if is_row(row):
                self._held.add(row_id(row))
        self._offset += end
        return self._held


def row_id(r: dict) -> tuple:
    """What one row is a result of: ``KEY`` plus split and metric (a row's value may be written once)."""
    return (*(r.get(k) for k in KEY), r.get("split"), r.get("metric"))
