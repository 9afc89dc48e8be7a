"""CC-100-format corpora: ``{lang}.txt`` or ``{lang}.txt.xz``; UTF-8 text, one line per sentence/paragraph,
documents separated by empty lines."""

from __future__ import annotations

import lzma
import queue
import re
import threading
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
class Undecodable:
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

    def merge(self, other: Undecodable) -> None:
        """Add the counts of a later part of the same corpus (its line numbers are the corpus's)."""
        self.lines += other.lines
        self.replaced += other.replaced
        self.first_line = self.first_line or other.first_line

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


MAX_DOCUMENT_BYTES = 1 << 20
"""A document ends at a blank line, or where a chunk of the corpus is cut for want of one: when no blank line
comes within this many bytes after a chunk's target size, the chunk (and the document running through it) ends
at the next line end. A corpus without blank lines is thus read in bounded pieces (a chunk holds at most its
target size + this + one line), never whole."""

READ_BYTES = 4 << 20  # the corpus is read (and decompressed) in blocks of this size
_BLANK_LINES = (b"\n\n", b"\n\r\n")  # a blank line ("\r\n" files too): where a chunk may end


@dataclass(frozen=True)
class RawChunk:
    """Bytes ``[start, end)`` of a corpus's text (after decompression), ending after a blank line, at a forced
    cut (see ``MAX_DOCUMENT_BYTES``) or at the end of the corpus."""

    index: int
    start: int
    end: int
    data: bytes


class CountingReader:
    """A corpus opened for reading text, with the position in the file on disk (compressed bytes for xz), for
    progress and time estimates.

    An xz corpus is decompressed ahead by a thread (``PREFETCH_BLOCKS`` blocks of ``READ_BYTES``): liblzma
    releases the GIL, so decompression (one core's work, the ceiling of a CC-100 prepare) overlaps with what the
    caller does with the text (cutting it into pieces, handing them to the encoding processes) instead of adding
    to it. ``read`` then returns one block at a time (fewer bytes than asked, as a raw stream may); an empty
    result is the end of the text. Plain text is read directly (it reads at hundreds of MB/s)."""

    PREFETCH_BLOCKS = 4

    def __init__(self, path: Path, prefetch: bool = True) -> None:
        self.path = path
        self.size = path.stat().st_size
        self._raw = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._text: BinaryIO = (lzma.LZMAFile(self._raw) if path.suffix == ".xz"  # type: ignore[assignment]
                                else self._raw)
        self._prefetch = prefetch and path.suffix == ".xz"
        self._blocks: queue.Queue[bytes | BaseException] = queue.Queue(self.PREFETCH_BLOCKS)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._done = False

    def _decompress(self) -> None:
        """The prefetch thread: blocks of text into the queue, then b"" (or the error that ended the reading)."""
        item: bytes | BaseException
        while not self._stop.is_set():
            try:
                item = self._text.read(READ_BYTES)
            except BaseException as e:  # noqa: BLE001 - handed to the reading thread, raised there
                item = e
            while not self._stop.is_set():
                try:
                    self._blocks.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if not isinstance(item, bytes) or not item:
                return

    def read(self, n: int) -> bytes:
        if not self._prefetch:
            return self._text.read(n)
        if self._done:
            return b""
        if self._thread is None:
            self._thread = threading.Thread(target=self._decompress, name=f"xz {self.path.name}", daemon=True)
            self._thread.start()
        item = self._blocks.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = not item
        return item

    def seek(self, offset: int) -> None:
        """Go to byte ``offset`` of the text (before the first read): instant for plain text; xz decompresses up to
        it (no other work)."""
        if self._thread is not None:
            raise RuntimeError("CountingReader.seek after reading started")
        self._text.seek(offset)

    @property
    def position(self) -> int:
        """Bytes of the file on disk consumed so far (for xz: decompressed ahead by up to PREFETCH_BLOCKS blocks)."""
        return self._raw.tell()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._blocks.get_nowait()  # a put waiting for room sees the stop within 0.1 s
                except queue.Empty:
                    pass
                self._thread.join(timeout=0.05)
        self._text.close()
        self._raw.close()

    def __enter__(self) -> CountingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cut(buf: bytearray, target: int, eof: bool) -> int | None:
    """Where the chunk held at the start of ``buf`` ends (exclusive), or None when more text is needed."""
    if len(buf) <= target:
        return len(buf) if eof else None
    found = [i + len(p) for p in _BLANK_LINES
             if 0 <= (i := buf.find(p, target - 1, target + MAX_DOCUMENT_BYTES + len(p)))]
    if found:
        return min(found)
    forced = buf.find(b"\n", target + MAX_DOCUMENT_BYTES)
    if forced >= 0:
        return forced + 1
    if len(buf) < target + MAX_DOCUMENT_BYTES and not eof:
        return None  # a blank line may still come
    return len(buf) if eof else None


def iter_raw_chunks(path: Path, target: int, start: int = 0, first_index: int = 0,
                    reader: CountingReader | None = None) -> Iterator[RawChunk]:
    """The corpus's text from byte ``start`` on, in chunks of about ``target`` bytes each ending after a blank line
    (``_cut``); chunk boundaries depend only on the text from ``start``, so a run resumed at a chunk's end gives
    the same chunks after it."""
    own = reader is None
    reader = reader or CountingReader(path)
    try:
        if start:
            reader.seek(start)
        buf, index, eof = bytearray(), first_index, False
        while True:
            if not eof:
                block = reader.read(READ_BYTES)
                eof = not block
                buf += block
            while buf and (end := _cut(buf, target, eof)) is not None:
                with memoryview(buf) as view:
                    data = bytes(view[:end])  # one copy
                yield RawChunk(index, start, start + end, data)
                del buf[:end]
                index, start = index + 1, start + end
            if eof and not buf:
                return
    except (lzma.LZMAError, EOFError) as e:
        raise CorpusError(f"corpus {path} is not a readable xz file ({e}); re-download or decompress it") from e
    except OSError as e:
        raise CorpusError(f"cannot read corpus {path}: {e}") from e
    finally:
        if own:
            reader.close()


def decoded_lines(data: bytes, undecodable: Undecodable, first_line: int = 1) -> Iterator[str]:
    """Decoded lines of a chunk; ``\\n``, ``\\r\\n`` and a lone ``\\r`` end a line, as in text mode."""
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the chunk ends with a line end
    for number, raw in enumerate(lines, first_line):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = undecodable.replace(raw, number)
        if "\r" in text:
            yield from text.removesuffix("\r").split("\r")
        else:
            yield text


def parse_documents(data: bytes, undecodable: Undecodable, first_line: int = 1) -> list[list[str]]:
    """The documents of a chunk (lists of stripped, non-empty lines; a blank line ends one, and so does the end of
    the chunk)."""
    docs: list[list[str]] = []
    doc: list[str] = []
    for line in decoded_lines(data, undecodable, first_line):
        line = line.strip()
        if line:
            doc.append(line)
        elif doc:
            docs.append(doc)
            doc = []
    if doc:
        docs.append(doc)
    return docs


def iter_documents(path: str | Path, target: int = 4 * READ_BYTES) -> Iterator[list[str]]:
    """Documents as lists of stripped, non-empty lines (read in chunks of about ``target`` bytes: memory stays
    bounded whatever the corpus). Raises CorpusError on unreadable or empty input; warns (once per file) about
    lines that are not UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    n_docs, line_no = 0, 1
    undecodable = Undecodable()
    for chunk in iter_raw_chunks(path, target):
        docs = parse_documents(chunk.data, undecodable, line_no)
        line_no += chunk.data.count(b"\n")
        n_docs += len(docs)
        yield from docs
    if n_docs == 0:
        raise CorpusError(f"corpus {path} is empty (no non-blank lines)")
    undecodable.warn(path)


def iter_lines(path: str | Path) -> Iterator[str]:
    for doc in iter_documents(path):
        yield from doc
