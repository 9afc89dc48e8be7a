"""`minimodel prepare`: per language, a SentencePiece model and the token shards of its corpus."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from minimodel.config import ExperimentConfig
from minimodel.data.corpus import find_corpus, iter_documents
from minimodel.data.shards import encode_corpus
from minimodel.data.tokenizer import Tokenizer, train_tokenizer


@dataclass(frozen=True)
class Prepared:
    lang: str
    tokenizer: Path
    shards: Path


def prepared_paths(cfg: ExperimentConfig, lang: str) -> Prepared:
    root = Path(cfg.data.prepared_dir) / lang
    return Prepared(lang, root / "spm.model", root / "shards")


def prepare_language(cfg: ExperimentConfig, lang: str, progress: bool = True) -> Prepared:
    """Train the tokenizer (unless one exists) and encode the corpus (resuming where it stopped)."""
    paths = prepared_paths(cfg, lang)
    corpus = find_corpus(cfg.data.corpus_dir, lang)
    next(iter_documents(corpus))  # fails clearly on a missing, empty or unreadable corpus
    if paths.tokenizer.exists():
        tok = Tokenizer(paths.tokenizer)
        print(f"[prepare {lang}] tokenizer {paths.tokenizer} exists ({tok.vocab_size} pieces)", file=sys.stderr)
    else:
        print(f"[prepare {lang}] training SentencePiece ({cfg.data.vocab_size} pieces) on {corpus}", file=sys.stderr)
        tok = train_tokenizer(corpus, paths.tokenizer, cfg.data.vocab_size, cfg.data.spm_model_type,
                              cfg.data.spm_max_sentences, cfg.data.spm_character_coverage, cfg.data.encode_threads)
    if tok.vocab_size != cfg.data.vocab_size:
        from minimodel.data.tokenizer import TokenizerError

        raise TokenizerError(f"{paths.tokenizer} has {tok.vocab_size} pieces but data.vocab_size is "
                             f"{cfg.data.vocab_size}; delete it to retrain, or set data.vocab_size={tok.vocab_size}")
    manifest = encode_corpus(corpus, tok, paths.shards, cfg.data.shard_bytes, cfg.data.encode_threads, progress)
    tokens = sum(e["tokens"] for e in manifest["shards"])
    print(f"[prepare {lang}] {paths.shards}: {len(manifest['shards'])} shards, {tokens:,} tokens", file=sys.stderr)
    return paths
