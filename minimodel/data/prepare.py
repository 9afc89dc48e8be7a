"""`minimodel prepare`: per language, a tokenizer and the token shards of its corpus.

Every language gets a SentencePiece model trained here (``{prepared_dir}/{lang}/spm.model``) and its
shards (``{prepared_dir}/{lang}/shards``). The source language can instead be encoded with a Hugging
Face tokenizer (``data.source_tokenizer``, or MiniPost's Hugging Face ``bridge.source``): the
public model's own vocabulary. Those shards live apart, in ``{prepared_dir}/{lang}/hf-{name}/shards``,
so they never collide with SentencePiece shards of the same corpus."""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from minimodel.config import ExperimentConfig
from minimodel.data.corpus import find_corpus, iter_documents
from minimodel.data.shards import encode_corpus
from minimodel.data.tokenizer import HFTokenizer, Tokenizer, TokenizerError, train_tokenizer


@dataclass(frozen=True)
class Prepared:
    lang: str
    tokenizer: str  # a SentencePiece .model path, or a Hugging Face tokenizer directory / hub id
    shards: Path
    hf: bool = False


def _slug(ref: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(ref.rstrip("/")).name or "tokenizer")
    return f"{name}-{hashlib.sha1(ref.encode()).hexdigest()[:8]}"


def prepared_paths(cfg: ExperimentConfig, lang: str) -> Prepared:
    root = Path(cfg.data.prepared_dir) / lang
    if lang == cfg.source_lang and cfg.source_tokenizer:
        ref = cfg.source_tokenizer
        return Prepared(lang, ref, root / f"hf-{_slug(ref)}" / "shards", hf=True)
    return Prepared(lang, str(root / "spm.model"), root / "shards")


def load_prepared_tokenizer(cfg: ExperimentConfig, lang: str) -> Tokenizer | HFTokenizer:
    """The tokenizer ``prepare`` used for ``lang`` (clear error when it has not run)."""
    paths = prepared_paths(cfg, lang)
    return HFTokenizer(paths.tokenizer) if paths.hf else Tokenizer(paths.tokenizer)


def prepare_language(cfg: ExperimentConfig, lang: str, progress: bool = True) -> Prepared:
    """Train the tokenizer (unless one exists or a Hugging Face one is given) and encode the corpus
    (resuming where it stopped)."""
    paths = prepared_paths(cfg, lang)
    corpus = find_corpus(cfg.data.corpus_dir, lang)
    next(iter_documents(corpus))  # fails clearly on a missing, empty or unreadable corpus
    tok: Tokenizer | HFTokenizer
    if paths.hf:
        tok = HFTokenizer(paths.tokenizer)
        print(f"[prepare {lang}] Hugging Face tokenizer {paths.tokenizer} ({tok.vocab_size} pieces, "
              f"{tok.convention} pieces, <mask> = {tok.specials.mask})", file=sys.stderr)
    elif Path(paths.tokenizer).exists():
        tok = Tokenizer(paths.tokenizer)
        print(f"[prepare {lang}] tokenizer {paths.tokenizer} exists ({tok.vocab_size} pieces)", file=sys.stderr)
    else:
        print(f"[prepare {lang}] training SentencePiece ({cfg.data.vocab_size} pieces) on {corpus}", file=sys.stderr)
        tok = train_tokenizer(corpus, Path(paths.tokenizer), cfg.data.vocab_size, cfg.data.spm_model_type,
                              cfg.data.spm_max_sentences, cfg.data.spm_character_coverage, cfg.data.encode_threads)
    if not paths.hf and tok.vocab_size != cfg.data.vocab_size:
        raise TokenizerError(f"{paths.tokenizer} has {tok.vocab_size} pieces but data.vocab_size is "
                             f"{cfg.data.vocab_size}; delete it to retrain, or set data.vocab_size={tok.vocab_size}")
    manifest = encode_corpus(corpus, tok, paths.shards, cfg.data.shard_bytes, cfg.data.encode_threads, progress)
    tokens = sum(e["tokens"] for e in manifest["shards"])
    print(f"[prepare {lang}] {paths.shards}: {len(manifest['shards'])} shards, {tokens:,} tokens", file=sys.stderr)
    return paths
