"""The readout of a classification head (issue 52, part 6): ``finetune.pool`` (first | last | mean over the real tokens)
and ``finetune.layer`` (after which layer; 0 = the last). A readout at layer k is the hidden state after layer k
(a decoder's through its final norm), layers above k neither run nor matter, the mean ignores padding, both options
are checked at load, are part of the finetuning's identity, are recorded in ``model.pt`` and read back by step 4, and
the decoder's task export reproduces them; a tiny decoder chain finetunes, evaluates and exports with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from minimodel.cli import main
from minimodel.config.schema import PRIMARY, ModelConfig
from minimodel.errors import ERROR_EXIT, CheckpointError, ConfigError
from minimodel.experiment import load_experiment
from minimodel.models.families import build
from minimodel.models.model import ClassificationHead, SpanHead, task_logits
from minimodel.models.surgery import freeze_all_but
from minimodel.stages.finetune import finetune_trainable
from minimodel.store.checkpoints import Finetuned, load_finetuned
from minimodel.store.identity import stage_changes
from tests.conftest import ROOT, TINY
from tests.test_decoder import STYLES, decoder, ids

TINY_YAML = ROOT / "experiments" / "tiny.yaml"
FAMILIES = ["encoder", *STYLES]


def model_of(family: str) -> torch.nn.Module:
    """A 4-layer model of the family (a decoder: GPT-2 or Llama style), in eval mode, no dropout."""
    if family != "encoder":
        return decoder(family)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=97, hidden=32, layers=4, heads=4, ffn=64, max_positions=26, dropout=0.0,
                      attn_dropout=0.0)
    return build(cfg).eval()


def pools_of(family: str) -> list[str]:
    return ["first", "last", "mean"] if family == "encoder" else ["last", "mean"]


def right_padded(x: torch.Tensor, lengths: list[int], pad: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.arange(x.shape[1])[None] < torch.tensor(lengths)[:, None]  # (B, T)
    return x.masked_fill(~mask, pad), mask


# ---- the readout itself ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_the_readout_at_layer_k_is_the_hidden_state_after_layer_k(family):
    """By hand from ``hidden_states``: a decoder's through the primary head's final norm (also at a middle layer), the
    encoder's as it is (RoBERTa's post-norm blocks end with their own LayerNorm)."""
    body = model_of(family)
    x, mask = right_padded(ids(3, 12), [12, 7, 3])
    with torch.no_grad():
        states = body.hidden_states(x, [1, 2, 3, 4], padded=True)
        for layer in (1, 2, 3, 4):
            h = states[layer]
            if family != "encoder":
                h = body.heads[PRIMARY].norm(h)
            real = mask[:, :, None].float()
            by_hand = {"first": h[:, 0], "last": h[torch.arange(3), mask.sum(1) - 1],
                       "mean": (h * real).sum(1) / real.sum(1)}
            for pool in pools_of(family):
                torch.manual_seed(layer)
                head = ClassificationHead(32, 3, 0.0, pool, layer).eval()
                want = head.out(torch.tanh(head.dense(by_hand[pool])))
                got = task_logits(body, head, x, mask, padded=True)
                assert torch.allclose(got, want, atol=1e-6), (family, layer, pool)
        # layer 0 (the default) is the last layer: what encode gave before the option existed
        default = ClassificationHead(32, 3, 0.0, pools_of(family)[0]).eval()
        last = ClassificationHead(32, 3, 0.0, pools_of(family)[0], 4).eval()
        last.load_state_dict(default.state_dict())
        assert torch.equal(task_logits(body, default, x, mask, True), task_logits(body, last, x, mask, True))
        assert torch.equal(body.encode(x, padded=True), body.encode(x, padded=True, layer=4))
        assert not torch.allclose(body.encode(x, padded=True, layer=2), body.encode(x, padded=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_mean_pooling_ignores_padding(family):
    """A row padded in a batch with a longer one gives the logits it gives alone, unpadded, at every layer."""
    body = model_of(family)
    long, short = ids(1, 14, seed=2), ids(1, 9, seed=3)
    batch, mask = right_padded(torch.cat([long, torch.cat([short, torch.ones(1, 5, dtype=torch.long)], 1)]), [14, 9])
    with torch.no_grad():
        for layer in (1, 3, 4):
            head = ClassificationHead(32, 3, 0.0, "mean", layer).eval()
            together = task_logits(body, head, batch, mask, padded=True)
            alone = task_logits(body, head, short, None, padded=False)
            assert torch.allclose(together[1], alone[0], atol=1e-5), (family, layer)
            assert torch.allclose(together[0], task_logits(body, head, long, None, padded=False)[0], atol=1e-5)
            # the padding's hidden states are not zero: a mean over every position would differ
            everything = ClassificationHead(32, 3, 0.0, "mean", layer).eval()
            everything.load_state_dict(head.state_dict())
            assert not torch.allclose(task_logits(body, everything, batch, None, padded=True)[1], alone[0], atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_layers_above_the_readout_neither_run_nor_change_the_logits(family):
    body = model_of(family)
    x, mask = right_padded(ids(2, 10), [10, 6])
    head = ClassificationHead(32, 3, 0.0, "mean", 2).eval()
    ran: list[int] = []
    for i, layer in enumerate(body.layers):
        layer.register_forward_hook(lambda *a, i=i: ran.append(i))
    with torch.no_grad():
        before = task_logits(body, head, x, mask, padded=True)
        assert ran == [0, 1]
        for layer in body.layers[2:]:
            for p in layer.parameters():
                p.add_(torch.randn_like(p))
        after = task_logits(body, head, x, mask, padded=True)
        full = ClassificationHead(32, 3, 0.0, "mean", 4).eval()
        full.load_state_dict(head.state_dict())
        moved = task_logits(body, full, x, mask, padded=True)
    assert torch.equal(before, after)
    assert not torch.allclose(moved, before)  # the perturbation does reach a readout after layer 4


@pytest.mark.parametrize("family", FAMILIES)
def test_finetuning_trains_the_layers_up_to_the_readout(family):
    body = model_of(family)
    freeze_all_but(body, lambda name: finetune_trainable(name, below=2))
    trained = {n.split(".")[1] for n, p in body.named_parameters() if p.requires_grad and n.startswith("layers.")}
    assert trained == {"0", "1"}
    assert not any(p.requires_grad for n, p in body.named_parameters() if n.startswith(("embeddings.", "heads.")))
    freeze_all_but(body, finetune_trainable)  # the default: every layer
    assert {n.split(".")[1] for n, p in body.named_parameters() if p.requires_grad} == {"0", "1", "2", "3"}


# ---- configuration: checked at load, part of the identity ---------------------------------------------------------

DECODER = ["model.family=decoder"]


@pytest.mark.parametrize(("overrides", "message"), [
    ([*DECODER, "finetune.pool=first"], r"finetune.pool='first' is not a readout of model.family=decoder: last, mean, "
                                        r"or unset .* the first position sees only <s>"),
    (["finetune.pool=max"], r"finetune.pool='max' is not a readout of model.family=encoder: first, last, mean"),
    (["finetune.layer=5"], r"finetune.layer=5 is not a layer of the model: 0 \(the last\) or 1..4 \(model.layers\)"),
    (["finetune.layer=-1"], r"finetune.layer=-1 is not a layer of the model"),
    (["body=mini", "finetune.layer=3"], r"finetune.layer=3 is above the mini-model's 2 layers, which body=mini "
                                        r"finetunes: set finetune.layer to 1..2"),
    (["finetune.mini_tasks=[xnli]", "finetune.layer=3"], r"finetune.layer=3 is above the mini-model's 2 layers, which "
                                                         r"finetune.mini_tasks finetunes: .*finetune.mini_tasks=\[\]"),
])
def test_bad_readouts_are_refused_at_load_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(TINY_YAML, [*TINY, *overrides])


def test_good_readouts_load():
    for overrides in (["finetune.pool=mean", "finetune.layer=4"], [*DECODER, "finetune.pool=mean", "finetune.layer=1"],
                      ["finetune.pool=first"], ["body=mini", "finetune.layer=2"], ["finetune.mini_tasks=[xnli]",
                                                                                    "finetune.layer=2"]):
        cfg = load_experiment(TINY_YAML, [*TINY, *overrides])
        assert cfg.finetune.layer in (1, 2, 4, 0)


def test_the_readout_resolves_against_the_model_finetuned():
    """``families.readout``: the family's token and the last layer by default; a body shallower than finetune.layer
    (a public model with fewer layers than model.layers says) is refused naming the key."""
    from minimodel.models.families import readout

    assert readout(load_experiment(TINY_YAML, TINY), 4) == ("first", 4)
    assert readout(load_experiment(TINY_YAML, [*TINY, *DECODER]), 30) == ("last", 30)
    cfg = load_experiment(TINY_YAML, [*TINY, *DECODER, "finetune.pool=mean", "finetune.layer=3"])
    assert readout(cfg, 4) == ("mean", 3)
    with pytest.raises(ConfigError, match=r"finetune.layer=3 is above the 2 layers of the model finetuned here: set "
                                          r"finetune.layer to 1..2"):
        readout(cfg, 2)


def _flat(*overrides: str) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(load_experiment(TINY_YAML, [*TINY, *overrides])))


def test_the_readout_is_part_of_the_finetunings_identity():
    stage = "finetune/xnli/seed1"
    default = _flat()
    assert stage_changes(default, _flat("finetune.pool=mean"), stage) == [("finetune.pool", "", "mean")]
    assert stage_changes(default, _flat("finetune.layer=2"), stage) == [("finetune.layer", 0, 2)]
    # the default spelled out is the default: the family's own token, the last layer
    assert stage_changes(default, _flat("finetune.pool=first", "finetune.layer=4"), stage) == []
    decoder_default = _flat(*DECODER)
    assert stage_changes(decoder_default, _flat(*DECODER, "finetune.pool=last"), stage) == []
    assert stage_changes(decoder_default, _flat(*DECODER, "finetune.pool=mean"), stage) == [("finetune.pool", "",
                                                                                            "mean")]
    # a config.yaml written before the options existed reads as the default
    older = {k: v for k, v in default.items()}
    older["finetune"] = {k: v for k, v in default["finetune"].items() if k not in ("pool", "layer")}
    assert stage_changes(older, default, stage) == []
    assert stage_changes(older, _flat("finetune.layer=3"), stage) == [("finetune.layer", 0, 3)]
    # adaptation does not read it
    assert stage_changes(default, _flat("finetune.layer=2"), "adapt/de") == []


# ---- model.pt records it; step 4 reads it back --------------------------------------------------------------------

def _finetuned(tmp_path: Path, body: torch.nn.Module, head: torch.nn.Module, readout: dict | None,
               qa: bool = False) -> Path:
    from dataclasses import asdict

    payload = Finetuned(system="bl_base", task="t", seed=1, model_config=asdict(body.cfg), labels=["a", "b", "c"],
                        qa=qa, body_state=body.state_dict(), head_state=head.state_dict())
    d = payload.to_dict()
    if readout is None:  # as format 2 wrote it: no readout
        d.pop("readout")
        d["format"] = 2
    else:
        d["readout"] = readout
    path = tmp_path / "model.pt"
    torch.save(d, path)
    return path


@pytest.mark.parametrize("family", FAMILIES)
def test_the_finetuned_model_records_its_readout(tmp_path, family):
    body = model_of(family)
    pool = pools_of(family)[-1]
    head = ClassificationHead(32, 3, 0.0, pool, 2).eval()
    _, loaded, ft = load_finetuned(_finetuned(tmp_path, body, head, {"pool": pool, "layer": 2}))
    assert (loaded.pooling, loaded.layer, ft.readout) == (pool, 2, {"pool": pool, "layer": 2})
    x = ids(2, 8)
    with torch.no_grad():
        assert torch.equal(task_logits(body, head, x), task_logits(body, loaded.eval(), x))
    # a file written before: the family's own token of the last layer
    _, old, ft = load_finetuned(_finetuned(tmp_path, body, ClassificationHead(32, 3, 0.0, "first"), None))
    assert (old.pooling, old.layer, ft.readout) == (pools_of(family)[0], 4, {})
    _, span, _ = load_finetuned(_finetuned(tmp_path, body, SpanHead(32), {"pool": pools_of(family)[0], "layer": 3},
                                           qa=True))
    assert isinstance(span, SpanHead) and span.layer == 3
    with pytest.raises(CheckpointError, match=r"readout .* is not one of this 4-layer model"):
        load_finetuned(_finetuned(tmp_path, body, head, {"pool": pool, "layer": 7}))


# ---- the task export ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("style", list(STYLES))
def test_the_decoder_export_reproduces_pool_and_layer(tmp_path, style):
    pytest.importorskip("transformers")
    from minimodel.models.decoder_task import FORMAT, HEAD_CONFIG, load_task_model, task_to_hf

    body = decoder(style)
    x, mask = right_padded(ids(3, 12), [12, 7, 3])
    for pool, layer in (("mean", 2), ("last", 1), ("mean", 4)):
        torch.manual_seed(layer)
        head = ClassificationHead(body.cfg.hidden, 3, 0.0, pool, layer).eval()
        out = tmp_path / f"{pool}{layer}"
        task_to_hf(body, head, ["a", "b", "c"], False, out)
        meta = json.loads((out / HEAD_CONFIG).read_text())
        assert (meta["format"], meta["pooling"], meta["layer"], meta["layers"]) == (FORMAT, pool, layer, 4)
        model = load_task_model(out)
        with torch.no_grad():
            mine, theirs = task_logits(body, head, x, mask), model(x, mask)
            alone = model(x[:1])  # no mask: every position is real
        assert (theirs - mine).abs().max().item() < 1e-5, (pool, layer)
        assert (alone - task_logits(body, head, x[:1])).abs().max().item() < 1e-5
    # an export of format 1 (no layer, pooling last) still loads as the last token of the last layer
    meta = json.loads((out / HEAD_CONFIG).read_text())
    legacy = {k: v for k, v in meta.items() if k not in ("layer", "layers")}
    (out / HEAD_CONFIG).write_text(json.dumps({**legacy, "format": "minimodel-decoder-classification/1",
                                               "pooling": "last"}))
    old = load_task_model(out)
    last = ClassificationHead(body.cfg.hidden, 3, 0.0, "last").eval()
    last.load_state_dict(head.state_dict())
    with torch.no_grad():
        assert (old(x, mask) - task_logits(body, last, x, mask)).abs().max().item() < 1e-5


def test_the_encoder_export_refuses_a_readout_its_classes_do_not_have(tmp_path):
    pytest.importorskip("transformers")
    from minimodel.models.hf import task_to_hf

    body = model_of("encoder")
    for head, what in ((ClassificationHead(32, 3, 0.0, "mean"), "read mean of layer 4 of 4"),
                       (ClassificationHead(32, 3, 0.0, "first", 2), "read first of layer 2 of 4"),
                       (SpanHead(32, 3), "read every token of layer 3 of 4")):
        with pytest.raises(ConfigError, match=rf"reads .* of the last layer; this model was finetuned to {what}"):
            task_to_hf(body, head, ["a", "b", "c"], isinstance(head, SpanHead), tmp_path / "x")
    task_to_hf(body, ClassificationHead(32, 3, 0.0, "first", 4), ["a", "b", "c"], False, tmp_path / "ok")
    assert (tmp_path / "ok" / "config.json").is_file()


# ---- a tiny decoder chain with pool=mean, layer=2 -----------------------------------------------------------------

@pytest.mark.slow
def test_a_decoder_finetunes_evaluates_and_exports_with_a_middle_layer_mean(tmp_path, prepared, corpus_dir, capsys):
    transformers = pytest.importorskip("transformers")
    from minimodel.data.prepare import load_prepared_tokenizer
    from minimodel.data.task_features import pad_collate
    from minimodel.data.tasks import TaskData
    from minimodel.export import adapted_embeddings
    from minimodel.models.decoder_task import load_task_model
    from minimodel.models.surgery import plug_embeddings
    from minimodel.store.checkpoints import load_trained_model
    from minimodel.store.layout import finetuned_model
    from minimodel.systems import stage_plan
    from tests.test_decoder_pipeline import run_args

    experiment = str(ROOT / "experiments" / "demo.yaml")
    readout = ["finetune.pool=mean", "finetune.layer=2"]
    args = [*run_args(tmp_path, corpus_dir, prepared), "sweep=[]", "system=bl_base", *readout]
    assert main(["run", experiment, *args, "--no-progress"]) == 0
    cfg = load_experiment(experiment, [*args, "lang=de"])
    r = stage_plan(cfg, "evaluate").runs
    run = r.finetune("lohelp", 1)
    assert json.loads((run / "done.json").read_text())["readout"] == {"pool": "mean", "layer": 2}
    body, head, ft = load_finetuned(finetuned_model(run))
    assert (ft.readout, head.pooling, head.layer, body.cfg.layers) == ({"pool": "mean", "layer": 2}, "mean", 2, 4)
    # layers 3 and 4 never ran in step 3: they are the pretrained ones, bit for bit; layers 1 and 2 trained
    pretrained, _ = load_trained_model(r.pretrain / "checkpoints" / "last.ckpt")
    before, after = pretrained.state_dict(), body.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in after if k.startswith(("layers.2.", "layers.3.")))
    assert not all(torch.equal(after[k], before[k]) for k in after if k.startswith(("layers.0.", "layers.1.")))

    # step 4 read the same readout: the probabilities it saved are the mean of layer 2 through the final norm
    emb = adapted_embeddings(cfg)
    plug_embeddings(body, emb.adapted, emb.tokenizer.sha256, emb.tokenizer.vocab_size)
    body.eval(), head.eval()
    data = TaskData("lohelp", cfg.tasks["lohelp"])
    features = data.features(data.records("test", "de"), load_prepared_tokenizer(cfg, "de"))
    batch = pad_collate(features, body.cfg.pad_id)
    with torch.no_grad():
        h = body.heads[PRIMARY].norm(body.hidden_states(batch["input_ids"], [2])[2])
        real = batch["attention_mask"][:, :, None].float()
        by_hand = head.out(torch.tanh(head.dense((h * real).sum(1) / real.sum(1)))).softmax(-1)
    saved = [json.loads(line) for line in Path(r.layout.predictions(r.label, "lohelp", "de", 1, 4)).read_text()
             .splitlines()]
    probabilities = torch.tensor([[row["probabilities"][label] for label in ft.labels] for row in saved])
    assert len(saved) == len(features) > 20 and (by_hand - probabilities).abs().max().item() < 1e-5

    # the export reads the same, with transformers alone
    out = tmp_path / "de-lohelp"
    assert main(["export", experiment, *args, "lang=de", "task=lohelp", "seed=1", "--out", str(out)]) == 0
    model, tok = load_task_model(out), transformers.AutoTokenizer.from_pretrained(out)
    texts = tok([rec["text"] for rec in data.records("test", "de")], padding=True, truncation=True,
                max_length=cfg.tasks["lohelp"].max_len, return_tensors="pt")
    with torch.no_grad():
        theirs = model(texts["input_ids"], texts["attention_mask"]).softmax(-1)
    assert (theirs - probabilities).abs().max().item() < 1e-5

    # another readout is another finetuning: the finished one refuses it, and so does its evaluation
    capsys.readouterr()
    assert main(["finetune", experiment, *args, "task=lohelp", "seed=1", "finetune.layer=3", "--no-progress"]) == \
        ERROR_EXIT
    assert "finetune.layer: 2 -> 3" in capsys.readouterr().err
    assert main(["evaluate", experiment, *args, "finetune.pool=last", "--no-progress"]) == ERROR_EXIT
    assert "finetune.pool: 'mean' there, 'last' here" in capsys.readouterr().err
    assert main(["finetune", experiment, *args, "task=lohelp", "seed=1", "--no-progress"]) == 0  # as it ran: reused
