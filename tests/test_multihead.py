"""Many mini-models from one MiniJoint pretraining: the weighted loss over every head, gradients of a head
reaching only the layers below it, step 2 over any head (only its layers computed, V*h + V parameters
trained), per-head run directories and results, one shared pretraining in the plan, and the FLOPs saved."""

from __future__ import annotations

import json

import pytest
import torch

from minimodel.config.schema import ModelConfig, OptimConfig
from minimodel.errors import ConfigError
from minimodel.flops import pretrain_flops
from minimodel.models.model import IGNORE_INDEX, RobertaMLM
from minimodel.pipeline import plan, variants
from minimodel.report.costs import multi_head_saving
from minimodel.store.checkpoints import TrainingMeta, load_trained_model
from minimodel.systems import stage_plan
from minimodel.training.mlm import MLMModule, head_weights
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_config

TINY_EXP = ROOT / "experiments" / "tiny.yaml"
HEADS = ["model.mini_heads=[1,2]"]


def small_model(heads: list[int]) -> RobertaMLM:
    torch.manual_seed(0)
    return RobertaMLM(ModelConfig(vocab_size=50, hidden=16, layers=4, heads=2, ffn=32, max_positions=20,
                                  dropout=0.0, attn_dropout=0.0, mini_heads=heads))


def batch(vocab: int = 50) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (4, 12), generator=gen)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, ::3] = ids[:, ::3]
    return {"input_ids": ids, "labels": labels}


def module(model: RobertaMLM, weights: dict[str, float] | None = None) -> MLMModule:
    meta = TrainingMeta(stage="pretrain", system="minijoint", lang="en", model_config={}, tokenizer={})
    return MLMModule(model, OptimConfig(), meta, 1.0, weights=weights)


def test_the_loss_is_the_weighted_sum_of_the_heads_losses():
    model, b = small_model([1, 2]), batch()
    per_head = model.mlm_losses(b["input_ids"], b["labels"])
    assert set(per_head) == {"primary", "l1", "l2"}
    weights = {"primary": 2.0, "l1": 0.5, "l2": 0.0}
    loss, _ = module(model, weights).loss(b)
    assert torch.allclose(loss, sum(w * per_head[h] for h, w in weights.items()))
    mean, _ = module(model).loss(b)  # default: the mean over all heads, the primary head's share 1/3
    assert torch.allclose(mean, sum(per_head.values()) / 3)
    assert head_weights(["primary", "l1", "l2"]) == {"primary": 1 / 3, "l1": 1 / 3, "l2": 1 / 3}
    with pytest.raises(ValueError, match="do not match"):
        head_weights(["primary", "l1"], {"primary": 1.0})


def test_a_heads_gradient_reaches_only_the_layers_below_it():
    model, b = small_model([1, 2]), batch()
    model.mlm_losses(b["input_ids"], b["labels"], ["l2"])["l2"].backward()
    for i, layer in enumerate(model.layers):
        grads = [p.grad for p in layer.parameters()]
        if i < 2:
            assert all(g is not None and g.abs().sum() > 0 for g in grads), f"layer {i + 1} got no gradient"
        else:
            assert all(g is None for g in grads), f"layer {i + 1} is above head l2 but got a gradient"
    for name in ("primary", "l1"):
        assert model.heads[name].dense.weight.grad is None and model.heads[name].bias.grad is None
    assert model.token_embeddings.weight.grad is not None  # the tied projection of the head and the input side


def test_the_model_computes_only_the_layers_up_to_a_head():
    model, b = small_model([1, 2]), batch()
    called: list[int] = []
    for i, layer in enumerate(model.layers):
        layer.register_forward_hook(lambda m, inp, out, i=i: called.append(i))
    model.mlm_losses(b["input_ids"], b["labels"], ["l1"])
    assert called == [0]


def test_config_names_the_head_of_step_2(tmp_path):
    with pytest.raises(ConfigError, match="several secondary heads .*adapt.head=l1"):
        tiny_config(tmp_path, tmp_path, *HEADS)
    with pytest.raises(ConfigError, match="adapt.head='l3' is not a head of the model: it has primary, l1, l2"):
        tiny_config(tmp_path, tmp_path, *HEADS, "adapt.head=l3")
    with pytest.raises(ConfigError, match="system bl_base adapts over its whole model"):
        tiny_config(tmp_path, tmp_path, "system=bl_base", "model.mini_heads=[]", "adapt.head=l2")
    with pytest.raises(ConfigError, match=r"head_weights must give a weight to each head .*\(primary, l1, l2\)"):
        tiny_config(tmp_path, tmp_path, *HEADS, "adapt.head=l1", "pretrain.head_weights={primary: 1, l1: 1}")
    with pytest.raises(ConfigError, match="head_weights.l1 must be a finite number >= 0"):
        tiny_config(tmp_path, tmp_path, *HEADS, "adapt.head=l1", "pretrain.head_weights={primary: 1, l1: -1, l2: 1}")
    with pytest.raises(ConfigError, match="at least one weight must be positive"):
        tiny_config(tmp_path, tmp_path, *HEADS, "adapt.head=l1", "pretrain.head_weights={primary: 0, l1: 0, l2: 0}")

    cfg = tiny_config(tmp_path, tmp_path, *HEADS, "adapt.head=l2")
    r = stage_plan(cfg, "adapt").runs
    assert stage_plan(cfg, "adapt").depth == 2 and r.label == "minijoint@l2"
    assert r.pretrain == tmp_path / "runs" / "tiny" / "minijoint" / "pretrain"  # shared by every head
    assert r.adapt("de") == tmp_path / "runs" / "tiny" / "minijoint@l2" / "adapt" / "de"
    assert r.finetune("lohelp", 1) == tmp_path / "runs" / "tiny" / "minijoint" / "finetune" / "lohelp" / "seed1"
    assert r.results == tmp_path / "runs" / "tiny" / "minijoint@l2" / "results.jsonl"
    single = tiny_config(tmp_path, tmp_path)  # one secondary head: the names of before
    assert stage_plan(single, "adapt").runs.label == "minijoint" and stage_plan(single, "adapt").depth == 2
    assert stage_plan(tiny_config(tmp_path, tmp_path, "adapt.head=primary"), "adapt").runs.label == "minijoint@primary"


def test_one_pretraining_serves_every_head_in_the_plan(tmp_path):
    exp = tmp_path / "sweep.yaml"
    exp.write_text(TINY_EXP.read_text() + "\nsweep:\n  - \"system=bl_base model.mini_heads=[]\"\n"
                   "  - \"model.mini_heads=[1,2] adapt.head=l1\"\n  - \"model.mini_heads=[1,2] adapt.head=l2\"\n")
    (tmp_path / "conf").symlink_to(ROOT / "conf")
    assert [v.label for v in variants(exp, [])] == ["bl_base", "minijoint@l1", "minijoint@l2"]
    steps = plan(exp, [])
    pretrains = [s.name for s in steps if s.stage == "pretrain"]
    assert pretrains == ["bl_base:pretrain", "minijoint@l1:pretrain"]
    adapt_l2 = next(s for s in steps if s.name == "minijoint@l2:adapt-de")
    assert adapt_l2.after == ("minijoint@l1:pretrain", "prepare-de")
    c = variants(exp, [])[1].cfg
    primary_finetunes = [s.name for s in steps if s.stage == "finetune" and "body=mini" not in s.args]
    assert len([f for f in primary_finetunes if f.startswith("minijoint@l1:")]) == len(c.finetune.tasks) * len(
        c.finetune.seeds)
    assert not [f for f in primary_finetunes if f.startswith("minijoint@l2:")]  # the finetuned models are shared
    evaluate_l2 = next(s for s in steps if s.name == "minijoint@l2:evaluate-de")
    assert "minijoint@l1:finetune-xnli-s1" in evaluate_l2.after
    exp.write_text(TINY_EXP.read_text() + "\nsweep:\n  - \"model.mini_heads=[1,2] adapt.head=l1\"\n"
                   "  - \"model.mini_heads=[1,2] adapt.head=l1 adapt.optim.lr=1e-3\"\n")
    with pytest.raises(ConfigError, match="two sweep entries give the same system run"):
        variants(exp, [])


def test_an_adaptation_tag_shares_steps_1_1b_and_3(tmp_path):
    """``adapt.tag`` names a step-2 variant (a low-data adaptation): its own adaptation runs and results, the
    untagged system's pretraining, bridge and finetuned models."""
    exp = tmp_path / "sweep.yaml"
    exp.write_text(TINY_EXP.read_text() + "\nsweep:\n  - \"system=minipost model.mini_heads=[] bridge.depth=2\"\n"
                   "  - \"system=minipost model.mini_heads=[] bridge.depth=2 adapt.data_fraction=0.1 adapt.tag=low\"\n"
                   "  - \"model.mini_heads=[1,2] adapt.head=l2\"\n"
                   "  - \"model.mini_heads=[1,2] adapt.head=l2 adapt.data_fraction=0.1 adapt.tag=low\"\n")
    (tmp_path / "conf").symlink_to(ROOT / "conf")
    vs = variants(exp, [])
    assert [v.label for v in vs] == ["minipost", "minipost@low", "minijoint@l2", "minijoint@l2+low"]
    r = [stage_plan(v.cfg, "adapt").runs for v in vs]
    assert r[1].bridge == r[0].bridge and r[1].adapt("de") != r[0].adapt("de")
    assert r[1].finetune("xnli", 1) == r[0].finetune("xnli", 1) and r[1].results != r[0].results
    assert r[3].pretrain == r[2].pretrain and r[3].adapt("de").parent.parent.name == "minijoint@l2+low"
    steps = plan(exp, [])
    assert [s.name for s in steps if s.stage in ("pretrain", "bridge")] == [
        "minipost:pretrain", "minipost:bridge", "minijoint@l2:pretrain"]
    assert next(s for s in steps if s.name == "minipost@low:adapt-de").after == ("minipost:bridge", "prepare-de")
    assert not [s for s in steps if s.stage == "finetune" and s.name.startswith(("minipost@low:", "minijoint@l2+low:"))]
    with pytest.raises(ConfigError, match="adapt.tag='a/b'"):
        tiny_config(tmp_path, tmp_path, "adapt.tag=a/b")


def test_flops_state_the_compute_one_multi_head_pretraining_saves(tmp_path):
    cfg = tiny_config(tmp_path, tmp_path, "model.mini_heads=[1,2,3]", "adapt.head=l1")
    m, d, p = cfg.model, cfg.data, cfg.pretrain.optim
    args = dict(hidden=m.hidden, seq_len=d.seq_len, vocab=m.vocab_size, mask_prob=d.mask_prob,
                batch=p.global_batch, updates=p.updates)
    one, dedicated = pretrain_flops(m.layers, extra_heads=3, **args), 3 * pretrain_flops(m.layers, extra_heads=1, **args)
    text = multi_head_saving(cfg)
    assert f"{one / 1e18:.4g} EFLOPs" in text and f"{dedicated / 1e18:.4g} EFLOPs" in text
    assert f"{1 - one / dedicated:.1%}" in text and 0.5 < 1 - one / dedicated < 0.67
    assert multi_head_saving(tiny_config(tmp_path, tmp_path)) == ""


@pytest.mark.slow
def test_step_2_over_each_head_of_one_pretraining(tmp_path, prepared, corpus_dir):
    from minimodel.report.reading import load_results
    from minimodel.stages.adapt import adaptation_body, run_adapt
    from minimodel.stages.evaluate import run_evaluate
    from minimodel.stages.finetune import run_finetune
    from minimodel.stages.pretrain import run_pretrain

    stages = stage_overrides(["pretrain", "adapt"], updates=6, **TINY_STAGE, ckpt_every=6, val_every=6)
    task = [f"tasks.lohelp.source={ROOT / 'data/demo/task/lohelp'}", "tasks.lohelp.kind=local",
            "tasks.lohelp.max_train_examples=64", "tasks.lohelp.max_len=64", "finetune.tasks=[lohelp]",
            "finetune.mini_tasks=[]", "finetune.seeds=[1]", "finetune.epochs=1", "finetune.batch_size=8",
            "finetune.micro_batch=8", "target_langs=[de]", "finetune.trainer.accelerator=cpu",
            "finetune.trainer.precision=32-true"]

    def cfg(*extra: str):
        return tiny_config(tmp_path, corpus_dir, *HEADS, *stages, *task,
                           "pretrain.head_weights={primary: 2, l1: 1, l2: 1}", *extra, prepared=prepared)

    pre = run_pretrain(cfg("adapt.head=l1"), progress_bar=False).run_dir
    assert run_pretrain(cfg("adapt.head=l2"), progress_bar=False).outcome.name == "SKIPPED"  # the same run
    full, _ = load_trained_model(pre / "checkpoints" / "last.ckpt")
    for head, depth in (("l1", 1), ("l2", 2)):
        c = cfg(f"adapt.head={head}", "lang=de")
        body, _, _ = adaptation_body(c, stage_plan(c, "adapt"))
        assert body.cfg.layers == depth and list(body.heads) == ["primary"]
        assert torch.equal(body.heads["primary"].dense.weight, full.heads[head].dense.weight)
        assert torch.equal(body.layers[depth - 1].qkv.weight, full.layers[depth - 1].qkv.weight)
        run_dir = run_adapt(c, progress_bar=False).run_dir
        assert run_dir == tmp_path / "runs" / "tiny" / f"minijoint@{head}" / "adapt" / "de"
        info = json.loads((run_dir / "adapt_info.json").read_text())
        assert info["body_layers"] == depth and info["trainable_parameters"] == 1000 * 64 + 1000

    # step 3 once (the finetuned primary model is shared), step 4 per head: results keyed by head
    run_finetune(cfg("adapt.head=l1"), "lohelp", 1, progress_bar=False)
    for head in ("l1", "l2"):
        path = run_evaluate(cfg(f"adapt.head={head}"), progress=False).path
        assert path == tmp_path / "runs" / "tiny" / f"minijoint@{head}" / "results.jsonl"
    res = load_results(tmp_path / "runs", "tiny")
    assert {s for s, _, _ in res.curves} == {"minijoint@l1", "minijoint@l2"}
