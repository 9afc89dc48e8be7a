"""``adapt.vocabulary: extend``: the target language's tokenizer as the source tokenizer plus the target pieces it lacks.

Every source piece keeps its id (so its embedding row, which step 2 keeps frozen); the new pieces get the ids after
the source's. Two kinds of source tokenizer are extended, each in its own format, so that the result is a tokenizer of
the same kind (``data.tokenizer``: a ``Tokenizer`` or an ``HFTokenizer``) and exports as one:

- **a SentencePiece model** (the source language's ``spm.model`` that ``prepare`` trains): the target model's normal
  pieces the source lacks are appended to the source's model with their own scores. Unigram: segmentation stays a
  best path over one vocabulary, now with the target's pieces, whose scores are log-probabilities of the same scale.
  BPE: they are appended below every source piece (SentencePiece's BPE merges the highest-scored pair first), so the
  source's merges come first and the new ones apply to what they leave.
- **a Hugging Face byte-level BPE** (GPT-2, RoBERTa, SmolLM2, Qwen, Llama 3): each new piece is written in the
  byte-level alphabet ("▁maison" -> "Ġmaison") and reached by merges appended after the source's, learned on target
  text (``learn_merges``): BPE's training continued from the source's own segmentation of the text's words, each step
  joining the most frequent adjacent pair whose result is a target piece or a prefix of one (``Ġma`` + ``is``, then
  ``Ġmais`` + ``on``), so that the merges fire where the target's words have them (the source segments a piece's text
  alone and inside a longer word differently, so merges made from the piece alone would often never fire). A prefix
  that never grew into a target piece is dropped (``needed``); one that did is a vocabulary entry too
  (``intermediate``); a target piece the text never built is left out (``unreachable``). Because the new merges rank
  after all of the source's, text is first segmented exactly as the source does; the new merges then only join
  neighbouring source pieces into new ones.

  Added tokens (``tokenizer.add_tokens``) were the other way: they are matched in the raw text before the model runs,
  with no regard to word boundaries ("ation" added would cut English "nation" into "n" + "ation"), and thousands of
  them slow every encoding; merges keep the source's segmentation first and the vocabulary one BPE model.

Other tokenizers (WordPiece, a Hugging Face Unigram or a SentencePiece-style BPE with byte fallback) are refused by
name."""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from minimodel.data.tokenizer import WORD_START, HFTokenizer, Tokenizer, TokenizerError, _bytes_to_unicode
from minimodel.store import atomic

EXTENSION = "extension.json"
"""Beside an extended tokenizer: what it was made from (source and target sha256) and its counts."""

NORMAL = 1  # SentencePiece's piece type of an ordinary piece (not control, unknown, user-defined or byte)


def extend_sentencepiece(source: Tokenizer, target: Tokenizer, out: Path) -> dict[str, Any]:
    """Write to ``out`` the source SentencePiece model with the target model's normal pieces it lacks appended;
    returns the counts (``kept``, ``new``)."""
    from sentencepiece import sentencepiece_model_pb2

    src, trg = sentencepiece_model_pb2.ModelProto(), sentencepiece_model_pb2.ModelProto()
    src.ParseFromString(source.sp.serialized_model_proto())
    trg.ParseFromString(target.sp.serialized_model_proto())
    if src.trainer_spec.model_type != trg.trainer_spec.model_type:
        raise TokenizerError(f"adapt.vocabulary=extend: {source.path} and {target.path} are SentencePiece models of "
                             f"different types ({src.trainer_spec.model_type} and {trg.trainer_spec.model_type})")
    have = {p.piece for p in src.pieces}
    bpe = src.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE
    floor = min((p.score for p in src.pieces if p.type == NORMAL), default=0.0)
    kept, new = len(src.pieces), 0
    for p in trg.pieces:
        if p.type != NORMAL or p.piece in have:
            continue
        new += 1
        piece = src.pieces.add()
        piece.piece, piece.type = p.piece, NORMAL
        piece.score = floor - new if bpe else p.score  # BPE: after every source merge, in the target's order
        have.add(p.piece)
    src.trainer_spec.vocab_size = len(src.pieces)
    atomic.write_bytes(out, src.SerializeToString())
    return {"kept": kept, "new": new, "intermediate": 0, "unreachable": 0}


def _merges_format(merges: list) -> bool:
    """Whether a ``tokenizers`` BPE model lists its merges as pairs (newer) rather than "a b" strings."""
    return bool(merges) and isinstance(merges[0], list)


def extend_byte_level(source: HFTokenizer, target: Tokenizer, out: Path, texts: Iterable[str],
                      min_count: int = 2) -> dict[str, Any]:
    """Write to the directory ``out`` (a Hugging Face tokenizer directory) the source byte-level BPE with the target
    pieces it lacks, reached by merges learned on ``texts`` (target-language text; the module docstring); returns the
    counts."""
    spec = json.loads(source.hf.backend_tokenizer.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or source.convention != "byte-level":
        raise TokenizerError(f"adapt.vocabulary=extend: {source.path} is a {model.get('type', '?')} tokenizer with "
                             f"{source.convention} pieces; only SentencePiece models and byte-level BPE tokenizers "
                             f"(GPT-2, RoBERTa, SmolLM2, Qwen, Llama 3) are extended")
    vocab: dict[str, int] = dict(model["vocab"])
    kept = source.vocab_size
    # an added token outside the model's vocabulary (RoBERTa's <mask>) is numbered after it when a tokenizer is read:
    # it goes into the vocabulary at its id, so that the new pieces come after it and it keeps its id
    for t in spec.get("added_tokens", []):
        vocab.setdefault(t["content"], t["id"])
    ids = list(vocab.values())
    if max(ids, default=-1) != kept - 1 or len(set(ids)) != kept:
        raise TokenizerError(f"adapt.vocabulary=extend: {source.path} does not number its {kept} pieces 0..{kept - 1} "
                             f"(ids up to {max(ids, default=-1)}): the new pieces would not follow them")
    pairs = _merges_format(model.get("merges", []))
    merges = [tuple(m) if pairs else tuple(m.split(" ", 1)) for m in model.get("merges", [])]
    to_bytes = _bytes_to_unicode()
    wanted = set()
    for piece, kind in zip(target.pieces(), _piece_types(target)):
        spelled = "".join(to_bytes[b] for b in piece.replace(WORD_START, " ").encode("utf-8"))
        if kind == NORMAL and spelled not in vocab:
            wanted.add(spelled)
    new_merges = needed(learn_merges(_words(source, texts), wanted, min_count), wanted)
    next_id = kept
    for a, b in new_merges:
        if a + b not in vocab:
            vocab[a + b] = next_id
            next_id += 1
    added = [t for t, i in vocab.items() if i >= kept]
    made = sum(t in wanted for t in added)
    counts = {"kept": kept, "new": made, "intermediate": len(added) - made, "unreachable": len(wanted) - made,
              "merges": len(new_merges)}
    model["vocab"] = vocab
    model["merges"] = [list(m) if pairs else " ".join(m) for m in [*merges, *new_merges]]
    from tokenizers import Tokenizer as RustTokenizer

    _save_hf(source, RustTokenizer.from_str(json.dumps(spec)), out)
    return counts


def _words(source: HFTokenizer, texts: Iterable[str]) -> Counter[tuple[str, ...]]:
    """The source tokenizer's segmentation of every word (pre-token) of ``texts``, with its count."""
    backend = source._backend
    counts: Counter[str] = Counter()
    for line in texts:
        text = backend.normalizer.normalize_str(line) if backend.normalizer is not None else line
        words = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer is not None else [(text, None)]
        counts.update(w for w, _ in words)
    out: Counter[tuple[str, ...]] = Counter()
    for w, c in counts.items():
        out[tuple(t.value for t in backend.model.tokenize(w))] += c
    return out


def learn_merges(words: Counter[tuple[str, ...]], wanted: set[str], min_count: int = 2) -> list[tuple[str, str]]:
    """BPE's training continued from the source's segmentation of the target text (``words``: segmentation -> count),
    restricted to merges whose result is a wanted piece or a prefix of one: each step joins the most frequent such
    adjacent pair (ties: the pair first in string order) everywhere, until none occurs ``min_count`` times. The
    merges in the order learned, which is the order BPE applies them in, so the segmentations here are what the
    extended tokenizer gives."""
    prefixes = {w[:k] for w in wanted for k in range(2, len(w) + 1)}
    seqs = [list(w) for w in words]
    freq = list(words.values())
    count: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, seq in enumerate(seqs):
        for pair in zip(seq, seq[1:]):
            count[pair] += freq[i]
            where.setdefault(pair, set()).add(i)
    heap = [(-c, pair) for pair, c in count.items() if pair[0] + pair[1] in prefixes]
    heapq.heapify(heap)
    out: list[tuple[str, str]] = []
    while heap:
        c, pair = heapq.heappop(heap)
        if -c != count.get(pair, 0):  # stale: pushed again with its new count when that changed
            continue
        if -c < min_count:
            break
        out.append(pair)
        joined = pair[0] + pair[1]
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop(pair, ())):
            seq, f = seqs[i], freq[i]
            for p in zip(seq, seq[1:]):
                count[p] -= f
                changed.add(p)
            merged, k = [], 0
            while k < len(seq):
                if k + 1 < len(seq) and seq[k] == pair[0] and seq[k + 1] == pair[1]:
                    merged.append(joined)
                    k += 2
                else:
                    merged.append(seq[k])
                    k += 1
            seqs[i] = merged
            for p in zip(merged, merged[1:]):
                count[p] += f
                where.setdefault(p, set()).add(i)
                changed.add(p)
        count.pop(pair, None)
        for p in changed:
            if p != pair and count.get(p, 0) > 0 and p[0] + p[1] in prefixes:
                heapq.heappush(heap, (-count[p], p))
    return out


def needed(merges: list[tuple[str, str]], wanted: set[str]) -> list[tuple[str, str]]:
    """``merges`` without those that make neither a wanted piece nor a part of a later kept merge (a prefix that never
    grew into a target piece), in their order."""
    keep = list(merges)
    while True:
        used = {part for a, b in keep for part in (a, b)}
        kept = [(a, b) for a, b in keep if a + b in wanted or a + b in used]
        if len(kept) == len(keep):
            return kept
        keep = kept


def _piece_types(tok: Tokenizer) -> list[int]:
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tok.sp.serialized_model_proto())
    return [p.type for p in proto.pieces]


def _save_hf(source: HFTokenizer, rust: Any, out: Path) -> None:
    """The extended backend as a Hugging Face tokenizer directory (``tokenizer.json`` and its config, the source's
    special tokens), written whole or not at all."""
    from transformers import PreTrainedTokenizerFast

    special = {f"{role}_token": getattr(source.hf, f"{role}_token", None)
               for role in ("bos", "eos", "unk", "pad", "mask", "sep", "cls")}
    fast = PreTrainedTokenizerFast(tokenizer_object=rust, **{k: v for k, v in special.items() if v is not None},
                                   model_max_length=getattr(source.hf, "model_max_length", None) or 10**30)
    with atomic.replacing_dir(out, replace=out.exists()) as d:
        fast.save_pretrained(str(d))


def extend(source: Tokenizer | HFTokenizer, target: Tokenizer, out: Path, texts: Iterable[str] = ()) -> dict[str, Any]:
    """The extended tokenizer of ``source`` and ``target`` written at ``out`` (a ``.model`` file for a SentencePiece
    source, a directory for a Hugging Face one, whose merges are learned on ``texts``) with ``extension.json`` beside
    it; returns that record."""
    if isinstance(source, HFTokenizer):
        counts = extend_byte_level(source, target, out, texts)
    else:
        counts = extend_sentencepiece(source, target, out)
    record = {"source": str(source.path), "source_sha256": source.sha256, "target": str(target.path),
              "target_sha256": target.sha256, **counts}
    atomic.write_json(extension_record(out), record)
    return record


def extension_record(tokenizer: str | Path) -> Path:
    """``extension.json`` of an extended tokenizer: beside it (its ``.model`` file or its directory)."""
    return Path(tokenizer).parent / EXTENSION


def read_extension(tokenizer: str | Path) -> dict[str, Any] | None:
    try:
        return atomic.loads(extension_record(tokenizer).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
