"""MiniPost from a Hugging Face checkpoint: the source language is encoded with the public model's own
tokenizer (byte-level BPE with <mask> as its last id, like roberta-base), masking uses that
tokenizer's special ids, and overlap initialisation matches its pieces with the SentencePiece
pieces of the target language across the two spelling conventions ("Ġthe" vs "▁the")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from minimodel.cli import main  # noqa: E402
from minimodel.data.mlm import Masker  # noqa: E402
from minimodel.data.prepare import prepared_paths  # noqa: E402
from minimodel.data.shards import TokenStream  # noqa: E402
from minimodel.data.tokenizer import (  # noqa: E402
    SENTENCEPIECE_SPECIALS,
    HFTokenizer,
    SpecialTokens,
    Tokenizer,
    TokenizerError,
    byte_level_surface,
    load_tokenizer,
    wordpiece_surface,
)
from minimodel.models.hf import from_hf, to_hf  # noqa: E402
from minimodel.models.model import IGNORE_INDEX, PRIMARY, ModelConfig, RobertaMLM  # noqa: E402
from minimodel.store.checkpoints import load_checkpoint, load_trained_model  # noqa: E402
from minimodel.store.results import ResultsTable  # noqa: E402
from tests.conftest import ROOT, real_text, stage_overrides, tiny_overrides  # noqa: E402

BPE_VOCAB = 800  # + <mask> = 801 ids


def build_hf_tokenizer(out: Path, kind: str = "bpe", vocab: int = BPE_VOCAB) -> Path:
    """A RoBERTa-style tokenizer trained on real English text and saved as a Hugging Face directory:
    byte-level BPE (roberta-base) or SentencePiece unigram (xlm-roberta-base), <mask> last."""
    from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
    from transformers import RobertaTokenizerFast, XLMRobertaTokenizerFast

    lines = real_text("en", 400_000).splitlines()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    if kind == "bpe":
        backend = ByteLevelBPETokenizer()
        backend.train_from_iterator(lines, vocab_size=vocab, min_frequency=2, special_tokens=specials,
                                    show_progress=False)
        cls = RobertaTokenizerFast
    else:
        backend = SentencePieceUnigramTokenizer()
        backend.train_from_iterator(lines, vocab_size=vocab, special_tokens=specials, unk_token="<unk>",
                                    show_progress=False)
        cls = XLMRobertaTokenizerFast
    tok = cls(tokenizer_object=backend._tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>",
              cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random RoBERTa MLM with its own byte-level BPE tokenizer, as a public model directory."""
    out = build_hf_tokenizer(tmp_path_factory.mktemp("hf") / "tiny-roberta")
    vocab = len(HFTokenizer(str(out)).pieces())
    torch.manual_seed(0)
    model = RobertaMLM(ModelConfig(vocab_size=vocab, hidden=64, layers=2, heads=2, ffn=128, max_positions=66))
    to_hf(model, out)
    return out


# ------------------------------------------------------------------------------------------ tokenizers


def test_byte_level_and_wordpiece_pieces_in_sentencepiece_spelling():
    assert byte_level_surface("Ġthe") == "\u2581the"
    assert byte_level_surface("the") == "the"
    assert byte_level_surface("ĠmÃ¼de") == "\u2581müde"  # "ü" is two bytes, written "Ã¼"
    assert byte_level_surface("Ã") is None  # the first byte of a two-byte character
    assert byte_level_surface("ĠĠ") == "\u2581\u2581"
    assert byte_level_surface("é") is None  # not in the byte alphabet ("é" is "Ã©")
    assert wordpiece_surface("##ing") == "ing" and wordpiece_surface("walk") == "\u2581walk"


def test_hf_tokenizer_interface(hf_dir):
    tok = load_tokenizer(str(hf_dir))
    assert isinstance(tok, HFTokenizer) and tok.convention == "byte-level"
    assert tok.vocab_size == BPE_VOCAB + 1
    assert tok.specials == SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=BPE_VOCAB)
    assert tok.specials.ids == (0, 1, 2, 3, BPE_VOCAB)
    assert HFTokenizer(str(hf_dir)).sha256 == tok.sha256  # same content, same identity
    text = "The quick brown fox jumps over  the lazy dog."
    ids = tok.encode_one(text)
    assert tok.encode([text, "the"]) == [ids, tok.encode_one("the")]
    assert tok.decode(ids) == text and not set(ids) & set(tok.specials.ids)
    ids2, offsets = tok.encode_with_offsets(text)
    assert ids2 == ids
    pieces = tok.pieces()
    for i, (start, end) in zip(ids, offsets):  # each span is the piece's text without its leading space
        assert text[start:end] == byte_level_surface(pieces[i]).lstrip("\u2581")
    surface = tok.surface_pieces()
    assert surface[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and surface[BPE_VOCAB] == "<mask>"
    the = pieces.index("Ġthe")
    assert surface[the] == "\u2581the"


def test_text_that_spells_a_special_token_is_encoded_as_text(hf_dir):
    """A corpus line may spell a special token (the bundled Chinese corpus has "setmode <filename> <perm=...>", one of
    SmolLM2's specials): it is the characters it is, as SentencePiece reads it, never the special id (an end of text
    or a mask in mid-line), in every way of encoding."""
    tok = HFTokenizer(str(hf_dir))
    text = "the cat </s> sat on <mask> the <s>mat"
    ids = tok.encode_one(text)
    assert not set(ids) & set(tok.specials.ids), ids
    assert tok.encode([text]) == [ids] and tok.decode(ids) == text
    ids2, offsets = tok.encode_with_offsets(text)
    assert ids2 == ids
    assert "".join(text[a:b] for a, b in offsets).replace(" ", "") == text.replace(" ", "")
    assert tok.hf(text, add_special_tokens=False)["input_ids"] != ids  # transformers' own default reads them as ids


def test_a_truncation_saved_with_the_tokenizer_does_not_cut_corpus_lines(hf_dir, tmp_path):
    tok = HFTokenizer(str(hf_dir))
    line = " ".join(["the quick brown fox"] * 50)
    full = tok.encode_one(line)
    tok.hf.backend_tokenizer.enable_truncation(max_length=8)  # as some hub tokenizer.json files carry
    tok.hf.save_pretrained(tmp_path / "truncating")
    assert '"max_length": 8' in (tmp_path / "truncating" / "tokenizer.json").read_text()
    again = HFTokenizer(str(tmp_path / "truncating"))
    assert len(full) > 100 and again.encode([line]) == [full] and again.encode_one(line) == full
    assert again.sha256 == tok.sha256  # the same encoding, the same identity


def test_sentencepiece_style_hf_tokenizer_keeps_its_pieces(tmp_path):
    tok = HFTokenizer(str(build_hf_tokenizer(tmp_path / "xlmr", kind="unigram", vocab=600)))
    assert tok.convention == "sentencepiece" and tok.specials.mask == tok.vocab_size - 1
    assert tok.surface_pieces() == tok.pieces() and "\u2581the" in tok.pieces()
    text = "Hello world, the fox"
    ids, offsets = tok.encode_with_offsets(text)
    assert ids == tok.encode_one(text) and tok.decode(ids) == text
    assert all(0 <= s <= e <= len(text) and not text[s:e].startswith(" ") for s, e in offsets)


def test_unusable_hf_tokenizers_fail_clearly(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError, match=r"from the directory .*empty: expected tokenizer.json"):
        HFTokenizer(str(tmp_path / "empty"))


# --------------------------------------------------------------------------------------------- masking


def test_masking_with_the_mask_id_last():
    V = 801
    specials = SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=V - 1)
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, V - 1, size=200_000)
    tokens[::50] = 2
    tokens[0] = 0
    inputs, labels = Masker(V, 0.15, specials)(tokens, np.random.default_rng(1))
    chosen = labels != IGNORE_INDEX
    assert np.isin(tokens[chosen], specials.ids).sum() == 0  # specials never masked
    assert abs(chosen.sum() / (~np.isin(tokens, specials.ids)).sum() - 0.15) < 0.005
    assert abs((inputs[chosen] == V - 1).mean() - 0.8) < 0.01  # <mask> is id 800 here, not 4
    replaced = chosen & (inputs != tokens) & (inputs != V - 1)
    assert abs(replaced.sum() / chosen.sum() - 0.1) < 0.01
    assert not np.isin(inputs[replaced], specials.ids).any()  # random replacements are never specials
    assert (inputs[replaced] == 4).any()  # id 4 is an ordinary piece for this tokenizer
    assert (inputs[~chosen] == tokens[~chosen]).all()


def test_sentencepiece_masking_is_unchanged_by_the_general_path():
    """The fast path (specials = 0..4) and the lookup path draw the same masks."""
    V = 1000
    tokens = np.random.default_rng(0).integers(5, V, size=5000)
    fast = Masker(V, 0.15, SENTENCEPIECE_SPECIALS)
    general = Masker(V, 0.15, SENTENCEPIECE_SPECIALS)
    general.leading, general.regular = 0, np.arange(5, V)
    a, b = fast(tokens, np.random.default_rng(3)), general(tokens, np.random.default_rng(3))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


# ------------------------------------------------------------------------------------- end to end


def overrides(tmp: Path, corpus: Path, hf_dir: Path) -> list[str]:
    return [*tiny_overrides(tmp, corpus), "data.num_workers=0", "sweep=[]", "system=minipost",
            f"bridge.source={hf_dir}", "bridge.depth=1", "bridge.layers=1", "target_langs=[de]",
            *stage_overrides(["bridge", "adapt"], global_batch=8, micro_batch=4, warmup_updates=1, val_every=4,
                             log_every=2),
            *stage_overrides(["bridge"], updates=6), *stage_overrides(["adapt"], updates=6, ckpt_every=3, ckpt_steps=[1]),
            "tasks.lohelp.max_train_examples=64", "tasks.lohelp.max_len=48",
            "finetune.epochs=1", "finetune.batch_size=16", "finetune.micro_batch=16", "finetune.mini_tasks=[]"]


@pytest.mark.slow
def test_minipost_from_a_hugging_face_model_through_steps_1b_to_4(tmp_path, corpus_dir, hf_dir):
    args = overrides(tmp_path, corpus_dir, hf_dir)
    experiment = str(ROOT / "experiments" / "demo.yaml")
    assert main(["run", experiment, *args, "--no-progress"]) == 0
    from minimodel.experiment import load_experiment
    from minimodel.systems import stage_plan

    cfg = load_experiment(experiment, args)
    hf_tok = HFTokenizer(str(hf_dir))
    assert stage_plan(cfg, "prepare").tokenizer == str(hf_dir)  # MiniPost from a HF model uses that model's tokenizer

    # prepare: English encoded with the model's own tokenizer (no SentencePiece model for English)
    en = prepared_paths(cfg, "en")
    assert en.hf and en.tokenizer == str(hf_dir) and not (tmp_path / "prepared" / "en" / "spm.model").exists()
    stream = TokenStream.open(en.shards)
    assert stream.vocab_size == hf_tok.vocab_size and stream.tokenizer_sha256 == hf_tok.sha256
    first_line = real_text("en", 400_000).splitlines()[0]
    expected = hf_tok.encode_one(first_line)
    assert stream.slice(0, len(expected) + 1).tolist() == [*expected, hf_tok.specials.eos]

    # the bridge trained with that tokenizer's <mask> (id 800), and only its new layer changed
    from minimodel.stages.pretrain import mlm_datamodule

    dm = mlm_datamodule(cfg, "en", cfg.bridge.optim, 1, hf_tok)
    dm.setup()
    batch = dm.train_set[0]
    masked = batch["labels"] != IGNORE_INDEX
    assert batch["input_ids"][0] == 0 and (batch["input_ids"][masked] == BPE_VOCAB).any()
    primary = from_hf(hf_dir)
    mini, meta = load_trained_model(tmp_path / "runs" / "demo" / "minipost" / "bridge" / "checkpoints" / "last.ckpt")
    assert meta.tokenizer["sha256"] == hf_tok.sha256 and mini.cfg.layers == 2
    for name, value in mini.state_dict().items():
        if not name.startswith("layers.1."):
            assert torch.equal(value, primary.state_dict()[name]), f"{name} changed during the bridge"
    assert not torch.equal(mini.layers[1].qkv.weight, primary.layers[1].qkv.weight)

    # adapt: overlap across conventions ("Ġ..." BPE pieces vs "▁..." SentencePiece pieces)
    adapt_dir = tmp_path / "runs" / "demo" / "minipost" / "adapt" / "de"
    info = json.loads((adapt_dir / "adapt_info.json").read_text())
    de_tok = Tokenizer(prepared_paths(cfg, "de").tokenizer)
    source_surface = hf_tok.surface_pieces()
    shared = [p for p in de_tok.pieces() if p in set(source_surface)]
    assert info["overlapping_pieces"] == len(shared) > 100
    step0 = load_checkpoint(sorted((adapt_dir / "embeddings").glob("step*.pt"))[0])
    assert step0["step"] == 0
    word_pieces = [p for p in shared if p.startswith("\u2581") and len(p) > 2]
    assert word_pieces, "no whole-word piece shared between the English BPE and the German SentencePiece"
    for piece in word_pieces[:20]:
        src = source_surface.index(piece)
        assert hf_tok.pieces()[src].startswith("Ġ")
        trg = de_tok.pieces().index(piece)
        assert torch.equal(step0["embeddings"][trg], primary.embeddings.tokens.weight[src].detach())
        assert step0["bias"][trg] == primary.heads[PRIMARY].bias[src]

    # finetune (with the model's tokenizer) and evaluate (German embeddings plugged into the HF model)
    # MiniPost shares BL_BASE's finetunings of the public model (as it shares BL_BASE's own when there is none)
    assert not (tmp_path / "runs" / "demo" / "minipost" / "finetune").exists()
    ft = load_checkpoint(tmp_path / "runs" / "demo" / "bl_base" / "finetune" / "lohelp" / "seed1" / "model.pt")
    assert ft["tokenizer"]["sha256"] == hf_tok.sha256 and ft["model_config"]["vocab_size"] == BPE_VOCAB + 1
    assert torch.equal(ft["body_state"]["embeddings.tokens.weight"], primary.embeddings.tokens.weight)
    rows = ResultsTable(tmp_path / "runs" / "demo" / "minipost" / "results.jsonl").rows()
    assert {r["step"] for r in rows if r["lang"] == "de"} == {0, 1, 3, 6}
    assert {(r["lang"], r["split"]) for r in rows if r["lang"] == "en"} == {("en", "dev"), ("en", "test")}


def test_a_tokenizer_that_does_not_fit_the_hf_model_is_refused(tmp_path, corpus_dir, hf_dir):
    other = build_hf_tokenizer(tmp_path / "other", vocab=500)
    args = [*overrides(tmp_path, corpus_dir, hf_dir), f"data.source_tokenizer={other}"]
    experiment = str(ROOT / "experiments" / "demo.yaml")
    assert main(["prepare", experiment, *args, "--langs=en", "--no-progress"]) == 0
    from minimodel.experiment import load_experiment
    from minimodel.stages.bridge import run_bridge

    with pytest.raises(TokenizerError, match=r"has 501 pieces but the model bridge.source=.*tiny-roberta has a "
                                             r"vocabulary of 801 \(a model's matrix may exceed its tokenizer only by "
                                             r"alignment padding"):
        run_bridge(load_experiment(experiment, args), progress_bar=False)
    assert not (tmp_path / "runs" / "demo" / "minipost" / "bridge").exists()  # nothing written


def test_a_matrix_padded_past_its_tokenizer_is_accepted_and_nothing_else():
    """Public models whose embedding matrix is padded past their tokenizer (rows a multiple of 64) are read; a
    tokenizer of another size is not (the matrix is not a multiple of 64, or the tokenizer is larger, or far
    smaller)."""
    from minimodel.data.prepare import padded_rows

    assert padded_rows(49_152, 49_152) == 0  # SmolLM2
    assert padded_rows(151_665, 151_936) == 271  # Qwen2.5-0.5B
    assert padded_rows(50_295, 51_200) == 905  # Phi-2 (an architecture minimodel does not read: the rule's)
    assert padded_rows(50_277, 50_304) == 27  # Pythia (likewise)
    assert padded_rows(801, 832) == 31
    assert padded_rows(501, 801) == -1  # 801 is no alignment
    assert padded_rows(832, 801) == padded_rows(900, 832) == -1  # a tokenizer larger than the matrix
    assert padded_rows(500, 2048) == -1  # 1,548 rows past the pieces: another tokenizer, not padding


def test_a_padded_matrix_is_read_with_its_own_tokenizer_only(tmp_path, corpus_dir, hf_dir):
    """A public model whose matrix is padded past its tokenizer (801 pieces, 832 rows) gets its bridge with its own
    tokenizer; another tokenizer of the same size named by data.source_tokenizer is refused before anything is
    written (no checkpoint record backs a public model's tokenizer: the size is the only check)."""
    import shutil

    from minimodel.experiment import load_experiment
    from minimodel.stages.bridge import run_bridge

    padded = tmp_path / "padded-roberta"
    shutil.copytree(hf_dir, padded)
    torch.manual_seed(0)
    to_hf(RobertaMLM(ModelConfig(vocab_size=832, hidden=64, layers=2, heads=2, ffn=128, max_positions=66)), padded)
    assert from_hf(padded).cfg.vocab_size == 832 and HFTokenizer(str(padded)).vocab_size == 801
    experiment = str(ROOT / "experiments" / "demo.yaml")
    other = [*overrides(tmp_path, corpus_dir, padded), f"data.source_tokenizer={hf_dir}"]  # the same pieces
    assert main(["prepare", experiment, *other, "--langs=en", "--no-progress"]) == 0
    with pytest.raises(TokenizerError, match=r"has 801 pieces but the model .* has a vocabulary of 832: a matrix "
                                             r"padded past its tokenizer is read only with the model's own"):
        run_bridge(load_experiment(experiment, other), progress_bar=False)
    assert not (tmp_path / "runs" / "demo" / "minipost" / "bridge").exists()
    own = overrides(tmp_path, corpus_dir, padded)
    assert main(["prepare", experiment, *own, "--langs=en", "--no-progress"]) == 0
    run = run_bridge(load_experiment(experiment, own), progress_bar=False)
    assert run.done["step"] == 6 and load_trained_model(run.run_dir / "checkpoints" / "last.ckpt")[0].cfg.vocab_size == 832


def test_a_bridge_reads_another_language_in_the_models_own_tokenizer(tmp_path, corpus_dir, hf_dir):
    """bridge.langs over a public model: German is encoded by the model's own tokenizer beside English's layout
    ({lang}/hf-{name}/), and the bridge reads it in turn with English (bridge_info.json's langs)."""
    from minimodel.experiment import load_experiment
    from minimodel.stages.bridge import run_bridge

    experiment = str(ROOT / "experiments" / "demo.yaml")
    args = [*overrides(tmp_path, corpus_dir, hf_dir), "bridge.langs=[de]"]
    assert main(["prepare", experiment, *args, "--no-progress"]) == 0  # en, de, and de in the model's tokenizer
    cfg = load_experiment(experiment, args)
    de = prepared_paths(cfg, "de", in_source=True)
    assert de.hf and de.shards.parent.parent == tmp_path / "prepared" / "de" and de.shards.parent.name.startswith("hf-")
    hf_tok = HFTokenizer(str(hf_dir))
    stream = TokenStream.open(de.shards)
    assert stream.tokenizer_sha256 == hf_tok.sha256
    first_line = real_text("de", 400_000).splitlines()[0]
    assert stream.slice(0, 8).tolist() == hf_tok.encode_one(first_line)[:8]
    run = run_bridge(cfg, progress_bar=False)
    info = run.done["bridge"]["langs"]["de"]
    assert info["train_blocks"] > 0 and info["held_out_lines"] > 1.25 * info["step2_held_out_lines"]["replace"]
    assert info["step0"]["tokens"] > 0 and info["final"]["tokens"] == info["step0"]["tokens"]


@pytest.mark.slow
def test_pretraining_with_a_hugging_face_tokenizer(tmp_path, corpus_dir, hf_dir):
    """data.source_tokenizer also serves step 1 (e.g. BL_BASE with RoBERTa's own byte-level BPE)."""
    from minimodel.data.prepare import prepare_language
    from minimodel.experiment import load_experiment
    from minimodel.stages.pretrain import run_pretrain

    cfg = load_experiment(ROOT / "experiments" / "tiny.yaml", [
        *tiny_overrides(tmp_path, corpus_dir), f"data.prepared_dir={tmp_path / 'p'}",  # its own prepared dir
        "data.num_workers=0", f"data.source_tokenizer={hf_dir}", f"model.vocab_size={BPE_VOCAB + 1}",
        *stage_overrides(["pretrain"], updates=4, global_batch=8, micro_batch=4, warmup_updates=1, val_every=4,
                         log_every=2, ckpt_every=4)])
    prepare_language(cfg, "en", progress=False)
    run_dir = run_pretrain(cfg, progress_bar=False).run_dir
    model, meta = load_trained_model(run_dir / "checkpoints" / "last.ckpt")
    assert model.cfg.vocab_size == BPE_VOCAB + 1 and meta.tokenizer["sha256"] == HFTokenizer(str(hf_dir)).sha256
    assert json.loads((run_dir / "done.json").read_text())["step"] == 4
    with pytest.raises(TokenizerError, match=r"has 801 pieces but model.vocab_size is 1000"):
        run_pretrain(load_experiment(ROOT / "experiments" / "tiny.yaml", [
            f"runs_dir={tmp_path / 'runs2'}", f"data.prepared_dir={tmp_path / 'p'}",
            f"data.source_tokenizer={hf_dir}", "model.vocab_size=1000", "data.vocab_size=1000"]), progress_bar=False)
