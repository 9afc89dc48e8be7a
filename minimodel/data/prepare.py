"""`minimodel prepare`: per language, a tokenizer and the token shards of its corpus.

Every language gets a SentencePiece model trained here (``{prepared_dir}/{lang}/spm.model``) and its
shards (``{prepared_dir}/{lang}/shards``). The source language can instead be encoded with a Hugging
Face tokenizer (``data.source_tokenizer``, or MiniPost's Hugging Face ``bridge.source``): the
public model's own vocabulary. Those shards live apart, in ``{prepared_dir}/{lang}/hf-{name}/shards``,
so they never collide with SentencePiece shards of the same corpus."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from minimodel import signals
from minimodel.config.schema import ExperimentConfig
from minimodel.data.corpus import check_text, find_corpus, iter_documents
from minimodel.data.encode import encode_corpus, workers_for
from minimodel.data.shards import ShardError, check_writable, read_manifest, shard_ok
from minimodel.data.spm_sample import SAMPLE_FILE
from minimodel.data.spm_training import train_tokenizer
from minimodel.data.tokenizer import AnyTokenizer, HFTokenizer, Tokenizer, TokenizerError
from minimodel.errors import UserError
from minimodel.log import get_logger
from minimodel.models.families import causal
from minimodel.store import atomic
from minimodel.store.layout import Prepared, prepared
from minimodel.store.locks import exclusive
from minimodel.systems import stage_plan

log = get_logger(__name__)


EXTEND_LINES = 200_000
"""``adapt.vocabulary=extend`` over a byte-level BPE: the merges that reach the new pieces are learned on the target
corpus' first lines, this many at most (``data.extend``)."""

PAD_ROWS_MULTIPLE, PAD_ROWS_MAX = 64, 1024
"""A model's embedding matrix may have more rows than its own tokenizer has pieces when the surplus is alignment
padding (Qwen2.5-0.5B: 151,936 rows for 151,665 pieces; other families pad alike, e.g. Phi-2 51,200 for 50,295 and
Pythia 50,304 for 50,277, though minimodel does not read those architectures): its rows a multiple of this, at most
this many past the pieces. The padding rows are never read (no token has their ids)."""


def padded_rows(pieces: int, rows: int) -> int:
    """How many rows of a ``rows``-row embedding matrix lie past a tokenizer of ``pieces`` pieces as alignment padding
    (``PAD_ROWS_MULTIPLE``, ``PAD_ROWS_MAX``): 0 when they match, -1 when the two do not fit."""
    if rows == pieces:
        return 0
    padding = rows % PAD_ROWS_MULTIPLE == 0 and pieces < rows <= pieces + PAD_ROWS_MAX
    return rows - pieces if padding else -1


def prepared_paths(cfg: ExperimentConfig, lang: str, in_source: bool = False) -> Prepared:
    """Tokenizer and shards of ``lang`` (the source language may use a Hugging Face tokenizer; a target language's
    tokenizer is the source tokenizer extended with its pieces under ``adapt.vocabulary=extend``). ``in_source``:
    ``lang``'s text in the source language's tokenizer, which step 1b reads for ``bridge.langs``."""
    hf = stage_plan(cfg, "prepare").tokenizer
    if lang == cfg.source_lang:
        return prepared(cfg.data.prepared_dir, lang, hf)
    if in_source:
        return prepared(cfg.data.prepared_dir, lang, hf, in_source=cfg.source_lang)
    if cfg.adapt.vocabulary == "extend":
        return prepared(cfg.data.prepared_dir, lang, extends=hf)
    return prepared(cfg.data.prepared_dir, lang)


def prepare_settings(cfg: ExperimentConfig, lang: str, in_source: bool = False) -> dict:
    """What decides a language's prepared data: its corpus (name and size) and the tokenizer and shard settings.
    ``done.json`` records it; a prepare step is finished when the recorded settings equal these."""
    d = cfg.data
    paths = prepared_paths(cfg, lang, in_source)
    try:
        corpus = find_corpus(d.corpus_dir, lang)
        corpus_id = {"corpus": corpus.name, "corpus_bytes": corpus.stat().st_size}
    except (UserError, OSError):
        corpus_id = {"corpus": "", "corpus_bytes": -1}
    own = {"vocab_size": d.vocab_size, "spm_model_type": d.spm_model_type, "spm_max_sentences": d.spm_max_sentences,
           "spm_character_coverage": d.spm_character_coverage, "spm_sample_bytes": d.spm_sample_bytes}
    if paths.base:  # the source tokenizer extended with the language's own pieces
        tokenizer = {**own, "extends": stage_plan(cfg, "prepare").tokenizer or "spm",
                     **({"extend_lines": EXTEND_LINES} if paths.hf else {})}
        sample: dict = {}
    elif paths.borrowed:  # the source language's SentencePiece model (its sha256 is checked apart)
        tokenizer, sample = {"tokenizer_of": cfg.source_lang, **{k: v for k, v in own.items() if k != "spm_sample_bytes"}}, {}
    else:
        tokenizer = ({"tokenizer": paths.tokenizer} if paths.hf else
                     {k: v for k, v in own.items() if k != "spm_sample_bytes"})
        sample = {} if paths.hf else {"spm_sample_bytes": d.spm_sample_bytes}
    return {"lang": lang, **corpus_id, **tokenizer, **sample, "shard_bytes": d.shard_bytes}


def is_prepared(cfg: ExperimentConfig, lang: str, in_source: bool = False) -> bool:
    """Whether ``lang``'s prepare step finished with these settings (its ``done.json`` says so) and what it made is
    still on disk as it was made, checked cheaply (no read of the tokens): the tokenizer file it recorded (sha256 of
    a SentencePiece model, a few MB at most) and every shard of a complete manifest at its recorded size. A step
    whose files changed is not finished: prepare looks again (re-encodes a missing or cut shard, refuses shards
    made with another tokenizer). ``in_source``: ``lang``'s text in the source language's tokenizer
    (``prepared_paths``)."""
    paths = prepared_paths(cfg, lang, in_source)
    try:
        recorded = atomic.loads(paths.done.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(recorded, dict) or recorded.get("settings") != prepare_settings(cfg, lang, in_source):
        return False
    if paths.base and not _extension_current(cfg, paths):
        return False
    if not paths.hf and recorded.get("tokenizer_sha256"):
        try:
            if Tokenizer(paths.tokenizer).sha256 != recorded["tokenizer_sha256"]:
                log.warning(f"prepare {lang}: {paths.tokenizer} is not the tokenizer {paths.done} records: the "
                            f"step is not finished with it")
                return False
        except Exception:  # missing or unreadable: not finished either
            return False
    try:
        manifest = read_manifest(Path(paths.shards))
    except ShardError:
        return False
    return bool(manifest and manifest.get("complete")
                and all(shard_ok(Path(paths.shards), e) for e in manifest["shards"]))


def _extension_current(cfg: ExperimentConfig, paths: Prepared) -> bool:
    """Whether the extended tokenizer of ``paths`` was made from the language's SentencePiece model as it is now and,
    for a SentencePiece source, from the source language's as it is now (a Hugging Face source is named by the
    extension's directory; step 2 checks its sha256 against the model's)."""
    from minimodel.data.extend import read_extension

    record = read_extension(paths.tokenizer)
    if record is None or not Path(paths.base).is_file():
        return False
    try:
        if Tokenizer(paths.base).sha256 != record.get("target_sha256"):
            return False
        if not paths.hf:
            source = prepared_paths(cfg, cfg.source_lang).tokenizer
            return Tokenizer(source).sha256 == record.get("source_sha256")
    except Exception:  # missing or unreadable: not current either
        return False
    return True


def bridge_reads(cfg: ExperimentConfig) -> tuple[str, ...]:
    """The languages besides the source whose text in the source tokenizer this configuration's step 1b reads
    (``bridge.langs``; none for a system without a bridge, or whose bridge is another experiment's: ``models_from``)."""
    return tuple(cfg.bridge.langs) if stage_plan(cfg, "bridge").runs_here and not cfg.models_from else ()


def prepare_jobs(cfg: ExperimentConfig, lang: str, only: str = "") -> tuple[bool, ...]:
    """What ``minimodel prepare --langs=LANG [--only=own|source]`` makes of ``lang``, as ``in_source`` flags: its own
    data (False) and, when step 1b reads it (``bridge_reads``), its text in the source tokenizer (True), after its
    own data (whose held-out text the bridge leaves out: ``stages.bridge.held_out_tail``). ``only``: one of the
    two (``source`` for a language step 1b does not read: a ``UserError``)."""
    bridge = lang in bridge_reads(cfg)
    if only == "source" and not bridge:
        raise UserError(f"prepare --langs={lang} --only=source: step 1b of this configuration does not read {lang} "
                        f"(bridge.langs={list(cfg.bridge.langs)}, system {cfg.system}); nothing to prepare")
    return {"own": (False,), "source": (True,)}.get(only, (False, True) if bridge else (False,))


def prepared_all(cfg: ExperimentConfig, lang: str, only: str = "") -> bool:
    """Whether everything ``prepare_jobs`` names for ``lang`` is prepared with these settings."""
    return all(is_prepared(cfg, lang, in_source) for in_source in prepare_jobs(cfg, lang, only))


def load_prepared_tokenizer(cfg: ExperimentConfig, lang: str) -> AnyTokenizer:
    """The tokenizer ``prepare`` used for ``lang`` (clear error when it has not run)."""
    paths = prepared_paths(cfg, lang)
    return HFTokenizer(paths.tokenizer, causal(cfg.model), cfg.runs_dir) if paths.hf else Tokenizer(paths.tokenizer)


def prepare_language(cfg: ExperimentConfig, lang: str, progress: bool = True,
                     stop: Callable[[], str | None] = signals.requested, in_source: bool = False) -> str:
    """Train the tokenizer (unless one exists or a Hugging Face one is given) and encode the corpus (resuming where
    it stopped), then write the language's ``done.json``. Returns "" when the language is prepared, or the name of
    the stop signal (``stop()``: SLURM's USR1 before the time limit, SIGTERM) that stopped it at a safe point:
    after drawing the tokenizer's sample (saved), after the tokenizer, or after the shards being encoded.
    ``in_source``: encode ``lang``'s corpus with the source language's tokenizer (``bridge.langs``), which must be
    there (a SentencePiece one is the source language's prepare step's; nothing is trained)."""
    paths = prepared_paths(cfg, lang, in_source)
    if is_prepared(cfg, lang, in_source):
        log.info(f"prepare {lang}{' in the source tokenizer' if in_source else ''}: finished with these settings "
                 f"({paths.done}); skipping")
        return ""
    if paths.borrowed and not Path(paths.tokenizer).is_file():
        raise TokenizerError(f"prepare {lang} for bridge.langs: its text is encoded with the source language's "
                             f"tokenizer {paths.tokenizer}, which is not there: prepare {cfg.source_lang} first")
    corpus = find_corpus(cfg.data.corpus_dir, lang)
    check_same_corpus(cfg, lang, paths, corpus, in_source)  # another corpus' tokenizer and shards: refused
    check_text(corpus)  # binary data, UTF-16, ...: said before reading on to the first blank line
    next(iter_documents(corpus))  # fails clearly on a missing, empty or unreadable corpus
    directory = Path(cfg.data.prepared_dir) / lang
    if directory.is_dir() and not os.access(directory, os.W_OK):  # shared read-only data: nothing to lock
        return _prepare(cfg, lang, paths, corpus, progress, stop, in_source)
    check_writable(directory)
    with exclusive(directory, f"prepare {lang}"):  # one writer of a language's tokenizer and shards
        return _prepare(cfg, lang, paths, corpus, progress, stop, in_source)


def check_same_corpus(cfg: ExperimentConfig, lang: str, paths: Prepared, corpus: Path, in_source: bool = False
                      ) -> None:
    """A ``ShardError`` when ``lang``'s prepared data (its ``done.json``) was made from another corpus than
    ``corpus`` (another file name or size): its tokenizer was trained on that corpus and its shards encode it, and
    adaptations of this or another experiment (``models_from``) read them (``in_source``: the source tokenizer's
    encoding of ``lang``, which bridges with ``bridge.langs`` read). Nothing is written; the message says how
    to prepare the new corpus apart."""
    try:
        recorded = atomic.loads(paths.done.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    old = recorded.get("settings") if isinstance(recorded, dict) else None
    if not isinstance(old, dict):
        return
    new = prepare_settings(cfg, lang, in_source)
    if all(old.get(k) == new.get(k) for k in ("corpus", "corpus_bytes")):
        return
    def size(n: object) -> str:
        return f"{n:,} bytes" if isinstance(n, int) and n >= 0 else "size unknown"

    then = recorded.get("corpus_path") or old.get("corpus")
    # the source tokenizer's encoding of another language is read by the bridges (bridge.langs); the rest, by steps 2
    readers = "bridges (bridge.langs)" if in_source else "adaptations"
    what = "its shards are" if in_source else "its tokenizer and shards are"
    raise ShardError(
        f"{paths.done.parent} was prepared from another corpus ({then}, {size(old.get('corpus_bytes'))}) than "
        f"data.corpus_dir gives now ({corpus}, {size(new.get('corpus_bytes'))}): {what} that "
        f"corpus', and the {readers} that read them (of any experiment using data.prepared_dir="
        f"{cfg.data.prepared_dir}) stand on them; nothing was overwritten. Prepare the new corpus apart: set "
        f"data.prepared_dir to a directory of your own (docs/running.md, reusing models), or delete "
        f"{paths.done.parent} to prepare {lang} again from it (the {readers} that read it are then refused until "
        f"redone)")


def _prepare(cfg: ExperimentConfig, lang: str, paths: Prepared, corpus: Path, progress: bool,
             stop: Callable[[], str | None], in_source: bool = False) -> str:
    d = cfg.data
    workers = workers_for(d.encode_threads)
    tok: Tokenizer | HFTokenizer | None
    if paths.base:  # adapt.vocabulary=extend: the source tokenizer plus the pieces of the language's own model
        own = _own_tokenizer(cfg, lang, Path(paths.base), corpus, workers, stop)
        if own is None:
            return _stopped(lang, stop, "the tokenizer's sample" if (Path(paths.base).parent / SAMPLE_FILE).exists()
                            else "nothing yet")
        tok = _extended_tokenizer(cfg, lang, paths, own, corpus)
    elif paths.hf:
        is_causal = causal(cfg.model)
        tok = HFTokenizer(paths.tokenizer, is_causal, cfg.runs_dir)
        mask = "" if is_causal else f", <mask> = {tok.specials.mask}"  # a causal LM masks nothing: no <mask> to name
        log.info(f"prepare {lang}: Hugging Face tokenizer {paths.tokenizer} ({tok.vocab_size} pieces, "
                 f"{tok.convention} pieces{mask})")
    else:
        tok = _own_tokenizer(cfg, lang, Path(paths.tokenizer), corpus, workers, stop)
        if tok is None or stop():
            sample = Path(paths.tokenizer).parent / SAMPLE_FILE
            kept = ("the tokenizer" if tok is not None else f"the tokenizer's sample ({sample})" if sample.exists()
                    else "nothing yet (the tokenizer's sample is drawn again: at most data.spm_sample_bytes of text)")
            return _stopped(lang, stop, kept)
    log.info(f"prepare {lang}: encoding {corpus} with {workers} process(es) (data.encode_threads="
             f"{d.encode_threads}{': the CPUs this process may use' if d.encode_threads == 0 else ''})")
    manifest = encode_corpus(corpus, tok, paths.shards, d.shard_bytes, workers, progress, stop, f"prepare {lang}")
    if manifest.get("stopped"):
        return _stopped(lang, stop, f"{len(manifest['shards'])} shard(s)")
    tokens = sum(e["tokens"] for e in manifest["shards"])
    log.info(f"prepare {lang}: {paths.shards}: {len(manifest['shards'])} shards, {tokens:,} tokens")
    # the corpus the shards came from, by content: recorded by every step that reads them (``provenance.Outside``)
    atomic.write_json(paths.done, {"settings": prepare_settings(cfg, lang, in_source), "tokenizer_sha256": tok.sha256,
                                   "shards": len(manifest["shards"]), "tokens": tokens,
                                   "corpus_path": str(corpus.resolve()), "corpus_sha256": atomic.file_sha256(corpus)})
    return ""


def _own_tokenizer(cfg: ExperimentConfig, lang: str, path: Path, corpus: Path, workers: int,
                   stop: Callable[[], str | None]) -> Tokenizer | None:
    """The language's own SentencePiece model at ``path``: read, or trained when it is not there (None: a stop signal
    came before it was)."""
    d = cfg.data
    if path.exists():
        tok = Tokenizer(path)
        log.info(f"prepare {lang}: tokenizer {path} exists ({tok.vocab_size} pieces)")
    else:
        check_writable(path.parent)  # before the time spent training
        log.info(f"prepare {lang}: training SentencePiece ({d.vocab_size} pieces) on {corpus}")
        tok = train_tokenizer(corpus, path, d.vocab_size, d.spm_model_type, d.spm_max_sentences,
                              d.spm_character_coverage, workers, sample_bytes=d.spm_sample_bytes, stop=stop)
        if tok is None:
            return None
    if tok.vocab_size != d.vocab_size:
        raise TokenizerError(f"{path} has {tok.vocab_size} pieces but data.vocab_size is "
                             f"{d.vocab_size}; delete it to retrain, or set data.vocab_size={tok.vocab_size}")
    return tok


def _extended_tokenizer(cfg: ExperimentConfig, lang: str, paths: Prepared, own: Tokenizer,
                        corpus: Path) -> Tokenizer | HFTokenizer:
    """``adapt.vocabulary=extend``: the source tokenizer extended with the pieces of ``own`` it lacks
    (``data.extend``), made unless it is there and current."""
    from itertools import islice

    from minimodel.data.extend import extend

    if not _extension_current(cfg, paths):
        try:
            source = load_prepared_tokenizer(cfg, cfg.source_lang)
        except TokenizerError as e:
            raise TokenizerError(f"prepare {lang}: adapt.vocabulary=extend extends the source language's tokenizer, "
                                 f"which is not there ({e}): prepare {cfg.source_lang} first") from e
        check_writable(Path(paths.tokenizer).parent)
        lines = islice((line for doc in iter_documents(corpus) for line in doc), EXTEND_LINES)
        record = extend(source, own, Path(paths.tokenizer), lines if paths.hf else ())
        if Path(paths.shards).exists():  # encoded with the tokenizer this one replaces
            import shutil

            shutil.rmtree(paths.shards)
        log.info(f"prepare {lang}: {source.path} ({record['kept']:,} pieces) extended with {record['new']:,} pieces of "
                 f"{own.path}" + (f" and {record['intermediate']:,} pieces on the way to them ({record['unreachable']:,} "
                                  f"not reached in the first {EXTEND_LINES:,} lines)" if paths.hf else "")
                 + f" -> {paths.tokenizer}")
    return HFTokenizer(paths.tokenizer, causal(cfg.model), cfg.runs_dir) if paths.hf else Tokenizer(paths.tokenizer)


def _stopped(lang: str, stop: Callable[[], str | None], kept: str) -> str:
    reason = stop() or "a stop request"
    log.warning(f"prepare {lang}: stopped on {reason} with {kept} saved; rerun the same command to go on from there")
    return reason


def load_source_tokenizer(cfg: ExperimentConfig, model: object | None = None, model_name: str = "",
                          trained_with: dict | None = None) -> AnyTokenizer:
    """The source language's tokenizer (SentencePiece from `prepare`, or a Hugging Face one), checked against
    ``model`` (a ``RobertaMLM``: vocabulary size and padding id) or, without one, against ``model:``, and
    against ``trained_with``, the tokenizer record (path, sha256) stored with the model's checkpoint: another
    tokenizer of the same size would silently feed the model the wrong ids."""
    tok = load_prepared_tokenizer(cfg, cfg.source_lang)
    expected = (trained_with or {}).get("sha256")
    if expected and tok.sha256 != expected:
        raise TokenizerError(
            f"tokenizer {tok.path} (sha256 {tok.sha256[:12]}) is not the one {model_name or 'the model'} was trained "
            f"with ({trained_with.get('path', '?')}, sha256 {expected[:12]}): restore that tokenizer, or point "
            f"data.prepared_dir at the prepared data the model was trained on")  # type: ignore[union-attr]
    if model is None:
        vocab, pad = cfg.model.vocab_size, cfg.model.pad_id
        has_vocab, pads = f"model.vocab_size is {vocab}", f"model.pad_id is {pad}"
    else:
        mcfg = model.cfg  # type: ignore[attr-defined]
        vocab, pad = mcfg.vocab_size, mcfg.pad_id
        has_vocab = f"the model {model_name} has a vocabulary of {vocab}"
        pads = f"the model {model_name} pads with id {pad}"
    surplus = padded_rows(tok.vocab_size, vocab) if model is not None else (0 if tok.vocab_size == vocab else -1)
    if surplus < 0:
        hint = ("; a public model needs its own tokenizer: set data.source_tokenizer to its directory or hub id"
                if isinstance(tok, Tokenizer) and model is not None else "")
        padding = (f" (a model's matrix may exceed its tokenizer only by alignment padding: rows a multiple of "
                   f"{PAD_ROWS_MULTIPLE}, at most {PAD_ROWS_MAX:,} past the pieces)" if model is not None else "")
        raise TokenizerError(f"tokenizer {tok.path} has {tok.vocab_size} pieces but {has_vocab}{padding}{hint}")
    if surplus and cfg.data.source_tokenizer and cfg.data.source_tokenizer != cfg.bridge.source:
        raise TokenizerError(f"tokenizer {tok.path} (data.source_tokenizer) has {tok.vocab_size} pieces but {has_vocab}:"
                             f" a matrix padded past its tokenizer is read only with the model's own tokenizer "
                             f"(leave data.source_tokenizer unset), since another tokenizer of nearly its size would "
                             f"feed the model the wrong ids")
    if surplus:
        log.warning(f"the model {model_name}'s embedding matrix has {vocab:,} rows for the {tok.vocab_size:,} pieces "
                    f"of its own tokenizer {tok.path}: the last {surplus:,} are taken as alignment padding, which no "
                    f"token reads")
    if tok.specials.pad != pad:
        raise TokenizerError(f"tokenizer {tok.path} pads with id {tok.specials.pad} but {pads}")
    return tok
