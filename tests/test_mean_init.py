"""``adapt.init=mean`` (fast vocabulary transfer, Gee et al. 2022): each new target piece the mean of the source
embeddings of its segmentation by the source tokenizer. The mean against hand-computed values, fallbacks to the
overlap rule counted, a padded source matrix (more rows than the tokenizer has pieces), both families, tied and
untied output projections, the segmentation of a piece by SentencePiece and byte-level BPE tokenizers (SmolLM2's when
it is here), and a tiny end-to-end step 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from minimodel.data.tokenizer import WORD_START, HFTokenizer, Tokenizer
from minimodel.models.families import build
from minimodel.models.model import PRIMARY, ModelConfig
from minimodel.models.surgery import mean_init, overlap_init
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_config

DE_SPM = ROOT / "tests" / "fixtures" / "legacy" / "de_spm.model"
SMOLLM2 = ROOT / ".cache" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# ------------------------------------------------------------------------------------------------ by hand


def hand_case(padding: int = 0):
    """Source pieces a b ▁c d (ids 0-3; ``padding`` more rows past them, as a padded matrix has); target pieces:
    <s> (no segmentation), a (copied), ab = a + b, ▁cd = ▁c + d, aab = a + a + b (a piece counted twice), x (an empty
    segmentation), y (names row 9, which the matrix does not have)."""
    source = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 3.0]])
    source = torch.cat([source, torch.full((padding, 2), 100.0)])
    src_pieces = ["a", "b", "\u2581c", "d"]
    trg_pieces = ["<s>", "a", "ab", "\u2581cd", "aab", "x", "y"]
    segments = [None, [0], [0, 1], [2, 3], [0, 0, 1], [], [0, 9]]
    return source, src_pieces, trg_pieces, segments


def test_mean_init_by_hand():
    source, src_pieces, trg_pieces, segments = hand_case()
    r = mean_init(source, src_pieces, trg_pieces, segments, 0.02, torch.Generator().manual_seed(3))
    assert torch.equal(r.weight[1], source[0])  # a: copied
    assert torch.allclose(r.weight[2], torch.tensor([0.5, 0.5]))  # ab: (a + b) / 2
    assert torch.allclose(r.weight[3], torch.tensor([0.5, 2.5]))  # ▁cd: ((2, 2) + (-1, 3)) / 2
    assert torch.allclose(r.weight[4], torch.tensor([2 / 3, 1 / 3]))  # aab: (a + a + b) / 3
    # <s>, x and y fall back to the overlap rule: exactly overlap_init's draws from the same generator
    overlap, rows = overlap_init(source, src_pieces, trg_pieces, 0.02, torch.Generator().manual_seed(3))
    assert torch.equal(r.weight[[0, 5, 6]], overlap[[0, 5, 6]]) and torch.equal(r.rows, rows)
    assert r.info == {"copied": 1, "mean": 3, "random": 3} and r.out_of_range == 1
    assert r.segments == [None, None, (0, 1), (2, 3), (0, 0, 1), None, None]
    assert r.means.tolist() == [False, False, True, True, True, False, False]
    # the same means of any per-row values: a bias vector (fallback kept where there is no mean)
    bias = r.apply(torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.full((7,), -1.0))
    assert torch.allclose(bias, torch.tensor([-1, -1, 0.15, 0.35, 0.4 / 3, -1, -1]))
    with pytest.raises(ValueError, match="2 segmentations for 7 target pieces"):
        mean_init(source, src_pieces, trg_pieces, segments[:2])


def test_a_padded_source_matrix_is_read_by_token_id():
    """A source matrix with rows past its tokenizer's pieces (Qwen's, padded to a multiple of 64 or 128): the rows are
    token ids, so the result is the unpadded one's; a segmentation naming a padding row is a row the matrix has."""
    source, src_pieces, trg_pieces, segments = hand_case()
    plain = mean_init(source, src_pieces, trg_pieces, segments, 0.02, torch.Generator().manual_seed(3))
    padded_source, *_ = hand_case(padding=6)
    padded = mean_init(padded_source, src_pieces, trg_pieces, segments, 0.02, torch.Generator().manual_seed(3))
    assert torch.equal(padded.weight[:6], plain.weight[:6]) and padded.segments[:6] == plain.segments[:6]
    # row 9 exists in the padded matrix (10 rows): y is then its mean with a
    assert padded.out_of_range == 0 and padded.segments[6] == (0, 9) and padded.info["mean"] == 4
    assert torch.allclose(padded.weight[6], (padded_source[0] + padded_source[9]) / 2)


# ------------------------------------------------------------------------------------------------ segmentation


def test_a_sentencepiece_source_segments_a_piece_as_its_text_alone():
    tok = Tokenizer(DE_SPM)
    pieces = tok.pieces()
    # the plain encoding puts a word start before every text; encode_piece keeps a continuation a continuation
    assert [pieces[i] for i in tok.encode_one("der")] == ["\u2581der"]
    assert [pieces[i] for i in tok.encode_piece("der")] == ["der"]
    assert [pieces[i] for i in tok.encode_piece("\u2581der")] == ["\u2581der"]
    assert [pieces[i] for i in tok.encode_piece("ung")] == ["ung"]
    assert tok.encode_piece("\u03a9") == [tok.specials.unk]  # not in the vocabulary
    # every piece (but the specials) is segmented into pieces that spell it
    for i, piece in enumerate(pieces[5:], start=5):
        assert "".join(pieces[j] for j in tok.encode_piece(piece)) == piece, (i, piece)


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from tests.test_hf_source import build_hf_tokenizer

    return build_hf_tokenizer(tmp_path_factory.mktemp("bpe") / "tiny-roberta")


def test_a_byte_level_source_segments_sentencepiece_spelled_pieces(bpe_dir):
    tok = HFTokenizer(str(bpe_dir))
    raw = tok.pieces()
    assert [raw[i] for i in tok.encode_piece("\u2581the")] == ["Ġthe"]
    assert "".join(raw[i] for i in tok.encode_piece("the")) == "the"  # a continuation: no "Ġ"
    surfaces = tok.surface_pieces()
    german = Tokenizer(DE_SPM).surface_pieces()[5:]
    for piece in german:  # what the source reads is the piece's text
        ids = tok.encode_piece(piece)
        assert ids and tok.hf.convert_tokens_to_string([raw[i] for i in ids]) == piece.replace(WORD_START, " ")
    assert all(surfaces[i] is not None for i in tok.encode_piece("\u2581the"))


def test_a_tokenizer_that_adds_a_word_start_gives_none_it_cannot_take_off(tmp_path):
    """A SentencePiece-style Hugging Face tokenizer (XLM-R's Metaspace) puts "▁" before every text: taken off where it
    is a piece of its own, and no segmentation where it merged into the first piece ("▁ung" is not "ung")."""
    pytest.importorskip("transformers")
    from tests.test_hf_source import build_hf_tokenizer

    tok = HFTokenizer(str(build_hf_tokenizer(tmp_path / "unigram", kind="unigram")))
    surfaces = tok.surface_pieces()
    seen = {"bare": 0, "none": 0}
    for piece in Tokenizer(DE_SPM).surface_pieces()[5:]:
        ids = tok.encode_piece(piece)
        if not ids:
            seen["none"] += 1
            continue
        spelled = [surfaces[i] for i in ids]
        assert spelled[0].startswith(WORD_START) == piece.startswith(WORD_START), (piece, spelled)
        if not piece.startswith(WORD_START) and tok._backend.encode(piece, add_special_tokens=False).tokens[0] == "▁":
            seen["bare"] += 1
    assert seen["bare"] > 0 and seen["none"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2.is_file(), reason=f"{SMOLLM2} is not here (bash scripts/get_smollm2.sh)")
def test_smollm2s_byte_level_bpe_reads_a_word_start_as_one_piece():
    pytest.importorskip("gguf")
    tok = HFTokenizer(str(SMOLLM2), causal=True)
    raw = tok.pieces()
    assert [raw[i] for i in tok.encode_piece("\u2581the")] == ["Ġthe"]
    assert [raw[i] for i in tok.encode_piece("the")] == ["the"]
    assert len(tok.encode_piece("\u2581\u015b")) == 2  # " ś": Ġ + the first byte of ś, then its second byte


# ------------------------------------------------------------------------------------------------ the stage hook


def stage_inputs(tmp_path: Path, bpe_dir: Path, padding: int, **model: object):
    """A random body over the byte-level BPE (its matrix ``padding`` rows longer than the tokenizer), the German
    SentencePiece model as target, and a config with ``adapt.init=mean``."""
    from minimodel.stages.adapt import Inputs

    source_tok = HFTokenizer(str(bpe_dir), causal=model.get("family") == "decoder")
    torch.manual_seed(0)
    body = build(ModelConfig(vocab_size=source_tok.vocab_size + padding, hidden=16, layers=1, heads=2, ffn=32,
                             max_positions=66, pad_id=source_tok.specials.pad, **model))  # type: ignore[arg-type]
    if getattr(body.heads[PRIMARY], "bias", None) is not None:
        with torch.no_grad():
            body.heads[PRIMARY].bias.normal_()
    cfg = tiny_config(tmp_path, tmp_path, "adapt.init=mean", "adapt.trainer.seed=5")
    return cfg, Inputs(body, "body", source_tok, Tokenizer(DE_SPM))


LLAMA = dict(family="decoder", norm="rmsnorm", positions="rotary", activation="swiglu", bias=False)


@pytest.mark.parametrize("model", [{}, {**LLAMA, "tie_embeddings": True}, {**LLAMA, "tie_embeddings": False}],
                         ids=["encoder", "decoder-tied", "decoder-untied"])
def test_the_stage_hook_for_both_families_tied_and_untied(tmp_path, bpe_dir, model):
    from minimodel.stages.adapt import INITS, init_output, init_target_embeddings

    cfg, x = stage_inputs(tmp_path, bpe_dir, padding=11, **model)
    initial = INITS["mean"](cfg, x, PRIMARY)
    src, trg = x.source_tok, x.target_tok
    weight = x.body.embeddings.tokens.weight.detach()
    head = x.body.heads[PRIMARY]
    info = initial.info
    assert info["method"] == "mean" and info["copied"] + info["mean"] + info["random"] == trg.vocab_size
    assert info["mean"] > 500 and info["copied"] > 50 and initial.overlap == info["copied"]
    # the target specials (<s> <pad> </s> <unk> <mask>) cannot be segmented; every other piece can
    assert sum(info["fallback"].values()) == info["random"] and info["fallback"]["special"] == info["random"]
    assert 5 - info["random"] == sum(p in set(src.surface_pieces()) for p in trg.pieces()[:5])
    # a few pieces by hand: the mean of the source rows of their segmentation
    overlap, _, copied = init_target_embeddings(x.body, src, trg, cfg.adapt.trainer.seed)
    src_surface = set(src.surface_pieces())
    new = [i for i, p in enumerate(trg.pieces()) if i > 4 and p not in src_surface and len(src.encode_piece(p)) > 1]
    assert copied == info["copied"] and len(new) > 20
    for i in new[:10]:
        ids = src.encode_piece(trg.pieces()[i])
        assert torch.allclose(initial.weight[i], weight[ids].mean(0), atol=1e-6)
        if getattr(head, "bias", None) is not None:
            assert torch.allclose(initial.bias[i], head.bias.detach()[ids].mean(), atol=1e-6)
    assert torch.equal(initial.weight[:5], overlap[:5])  # the specials: the overlap rule's
    if getattr(head, "bias", None) is None:
        assert not initial.bias.any()
    if x.body.cfg.tie_embeddings:
        assert initial.output is None
    else:  # the output matrix: the same means over the source output rows, init_output's own draws elsewhere
        output = head.decoder.weight.detach()
        assert not torch.equal(output, weight)
        for i in new[:10]:
            assert torch.allclose(initial.output[i], output[src.encode_piece(trg.pieces()[i])].mean(0), atol=1e-6)
        reference = init_output(x.body, src, trg, cfg.adapt.trainer.seed)
        assert torch.equal(initial.output[:5], reference[:5])


def test_the_stage_hook_over_a_padded_matrix_reads_rows_by_token_id(tmp_path, bpe_dir):
    from minimodel.stages.adapt import INITS

    cfg, plain = stage_inputs(tmp_path, bpe_dir, padding=0)
    _, padded = stage_inputs(tmp_path, bpe_dir, padding=37)
    v = plain.source_tok.vocab_size
    with torch.no_grad():  # the same rows for the tokenizer's ids, whatever lies past them
        padded.body.embeddings.tokens.weight[:v] = plain.body.embeddings.tokens.weight
        padded.body.heads[PRIMARY].bias[:v] = plain.body.heads[PRIMARY].bias
    a, b = INITS["mean"](cfg, plain, PRIMARY), INITS["mean"](cfg, padded, PRIMARY)
    assert padded.body.cfg.vocab_size == v + 37
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert {k: a.info[k] for k in ("copied", "mean", "random")} == {k: b.info[k] for k in ("copied", "mean", "random")}


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.slow
@pytest.mark.parametrize("family", ["encoder", "decoder-untied"])
def test_step_2_with_the_mean_initialisation(tmp_path, prepared, corpus_dir, family):
    from minimodel.data.prepare import load_prepared_tokenizer
    from minimodel.errors import ConfigError
    from minimodel.stages.adapt import Inputs, mean_initial, run_adapt
    from minimodel.stages.pretrain import run_pretrain
    from minimodel.store.checkpoints import load_checkpoint, load_trained_model

    llama = ["model.family=decoder", "model.norm=rmsnorm", "model.positions=rotary", "model.activation=swiglu",
             "model.bias=false", "model.tie_embeddings=false"] if family != "encoder" else []
    base = [*llama, "system=bl_base", "model.mini_heads=[]",
            *stage_overrides(["pretrain", "adapt"], updates=4, **TINY_STAGE, ckpt_every=2, val_every=4)]
    run_pretrain(tiny_config(tmp_path, corpus_dir, *base, prepared=prepared), progress_bar=False)
    cfg = tiny_config(tmp_path, corpus_dir, *base, "lang=de", "adapt.init=mean", prepared=prepared)
    run_dir = run_adapt(cfg, progress_bar=False).run_dir
    info = json.loads((run_dir / "adapt_info.json").read_text())
    init = info["init"]
    assert init["method"] == "mean" and init["copied"] + init["mean"] + init["random"] == 1000
    assert init["mean"] > 300 and info["overlapping_pieces"] == init["copied"] > 100
    assert json.loads((run_dir / "done.json").read_text())["init"] == init
    # step 0 holds mean_init's result over the pretrained model (English SentencePiece -> German SentencePiece)
    body, _ = load_trained_model(tmp_path / "runs" / "tiny" / "bl_base" / "pretrain" / "checkpoints" / "last.ckpt")
    en, de = load_prepared_tokenizer(cfg, "en"), load_prepared_tokenizer(cfg, "de")
    expected = mean_initial(cfg, Inputs(body, "", en, de), PRIMARY)
    step0 = load_checkpoint(run_dir / "embeddings" / "step0000000.pt")
    assert torch.equal(step0["embeddings"], expected.weight)
    assert torch.equal(step0["bias"], expected.bias if body.cfg.family == "encoder" else torch.zeros(0))
    assert (step0["output"] is None) == body.cfg.tie_embeddings
    if step0["output"] is not None:
        assert torch.equal(step0["output"], expected.output)
    last = load_checkpoint(run_dir / "embeddings" / "step0000004.pt")
    assert not torch.equal(last["embeddings"], step0["embeddings"])
    # another init of the finished run is refused by the stage identity
    with pytest.raises(ConfigError, match=r"adapt.init: 'mean' -> 'overlap'"):
        run_adapt(tiny_config(tmp_path, corpus_dir, *base, "lang=de", prepared=prepared), progress_bar=False)


def test_mean_rows_are_not_read_as_focus_rows_by_the_report(tmp_path):
    """A ``{system}@mean`` variant row is its own row, not one of the report's FOCUS claims' pairs."""
    from minimodel.cli import init_twins
    from minimodel.pipeline import variants

    exp = tmp_path / "sweep.yaml"
    exp.write_text((ROOT / "experiments" / "tiny.yaml").read_text() + '\nsweep:\n  - "system=bl_base model.mini_heads=[]"\n'
                   '  - "system=bl_base model.mini_heads=[] adapt.init=mean adapt.tag=mean"\n')
    (tmp_path / "conf").symlink_to(ROOT / "conf")
    vs = variants(exp, [])
    assert [v.label for v in vs] == ["bl_base", "bl_base@mean"] and vs[1].cfg.adapt.init == "mean"
    assert init_twins(vs) == {}  # only a FOCUS row pairs with its overlap twin


def test_pieces_the_source_cannot_segment_fall_back_to_the_overlap_rule_and_are_counted(tmp_path, bpe_dir,
                                                                                         monkeypatch):
    """The two fallbacks a byte-level BPE never meets on real text, forced: a piece with no faithful segmentation
    (``unsegmented``) and one whose segmentation holds the source's <unk> (``unknown``: a SentencePiece source
    lacking a character). Both start where the overlap rule puts them, and adapt_info counts them by reason."""
    from minimodel.stages.adapt import INITS, init_target_embeddings

    cfg, x = stage_inputs(tmp_path, bpe_dir, padding=0)
    src, trg = x.source_tok, x.target_tok
    src_surface = set(src.surface_pieces())
    new = [i for i, p in enumerate(trg.surface_pieces()) if i > 4 and p not in src_surface
           and len(src.encode_piece(p)) > 1]
    lost, unknown = trg.surface_pieces()[new[0]], trg.surface_pieces()[new[1]]
    encode = src.encode_piece
    forced = {lost: [], unknown: [encode(unknown)[0], src.specials.unk]}
    monkeypatch.setattr(src, "encode_piece", lambda piece: forced.get(piece, encode(piece)))
    initial = INITS["mean"](cfg, x, PRIMARY)
    fallback = initial.info["fallback"]  # the target specials the source also spells are copied, not counted
    assert {k: fallback[k] for k in ("unsegmented", "unknown", "out_of_range")} == {
        "unsegmented": 1, "unknown": 1, "out_of_range": 0}
    assert initial.info["random"] == fallback["special"] + 2
    overlap, _, _ = init_target_embeddings(x.body, src, trg, cfg.adapt.trainer.seed)
    for i in new[:2]:  # the overlap rule's own draw, not a mean
        assert torch.equal(initial.weight[i], overlap[i])
    ids = encode(trg.surface_pieces()[new[2]])  # the next one still gets its mean
    assert torch.allclose(initial.weight[new[2]], x.body.embeddings.tokens.weight.detach()[ids].mean(0), atol=1e-6)


@pytest.mark.parametrize("model", [{}, {**LLAMA, "tie_embeddings": False}], ids=["encoder", "decoder-untied"])
def test_random_reads_nothing_of_the_source(tmp_path, bpe_dir, model):
    """adapt.init=random: every row N(0, init_std) from the adaptation's seed, the same whatever the source model's
    weights; an untied output projection drawn too (seed + 1), not the overlap rule's copies; biases 0."""
    from minimodel.stages.adapt import INITS, init_output

    cfg, x = stage_inputs(tmp_path, bpe_dir, padding=0, **model)
    a = INITS["random"](cfg, x, PRIMARY)
    with torch.no_grad():
        for p in x.body.parameters():
            p.add_(1.0)
    b = INITS["random"](cfg, x, PRIMARY)
    vocab, hidden, std = x.target_tok.vocab_size, x.body.cfg.hidden, x.body.cfg.init_std
    assert a.info == {"method": "random"} and a.overlap == 0 and not a.bias.any()
    assert torch.equal(a.weight, b.weight) and a.weight.shape == (vocab, hidden)
    assert abs(float(a.weight.std()) / std - 1) < 0.05
    if x.body.cfg.tie_embeddings:
        assert a.output is None
    else:
        assert torch.equal(a.output, b.output) and not torch.equal(a.output, a.weight)
        overlap = init_output(x.body, x.source_tok, x.target_tok, cfg.adapt.trainer.seed)
        shared = [i for i, p in enumerate(x.target_tok.surface_pieces()) if p in set(x.source_tok.surface_pieces())]
        assert len(shared) > 50 and not (a.output[shared] == overlap[shared]).all(1).any()  # no copied source row
