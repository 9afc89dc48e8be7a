"""Training the SentencePiece model of a language on its corpus sample (``data.spm_sample``), in SentencePiece's
standard or large-corpus mode, with its failures said in terms of the corpus and ``data.vocab_size``."""

from __future__ import annotations

import io
import multiprocessing
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sentencepiece as spm

from minimodel.data.spm_sample import MAX_SENTENCE_BYTES, SAMPLE_FILE, _read_sample, _sample_key, tokenizer_sample
from minimodel.data.tokenizer import BOS, EOS, PAD, SPECIALS, UNK, Tokenizer, TokenizerError
from minimodel.log import get_logger
from minimodel.store import atomic

log = get_logger(__name__)

SPM_INDEX_LIMIT = 2**31 - 1
"""SentencePiece's trainer indexes the characters of its sample (one more per line: a separator, and one for the
word-start mark of the first word) with 32-bit integers and aborts above this unless it runs in its
large-corpus mode (``train_extremely_large_corpus``: 64-bit indices, more memory)."""
LARGE_CORPUS_MARGIN = 0.98  # switch a little below the limit: normalisation (NFKC) can lengthen the text


def large_corpus_mode(chars: int, lines: int) -> bool:
    """Whether SentencePiece must train in its large-corpus mode on a sample of ``lines`` lines holding ``chars``
    characters (``SPM_INDEX_LIMIT``)."""
    return chars + 2 * lines >= LARGE_CORPUS_MARGIN * SPM_INDEX_LIMIT


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
    options = dict(vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage,
                   bos_id=BOS, pad_id=PAD, eos_id=EOS, unk_id=UNK, user_defined_symbols=["<mask>"],
                   num_threads=threads, max_sentence_length=MAX_SENTENCE_BYTES, train_extremely_large_corpus=large,
                   minloglevel=2)
    model = _train_stoppably(sample_path, _sample_key(corpus, max_sentences, sample_bytes, seed), options, stop)
    if model is None:
        return None
    if isinstance(model, str):
        raise _training_error(corpus, vocab_size, model)
    atomic.write_bytes(out_path, model)
    sample_path.unlink(missing_ok=True)
    return Tokenizer(out_path)


def _train(sample_path: Path, key: dict, options: dict, conn: Any) -> None:
    """The child process: train on the saved sample, send back the model's bytes (or SentencePiece's error)."""
    lines = _read_sample(sample_path, key)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines or []), model_writer=model, **options)
    except RuntimeError as e:
        conn.send(str(e))
        return
    conn.send(model.getvalue())


def _train_stoppably(sample_path: Path, key: dict, options: dict,
                     stop: Callable[[], str | None]) -> bytes | str | None:
    """SentencePiece's training in a child process, so that a stop signal (SLURM's USR1 before the time limit,
    SIGTERM) or Ctrl-C ends it at once: SentencePiece's C++ trainer holds the interpreter until it returns, which
    on CC-100 English takes hours. Returns the model's bytes, SentencePiece's error message, or None when ``stop()``
    asked (the sample stays saved: the next run trains on it)."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (torch, tokenizers)
    mine, theirs = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_train, args=(sample_path, key, options, theirs), daemon=True)
    child.start()
    theirs.close()
    try:
        while not mine.poll(0.25):
            if stop():
                child.terminate()
                child.join()
                return None
            if not child.is_alive() and not mine.poll(0):
                raise TokenizerError(f"SentencePiece's training process ended without a model (exit code "
                                     f"{child.exitcode}: out of memory?); the sample {sample_path} is kept: rerun "
                                     f"`minimodel prepare` to train on it again")
        result = mine.recv()
    except BaseException:  # Ctrl-C: the trainer stops with the command
        child.terminate()
        child.join()
        raise
    child.join()
    return result
