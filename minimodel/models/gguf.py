"""GGUF sources: a model shipped as one GGUF file (llama.cpp's format, often quantised) read through transformers'
GGUF support, model and tokenizer both. ``hf_source`` turns a source (``bridge.source``, ``data.source_tokenizer``)
into what ``from_pretrained`` reads; nothing here imports torch."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from typing import Any

from minimodel.errors import CheckpointError, ConfigError

GGUF = ".gguf"


def hf_source(source: str) -> tuple[str, dict[str, Any]]:
    """Where ``from_pretrained`` reads ``source`` and the options that make it read a GGUF file: a ``.gguf`` file, or a
    directory holding one and no ``config.json`` -> (its directory, ``{"gguf_file": name}``); anything else (a model
    directory, a hub id) as it is. transformers' GGUF support needs the ``gguf`` package (``minimodel[gguf]``)."""
    path = Path(source)
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(p.name for p in path.glob(f"*{GGUF}"))
        if len(found) > 1:
            raise CheckpointError(f"{source} holds several GGUF files ({', '.join(found)}): name the one to load "
                                  f"(e.g. {path / found[0]})")
        if found:
            path = path / found[0]
    if path.suffix != GGUF:
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
_STRING, _ARRAY = 8, 9


def gguf_header(path: Path) -> tuple[str, list[int]]:
    """A GGUF file's architecture and the storage type (``GGMLQuantizationType`` number) of each tensor, read from
    its header alone: the metadata is skipped over, not decoded (``gguf.GGUFReader`` decodes every piece of the
    tokenizer's vocabulary and merges, 6 s for SmolLM2's, where this takes a fraction of a second)."""
    import struct

    with open(path, "rb") as f:
        def read(fmt: str) -> Any:
            size = struct.calcsize(fmt)
            data = f.read(size)
            if len(data) != size:
                raise CheckpointError(f"{path}: the GGUF header ends early (a truncated file?)")
            return struct.unpack(fmt, data)[0]

        def string() -> bytes:
            return f.read(read("<Q"))

        def skip(kind: int) -> None:
            if kind == _STRING:
                f.seek(read("<Q"), 1)
            elif kind == _ARRAY:
                item, count = read("<I"), read("<Q")
                if item in _WIDTHS:
                    f.seek(_WIDTHS[item] * count, 1)
                else:
                    for _ in range(count):
                        skip(item)
            elif kind in _WIDTHS:
                f.seek(_WIDTHS[kind], 1)
            else:
                raise CheckpointError(f"{path}: unknown GGUF metadata type {kind}")

        if f.read(4) != b"GGUF":
            raise CheckpointError(f"{path}: not a GGUF file (no GGUF magic number)")
        version = read("<I")
        if version not in (2, 3):  # (version 1 counted in 32 bits; gguf's own reader refuses it too)
            raise CheckpointError(f"{path}: GGUF version {version}; versions 2 and 3 are read")
        tensors, fields = read("<Q"), read("<Q")
        arch = "?"
        for _ in range(fields):
            key, kind = string(), read("<I")
            if key == b"general.architecture" and kind == _STRING:
                arch = string().decode()
            else:
                skip(kind)
        types = []
        for _ in range(tensors):
            string()  # name
            f.seek(8 * read("<I"), 1)  # its dimensions
            types.append(read("<I"))
            read("<Q")  # offset
    return arch, types


def gguf_summary(directory: str, name: str) -> str:
    """What a GGUF file holds, for the log: its architecture and the storage types of its tensors (a quantised file
    is dequantised on load, so what was lost to quantisation stays lost)."""
    from gguf import GGMLQuantizationType

    arch, types = gguf_header(Path(directory) / name)
    known = {int(t): t.name for t in GGMLQuantizationType}
    counts = Counter(known.get(t, str(t)) for t in types)
    listed = ", ".join(f"{n} {t}" for t, n in counts.most_common())
    return f"GGUF {name} (architecture {arch}; {len(types)} tensors: {listed})"
