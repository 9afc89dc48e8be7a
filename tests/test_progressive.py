"""Progressive mini-model adaptation (adapt.schedule): phases over ever deeper heads of one MiniJoint model.
The embeddings, the one output bias and their optimiser state carry over a phase switch untouched; each phase
pays A3 at its own depth and every checkpoint holds the running sum; adaptation checkpoints record the phase;
a run killed inside the second phase resumes bit-exactly."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from minimodel.config.schema import ModelConfig, OptimConfig
from minimodel.errors import ConfigError
from minimodel.flops import FlopSchedule, adapt_flops
from minimodel.models.model import IGNORE_INDEX, PRIMARY, RobertaMLM
from minimodel.models.surgery import adaptation_trainable, freeze_all_but, staged_body, swap_embeddings, tie_biases
from minimodel.store.checkpoints import TrainingMeta, load_adaptation
from minimodel.store.layout import adaptation_checkpoints
from minimodel.systems import Phase, stage_plan
from minimodel.training.mlm import MLMModule
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_config, tiny_overrides
from tests.test_reliability import cli, kill_when, losses, mid_way, run_to_end, weights

HEADS = "model.mini_heads=[1,2]"
SCHEDULE = "adapt.schedule=[{head: l1, until: 4}, {head: l2, until: 0.5}, {head: primary}]"


def test_phases_from_fractions_and_update_counts(tmp_path):
    cfg = tiny_config(tmp_path, tmp_path, HEADS, SCHEDULE, "adapt.optim.updates=20")
    assert stage_plan(cfg, "adapt").phases == (Phase("l1", 1, 0, 4), Phase("l2", 2, 4, 10), Phase(PRIMARY, 4, 10, 20))
    assert stage_plan(cfg, "adapt").runs.label == "minijoint@progressive"
    assert stage_plan(cfg, "adapt").runs.pretrain == tmp_path / "runs" / "tiny" / "minijoint" / "pretrain"
    for bad, message in [
        ("[{head: l2, until: 0.5}, {head: l1}]", "deeper head than the one before"),
        ("[{head: l1, until: 0.5}, {head: l2, until: 0.8}]", "the last phase needs until: 0"),
        ("[{head: l1, until: 2.5}, {head: l2}]", r"until=2.5: a fraction .* or a whole number"),
        ("[{head: l1, until: 30}, {head: l2}]", "at most at adapt.optim.updates"),
        ("[{head: l3, until: 0.5}, {head: l2}]", "is not a head of the model"),
    ]:
        with pytest.raises(ConfigError, match=message):
            tiny_config(tmp_path, tmp_path, HEADS, f"adapt.schedule={bad}", "adapt.optim.updates=20")
    with pytest.raises(ConfigError, match="not both"):
        tiny_config(tmp_path, tmp_path, HEADS, SCHEDULE, "adapt.head=l1")
    with pytest.raises(ConfigError, match="system bl_base has no secondary heads"):
        tiny_config(tmp_path, tmp_path, "system=bl_base", "model.mini_heads=[]",
                    "adapt.schedule=[{head: primary}]")


def test_flop_schedule_sums_each_phase_at_its_own_rate():
    s = FlopSchedule([(0, 4, 1.0), (4, 10, 10.0), (10, 20, 100.0)])
    assert [s.at(k) for k in (0, 3, 4, 6, 10, 20)] == [0.0, 3.0, 4.0, 24.0, 64.0, 1064.0]
    assert [s.rate(k) for k in (0, 3, 4, 9, 10, 25)] == [1.0, 1.0, 10.0, 10.0, 100.0, 100.0]
    assert FlopSchedule.constant(3.0).at(7) == 7 * 3.0
    with pytest.raises(ValueError, match="contiguous"):
        FlopSchedule([(0, 4, 1.0), (5, 8, 1.0)])


def small_model() -> RobertaMLM:
    torch.manual_seed(0)
    return RobertaMLM(ModelConfig(vocab_size=60, hidden=16, layers=4, heads=2, ffn=32, max_positions=20,
                                  dropout=0.0, attn_dropout=0.0, mini_heads=[1, 2]))


def test_the_staged_body_keeps_each_heads_weights_and_shares_one_bias():
    model = small_model()
    body, names = staged_body(model, ["l1", "l2"])
    assert names == {"l1": "l1", "l2": PRIMARY} and body.cfg.layers == 2 and list(body.heads) == [PRIMARY, "l1"]
    assert torch.equal(body.heads[PRIMARY].dense.weight, model.heads["l2"].dense.weight)
    assert torch.equal(body.heads["l1"].norm.weight, model.heads["l1"].norm.weight)
    swap_embeddings(body, torch.randn(40, 16), torch.zeros(40))
    tie_biases(body)
    assert body.heads["l1"].bias is body.heads[PRIMARY].bias
    assert body.heads["l1"].decoder.weight is body.embeddings.tokens.weight
    assert freeze_all_but(body, adaptation_trainable) == 40 * 16 + 40


class Batches(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(i)
        ids = torch.randint(3, 40, (12,), generator=gen)
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[::3] = ids[::3]
        return {"input_ids": ids, "labels": labels}


class Snapshot(L.Callback):
    """The trainable state at the end of the last update of phase 1 and at the start of phase 2's first."""

    def __init__(self, switch: int) -> None:
        self.switch, self.before, self.after = switch, None, None

    def state(self, trainer: L.Trainer, module: MLMModule) -> dict:
        emb, bias = module.model.embeddings.tokens.weight, module.model.heads[PRIMARY].bias
        opt = trainer.optimizers[0]
        moments = {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in (("emb", emb), ("bias", bias))}
        return {"objects": (emb, bias), "emb": emb.detach().clone(), "bias": bias.detach().clone(), "moments": moments,
                "head": module.phase_head(trainer.global_step)}

    def on_train_batch_end(self, trainer, module, *args) -> None:
        if trainer.global_step == self.switch:
            self.before = self.state(trainer, module)

    def on_train_batch_start(self, trainer, module, *args) -> None:
        if trainer.global_step == self.switch:
            self.after = self.state(trainer, module)


def test_a_phase_switch_leaves_embeddings_bias_and_moments_untouched():
    body, names = staged_body(small_model(), ["l1", "l2"])
    swap_embeddings(body, torch.randn(40, 16) * 0.02, torch.zeros(40))
    tie_biases(body)
    freeze_all_but(body, adaptation_trainable)
    meta = TrainingMeta(stage="adapt", system="minijoint", lang="de", model_config={}, tokenizer={})
    module = MLMModule(body, OptimConfig(lr=1e-2, warmup_updates=1, updates=8, global_batch=4, micro_batch=4), meta,
                       FlopSchedule([(0, 4, 1.0), (4, 8, 2.0)]), trainable=adaptation_trainable,
                       phase_head=lambda step: names["l1"] if step < 4 else names["l2"])
    snap = Snapshot(4)
    trainer = L.Trainer(max_steps=8, callbacks=[snap], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, DataLoader(Batches(), batch_size=4))
    before, after = snap.before, snap.after
    assert before["head"] == "primary" and after["head"] == "primary"  # l2 is the body's primary head
    assert before["objects"][0] is after["objects"][0] and before["objects"][1] is after["objects"][1]
    assert torch.equal(before["emb"], after["emb"]) and torch.equal(before["bias"], after["bias"])
    for what in ("emb", "bias"):
        assert before["moments"][what].keys() == after["moments"][what].keys() >= {"exp_avg", "exp_avg_sq"}
        for k in before["moments"][what]:
            assert torch.equal(before["moments"][what][k], after["moments"][what][k])
    assert module.cumulative_flops(8) == 4 * 1.0 + 4 * 2.0


@pytest.mark.slow
def test_progressive_adaptation_records_phases_sums_flops_and_resumes_exactly(tmp_path, prepared, corpus_dir):
    exp = str(ROOT / "experiments" / "tiny.yaml")
    stages = stage_overrides(["pretrain", "adapt"], updates=24, **TINY_STAGE, ckpt_every=6, val_every=12, log_every=1)
    args = [HEADS, "adapt.schedule=[{head: l1, until: 4}, {head: l2, until: 0.75}, {head: primary}]", *stages]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    for root in (straight, killed):
        run_to_end("pretrain", exp, *tiny_overrides(root, corpus_dir, prepared, runs_dir=root), *args)
    run_to_end("adapt", exp, *tiny_overrides(straight, corpus_dir, prepared, runs_dir=straight), *args, "lang=de")
    ref_dir = straight / "tiny" / "minijoint@progressive" / "adapt" / "de"
    run_dir = killed / "tiny" / "minijoint@progressive" / "adapt" / "de"

    # phases l1 (updates 1-4, 1 layer), l2 (5-18, 2 layers), primary (19-24, 4 layers); a checkpoint ends each phase
    a3 = {d: adapt_flops(d, 64, 64, 1000, 0.15, 8, 1) for d in (1, 2, 4)}
    expected = {0: ("l1", 0.0), 4: ("l1", 4 * a3[1]), 6: ("l2", 4 * a3[1] + 2 * a3[2]),
                12: ("l2", 4 * a3[1] + 8 * a3[2]), 18: ("l2", 4 * a3[1] + 14 * a3[2]),
                24: ("primary", 4 * a3[1] + 14 * a3[2] + 6 * a3[4])}
    ckpts = {load_adaptation(p).step: load_adaptation(p) for p in adaptation_checkpoints(ref_dir)}
    assert sorted(ckpts) == sorted(expected)
    for step, (phase, flops) in expected.items():
        assert ckpts[step].phase == phase and ckpts[step].flops == pytest.approx(flops, rel=1e-12)
    assert ckpts[24].body_layers == 4

    # kill -9 inside the second phase (between checkpoints 6 and 12), then resume: bit-identical
    cmd = ["adapt", exp, *tiny_overrides(killed, corpus_dir, prepared, runs_dir=killed), *args, "lang=de"]
    kill_when(cli(*cmd), mid_way(run_dir, 6, 6))
    steps = {load_adaptation(p).step for p in adaptation_checkpoints(run_dir)}
    assert not (run_dir / "done.json").exists() and 6 in steps and 12 not in steps
    run_to_end(*cmd)
    assert losses(run_dir) == losses(ref_dir)
    a, b = weights(ref_dir / "checkpoints" / "last.ckpt"), weights(run_dir / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for p in adaptation_checkpoints(ref_dir):
        assert torch.equal(load_adaptation(p).embeddings, load_adaptation(run_dir / "embeddings" / p.name).embeddings)


def test_a_stop_between_scheduled_updates_adds_no_point_to_the_curves(tmp_path, prepared, corpus_dir):
    """A signal (here stop_at) at update 9 of 12, checkpoints every 6: the stop writes the resumable last.ckpt but no
    adaptation checkpoint, so step 4's curve points are the scheduled ones, whether or not the run was stopped."""
    exp = str(ROOT / "experiments" / "tiny.yaml")
    stages = stage_overrides(["pretrain", "adapt"], updates=12, **TINY_STAGE, ckpt_every=6, val_every=12, log_every=1)
    base = [*tiny_overrides(tmp_path, corpus_dir, prepared, runs_dir=tmp_path), *stages]
    run_to_end("pretrain", exp, *base)
    cmd = ["adapt", exp, *base, "lang=de"]
    stopped = cli(*cmd, "adapt.trainer.stop_at=9")
    out, _ = stopped.communicate(timeout=600)
    assert stopped.returncode == 4, out  # stopped as asked: not finished
    run_dir = next((tmp_path / "tiny").glob("*/adapt/de"))
    assert [load_adaptation(p).step for p in adaptation_checkpoints(run_dir)] == [0, 6]
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    run_to_end(*cmd)
    assert [load_adaptation(p).step for p in adaptation_checkpoints(run_dir)] == [0, 6, 12]
