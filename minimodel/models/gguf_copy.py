"""A GGUF source converted once (issue 55 part 1): transformers dequantises a GGUF file on every load (12-16 s for
SmolLM2-135M on a 2-core CPU, and every stage of ``minimodel run`` loads it again), so the first load writes the model,
and its tokenizer where the file carries one, as a Hugging Face directory beside the runs
(``{runs_dir}/.sources/``), keyed by the file's content; every later load, in any stage or process, reads that copy.
The boundary's checks (``minimodel.models.outside``) run on the way in, as for any outside model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from minimodel.errors import ConfigError, WriteError
from minimodel.log import get_logger, quiet_gguf
from minimodel.models.gguf import GGUFHeader, gguf_metadata, gguf_summary
from minimodel.models.hub import check_hub, first_line
from minimodel.models.outside import (
    CONFIG,
    FLOAT32,
    GGUF_ARCHITECTURES,
    GGUF_TOKENIZER,
    LOAD_COPIES,
    SAFE_WEIGHTS,
    Source,
    _config_json,
    _reads,
    available_memory,
    check_architecture,
    check_sizes,
    gguf_checked,
    load_weights,
    missing_weights,
    read_config,
    source,
    transformers,
)

log = get_logger(__name__)

SOURCES = ".sources"
"""Beside the runs (``{runs_dir}/.sources/``): the GGUF sources converted once to Hugging Face directories."""
MARKER = "minimodel-source.json"
"""In a converted copy: what it was made from (the GGUF file's path, size, mtime, sha256), by which transformers
version, and the size of each file it holds; a copy without a readable marker that matches is never read."""


def local_source(src: Source, runs_dir: str | Path, model_types: tuple[str, ...], family: str) -> Source:
    """``src`` as a family's ``from_hf`` reads it: a GGUF file, given the experiment's ``runs_dir``, its architecture
    checked from the header (``model_types``) and then its converted copy (``gguf_copy``); anything else as it is."""
    if src.gguf is None or not runs_dir:
        return src
    header = gguf_checked(src.gguf)
    check_architecture(src.gguf, header, model_types, _reads(model_types, family))
    return gguf_copy(src, header, runs_dir)


def load_tokenizer(ref: str, runs_dir: str | Path = "") -> tuple[Any, Source]:
    """transformers' tokenizer of an outside model (a directory, a hub id, a GGUF file, which carries its tokenizer),
    and its ``Source``. A GGUF file's architecture is checked from its header first; given ``runs_dir``, its tokenizer
    is read from the file's converted copy (``gguf_copy``, made here if need be), else converted once per process
    (``gguf_tokenizer``). Failures: ``TokenizerError`` by the caller (``data/tokenizer.py``), which knows what it
    expected."""
    from transformers import AutoTokenizer

    src = source(ref)
    if src.gguf is not None:
        header = gguf_metadata(src.gguf)  # a damaged or crafted header: named here, before transformers decodes it
        check_architecture(src.gguf, header, GGUF_ARCHITECTURES,
                           f"minimodel reads GGUF files of the architectures {list(GGUF_ARCHITECTURES)}")
        if runs_dir:
            copy = gguf_copy(src, header, runs_dir)
            if copy.gguf is None and _marker(Path(copy.where)).get("tokenizer"):
                return AutoTokenizer.from_pretrained(copy.where), src
        return gguf_tokenizer(AutoTokenizer, src.where, src.options), src
    config = Path(src.where) / CONFIG
    if config.is_file():  # AutoTokenizer may build the model's config from it (a tokenizer_config.json without a class)
        check_sizes(_config_json(config, model=False), str(config))
    elif not src.local:
        check_hub(src.where, "tokenizer_config.json")
    return AutoTokenizer.from_pretrained(src.where), src


# A GGUF file's tokenizer, converted once per process: transformers decodes the file's whole vocabulary and merges
# into a fast tokenizer on every load (5-8 s for SmolLM2's 49,152 pieces), and every stage of `minimodel run` loads
# the source tokenizer again. Keyed by the file's path, size and modification time: a file replaced is converted anew.
_GGUF_TOKENIZERS: dict[tuple[str, int, int], Any] = {}


def gguf_tokenizer(auto: Any, where: str, options: dict[str, Any]) -> Any:
    path = (Path(where) / options["gguf_file"]).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _GGUF_TOKENIZERS:
        quiet_gguf()  # --no-progress: not the conversion's bar either
        _GGUF_TOKENIZERS[key] = auto.from_pretrained(where, **options)
    return _GGUF_TOKENIZERS[key]


# ------------------------------------------------------------------------------------------ a GGUF file, converted once


def _marker(copy: Path) -> dict[str, Any]:
    """The marker of a converted copy ({} where it has none or it cannot be read)."""
    try:
        marker = json.loads((copy / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def copy_current(copy: Path, made_from: dict[str, Any]) -> bool:
    """Whether ``copy`` is a finished conversion of the file ``made_from`` describes (its sha256) by this transformers
    version, every file its marker lists there at the size it was written (a copy cut short, emptied or edited is
    converted again, never read)."""
    marker = _marker(copy)
    files = marker.get("files")
    if not isinstance(files, dict) or CONFIG not in files or any(
            marker.get(k) != made_from[k] for k in ("sha256", "transformers")):
        return False
    try:
        return all(isinstance(n, int) and (copy / name).stat().st_size == n for name, n in files.items())
    except (OSError, ValueError):
        return False


def gguf_copy(src: Source, header: GGUFHeader, runs_dir: str | Path) -> Source:
    """The GGUF source ``src`` (its header checked: ``check_architecture``) as a Hugging Face directory converted
    once: ``{runs_dir}/.sources/<file stem>-<sha256[:16]>/``, keyed by the file's content (its digest cached by path,
    size and mtime in ``{runs_dir}/.file-digests.json``: hashed once). A copy that is there and current
    (``copy_current``) is read as it is; otherwise the file is converted (``_convert``), written whole or not at all,
    and an earlier copy of the same file (another content) is removed. The log says which. The ``Source`` returned
    keeps ``src.name``: messages and the experiment's provenance name the GGUF file, not the copy. Where the copy
    cannot be written (a full disk, a read-only runs directory), a warning says so and ``src`` itself is returned."""
    from minimodel.store.provenance import file_digest

    tf = transformers()
    gguf = Path(src.where, src.options["gguf_file"]).resolve()
    st = gguf.stat()
    made_from = {"source": str(gguf), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                 "sha256": file_digest(gguf, runs_dir), "transformers": tf.__version__}
    copy = Path(runs_dir) / SOURCES / f"{gguf.stem}-{made_from['sha256'][:16]}"
    if copy_current(copy, made_from):
        log.info(f"{src.name}: from the converted copy {copy}")
    else:
        try:
            _convert(src, header, copy, made_from)
        except WriteError as e:  # a full disk, a read-only runs directory: the file itself is read, as without one
            log.warning(f"{src.name}: its converted copy cannot be written ({e}); read from the GGUF file itself")
            return src
        log.info(f"{src.name}: converted once to {copy}")
        for old in copy.parent.glob(f"{gguf.stem}-*"):  # the copy of this file as it was before
            if old != copy and _marker(old).get("source") == str(gguf):
                shutil.rmtree(old, ignore_errors=True)
    out = Source(src.name, str(copy))
    out.config_file = str(copy / CONFIG)
    return out


def _convert(src: Source, header: GGUFHeader, copy: Path, made_from: dict[str, Any]) -> None:
    """Write ``copy``: the GGUF file's model, dequantised to float32 (transformers' load, through ``read_config`` and
    ``load_weights``: their checks and errors), as ``config.json`` and ``model.safetensors``, and its tokenizer where
    the file carries one (``save_pretrained``), with the marker (``MARKER``) last; in a temporary directory renamed
    into place, so that a conversion stopped halfway leaves no copy. Refused before anything is decoded when its
    float32 tensors would not fit the memory available."""
    import torch
    from safetensors.torch import save_model

    from minimodel.store import atomic

    need, have = LOAD_COPIES * FLOAT32 * header.elements, available_memory()
    if need > have:
        raise ConfigError(f"{src.gguf}: {header.elements:,} weights: converting them to float32 takes about "
                          f"{need / 1e9:,.1f} GB ({LOAD_COPIES} copies) and {have / 1e9:,.1f} GB of memory is "
                          f"available: use a smaller model or a machine with more memory")
    tf = transformers()
    log.info(f"{src.name}: {gguf_summary(src.where, src.options['gguf_file'])}; dequantised to float32 once")
    hf_config = read_config(src, GGUF_ARCHITECTURES, "decoder")
    model, info = load_weights(tf.AutoModelForCausalLM, src, hf_config, build=tf.AutoModelForCausalLM.from_config,
                               dtype=torch.float32)
    missing_weights(info, src, {"lm_head.weight"} if getattr(hf_config, "tie_word_embeddings", False) else set(),
                    "*ForCausalLM")
    tokenizer = None
    if GGUF_TOKENIZER in header.keys:
        try:
            tokenizer = gguf_tokenizer(tf.AutoTokenizer, src.where, src.options)
        except Exception as e:  # converted without it: a load of the tokenizer reads the GGUF file and says why
            log.warning(f"{src.name}: its tokenizer is not converted ({first_line(e)})")
    vars(model.config).pop("quantization_config", None)  # transformers' mark of a GGUF load: the copy is float32
    try:
        with atomic.replacing_dir(copy, replace=True) as tmp:
            # tensors and config as save_pretrained writes them (it refuses a model loaded from a GGUF file); a tied
            # output projection is stored once, as transformers stores it
            model.config.save_pretrained(tmp)
            save_model(model, str(tmp / SAFE_WEIGHTS[0]), metadata={"format": "pt"})
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            files = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
            atomic.write_json(tmp / MARKER, {**made_from, "tokenizer": tokenizer is not None, "files": files})
    except WriteError:  # another process (a rank of the same run) converted it meanwhile
        if not copy_current(copy, made_from):
            raise
