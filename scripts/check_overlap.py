"""How much of a task's evaluation text is in an adaptation corpus, verbatim: a test set that step 2 has read is not a
zero-shot test. For each dev/test file of a local task, the share of examples whose text (each text field, spaces
collapsed, at least --min-chars characters) occurs verbatim in the language's corpus, then each such example: its
place in the file, its id (--id-field, when the records have one) and the corpus lines that hold its text. With
--write-clean OUT, a copy of the task folder in OUT (a new directory: an existing one is never overwritten) whose
dev/test files lack those examples, every other file copied as it is.

    .venv/bin/python scripts/check_overlap.py data/mytask data/demo/corpus [--fields passage] [--min-chars 40]
    .venv/bin/python scripts/check_overlap.py data/mytask data/demo/corpus --write-clean data/mytask-clean

The corpus of language L is CORPUS/L.txt or CORPUS/L.txt.xz; the task's files are dev.L / test.L (.jsonl, .json,
.csv, .tsv, .parquet). Exit 0 with the figures, which are for you to judge (docs/own-task.md, "Overlap with the
adaptation text"); exit 2 with one line ``error: ...`` naming the path, file, line or option at fault for bad input (a
missing directory, a file that is not UTF-8 or not readable, a malformed record, a field no record of a file has,
--min-chars below 1) or when --write-clean's OUT exists."""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import lzma
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minimodel.data.task_files import read_records  # noqa: E402
from minimodel.errors import UserError  # noqa: E402

SPACE = re.compile(r"\s+")
EVAL_FILE = re.compile(r"(dev|test)\.[A-Za-z_-]+\.(jsonl|json|csv|tsv|parquet)$")
SHOWN = 80  # characters of an example's text shown beside its corpus lines


def norm(text: str) -> str:
    return SPACE.sub(" ", text).strip()


class OverlapError(UserError):
    """Bad input to this script, naming the path or option at fault."""


@dataclass(frozen=True)
class Corpus:
    """A language's corpus, spaces collapsed (``norm`` of the whole file: its lines joined by one space), with where
    each of its non-blank lines starts in that text, to name the lines a match spans."""

    name: str
    text: str
    starts: list[int]  # offset in ``text`` of each non-blank line
    numbers: list[int]  # its line number in the file (1-based)

    def lines(self, start: int, length: int) -> tuple[int, int]:
        """The first and last line (file numbering) of ``text[start:start + length]``."""
        first = bisect.bisect_right(self.starts, start) - 1
        last = bisect.bisect_right(self.starts, start + max(length, 1) - 1) - 1
        return self.numbers[first], self.numbers[last]


def read_corpus(corpus: Path, lang: str) -> Corpus | None:
    for path in (corpus / f"{lang}.txt", corpus / f"{lang}.txt.xz"):
        if path.is_file():
            opener = lzma.open if path.suffix == ".xz" else open
            try:  # read whole, so that a decoding error's offset is the offset in the file's text
                with opener(path, "rt", encoding="utf-8") as f:
                    raw = f.read()
            except UnicodeDecodeError as e:
                raise OverlapError(f"corpus {path} is not UTF-8 (byte 0x{e.object[e.start]:02x} at offset "
                                   f"{e.start:,} of its text): convert it (e.g. iconv -f latin1 -t utf-8)") from e
            except (OSError, EOFError, lzma.LZMAError) as e:
                raise OverlapError(f"corpus {path} cannot be read: {e}") from e
            parts, starts, numbers, offset = [], [], [], 0
            for n, line in enumerate(raw.split("\n"), 1):  # the lines as iterating the file numbers them
                line = norm(line)
                if line:
                    parts.append(line)
                    starts.append(offset)
                    numbers.append(n)
                    offset += len(line) + 1
            return Corpus(path.name, " ".join(parts), starts, numbers)
    return None


def corpus_text(corpus: Path, lang: str) -> str | None:
    found = read_corpus(corpus, lang)
    return None if found is None else found.text


@dataclass(frozen=True)
class Found:
    """One example of a dev/test file whose text is in the corpus."""

    file: str
    where: str  # its place in the file: "line 3", "record 2", "row 5"
    id: str  # its --id-field value ("" without one)
    corpus: str  # the corpus file
    lines: tuple[int, int]  # the corpus lines holding the text (first, last)
    text: str  # the text found, spaces collapsed

    def describe(self) -> str:
        ident = f" (id {self.id})" if self.id else ""
        first, last = self.lines
        span = f"line {first}" if first == last else f"lines {first}-{last}"
        shown = self.text if len(self.text) <= SHOWN else self.text[:SHOWN - 1] + "…"
        return f"{self.file} {self.where}{ident}: {self.corpus} {span}: {json.dumps(shown, ensure_ascii=False)}"


def eval_files(task: Path) -> list[Path]:
    return sorted(p for p in task.iterdir() if EVAL_FILE.match(p.name))


def find_overlaps(task: Path, corpus: Path, fields: list[str], min_chars: int, id_field: str = "id"
                  ) -> list[tuple[str, list[Found], int]]:
    """``(file, the examples whose text is in the corpus, examples checked)`` for each dev/test file of ``task``
    with a corpus. Raises OverlapError (or a TaskDataError naming file and line) for bad input."""
    if min_chars < 1:
        raise OverlapError(f"--min-chars {min_chars}: give at least 1 (an empty text is in every corpus, which would "
                           f"count every example as seen)")
    for what, path in (("task directory", task), ("corpus directory", corpus)):
        if not path.is_dir():
            raise OverlapError(f"{what} {path} {'is not a directory' if path.exists() else 'does not exist'}")
    out = []
    for path in eval_files(task):
        lang = path.name.split(".")[1]
        text = read_corpus(corpus, lang)
        if text is None:
            continue
        found, checked = [], 0
        has: set[str] = set()  # the fields the file's records have
        for where, record in read_records(path):
            has.update(record)
            parts = [norm(str(record.get(f, ""))) for f in fields]
            parts = [p for p in parts if len(p) >= min_chars]
            if not parts:
                continue
            checked += 1
            for part in parts:
                at = text.text.find(part)
                if at >= 0:
                    found.append(Found(path.name, where, str(record.get(id_field, "")), text.name,
                                       text.lines(at, len(part)), part))
                    break
        missing = [f for f in fields if f not in has]
        if missing:
            raise OverlapError(f"{path}: no record has the field(s) {missing} (--fields); its records have "
                               f"{sorted(has)}")
        out.append((path.name, found, checked))
    return out


def overlap(task: Path, corpus: Path, fields: list[str], min_chars: int) -> list[tuple[str, int, int]]:
    """``(file, examples whose text is in the corpus, examples checked)`` for each dev/test file of ``task``."""
    return [(name, len(found), checked) for name, found, checked in find_overlaps(task, corpus, fields, min_chars)]


def write_clean(task: Path, out: Path, found: list[Found]) -> dict[str, int]:
    """A copy of ``task`` in ``out`` (a new directory, never an existing one) whose dev/test files lack the ``found``
    examples; the other files copied as they are. Returns file -> examples kept. A .jsonl file keeps its other lines
    byte for byte; .csv/.tsv are written again with their header and delimiter, .json as a list, .parquet by
    pyarrow."""
    if out.exists():
        raise FileExistsError(f"{out} exists: --write-clean writes a new directory, never over an existing one")
    drop: dict[str, set[str]] = {}
    for f in found:
        drop.setdefault(f.file, set()).add(f.where)
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(task, tmp)
    kept = {}
    for name, where in drop.items():
        src, dst = task / name, tmp / name
        records = [(w, r) for w, r in read_records(src) if w not in where]
        kept[name] = len(records)
        ext = src.suffix.lstrip(".")
        if ext == "jsonl":
            with open(src, encoding="utf-8-sig") as f:
                lines = [line for n, line in enumerate(f, 1) if f"line {n}" not in where]
            dst.write_text("".join(lines), encoding="utf-8")
        elif ext in ("csv", "tsv"):
            with open(src, encoding="utf-8-sig", newline="") as f:
                header = csv.DictReader(f, delimiter="\t" if ext == "tsv" else ",").fieldnames or []
            with open(dst, "w", encoding="utf-8", newline="") as f:
                writer = csv.DictWriter(f, header, delimiter="\t" if ext == "tsv" else ",")
                writer.writeheader()
                writer.writerows(r for _, r in records)
        elif ext == "json":
            dst.write_text(json.dumps([r for _, r in records], ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist([r for _, r in records], schema=pq.read_schema(src)), dst)
    tmp.rename(out)
    return kept


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", type=Path)
    p.add_argument("corpus", type=Path)
    p.add_argument("--fields", nargs="+", default=["text"])
    p.add_argument("--min-chars", type=int, default=40)
    p.add_argument("--id-field", default="id", help="the records' id field, named beside each example (default: id)")
    p.add_argument("--write-clean", type=Path, metavar="OUT",
                   help="write a copy of the task folder to OUT (new) without the overlapping examples")
    args = p.parse_args(argv)
    if args.write_clean is not None and args.write_clean.exists():
        print(f"error: {args.write_clean} exists: --write-clean writes a new directory, never over an existing one",
              file=sys.stderr)
        return 2
    try:
        rows = find_overlaps(args.task, args.corpus, args.fields, args.min_chars, args.id_field)
    except (UserError, OSError) as e:  # a task file's problems are TaskDataErrors naming file and line
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not rows:  # nothing compared: not "no overlap"
        files = [p.name for p in eval_files(args.task)]
        print(f"error: no dev.L / test.L file of {args.task} ({files or 'none'}) has a corpus of its language "
              f"{args.corpus}/L.txt[.xz] (there: {sorted(p.name for p in args.corpus.iterdir())}): nothing was "
              f"compared", file=sys.stderr)
        return 2
    if not any(checked for _, _, checked in rows):
        print(f"error: no example of {', '.join(name for name, _, _ in rows)} has a text of at least "
              f"{args.min_chars:,} characters in {args.fields} (--min-chars): nothing was compared; give a smaller "
              f"--min-chars", file=sys.stderr)
        return 2
    for name, found, checked in rows:
        if not checked:
            print(f"{name}: no example has a text of at least {args.min_chars:,} characters (--min-chars): none "
                  f"compared")
            continue
        print(f"{name}: {len(found):,} of {checked:,} examples ({100.0 * len(found) / checked:.1f}%) have a text "
              f"field found verbatim in the corpus")
        for f in found:
            print(f"  {f.describe()}")
    if args.write_clean is not None:
        found_all = [f for _, found, _ in rows for f in found]
        try:
            kept = write_clean(args.task, args.write_clean, found_all)
        except OSError as e:
            print(f"error: --write-clean {args.write_clean}: {e}", file=sys.stderr)
            return 2
        changed = ", ".join(f"{name} ({n:,} kept)" for name, n in sorted(kept.items())) or "none"
        print(f"wrote {args.write_clean}: the task without the {len(found_all):,} examples above; files changed: "
              f"{changed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
