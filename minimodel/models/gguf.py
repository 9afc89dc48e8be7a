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


def gguf_summary(directory: str, name: str) -> str:
    """What a GGUF file holds, for the log: its architecture and the storage types of its tensors (a quantised file
    is dequantised on load, so what was lost to quantisation stays lost)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(Path(directory) / name))
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else "?"
    types = Counter(t.tensor_type.name for t in reader.tensors)
    listed = ", ".join(f"{n} {t}" for t, n in types.most_common())
    return f"GGUF {name} (architecture {arch}; {len(reader.tensors)} tensors: {listed})"
