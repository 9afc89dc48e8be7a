"""The tidy results table of an experiment: one JSON object per line, appended safely.

Row: system, body, task, lang, seed, step (adaptation step; -1 = source-language embeddings),
flops and v100_days (of adaptation up to that step), split, metric, value; pretrain_seed (the system's pretraining
seed, also in its label as ``-ps{seed}`` unless 1; rows written before it existed are of pretraining seed 1).
``seed`` is the finetuning seed."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from minimodel.errors import UserError
from minimodel.log import get_logger
from minimodel.store import atomic

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
        if kind is float and not math.isfinite(value):  # NaN or inf: not a measurement
            return False
    seed = r.get("pretrain_seed", 1)  # optional: rows written before it existed are of pretraining seed 1
    return isinstance(seed, int) and not isinstance(seed, bool)


_WARNED: set[tuple[str, int, int]] = set()


def _whole_row(line: str) -> bool:
    """Whether a last line without its line end is nevertheless a whole result row (a file edited by hand), rather
    than one cut short by an interrupted write."""
    try:
        return is_row(atomic.loads(line))
    except json.JSONDecodeError:
        return False


class ResultsTable:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def rows(self) -> list[dict]:
        """Every complete row. A last line cut short by an interruption is ignored (the next append cuts it);
        lines that are not a row (not JSON, not an object with every field of ``FIELDS``) are skipped with one
        warning per file that counts them."""
        if not self.path.exists():
            return []
        out, cut, bad = [], 0, 0
        first: dict[tuple, tuple[int, dict]] = {}  # row id -> (line number, row): duplicates must agree
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, start=1):
                if not line.endswith("\n") and not _whole_row(line):
                    cut = number  # a partial last line: the next append cuts it (see _repair)
                    break
                if not line.strip():
                    continue
                try:
                    row = atomic.loads(line)
                except json.JSONDecodeError:
                    row = None
                if not is_row(row):
                    bad += 1
                    continue
                rid = row_id(row)
                if rid in first:
                    if first[rid][1] != row:
                        raise UserError(
                            f"{self.path}: lines {first[rid][0]} and {number} are results of the same evaluation "
                            f"({', '.join(f'{k}={v}' for k, v in zip((*KEY, 'split', 'metric'), rid))}) with "
                            f"different contents (value {first[rid][1]['value']} and {row['value']}): remove the "
                            f"wrong one, or both and rerun `minimodel evaluate`")
                    continue  # an identical duplicate: one row
                first[rid] = (number, row)
                out.append(row)
        seen = (str(self.path.resolve()), self.path.stat().st_size, bad)
        if cut and not bad and seen not in _WARNED:
            _WARNED.add(seen)
            log.warning(f"{self.path}, line {cut}: the last line is cut short (an evaluation stopped while writing "
                        f"it, or an edit), so its row is not used; rerun `minimodel evaluate` to write it again (the "
                        f"next evaluation replaces the cut line)")
        if bad and seen not in _WARNED:  # (once per process and file: the report reads the results twice)
            _WARNED.add(seen)
            log.warning(f"{self.path}: skipped {bad} line(s) that are not result rows (not JSON, not an object "
                        f"with {', '.join(FIELDS)}, or a non-finite number)" + (f" and a last line cut short (line {cut})" if cut else "")
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
                if _whole_row(data[data.rfind(b"\n") + 1:].decode("utf-8", errors="replace")):
                    f.write(b"\n")  # a whole row without its line end (an edit): kept
                else:
                    f.truncate(data.rfind(b"\n") + 1)

    def remove(self, rows: Iterable[dict]) -> int:
        """Remove these rows (equal in every field) from the file, rewriting it whole (atomically) under the
        append lock; returns how many lines went."""
        gone = [json.dumps(r, sort_keys=True) for r in rows]
        if not gone or not self.path.exists():
            return 0
        with self._locked() as f:
            self._repair()
            f.seek(0)
            kept, removed = [], 0
            for line in f.read().splitlines(keepends=True):
                try:
                    same = json.dumps(atomic.loads(line), sort_keys=True) in gone
                except ValueError:
                    same = False
                if same:
                    removed += 1
                else:
                    kept.append(line)
            if removed:
                atomic.write_text(self.path, "".join(kept))  # a new file: a waiting appender sees it (_locked)
                self._held, self._offset = set(), 0
        return removed

    @contextlib.contextmanager
    def _locked(self) -> Iterator[IO[str]]:
        """The results file, open for appending under its exclusive lock. A process that waited for the lock
        while ``remove`` replaced the file locks the new one instead (its lock was on the old one)."""
        atomic.make_dirs(self.path.parent)
        while True:
            f = open(self.path, "a+", encoding="utf-8")
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            if self.path.exists() and os.fstat(f.fileno()).st_ino == os.stat(self.path).st_ino:
                break
            f.close()
        try:
            inode = os.fstat(f.fileno()).st_ino
            if getattr(self, "_inode", None) != inode:  # a file replaced since the last read: read it again
                self._held, self._offset, self._inode = set(), 0, inode
            yield f
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            f.close()

    def append(self, rows: Iterable[dict]) -> list[dict]:
        """Append the rows (all of one evaluation together) that the file does not hold yet, and make them durable.
        Several processes may append to one file (one evaluation per language, one per GPU): each append holds the
        file's lock, so rows never interleave and a row another process wrote meanwhile is not written twice.
        Returns the rows written."""
        rows = list(rows)
        if not rows:
            return []
        for r in rows:
            bad = {k: r.get(k) for k, kind in FIELDS.items() if kind is float and isinstance(r.get(k), float)
                   and not math.isfinite(r[k])}
            if bad:
                raise UserError(f"{self.path}: refusing to write a result row with {', '.join(f'{k}={v}' for k, v in bad.items())} "
                                f"({', '.join(f'{k}={r.get(k)}' for k in (*KEY, 'split', 'metric'))}): a non-finite "
                                f"score is not a measurement (a diverged model or a broken evaluation); nothing of "
                                f"this evaluation was written")
        with self._locked() as f:
            self._repair()
            held = self._held_ids()
            new = [r for r in rows if row_id(r) not in held]
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in new)
            if text:
                f.flush()
                self._offset = atomic.append_fd(f.fileno(), text.encode("utf-8"), self.path)  # whole rows or none
                held.update(row_id(r) for r in new)
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
                row = atomic.loads(line)
            except ValueError:
                continue
            if is_row(row):
                self._held.add(row_id(row))
        self._offset += end
        return self._held


def row_id(r: dict) -> tuple:
    """What one row is a result of: ``KEY`` plus split and metric (a row's value may be written once)."""
    return (*(r.get(k) for k in KEY), r.get("split"), r.get("metric"))
