"""The one door for outside models (``minimodel/models/outside.py``, issue 54 part 1): every read of a model minimodel
did not write (a Hugging Face directory or hub id, safetensors, a GGUF file, tokenizer files; both families) ends in
the project's error naming the file and what is wrong, or loads. Each case a hostile user found is a named test here
(each raised another exception type, built 10^9 layers, or loaded a different model without a word before), then
property-based fuzz tests over a source's ``config.json`` fields and a GGUF file's header bytes: the load ends in a
``UserError`` or succeeds, never another exception type. The fuzz tests are bounded (``MINIMODEL_FUZZ_EXAMPLES``,
default 25 examples each: seconds); set it higher to search longer."""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from minimodel.cli import main  # noqa: E402
from minimodel.errors import CheckpointError, ConfigError, UserError  # noqa: E402
from minimodel.models import hf, hf_decoder, outside  # noqa: E402
from minimodel.stages.bridge import load_primary  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("MINIMODEL_FUZZ_EXAMPLES", "25"))
LLAMA = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=48, max_position_embeddings=64, bos_token_id=0, eos_token_id=2)
ROBERTA = dict(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
               max_position_embeddings=40, pad_token_id=1)


def save(kind: str, out: Path, **extra: Any) -> Path:
    """A tiny random model of ``kind`` (transformers' own classes), saved as save_pretrained writes it."""
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(**{**dict(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                                   bos_token_id=0, eos_token_id=0), **extra})
        transformers.GPT2LMHeadModel(config).save_pretrained(out)
    elif kind == "roberta":
        transformers.RobertaForMaskedLM(transformers.RobertaConfig(**{**ROBERTA, **extra})).save_pretrained(out)
    else:
        prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}[kind]
        config = getattr(transformers, f"{prefix}Config")(**{**LLAMA, **extra})
        getattr(transformers, f"{prefix}ForCausalLM")(config).save_pretrained(out)
    return out


def edit_config(directory: Path, **fields: Any) -> Path:
    """``directory``'s config.json with ``fields`` set as written (what a hand-edited or crafted file holds)."""
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return directory


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny saved model of each type minimodel reads."""
    d = tmp_path_factory.mktemp("bases")
    for kind in ("gpt2", "llama", "mistral", "qwen2", "qwen3", "roberta"):
        save(kind, d / kind)
    return d


def copy_of(bases: Path, kind: str, out: Path) -> Path:
    shutil.copytree(bases / kind, out)
    return out


TINY_TOKENS = ["<|endoftext|>", "a", "b", "c", "d", "e", "\u0120", "ab", "cd", "\u0120a", "\u0120b", "abcd", "f", "g",
               "h", "i"]
"""The vocabulary of ``write_gguf(tokenizer=True)``: a byte-level BPE one (GPT-2's kind) of 16 pieces."""


def write_gguf(path: Path, arch: str = "llama", layers: int = 1, hidden: int = 8, heads: int = 2,
               tokenizer: bool = False, seed: int = 0) -> Path:
    """A tiny float32 GGUF file of ``arch`` (gguf's own writer), which transformers and minimodel load; with a
    byte-level BPE tokenizer of ``TINY_TOKENS`` (``tokenizer``); ``seed``: its weights' random draw."""
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    import numpy as np

    ffn, vocab = 12, 16
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_context_length(32)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10_000.0)
    w.add_vocab_size(vocab)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(TINY_TOKENS)
        w.add_token_types([3] + [1] * (len(TINY_TOKENS) - 1))  # <|endoftext|> a control token, the rest normal
        w.add_token_merges(["a b", "c d", "\u0120 a", "\u0120 b", "ab cd"])
        w.add_bos_token_id(0)
        w.add_eos_token_id(0)
    rng = np.random.default_rng(seed)

    def tensor(*shape: int) -> Any:
        return rng.standard_normal(shape).astype(np.float32)

    w.add_tensor("token_embd.weight", tensor(vocab, hidden))
    w.add_tensor("output_norm.weight", tensor(hidden))
    for i in range(layers):
        for name, shape in (("attn_norm", (hidden,)), ("ffn_norm", (hidden,)), ("attn_q", (hidden, hidden)),
                            ("attn_k", (hidden, hidden)), ("attn_v", (hidden, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)),
                            ("ffn_down", (hidden, ffn))):
            w.add_tensor(f"blk.{i}.{name}.weight", tensor(*shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------- config fields


@pytest.mark.parametrize("kind,fields,message", [
    ("llama", {"rope_scaling": {"rope_type": "no-such-rope", "factor": 2.0}}, r"rope"),
    ("llama", {"num_key_value_heads": 3}, r"num_key_value_heads=3 does not divide num_attention_heads=2"),
    ("llama", {"head_dim": -4}, r"head_dim=-4 is not a size minimodel reads"),
    ("llama", {"head_dim": 0}, r"head_dim=0 is not a size minimodel reads"),
    ("llama", {"num_attention_heads": 0}, r"num_attention_heads=0 is not a size minimodel reads"),
    ("llama", {"vocab_size": 0}, r"vocab_size=0 is not a size minimodel reads"),
    ("llama", {"hidden_act": "gelu"}, r"unsupported hidden_act='gelu'"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
     r"unsupported partial_rotary_factor=0\.5"),
    ("llama", {"num_hidden_layers": "two"}, r"num_hidden_layers='two' is not a size"),
    ("llama", {"hidden_size": 33}, r"hidden size \(33\) is not a multiple of the number of attention heads \(2\)"),
    ("llama", {"eos_token_id": 5000}, r"eos_token_id=5000 is not a token id below vocab_size=100"),
    ("gpt2", {"n_head": 0}, r"n_head=0 is not a size minimodel reads"),
    ("gpt2", {"n_head": 3}, r"n_head=3 does not divide n_embd=32"),
    ("gpt2", {"activation_function": "gelu_fast_custom"}, r"activation_function"),
    ("gpt2", {"tie_word_embeddings": False}, r"unsupported tie_word_embeddings=False"),
    ("roberta", {"num_attention_heads": 0}, r"num_attention_heads=0 is not a size minimodel reads"),
    ("roberta", {"num_attention_heads": 3}, r"num_attention_heads=3 does not divide hidden_size=32"),
    ("roberta", {"pad_token_id": 99}, r"pad_token_id=99 is not a token id below vocab_size=60"),
    ("roberta", {"hidden_act": "relu"}, r"unsupported hidden_act='relu'"),
])
def test_a_config_field_minimodel_cannot_compute_is_refused_by_name(bases, tmp_path, kind, fields, message):
    """Was a ``ValueError`` (or ``ZeroDivisionError``) traceback from the mapping or ``ModelConfig``; now a
    ``ConfigError`` (exit 2) naming the config file and the field."""
    d = edit_config(copy_of(bases, kind, tmp_path / kind), **fields)
    family = "encoder" if kind == "roberta" else "decoder"
    with pytest.raises(ConfigError, match=rf"{d}/config\.json: .*{message}"):
        load_primary(str(d), family)


@pytest.mark.parametrize("family,model_type", [("decoder", "phi"), ("decoder", "bert"), ("encoder", "llama"),
                                               ("encoder", "bert")])
def test_an_unsupported_model_type_is_refused_before_transformers_reads_it(bases, tmp_path, family, model_type):
    d = edit_config(copy_of(bases, "llama" if model_type == "llama" else "roberta", tmp_path / "m"),
                    model_type=model_type)
    with pytest.raises(ConfigError, match=rf"config\.json: unsupported model_type='{model_type}' \(minimodel reads "
                                          rf"model_type in \[.*\] for model.family={family}\)"):
        load_primary(str(d), family)


def test_a_qwen3_source_with_attention_biases_is_refused_by_name(tmp_path):
    """Qwen3's ``attention_bias`` biases q, k, v and the output projection; the family has q/k/v biases only. It
    loaded with its biases dropped (logits 0.65 away from transformers'), where the docs said it was refused."""
    d = save("qwen3", tmp_path / "q3", attention_bias=True)
    with pytest.raises(ConfigError, match=r"config\.json: unsupported attention_bias=True"):
        hf_decoder.from_hf(d)


@pytest.mark.parametrize("source", ["garbage", "list", "nested", "empty-dir", "hub-id", "gguf"])
def test_the_encoder_family_reads_its_source_through_the_guarded_door(tmp_path, monkeypatch, source):
    """The encoder family's ``from_hf`` read the config with no guard: an offline hub id, a garbage config.json, a
    GGUF source were tracebacks. (The hub is asked offline here: without a network it retries for half a minute.)"""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    d = tmp_path / "m"
    d.mkdir()
    error = CheckpointError
    if source == "garbage":
        (d / "config.json").write_bytes(b"\x00{not json" * 10)
        expected = r"m/config\.json: not a readable config\.json"
    elif source == "list":
        (d / "config.json").write_text("[1, 2]")
        expected = r"m/config\.json: not a model's config\.json \(a JSON list"
    elif source == "nested":  # past the JSON parser's depth: a RecursionError, not a ValueError
        (d / "config.json").write_text("[" * 100_000)
        expected = r"m/config\.json: not a readable config\.json"
    elif source == "empty-dir":
        expected = r"m: no config\.json in this directory"
    elif source == "hub-id":
        d = Path("no-such-owner/no-such-model-54")
        expected = r"no-such-owner/no-such-model-54: no such local directory, and not a model id the hub answers for"
    else:
        d, error = write_gguf(tmp_path / "model.gguf"), ConfigError
        expected = r"model\.gguf: a GGUF file of architecture 'llama': minimodel reads model_type in \['roberta'"
    with pytest.raises(error, match=expected):
        hf.from_hf(d)


def test_a_source_that_cannot_be_read_ends_in_exit_2_with_one_error_line(tmp_path, capsys):
    """Through the command line: ``bridge.source`` a directory with a garbage config.json."""
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text("{\"model_type\": \"roberta\", \"num_hidden_layers\": -1}")
    args = ["bridge", str(ROOT / "experiments" / "tiny.yaml"), f"runs_dir={tmp_path / 'runs'}",
            f"data.prepared_dir={tmp_path / 'prepared'}", "logging.wandb=disabled", "system=minipost",
            "model.mini_heads=[]", f"bridge.source={d}", "bridge.depth=1", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"[minimodel] bridge: error: {d}/config.json: num_hidden_layers=-1 is not a size minimodel reads" in err


def test_a_tokenizer_beside_a_crafted_config_is_refused_before_transformers_reads_it(bases, tmp_path):
    """``data.source_tokenizer`` (by default ``bridge.source``) reads through the same door: ``AutoTokenizer`` may
    build the model's config from config.json, so its sizes are checked first; a damaged GGUF header is named too."""
    from minimodel.data.tokenizer import HFTokenizer, TokenizerError

    d = edit_config(copy_of(bases, "qwen2", tmp_path / "q"), num_hidden_layers=1_000_000_000)
    with pytest.raises(TokenizerError, match=r"num_hidden_layers=1000000000 is not a size minimodel reads"):
        HFTokenizer(str(d), causal=True)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**60, 0))
    with pytest.raises(TokenizerError, match=r"cannot load the tokenizer of the model file .*bad\.gguf: .*bad\.gguf: "
                                             r"the header counts"):
        HFTokenizer(str(bad), causal=True)


# ---------------------------------------------------------------------------------------------- sizes


def test_a_billion_layers_is_refused_before_anything_is_built(bases, tmp_path):
    """``num_hidden_layers: 1000000000`` made the weight check build 10^9 layers (more than 10 GB before anything
    said no); a Qwen2 config of that many layers makes transformers list 10^9 layer types. Refused from the raw
    config.json, in well under a second and without growing the process."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for kind in ("llama", "qwen2", "gpt2", "roberta"):
        layers = "n_layer" if kind == "gpt2" else "num_hidden_layers"
        d = edit_config(copy_of(bases, kind, tmp_path / kind), **{layers: 1_000_000_000})
        with pytest.raises(ConfigError, match=rf"{layers}=1000000000 is not a size minimodel reads: an integer from "
                                              rf"1 to 4,096 \(more layers than any model has"):
            load_primary(str(d), "encoder" if kind == "roberta" else "decoder")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # kB: no 10^9 of anything


def test_a_model_too_large_for_the_memory_is_refused_with_the_figures(bases, tmp_path, monkeypatch):
    """Parameters computed from the config, before any tensor or module is built, against the memory available."""
    d = edit_config(copy_of(bases, "llama", tmp_path / "big"), hidden_size=65536, intermediate_size=262144,
                    num_hidden_layers=80, head_dim=None, num_attention_heads=64, num_key_value_heads=8)
    with pytest.raises(ConfigError, match=r"big/config\.json: a model of [\d,]+ parameters \(80 layers of width "
                                          r"65,536, 100 tokens\): loading it takes about [\d,.]+ GB \(2 float32 "
                                          r"copies\) and [\d,.]+ GB of memory is available"):
        load_primary(str(d), "decoder")
    monkeypatch.setattr(outside, "available_memory", lambda: 10_000)  # 10 kB: even the tiny model does not fit
    with pytest.raises(ConfigError, match=r"a model of [\d,]+ parameters"):
        load_primary(str(bases / "llama"), "decoder")


# ---------------------------------------------------------------------------------------------- the source's limits


@pytest.mark.parametrize("kind,fields,message", [
    ("mistral", {"sliding_window": 16}, r"data\.seq_len \(32\) exceeds the sliding attention window of the model .* "
                                        r"\(16: its config's sliding_window\)"),
    ("mistral", {"max_position_embeddings": 16}, r"data\.seq_len \(32\) exceeds the positions of the model .* \(16 = "
                                                 r"16: its config's max_position_embeddings\): set data\.seq_len to at "
                                                 r"most 16"),
    ("gpt2", {"n_positions": 8}, r"data\.seq_len \(32\) exceeds the positions of the model .* its config's "
                                 r"n_positions\): set data\.seq_len to at most 8"),
    ("roberta", {"max_position_embeddings": 20}, r"data\.seq_len \(32\) exceeds the positions of the model .* \(20 "
                                                 r"less 2 = 18: its config's max_position_embeddings\)"),
])
def test_the_sources_own_limits_are_checked_against_the_sequence_length(tmp_path, kind, fields, message):
    """A Mistral source whose window or positions are shorter than ``data.seq_len`` trained without a word (only
    the YAML's own ``model.sliding_window`` was checked); a GPT-2 source of 8 positions failed at its first update
    with an IndexError. Now refused when the source is read, before its weights are."""
    d = save(kind, tmp_path / kind, **fields)
    family = "encoder" if kind == "roberta" else "decoder"
    with pytest.raises(ConfigError, match=message):
        load_primary(str(d), family, {"data.seq_len": 32})
    load_primary(str(d), family, {"data.seq_len": 8})  # short enough: loads


def test_the_stages_check_the_sources_limits(tmp_path, capsys):
    """``bridge`` over a GPT-2 source of 8 positions with ``data.seq_len`` 32: exit 2 naming the key, before
    anything is written (was an IndexError at the first update)."""
    d = save("gpt2", tmp_path / "gpt2", n_positions=8)
    args = ["bridge", str(ROOT / "experiments" / "tiny.yaml"), f"runs_dir={tmp_path / 'runs'}",
            f"data.prepared_dir={tmp_path / 'prepared'}", "logging.wandb=disabled", "system=minipost",
            "model.mini_heads=[]", "model.family=decoder", "finetune.pool=last", f"bridge.source={d}",
            "bridge.depth=1", "data.seq_len=32", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "data.seq_len (32) exceeds the positions of the model" in err
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------------------- GGUF


@pytest.mark.parametrize("arch", ["bloom", "mamba", "roberta"])
def test_a_gguf_of_an_architecture_the_family_does_not_read_is_refused_by_name(tmp_path, arch):
    path = write_gguf(tmp_path / f"{arch}.gguf", arch=arch)
    with pytest.raises(ConfigError, match=rf"{arch}\.gguf: a GGUF file of architecture '{arch}': minimodel reads "
                                          rf"model_type in \['gpt2', 'llama'"):
        hf_decoder.from_hf(path)


def test_a_tiny_gguf_loads_with_transformers_logits(tmp_path):
    """The fuzzers' starting point is a file that loads, and loads right."""
    path = write_gguf(tmp_path / "tiny.gguf")
    ours = hf_decoder.from_hf(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    x = torch.randint(0, 16, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours.logits(x) - theirs(x).logits).abs().max() < 1e-5


@pytest.mark.parametrize("name", ["model.GGUF", "model.Gguf"])
def test_a_gguf_suffix_in_any_case_is_read_as_gguf(tmp_path, name):
    """``model.GGUF`` was taken for a training checkpoint (the suffix was compared case-sensitively), and refused as
    "not a model"; it is the same GGUF file as ``model.gguf``, as a file and in a directory of its own."""
    from minimodel.config.schema import is_hf_source
    from minimodel.models.gguf import hf_source

    (tmp_path / "lower").mkdir()
    lower = write_gguf(tmp_path / "lower" / "model.gguf")
    upper = tmp_path / "upper" / name
    upper.parent.mkdir()
    shutil.copy(lower, upper)
    assert is_hf_source(str(upper))
    assert hf_source(str(upper)) == (str(upper.parent), {"gguf_file": name})
    assert hf_source(str(upper.parent)) == (str(upper.parent), {"gguf_file": name})  # the directory holding it
    x = torch.randint(0, 16, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf_decoder.from_hf(lower).logits(x)
        assert torch.equal(hf_decoder.from_hf(upper).logits(x), expected)
        assert torch.equal(hf_decoder.from_hf(upper.parent).logits(x), expected)


HEADER = {"tensors": 8, "fields": 16, "first_key_length": 24}
"""Byte offsets in a GGUF file (versions 2 and 3): the tensor and field counts, the first metadata key's length."""


@pytest.mark.parametrize("case", ["cut-in-header", "huge-key-length", "huge-tensor-count", "huge-field-count",
                                  "huge-array", "bad-type", "many-dimensions", "layers-1e9"])
def test_a_cut_or_crafted_gguf_header_is_a_clear_error(tmp_path, case):
    """A cut or crafted GGUF header raised ``struct.error`` (or asked for gigabytes) in transformers' reader; the
    header is now read first, every length and count against the bytes the file has."""
    path = write_gguf(tmp_path / "model.gguf")
    data = bytearray(path.read_bytes())
    at = HEADER
    if case == "cut-in-header":
        data = data[:40]
    elif case == "huge-key-length":
        data[at["first_key_length"]:at["first_key_length"] + 8] = struct.pack("<Q", 2**62)
    elif case == "huge-tensor-count":
        data[at["tensors"]:at["tensors"] + 8] = struct.pack("<Q", 2**60)
    elif case == "huge-field-count":
        data[at["fields"]:at["fields"] + 8] = struct.pack("<Q", 2**40)
    elif case == "huge-array":  # an array of strings claiming 2^50 items
        path = tmp_path / "model.gguf"
        data = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 3) + b"key"
                         + struct.pack("<IIQ", 9, 8, 2**50))
    elif case == "bad-type":
        key = struct.unpack("<Q", data[24:32])[0]
        data[32 + key:36 + key] = struct.pack("<I", 77)
    elif case == "many-dimensions":
        path = tmp_path / "model.gguf"
        data = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"t"
                         + struct.pack("<I", 2**31) + bytes(64))
    else:
        marker = b"llama.block_count"
        i = data.index(marker) + len(marker)
        kind = struct.unpack("<I", data[i:i + 4])[0]
        assert kind == 4  # uint32
        data[i + 4:i + 8] = struct.pack("<I", 1_000_000_000)
    path.write_bytes(bytes(data))
    error, expected = ((ConfigError, r"llama\.block_count\).*1000000000") if case == "layers-1e9" else
                       (CheckpointError, r"not a readable GGUF file"))
    with pytest.raises(error, match=rf"model\.gguf.*{expected}"):
        hf_decoder.from_hf(path)


# ---------------------------------------------------------------------------------------------- the fuzzers


def _fuzz_settings() -> Any:
    from hypothesis import HealthCheck, settings

    return settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize="MINIMODEL_FUZZ_SEED" not in os.environ,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
                    database=None)


def _loads_or_refuses(load: Any) -> None:
    """The one property: the load succeeds or ends in the project's error, never another exception type."""
    try:
        load()
    except UserError as e:
        assert str(e).strip() and "\n" not in str(e).strip().splitlines()[0]


FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
          "intermediate_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
          "rope_parameters", "hidden_act", "tie_word_embeddings", "sliding_window", "use_sliding_window",
          "max_window_layers", "layer_types", "attention_bias", "mlp_bias", "pad_token_id", "eos_token_id",
          "model_type", "n_embd", "n_head", "n_layer", "n_positions", "n_inner", "activation_function",
          "type_vocab_size", "layer_norm_eps", "position_embedding_type", "is_decoder", "initializer_range",
          "attention_dropout", "hidden_dropout_prob")


def _values() -> Any:
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.sampled_from([0, 2**31, 10**9, 2**64]),
                        st.floats(allow_nan=True, allow_infinity=True),
                        st.sampled_from(["silu", "gelu", "relu", "yarn", "llama", "gpt2", "qwen3", "bloom", "", "x"]))
    return st.one_of(scalars, st.lists(scalars, max_size=4),
                     st.dictionaries(st.sampled_from(["rope_type", "type", "factor", "rope_theta",
                                                      "original_max_position_embeddings", "low_freq_factor"]),
                                     scalars, max_size=4))


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3", "gpt2", "roberta"])
def test_fuzz_config_fields_end_in_the_projects_error_or_load(bases, tmp_path, kind):
    """Any value in any field of a source's config.json (1 to 3 fields at once): a load or a ``UserError``."""
    pytest.importorskip("hypothesis")
    from hypothesis import given
    from hypothesis import strategies as st

    family = "encoder" if kind == "roberta" else "decoder"
    counter = iter(range(10**9))

    @_fuzz_settings()
    @given(st.dictionaries(st.sampled_from(FIELDS), _values(), min_size=1, max_size=3))
    def fuzz(fields: dict[str, Any]) -> None:
        d = tmp_path / f"case{next(counter)}"
        d.mkdir()
        for f in (bases / kind).iterdir():
            os.link(f, d / f.name)
        (d / "config.json").unlink()
        (d / "config.json").write_text(json.dumps({**json.loads((bases / kind / "config.json").read_text()),
                                                   **fields}))
        _loads_or_refuses(lambda: load_primary(str(d), family, {"data.seq_len": 16}))
        shutil.rmtree(d)

    fuzz()


@pytest.mark.parametrize("region", ["header", "anywhere"])
def test_fuzz_gguf_header_bytes_end_in_the_projects_error_or_load(tmp_path, region):
    """Bytes of a tiny GGUF file replaced (in its header and metadata, or anywhere) or the file cut: a load or a
    ``UserError``."""
    pytest.importorskip("hypothesis")
    from hypothesis import given
    from hypothesis import strategies as st

    original = write_gguf(tmp_path / "base.gguf").read_bytes()
    header = original.index(b"token_embd.weight") + 64 if region == "header" else len(original)
    counter = iter(range(10**9))
    edits = st.lists(st.tuples(st.integers(0, header - 1), st.integers(0, 255)), min_size=1, max_size=6)

    @_fuzz_settings()
    @given(edits, st.one_of(st.none(), st.integers(0, len(original))),
           st.sampled_from([None, 0, 1, 2**31, 2**32 - 1, 2**63]))
    def fuzz(changes: list[tuple[int, int]], cut: int | None, wide: int | None) -> None:
        data = bytearray(original)
        for at, byte in changes:
            data[at] = byte
        if wide is not None:  # a whole count or length overwritten (a single byte rarely makes one huge)
            at = changes[0][0] - changes[0][0] % 4
            data[at:at + 8] = struct.pack("<Q", wide % 2**64)[:len(data[at:at + 8])]
        if cut is not None:
            data = data[:cut]
        d = tmp_path / f"case{next(counter)}"
        d.mkdir()
        (d / "model.gguf").write_bytes(bytes(data))
        _loads_or_refuses(lambda: hf_decoder.from_hf(d / "model.gguf"))
        shutil.rmtree(d)

    fuzz()
