"""``adapt.init=focus`` (Dobler & de Melo, EMNLP 2023): sparsemax, top-k and the weighted sum against hand-computed
values; the auxiliary fastText vectors trained once per text, tokenizer and settings, cached with the prepared
language, bit-reproducible, retrained when the corpus or the tokenizer changes; every system's step 2 from
``minimodel run`` without any network access; a Hugging Face source; a run refusing to resume with another init;
bad values refused at load; ``{system}@focus`` variant rows from ``adapt.tag``."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from minimodel.errors import ConfigError
from minimodel.models.focus import focus_init, mix_weights, sparsemax
from minimodel.models.surgery import overlap_init
from minimodel.pipeline import plan, variants
from minimodel.systems import stage_plan
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_config, tiny_overrides

DEMO = ROOT / "experiments" / "demo.yaml"
needs_fasttext = pytest.mark.skipif(importlib.util.find_spec("fasttext") is None,
                                    reason="the focus extra (fastText) is not installed: pip install 'minimodel[focus]'")

# ------------------------------------------------------------------------------------------------ by hand


def test_sparsemax_top_k_and_the_mix_by_hand():
    # z = (1, .8, 0, -1): k = 2 (1 + 2*.8 > 1.8, 1 + 3*0 < 1.8), tau = (1.8 - 1)/2 = .4 -> (.6, .4, 0, 0)
    # z = (.5, .4, .3, -1): k = 3 (1 + 3*.3 = 1.9 > 1.2), tau = (1.2 - 1)/3 -> (.4333, .3333, .2333, 0)
    z = torch.tensor([[1.0, 0.8, 0.0, -1.0], [0.5, 0.4, 0.3, -1.0]], dtype=torch.float64)
    expected = torch.tensor([[0.6, 0.4, 0, 0], [1.3 / 3, 1 / 3, 0.7 / 3, 0]], dtype=torch.float64)
    assert torch.allclose(sparsemax(z), expected, atol=1e-12)
    assert torch.allclose(sparsemax(z[:, [3, 1, 0, 2]]), expected[:, [3, 1, 0, 2]], atol=1e-12)  # order-free
    cols, w = mix_weights(z)  # ranked columns, cut to the longest support (3)
    assert cols.tolist() == [[0, 1, 2], [0, 1, 2]] and torch.allclose(w, expected[:, :3], atol=1e-12)
    # top-k = 2: sparsemax over (.5, .4) alone: tau = (.9 - 1)/2 = -.05 -> (.55, .45); the first row is unchanged
    cols, w = mix_weights(z, top_k=2)
    assert torch.allclose(w, torch.tensor([[0.6, 0.4], [0.55, 0.45]], dtype=torch.float64), atol=1e-12)
    cols, w = mix_weights(z, top_k=1)
    assert w.tolist() == [[1.0], [1.0]]
    # ties: the lower column first; a flat row spreads evenly
    cols, w = mix_weights(torch.tensor([[0.2, 0.2, 0.2]], dtype=torch.float64))
    assert cols.tolist() == [[0, 1, 2]] and torch.allclose(w, torch.full((1, 3), 1 / 3, dtype=torch.float64))


def hand_case(top_k: int = 0):
    """Source pieces a b c d x (x in no target); target: <s> (no auxiliary vector, as a special piece), a b c d
    (copied), t u (new, with auxiliary vectors), v (new, none). Auxiliary vectors in 2-d: a (1, 0), b (.8, .6), c (0, 1),
    d (-1, 0); t (3, 0), so cos(t, .) = (1, .8, 0, -1); u at 60 degrees."""
    source = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 3.0], [9.0, 9.0]])
    source_bias = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    src_pieces = ["a", "b", "c", "d", "x"]
    trg_pieces = ["<s>", "a", "b", "c", "d", "t", "u", "v"]
    angle = np.arccos(0.5)
    aux = torch.tensor([[0, 0], [1, 0], [0.8, 0.6], [0, 1], [-1, 0], [3, 0], [np.cos(angle), np.sin(angle)], [0, 0]],
                       dtype=torch.float32)
    gen = torch.Generator().manual_seed(7)
    return focus_init(source, source_bias, src_pieces, trg_pieces, aux, 0.02, gen, top_k), source, source_bias


def test_focus_init_by_hand():
    r, source, bias = hand_case()
    # copied pieces keep their source embedding and bias
    assert torch.equal(r.weight[1:5], source[:4]) and torch.equal(r.bias[1:5], bias[:4])
    # t: cosines (1, .8, 0, -1) with a b c d -> weights (.6, .4, 0, 0)
    assert torch.allclose(r.weight[5], 0.6 * source[0] + 0.4 * source[1], atol=1e-6)
    assert torch.allclose(r.bias[5], torch.tensor(0.6 * 0.1 + 0.4 * 0.2), atol=1e-7)
    # u: cosines with a b c d computed here, sparsemax by hand (sorted, k, tau)
    u = torch.tensor([0.5, np.sin(np.arccos(0.5))], dtype=torch.float64)
    anchors = torch.tensor([[1, 0], [0.8, 0.6], [0, 1], [-1, 0]], dtype=torch.float64)
    cos = anchors @ u / anchors.norm(dim=1)
    ranked = sorted(cos.tolist(), reverse=True)
    k = max(j for j in range(1, 5) if 1 + j * ranked[j - 1] > sum(ranked[:j]))
    tau = (sum(ranked[:k]) - 1) / k
    weights = (cos - tau).clamp_min(0)
    # cosines a .5, b .92, c .87, d -.5: k = 3 (1 + 3 * .5 > .92 + .87 + .5), weights b .49, c .44, a .07
    assert abs(float(weights.sum()) - 1) < 1e-12 and k == 3
    assert torch.allclose(weights, torch.tensor([0.0714531, 0.4910684, 0.4374785, 0], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(r.weight[6].double(), weights @ source[:4].double(), atol=1e-6)
    assert torch.allclose(r.bias[6].double(), weights @ bias[:4].double(), atol=1e-7)
    # v (no auxiliary vector) and <s> (special): the overlap initialisation's own draws, bias 0
    overlap, rows = overlap_init(source, ["a", "b", "c", "d", "x"], ["<s>", "a", "b", "c", "d", "t", "u", "v"], 0.02,
                                 torch.Generator().manual_seed(7))
    assert torch.equal(r.weight[[0, 7]], overlap[[0, 7]]) and r.bias[[0, 7]].tolist() == [0, 0]
    assert torch.equal(r.rows, rows) and r.mixed.tolist() == [False] * 5 + [True, True, False]
    assert r.info | {"seconds": 0} == {"copied": 4, "mixed": 2, "random": 2, "anchors": 4, "top_k": 0,
                                       "support_mean": 2.5, "support_max": 3, "seconds": 0}
    # top-k = 1: each new piece copies its nearest overlapping piece
    one, _, _ = hand_case(top_k=1)
    assert torch.equal(one.weight[5], source[0]) and torch.equal(one.weight[6], source[1])


def test_the_fasttext_flop_estimate_by_hand():
    from minimodel.data.aux_embeddings import fasttext_flops

    # "<ab>" has 2 + 1 n-grams of 3 and 4 characters: 4 input rows; "</s>" 1. No subsampling with t = 1:
    # R = (1*1 + 3*4) / 4 = 3.25; per token 10 * (2 * 6 * 3.25 + 6 * 11) = 1050; 2 epochs of 4 tokens
    assert fasttext_flops(["</s>", "ab"], [1, 3], dim=10, epochs=2, ws=5, neg=10, minn=3, maxn=6, t=1.0) == 8400
    # subsampling keeps a token of frequency f with probability sqrt(t/f) + t/f
    kept = 3 * (np.sqrt(0.01 / 0.75) + 0.01 / 0.75) + 1 * min(1, np.sqrt(0.01 / 0.25) + 0.01 / 0.25)
    r = (1 * min(1, np.sqrt(0.04) + 0.04) + 4 * 3 * (np.sqrt(0.01 / 0.75) + 0.01 / 0.75)) / kept
    expected = 2 * kept * 10 * (2 * 6 * r + 6 * 11)
    assert fasttext_flops(["</s>", "ab"], [1, 3], 10, 2, 5, 10, 3, 6, t=0.01) == pytest.approx(expected)


# ------------------------------------------------------------------------------------------------ config


def test_bad_focus_settings_are_refused_at_load(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"adapt.init must be one of overlap, random, focus, mean, got 'foo'"):
        tiny_config(tmp_path, tmp_path, "adapt.init=foo")
    with pytest.raises(ConfigError, match=r"adapt.focus.top_k must be 0 \(every overlapping piece\) or a positive"):
        tiny_config(tmp_path, tmp_path, "adapt.focus.top_k=-1")
    for key in ("dim", "epochs", "min_count"):
        with pytest.raises(ConfigError, match=rf"adapt.focus.{key} must be a positive integer, got 0"):
            tiny_config(tmp_path, tmp_path, f"adapt.focus.{key}=0")
    with pytest.raises(ConfigError, match=r"adapt.focus.threads must be a number of threads from 1, at most"):
        tiny_config(tmp_path, tmp_path, "adapt.focus.threads=0")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fasttext" else real(name, *a))
    with pytest.raises(ConfigError, match=r"adapt.init=focus trains fastText .* pip install 'minimodel\[focus\]'"):
        tiny_config(tmp_path, tmp_path, "adapt.init=focus")
    tiny_config(tmp_path, tmp_path, "adapt.init=overlap")  # fastText is needed by focus only


@needs_fasttext
def test_focus_variant_rows_come_from_an_adaptation_tag(tmp_path):
    """``adapt.init=focus adapt.tag=focus`` in a sweep entry: a ``{system}@focus`` row sharing steps 1, 1b and 3."""
    exp = tmp_path / "sweep.yaml"
    focus = "adapt.init=focus adapt.tag=focus"
    entries = ["system=bl_base model.mini_heads=[]", "system=minipost model.mini_heads=[] bridge.depth=2",
               "system=minijoint model.mini_heads=[2]", "system=bl_small model.mini_heads=[] model.layers=2"]
    exp.write_text((ROOT / "experiments" / "tiny.yaml").read_text() + "\nsweep:\n" +
                   "".join(f'  - "{e}"\n  - "{e} {focus}"\n' for e in entries))
    (tmp_path / "conf").symlink_to(ROOT / "conf")
    vs = variants(exp, [])
    assert [v.label for v in vs] == ["bl_base", "bl_base@focus", "minipost", "minipost@focus", "minijoint",
                                     "minijoint@focus", "bl_small", "bl_small@focus"]
    assert [v.cfg.adapt.init for v in vs] == ["overlap", "focus"] * 4
    for plain, tagged in zip(vs[::2], vs[1::2]):
        a, b = stage_plan(plain.cfg, "adapt").runs, stage_plan(tagged.cfg, "adapt").runs
        assert a.pretrain == b.pretrain and a.body == b.body and a.finetune("xnli", 1) == b.finetune("xnli", 1)
        assert a.adapt("de") != b.adapt("de") and b.adapt("de").parent.parent.name == tagged.label
        assert a.results != b.results
    steps = plan(exp, [])
    names = [s.name for s in steps]
    assert not [n for n in names if n.split(":")[0].endswith("@focus") and n.split(":")[1].startswith(
        ("pretrain", "bridge", "finetune"))]
    adapt = next(s for s in steps if s.name == "minipost@focus:adapt-de")
    assert adapt.after == ("minipost:bridge", "prepare-de") and "adapt.init=focus" in adapt.args
    evaluate = next(s for s in steps if s.name == "minijoint@focus:evaluate-de")
    assert "minijoint@focus:adapt-de" in evaluate.after
    # the same system with two inits and no tag is one run twice: refused
    exp.write_text((ROOT / "experiments" / "tiny.yaml").read_text() + '\nsweep:\n  - "system=minijoint"\n'
                   '  - "system=minijoint adapt.init=focus"\n')
    with pytest.raises(ConfigError, match="two sweep entries give the same system run"):
        variants(exp, [])


# ------------------------------------------------------------------------------------------------ fastText


def copy_prepared(prepared: Path, dest: Path, langs: tuple[str, ...] = ("en", "de")) -> Path:
    """A private copy of the session's prepared data (its cache directory is this test's own); returns its parent."""
    for lang in langs:
        shutil.copytree(prepared / "prepared" / lang, dest / "prepared" / lang,
                        ignore=shutil.ignore_patterns(".lock", "focus"))
    return dest


@pytest.fixture
def trainings(monkeypatch) -> list[Path]:
    """Every fastText training (the text it read), counted."""
    from minimodel.data import aux_embeddings as aux

    calls: list[Path] = []
    real = aux.train_fasttext

    def counted(text, settings):
        calls.append(text)
        return real(text, settings)

    monkeypatch.setattr(aux, "train_fasttext", counted)
    return calls


@pytest.mark.slow
@needs_fasttext
def test_aux_vectors_are_trained_once_per_text_and_tokenizer(tmp_path, prepared, corpus_dir, trainings):
    from minimodel.data.aux_embeddings import AuxSettings, aux_embeddings
    from minimodel.data.prepare import load_prepared_tokenizer, prepare_language
    from minimodel.data.shards import ShardError

    copy = copy_prepared(prepared, tmp_path / "copy")
    cfg = tiny_config(tmp_path, corpus_dir, prepared=copy)
    tok = load_prepared_tokenizer(cfg, "de")
    first = aux_embeddings(cfg, "de", tok, AuxSettings())
    assert not first.cached and len(trainings) == 1 and first.path.parent == copy / "prepared" / "de" / "focus"
    assert sorted(p.name for p in first.path.parent.iterdir()) == sorted([first.path.name, first.path.stem + ".json"])
    assert first.vectors.shape == (len(first.pieces), 100) and len(first.pieces) > 500
    # reused: nothing trained, the same vectors
    again = aux_embeddings(cfg, "de", tok, AuxSettings())
    assert again.cached and len(trainings) == 1 and np.array_equal(again.vectors, first.vectors)
    assert again.record["train_seconds"] == first.record["train_seconds"] > 0
    # bit-reproducible: trained again from scratch, the same vectors
    first.path.unlink()
    fresh = aux_embeddings(cfg, "de", tok, AuxSettings())
    assert not fresh.cached and len(trainings) == 2 and np.array_equal(fresh.vectors, first.vectors)
    assert fresh.pieces == first.pieces
    # other settings, another share of the corpus: other keys
    assert aux_embeddings(cfg, "de", tok, AuxSettings(epochs=1)).path != first.path and len(trainings) == 3
    half = tiny_config(tmp_path, corpus_dir, "adapt.data_fraction=0.5", prepared=copy)
    assert aux_embeddings(half, "de", tok, AuxSettings()).record["tokens"] < first.record["tokens"]
    assert len(trainings) == 4

    # the corpus changes (same file name) and is prepared again with the same tokenizer: trained again
    corpus2 = tmp_path / "corpus2"
    corpus2.mkdir()
    text = (corpus_dir / "de.txt").read_text(encoding="utf-8")
    (corpus2 / "de.txt").write_text(text[len(text) // 10:], encoding="utf-8")
    de = copy / "prepared" / "de"
    shutil.rmtree(de / "shards")
    (de / "done.json").unlink()
    changed = tiny_config(tmp_path, corpus2, prepared=copy)
    prepare_language(changed, "de", progress=False)
    assert load_prepared_tokenizer(changed, "de").sha256 == tok.sha256
    other = aux_embeddings(changed, "de", tok, AuxSettings())
    assert not other.cached and len(trainings) == 5 and other.path != first.path
    assert other.record["tokens_sha256"] != first.record["tokens_sha256"]
    # another tokenizer (BPE) of the same corpus: trained again
    shutil.rmtree(de)
    bpe = tiny_config(tmp_path, corpus_dir, "data.spm_model_type=bpe", prepared=copy)
    prepare_language(bpe, "de", progress=False)
    bpe_tok = load_prepared_tokenizer(bpe, "de")
    assert bpe_tok.sha256 != tok.sha256
    third = aux_embeddings(bpe, "de", bpe_tok, AuxSettings())
    assert not third.cached and len(trainings) == 6 and third.record["tokenizer_sha256"] == bpe_tok.sha256

    # no piece frequent enough, too little text for the validation blocks: errors in config terms, nothing left
    with pytest.raises(ConfigError, match=r"fastText kept no piece .* adapt.focus.min_count=1000000000 times"):
        aux_embeddings(bpe, "de", bpe_tok, AuxSettings(min_count=10**9))
    few = tiny_config(tmp_path, corpus_dir, "data.spm_model_type=bpe", "data.val_blocks=100000", prepared=copy)
    with pytest.raises(ShardError, match="not enough for 100000 validation blocks"):
        aux_embeddings(few, "de", bpe_tok, AuxSettings())
    assert sorted(p.suffix for p in third.path.parent.iterdir()) == [".json", ".npy"]  # no text left behind


# ------------------------------------------------------------------------------------------------ end to end


@pytest.fixture
def no_network(monkeypatch) -> list:
    """Hugging Face offline, and any attempt to reach a network (a DNS lookup, a connection other than a local
    socket) recorded and refused."""
    attempts: list = []
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded(real):
        def call(self, address):
            if self.family != socket.AF_UNIX:
                attempts.append(address)
                raise OSError(f"network access attempted in an offline test: {address}")
            return real(self, address)
        return call

    def lookup(host, *args, **kwargs):
        attempts.append(host)
        raise socket.gaierror(f"network access attempted in an offline test: {host}")

    monkeypatch.setattr(socket.socket, "connect", guarded(connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(connect_ex))
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    return attempts


def demo_args(tmp: Path, prepared: Path, corpus: Path) -> list[str]:
    return [*tiny_overrides(tmp, corpus, prepared), "model.hidden=64", "model.ffn=128", "target_langs=[de]",
            *stage_overrides(["pretrain", "bridge", "adapt"], global_batch=8, micro_batch=4, warmup_updates=1,
                             val_every=4, log_every=2),
            *stage_overrides(["pretrain"], updates=6), *stage_overrides(["bridge"], updates=2),
            *stage_overrides(["adapt"], updates=4, ckpt_every=2), "tasks.lohelp.max_train_examples=32",
            "tasks.lohelp.max_len=48", "finetune.epochs=1", "finetune.batch_size=16", "finetune.micro_batch=16",
            "finetune.mini_tasks=[]", "adapt.init=focus"]


def step0(run_dir: Path) -> dict:
    from minimodel.store.checkpoints import load_checkpoint

    return load_checkpoint(run_dir / "embeddings" / "step0000000.pt")


@pytest.mark.slow
@needs_fasttext
def test_every_system_adapts_with_focus_from_minimodel_run_offline(tmp_path, prepared, corpus_dir, trainings,
                                                                   no_network):
    from minimodel.cli import main
    from minimodel.data.prepare import load_prepared_tokenizer
    from minimodel.experiment import load_experiment
    from minimodel.stages.adapt import run_adapt
    from minimodel.store.checkpoints import load_trained_model

    copy = copy_prepared(prepared, tmp_path / "copy")
    args = demo_args(tmp_path, copy, corpus_dir)
    assert main(["run", str(DEMO), *args, "--no-progress"]) == 0
    assert no_network == [] and len(trainings) == 1  # one fastText training, shared by the four systems
    exp = tmp_path / "runs" / "demo"
    infos = {s: json.loads((exp / s / "adapt" / "de" / "adapt_info.json").read_text())["init"]
             for s in ("bl_base", "bl_small", "minijoint", "minipost")}
    assert sorted(i["fasttext"]["cached"] for i in infos.values()) == [False, True, True, True]
    assert len({i["fasttext"]["key"] for i in infos.values()}) == 1
    for system, info in infos.items():
        assert info["method"] == "focus" and info["mixed"] > 100 and info["copied"] > 50, system
        assert info["copied"] + info["mixed"] + info["random"] == 1000
        assert info["fasttext"]["train_seconds"] > 0 and info["fasttext"]["tokens"] > 100_000
        assert info["fasttext"]["flops_estimate"] > 0
        done = json.loads((exp / system / "adapt" / "de" / "done.json").read_text())
        assert done["init"] == info  # the init's cost beside step 2's FLOPs
        assert (exp / system / "results.jsonl").is_file()

    # step 0 holds what focus_init gives over the body the system adapted (BL_BASE: the whole model)
    cfg = load_experiment(DEMO, [*args, "system=bl_base", "lang=de"])
    body, _ = load_trained_model(exp / "bl_base" / "pretrain" / "checkpoints" / "last.ckpt")
    first = step0(exp / "bl_base" / "adapt" / "de")
    src_pieces = load_prepared_tokenizer(cfg, "en").pieces()
    de_pieces = load_prepared_tokenizer(cfg, "de").pieces()
    shared = [(src_pieces.index(p), i) for i, p in enumerate(de_pieces) if p in set(src_pieces)]
    for src, trg in shared[:50]:
        assert torch.equal(first["embeddings"][trg], body.embeddings.tokens.weight[src].detach())

    # bit-identical: the same adaptation in another experiment, its fastText trained again from scratch
    for f in (copy / "prepared" / "de" / "focus").iterdir():
        f.unlink()
    twin = load_experiment(DEMO, [*args, "system=bl_base", "lang=de", "name=twin"])
    shutil.copytree(exp / "bl_base" / "pretrain", tmp_path / "runs" / "twin" / "bl_base" / "pretrain")
    run_adapt(twin, progress_bar=False)
    assert len(trainings) == 2
    other = step0(tmp_path / "runs" / "twin" / "bl_base" / "adapt" / "de")
    assert torch.equal(other["embeddings"], first["embeddings"]) and torch.equal(other["bias"], first["bias"])

    # the finished focus run is not this configuration's with another init: refused, naming the key
    overlap = load_experiment(DEMO, [*args, "system=bl_base", "lang=de", "adapt.init=overlap"])
    with pytest.raises(ConfigError, match=r"adapt/de is finished, but it ran with other settings .*adapt.init: "
                                          r"'focus' -> 'overlap'"):
        run_adapt(overlap, progress_bar=False)
    assert main(["adapt", str(DEMO), *args, "system=bl_base", "lang=de", "adapt.focus.top_k=10",
                 "--no-progress"]) == 2


@pytest.mark.slow
@needs_fasttext
def test_a_stopped_run_resumes_only_with_its_init(tmp_path, prepared, corpus_dir):
    from minimodel.experiment import load_experiment
    from minimodel.stages.adapt import run_adapt
    from minimodel.stages.pretrain import run_pretrain
    from minimodel.training.runner import Outcome

    copy = copy_prepared(prepared, tmp_path / "copy")
    base = [*tiny_overrides(tmp_path, corpus_dir, copy), "data.num_workers=0", "system=bl_base",
            "model.mini_heads=[]", *stage_overrides(["pretrain", "adapt"], updates=4, **TINY_STAGE, ckpt_every=2,
                                                    val_every=4)]
    run_pretrain(load_experiment(ROOT / "experiments" / "tiny.yaml", base), progress_bar=False)
    overlap = load_experiment(ROOT / "experiments" / "tiny.yaml", [*base, "lang=de", "adapt.trainer.stop_at=2"])
    assert run_adapt(overlap, progress_bar=False).outcome is Outcome.STOPPED
    focus = load_experiment(ROOT / "experiments" / "tiny.yaml", [*base, "lang=de", "adapt.init=focus"])
    with pytest.raises(ConfigError, match=r"holds a run stopped before its end that ran with other settings .*"
                                          r"adapt.init: 'overlap' -> 'focus'"):
        run_adapt(focus, progress_bar=False)
    assert not (copy / "prepared" / "de" / "focus").exists()  # refused before any fastText training


@pytest.mark.slow
@needs_fasttext
def test_focus_over_a_hugging_face_source(tmp_path, prepared, corpus_dir, no_network):
    """MiniPost from a Hugging Face model: its byte-level BPE pieces overlap the German SentencePiece pieces in
    SentencePiece spelling ("Ġthe" is "▁the"), the others are mixed from those."""
    pytest.importorskip("transformers")
    from minimodel.data.aux_embeddings import AuxSettings, aux_embeddings
    from minimodel.data.prepare import load_prepared_tokenizer
    from minimodel.data.tokenizer import HFTokenizer
    from minimodel.experiment import load_experiment
    from minimodel.models.hf import from_hf, to_hf
    from minimodel.models.model import PRIMARY, ModelConfig, RobertaMLM
    from minimodel.stages.adapt import run_adapt
    from minimodel.stages.bridge import run_bridge
    from tests.test_hf_source import build_hf_tokenizer

    hf_dir = build_hf_tokenizer(tmp_path / "tiny-roberta")
    torch.manual_seed(0)
    vocab = len(HFTokenizer(str(hf_dir)).pieces())
    to_hf(RobertaMLM(ModelConfig(vocab_size=vocab, hidden=64, layers=2, heads=2, ffn=128, max_positions=66)), hf_dir)
    copy = copy_prepared(prepared, tmp_path / "copy", langs=("de",))
    args = [*tiny_overrides(tmp_path, corpus_dir, copy), "data.num_workers=0", "system=minipost", "sweep=[]",
            f"bridge.source={hf_dir}", "bridge.depth=1", "bridge.layers=1", "model.mini_heads=[]",
            *stage_overrides(["bridge", "adapt"], updates=2, **TINY_STAGE, ckpt_every=2, val_every=2),
            "adapt.init=focus"]
    from minimodel.data.prepare import prepare_language

    cfg = load_experiment(DEMO, args)
    prepare_language(cfg, "en", progress=False)  # English with the model's own tokenizer
    run_bridge(cfg, progress_bar=False)
    de = load_experiment(DEMO, [*args, "lang=de"])
    run_dir = run_adapt(de, progress_bar=False).run_dir
    info = json.loads((run_dir / "adapt_info.json").read_text())["init"]
    hf_tok, de_tok = HFTokenizer(str(hf_dir)), load_prepared_tokenizer(de, "de")
    primary = from_hf(hf_dir)
    source_surface = hf_tok.surface_pieces()
    aux = aux_embeddings(de, "de", de_tok, AuxSettings())
    assert aux.cached  # the run's own
    expected = focus_init(primary.embeddings.tokens.weight, primary.heads[PRIMARY].bias, source_surface,
                          de_tok.surface_pieces(), torch.from_numpy(aux.for_vocabulary(de_tok)), primary.cfg.init_std,
                          torch.Generator().manual_seed(de.adapt.trainer.seed))
    first = step0(run_dir)
    assert torch.equal(first["embeddings"], expected.weight) and torch.equal(first["bias"], expected.bias)
    words = [(source_surface.index(p), i) for i, p in enumerate(de_tok.pieces())
             if p.startswith("\u2581") and len(p) > 2 and p in set(source_surface)]
    assert words and all(hf_tok.pieces()[s].startswith("Ġ") for s, _ in words)
    for s, t in words[:20]:
        assert torch.equal(first["embeddings"][t], primary.embeddings.tokens.weight[s].detach())
    assert info["mixed"] > 100 and info["copied"] == expected.copied and no_network == []
    with pytest.raises(OSError, match="offline test"):  # the guard itself
        socket.create_connection(("192.0.2.1", 80), timeout=1)
    assert no_network == ["192.0.2.1"]
