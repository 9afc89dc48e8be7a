"""The tidy results table of an experiment: one JSON object per line, appended safely.

Row: system, body, task, lang, seed, step (adaptation step; -1 = source-language embeddings),
flops and v100_days (of adaptation up to that step), split, metric, value."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

KEY = ("system", "body", "task", "lang", "seed", "step")


class ResultsTable:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def rows(self) -> list[dict]:
        """Every complete row; a line cut short by an interruption is ignored."""
        if not self.path.exists():
            return []
        out = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # a partial last line
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
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

    def append(self, rows: Iterable[dict]) -> None:
        """Append rows (all of one evaluation together) and make them durable."""
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        if not text:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
