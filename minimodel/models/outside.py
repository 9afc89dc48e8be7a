"""The one door for models minimodel did not write: a Hugging Face directory or hub id (its ``config.json``, its
``model.safetensors`` or plain-data ``pytorch_model.bin``), a GGUF file, and their tokenizers, for both families.

Both families' ``from_hf`` (``hf.py``, ``hf_decoder.py``) and the tokenizer (``data/tokenizer.py``) read through here,
never through each other's helpers. Whatever goes wrong ends in the project's error, naming the file and what is
wrong: ``CheckpointError`` for a file or id that cannot be read as a model (missing, damaged, not what it says),
``ConfigError`` for a readable config with a field minimodel does not compute (refused by name) or a size that would
not fit. Sizes are checked before anything is allocated: the raw ``config.json`` (or the GGUF header) before
transformers builds its config (a Qwen2 config of 10^9 layers lists 10^9 layer types), the parameters the mapped
config describes before any tensor or module is built, and the source's own position and window limits against
the sequence lengths of the experiment.

A GGUF file is read once: given the experiment's ``runs_dir``, it is converted to a Hugging Face directory
(``{runs_dir}/.sources/<file stem>-<sha256[:16]>/``: its config, float32 weights as safetensors, its tokenizer),
which every later load of the model or tokenizer reads, in any stage or process (``gguf_copy``); a file of another
content is another copy, and a copy that is incomplete or of another transformers version is converted again. Its
architecture is checked from the header before anything is decoded. A hub id is tried once, briefly (``check_hub``).

Needs ``transformers`` (``pip install minimodel[hf]``); it is imported only inside the functions."""

from __future__ import annotations

import json
import math
import os
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minimodel.errors import CheckpointError, ConfigError, UserError
from minimodel.log import get_logger, quiet_gguf
from minimodel.models import families
from minimodel.models.gguf import GGUFHeader, gguf_metadata, hf_source
from minimodel.models.hub import check_hub
from minimodel.models.hub import first_line as _first_line

log = get_logger(__name__)

CONFIG = "config.json"
MAX_CONFIG_BYTES = 16 * 2**20  # a config.json is kilobytes; one of megabytes is not a model's config
MAX_LAYERS = 4096  # above any model released (Llama 3.1 405B: 126 layers); a config asking for more is damaged
MAX_SIZE = 2**31 - 1  # any width, count or length; tensor shapes are 64-bit but no model field comes near this
LOAD_COPIES = 2  # a load holds the source's float32 tensors (transformers' model) and minimodel's model at once
FLOAT32 = 4
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")  # read first: tensors only, no pickle
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")  # read as data only (weights_only)
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
"""The safetensors dtypes minimodel reads as weights (any other: integers, booleans, 8-bit floats, is refused)."""

# config.json fields that size a model, by name in any family minimodel reads (GPT-2's n_*, the others' *_size):
# each an integer in its range, or null where transformers fills it in; layers bounded apart (MAX_LAYERS)
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "max_window_layers")
SIZE_FIELDS = {"vocab_size": 1, "hidden_size": 1, "n_embd": 1, "intermediate_size": 1, "n_inner": 1,
               "num_attention_heads": 1, "n_head": 1, "num_key_value_heads": 1, "head_dim": 1,
               "max_position_embeddings": 1, "n_positions": 1, "type_vocab_size": 1, "sliding_window": 0,
               "num_hidden_layers": 1, "n_layer": 1, "max_window_layers": 0}
NULLABLE = ("n_inner", "num_key_value_heads", "head_dim", "sliding_window")
GGUF_LAYERS = ".block_count"  # the GGUF metadata key (after the architecture) of the layer count
GGUF_ARCHITECTURES = ("gpt2", "llama", "mistral", "qwen2", "qwen3")
"""The GGUF architectures minimodel reads (the decoder family's model types, ``hf_decoder``); a GGUF file of any
other is refused from its header, before transformers decodes anything."""
GGUF_TOKENIZER = "tokenizer.ggml.model"  # the GGUF metadata key of a file that carries its tokenizer



def transformers() -> Any:
    try:
        import transformers as tf
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("reading a Hugging Face model needs transformers: pip install 'minimodel[hf]' "
                          "(or pip install transformers)") from e
    return tf


@dataclass
class Source:
    """An outside model: what the user named (``name``), where ``from_pretrained`` reads it and with which options
    (a GGUF file: its directory and ``gguf_file``), and the file its config comes from (for the messages)."""

    name: str
    where: str
    options: dict[str, Any] = field(default_factory=dict)
    config_file: str = ""

    @property
    def gguf(self) -> Path | None:
        return Path(self.where) / self.options["gguf_file"] if self.options else None

    @property
    def local(self) -> bool:
        return Path(self.where).is_dir()


def source(name: str | Path) -> Source:
    """The ``Source`` a ``bridge.source`` value names (a GGUF file, a directory holding one, a model directory, a
    hub id); a missing GGUF file or a directory of several is a ``CheckpointError``."""
    where, options = hf_source(str(name))
    s = Source(str(name), where, options)
    s.config_file = str(s.gguf) if s.gguf else str(Path(where) / CONFIG) if s.local else f"{where} ({CONFIG})"
    return s


def check_architecture(path: Path, header: GGUFHeader, model_types: tuple[str, ...], refuse: str) -> None:
    """A GGUF file's architecture and layer count, from its header (``gguf_metadata``): an architecture outside
    ``model_types`` is a ``ConfigError`` naming the file and saying what minimodel reads (``refuse``), before
    transformers decodes anything (seconds for a real vocabulary, tens of seconds for a large one)."""
    if header.arch not in model_types:
        raise ConfigError(f"{path}: a GGUF file of architecture {header.arch!r}: {refuse}")
    layers = header.ints.get(header.arch + GGUF_LAYERS)
    check_sizes({"num_hidden_layers": layers} if layers is not None else {}, f"{path} ({header.arch}{GGUF_LAYERS})")


def check_sizes(values: dict[str, Any], where: str) -> None:
    """The size fields of a raw config (``SIZE_FIELDS``): integers in range, layers at most ``MAX_LAYERS``; a
    ``ConfigError`` naming ``where`` and the field."""
    for name, low in SIZE_FIELDS.items():
        if name not in values:
            continue
        value = values[name]
        if value is None and name in NULLABLE:
            continue
        high = MAX_LAYERS if name in LAYER_FIELDS else MAX_SIZE
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            more = " (more layers than any model has: a damaged config?)" if name in LAYER_FIELDS and \
                isinstance(value, int) and value > high else ""
            raise ConfigError(f"{where}: {name}={value!r} is not a size minimodel reads: an integer from {low} to "
                              f"{high:,}{more}")


def _config_json(path: Path, model: bool = True) -> dict[str, Any]:
    """A ``config.json`` read as plain JSON, before transformers builds anything from it (``model``: it must name
    its ``model_type``)."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise CheckpointError(f"{path}: {size:,} bytes, not a model's config (at most {MAX_CONFIG_BYTES:,})")
        values = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or nested past the parser's depth
        raise CheckpointError(f"{path}: not a readable config.json ({_first_line(e)}): the download or copy is "
                              f"damaged; fetch or save the model again") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(values, dict):
        raise CheckpointError(f"{path}: not a model's config.json (a JSON {type(values).__name__}, not an object)")
    if model and not isinstance(values.get("model_type"), str):
        raise ConfigError(f"{path}: model_type={values.get('model_type')!r}: a model's config.json names its "
                          f"model_type")
    return values


def gguf_checked(path: Path) -> GGUFHeader:
    """``gguf_metadata`` of a GGUF source, a damaged header a ``CheckpointError`` saying the file is not readable."""
    try:
        return gguf_metadata(path)
    except CheckpointError as e:
        why = str(e).removeprefix(f"{path}: ")
        raise CheckpointError(f"{path}: not a readable GGUF file: {why}") from None


def _reads(model_types: tuple[str, ...], family: str) -> str:
    return f"minimodel reads model_type in {list(model_types)} for model.family={family}"


def read_config(src: Source, model_types: tuple[str, ...], family: str) -> Any:
    """The transformers config of ``src``, its sizes and ``model_type`` checked before transformers builds it (the
    raw ``config.json``, or the GGUF header): a file that cannot be read as a model's is a ``CheckpointError``, a
    field transformers or minimodel refuses a ``ConfigError``, each naming the file."""
    tf = transformers()
    if src.gguf is not None:
        check_architecture(src.gguf, gguf_checked(src.gguf), model_types, _reads(model_types, family))
    else:
        path = Path(src.where) / CONFIG
        if not src.local:
            check_hub(src.where)  # offline: at once; otherwise one short attempt, not half a minute of retries
            try:
                from transformers.utils import cached_file

                path = Path(cached_file(src.where, CONFIG))
            except Exception as e:  # an id the hub does not answer for here (offline, unknown, private)
                raise CheckpointError(f"{src.name}: no such local directory, and not a model id the hub answers for "
                                      f"here ({_first_line(e)}); check the path or id, or fetch the model "
                                      f"again") from None
            src.config_file = str(path)
        elif not path.is_file():
            files = sorted(p.name for p in Path(src.where).iterdir())[:12]
            raise CheckpointError(f"{src.name}: no {CONFIG} in this directory (it holds {files}): a Hugging Face "
                                  f"model directory as save_pretrained writes it, or a GGUF file")
        values = _config_json(path)
        if values["model_type"] not in model_types:
            raise ConfigError(f"{path}: unsupported model_type={values['model_type']!r} "
                              f"({_reads(model_types, family)})")
        check_sizes(values, str(path))
    try:
        return tf.AutoConfig.from_pretrained(src.where, **src.options)
    except ImportError:
        raise
    except Exception as e:  # a damaged GGUF (its tensors are read too), or transformers' checks of a config.json
        if src.gguf is not None:
            raise CheckpointError(f"{src.gguf}: not a readable GGUF file: {_first_line(e)}; a damaged or altered "
                                  f"file: fetch it again") from None
        raise ConfigError(f"{src.config_file}: transformers cannot read it as a config ({_first_line(e)})") from None


def size(hf_config: Any, name: str, source: str, default: int | None = None, low: int = 1) -> int:
    """The integer field ``name`` of a transformers config (``default`` where it is unset or null), at least ``low``:
    a ``ConfigError`` naming ``source`` and the field for anything else (a string, a fraction, 0, a negative)."""
    value = getattr(hf_config, name, None)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_SIZE:
        raise ConfigError(f"{source}: {name}={value!r} is not a size minimodel reads: an integer from {low} to "
                          f"{MAX_SIZE:,}")
    return value


def number(value: Any, name: str, source: str, fraction: bool = False) -> float:
    """A float field's ``value``: a finite number, in [0, 1) (``fraction``: a dropout) or above 0 (an epsilon, a
    scale, a base); a ``ConfigError`` naming ``source`` and the field ``name`` for anything else."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (0.0 <= value < 1.0 if fraction else value > 0.0):
        return float(value)
    raise ConfigError(f"{source}: {name}={value!r} is not a value minimodel reads: "
                      f"{'a fraction in [0, 1)' if fraction else 'a positive finite number'}")


def field_number(hf_config: Any, name: str, source: str, default: float | None = None, fraction: bool = False
                 ) -> float:
    """``number`` of the config field ``name`` (``default`` where the config lacks it or holds null)."""
    value = getattr(hf_config, name, None)
    return float(default) if value is None and default is not None else number(value, name, source, fraction)


def model_config(mapping: Callable[[Any, str], Any], hf_config: Any, src: Source) -> Any:
    """``mapping(hf_config, source)`` (a family's ``hf_config_to_model_config``), whose refusals are the project's
    errors: a value the mapping or ``ModelConfig`` cannot take (``ValueError``, ``ZeroDivisionError``, a wrong type)
    becomes a ``ConfigError`` naming the config file."""
    try:
        return mapping(hf_config, src.config_file)
    except UserError:
        raise
    except (ValueError, TypeError, ArithmeticError, AttributeError, KeyError, IndexError) as e:
        raise ConfigError(f"{src.config_file}: not a model minimodel can build: {_first_line(e)}") from None


def parameters(cfg: Any) -> int:
    """The parameters of the model ``cfg`` (a ``ModelConfig``) describes, from its sizes alone: embeddings, learned
    positions, an untied output projection, and per layer its matrices (``layer_linear``), norms and biases (an
    upper bound where the family has fewer)."""
    positions = cfg.max_positions if cfg.positions == "learned" else 0
    output = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden
    per_layer = cfg.layer_linear + 4 * cfg.hidden + cfg.attn_width + 2 * cfg.kv_width + 2 * cfg.ffn
    head = cfg.hidden * cfg.hidden + 3 * cfg.hidden + cfg.vocab_size
    return (cfg.vocab_size + positions) * cfg.hidden + output + cfg.layers * per_layer + head


def available_memory() -> int:
    """The bytes of memory this process may still take: the system's available memory (``MemAvailable``), or its
    physical memory where that is not known, and no more than a cgroup's limit less its use."""
    available = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if not available:
        try:
            available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
            available = 2**62
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


def check_memory(cfg: Any, src: Source) -> None:
    """Refuse, with the figures, a model whose float32 load (``LOAD_COPIES`` copies of its parameters) would not fit
    the memory available, before any tensor or module is built."""
    n = parameters(cfg)
    need, have = LOAD_COPIES * FLOAT32 * n, available_memory()
    if need > have:
        raise ConfigError(f"{src.config_file}: a model of {n:,} parameters ({cfg.layers:,} layers of width "
                          f"{cfg.hidden:,}, {cfg.vocab_size:,} tokens): loading it takes about {need / 1e9:,.1f} GB "
                          f"({LOAD_COPIES} float32 copies) and {have / 1e9:,.1f} GB of memory is available: use a "
                          f"smaller model or a machine with more memory (or check the config: a damaged one?)")


def check_lengths(cfg: Any, lengths: dict[str, int], src: Source, positions_field: str = "max_position_embeddings"
                  ) -> None:
    """The source's own limits against the sequences minimodel will run through it (``lengths``: a key such as
    ``data.seq_len`` -> its length): its positions (learned: more would index past the table; rotary: beyond what it
    was trained at; ``positions_field``: the source config's name for them, named in the message) and its sliding
    attention window (minimodel attends over the whole causal context, which is the window only up to its length)."""
    offset = families.of(cfg).position_offset
    for key, length in lengths.items():
        if length > cfg.max_positions - offset:
            extra = f" less {offset}" if offset else ""
            raise ConfigError(f"{key} ({length}) exceeds the positions of the model {src.name} "
                              f"({cfg.max_positions}{extra} = {cfg.max_positions - offset}: its config's "
                              f"{positions_field}): "
                              f"set {key} to at most {cfg.max_positions - offset}")
        if cfg.sliding_window and length > cfg.sliding_window:
            raise ConfigError(f"{key} ({length}) exceeds the sliding attention window of the model {src.name} "
                              f"({cfg.sliding_window}: its config's sliding_window): minimodel attends over the whole "
                              f"causal context, which equals the window only up to its length; set {key} to at most "
                              f"{cfg.sliding_window}")


def weights_file(src: Source) -> tuple[str, dict[str, Any]]:
    """The weights file ``from_pretrained`` reads in a local model directory ("" for a hub id or a GGUF file) and the
    options that make it read that one: ``model.safetensors`` whenever the directory has it, a pickled
    ``pytorch_model.bin`` only when it has nothing else."""
    if src.gguf is not None or not src.local:
        return "", {}
    directory = Path(src.where)
    for name in SAFE_WEIGHTS:
        if (directory / name).is_file():
            return str(directory / name), {"use_safetensors": True}
    for name in PICKLE_WEIGHTS:
        if (directory / name).is_file():
            return str(directory / name), {"use_safetensors": False}
    raise CheckpointError(f"{src.name}: no model weights in this Hugging Face model directory (expected "
                          f"{' or '.join(SAFE_WEIGHTS + PICKLE_WEIGHTS)}, as save_pretrained writes them)")


def check_weights(weights: str, build: Any, hf_config: Any, source: str) -> None:
    """Before transformers reads ``weights`` (a ``model.safetensors``; other files are left to their loader): a file
    safetensors can read, floating-point tensors only (integers would be cast to float without a word: a quantised
    or damaged checkpoint), and every tensor the model ``build(hf_config)`` (built on the meta device: no memory)
    has at the shape it has there (a config and weights of different models). Each refusal is a ``CheckpointError``
    naming the file and tensor."""
    if not weights.endswith(".safetensors"):
        return
    import torch
    from safetensors import safe_open

    try:
        with safe_open(weights, framework="pt") as f:
            slices = {k: f.get_slice(k) for k in f.keys()}
            found = {k: (tuple(v.get_shape()), v.get_dtype()) for k, v in slices.items()}
    except Exception as e:  # safetensors' own error types, or an OSError
        raise CheckpointError(f"{weights}: not a readable safetensors file ({_first_line(e)}): the download or copy "
                              f"is damaged; fetch or save the model again") from None
    odd = [f"{k} ({d})" for k, (_, d) in sorted(found.items()) if d not in FLOAT_DTYPES]
    if odd:
        raise CheckpointError(f"{weights}: weights stored as {', '.join(odd[:3])}{', ...' if len(odd) > 3 else ''}: "
                              f"minimodel reads floating-point weights ({', '.join(FLOAT_DTYPES)}); a quantised or "
                              f"damaged checkpoint would be cast to float without meaning: use the float model")
    try:
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in build(hf_config).state_dict().items()}
    except Exception as e:  # a config transformers' model class cannot build
        raise ConfigError(f"{source}: transformers cannot build the model this config describes "
                          f"({_first_line(e)})") from None
    wrong = [f"{k} {list(found[k][0])} (config {source}: {list(expected[k])})"
             for k in sorted(found) if k in expected and found[k][0] != expected[k]]
    if wrong:
        raise CheckpointError(f"{weights}: tensor shapes disagree with the model its config describes: "
                              f"{'; '.join(wrong[:3])}{'; ...' if len(wrong) > 3 else ''}: the config and the weights "
                              f"are of different models")


def not_plain_data(weights: str, e: pickle.UnpicklingError) -> CheckpointError:
    """The refusal of a pickled weights file that holds more than plain data, in the form minimodel uses for its own
    checkpoints (``checkpoints.load_checkpoint``), with the way out: the model's weights as safetensors."""
    unsafe = re.search(r"unsupported global:? (GLOBAL )?(\S+)", str(e), re.IGNORECASE)
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    what = (f"it holds a Python object ({unsafe.group(2)}) whose loading could run code" if unsafe else
            f"it is not readable as plain data ({lines[-1] if lines else type(e).__name__})")
    return CheckpointError(
        f"refusing to load {weights}: {what}; minimodel reads checkpoints as plain data (tensors, numbers, strings, "
        f"lists) only. Do not use files of unknown origin; convert a model you trust to safetensors, which holds "
        f"tensors only: load it with transformers and save it with save_pretrained(DIR) (transformers 5 writes "
        f"model.safetensors; older versions need safe_serialization=True), then set bridge.source=DIR")


def load_weights(cls: Any, src: Source, hf_config: Any, build: Any | None = None, **kwargs: Any) -> tuple[Any, dict]:
    """transformers' model ``cls`` of ``src`` with its loading info, after ``check_weights`` (``build``: what builds
    the model from the config, by default ``cls``); every failure a ``CheckpointError`` naming the file."""
    weights, more = weights_file(src)
    check_weights(weights, build or cls, hf_config, src.name)
    if src.gguf is not None:
        quiet_gguf()  # --no-progress: not the conversion's bar either
    try:
        return cls.from_pretrained(src.where, config=hf_config, output_loading_info=True, **more, **src.options,
                                   **kwargs)
    except pickle.UnpicklingError as e:  # transformers reads pickles with torch.load(weights_only=True)
        raise not_plain_data(weights or f"the weights of {src.name} (pytorch_model.bin)", e) from e
    except (ImportError, UserError):
        raise
    except Exception as e:
        if src.gguf is not None:
            raise CheckpointError(f"{src.name}: the GGUF file's tensors do not load as the model its metadata "
                                  f"describes ({_first_line(e)}): a damaged or altered file; fetch it again") from None
        raise CheckpointError(f"{weights or src.name}: the weights do not load as the model its config describes "
                              f"({_first_line(e)}): a damaged or altered checkpoint; fetch or save it again") from None


def missing_weights(info: dict, src: Source, tied: set[str], kind: str) -> None:
    """Refuse a checkpoint that lacks weights the model has (transformers would initialise them at random)."""
    missing = sorted(set(info.get("missing_keys", ())) - tied)
    if missing:
        raise CheckpointError(f"{src.name}: checkpoint lacks {missing} (need a complete {kind} checkpoint)")


def convert(src: Source, what: Callable[[], Any]) -> Any:
    """``what()`` (mapping loaded tensors onto minimodel's model), its refusals the project's errors naming the
    source: a ``ValueError`` of the mapping (an untied output projection, a non-zero output-projection bias) is a
    ``CheckpointError``."""
    try:
        return what()
    except UserError:
        raise
    except (ValueError, RuntimeError, KeyError) as e:
        raise CheckpointError(f"{src.name}: {_first_line(e)}") from None


