"""CC-100-format corpora: ``{lang}.txt`` or ``{lang}.txt.xz``; one line per sentence/paragraph,
documents separated by empty lines."""

from __future__ import annotations

import io
import lzma
from collections.abc import Iterator
from pathlib import Path

from minimodel.errors import UserError


class CorpusError(UserError, ValueError):
    """A corpus that cannot be used, with a message naming the file."""


def find_corpus(corpus_dir: str | Path, lang: str) -> Path:
    """The corpus file of ``lang`` in ``corpus_dir`` (plain text preferred over xz)."""
    d = Path(corpus_dir)
    for name in (f"{lang}.txt", f"{lang}.txt.xz"):
        if (d / name).is_file():
            return d / name
    raise CorpusError(
        f"no corpus for language '{lang}': expected {d / (lang + '.txt')} or {d / (lang + '.txt.xz')} "
        f"(CC-100 layout; set data.corpus_dir)"
    )


def open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".xz":
        return io.TextIOWrapper(lzma.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def iter_documents(path: str | Path) -> Iterator[list[str]]:
    """Documents as lists of stripped, non-empty lines. Raises CorpusError on unreadable or empty input."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    n_docs = 0
    doc: list[str] = []
    try:
        with open_text(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    doc.append(line)
                elif doc:
                    n_docs += 1
                    yield doc
                    doc = []
            if doc:
                n_docs += 1
                yield doc
    except (lzma.LZMAError, EOFError) as e:
        raise CorpusError(f"corpus {path} is not a readable xz file ({e}); re-download or decompress it") from e
    except OSError as e:
        raise CorpusError(f"cannot read corpus {path}: {e}") from e
    if n_docs == 0:
        raise CorpusError(f"corpus {path} is empty (no non-blank lines)")


def iter_lines(path: str | Path) -> Iterator[str]:
    for doc in iter_documents(path):
        yield from doc
