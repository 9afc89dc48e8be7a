"""The GPU path, proven as far as a CPU can (issue 34): every device branch of ``training/device.py`` taken on
its CUDA side, fused AdamW with clipping in every precision, fp16 loss scaling with a real ``GradScaler``, the
compiled stages, the host syncs of an update, and DDP processes stopping together on a non-finite loss.
What only a GPU can show is ``make gpu-check``'s (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils._python_dispatch import TorchDispatchMode

from minimodel.cli import main
from minimodel.config.schema import ModelConfig, OptimConfig
from minimodel.data.mlm import mlm_datamodule
from minimodel.data.prepare import load_source_tokenizer
from minimodel.errors import ERROR_EXIT, NonFiniteLossError
from minimodel.models.model import RobertaMLM
from minimodel.models.surgery import adaptation_trainable, freeze_all_but
from minimodel.store.checkpoints import TrainingMeta, load_checkpoint
from minimodel.training import device as dev
from minimodel.training import runner as runner_mod
from minimodel.training.callbacks import ScheduledCheckpoints
from minimodel.training.mlm import MLMModule
from minimodel.training.optim import MIN_LOSS_SCALE, UpdateGuard, build_optimizer
from tests.conftest import ROOT, stage_overrides, tiny_config, tiny_overrides
from tests.test_downstream import tiny_demo

STAGES = ("pretrain", "bridge", "adapt", "finetune")


# ------------------------------------------------------------------------------------- a pretend CUDA device

def pretend_cuda(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int] = (8, 0), count: int = 1,
                 name: str = "NVIDIA A100-SXM4-80GB") -> None:
    """``torch.cuda`` answers as on a machine with ``count`` cards of this compute capability."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def test_adamw_is_fused_on_cuda_and_as_asked_elsewhere():
    on_cuda = [SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=True)]
    mixed = [SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)]
    assert dev.adamw_fused(on_cuda) is True  # the CUDA side of auto
    assert dev.adamw_fused(mixed) is False
    assert dev.adamw_fused([torch.nn.Parameter(torch.zeros(1))]) is False
    assert dev.adamw_fused([torch.nn.Parameter(torch.zeros(1))], "fused") is True
    assert dev.adamw_fused(on_cuda, "foreach") is False
    with pytest.raises(ValueError, match="trainer.adamw"):
        dev.adamw_fused(on_cuda, "apex")
    p = torch.nn.Parameter(torch.zeros(3))
    opt, _ = build_optimizer([p], OptimConfig(), adamw="fused")
    assert opt.defaults["fused"] is True
    opt, _ = build_optimizer([p], OptimConfig(), adamw="foreach")
    assert not opt.defaults["fused"] and opt.defaults["foreach"] is True


def test_bf16_is_refused_where_the_card_only_emulates_it(monkeypatch):
    pretend_cuda(monkeypatch, capability=(7, 0), name="Tesla V100-SXM2-32GB")
    with pytest.raises(dev.PrecisionError, match=r"Tesla V100.*7\.0.*adapt\.trainer\.precision=16-mixed"):
        dev.check_precision("bf16-mixed", "gpu", "adapt.trainer.precision")
    dev.check_precision("16-mixed", "gpu", "adapt.trainer.precision")
    dev.check_precision("bf16-mixed", "cpu", "adapt.trainer.precision")  # a CPU stage on a GPU machine: fine
    assert dev.autocast_dtype(torch.device("cuda", 0)) is torch.float16  # evaluation follows native support
    pretend_cuda(monkeypatch, capability=(8, 0))
    dev.check_precision("bf16-mixed", "auto", "adapt.trainer.precision")
    assert dev.autocast_dtype(torch.device("cuda", 0)) is torch.bfloat16
    assert dev.autocast_dtype(torch.device("cpu")) is None
    with pytest.raises(dev.PrecisionError, match="must be one of"):
        dev.check_precision("bf16-true", "cpu", "adapt.trainer.precision")


def test_a_stage_on_a_card_without_bf16_stops_before_writing_anything(monkeypatch, tmp_path, prepared, corpus_dir):
    pretend_cuda(monkeypatch, capability=(7, 0), name="Tesla V100-SXM2-32GB")
    args = [str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(tmp_path, corpus_dir, prepared),
            "pretrain.trainer.accelerator=gpu", "pretrain.trainer.precision=bf16-mixed", "--no-progress"]
    assert main(["pretrain", *args]) == ERROR_EXIT
    assert not (tmp_path / "runs").exists()


def test_the_other_device_branches_take_their_cuda_side(monkeypatch, tmp_path, corpus_dir):
    from minimodel.stages.evaluate import device_for

    cfg = tiny_config(tmp_path, corpus_dir, "finetune.trainer.accelerator=gpu", "pretrain.trainer.devices=auto",
                      "pretrain.trainer.accelerator=gpu")
    assert device_for(cfg) == torch.device("cpu") and dev.pin_memory() is False
    pretend_cuda(monkeypatch, count=4)
    assert device_for(cfg, local_rank=5) == torch.device("cuda", 1)
    assert dev.pin_memory() is True
    assert runner_mod.world_size(cfg.pretrain.trainer) == 4


def test_config_refuses_unknown_precision_and_adamw(tmp_path, corpus_dir):
    from minimodel.errors import ConfigError

    with pytest.raises(ConfigError, match=r"adapt\.trainer\.precision must be auto or one of 32-true, bf16-mixed, 16-mixed"):
        tiny_config(tmp_path, corpus_dir, "adapt.trainer.precision=bf16")
    with pytest.raises(ConfigError, match=r"pretrain\.trainer\.adamw must be one of auto, fused, foreach"):
        tiny_config(tmp_path, corpus_dir, "pretrain.trainer.adamw=apex")


# ------------------------------------------------------------------------------------- the update guard

def grads_of(model: torch.nn.Module, scale: float = 1.0) -> None:
    for i, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, float(i + 1) * scale)


def test_guard_clips_to_the_norm_and_stops_on_nan_without_a_scaler():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    grads_of(model)
    norm = UpdateGuard(1.0)(opt, None, 0)
    assert float(norm) == pytest.approx((12 * 1 + 3 * 4) ** 0.5)  # weight 12 x 1.0, bias 3 x 2.0
    after = torch.sqrt(sum((p.grad ** 2).sum() for p in model.parameters()))
    assert float(after) == pytest.approx(1.0, rel=1e-5)
    model.weight.grad[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="not finite at update 8"):
        UpdateGuard(1.0)(opt, None, 7)


def test_guard_unscales_fp16_gradients_of_a_fused_optimizer_before_clipping():
    """Lightning unscales before clipping only for optimizers that do not unscale themselves: with fused AdamW
    the guard does, and the scaler's step then uses the unscaled gradients as they are."""
    model = torch.nn.Linear(4, 3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    scaler.scale(torch.zeros(()))  # what scaling the loss does first: the scale tensor exists
    grads_of(model, scale=1024.0)  # as backward of a scaled loss leaves them
    before = [p.detach().clone() for p in model.parameters()]
    norm = UpdateGuard(0.0)(opt, scaler, 0)
    assert float(norm) == pytest.approx((12 + 12) ** 0.5)  # the true norm, not 1024 x
    scaler.step(opt)
    scaler.update()
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict({k: v for k, v in zip(("weight", "bias"), before)})
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.1, foreach=True)
    grads_of(reference)
    ref_opt.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------------------- fp16 with a real scaler

def fp16_trainer(tmp: Path, updates: int, scaler: torch.amp.GradScaler) -> L.Trainer:
    """A stage's trainer (its checkpoint callback every 2 updates) with Lightning's fp16 plugin on the CPU."""
    return L.Trainer(accelerator="cpu", devices=1, max_steps=updates, max_epochs=-1, logger=False, accumulate_grad_batches=2,
                     callbacks=[ScheduledCheckpoints(tmp / "checkpoints", 2)],
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=str(tmp),
                     plugins=[MixedPrecision("16-mixed", "cpu", scaler)])


def fp16_module(tmp: Path, prepared: Path, corpus: Path, adamw: str, grad_clip: float = 1.0):
    cfg = tiny_config(tmp, corpus, "model.dropout=0.0", "model.attn_dropout=0.0", prepared=prepared)
    optim = OptimConfig(lr=2e-3, warmup_updates=2, updates=6, global_batch=8, micro_batch=4, grad_clip=grad_clip)
    L.seed_everything(1, verbose=False)
    model = RobertaMLM(cfg.model)
    meta = TrainingMeta(stage="pretrain", system="bl_base", lang="en", model_config={}, tokenizer={})
    module = MLMModule(model, optim, meta, 1.0, adamw=adamw)
    data = mlm_datamodule(cfg, "en", optim, 1, load_source_tokenizer(cfg))
    return module, data


@pytest.mark.parametrize("adamw", ["fused", "foreach"])
def test_fp16_with_loss_scaling_clips_true_gradients_and_resumes_exactly(tmp_path, prepared, corpus_dir, adamw):
    """Lightning on a CPU swaps 16-mixed for bf16-mixed, so a stage never runs fp16 here: the pieces are tested
    directly with Lightning's own fp16 plugin and a CPU GradScaler (the plugin a CUDA 16-mixed stage gets)."""
    def scaler() -> torch.amp.GradScaler:
        return torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=3)

    module, data = fp16_module(tmp_path / "a", prepared, corpus_dir, adamw)
    trainer = fp16_trainer(tmp_path / "a", 4, scaler())
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 4
    assert module.guard.last_norm is not None and float(module.guard.last_norm) < 100  # unscaled (x1024 otherwise)
    full = {k: v.clone() for k, v in module.state_dict().items()}
    assert trainer.precision_plugin.scaler.get_scale() == 2.0 ** 11  # grew once after 3 finite updates

    # the same run resumed from its checkpoint of update 2 (as a killed stage would be): the scaler's state
    # comes back with it and the last 2 updates are those of the uninterrupted run, bit for bit
    path = tmp_path / "a" / "checkpoints" / "step0000002.ckpt"
    saved = load_checkpoint(path)
    assert saved["MixedPrecision"]["_growth_tracker"] == 2 and saved["update_guard"] == {"skipped": 0}
    module, data = fp16_module(tmp_path / "c", prepared, corpus_dir, adamw)
    fresh_scaler = scaler()
    resumed = fp16_trainer(tmp_path / "c", 4, fresh_scaler)
    resumed.fit(module, datamodule=data, ckpt_path=str(path))
    assert resumed.global_step == 4 and fresh_scaler.get_scale() == 2.0 ** 11
    for k, v in full.items():
        assert torch.equal(module.state_dict()[k], v), k


def test_fp16_overflowing_updates_are_skipped_and_counted(tmp_path, prepared, corpus_dir):
    """A loss scale far too large overflows fp16: the scaler skips those updates and halves its scale; they stay
    updates of the schedule (global_step, FLOPs: the compute was spent) and are counted as skipped."""
    module, data = fp16_module(tmp_path, prepared, corpus_dir, "fused")
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 22, growth_interval=1000)
    trainer = fp16_trainer(tmp_path, 6, scaler)
    trainer.fit(module, datamodule=data)
    halvings = round(torch.log2(torch.tensor(2.0 ** 22 / scaler.get_scale())).item())
    assert trainer.global_step == 6 and 0 < module.guard.skipped == halvings < 6, halvings
    changed = [k for k, v in module.state_dict().items() if not torch.equal(v, initial[k])]
    assert changed  # the updates after the overflows trained


def test_fp16_stops_when_the_loss_scale_cannot_fall_further(tmp_path, prepared, corpus_dir, monkeypatch):
    module, data = fp16_module(tmp_path, prepared, corpus_dir, "foreach")
    real = module.loss
    monkeypatch.setattr(module, "loss", lambda batch: (real(batch)[0] * float("nan"), {}))
    scaler = torch.amp.GradScaler("cpu", init_scale=MIN_LOSS_SCALE * 10, growth_interval=1000)
    with pytest.raises(NonFiniteLossError, match="fp16 loss scale .* cannot fall further; 4 updates skipped"):
        fp16_trainer(tmp_path, 6, scaler).fit(module, datamodule=data)


# ------------------------------------------------------------------------------------- host syncs of an update

SYNC_OPS = {"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.nonzero.default",
            "aten.masked_select.default", "aten.item.default"}


class SyncCount(TorchDispatchMode):
    """Counts the operators that make a CUDA device wait for the host: reading a value (``item``, ``bool``) and
    data-dependent shapes (``nonzero``, boolean-mask indexing)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func)
        bool_index = name == "aten.index.Tensor" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []) if i is not None)
        if name in SYNC_OPS or bool_index:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_one_mlm_update_makes_one_host_sync_per_micro_batch_and_one_per_update():
    """Was 5 per micro-batch of a two-head model (the padding check, boolean-mask indexing of labels and of each
    head's states, the finite-loss check) and none per update; now the masked positions are found once per
    micro-batch and the finite check rides on the update's gradient norm."""
    torch.manual_seed(0)
    model = RobertaMLM(ModelConfig(vocab_size=50, hidden=16, layers=2, heads=2, ffn=32, max_positions=20,
                                   mini_heads=[1]))
    ids = torch.randint(5, 50, (2, 16))
    labels = torch.where(torch.rand(2, 16) < 0.3, ids, torch.full_like(ids, -100))
    labels[0, 3] = ids[0, 3]
    opt, _ = build_optimizer(model.parameters(), OptimConfig(), adamw="fused")  # as on CUDA
    guard, micro_batches = UpdateGuard(1.0), 2
    with SyncCount() as syncs:
        for _ in range(micro_batches):
            losses = model.mlm_losses(ids, labels)
            (sum(losses.values()) / 2).backward()
        guard(opt, None, 0)
    # (AdamW's step is left out: foreach AdamW reads its step counters with .item(), but they live on the host,
    # also on CUDA, so those reads make no device wait; fused AdamW reads nothing)
    assert syncs.count == micro_batches + 1


# ------------------------------------------------------------------------------------- compilation

@pytest.mark.slow
def test_every_training_stage_compiles_its_layers_when_asked(monkeypatch, tmp_path, prepared, corpus_dir):
    """``trainer.compile`` is read by the one runner: every stage compiles the layers it runs (the spy records
    how many; a real compile of step 2 is the next test)."""
    seen: list[tuple[str, int]] = []

    def spy(module: torch.nn.Module) -> int:
        from minimodel.models.model import Layer

        n = sum(isinstance(m, Layer) for m in module.modules())
        seen.append((type(module).__name__, n))
        return n

    monkeypatch.setattr(runner_mod, "compile_layers", spy)
    overrides = [*tiny_demo(tmp_path, prepared, corpus_dir), "sweep=['system=minijoint model.mini_heads=[2]','system=minipost']",
                 "target_langs=[de]", *(f"{s}.trainer.compile=true" for s in STAGES)]
    assert main(["run", str(ROOT / "experiments" / "demo.yaml"), *overrides, "--no-progress"]) == 0
    # MiniJoint: pretraining (4 layers), finetuning (4) and its mini-model finetuned on its own (2, Table 5),
    # adaptation over the mini-model (2); MiniPost: BL_BASE's pretraining (4), the bridge (1 copied + 1 new
    # layer), BL_BASE's finetuning (4), adaptation over the bridged mini-model (2)
    assert seen == [("MLMModule", 4), ("FinetuneModule", 4), ("FinetuneModule", 2), ("MLMModule", 2),
                    ("MLMModule", 4), ("MLMModule", 2), ("FinetuneModule", 4), ("MLMModule", 2)], seen


@pytest.mark.slow
def test_a_compiled_adaptation_update_agrees_with_eager():
    """Inductor on a CPU fuses and reorders fp32 arithmetic, so gradients agree with eager to float32 rounding,
    not bit for bit. AdamW's step is about lr x sign(gradient) for every element whatever the gradient's size,
    so a rounding difference in a tiny gradient moves its step by a visible fraction of lr: the tolerance is
    lr / 1000 (1e-5) absolute after 3 updates at lr 1e-2 (measured: 1.4e-6 on 1 of 6,400 elements)."""
    def adapted(compiled: bool) -> torch.Tensor:
        torch.manual_seed(0)
        model = RobertaMLM(ModelConfig(vocab_size=200, hidden=32, layers=2, heads=2, ffn=64, max_positions=34,
                                       dropout=0.0, attn_dropout=0.0))
        freeze_all_but(model, adaptation_trainable)
        if compiled:
            assert dev.compile_layers(model) == 2
        ids = torch.randint(5, 200, (4, 32), generator=torch.Generator().manual_seed(1))
        labels = torch.where(torch.rand(4, 32, generator=torch.Generator().manual_seed(2)) < 0.15, ids, -100)
        opt, _ = build_optimizer(model.parameters(), OptimConfig(lr=1e-2, warmup_updates=0))
        for _ in range(3):
            model.mlm_losses(ids, labels)["primary"].backward()
            UpdateGuard(1.0)(opt, None, 0)
            opt.step()
            opt.zero_grad()
        return model.embeddings.tokens.weight.detach().clone()

    eager, compiled = adapted(False), adapted(True)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------- the whole chain, GPU settings

@pytest.mark.slow
def test_the_tiny_chain_runs_with_fused_adamw_and_bf16_mixed(tmp_path, prepared, corpus_dir):
    """What every stage crashed on at its first update on a GPU: fused AdamW (as on CUDA) with gradient clipping
    under bf16-mixed, through ``minimodel run`` to the report."""
    gpu_like = [f"{s}.trainer.{k}={v}" for s in STAGES for k, v in (("adamw", "fused"), ("precision", "bf16-mixed"))]
    overrides = [*tiny_demo(tmp_path, prepared, corpus_dir), "target_langs=[de]", *gpu_like]
    assert main(["run", str(ROOT / "experiments" / "demo.yaml"), *overrides, "--no-progress"]) == 0
    runs = tmp_path / "runs" / "demo"
    assert (runs / "report.md").is_file()
    for run in ("bl_base/pretrain", "minipost/bridge", "minijoint/adapt/de", "bl_base/finetune/lohelp/seed1"):
        ckpt = load_checkpoint(runs / run / "checkpoints" / "last.ckpt")
        assert ckpt["optimizer_states"][0]["param_groups"][0]["fused"] is True, run
        assert ckpt["update_guard"] == {"skipped": 0}
        done = json.loads((runs / run / "done.json").read_text())
        assert done["skipped_updates"] == 0
    rows = (runs / "bl_base" / "pretrain" / "metrics.csv").read_text().splitlines()
    assert "train/grad_norm" in rows[0]


# ------------------------------------------------------------------------------------- DDP stops together

NAN_ON_RANK_1 = """
import sys
from minimodel.cli import main
from minimodel.training.callbacks import ScheduledCheckpoints
from minimodel.training.mlm import MLMModule

loss = MLMModule.loss

def poisoned(self, batch):
    total, losses = loss(self, batch)
    if self.global_rank == 1 and self.global_step == 2:
        total = total * float("nan")
    return total, losses

MLMModule.loss = poisoned
sys.exit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_nan_loss_on_one_rank_stops_both_at_the_same_update(tmp_path, prepared, corpus_dir):
    script = tmp_path / "nan_rank.py"
    script.write_text(NAN_ON_RANK_1)
    args = [*tiny_overrides(tmp_path, corpus_dir, prepared), *stage_overrides(
        ["pretrain"], updates=6, warmup_updates=2, global_batch=8, micro_batch=2, ckpt_every=2, log_every=1),
        "pretrain.trainer.accelerator=cpu", "pretrain.trainer.devices=2", "pretrain.trainer.strategy=ddp"]
    port = free_port()
    procs = []
    for rank in (0, 1):  # two processes as torchrun starts them: each is its own command, each exit code visible
        env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "NODE_RANK": "0", "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, str(script), "pretrain", str(ROOT / "experiments" / "tiny.yaml"),
                                       *args, "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]  # a rank left in a collective would hang until here
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == ERROR_EXIT, (rank, out)
        assert "not finite at update 3" in out, (rank, out)
    run = tmp_path / "runs" / "tiny" / "minijoint" / "pretrain"
    assert load_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 2  # the last good one is kept
    assert not (run / "done.json").exists()


def test_evaluation_precision_is_the_configured_one_on_every_device(monkeypatch):
    """``evaluate.precision``: auto follows native support on CUDA, and on the CPU (here, with the suite's
    MINIMODEL_CPU_BF16=0) stays in fp32 (tests/test_precision_auto.py: where bf16 is faster); bf16-mixed is bf16
    anywhere (a CPU with AMX runs it ~2.5x faster); 16-mixed is fp16 on CUDA and bf16 on the CPU; 32-true none."""
    cpu = torch.device("cpu")
    assert dev.autocast_dtype(cpu, "auto") is None and dev.autocast_dtype(cpu, "32-true") is None
    assert dev.autocast_dtype(cpu, "bf16-mixed") is torch.bfloat16 and dev.autocast_dtype(cpu, "16-mixed") is torch.bfloat16
    pretend_cuda(monkeypatch, capability=(7, 0))
    assert dev.autocast_dtype(torch.device("cuda", 0), "16-mixed") is torch.float16
    assert dev.autocast_dtype(torch.device("cuda", 0), "32-true") is None


def test_predict_in_bf16_on_the_cpu_agrees_with_fp32():
    """The CPU side of a bf16 evaluation: the same predictions as fp32 on a tiny decoder, probabilities to bf16's
    rounding."""
    from minimodel.data.downstream import predict
    from minimodel.models.decoder import DecoderLM
    from minimodel.models.model import ClassificationHead

    torch.manual_seed(0)
    body = DecoderLM(ModelConfig(family="decoder", vocab_size=200, hidden=32, layers=2, heads=4, kv_heads=2, ffn=64,
                                 max_positions=32, dropout=0.0, attn_dropout=0.0, norm="rmsnorm", positions="rotary",
                                 activation="swiglu", bias=False))
    head = ClassificationHead(32, 3, 0.0, pooling="last")
    with torch.no_grad():
        head.out.weight.mul_(50)  # decisive logits: an argmax tie cannot flip on rounding
    features = [{"input_ids": torch.randint(3, 200, (n,)).tolist(), "label": 0} for n in (5, 9, 12, 7)]
    full = predict(body, head, features, 2, torch.device("cpu"), "32-true")
    half = predict(body, head, features, 2, torch.device("cpu"), "bf16-mixed")
    assert [p for p, _ in half] == [p for p, _ in full]
    assert max(abs(a - b) for (_, pa), (_, pb) in zip(full, half) for a, b in zip(pa, pb)) < 0.05


def test_compile_layers_finds_the_decoders_layers_too():
    from minimodel.models.decoder import DecoderLM

    model = DecoderLM(ModelConfig(family="decoder", vocab_size=50, hidden=16, layers=3, heads=2, ffn=32,
                                  max_positions=16))
    assert dev.compile_layers(model) == 3
