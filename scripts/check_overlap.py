"""How much of a task's evaluation text is in an adaptation corpus, verbatim: a test set that step 2 has read is not a
zero-shot test. For each dev/test file of a local task, the share of examples whose text (each text field, spaces
collapsed, at least --min-chars characters) occurs verbatim in the language's corpus.

    .venv/bin/python scripts/check_overlap.py data/mytask data/demo/corpus [--fields passage] [--min-chars 40]

The corpus of language L is CORPUS/L.txt or CORPUS/L.txt.xz; the task's files are dev.L / test.L (.jsonl, .json,
.csv, .tsv, .parquet). Exit 0 with the figures, which are for you to judge (docs/own-task.md, "Overlap with the
adaptation text"); exit 2 with one line ``error: ...`` naming the path, file, line or option at fault for bad input (a
missing directory, a file that is not UTF-8 or not readable, a malformed record, a field no record of a file has,
--min-chars below 1)."""

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
from minimodel.errors import UserError  # noqa: E402

SPACE = re.compile(r"\s+")


def norm(text: str) -> str:
    return SPACE.sub(" ", text).strip()


class OverlapError(UserError):
    """Bad input to this script, naming the path or option at fault."""


def corpus_text(corpus: Path, lang: str) -> str | None:
    for path in (corpus / f"{lang}.txt", corpus / f"{lang}.txt.xz"):
        if path.is_file():
            opener = lzma.open if path.suffix == ".xz" else open
            try:
                with opener(path, "rt", encoding="utf-8") as f:
                    return norm(f.read())
            except UnicodeDecodeError as e:
                raise OverlapError(f"corpus {path} is not UTF-8 (byte 0x{e.object[e.start]:02x} at offset "
                                   f"{e.start:,} of its text): convert it (e.g. iconv -f latin1 -t utf-8)") from e
            except (OSError, EOFError, lzma.LZMAError) as e:
                raise OverlapError(f"corpus {path} cannot be read: {e}") from e
    return None


def overlap(task: Path, corpus: Path, fields: list[str], min_chars: int) -> list[tuple[str, int, int]]:
    """``(file, examples whose text is in the corpus, examples checked)`` for each dev/test file of ``task``."""
    if min_chars < 1:
        raise OverlapError(f"--min-chars {min_chars}: give at least 1 (an empty text is in every corpus, which would "
                           f"count every example as seen)")
    for what, path in (("task directory", task), ("corpus directory", corpus)):
        if not path.is_dir():
            raise OverlapError(f"{what} {path} {'is not a directory' if path.exists() else 'does not exist'}")
    out = []
    for path in sorted(p for p in task.iterdir() if re.match(r"(dev|test)\.[A-Za-z_-]+\.(jsonl|json|csv|tsv|parquet)$", p.name)):
        lang = path.name.split(".")[1]
        text = corpus_text(corpus, lang)
        if text is None:
            continue
        seen = checked = 0
        found: set[str] = set()  # the fields the file's records have
        for _, record in read_records(path):
            found.update(record)
            parts = [norm(str(record.get(f, ""))) for f in fields]
            parts = [p for p in parts if len(p) >= min_chars]
            if not parts:
                continue
            checked += 1
            seen += any(p in text for p in parts)
        missing = [f for f in fields if f not in found]
        if missing:
            raise OverlapError(f"{path}: no record has the field(s) {missing} (--fields); its records have "
                               f"{sorted(found)}")
        out.append((path.name, seen, checked))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", type=Path)
    p.add_argument("corpus", type=Path)
    p.add_argument("--fields", nargs="+", default=["text"])
    p.add_argument("--min-chars", type=int, default=40)
    args = p.parse_args(argv)
    try:
        rows = overlap(args.task, args.corpus, args.fields, args.min_chars)
    except (UserError, OSError) as e:  # a task file's problems are TaskDataErrors naming file and line
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"no dev.L / test.L file of {args.task} has a corpus {args.corpus}/L.txt[.xz]")
    for name, seen, checked in rows:
        share = 100.0 * seen / checked if checked else 0.0
        print(f"{name}: {seen:,} of {checked:,} examples ({share:.1f}%) have a text field found verbatim in the corpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
