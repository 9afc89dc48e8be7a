"""Active forgetting during pretraining (pretrain.forget_every): right after update K the token embeddings are a
fresh seeded initialisation, their AdamW moments are gone, every other parameter's moments are untouched and
the heads stay tied; the embeddings' own restarted schedule; a resume across a reset is bit-exact; two gloo
ranks agree with one process."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from minimodel.config.schema import ModelConfig, OptimConfig
from minimodel.errors import ConfigError
from minimodel.models.model import PRIMARY, RobertaMLM
from minimodel.store.checkpoints import TrainingMeta, load_checkpoint
from minimodel.training.mlm import MLMModule, forget_init, window_factor
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_config, tiny_overrides
from tests.test_progressive import Batches
from tests.test_reliability import cli, kill_when, losses, mid_way, run_to_end, weights


def test_config_checks_forgetting(tmp_path):
    assert tiny_config(tmp_path, tmp_path, "pretrain.forget_every=50").pretrain.forget_every == 50
    with pytest.raises(ConfigError, match="forget_every must be 0 .* below pretrain.optim.updates"):
        tiny_config(tmp_path, tmp_path, "pretrain.forget_every=500")
    with pytest.raises(ConfigError, match="active forgetting.* is for bl_base, minijoint, not bl_small"):
        tiny_config(tmp_path, tmp_path, "system=bl_small", "model.mini_heads=[]", "pretrain.forget_every=50")
    with pytest.raises(ConfigError, match="data_fraction must be in"):
        tiny_config(tmp_path, tmp_path, "adapt.data_fraction=0")


def test_fresh_embeddings_are_seeded_and_the_window_schedule_restarts():
    a, b = forget_init(30, 8, 0.02, 1, seed=1, step=6), forget_init(30, 8, 0.02, 1, seed=1, step=6)
    assert torch.equal(a, b) and not torch.equal(a, forget_init(30, 8, 0.02, 1, seed=1, step=12))
    assert torch.all(a[1] == 0) and 0.015 < float(a.std()) < 0.025
    # windows of 10 updates in a 25-update run, warmup 2: up, then down to 0 at each re-initialisation
    f = [window_factor(s, 10, 25, 2) for s in range(25)]
    assert f[0] == 0.5 and f[1] == 1.0 and f[9] == pytest.approx(1 / 8) and f[10] == 0.5 and f[11] == 1.0
    assert f[20] == 0.5 and f[24] == pytest.approx(1 / 3)


class AtReset(L.Callback):
    def __init__(self, k: int) -> None:
        self.k, self.end_of_k, self.start_of_next = k, None, None

    def snapshot(self, trainer, module) -> dict:
        opt = trainer.optimizers[0]
        emb = module.model.embeddings.tokens.weight
        return {"emb": emb.detach().clone(),
                "state": {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in module.model.named_parameters()
                          if p in opt.state},
                "tied": all(h.decoder.weight is emb for h in module.model.heads.values())}

    def on_train_batch_end(self, trainer, module, *args) -> None:
        if trainer.global_step == self.k and self.end_of_k is None:  # the micro-batch that completed update K
            self.end_of_k = self.snapshot(trainer, module)

    def on_before_backward(self, trainer, module, loss) -> None:  # inside update K+1, after the module's hook
        if trainer.global_step == self.k and self.start_of_next is None:
            self.start_of_next = self.snapshot(trainer, module)


def test_right_after_update_k_the_embeddings_and_only_their_moments_are_fresh():
    torch.manual_seed(0)
    model = RobertaMLM(ModelConfig(vocab_size=40, hidden=16, layers=3, heads=2, ffn=32, max_positions=20,
                                   dropout=0.0, attn_dropout=0.0, mini_heads=[1]))
    meta = TrainingMeta(stage="pretrain", system="minijoint", lang="en", model_config={}, tokenizer={})
    module = MLMModule(model, OptimConfig(lr=1e-2, warmup_updates=1, updates=6, global_batch=8, micro_batch=4), meta,
                       1.0, forget_every=3, forget_seed=7)
    cb = AtReset(3)
    trainer = L.Trainer(max_steps=6, callbacks=[cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        accumulate_grad_batches=2)
    trainer.fit(module, DataLoader(Batches(), batch_size=4))
    before, after = cb.end_of_k, cb.start_of_next
    assert torch.equal(after["emb"], forget_init(40, 16, 0.02, 1, seed=7, step=3))
    assert not torch.equal(before["emb"], after["emb"])
    assert "embeddings.tokens.weight" in before["state"] and "embeddings.tokens.weight" not in after["state"]
    others = [n for n in before["state"] if n != "embeddings.tokens.weight"]
    assert others and others == [n for n in after["state"]]
    for n in others:
        for k, v in before["state"][n].items():
            assert torch.equal(v, after["state"][n][k]), (n, k)
    assert after["tied"] and model.heads[PRIMARY].decoder.weight is model.heads["l1"].decoder.weight
    opt = trainer.optimizers[0]
    assert float(opt.state[model.embeddings.tokens.weight]["step"]) == 3  # restarted at update 4: 3 updates since


@pytest.mark.slow
def test_resume_across_a_reset_is_bit_exact(tmp_path, prepared, corpus_dir):
    exp = str(ROOT / "experiments" / "tiny.yaml")
    stages = stage_overrides(["pretrain"], updates=24, **TINY_STAGE, ckpt_every=6, val_every=12, log_every=1)
    args = [*stages, "pretrain.forget_every=6", "pretrain.forget_lr_restart=true"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_to_end("pretrain", exp, *tiny_overrides(straight, corpus_dir, prepared, runs_dir=straight), *args)
    run_dir, ref_dir = (root / "tiny" / "minijoint" / "pretrain" for root in (killed, straight))
    cmd = ["pretrain", exp, *tiny_overrides(killed, corpus_dir, prepared, runs_dir=killed), *args]
    # killed after the reset that follows checkpoint 6 (and before checkpoint 12): the resume redoes that reset
    kill_when(cli(*cmd), mid_way(run_dir, 6, 6))
    assert not (run_dir / "done.json").exists()
    run_to_end(*cmd)
    assert losses(run_dir) == losses(ref_dir)
    a, b = weights(ref_dir / "checkpoints" / "last.ckpt"), weights(run_dir / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the resets happened: the embeddings' AdamW state restarted after updates 6, 12 and 18, the others' did not
    state = load_checkpoint(ref_dir / "checkpoints" / "last.ckpt")["optimizer_states"][0]
    assert [len(g["params"]) for g in state["param_groups"]][0] == 1  # the embeddings' own group (lr restarts)
    steps = {i: float(s["step"]) for i, s in state["state"].items()}
    emb = state["param_groups"][0]["params"][0]
    assert steps[emb] == 6 and all(v == 24 for i, v in steps.items() if i != emb)


@pytest.mark.slow
def test_two_gloo_ranks_forget_alike(tmp_path, prepared, corpus_dir):
    from tests.test_ddp import pretrain

    extra = ["pretrain.forget_every=3"]
    one = pretrain(tmp_path / "one", prepared, corpus_dir, "pretrain.trainer.devices=1", *extra)
    two = pretrain(tmp_path / "two", prepared, corpus_dir, "pretrain.trainer.devices=2",
                   "pretrain.trainer.strategy=ddp", *extra)
    plain = pretrain(tmp_path / "plain", prepared, corpus_dir, "pretrain.trainer.devices=1")
    a, b, c = (load_checkpoint(d / "checkpoints" / "last.ckpt")["state_dict"] for d in (one, two, plain))
    for k, v in a.items():
        torch.testing.assert_close(b[k], v, rtol=1e-4, atol=1e-5, msg=k)
    emb = "model.embeddings.tokens.weight"
    assert (a[emb] - c[emb]).abs().max() > 1e-2  # the reset happened
