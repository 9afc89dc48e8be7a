"""Corpus -> token shards (memory-mapped numpy arrays), resumable and never re-encoding a finished shard.

The token stream of a corpus is every line followed by ``</s>``, with one more ``</s>`` after each
document, so a document boundary is two ``</s>`` in a row (fairseq's binarised RoBERTa data, where
the empty line between documents becomes a lone ``</s>``).

``{out_dir}/manifest.json`` records the corpus and tokenizer the shards were made from and every
finished shard; a shard is written to a temporary file and renamed, then the manifest is rewritten
the same way, so an interrupted run leaves only finished shards behind and the next run goes on
from there.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from minimodel import atomic
from minimodel.data.corpus import iter_documents
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.errors import UserError

MANIFEST = "manifest.json"


class ShardError(UserError, ValueError):
    """Prepared data that cannot be used, with a message naming the file."""


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def check_writable(directory: Path) -> None:
    """Create ``directory`` if needed and write a probe file there; ShardError naming it when that fails."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise ShardError(f"cannot write to {directory} ({e.strerror or e}): the prepared data goes there; make it "
                         f"writable or set data.prepared_dir to a writable directory") from e


def _chunks(corpus: Path, shard_bytes: int) -> Iterator[tuple[list[list[str]], int]]:
    """Groups of whole documents holding about ``shard_bytes`` of text each, with their byte size."""
    chunk: list[list[str]] = []
    size = 0
    for doc in iter_documents(corpus):
        chunk.append(doc)
        size += sum(len(line.encode("utf-8")) + 1 for line in doc) + 1
        if size >= shard_bytes:
            yield chunk, size
            chunk, size = [], 0
    if chunk:
        yield chunk, size


def encode_documents(docs: list[list[str]], tok: AnyTokenizer, threads: int) -> np.ndarray:
    lines = [line for doc in docs for line in doc]
    ids = tok.encode(lines, threads=threads)
    eos = tok.specials.eos
    out: list[int] = []
    k = 0
    for doc in docs:
        for _ in doc:
            out.extend(ids[k])
            out.append(eos)
            k += 1
        out.append(eos)  # document separator
    return np.asarray(out, dtype=token_dtype(tok.vocab_size))


def _write_manifest(out_dir: Path, manifest: dict) -> None:
    atomic.write_json(out_dir / MANIFEST, manifest)


def read_manifest(out_dir: Path) -> dict | None:
    path = Path(out_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardError(f"{path} is corrupt ({e}); delete {out_dir} and run `minimodel prepare` again") from e


def _shard_ok(out_dir: Path, entry: dict) -> bool:
    path = out_dir / entry["file"]
    if not path.is_file():
        return False
    try:
        arr = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError):
        return False
    return arr.ndim == 1 and len(arr) == entry["tokens"]


def encode_corpus(
    corpus: Path,
    tok: AnyTokenizer,
    out_dir: Path,
    shard_bytes: int = 64 * 2**20,
    threads: int = 2,
    progress: bool = True,
) -> dict:
    """Encode ``corpus`` into ``out_dir``; returns the manifest. Safe to interrupt and call again."""
    source = {"corpus": str(corpus), "corpus_bytes": corpus.stat().st_size if corpus.exists() else -1,
              "tokenizer_sha256": tok.sha256, "shard_bytes": shard_bytes,
              "dtype": token_dtype(tok.vocab_size).name, "vocab_size": tok.vocab_size}
    manifest = read_manifest(out_dir)
    if manifest is not None:
        differs = [k for k, v in source.items() if k != "corpus" and manifest.get(k) != v]
        if differs:
            raise ShardError(
                f"{out_dir} holds shards made from a different corpus or tokenizer ({', '.join(differs)} differ); "
                f"nothing was overwritten: delete {out_dir} or set data.prepared_dir elsewhere"
            )
        if manifest.get("complete") and all(_shard_ok(out_dir, e) for e in manifest["shards"]):
            return manifest
    else:
        manifest = {**source, "shards": [], "complete": False}
    check_writable(out_dir)  # before encoding, not after the first shard's worth of work
    done = {e["index"]: e for e in manifest["shards"] if _shard_ok(out_dir, e)}
    manifest["shards"] = [done[i] for i in sorted(done)]
    manifest["complete"] = False
    total = corpus.stat().st_size if corpus.suffix != ".xz" else None
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"encode {corpus.name}", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    try:
        for index, (docs, size) in enumerate(_chunks(corpus, shard_bytes)):
            bar.update(size)
            if index in done:
                continue
            arr = encode_documents(docs, tok, threads)
            name = f"shard_{index:05d}.npy"
            atomic.write_with(out_dir / name, lambda f, a=arr: np.save(f, a), needed=arr.nbytes + 128)
            done[index] = {"index": index, "file": name, "tokens": int(len(arr)), "documents": len(docs)}
            manifest["shards"] = [done[i] for i in sorted(done)]
            _write_manifest(out_dir, manifest)
    except OSError as e:
        raise ShardError(f"writing shards to {out_dir} failed: {e}; finished shards are kept, rerun to go on") from e
    finally:
        bar.close()
    manifest["complete"] = True
    _write_manifest(out_dir, manifest)
    return manifest


@dataclass
class TokenStream:
    """The concatenated shards of one prepared corpus, memory-mapped lazily (safe to pickle to workers)."""

    out_dir: Path
    files: list[str]
    lengths: list[int]
    vocab_size: int
    tokenizer_sha256: str = ""

    @classmethod
    def open(cls, out_dir: str | Path) -> TokenStream:
        out_dir = Path(out_dir)
        manifest = read_manifest(out_dir)
        if manifest is None:
            raise ShardError(f"no prepared shards in {out_dir} (run `minimodel prepare` first)")
        if not manifest.get("complete"):
            raise ShardError(f"shards in {out_dir} are incomplete (an interrupted `minimodel prepare`? run it again)")
        for e in manifest["shards"]:
            if not _shard_ok(out_dir, e):
                raise ShardError(f"shard {out_dir / e['file']} is missing or corrupt (expected {e['tokens']} tokens); "
                                 f"run `minimodel prepare` again to re-encode it")
        return cls(out_dir, [e["file"] for e in manifest["shards"]], [e["tokens"] for e in manifest["shards"]],
                   int(manifest["vocab_size"]), str(manifest.get("tokenizer_sha256", "")))

    def __post_init__(self) -> None:
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self._arrays: list[np.ndarray] | None = None

    def __getstate__(self) -> dict:
        return {"out_dir": self.out_dir, "files": self.files, "lengths": self.lengths, "vocab_size": self.vocab_size,
                "tokenizer_sha256": self.tokenizer_sha256}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def arrays(self) -> list[np.ndarray]:
        if self._arrays is None:
            self._arrays = [np.load(self.out_dir / f, mmap_mode="r") for f in self.files]
        return self._arrays

    def slice(self, start: int, end: int) -> np.ndarray:
        """Tokens [start, end) as int64, across shard boundaries."""
        parts = []
        i = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while start < end:
            local = start - int(self.offsets[i])
            take = min(end - start, self.lengths[i] - local)
            parts.append(self.arrays[i][local:local + take])
            start += take
            i += 1
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
