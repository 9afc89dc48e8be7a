"""Tokenizers: a SentencePiece model per language (trained by `minimodel prepare`: ``data.spm_training``), and,
for the source language only, a Hugging Face tokenizer when the primary model is a public checkpoint
(``data.source_tokenizer``, e.g. MiniPost from ``roberta-base`` or ``xlm-roberta-base``).

Both kinds offer the same small interface: ``encode``, ``encode_one``, ``encode_with_offsets``,
``decode``, ``vocab_size``, ``sha256`` (the identity checked wherever embeddings meet a tokenizer),
``specials`` (the ids of ``<s> <pad> </s> <unk> <mask>``), ``surface_pieces()`` (every piece in
SentencePiece spelling, so that vocabularies of different conventions can be compared for the
overlap initialisation of footnote 1) and ``encode_piece()`` (a piece of another vocabulary, given in
SentencePiece spelling, segmented by this one: ``adapt.init=mean``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import sentencepiece as spm

from minimodel.errors import UserError
from minimodel.models import gguf_copy
from minimodel.store import atomic

# fairseq / RoBERTa order for the first four; <mask> right after them.
BOS, PAD, EOS, UNK, MASK = 0, 1, 2, 3, 4
SPECIALS = {"<s>": BOS, "<pad>": PAD, "</s>": EOS, "<unk>": UNK, "<mask>": MASK}
WORD_START = "\u2581"  # SentencePiece's "▁": the piece starts a new word


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
    def encode_piece(self, piece: str) -> list[int]: ...


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
        self.sha256 = atomic.file_sha256(self.path)

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

    def encode_piece(self, piece: str) -> list[int]:
        """The ids this model segments ``piece`` (SentencePiece spelling: "▁" is a space) into, read as exactly that
        text: without the word start SentencePiece puts before every text ("ung" stays a continuation, not "▁ung")
        and keeping its spaces. <unk> where a character is not in the vocabulary."""
        exact = self.__dict__.get("_exact")
        if exact is None:  # the same model with its normaliser told to add and strip nothing
            from sentencepiece import sentencepiece_model_pb2

            proto = sentencepiece_model_pb2.ModelProto()
            proto.ParseFromString(self.sp.serialized_model_proto())
            proto.normalizer_spec.add_dummy_prefix = False
            proto.normalizer_spec.remove_extra_whitespaces = False
            exact = self._exact = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
        return exact.encode(piece.replace(WORD_START, " "))


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

    def __init__(self, ref: str, causal: bool = False, runs_dir: str = "") -> None:
        """``causal``: the tokenizer of a causal LM (GPT-2, Llama), which may lack <pad>, <unk> and <mask>: padding
        is then its end-of-sequence token (what the model's ``pad_id`` must be), <unk> and <mask> (which nothing
        inserts into a causal LM's blocks) the end-of-sequence token too, and a missing <s> the end-of-sequence
        token (GPT-2's ``<|endoftext|>`` is both). ``runs_dir`` (the experiment's): a GGUF file's tokenizer is read
        from the file's copy converted once there (``gguf_copy.gguf_copy``); ``path`` stays ``ref``."""
        self.path, self.causal, self.runs_dir = ref, causal, runs_dir
        # encoding runs on all cores; forked DataLoader workers never tokenize, so keep it on after a fork
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
        try:
            import transformers  # noqa: F401
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise TokenizerError("data.source_tokenizer needs Hugging Face transformers: "
                                 "pip install 'minimodel[hf]'") from e
        try:  # through the one door for outside models; a GGUF file carries its tokenizer
            self.hf, _ = gguf_copy.load_tokenizer(ref, runs_dir)
        except Exception as e:  # OSError for a missing dir / unreachable hub, ValueError for a bad one
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            if Path(ref).is_dir():
                files = sorted(p.name for p in Path(ref).iterdir())[:12]
                raise TokenizerError(f"cannot load a Hugging Face tokenizer from the directory {ref}: expected "
                                     f"tokenizer.json (or vocab.json + merges.txt, or sentencepiece.bpe.model) "
                                     f"with tokenizer_config.json; it holds {files} ({reason})") from e
            if Path(ref).is_file():
                raise TokenizerError(f"cannot load the tokenizer of the model file {ref}: {reason}") from e
            if isinstance(e, UserError) and reason.startswith(f"{ref}: "):  # the door's refusal of a hub id
                raise TokenizerError(f"cannot load a Hugging Face tokenizer from {reason}") from e
            raise TokenizerError(f"cannot load a Hugging Face tokenizer from {ref}: no such local directory, and "
                                 f"as a hub id it failed ({reason})") from e
        if not getattr(self.hf, "is_fast", False):
            raise TokenizerError(f"{ref}: a fast tokenizer (tokenizer.json) is needed, got {type(self.hf).__name__}")
        ids = {}
        for role in ("bos", "pad", "eos", "unk", "mask"):
            value = getattr(self.hf, f"{role}_token_id")
            if value is None and causal and role != "eos":
                value = self.hf.eos_token_id
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
        # text is text: a corpus line that spells a special token ("<|endoftext|>", "<filename>", "</s>") is encoded
        # as the characters it is, as SentencePiece does, not as the special id (an end of text in mid-document)
        self._backend.encode_special_tokens = True
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
        enc = self._backend.encode(text, add_special_tokens=False)  # character offsets, as the wrapper gives them
        offsets = [(_skip_space(text, s, e), e) for s, e in enc.offsets]
        return list(enc.ids), offsets

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

    def encode_piece(self, piece: str) -> list[int]:
        """The ids this tokenizer segments ``piece`` (SentencePiece spelling: "▁" is a space) into, as that text
        alone: no special tokens (a byte-level BPE such as GPT-2's or SmolLM2's reads " the" as "Ġthe" and "ung" as
        "ung"). A tokenizer that puts a word start before every text (a SentencePiece-style ``Metaspace``, a
        byte-level BPE with ``add_prefix_space``) has it taken off where it is a piece of its own ("▁", then "ung");
        where it is merged into the first piece ("▁ung", not the continuation "ung") there is no faithful
        segmentation and the answer is [] (so is an empty text)."""
        ids = self._backend.encode(piece.replace(WORD_START, " "), add_special_tokens=False).ids
        surfaces = self.__dict__.get("_surfaces")
        if surfaces is None:
            surfaces = self._surfaces = self.surface_pieces()
        first = surfaces[ids[0]] if ids and ids[0] < len(surfaces) else None
        added = first is not None and first.startswith(WORD_START) and not piece.startswith(WORD_START)
        if not added and first == WORD_START and len(ids) > 1:  # "▁the" read as "▁▁the" (a prepended word start)
            rest = surfaces[ids[1]] if ids[1] < len(surfaces) else None
            added = rest is not None and rest.startswith(WORD_START)
        if added:
            return ids[1:] if first == WORD_START else []
        return ids


def load_tokenizer(ref: str | Path) -> Tokenizer | HFTokenizer:
    """A SentencePiece ``.model`` file, or a Hugging Face tokenizer directory / hub id."""
    ref = str(ref)
    if ref.endswith(".model") or Path(ref).is_file():
        return Tokenizer(ref)
    return HFTokenizer(ref)
