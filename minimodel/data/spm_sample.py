"""The sample of a corpus that SentencePiece trains on: at most ``data.spm_max_sentences`` lines, reservoir-sampled
from at most ``data.spm_sample_bytes`` of text (windows spread over a larger plain corpus), and saved
(``SAMPLE_FILE``, beside the tokenizer) so that a rerun of a stopped `minimodel prepare` trains on the same lines."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

from minimodel.data.corpus import CorpusError, Undecodable, decoded_lines, iter_raw_chunks
from minimodel.log import get_logger
from minimodel.store import atomic

log = get_logger(__name__)

MAX_SENTENCE_BYTES = 1 << 16  # SentencePiece's max_sentence_length: training skips longer lines


SAMPLE_WINDOWS = 1024  # a plain corpus larger than data.spm_sample_bytes is sampled in this many windows at most
MIN_WINDOW_BYTES = 1 << 20
SAMPLE_FILE = "spm_sample.txt"


def sample_windows(size: int, budget: int) -> list[tuple[int, int]]:
    """Byte ranges of a plain corpus of ``size`` bytes to draw the tokenizer's sample from: the whole file when it
    is at most ``budget``, else windows of equal size, ``budget`` bytes in all, spread evenly from start to end."""
    if size <= budget:
        return [(0, size)]
    k = max(1, min(SAMPLE_WINDOWS, budget // MIN_WINDOW_BYTES))
    width = budget // k
    step = (size - width) / (k - 1) if k > 1 else 0.0
    return [(round(i * step), round(i * step) + width) for i in range(k)]


def _window_texts(corpus: Path, budget: int, stop: Callable[[], str | None]) -> Iterator[bytes]:
    """The text to sample from, in pieces that end at line ends (whole lines only)."""
    size = corpus.stat().st_size
    if corpus.suffix == ".xz" or size <= budget:
        read = 0
        for chunk in iter_raw_chunks(corpus, 32 << 20):
            if stop() or read >= budget:
                return
            data = chunk.data
            if read + len(data) > budget:  # the budget ends inside this chunk: up to the last whole line within it
                data = data[:budget - read]
                data = data[:data.rfind(b"\n") + 1]
                read = budget
            else:
                read += len(data)
            yield data
        return
    with open(corpus, "rb") as f:
        for start, end in sample_windows(size, budget):
            if stop():
                return
            f.seek(start)
            data = f.read(end - start)
            if start:  # a window starts at the beginning of its first whole line
                data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
            yield data + f.readline()  # and ends at the end of its last


def _sample_lines(corpus: Path, max_sentences: int, seed: int, budget: int = 2**62,
                  stop: Callable[[], str | None] = lambda: None) -> list[str] | None:
    """Reservoir-sample at most ``max_sentences`` lines among those SentencePiece trains on (at most
    ``MAX_SENTENCE_BYTES``), from at most ``budget`` bytes of text (``sample_windows``; the whole corpus, in order,
    when it is no larger). Warns about the longer lines, fails if no line is left; None when ``stop()`` asked."""
    rng = random.Random(seed)
    reservoir: list[str] = []
    n_long = i = 0
    undecodable = Undecodable()
    for data in _window_texts(corpus, budget, stop):
        for line in decoded_lines(data, undecodable):
            line = line.strip()
            if not line:
                continue
            if len(line) * 4 > MAX_SENTENCE_BYTES and len(line.encode("utf-8")) > MAX_SENTENCE_BYTES:
                n_long += 1
                continue
            if i < max_sentences:
                reservoir.append(line)
            else:
                j = rng.randint(0, i)
                if j < max_sentences:
                    reservoir[j] = line
            i += 1
    if stop():
        return None
    if not reservoir and not n_long:
        raise CorpusError(f"corpus {corpus} is empty (no non-blank lines)")
    if n_long and not reservoir:
        raise CorpusError(f"corpus {corpus} has no line to train the tokenizer on: SentencePiece skips lines over "
                          f"{MAX_SENTENCE_BYTES:,} bytes (its max_sentence_length) and every line here ({n_long:,}) "
                          f"is longer; put one sentence or paragraph per line")
    if n_long:
        log.warning(f"corpus {corpus}: {n_long:,} line(s) over {MAX_SENTENCE_BYTES:,} bytes (SentencePiece's "
                    f"max_sentence_length) are skipped in tokenizer training (they are still encoded); "
                    f"a corpus holds one sentence or paragraph per line")
    return reservoir


def _sample_key(corpus: Path, max_sentences: int, budget: int, seed: int) -> dict:
    return {"corpus": corpus.name, "corpus_bytes": corpus.stat().st_size, "max_sentences": max_sentences,
            "sample_bytes": budget, "seed": seed}


def _read_sample(path: Path, key: dict) -> list[str] | None:
    """The saved sample at ``path`` when it was drawn with ``key``'s settings, else None."""
    try:
        with open(path, encoding="utf-8") as f:
            header = atomic.loads(f.readline().removeprefix(_SAMPLE_HEADER))
            if header.get("key") != key:
                return None
            lines = f.read().split("\n")
    except (OSError, ValueError, AttributeError):
        return None
    lines = lines[:-1] if lines and lines[-1] == "" else lines
    return lines if len(lines) == header.get("lines") else None


_SAMPLE_HEADER = "#minimodel-tokenizer-sample "


def _amount(n: int) -> str:
    """Bytes for the log: 2.1 GB, 1.0 MB, 900 kB."""
    return next(f"{n / d:.1f} {u}" for d, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "bytes")) if n >= d or d == 1)


def tokenizer_sample(corpus: Path, sample_path: Path, max_sentences: int, budget: int, seed: int = 1,
                     stop: Callable[[], str | None] = lambda: None) -> list[str] | None:
    """The lines to train the tokenizer on: those saved in ``sample_path`` by an earlier run with the same
    settings, or a new sample (``_sample_lines``), saved there before training. None when ``stop()`` asked."""
    key = _sample_key(corpus, max_sentences, budget, seed)
    lines = _read_sample(sample_path, key)
    if lines is not None:
        log.info(f"tokenizer sample: {len(lines):,} lines from {sample_path} (drawn by an earlier run)")
        return lines
    size = corpus.stat().st_size
    if corpus.suffix == ".xz" and size > budget // 8:  # (xz holds about 4-8 bytes of text per byte)
        how = (f"from the first {_amount(budget)} of text at most (an xz file cannot be read from an offset "
               f"without decompressing up to it; decompress the corpus to sample windows spread over all of it)")
    elif size > budget:
        how = f"from {_amount(budget)} read in {len(sample_windows(size, budget))} windows spread over the file"
    else:
        how = "from the whole corpus"
    log.info(f"tokenizer sample: drawing at most {max_sentences:,} lines of {corpus} {how}")
    lines = _sample_lines(corpus, max_sentences, seed, budget, stop)
    if lines is None:
        return None
    header = json.dumps({"key": key, "lines": len(lines)})
    atomic.write_text(sample_path, _SAMPLE_HEADER + header + "\n" + "".join(line + "\n" for line in lines))
    return lines
