"""Hugging Face interop of the decoder family (minimodel/hf_decoder.py), on tiny randomly initialised GPT-2 and Llama
models written here (no hub): ``from_hf`` gives the HF logits, ``to_hf`` round-trips, MiniPost runs steps 1b-4 from a
``GPT2LMHeadModel`` or ``LlamaForCausalLM`` directory with that model's own tokenizer (byte-level BPE or unigram, no
padding or mask token), and the adapted German model exports to ``AutoModelForCausalLM`` + a fast tokenizer that ``pipeline("text-generation")``
runs offline, with our logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from minimodel.cli import main  # noqa: E402
from minimodel.data.tokenizer import HFTokenizer, Tokenizer  # noqa: E402
from minimodel.hf_decoder import from_hf, to_hf  # noqa: E402
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


def tiny(kind: str, vocab: int, **extra: object):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=3, n_head=2, n_positions=64,
                                         **{"bos_token_id": 0, "eos_token_id": 0, **extra})
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=3, num_attention_heads=2,
                                      intermediate_size=96, max_position_embeddings=64,
                                      **{"bos_token_id": 0, "eos_token_id": 2, **extra})
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("kind,tied", [("gpt2", True), ("llama", False), ("llama", True)])
def test_from_hf_gives_the_hf_logits_and_to_hf_round_trips(tmp_path, kind, tied):
    hf = tiny(kind, 300, **({} if kind == "gpt2" else {"tie_word_embeddings": tied}))
    hf.save_pretrained(tmp_path / "hf")
    ours, _ = load_primary(str(tmp_path / "hf"), "decoder")  # bridge.source: a directory (or a hub id)
    assert type(ours).__name__ == "DecoderLM" and ours.cfg.tie_embeddings == tied
    x = torch.randint(3, 300, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (hf(x).logits - ours.logits(x)).abs().max() < 1e-5
    to_hf(ours, tmp_path / "back", bos=0, eos=2, pad=1)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(again).__name__ == type(hf).__name__
    with torch.no_grad():
        assert (again(x).logits - ours.logits(x)).abs().max() < 1e-5
    assert from_hf(tmp_path / "back").state_dict().keys() == ours.state_dict().keys()


def test_unsupported_decoders_are_clear_errors(tmp_path):
    tiny("llama", 100, num_key_value_heads=1).save_pretrained(tmp_path / "gqa")
    with pytest.raises(ValueError, match="num_key_value_heads"):
        from_hf(tmp_path / "gqa")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=1, n_head=2, activation_function="relu")).save_pretrained(tmp_path / "relu")
    with pytest.raises(ValueError, match="activation_function"):
        from_hf(tmp_path / "relu")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_minipost_from_a_public_decoder_steps_1b_to_4_and_export_to_a_text_generation_pipeline(tmp_path, corpus_dir,
                                                                                               kind):
    """GPT-2 (tied, byte-level BPE, <|endoftext|> for everything) or Llama (untied, unigram, <s> = 1, </s> = 2)."""
    if kind == "gpt2":
        source = gpt2_tokenizer(tmp_path / "tiny-gpt2")
        ids = {"bos_token_id": 0, "eos_token_id": 0}
    else:
        source = llama_tokenizer(tmp_path / "tiny-llama")
        ids = {"bos_token_id": 1, "eos_token_id": 2}
    hf_tok = HFTokenizer(str(source), causal=True)
    eos = ids["eos_token_id"]
    assert hf_tok.specials.pad == hf_tok.specials.eos == hf_tok.specials.mask == eos  # no <pad>, no <mask>
    tiny(kind, hf_tok.vocab_size, **ids).save_pretrained(source)
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
    assert type(model).__name__ == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[kind] and tok.is_fast
    assert model.config.tie_word_embeddings == (kind == "gpt2")
    assert (model.config.pad_token_id, model.config.eos_token_id) == (tok.pad_token_id, tok.eos_token_id) == (1, 2)
    text = "Das ist ein kleiner Test"
    de = Tokenizer(tmp_path / "prepared" / "de" / "spm.model")
    ids = tok(text, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == [0, *de.encode_one(text)]  # <s> then the SentencePiece ids, no </s> after a prompt
    ours, _ = load_primary(str(source), "decoder")
    from minimodel.checkpoints import load_adaptation
    from minimodel.layout import adaptation_checkpoints
    from minimodel.surgery import plug_embeddings

    plug_embeddings(ours, load_adaptation(adaptation_checkpoints(runs / "adapt" / "de")[-1]), de.sha256,
                    de.vocab_size)
    with torch.no_grad():
        assert (model(ids).logits - ours.eval().logits(ids)).abs().max() < 1e-5
    generate = transformers.pipeline("text-generation", model=str(out), device="cpu")
    produced = generate(text, max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert produced.startswith(text) and len(produced) > len(text)
