"""CC-100-format corpora: ``{lang}.txt`` or ``{lang}.txt.xz``; UTF-8 text, one line per sentence/paragraph,
documents separated by empty lines."""

from __future__ import annotations

import lzma
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from minimodel.errors import UserError
from minimodel.log import get_logger

log = get_logger(__name__)

TEXT_CHECK_BYTES = 1 << 20  # check_text reads this much of a corpus
MAX_NOT_TEXT = 0.2  # a corpus with more than this fraction of characters that are not text is refused
_NOT_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffd]")  # control characters (not tab/newline), U+FFFD
_REPLACEMENT = "\ufffd".encode()
_warned: set[tuple[str, int, int]] = set()  # (path, size, mtime) of corpora already warned about


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


def open_binary(path: Path) -> BinaryIO:
    return lzma.open(path, "rb") if path.suffix == ".xz" else open(path, "rb")  # type: ignore[return-value]


def check_text(path: str | Path) -> None:
    """Raise CorpusError when the start of ``path`` is mostly not UTF-8 text (binary data, UTF-16, gzip, ...)."""
    path = Path(path)
    try:
        with open_binary(path) as f:
            head = f.read(TEXT_CHECK_BYTES).decode("utf-8", errors="replace")
    except (lzma.LZMAError, EOFError) as e:
        raise CorpusError(f"corpus {path} is not a readable xz file ({e}); re-download or decompress it") from e
    except OSError as e:
        raise CorpusError(f"cannot read corpus {path}: {e}") from e
    bad = len(_NOT_TEXT.findall(head))
    if head and bad / len(head) > MAX_NOT_TEXT:
        raise CorpusError(
            f"corpus {path} is not text: {bad / len(head):.0%} of its first {len(head):,} characters are NUL/control "
            f"bytes or invalid UTF-8; a corpus is UTF-8 text, one sentence or paragraph per line (a UTF-16, gzip or "
            f"other binary file must be converted; only .xz is decompressed)"
        )


@dataclass
class _Undecodable:
    """Lines of a corpus that are not valid UTF-8 (their bad bytes become U+FFFD)."""

    lines: int = 0
    replaced: int = 0
    first_line: int = 0

    def replace(self, raw: bytes, number: int) -> str:
        """``raw`` (not UTF-8) decoded with its bad bytes replaced by U+FFFD, counted."""
        text = raw.decode("utf-8", errors="replace")
        self.lines += 1
        self.replaced += text.count("\ufffd") - raw.count(_REPLACEMENT)
        self.first_line = self.first_line or number
        return text

    def warn(self, path: Path) -> None:
        """Warn once per corpus file (prepare reads it twice: tokenizer training, then encoding)."""
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if self.lines and key not in _warned:
            _warned.add(key)
            log.warning(f"corpus {path} is not all UTF-8: {self.lines:,} line(s) hold invalid bytes "
                        f"({self.replaced:,} invalid byte sequences replaced by U+FFFD), the first at line "
                        f"{self.first_line}; convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8) to keep "
                        f"those characters")


def _lines(f: BinaryIO, undecodable: _Undecodable) -> Iterator[str]:
    """Decoded lines; ``\\n``, ``\\r\\n`` and a lone ``\\r`` end a line, as in text mode (a line may keep
    its ``\\n``: callers strip)."""
    for number, raw in enumerate(f, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = undecodable.replace(raw, number)
        if "\r" in text:
            yield from (text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")).split("\r")
        else:
            yield text


def iter_documents(path: str | Path) -> Iterator[list[str]]:
    """Documents as lists of stripped, non-empty lines. Raises CorpusError on unreadable or empty input;
    warns (once per file) about lines that are not UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    n_docs = 0
    doc: list[str] = []
    undecodable = _Undecodable()
    try:
        with open_binary(path) as f:
            for line in _lines(f, undecodable):
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
    undecodable.warn(path)


def iter_lines(path: str | Path) -> Iterator[str]:
    for doc in iter_documents(path):
        yield from doc
