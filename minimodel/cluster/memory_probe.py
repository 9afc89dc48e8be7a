"""Measure what the memory plan (``minimodel.cluster.memory``) predicts: the peak memory of a training update of a
stage's real model, built from an experiment config with random weights as the stage builds it (the same
surgery and freezing), at the configured micro-batch, sequence length and precision.

One update as the stages run it: two micro-batches (the second runs with the first's gradients there, as
under gradient accumulation), the LM loss of the stage's heads (masked, or the next token at every position
but a block's last for a causal family; finetuning: a task head's cross-entropy),
gradient clipping, AdamW (``build_optimizer``: fused on CUDA), ``zero_grad(set_to_none=True)``. The update is
run once to create the optimizer's state, then measured.

On CUDA the peak is ``torch.cuda.max_memory_allocated``; elsewhere ``LiveTensors`` counts the bytes of live
tensor storages (a ``TorchDispatchMode``, so any device). Used by ``tests/test_memory.py`` (CPU, small sizes)
and ``scripts/gpu_check.py`` (CUDA, roberta-base sizes)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from minimodel.cluster.memory import is_qa
from minimodel.config.schema import PRIMARY, ExperimentConfig
from minimodel.data.tokenizer import BOS, MASK
from minimodel.models.families import build, causal, readout
from minimodel.models.model import IGNORE_INDEX, ClassificationHead, SpanHead, task_logits
from minimodel.models.surgery import (
    adaptation_trainable,
    build_minipost,
    extract_mini,
    freeze_all_but,
    primary_only,
    staged_body,
    swap_embeddings,
    tie_biases,
)
from minimodel.systems import Body, stage_plan
from minimodel.training.device import resolve_precision

N_SPECIAL = 5  # <s> <pad> </s> <unk> <mask>: never drawn as a token


class LiveTensors(TorchDispatchMode):
    """Bytes of the tensor storages that operators allocate while active and that are still alive (``live``),
    and their maximum (``peak``). Storages allocated before (parameters, batches) are not counted, nor views of
    them and in-place results (an output that shares a storage with an input is not a new allocation)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: dict[int, weakref.ref] = {}  # data pointer -> the storage, while it lives

    def _forget(self, key: int, nbytes: int) -> None:
        self._seen.pop(key, None)
        self.live -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if not nbytes or key in inputs or key in self._seen:
                continue
            self._seen[key] = weakref.ref(storage, lambda _, k=key, n=nbytes: self._forget(k, n))
            self.live += nbytes
        self.peak = max(self.peak, self.live)
        return out

    def reset_peak(self) -> None:
        self.peak = self.live


# ------------------------------------------------------------------------------------------ the stages' models


@dataclass
class StageUnderTest:
    """A stage's model and how one micro-batch's loss is computed from a batch."""

    stage: str
    model: nn.Module
    loss: Callable[[dict[str, Tensor]], Tensor]
    vocab: int
    seq_len: int
    micro_batch: int
    precision: str
    task_labels: int = 0  # finetuning: classes of the task head (0: a span head)
    causal: bool = False  # LM labels are the next tokens (a causal family), not masked positions


def mlm_loss(model: nn.Module, heads: list[str] | None = None) -> Callable[[dict[str, Tensor]], Tensor]:
    """The LM stages' loss: the mean of the heads' losses (``MLMModule``'s default weights)."""
    def loss(batch: dict[str, Tensor]) -> Tensor:
        losses = model.mlm_losses(batch["input_ids"], batch["labels"], heads)
        return torch.stack(list(losses.values())).mean()
    return loss


class Distilled(nn.Module):
    """``bridge.objective=distill`` as the bridge stage holds it: the student trains, the whole source model stays on
    the device as its frozen teacher, in eval mode whatever mode the pair is put in (``MLMModule``'s teacher)."""

    def __init__(self, student: nn.Module, teacher: nn.Module) -> None:
        super().__init__()
        self.student, self.teacher = student, teacher.eval().requires_grad_(False)

    def train(self, mode: bool = True) -> Distilled:
        super().train(mode)
        self.teacher.eval()
        return self


def build_stage(cfg: ExperimentConfig, stage: str) -> StageUnderTest:
    """The model ``stage`` trains, as ``stages/{stage}.py`` builds it (random weights), of the config's model
    family (``families.build``)."""
    m, d, lm = cfg.model, cfg.data, causal(cfg.model)
    if stage == "pretrain":
        model = build(m)
        o = cfg.pretrain.optim
        return StageUnderTest(stage, model, mlm_loss(model), m.vocab_size, d.seq_len, o.micro_batch,
                              cfg.pretrain.trainer.precision, causal=lm)
    if stage == "bridge":  # the recipe's bridge.init (an affine map: the identity here) and, distilled, its teacher
        b = cfg.bridge
        source = build(replace(m, mini_heads=[]))
        mini = build_minipost(source, b.depth, b.layers, seed=b.trainer.seed, init=b.init)
        if b.objective != "distill":
            return StageUnderTest(stage, mini, mlm_loss(mini), m.vocab_size, d.seq_len, b.optim.micro_batch,
                                  b.trainer.precision, causal=lm)
        from minimodel.training.mlm import distill_losses

        pair = Distilled(mini, source)
        return StageUnderTest(stage, pair, lambda batch: distill_losses(
            mini, pair.teacher, batch["input_ids"], batch["labels"], b.distill_mse)[0], m.vocab_size, d.seq_len,
            b.optim.micro_batch, b.trainer.precision, causal=lm)
    if stage == "adapt":
        plan = stage_plan(cfg, "adapt")
        kind = plan.body
        primary = build(m)
        if cfg.adapt.schedule:
            body, _ = staged_body(primary, [p.head for p in plan.phases])
        elif kind is Body.HEAD:
            body = extract_mini(primary, plan.depth, plan.head)
        elif kind is Body.BRIDGE:
            body = build_minipost(primary_only(primary), cfg.bridge.depth, cfg.bridge.layers)
        else:
            body = primary_only(primary)
        vocab = d.vocab_size
        output = None if m.tie_embeddings else torch.randn(vocab, m.hidden) * m.init_std  # init_output's shape
        swap_embeddings(body, torch.randn(vocab, m.hidden) * m.init_std, torch.zeros(vocab), output)
        tie_biases(body)
        freeze_all_but(body, adaptation_trainable)
        o = cfg.adapt.optim
        return StageUnderTest(stage, body, mlm_loss(body, [PRIMARY]), vocab, d.seq_len, o.micro_batch,
                              cfg.adapt.trainer.precision, causal=lm)
    if stage == "finetune":
        from minimodel.stages.finetune import finetune_trainable

        task = max(cfg.finetune.tasks, key=lambda t: cfg.tasks[t].max_len)
        body = primary_only(build(m))
        pool, layer = readout(cfg, m.layers)
        freeze_all_but(body, partial(finetune_trainable, below=layer))
        qa, labels = is_qa(cfg, task), 3
        head: nn.Module = (SpanHead(m.hidden, layer) if qa
                           else ClassificationHead(m.hidden, labels, m.dropout, pool, layer))
        model = nn.ModuleDict({"body": body, "head": head})

        def loss(batch: dict[str, Tensor]) -> Tensor:
            out = task_logits(body, head, batch["input_ids"])
            if qa:
                start, end = out
                return (F.cross_entropy(start.float(), batch["start"]) + F.cross_entropy(end.float(), batch["end"])) / 2
            return F.cross_entropy(out.float(), batch["label"])

        return StageUnderTest(stage, model, loss, m.vocab_size, cfg.tasks[task].max_len, cfg.finetune.micro_batch,
                              cfg.finetune.trainer.precision, 0 if qa else labels)
    raise ValueError(f"no stage {stage!r}: pretrain, bridge, adapt or finetune")


def make_batch(s: StageUnderTest, mask_prob: float, device: torch.device, seed: int = 0) -> dict[str, Tensor]:
    """Random tokens after <s>, no padding; MLM stages: exactly round(mask_prob x tokens) masked positions (the
    plan's count) anywhere but on a <s>; causal LM stages: the next token at every position but the last
    (``data.mlm``'s blocks); finetuning: random labels and answer spans."""
    g = torch.Generator().manual_seed(seed)
    b, t = s.micro_batch, s.seq_len
    ids = torch.randint(N_SPECIAL, s.vocab, (b, t), generator=g)
    ids[:, 0] = BOS
    out = {"input_ids": ids}
    if s.stage == "finetune":
        out["label"] = torch.randint(0, max(1, s.task_labels), (b,), generator=g)
        out["start"] = torch.randint(0, t, (b,), generator=g)
        out["end"] = torch.randint(0, t, (b,), generator=g)
    elif s.causal:
        out["labels"] = torch.cat([ids[:, 1:], torch.full((b, 1), IGNORE_INDEX)], dim=1)
    else:
        positions = torch.arange(b * t)
        positions = positions[positions % t != 0]  # never a <s>
        flat = positions[torch.randperm(len(positions), generator=g)[: round(mask_prob * b * t)]]
        labels = torch.full((b * t,), IGNORE_INDEX)
        labels[flat] = ids.flatten()[flat]
        ids.view(-1)[flat] = MASK
        out["labels"] = labels.view(b, t)
    return {k: v.to(device) for k, v in out.items()}


# ------------------------------------------------------------------------------------------ one update


@dataclass(frozen=True)
class Measured:
    """What one update of a stage's model took (bytes): the parameters, gradients and AdamW state it holds, and
    the peak of all its tensors during the update (weights, gradients and state included; the batch not)."""

    weights: int
    gradients: int
    optimizer: int
    peak: int

    @property
    def rest(self) -> int:
        """The peak less weights, gradients and optimizer: activations, weight copies, logits, the backward's own."""
        return self.peak - self.weights - self.gradients - self.optimizer


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The stage's autocast: bf16 (16-mixed: fp16 on CUDA, bf16 on the CPU, as Lightning does), none in 32-true;
    auto as the stage resolves it on ``device`` (``resolve_precision``)."""
    if precision == "auto":
        precision = resolve_precision(device).precision
    if precision == "32-true":
        return contextlib.nullcontext()
    dtype = torch.float16 if precision == "16-mixed" and device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


def _bytes(tensors: Iterator[Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def measure_update(s: StageUnderTest, device: torch.device, mask_prob: float, grad_clip: float = 1.0) -> Measured:
    """Peak memory of one update of ``s`` on ``device`` (two micro-batches, after one warm-up update)."""
    from minimodel.config.schema import OptimConfig
    from minimodel.training.optim import build_optimizer

    torch.manual_seed(0)
    batches = [make_batch(s, mask_prob, device, seed) for seed in (1, 2)]
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0  # the batches, anything earlier
    model = s.model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt, _ = build_optimizer(params, OptimConfig(warmup_updates=10, updates=100))
    precision = resolve_precision(device).precision if s.precision == "auto" else s.precision
    scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" and device.type == "cuda" else None

    def update() -> None:
        for batch in batches:
            with autocast(device, precision):
                loss = s.loss(batch)
            (scaler.scale(loss) if scaler else loss).backward()
            del loss
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    weights = _bytes(model.parameters())
    if device.type == "cuda":
        update()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        update()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base  # weights and optimizer state included
    else:
        with LiveTensors() as live:
            update()
            live.reset_peak()
            update()
        peak = weights + live.peak  # the tracker counts what the updates created: optimizer state included
    grads = sum(4 * p.numel() for p in params)  # fp32, as the update leaves them before zero_grad
    state = _bytes(v for st in opt.state.values() for v in st.values() if isinstance(v, Tensor) and v.dim() > 0)
    return Measured(weights=weights, gradients=grads, optimizer=state, peak=peak)
