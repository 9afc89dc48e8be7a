"""SentencePiece tokenizers, one per language, with the special-token ids the model agrees on."""

from __future__ import annotations

import hashlib
import io
import os
import random
from pathlib import Path
from typing import Iterable, Iterator

import sentencepiece as spm

from minimodel.data.corpus import iter_lines

# fairseq / RoBERTa order for the first four; <mask> right after them.
BOS, PAD, EOS, UNK, MASK = 0, 1, 2, 3, 4
SPECIALS = {"<s>": BOS, "<pad>": PAD, "</s>": EOS, "<unk>": UNK, "<mask>": MASK}


class TokenizerError(ValueError):
    """A tokenizer that cannot be used here, with a message naming the file."""


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Tokenizer:
    """A SentencePiece model whose special ids match ``SPECIALS``."""

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

    def pieces(self) -> list[str]:
        return [self.sp.id_to_piece(i) for i in range(self.vocab_size)]


def _sample_lines(corpus: Path, max_sentences: int, seed: int) -> Iterator[str]:
    """Reservoir-sample at most ``max_sentences`` lines (all of them when the corpus is smaller)."""
    rng = random.Random(seed)
    reservoir: list[str] = []
    for i, line in enumerate(iter_lines(corpus)):
        if i < max_sentences:
            reservoir.append(line)
        else:
            j = rng.randint(0, i)
            if j < max_sentences:
                reservoir[j] = line
    yield from reservoir


def train_tokenizer(
    corpus: Path,
    out_path: Path,
    vocab_size: int,
    model_type: str = "unigram",
    max_sentences: int = 10_000_000,
    character_coverage: float = 0.9995,
    threads: int = 2,
    seed: int = 1,
) -> Tokenizer:
    """Train a SentencePiece model on ``corpus`` and write it atomically to ``out_path``."""
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sample_lines(corpus, max_sentences, seed),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            bos_id=BOS, pad_id=PAD, eos_id=EOS, unk_id=UNK,
            user_defined_symbols=["<mask>"],
            num_threads=threads,
            max_sentence_length=1 << 16,
            train_extremely_large_corpus=False,
            minloglevel=2,
        )
    except RuntimeError as e:
        msg = str(e)
        if "Vocabulary size" in msg or "vocab_size" in msg:
            raise TokenizerError(
                f"corpus {corpus} is too small for a vocabulary of {vocab_size} pieces ({msg.strip()}); "
                f"lower data.vocab_size"
            ) from e
        raise TokenizerError(f"SentencePiece training on {corpus} failed: {msg}") from e
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".tmp")
    tmp.write_bytes(model.getvalue())
    os.replace(tmp, out_path)
    return Tokenizer(out_path)
