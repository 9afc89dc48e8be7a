"""FOCUS's auxiliary embeddings (``adapt.init=focus``): fastText vectors of a target language's pieces, trained on
the text step 2 trains on, tokenized with the language's SentencePiece model, then cached for every system.

The text is the prepared token stream (``minimodel prepare``'s shards: the corpus already tokenized with the target
model), its training blocks only: those before the validation blocks, the first ``adapt.data_fraction`` of them, as
step 2 reads them (``shards.train_blocks``). It is written one corpus line per line, pieces in SentencePiece spelling
separated by spaces, special pieces left out; fastText (Bojanowski et al., 2017) trains CBOW vectors on it with
FOCUS's settings (``FASTTEXT``: CBOW, 10 negatives; ``adapt.focus.dim`` / ``epochs`` / ``min_count``, FOCUS's
100 / 3 / 10 by default; fastText's defaults otherwise). A piece seen fewer than ``min_count`` times gets no vector.

Why this and not the ``deepfocus`` package (FOCUS's own code): deepfocus needs Hugging Face tokenizer objects for
both vocabularies, numba/fastdist, entmax, ``datasets`` and a fastText built from source; it caches under
``~/.cache/deepfocus`` keyed by the corpus's *path* (a changed corpus at the same path is not noticed), writes
non-atomically, and trains fastText on every CPU (not reproducible). Here the training text is the prepared
shards, the cache lives with the prepared language, keyed by content, and one thread makes it bit-reproducible.

The cache: ``{prepared_dir}/{lang}/focus/aux-{key}.npy`` (vectors) and ``.json`` (pieces, counts, what the key is
made of, the time training took). The key hashes the target tokenizer's sha256, the sha256 of the token ids read
and the fastText settings: a re-prepared corpus or another tokenizer gives another key, so a stale file is never
read. Nothing here depends on the system or the seed (fastText's own seed is its default, 0: the Python bindings
do not expose it for unsupervised training), so every system and seed that adapts on the same text shares one
training. Each rank of a distributed run trains the same vectors at once (one thread each, the same wall time)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from minimodel.config.schema import ExperimentConfig
from minimodel.data.shards import TokenStream, check_blocks, train_blocks
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.errors import ConfigError, WriteError
from minimodel.log import get_logger
from minimodel.store import atomic

log = get_logger(__name__)

FORMAT = "focus-aux-1"
FASTTEXT = {"model": "cbow", "neg": 10}
"""FOCUS's fastText settings besides dim, epochs and minCount (its code: CBOW, "more closely aligned with MLM")."""
CHUNK = 1 << 22  # tokens read at once
EOS_WORD = "</s>"  # fastText's own token for a line end: not a piece


@dataclass(frozen=True)
class AuxSettings:
    dim: int = 100
    epochs: int = 3
    min_count: int = 10
    threads: int = 1


@dataclass
class AuxEmbeddings:
    """The pieces that have a vector (seen at least ``min_count`` times) and their vectors."""

    pieces: list[str]
    vectors: np.ndarray  # (len(pieces), dim) float32
    record: dict  # the cache's .json without the pieces: key, tokens, train_seconds, ...
    cached: bool  # read from the cache: nothing was trained
    path: Path  # the cached vectors (or where they would have gone, when the directory is read-only)

    def for_vocabulary(self, tok: AnyTokenizer) -> np.ndarray:
        """One row per piece id of ``tok``: its vector, zeros for a special piece or one without a vector."""
        words, index = piece_words(tok), {p: i for i, p in enumerate(self.pieces)}
        out = np.zeros((len(words), self.vectors.shape[1]), dtype=np.float32)
        for i, w in enumerate(words):
            if w and w in index:
                out[i] = self.vectors[index[w]]
        return out


def piece_words(tok: AnyTokenizer) -> list[str]:
    """The fastText word of each piece id: the piece in SentencePiece spelling, "" for special pieces and for a piece
    fastText would split (one holding whitespace)."""
    special = set(tok.specials.ids)
    words = []
    for i, piece in enumerate(tok.surface_pieces()):
        plain = piece is not None and piece != EOS_WORD and piece.split() == [piece]
        words.append(piece if plain and i not in special else "")  # type: ignore[arg-type]
    return words


def training_tokens(cfg: ExperimentConfig, stream: TokenStream) -> int:
    """How many tokens of ``stream`` (from its start) step 2 trains on: its training blocks."""
    span, n_blocks = cfg.data.seq_len - 1, len(stream) // (cfg.data.seq_len - 1)
    check_blocks(stream.out_dir, n_blocks, cfg.data.val_blocks, cfg.data.seq_len)
    return len(train_blocks(n_blocks, cfg.data.val_blocks, cfg.adapt.data_fraction)) * span


def _chunks(stream: TokenStream, end: int):
    for start in range(0, end, CHUNK):
        yield stream.slice(start, min(start + CHUNK, end))


def tokens_sha256(stream: TokenStream, end: int) -> str:
    h = hashlib.sha256()
    for ids in _chunks(stream, end):
        h.update(ids.astype("<i4").tobytes())
    return h.hexdigest()


def write_text(stream: TokenStream, end: int, tok: AnyTokenizer, path: Path) -> None:
    """Tokens [0, end) of ``stream`` as fastText's training text: a line per ``</s>``, pieces separated by spaces."""
    table = np.array([w + " " if w else "" for w in piece_words(tok)], dtype=object)
    table[tok.specials.eos] = "\n"
    with atomic.replacing(path) as f:
        for ids in _chunks(stream, end):
            f.write("".join(table[ids].tolist()).encode("utf-8"))


def train_fasttext(text: Path, s: AuxSettings) -> tuple[list[str], list[int], np.ndarray, float]:
    """fastText on ``text``: the words it kept (``min_count``), their counts and vectors (a word's vector with its
    character n-grams, as FOCUS reads it), and about the FLOPs its training took (``fasttext_flops``)."""
    import fasttext

    try:
        model = fasttext.train_unsupervised(str(text), dim=s.dim, epoch=s.epochs, minCount=s.min_count,
                                            thread=s.threads, verbose=0, **FASTTEXT)
    except (ValueError, RuntimeError) as e:  # "Empty vocabulary. Try a smaller -minCount value."
        if "vocabulary" not in str(e).lower():
            raise
        raise ConfigError(f"adapt.init=focus: fastText kept no piece of the text step 2 trains on (none occurs "
                          f"adapt.focus.min_count={s.min_count} times): lower adapt.focus.min_count, or adapt on "
                          f"more text") from e
    words, counts = model.get_words(include_freq=True)
    a = model.f.getArgs()
    flops = fasttext_flops(list(words), [int(c) for c in counts], s.dim, s.epochs, a.ws, a.neg, a.minn, a.maxn, a.t)
    kept = [(w, int(c)) for w, c in zip(words, counts) if w != EOS_WORD]
    vectors = np.stack([model.get_word_vector(w) for w, _ in kept]) if kept else np.zeros((0, s.dim), np.float32)
    return [w for w, _ in kept], [c for _, c in kept], vectors.astype(np.float32), flops


def fasttext_flops(words: list[str], counts: list[int], dim: int, epochs: int, ws: int, neg: int, minn: int,
                   maxn: int, t: float) -> float:
    """About the FLOPs of fastText's CBOW training: per epoch, every token it keeps (subsampling keeps a token of
    frequency f with probability sqrt(t/f) + t/f) is a target whose context of about ws + 1 words (a window drawn
    from 1..ws on each side) averages R input rows of dim each (a word's own and its character n-grams', R averaged
    over tokens), scores neg + 1 output rows (a dot product, its gradient, the row's update: 6 dim) and sends the
    gradient back to those input rows: dim * (2 (ws + 1) R + 6 (neg + 1)) per kept token. An estimate (edges of
    lines and windows ignored), for comparing with step 2's FLOPs."""
    total = sum(counts)
    if not total:
        return 0.0
    freq = np.asarray(counts, dtype=np.float64) / total
    kept = np.asarray(counts, dtype=np.float64) * np.minimum(1.0, np.sqrt(t / freq) + t / freq)
    rows = np.asarray([1 + sum(max(0, len(w) + 3 - n) for n in range(minn, maxn + 1)) if w != EOS_WORD else 1
                       for w in words], dtype=np.float64)  # "<w>" has len(w) + 3 - n n-grams of length n
    per_token = dim * (2 * (ws + 1) * float((kept * rows).sum() / kept.sum()) + 6 * (neg + 1))
    return float(epochs * kept.sum() * per_token)


def _read_cache(path: Path, key: str, dim: int) -> tuple[list[str], dict, np.ndarray] | None:
    meta = path.with_suffix(".json")
    try:
        record = atomic.loads(meta.read_text(encoding="utf-8"))
        vectors = np.load(path)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key or vectors.shape != (len(record["pieces"]), dim):
        return None
    return record.pop("pieces"), record, vectors.astype(np.float32)


def aux_embeddings(cfg: ExperimentConfig, lang: str, tok: AnyTokenizer, s: AuxSettings) -> AuxEmbeddings:
    """The auxiliary vectors of ``lang``'s pieces: from the cache when it holds them for this text, tokenizer and
    settings, else trained here (and cached; a read-only prepared directory: trained, said, not cached)."""
    from minimodel.data.prepare import prepared_paths

    paths = prepared_paths(cfg, lang)
    stream = TokenStream.open(paths.shards)
    end = training_tokens(cfg, stream)
    digest = tokens_sha256(stream, end)
    parts = {"format": FORMAT, "tokenizer_sha256": tok.sha256, "tokens_sha256": digest, "tokens": end,
             "fasttext": {**FASTTEXT, **asdict(s)}}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    path = paths.aux_embeddings / f"aux-{key[:16]}.npy"
    hit = _read_cache(path, key, s.dim)
    if hit is not None:
        pieces, record, vectors = hit
        log.info(f"focus {lang}: fastText vectors of {len(pieces):,} pieces from {path} (trained in "
                 f"{record['train_seconds']:.1f} s on {end:,} tokens; reused)")
        return AuxEmbeddings(pieces, vectors, record, True, path)
    log.info(f"focus {lang}: training fastText ({s.dim} dims, {s.epochs} epochs, {s.threads} thread(s)) on the "
             f"{end:,} tokens step 2 trains on")
    try:
        atomic.make_dirs(paths.aux_embeddings)
        # this process's own text: the ranks of a distributed run each train (the same vectors) at once
        text = path.with_name(f"{path.stem}.{socket.gethostname()}-{os.getpid()}.txt")
        pieces, counts, vectors, cost = _train(stream, end, tok, s, text)
    except WriteError as e:  # shared read-only prepared data: train in a temporary directory, cache nothing
        log.warning(f"focus {lang}: cannot cache the fastText vectors ({e}); training them for this run only")
        with tempfile.TemporaryDirectory(prefix="minimodel-focus-") as tmp:
            pieces, counts, vectors, cost = _train(stream, end, tok, s, Path(tmp) / "text.txt")
        return AuxEmbeddings(pieces, vectors, {**parts, "key": key, **cost}, False, path)
    record = {**parts, "key": key, **cost, "trained_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        atomic.write_with(path, lambda f: np.save(f, vectors))
        atomic.write_json(path.with_suffix(".json"), {**record, "pieces": pieces, "counts": counts}, indent=None)
    except WriteError as e:
        log.warning(f"focus {lang}: the fastText vectors were not cached ({e})")
    log.info(f"focus {lang}: fastText trained in {cost['train_seconds']:.1f} s (about {cost['flops_estimate']:.3g} "
             f"FLOPs): vectors of {len(pieces):,} pieces -> {path}")
    return AuxEmbeddings(pieces, vectors, record, False, path)


def _train(stream: TokenStream, end: int, tok: AnyTokenizer, s: AuxSettings,
           text: Path) -> tuple[list[str], list[int], np.ndarray, dict]:
    """The text written to ``text`` (removed after), fastText trained on it; the cost: the wall time of both, the
    estimated FLOPs of training."""
    start = time.perf_counter()
    try:
        write_text(stream, end, tok, text)
        pieces, counts, vectors, flops = train_fasttext(text, s)
    finally:
        text.unlink(missing_ok=True)
    return pieces, counts, vectors, {"train_seconds": round(time.perf_counter() - start, 3), "flops_estimate": flops}
