"""Prepared data: token shards (memory-mapped numpy arrays) and their manifest, and reading them as one token
stream (``TokenStream``); ``data.encode`` writes them.

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
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minimodel.errors import UserError
from minimodel.store import atomic

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


def write_manifest(out_dir: Path, manifest: dict) -> None:
    atomic.write_json(out_dir / MANIFEST, manifest)


def read_manifest(out_dir: Path) -> dict | None:
    path = Path(out_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        return atomic.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardError(f"{path} is corrupt ({e}); delete {out_dir} and run `minimodel prepare` again") from e


def file_digest(path: Path) -> dict:
    """What a manifest entry records of a shard file to check it later: its size and sha256."""
    return {"bytes": path.stat().st_size, "sha256": atomic.file_sha256(path)}


_VERIFIED: set[tuple[str, int, int]] = set()  # (path, size, mtime) of the shards this process has hashed


def shard_damage(out_dir: Path, entry: dict) -> str:
    """Why the shard of ``entry`` does not hold what the manifest recorded ("" when it does): its sha256, checked
    once per process and file (a read of the whole shard: about 1.5 GB/s here, so CC-100 English's 300 GB add a few
    minutes to a pretraining's start); shards written before checksums were recorded are not checked."""
    path = Path(out_dir) / entry["file"]
    if "sha256" not in entry:
        return ""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _VERIFIED:
        return ""
    if atomic.file_sha256(path) != entry["sha256"]:
        return f"its sha256 differs from the one {Path(out_dir) / MANIFEST} recorded (the bytes changed since it was written)"
    _VERIFIED.add(key)
    return ""


def shard_ok(out_dir: Path, entry: dict) -> bool:
    """Whether the shard of manifest ``entry`` is in ``out_dir``, whole (a 1-d array of its recorded length and, where
    recorded, size): cheap, no read of the tokens (``shard_damage`` checks the bytes)."""
    path = out_dir / entry["file"]
    if not path.is_file():
        return False
    if "bytes" in entry and path.stat().st_size != entry["bytes"]:
        return False
    try:
        arr = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError):
        return False
    return arr.ndim == 1 and len(arr) == entry["tokens"]


def train_blocks(n_blocks: int, val_blocks: int, fraction: float = 1.0) -> range:
    """The training blocks of a token stream cut into ``n_blocks`` MLM blocks: those before the last ``val_blocks``
    (the validation split), their first ``fraction`` share (a stage that trains on part of the corpus)."""
    train = range(n_blocks - val_blocks)
    return train[: max(1, round(fraction * len(train)))]


def check_blocks(shard_dir: Path, n_blocks: int, val_blocks: int, seq_len: int) -> None:
    """A ShardError when the corpus of ``shard_dir`` gives too few MLM blocks for its validation split."""
    if n_blocks < 2 * val_blocks or n_blocks < 2:
        raise ShardError(
            f"{shard_dir}: the corpus gives only {n_blocks} blocks of {seq_len} tokens, not enough for "
            f"{val_blocks} validation blocks and at least as many training blocks; "
            f"use a larger corpus or lower data.val_blocks / data.seq_len")


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
            if not shard_ok(out_dir, e):
                raise ShardError(f"shard {out_dir / e['file']} is missing or corrupt (expected {e['tokens']} tokens); "
                                 f"run `minimodel prepare` again to re-encode it")
            damage = shard_damage(out_dir, e)
            if damage:
                raise ShardError(f"shard {out_dir / e['file']} is damaged: {damage}; delete it and run `minimodel "
                                 f"prepare` again to re-encode it (nothing else is redone)")
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
