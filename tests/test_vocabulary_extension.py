"""``adapt.vocabulary: extend``: the target tokenizer is the source tokenizer plus the target pieces it lacks
(``data.extend``), every source piece keeping its id and its embedding. The extension of a SentencePiece source and of
a byte-level BPE (merges learned by hand and on real text), ``prepare`` making it, step 2 training the new rows only
(the source's bit-identical, also across a resume), evaluation and export (``AutoTokenizer`` and the model class load
it) with an extended vocabulary, over the project's own SentencePiece source and over a Hugging Face one."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from minimodel.cli import main
from minimodel.data.extend import learn_merges, needed, read_extension
from minimodel.data.tokenizer import WORD_START, HFTokenizer, Tokenizer, _bytes_to_unicode
from minimodel.errors import ConfigError
from tests.conftest import ROOT, real_text, stage_overrides, tiny_config, tiny_overrides

TINY = ROOT / "experiments" / "tiny.yaml"

# ------------------------------------------------------------------------------------------------ by hand


def test_merges_are_learned_where_the_text_has_them_and_only_toward_target_pieces():
    # "abcd" x5, "abx" x3, "cd" x1: the most frequent pair toward a wanted piece first (ab: 8), then abc (5), then
    # abcd (5); "cd" (6) is a prefix of nothing wanted, "bx" neither
    words = Counter({("a", "b", "c", "d"): 5, ("a", "b", "x"): 3, ("c", "d"): 1})
    assert learn_merges(words, {"abcd"}) == [("a", "b"), ("ab", "c"), ("abc", "d")]
    assert learn_merges(words, {"abcd", "cd"}) == [("a", "b"), ("c", "d"), ("ab", "cd")]  # cd (6) before abc
    assert learn_merges(words, {"abx"}) == [("a", "b"), ("ab", "x")]
    assert learn_merges(words, {"abx"}, min_count=4) == [("a", "b")]  # abx occurs 3 times
    assert learn_merges(Counter({("a", "a", "a"): 2}), {"aa"}) == [("a", "a")]
    # a prefix made on the way to a piece the text never completes is dropped; one a kept merge reads stays
    assert needed([("a", "b"), ("ab", "c"), ("x", "y")], {"abc", "xyz"}) == [("a", "b"), ("ab", "c")]
    assert needed([("a", "b"), ("x", "y"), ("xy", "z")], {"xyz"}) == [("x", "y"), ("xy", "z")]


# ------------------------------------------------------------------------------------------------ tokenizers


def own_tokenizers(prepared: Path) -> tuple[Tokenizer, Tokenizer]:
    return Tokenizer(prepared / "prepared" / "en" / "spm.model"), Tokenizer(prepared / "prepared" / "de" / "spm.model")


def test_a_sentencepiece_source_keeps_its_ids_and_gains_the_targets_pieces(tmp_path, prepared):
    from minimodel.data.extend import extend

    en, de = own_tokenizers(prepared)
    record = extend(en, de, tmp_path / "spm.model")
    ext = Tokenizer(tmp_path / "spm.model")
    assert ext.pieces()[:en.vocab_size] == en.pieces() and ext.specials == en.specials
    new = [p for p in de.pieces()[5:] if p not in set(en.pieces())]
    assert ext.pieces()[en.vocab_size:] == new and record["new"] == len(new) == ext.vocab_size - en.vocab_size
    assert record == {**record, "kept": en.vocab_size, "source_sha256": en.sha256, "target_sha256": de.sha256}
    assert read_extension(tmp_path / "spm.model") == record
    text = real_text("de", 20_000)
    assert len(ext.encode_one(text)) < 0.8 * len(en.encode_one(text))
    assert any(i >= en.vocab_size for i in ext.encode_one(text))


def test_a_byte_level_bpe_keeps_its_ids_and_reaches_the_targets_pieces(tmp_path, prepared):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from minimodel.data.extend import extend
    from tests.test_hf_source import build_hf_tokenizer

    source = HFTokenizer(str(build_hf_tokenizer(tmp_path / "bpe")))
    _, de = own_tokenizers(prepared)
    lines = real_text("de", 200_000).splitlines()
    record = extend(source, de, tmp_path / "ext" / "tokenizer", lines)
    ext = HFTokenizer(str(tmp_path / "ext" / "tokenizer"))
    kept = source.vocab_size
    assert record["kept"] == kept and ext.vocab_size == kept + record["new"] + record["intermediate"]
    assert ext.pieces()[:kept] == source.pieces() and ext.specials == source.specials
    assert record["new"] > 100 and record["unreachable"] >= 0
    added = {p for p in ext.pieces()[kept:]}
    to_bytes = _bytes_to_unicode()
    wanted = {"".join(to_bytes[b] for b in p.replace(WORD_START, " ").encode("utf-8")) for p in de.pieces()}
    assert len(added & wanted) == record["new"]  # "▁Über" is "ĠÃľber" in the byte-level alphabet
    # German text: fewer tokens; any text: the source's segmentation, some neighbours joined (the new merges come
    # after all of the source's), so every boundary between two pieces is one of the source's
    held_out = real_text("de", 260_000)[200_000:]
    assert len(ext.encode_one(held_out)) < 0.9 * len(source.encode_one(held_out))

    spelled = {id(t): t.pieces() for t in (ext, source)}

    def boundaries(tok: HFTokenizer, line: str) -> set[int]:
        ends, at = set(), 0
        for i in tok.encode_one(line):
            at += len(spelled[id(tok)][i])
            ends.add(at)
        return ends

    for line in [*real_text("en", 5_000).splitlines(), *held_out.splitlines()[:50]]:
        assert boundaries(ext, line) <= boundaries(source, line), line
    # as users load it
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "ext" / "tokenizer"))
    assert auto(held_out[:2000], add_special_tokens=False)["input_ids"] == ext.encode_one(held_out[:2000])


def test_a_tokenizer_that_is_neither_is_refused(tmp_path, prepared):
    pytest.importorskip("transformers")
    from minimodel.data.extend import extend
    from minimodel.data.tokenizer import TokenizerError
    from tests.test_hf_source import build_hf_tokenizer

    unigram = HFTokenizer(str(build_hf_tokenizer(tmp_path / "unigram", kind="unigram")))
    with pytest.raises(TokenizerError, match=r"is a Unigram tokenizer .* only SentencePiece models and byte-level BPE"):
        extend(unigram, own_tokenizers(prepared)[1], tmp_path / "out", [])
    assert not (tmp_path / "out").exists()


def test_a_bad_vocabulary_is_refused_at_load(tmp_path):
    with pytest.raises(ConfigError, match=r"adapt.vocabulary must be one of replace, extend, got 'grow'"):
        tiny_config(tmp_path, tmp_path, "adapt.vocabulary=grow")


def test_frozen_rows_stay_bit_identical_under_adamw_with_weight_decay():
    """The first rows get no gradient (so no moments) and are put back after each step: AdamW's decoupled weight decay
    would otherwise shrink them, gradient or not (as it does without the callback)."""
    from types import SimpleNamespace

    from minimodel.models.families import build
    from minimodel.models.model import ModelConfig
    from minimodel.models.surgery import adaptation_trainable, freeze_all_but
    from minimodel.training.callbacks import FrozenRows

    def train(frozen: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        model = build(ModelConfig(vocab_size=30, hidden=8, layers=1, heads=2, ffn=16, max_positions=20))
        freeze_all_but(model, adaptation_trainable)
        before = model.embeddings.tokens.weight.detach().clone()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1, weight_decay=0.1)
        if frozen:
            FrozenRows([n for n, p in model.named_parameters() if p.requires_grad], 20, model).on_train_start(
                SimpleNamespace(optimizers=[opt]), SimpleNamespace(model=model))
        ids = torch.randint(5, 30, (2, 12))
        for _ in range(3):
            loss = model.lm_losses(ids, ids)["primary"]
            loss.backward()
            if frozen:
                assert not model.embeddings.tokens.weight.grad[:20].any()
            opt.step()
            opt.zero_grad()
        return before, model.embeddings.tokens.weight.detach(), model.heads["primary"].bias.detach()

    before, after, bias = train(frozen=True)
    assert torch.equal(after[:20], before[:20]) and not torch.equal(after[20:], before[20:])
    assert not bias[:20].any() and bias[20:].any()  # the bias started at 0 and only its new entries moved
    before, after, _ = train(frozen=False)
    assert not torch.equal(after[:20], before[:20])


def test_step_2_is_priced_at_the_extended_vocabulary(tmp_path):
    from minimodel.cluster.memory import stage_models
    from minimodel.systems import stage_plan

    replace = tiny_config(tmp_path, tmp_path, "system=bl_base", "model.mini_heads=[]")
    extend = tiny_config(tmp_path, tmp_path, "system=bl_base", "model.mini_heads=[]", "adapt.vocabulary=extend")
    assert stage_plan(replace, "adapt").target_vocab == 1000 and stage_plan(extend, "adapt").target_vocab == 2000
    rows = {m.stage: m for m in stage_models(extend)}
    assert rows["adapt"].vocab == 2000 and rows["adapt"].trainable == 2000 * 64 + 2000


# ------------------------------------------------------------------------------------------------ end to end


def chain_args(tmp: Path, corpus: Path, *extra: str) -> list[str]:
    return [*tiny_overrides(tmp, corpus), "data.num_workers=0", "system=bl_base", "model.mini_heads=[]",
            "target_langs=[de]", "sweep=[]",
            *stage_overrides(["pretrain", "adapt"], updates=4, global_batch=8, micro_batch=4, warmup_updates=1,
                             lr=2e-3, ckpt_every=2, val_every=4),
            f"tasks.lohelp.source={ROOT / 'data/demo/task/lohelp'}", "tasks.lohelp.kind=local",
            "tasks.lohelp.max_train_examples=32", "tasks.lohelp.max_len=48", "finetune.tasks=[lohelp]",
            "finetune.seeds=[1]", "finetune.epochs=1", "finetune.batch_size=8", "finetune.micro_batch=8",
            "finetune.trainer.accelerator=cpu", "finetune.trainer.precision=32-true", "adapt.vocabulary=extend",
            *extra]


def small_corpus(tmp: Path) -> Path:
    d = tmp / "corpus"
    d.mkdir()
    for lang in ("en", "de"):
        (d / f"{lang}.txt").write_text(real_text(lang, 300_000), encoding="utf-8")
    return d


LLAMA = ["model.family=decoder", "model.norm=rmsnorm", "model.positions=rotary", "model.activation=swiglu",
         "model.bias=false", "model.tie_embeddings=false"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["encoder", "decoder-untied"])
def test_minimodel_run_with_an_extended_vocabulary(tmp_path, family):
    """prepare (the extension after the source), step 1, step 2 over the extended vocabulary, step 3, step 4 and the
    report from `minimodel run`; then the source rows are bit-identical, the new ones trained, a resumed step 2 ends
    where an uninterrupted one does, and the export loads in transformers."""
    from minimodel.data.prepare import load_prepared_tokenizer
    from minimodel.experiment import load_experiment
    from minimodel.pipeline import plan
    from minimodel.stages.adapt import run_adapt
    from minimodel.store.checkpoints import load_adaptation, load_checkpoint, load_trained_model
    from minimodel.store.results import ResultsTable
    from minimodel.training.runner import Outcome

    corpus = small_corpus(tmp_path)
    args = chain_args(tmp_path, corpus, *(LLAMA if family != "encoder" else []))
    steps = {s.name: s for s in plan(TINY, args)}
    assert steps["prepare-de"].after == ("prepare-en",) and steps["prepare-en"].after == ()
    assert main(["run", str(TINY), *args, "--no-progress"]) == 0
    cfg = load_experiment(TINY, [*args, "lang=de"])
    en, de = load_prepared_tokenizer(cfg, "en"), load_prepared_tokenizer(cfg, "de")
    assert Path(de.path).parent.name == "extend-spm" and de.pieces()[:1000] == en.pieces()
    runs = tmp_path / "runs" / "tiny" / "bl_base"
    primary, _ = load_trained_model(runs / "pretrain" / "checkpoints" / "last.ckpt")
    info = json.loads((runs / "adapt" / "de" / "adapt_info.json").read_text())
    new = de.vocab_size - 1000
    assert info["kept_rows"] == 1000 and info["target_vocab"] == de.vocab_size and new > 500
    assert info["init"]["vocabulary"] == {"mode": "extend", "kept": 1000, "new": new, "intermediate": 0,
                                          "unreachable": 0}
    untied = family != "encoder"
    assert info["trained_parameters"] == new * 64 * (2 if untied else 1) + (0 if untied else new)
    # the source rows are the pretrained model's, bit for bit, at every checkpoint; the new rows trained
    ckpts = sorted((runs / "adapt" / "de" / "embeddings").glob("step*.pt"))
    first, last = load_adaptation(ckpts[0]), load_adaptation(ckpts[-1])
    head = primary.heads["primary"]
    for a in (first, last):
        assert a.kept == 1000 and torch.equal(a.embeddings[:1000], primary.embeddings.tokens.weight.detach())
        if untied:
            assert torch.equal(a.output[:1000], head.decoder.weight.detach())
        else:
            assert torch.equal(a.bias[:1000], head.bias.detach())
    assert not torch.equal(first.embeddings[1000:], last.embeddings[1000:])
    state = load_checkpoint(runs / "adapt" / "de" / "checkpoints" / "last.ckpt")["state_dict"]
    assert torch.equal(state["model.embeddings.tokens.weight"], last.embeddings)
    # step 4 read the extended vocabulary
    rows = ResultsTable(runs / "results.jsonl").rows()
    assert {r["step"] for r in rows if r["lang"] == "de"} == {0, 2, 4}

    # a resumed run: stopped after update 2, resumed, the same as the finished one
    twin = load_experiment(TINY, [*args, "lang=de", "name=twin", "adapt.trainer.stop_at=2"])
    import shutil

    shutil.copytree(runs / "pretrain", tmp_path / "runs" / "twin" / "bl_base" / "pretrain")
    assert run_adapt(twin, progress_bar=False).outcome is Outcome.STOPPED
    resumed = run_adapt(load_experiment(TINY, [*args, "lang=de", "name=twin"]), progress_bar=False)
    again = load_adaptation(sorted((resumed.run_dir / "embeddings").glob("step*.pt"))[-1])
    assert torch.equal(again.embeddings, last.embeddings) and torch.equal(again.bias, last.bias)

    # another vocabulary for the finished run is refused (the stage identity)
    with pytest.raises(ConfigError, match=r"adapt.vocabulary: 'extend' -> 'replace'"):
        run_adapt(load_experiment(TINY, [*args, "lang=de", "adapt.vocabulary=replace"]), progress_bar=False)

    # export: the model class and AutoTokenizer load it and give its logits
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "export"
    assert main(["export", str(TINY), *args, "lang=de", "--out", str(out)]) == 0
    auto = transformers.AutoTokenizer.from_pretrained(str(out))
    text = "Das ist ein kleiner Test der Übersetzung."
    ids = auto(text)["input_ids"]
    assert ids[1:-1 if not untied else None] == de.encode_one(text) and max(ids) >= 1000
    loader = transformers.AutoModelForCausalLM if untied else transformers.AutoModelForMaskedLM
    model = loader.from_pretrained(str(out)).eval()
    assert model.get_input_embeddings().weight.shape[0] == de.vocab_size
    assert torch.equal(model.get_input_embeddings().weight.detach(), last.embeddings)
    # the finetuned classifier with the extended vocabulary (a decoder's reads the last real token: its tokenizer
    # ends the text with </s>, as finetuning did, where the LM's leaves it open for generation)
    task = tmp_path / "task"
    assert main(["export", str(TINY), *args, "lang=de", "task=lohelp", "seed=1", "--out", str(task)]) == 0
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(str(task)).eval()
    assert torch.equal(classifier.get_input_embeddings().weight.detach(), last.embeddings)
    task_ids = transformers.AutoTokenizer.from_pretrained(str(task))(text)["input_ids"]
    assert task_ids == (ids + [auto.eos_token_id] if untied else ids)
    # the small artifact and plugging it back
    small = tmp_path / "small"
    assert main(["export", str(TINY), *args, "lang=de", "--embeddings-only", "--out", str(small)]) == 0
    assert main(["export", str(TINY), *args, "lang=de", "--embeddings", str(small), "--out",
                 str(tmp_path / "again")]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("padded", [False, True], ids=["rows-are-pieces", "padded-matrix"])
def test_step_2_extends_a_hugging_face_byte_level_bpe(tmp_path, padded):
    """Standard adaptation over a public model (a tiny RoBERTa with its own byte-level BPE): the extended tokenizer is
    a Hugging Face directory that prepare makes from the model's and the German SentencePiece model, step 2 keeps the
    model's rows, and the export's AutoTokenizer gives the extended ids. Also over a matrix padded past the
    tokenizer's pieces (as Qwen's is): the new pieces take the ids after the last piece, not after the padding, and
    the padding rows are left behind."""
    transformers = pytest.importorskip("transformers")
    from minimodel.data.prepare import load_prepared_tokenizer
    from minimodel.experiment import load_experiment
    from minimodel.models.hf import from_hf, to_hf
    from minimodel.models.model import ModelConfig, RobertaMLM
    from minimodel.stages.adapt import run_adapt
    from minimodel.store.checkpoints import load_adaptation
    from tests.test_hf_source import build_hf_tokenizer

    hf_dir = build_hf_tokenizer(tmp_path / "tiny-roberta")
    torch.manual_seed(0)
    pieces = HFTokenizer(str(hf_dir)).vocab_size
    rows = (pieces // 64 + 1) * 64 if padded else pieces  # 801 pieces: 832 rows
    to_hf(RobertaMLM(ModelConfig(vocab_size=rows, hidden=64, layers=2, heads=2, ffn=128, max_positions=66)), hf_dir)
    corpus = small_corpus(tmp_path)
    args = [*chain_args(tmp_path, corpus), f"bridge.source={hf_dir}", "lang=de", "adapt.init=mean"]
    for lang in ("en", "de"):
        assert main(["prepare", str(TINY), *args, f"--langs={lang}", "--no-progress"]) == 0
    cfg = load_experiment(TINY, args)
    source, de = load_prepared_tokenizer(cfg, "en"), load_prepared_tokenizer(cfg, "de")
    assert isinstance(de, HFTokenizer) and Path(de.path).name == "tokenizer"
    assert Path(de.path).parent.name.startswith("extend-tiny-roberta")
    kept = source.vocab_size
    assert de.pieces()[:kept] == source.pieces() and de.vocab_size > kept + 100 and kept == pieces
    assert from_hf(hf_dir).cfg.vocab_size == rows
    run_dir = run_adapt(cfg, progress_bar=False).run_dir
    primary = from_hf(hf_dir)
    last = load_adaptation(sorted((run_dir / "embeddings").glob("step*.pt"))[-1])
    assert last.kept == kept and torch.equal(last.embeddings[:kept], primary.embeddings.tokens.weight[:kept].detach())
    assert torch.equal(last.bias[:kept], primary.heads["primary"].bias[:kept].detach())
    info = json.loads((run_dir / "adapt_info.json").read_text())
    assert info["kept_rows"] == info["init"]["vocabulary"]["kept"] == pieces  # not the padded matrix's rows
    assert de.pieces()[pieces] not in set(source.pieces())  # the first new piece follows the last source piece
    info = info["init"]
    assert info["method"] == "mean" and info["vocabulary"]["new"] > 100 and info["mean"] > 100
    out = tmp_path / "export"
    assert main(["export", str(TINY), *args, "--out", str(out)]) == 0
    auto = transformers.AutoTokenizer.from_pretrained(str(out))
    text = "Die Übersetzung der Bedienungsanleitung ist fertig."
    assert auto(text)["input_ids"] == [source.specials.bos, *de.encode_one(text), source.specials.eos]
    model = transformers.AutoModelForMaskedLM.from_pretrained(str(out)).eval()
    assert torch.equal(model.get_input_embeddings().weight.detach(), last.embeddings)
