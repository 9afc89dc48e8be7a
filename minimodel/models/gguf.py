"""GGUF sources: a model shipped as one GGUF file (llama.cpp's format, often quantised) read through transformers'
GGUF support, model and tokenizer both. ``hf_source`` turns a source (``bridge.source``, ``data.source_tokenizer``)
into what ``from_pretrained`` reads; nothing here imports torch."""

from __future__ import annotations

import importlib.util
import math
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minimodel.config.schema import GGUF_SUFFIX, is_gguf_name
from minimodel.errors import CheckpointError, ConfigError

GGUF = GGUF_SUFFIX


def hf_source(source: str) -> tuple[str, dict[str, Any]]:
    """Where ``from_pretrained`` reads ``source`` and the options that make it read a GGUF file: a ``.gguf`` file (the
    suffix in any case: ``model.GGUF`` too), or a directory holding one and no ``config.json`` -> (its directory,
    ``{"gguf_file": name}``); anything else (a model directory, a hub id) as it is. transformers' GGUF support needs the
    ``gguf`` package (``minimodel[gguf]``)."""
    path = Path(source)
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(p.name for p in path.iterdir() if is_gguf_name(p) and not p.is_dir())
        if len(found) > 1:
            raise CheckpointError(f"{source} holds several GGUF files ({', '.join(found)}): name the one to load "
                                  f"(e.g. {path / found[0]})")
        if found:
            path = path / found[0]
    if not is_gguf_name(path):
        return source, {}
    if not path.is_file():
        raise CheckpointError(f"{source}: no such GGUF file")
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"{source} is a GGUF file: loading it through transformers needs the packages "
                          f"{' and '.join(missing)}: pip install 'minimodel[gguf]' (make setup installs them)")
    return str(path.parent), {"gguf_file": path.name}


# GGUF metadata value types (the format's spec): the byte width of each fixed-size one; 8 = string, 9 = array
_WIDTHS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_INTS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}  # decoded: the sizes
_STRING, _ARRAY = 8, 9
MAX_DIMENSIONS = 8  # ggml tensors have at most 4; a larger count is a damaged or crafted header
MAX_NESTING = 4  # arrays of arrays of ...: deeper is a damaged or crafted header


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file's header says: its architecture, the storage type (``GGMLQuantizationType`` number) of each
    tensor, its integer metadata (``llama.block_count`` ...: the sizes a size check reads before any load), the
    names of all its metadata keys (``tokenizer.ggml.model``: it carries a tokenizer) and the number of values its
    tensors hold (what a load dequantises to float32)."""

    arch: str
    types: list[int]
    ints: dict[str, int]
    keys: frozenset[str] = frozenset()
    elements: int = 0


def gguf_metadata(path: Path) -> GGUFHeader:
    """Read a GGUF file's header, every count and length checked against the bytes the file has (a cut or crafted
    header is a ``CheckpointError`` naming the file, never a read of gigabytes or a ``struct.error``): the metadata
    is skipped over, not decoded, but for its integers and the architecture (``gguf.GGUFReader`` decodes every piece
    of the tokenizer's vocabulary and merges, 6 s for SmolLM2's, where this takes a fraction of a second)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            return _read_header(f, path, size)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None


class _Reader:
    """A GGUF header's reads, each length and count checked against the bytes left in the file."""

    def __init__(self, f: Any, path: Path, size: int) -> None:
        self.f, self.path, self.size = f, path, size

    def left(self) -> int:
        return self.size - self.f.tell()

    def short(self, what: str, n: int, unit: str = "bytes") -> CheckpointError:
        return CheckpointError(f"{self.path}: the GGUF header ends early: {what} of {n:,} {unit}, {self.left():,} "
                               f"bytes left (a truncated file?)")

    def crafted(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {what} (a damaged or altered GGUF file; fetch it again)")

    def read(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        data = self.f.read(n)
        if len(data) != n:
            raise CheckpointError(f"{self.path}: the GGUF header ends early (a truncated file?)")
        return struct.unpack(fmt, data)[0]

    def skip_bytes(self, n: int, what: str) -> None:
        if n > self.left():
            raise self.short(what, n)
        self.f.seek(n, 1)

    def string(self, what: str) -> bytes:
        n = self.read("<Q")
        if n > self.left():
            raise self.short(what, n)
        return self.f.read(n)

    def skip(self, kind: int, depth: int = 0) -> None:
        if kind == _STRING:
            self.skip_bytes(self.read("<Q"), "a string")
        elif kind == _ARRAY:
            item, count = self.read("<I"), self.read("<Q")
            if depth >= MAX_NESTING:
                raise self.crafted(f"arrays nested deeper than {MAX_NESTING}")
            if item in _WIDTHS:
                self.skip_bytes(_WIDTHS[item] * count, "an array")
            elif count > self.left():  # every item takes a byte at least
                raise self.short("an array", count, "items")
            else:
                for _ in range(count):
                    self.skip(item, depth + 1)
        elif kind in _WIDTHS:
            self.skip_bytes(_WIDTHS[kind], "a value")
        else:
            raise CheckpointError(f"{self.path}: unknown GGUF metadata type {kind}")


def _read_header(f: Any, path: Path, size: int) -> GGUFHeader:
    r = _Reader(f, path, size)
    if f.read(4) != b"GGUF":
        raise CheckpointError(f"{path}: not a GGUF file (no GGUF magic number)")
    version = r.read("<I")
    if version not in (2, 3):  # (version 1 counted in 32 bits; gguf's own reader refuses it too)
        raise CheckpointError(f"{path}: GGUF version {version}; versions 2 and 3 are read")
    tensors, fields = r.read("<Q"), r.read("<Q")
    if fields > r.left() or tensors > r.left():  # a field or tensor entry takes more than a byte
        raise r.crafted(f"the header counts {tensors:,} tensors and {fields:,} metadata fields in a file of "
                        f"{size:,} bytes")
    arch, ints, keys = "?", {}, set()
    for _ in range(fields):
        key, kind = r.string("a metadata key"), r.read("<I")
        name = key.decode("utf-8", "replace")
        keys.add(name)
        if name == "general.architecture" and kind == _STRING:
            arch = r.string("the architecture").decode("utf-8", "replace")
        elif kind in _INTS:
            ints[name] = int(r.read(_INTS[kind]))
        else:
            r.skip(kind)
    types, elements = [], 0
    for _ in range(tensors):
        r.string("a tensor name")
        dims = r.read("<I")
        if dims > MAX_DIMENSIONS:
            raise r.crafted(f"a tensor of {dims:,} dimensions")
        if 8 * dims > r.left():
            raise r.short("a tensor's dimensions", 8 * dims)
        elements += math.prod(r.read("<Q") for _ in range(dims))
        types.append(r.read("<I"))
        r.read("<Q")  # offset
    return GGUFHeader(arch, types, ints, frozenset(keys), elements)


def gguf_header(path: Path) -> tuple[str, list[int]]:
    """A GGUF file's architecture and the storage type of each tensor, read from its header alone (``gguf_metadata``)."""
    header = gguf_metadata(path)
    return header.arch, header.types


def gguf_summary(directory: str, name: str) -> str:
    """What a GGUF file holds, for the log: its architecture and the storage types of its tensors (a quantised file
    is dequantised on load, so what was lost to quantisation stays lost)."""
    from gguf import GGMLQuantizationType

    arch, types = gguf_header(Path(directory) / name)
    known = {int(t): t.name for t in GGMLQuantizationType}
    counts = Counter(known.get(t, str(t)) for t in types)
    listed = ", ".join(f"{n} {t}" for t, n in counts.most_common())
    return f"GGUF {name} (architecture {arch}; {len(types)} tensors: {listed})"
