"""Hugging Face interop of the decoder family (minimodel/models/hf_decoder.py), on tiny randomly initialised GPT-2 and Llama
models written here (no hub): ``from_hf`` gives the HF logits, ``to_hf`` round-trips, MiniPost runs steps 1b-4 from a
``GPT2LMHeadModel`` or ``LlamaForCausalLM`` directory with that model's own tokenizer (byte-level BPE or unigram, no
padding or mask token), and the adapted German model exports to ``AutoModelForCausalLM`` + a fast tokenizer that ``pipeline("text-generation")``
runs offline, with our logits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from minimodel.cli import main  # noqa: E402
from minimodel.data.tokenizer import HFTokenizer, Tokenizer  # noqa: E402
from minimodel.errors import CheckpointError, ConfigError  # noqa: E402
from minimodel.models.hf_decoder import from_hf, to_hf  # noqa: E402
from minimodel.stages.bridge import load_primary  # noqa: E402
from tests.conftest import ROOT, real_text, stage_overrides, tiny_overrides  # noqa: E402
from tests.test_decoder_pipeline import small_task  # noqa: E402

EOT = "<|endoftext|>"


def gpt2_tokenizer(out: Path, vocab: int = 600) -> Path:
    """A GPT-2-style byte-level BPE trained on real English text: one special token, no padding or mask token."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    backend = ByteLevelBPETokenizer()
    backend.train_from_iterator(real_text("en", 200_000).splitlines(), vocab_size=vocab, min_frequency=2,
                                special_tokens=[EOT], show_progress=False)
    tok = GPT2TokenizerFast(tokenizer_object=backend._tokenizer, bos_token=EOT, eos_token=EOT, unk_token=EOT)
    tok.save_pretrained(out)
    return out


def llama_tokenizer(out: Path, vocab: int = 600) -> Path:
    """A Llama-style SentencePiece unigram tokenizer (<unk> <s> </s>, no padding or mask token) trained on English."""
    from tokenizers import SentencePieceUnigramTokenizer

    backend = SentencePieceUnigramTokenizer()
    backend.train_from_iterator(real_text("en", 200_000).splitlines(), vocab_size=vocab,
                                special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False)
    cls = getattr(transformers, "LlamaTokenizerFast", None) or transformers.LlamaTokenizer
    cls(tokenizer_object=backend._tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(out)
    return out


def qwen2_tokenizer(out: Path, vocab: int = 600) -> Path:
    """A Qwen2-style byte-level BPE: <|endoftext|> (end of text and padding), <|im_start|> and <|im_end|>, no
    beginning-of-sequence token, no mask token."""
    from tokenizers import ByteLevelBPETokenizer

    specials = [EOT, "<|im_start|>", "<|im_end|>"]
    backend = ByteLevelBPETokenizer()
    backend.train_from_iterator(real_text("en", 200_000).splitlines(), vocab_size=vocab, min_frequency=2,
                                special_tokens=specials, show_progress=False)
    transformers.Qwen2TokenizerFast(tokenizer_object=backend._tokenizer, bos_token=None, eos_token=EOT,
                                    pad_token=EOT, unk_token=None,
                                    additional_special_tokens=specials[1:]).save_pretrained(out)
    return out


LLAMA_FAMILY = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
"""model_type -> the prefix of transformers' config and model classes."""
SHIPPED = {  # each type as current checkpoints use it: grouped-query attention and the type's own options
    "llama": {"num_key_value_heads": 2, "head_dim": 32, "rope_theta": 500_000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 16}},
    "mistral": {"num_key_value_heads": 1, "sliding_window": 64},
    "qwen2": {"num_key_value_heads": 2, "rope_theta": 1_000_000.0},  # q/k/v biases: always, in Qwen2
    "qwen3": {"num_key_value_heads": 2, "head_dim": 24},  # q/k RMSNorm: always, in Qwen3; head_dim x heads != hidden
}


def tiny(kind: str, vocab: int, **extra: object):
    """A tiny randomly initialised causal LM of ``kind`` (gpt2 or a Llama-family model_type), built offline with
    transformers' own classes; biases and norm weights are randomised too (their defaults, 0 and 1, would hide a
    mapping that drops them)."""
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=3, n_head=2, n_positions=64,
                                         **{"bos_token_id": 0, "eos_token_id": 0, **extra})
        return transformers.GPT2LMHeadModel(config).eval()
    prefix = LLAMA_FAMILY[kind]
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
        max_position_embeddings=64, **{"bos_token_id": 0, "eos_token_id": 2, **extra})
    model = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.2)
    return model


@pytest.mark.parametrize("kind,options", [("gpt2", {}), ("llama", {"tie_word_embeddings": False}),
                                          ("llama", {"tie_word_embeddings": True}),
                                          *((k, SHIPPED[k]) for k in LLAMA_FAMILY)])
def test_from_hf_gives_the_hf_logits_and_to_hf_round_trips(tmp_path, kind, options):
    hf = tiny(kind, 300, **options)
    hf.save_pretrained(tmp_path / "hf")
    ours, _ = load_primary(str(tmp_path / "hf"), "decoder")  # bridge.source: a directory (or a hub id)
    assert ours.training  # as a training checkpoint loads: step 3 finetunes it with its dropout
    ours.eval()
    assert type(ours).__name__ == "DecoderLM" and ours.cfg.tie_embeddings == hf.config.tie_word_embeddings
    x = torch.randint(3, 300, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # fp32, the same operations in the same order: equal up to rounding (seen: exactly equal)
        assert (hf(x).logits - ours.logits(x)).abs().max() < 1e-5
    to_hf(ours, tmp_path / "back", bos=0, eos=2, pad=1, new_tokenizer=False)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(again).__name__ == type(hf).__name__ and again.config.model_type == kind
    with torch.no_grad():
        assert (again(x).logits - ours.logits(x)).abs().max() < 1e-5
    back = from_hf(tmp_path / "back")
    assert back.cfg == replace(ours.cfg, pad_id=1) and back.state_dict().keys() == ours.state_dict().keys()
    # with a new tokenizer beside it (minimodel export), a Qwen2 model is written as Llama with attention biases
    # (AutoTokenizer would replace any tokenizer beside a qwen2 config with Qwen2's own): the same logits, read back
    to_hf(ours, tmp_path / "export", bos=0, eos=2, pad=1)
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    assert exported.config.model_type == ("llama" if kind == "qwen2" else kind)
    with torch.no_grad():
        assert (exported(x).logits - ours.logits(x)).abs().max() < 1e-5
    assert from_hf(tmp_path / "export").cfg == replace(ours.cfg, pad_id=1)


def test_the_shipped_options_are_read_as_declared_fields(tmp_path):
    """What each model type sets lands in the model config's declared fields (and nothing else differs from
    plain Llama's)."""
    seen = {}
    for kind, options in SHIPPED.items():
        tiny(kind, 100, **options).save_pretrained(tmp_path / kind)
        seen[kind] = from_hf(tmp_path / kind).cfg.llama_options()
    assert seen == {
        "llama": {"kv_heads": 2, "head_size": 32, "rope_scaling": "llama3", "rope_factor": 8.0,
                  "rope_original_max_positions": 16},
        "mistral": {"kv_heads": 1, "sliding_window": 64},
        "qwen2": {"kv_heads": 2, "qkv_bias": True},
        "qwen3": {"kv_heads": 2, "head_size": 24, "qk_norm": True}}


def test_rope_scalings_give_transformers_frequencies():
    """``decoder.rope_inv_freq`` against transformers' own rope initialisation, for each rope type minimodel
    accepts; the scaled frequencies differ from the unscaled ones (the test can fail)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from minimodel.models.decoder import rope_inv_freq
    from minimodel.models.hf_decoder import hf_config_to_model_config

    plain = None
    for scaling in (None, {"rope_type": "linear", "factor": 4.0},
                    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}):
        config = transformers.LlamaConfig(hidden_size=2048, num_attention_heads=32, max_position_embeddings=131072,
                                          rope_theta=500_000.0, rope_scaling=scaling)
        ours = rope_inv_freq(hf_config_to_model_config(config))
        if scaling is None:
            plain = ours
            continue
        theirs, attention_scaling = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
        assert attention_scaling == 1.0 and torch.allclose(ours, theirs.float(), rtol=1e-6, atol=0)
        assert not torch.allclose(ours, plain)


@pytest.mark.parametrize("field,value", [("hidden_act", "gelu"), ("mlp_bias", True),
                                         ("rope_scaling", {"rope_type": "yarn", "factor": 4.0})])
def test_what_the_family_lacks_is_refused_by_name(tmp_path, field, value):
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=48, **{field: value})
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "m")
    name = "rope_type" if field == "rope_scaling" else field
    with pytest.raises(ConfigError, match=name):
        from_hf(tmp_path / "m")


def test_llama_attention_biases_load_as_qkv_biases_only_when_the_output_bias_is_zero(tmp_path):
    """Llama's ``attention_bias`` biases q, k, v and the output projection; the family has q/k/v biases (Qwen2's), so
    a Llama with zero output biases (what a Qwen2 export is written as) loads, and one with any other is refused."""
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=48, attention_bias=True)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.bias.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "zero")
    ours = from_hf(tmp_path / "zero")
    assert ours.cfg.qkv_bias
    x = torch.randint(0, 100, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(x).logits - ours.logits(x)).abs().max() < 1e-5
        model.model.layers[0].self_attn.o_proj.bias.fill_(0.1)
    model.save_pretrained(tmp_path / "biased")
    with pytest.raises(CheckpointError, match="output-projection bias"):
        from_hf(tmp_path / "biased")


def test_unsupported_decoders_are_clear_errors(tmp_path):
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=1, n_head=2, activation_function="relu")).save_pretrained(tmp_path / "relu")
    with pytest.raises(ConfigError, match="activation_function"):
        from_hf(tmp_path / "relu")
    phi = transformers.PhiConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=48)
    transformers.PhiForCausalLM(phi).save_pretrained(tmp_path / "phi")
    with pytest.raises(ConfigError, match=r"model_type='phi'.*llama.*mistral.*qwen2.*qwen3"):
        from_hf(tmp_path / "phi")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "llama", "mistral", "qwen2", "qwen3"])
def test_minipost_from_a_public_decoder_steps_1b_to_4_and_export_to_a_text_generation_pipeline(tmp_path, corpus_dir,
                                                                                               kind):
    """GPT-2 (tied, byte-level BPE, <|endoftext|> for everything) or a Llama-family model (unigram, <s> = 1, </s> = 2):
    plain Llama untied, Mistral, Qwen2 and Qwen3 with the options they ship with (``SHIPPED``: grouped-query attention,
    a sliding window, q/k/v biases, q/k norm and a head width apart from hidden / heads); Qwen2 with its own kind of
    tokenizer (byte-level BPE, <|endoftext|> = 0, no beginning-of-sequence token)."""
    if kind == "gpt2":
        source = gpt2_tokenizer(tmp_path / "tiny-gpt2")
        ids = {"bos_token_id": 0, "eos_token_id": 0}
    elif kind == "qwen2":
        source = qwen2_tokenizer(tmp_path / "tiny-qwen2")
        ids = {"bos_token_id": None, "eos_token_id": 0}
    else:
        source = llama_tokenizer(tmp_path / "tiny-llama")
        ids = {"bos_token_id": 1, "eos_token_id": 2}
    hf_tok = HFTokenizer(str(source), causal=True)
    eos = ids["eos_token_id"]
    assert hf_tok.specials.pad == hf_tok.specials.eos == hf_tok.specials.mask == eos  # no <pad>, no <mask>
    shipped = {} if kind in ("gpt2", "llama") else SHIPPED[kind]
    tiny(kind, hf_tok.vocab_size, **ids, **shipped).save_pretrained(source)
    args = [*tiny_overrides(tmp_path, corpus_dir), "data.num_workers=0", "sweep=[]", "system=minipost",
            "model.family=decoder", f"bridge.source={source}", "bridge.depth=1",
            "bridge.layers=1", "target_langs=[de]", f"tasks.lohelp.source={small_task(tmp_path)}",
            *stage_overrides(["bridge", "adapt"], global_batch=8, micro_batch=8, warmup_updates=1, val_every=4,
                             log_every=2),
            *stage_overrides(["bridge"], updates=3), *stage_overrides(["adapt"], updates=4, ckpt_every=4),
            "tasks.lohelp.max_train_examples=32", "tasks.lohelp.max_len=48", "finetune.epochs=1",
            "finetune.batch_size=16", "finetune.micro_batch=16", "finetune.mini_tasks=[]"]
    experiment = str(ROOT / "experiments" / "demo.yaml")
    assert main(["run", experiment, *args, "--no-progress"]) == 0
    runs = tmp_path / "runs" / "demo" / "minipost"
    rows = (runs / "results.jsonl").read_text()
    assert '"metric": "perplexity"' in rows and '"lang": "de"' in rows

    out = tmp_path / "export"
    assert main(["export", experiment, *args, "lang=de", "--out", str(out)]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    # a Qwen2 model is written as Llama with attention biases (hf_decoder.export_type): AutoTokenizer would replace
    # the German SentencePiece tokenizer beside a qwen2 config with Qwen2's byte-level BPE
    written = {"gpt2": "GPT2LMHeadModel", "qwen2": "LlamaForCausalLM"}.get(kind) or f"{LLAMA_FAMILY[kind]}ForCausalLM"
    assert type(model).__name__ == written
    assert tok.is_fast
    assert model.config.tie_word_embeddings == (kind == "gpt2")
    assert (model.config.pad_token_id, model.config.eos_token_id) == (tok.pad_token_id, tok.eos_token_id) == (1, 2)
    text = "Das ist ein kleiner Test"
    de = Tokenizer(tmp_path / "prepared" / "de" / "spm.model")
    ids = tok(text, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == [0, *de.encode_one(text)]  # <s> then the SentencePiece ids, no </s> after a prompt
    ours, _ = load_primary(str(source), "decoder")
    from minimodel.models.surgery import plug_embeddings
    from minimodel.store.checkpoints import load_adaptation
    from minimodel.store.layout import adaptation_checkpoints

    plug_embeddings(ours, load_adaptation(adaptation_checkpoints(runs / "adapt" / "de")[-1]), de.sha256,
                    de.vocab_size)
    with torch.no_grad():
        assert (model(ids).logits - ours.eval().logits(ids)).abs().max() < 1e-5
    generate = transformers.pipeline("text-generation", model=str(out), device="cpu")
    produced = generate(text, max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert produced.startswith(text) and len(produced) > len(text)
