"""How much of a task's evaluation text is in an adaptation corpus, verbatim: a test set that step 2 has read is not a
zero-shot test. For each dev/test file of a local task, the share of examples whose text (each text field, spaces
collapsed, at least --min-chars characters) occurs verbatim in the language's corpus.

    .venv/bin/python scripts/check_overlap.py data/mytask data/demo/corpus [--fields passage] [--min-chars 40]

The corpus of language L is CORPUS/L.txt or CORPUS/L.txt.xz; the task's files are dev.L / test.L (.jsonl, .json,
.csv, .tsv, .parquet). Exit 0 always; the figures are for you to judge (docs/own-task.md, "Overlap with the
adaptation text")."""

from __future__ import annotations

import argparse
import lzma
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minimodel.data.task_files import read_records  # noqa: E402

SPACE = re.compile(r"\s+")


def norm(text: str) -> str:
    return SPACE.sub(" ", text).strip()


def corpus_text(corpus: Path, lang: str) -> str | None:
    for path in (corpus / f"{lang}.txt", corpus / f"{lang}.txt.xz"):
        if path.is_file():
            opener = lzma.open if path.suffix == ".xz" else open
            with opener(path, "rt", encoding="utf-8") as f:
                return norm(f.read())
    return None


def overlap(task: Path, corpus: Path, fields: list[str], min_chars: int) -> list[tuple[str, int, int]]:
    """``(file, examples whose text is in the corpus, examples checked)`` for each dev/test file of ``task``."""
    out = []
    for path in sorted(p for p in task.iterdir() if re.match(r"(dev|test)\.[A-Za-z_-]+\.(jsonl|json|csv|tsv|parquet)$", p.name)):
        lang = path.name.split(".")[1]
        text = corpus_text(corpus, lang)
        if text is None:
            continue
        seen = checked = 0
        for _, record in read_records(path):
            parts = [norm(str(record.get(f, ""))) for f in fields]
            parts = [p for p in parts if len(p) >= min_chars]
            if not parts:
                continue
            checked += 1
            seen += any(p in text for p in parts)
        out.append((path.name, seen, checked))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", type=Path)
    p.add_argument("corpus", type=Path)
    p.add_argument("--fields", nargs="+", default=["text"])
    p.add_argument("--min-chars", type=int, default=40)
    args = p.parse_args()
    rows = overlap(args.task, args.corpus, args.fields, args.min_chars)
    if not rows:
        print(f"no dev.L / test.L file of {args.task} has a corpus {args.corpus}/L.txt[.xz]")
    for name, seen, checked in rows:
        share = 100.0 * seen / checked if checked else 0.0
        print(f"{name}: {seen:,} of {checked:,} examples ({share:.1f}%) have a text field found verbatim in the corpus")


if __name__ == "__main__":
    main()
