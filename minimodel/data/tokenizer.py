"""Tokenizers: a SentencePiece model per language (trained by `minimodel prepare`), and, for the
source language only, a Hugging Face tokenizer when the primary model is a public checkpoint
(``data.source_tokenizer``, e.g. MiniPost from ``roberta-base`` or ``xlm-roberta-base``).

Both kinds offer the same small interface: ``encode``, ``encode_one``, ``encode_with_offsets``,
``decode``, ``vocab_size``, ``sha256`` (the identity checked wherever embeddings meet a tokenizer),
``specials`` (the ids of ``<s> <pad> </s> <unk> <mask>``) and ``surface_pieces()`` (every piece in
SentencePiece spelling, so that vocabularies of different conventions can be compared for the
overlap initialisation of footnote 1).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import sentencepiece as spm

from minimodel import atomic
from minimodel.data.corpus import CorpusError, Undecodable, decoded_lines, iter_raw_chunks
from minimodel.errors import UserError
from minimodel.log import get_logger

# fairseq / RoBERTa order for the first four; <mask> right after them.
BOS, PAD, EOS, UNK, MASK = 0, 1, 2, 3, 4
SPECIALS = {"<s>": BOS, "<pad>": PAD, "</s>": EOS, "<unk>": UNK, "<mask>": MASK}
WORD_START = "\u2581"  # SentencePiece's "▁": the piece starts a new word

log = get_logger(__name__)


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens. ``ids`` (these plus any other special token of the tokenizer) are
    never masked and never drawn as random replacements."""

    bos: int = BOS
    pad: int = PAD
    eos: int = EOS
    unk: int = UNK
    mask: int = MASK
    others: tuple[int, ...] = ()

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(sorted({self.bos, self.pad, self.eos, self.unk, self.mask, *self.others}))


SENTENCEPIECE_SPECIALS = SpecialTokens()


class TokenizerError(UserError, ValueError):
    """A tokenizer that cannot be used here, with a message naming the file."""


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class AnyTokenizer(Protocol):
    """What the stages need from a tokenizer (``Tokenizer`` and ``HFTokenizer``)."""

    path: Any
    sha256: str
    specials: SpecialTokens

    @property
    def vocab_size(self) -> int: ...
    def encode(self, texts: list[str], threads: int = 1) -> list[list[int]]: ...
    def encode_one(self, text: str) -> list[int]: ...
    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...
    def decode(self, ids: Iterable[int]) -> str: ...
    def surface_pieces(self) -> list[str | None]: ...


class Tokenizer:
    """A SentencePiece model whose special ids match ``SPECIALS``."""

    specials = SENTENCEPIECE_SPECIALS

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise TokenizerError(f"tokenizer not found: {self.path} (run `minimodel prepare` first)")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except Exception as e:  # sentencepiece raises OSError/RuntimeError on corrupt files
            raise TokenizerError(f"{self.path} is not a readable SentencePiece model: {e}") from e
        for piece, expected in SPECIALS.items():
            got = self.sp.piece_to_id(piece)
            if got != expected:
                raise TokenizerError(f"{self.path}: special token {piece} has id {got}, expected {expected}")
        self.sha256 = file_sha256(self.path)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        return self.sp.encode(texts, num_threads=threads)

    def encode_one(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` and each token's ``(start, end)`` character span in ``text``, without
        the leading whitespace SentencePiece folds into a piece (a bare "▁" gets an empty span)."""
        from sentencepiece import sentencepiece_pb2

        proto = sentencepiece_pb2.SentencePieceText()
        proto.ParseFromString(self.sp.encode(text, out_type="serialized_proto"))
        # SentencePiece reports UTF-8 byte offsets into the original text
        char_at = [i for i, ch in enumerate(text) for _ in ch.encode("utf-8")] + [len(text)]
        ids, offsets = [], []
        for piece in proto.pieces:
            start, end = char_at[piece.begin], char_at[piece.end]
            ids.append(piece.id)
            offsets.append((_skip_space(text, start, end), end))
        return ids, offsets

    def pieces(self) -> list[str]:
        return [self.sp.id_to_piece(i) for i in range(self.vocab_size)]

    def surface_pieces(self) -> list[str | None]:
        return self.pieces()


def _skip_space(text: str, start: int, end: int) -> int:
    surface = text[start:end]
    return start + len(surface) - len(surface.lstrip())


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (byte-level BPE vocabularies are
    written in it: a space is "Ġ", "ä" is "Ã¤")."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


_BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


def byte_level_surface(piece: str) -> str | None:
    """A byte-level BPE piece in SentencePiece spelling ("Ġthe" -> "▁the", "Ã¤" -> "ä"); None when the
    piece is not a whole UTF-8 sequence (part of a multi-byte character) or not in the byte alphabet."""
    try:
        text = bytes(_BYTE_OF_CHAR[c] for c in piece).decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        return None
    return "".join(WORD_START if ch.isspace() else ch for ch in text)


def wordpiece_surface(piece: str) -> str:
    """A WordPiece piece in SentencePiece spelling ("##ing" -> "ing", "the" -> "▁the")."""
    return piece[2:] if piece.startswith("##") else WORD_START + piece


class HFTokenizer:
    """A Hugging Face *fast* tokenizer (a model directory or a hub id) behind the ``Tokenizer`` interface.

    ``sha256`` hashes the tokenizer's full serialisation (vocabulary, merges, normalisation, special
    tokens; not its truncation or padding settings, which encoding here ignores), so the same
    tokenizer has the same identity wherever it was loaded from."""

    def __init__(self, ref: str) -> None:
        self.path = ref
        # encoding runs on all cores; forked DataLoader workers never tokenize, so keep it on after a fork
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
        try:
            from transformers import AutoTokenizer
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise TokenizerError("data.source_tokenizer needs Hugging Face transformers: "
                                 "pip install 'minimodel[hf]'") from e
        try:
            self.hf = AutoTokenizer.from_pretrained(ref)
        except Exception as e:  # OSError for a missing dir / unreachable hub, ValueError for a bad one
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            if Path(ref).is_dir():
                files = sorted(p.name for p in Path(ref).iterdir())[:12]
                raise TokenizerError(f"cannot load a Hugging Face tokenizer from the directory {ref}: expected "
                                     f"tokenizer.json (or vocab.json + merges.txt, or sentencepiece.bpe.model) "
                                     f"with tokenizer_config.json; it holds {files} ({reason})") from e
            raise TokenizerError(f"cannot load a Hugging Face tokenizer from {ref}: no such local directory, and "
                                 f"as a hub id it failed ({reason})") from e
        if not getattr(self.hf, "is_fast", False):
            raise TokenizerError(f"{ref}: a fast tokenizer (tokenizer.json) is needed, got {type(self.hf).__name__}")
        ids = {}
        for role in ("bos", "pad", "eos", "unk", "mask"):
            value = getattr(self.hf, f"{role}_token_id")
            if value is None:
                raise TokenizerError(f"{ref}: the tokenizer has no {role} token; a RoBERTa-style MLM tokenizer "
                                     f"defines <s> <pad> </s> <unk> <mask>")
            ids[role] = int(value)
        others = tuple(int(i) for i in self.hf.all_special_ids if int(i) not in ids.values())
        self.specials = SpecialTokens(**ids, others=others)
        serialised = self.hf.backend_tokenizer.to_str()
        # a private copy of the Rust tokenizer for bulk encoding (1.8x faster than the Python wrapper);
        # a truncation or padding setting saved in tokenizer.json must not cut or pad corpus lines
        from tokenizers import Tokenizer as RustTokenizer

        self._backend = RustTokenizer.from_str(serialised)
        self._backend.no_truncation()
        self._backend.no_padding()
        self._encode_batch = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        spec = {k: v for k, v in json.loads(serialised).items() if k not in ("truncation", "padding")}
        self.sha256 = hashlib.sha256(json.dumps(spec, sort_keys=True).encode("utf-8")).hexdigest()
        decoder = (spec.get("decoder") or {}).get("type", "")
        self.convention = {"ByteLevel": "byte-level", "WordPiece": "wordpiece"}.get(decoder, "sentencepiece")

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, texts: list[str], threads: int = 1) -> list[list[int]]:
        return [e.ids for e in self._encode_batch(texts, add_special_tokens=False)]

    def encode_one(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [(_skip_space(text, s, e), e) for s, e in enc["offset_mapping"]]
        return list(enc["input_ids"]), offsets

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode([int(i) for i in ids])

    def pieces(self) -> list[str]:
        return self.hf.convert_ids_to_tokens(list(range(self.vocab_size)))

    def surface_pieces(self) -> list[str | None]:
        """Pieces in SentencePiece spelling; special tokens keep their literal text."""
        special = set(self.specials.ids) | {int(i) for i in self.hf.added_tokens_decoder}
        out: list[str | None] = []
        for i, piece in enumerate(self.pieces()):
            if i in special or piece is None or self.convention == "sentencepiece":
                out.append(piece)
            elif self.convention == "byte-level":
                out.append(byte_level_surface(piece))
            else:
                out.append(wordpiece_surface(piece))
        return out


def load_tokenizer(ref: str | Path) -> Tokenizer | HFTokenizer:
    """A SentencePiece ``.model`` file, or a Hugging Face tokenizer directory / hub id."""
    ref = str(ref)
    if ref.endswith(".model") or Path(ref).is_file():
        return Tokenizer(ref)
    return HFTokenizer(ref)


MAX_SENTENCE_BYTES = 1 << 16  # SentencePiece's max_sentence_length: training skips longer lines


SAMPLE_WINDOWS = 1024  # a plain corpus larger than data.spm_sample_bytes is sampled in this many windows at most
MIN_WINDOW_BYTES = 1 << 20
SPM_INDEX_LIMIT = 2**31 - 1
"""SentencePiece's trainer indexes the characters of its sample (one more per line: a separator, and one for the
word-start mark of the first word) with 32-bit integers and aborts above this unless it runs in its
large-corpus mode (``train_extremely_large_corpus``: 64-bit indices, more memory)."""
LARGE_CORPUS_MARGIN = 0.98  # switch a little below the limit: normalisation (NFKC) can lengthen the text
SAMPLE_FILE = "spm_sample.txt"


def large_corpus_mode(chars: int, lines: int) -> bool:
    """Whether SentencePiece must train in its large-corpus mode on a sample of ``lines`` lines holding ``chars``
    characters (``SPM_INDEX_LIMIT``)."""
    return chars + 2 * lines >= LARGE_CORPUS_MARGIN * SPM_INDEX_LIMIT


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
            read += len(chunk.data)
            yield chunk.data
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
            header = json.loads(f.readline().removeprefix(_SAMPLE_HEADER))
            if header.get("key") != key:
                return None
            lines = f.read().split("\n")
    except (OSError, ValueError, AttributeError):
        return None
    lines = lines[:-1] if lines and lines[-1] == "" else lines
    return lines if len(lines) == header.get("lines") else None


_SAMPLE_HEADER = "#minimodel-tokenizer-sample "


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
        how = (f"from the first {budget / 1e9:.1f} GB of text at most (an xz file cannot be read from an offset "
               f"without decompressing up to it; decompress the corpus to sample windows spread over all of it)")
    elif size > budget:
        how = f"from {budget / 1e9:.1f} GB read in {len(sample_windows(size, budget))} windows spread over the file"
    else:
        how = "from the whole corpus"
    log.info(f"tokenizer sample: drawing at most {max_sentences:,} lines of {corpus} {how}")
    lines = _sample_lines(corpus, max_sentences, seed, budget, stop)
    if lines is None:
        return None
    header = json.dumps({"key": key, "lines": len(lines)})
    atomic.write_text(sample_path, _SAMPLE_HEADER + header + "\n" + "".join(line + "\n" for line in lines))
    return lines


def _training_error(corpus: Path, vocab_size: int, message: str) -> TokenizerError:
    """SentencePiece's failure, said in terms of the corpus and ``data.vocab_size``."""
    message = message.strip()
    too_few = re.search(r"smaller than required_chars\. \d+ vs (\d+)", message)
    if too_few:
        return TokenizerError(
            f"data.vocab_size={vocab_size} is below the {too_few[1]} pieces SentencePiece needs for {corpus} "
            f"(the {len(SPECIALS)} special pieces and one per character covering data.spm_character_coverage of "
            f"the text): set data.vocab_size to at least {too_few[1]}"
        )
    too_many = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", message)
    if too_many:
        return TokenizerError(
            f"corpus {corpus} is too small for a vocabulary of {vocab_size} pieces (SentencePiece finds at most "
            f"{too_many[1]} in it): lower data.vocab_size to at most {too_many[1]}, or use a larger corpus"
        )
    return TokenizerError(f"SentencePiece training on {corpus} failed: {message}")


def train_tokenizer(
    corpus: Path,
    out_path: Path,
    vocab_size: int,
    model_type: str = "unigram",
    max_sentences: int = 10_000_000,
    character_coverage: float = 0.9995,
    threads: int = 2,
    seed: int = 1,
    sample_bytes: int = 2**62,
    stop: Callable[[], str | None] = lambda: None,
) -> Tokenizer | None:
    """Train a SentencePiece model on a sample of ``corpus`` (``tokenizer_sample``, kept beside ``out_path``
    until the model is written) and write it atomically to ``out_path``. None when ``stop()`` asked before
    training began (the sample, if drawn, is kept for the next run)."""
    sample_path = Path(out_path).parent / SAMPLE_FILE
    lines = tokenizer_sample(corpus, sample_path, max_sentences, sample_bytes, seed, stop)
    if lines is None or stop():
        return None
    chars = sum(map(len, lines))
    large = large_corpus_mode(chars, len(lines))
    log.info(f"tokenizer sample: {len(lines):,} lines, {chars:,} characters: SentencePiece trains "
             + ("in its large-corpus mode (64-bit indices: the sample reaches its 32-bit limit of "
                f"{SPM_INDEX_LIMIT:,} characters)" if large else
                f"in its standard mode ({(chars + 2 * len(lines)) / SPM_INDEX_LIMIT:.1%} of its 32-bit index)")
             + f", {threads} thread(s)")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            bos_id=BOS, pad_id=PAD, eos_id=EOS, unk_id=UNK,
            user_defined_symbols=["<mask>"],
            num_threads=threads,
            max_sentence_length=MAX_SENTENCE_BYTES,
            train_extremely_large_corpus=large,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise _training_error(corpus, vocab_size, str(e)) from e
    atomic.write_bytes(out_path, model.getvalue())
    sample_path.unlink(missing_ok=True)
    return Tokenizer(out_path)
