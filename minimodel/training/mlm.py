"""The one LightningModule of the MLM stages (pretraining, bridge, adaptation).

The stages differ in the model they hand over (what is frozen is already set on it), which
parameters must train (checked when fitting starts) and the metadata their checkpoints carry;
they wrap this module and do not subclass it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric

from minimodel.config.schema import OptimConfig
from minimodel.flops import FlopSchedule
from minimodel.log import get_logger
from minimodel.models.model import IGNORE_INDEX, PRIMARY, RobertaMLM
from minimodel.store.checkpoints import TrainingMeta
from minimodel.training.optim import UpdateGuard, lightning_optim

log = get_logger(__name__)


def head_metric(head: str, heads: list[str]) -> str:
    """primary -> loss; the one secondary head -> loss_mini; several -> loss_l{N}."""
    if head == PRIMARY:
        return "loss"
    return "loss_mini" if len(heads) == 2 else f"loss_{head}"


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))


class MLMValidation(nn.Module):
    """Token-weighted validation loss and perplexity per head, reduced over processes."""

    def __init__(self, heads: list[str]) -> None:
        super().__init__()
        self.heads = heads
        self.loss = nn.ModuleDict({h: MeanMetric() for h in heads})

    def update(self, model: RobertaMLM, batch: dict[str, torch.Tensor]) -> None:
        losses = model.lm_losses(batch["input_ids"], batch["labels"], self.heads)
        n = batch["labels"].ne(IGNORE_INDEX).sum()
        for h, v in losses.items():
            self.loss[h].update(v, n)

    def log(self, module: L.LightningModule) -> None:
        for h in self.heads:
            value = float(self.loss[h].compute())
            name = head_metric(h, self.heads)
            module.log(f"val/{name}", value)
            module.log(f"val/{name.replace('loss', 'ppl')}", perplexity(value))
            self.loss[h].reset()


def head_weights(heads: list[str], weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """The weight of each head's loss: ``weights`` as given, or the mean over all heads (1/len(heads) each)."""
    if not weights:
        return {h: 1.0 / len(heads) for h in heads}
    missing = [h for h in heads if h not in weights]
    if missing or len(weights) != len(heads):
        raise ValueError(f"head weights {dict(weights)} do not match the model's heads {heads}")
    return {h: float(weights[h]) for h in heads}


def forget_init(vocab: int, hidden: int, std: float, pad_id: int, seed: int, step: int) -> torch.Tensor:
    """The fresh token embeddings of active forgetting after update ``step``: N(0, std) from a generator seeded by
    (``seed``, ``step``) alone, so every rank draws the same matrix without talking to the others; padding row 0."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    weight = torch.randn(vocab, hidden, generator=gen) * std
    weight[pad_id] = 0.0
    return weight


def window_factor(step: int, every: int, total: int, warmup: int) -> float:
    """Learning-rate factor of the embeddings under active forgetting with restarts: within each window of
    ``every`` updates (the last one ends at ``total``), linear warmup over ``min(warmup, window / 2)`` updates,
    then linear decay to 0 at the window's end."""
    start = (step // every) * every
    end = min(start + every, total)
    warm, local = max(1, min(warmup, (end - start) // 2)), step - start
    if local < warm:
        return (local + 1) / warm
    return max(0.0, (end - step) / max(1, end - start - warm))


def distill_losses(student: nn.Module, teacher: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor,
                   mse_weight: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``bridge.objective=distill``: at the positions the LM loss scores (``labels`` != -100), the KL divergence
    KL(teacher || student) of the two next-token (or masked-token) distributions, plus ``mse_weight`` times the mean
    squared difference of their final hidden states (each model's ``final_state``: what its output projection and a
    task head read). The teacher runs without gradient. Returns the training loss and its parts, with the student's
    own LM loss (``lm``, logged, not trained) beside them."""
    where = labels.flatten().ne(IGNORE_INDEX).nonzero().squeeze(1)
    targets = labels.flatten().index_select(0, where)
    top = student.cfg.layers
    h_s = student.hidden_states(input_ids, [top], padded=False)[top].flatten(0, 1).index_select(0, where)
    with torch.no_grad():
        depth = teacher.cfg.layers
        h_t = teacher.hidden_states(input_ids, [depth], padded=False)[depth].flatten(0, 1).index_select(0, where)
        teacher_logp = F.log_softmax(teacher.heads[PRIMARY](h_t).float(), dim=-1)
        teacher_state = teacher.final_state(h_t).float() if mse_weight else None
    logits = student.heads[PRIMARY](h_s).float()
    logp = F.log_softmax(logits, dim=-1)
    kl = F.kl_div(logp, teacher_logp, log_target=True, reduction="batchmean")
    parts = {"kl": kl, "lm": F.nll_loss(logp, targets).detach()}
    loss = kl
    if mse_weight:
        mse = F.mse_loss(student.final_state(h_s).float(), teacher_state)
        parts["mse"] = mse
        loss = loss + mse_weight * mse
    return loss, parts


class MLMModule(L.LightningModule):
    """Trains the parameters of ``model`` that require a gradient on the weighted sum of the MLM losses of its
    heads (``weights``: head -> weight; default the mean over the heads).

    ``trainable(name)``, when given, is what must train: fitting refuses to start otherwise."""

    def __init__(self, model: RobertaMLM, optim: OptimConfig, meta: TrainingMeta, flops: float | FlopSchedule,
                 trainable: Callable[[str], bool] | None = None, weights: Mapping[str, float] | None = None,
                 phase_head: Callable[[int], str] | None = None, forget_every: int = 0,
                 forget_lr_restart: bool = False, forget_seed: int = 0, adamw: str = "auto",
                 teacher: nn.Module | None = None, distill_mse: float = 0.0) -> None:
        """``flops``: per update, or a ``FlopSchedule``; ``phase_head(step)``, when given, is the one head whose
        loss trains the update after ``step`` updates (progressive adaptation) instead of the weighted sum;
        ``adamw``: ``trainer.adamw``; ``teacher``: train on ``distill_losses`` against this frozen model instead of
        the LM loss (``bridge.objective=distill``; it is not part of the module's state: checkpoints hold only the
        trained model)."""
        super().__init__()
        if teacher is not None:
            if phase_head is not None or len(model.cfg.head_names) > 1:
                raise ValueError("distillation trains one head: no phases, no secondary heads")
            teacher.eval().requires_grad_(False)
        self._teacher = (teacher,) if teacher is not None else ()  # a tuple: not a registered submodule
        self.distill_mse = distill_mse
        self.model, self.optim_cfg, self.meta, self.adamw = model, optim, meta, adamw
        self.guard = UpdateGuard(optim.grad_clip)
        self.flops = flops if isinstance(flops, FlopSchedule) else FlopSchedule.constant(flops)
        self.trainable = trainable
        self.weights = head_weights(model.cfg.head_names, weights)
        self.phase_head = phase_head
        self.forget_every, self.forget_lr_restart, self.forget_seed = forget_every, forget_lr_restart, forget_seed
        self._forgot_at = -1
        self.val = MLMValidation(model.cfg.head_names)

    @property
    def teacher(self) -> nn.Module | None:
        return self._teacher[0] if self._teacher else None

    def on_fit_start(self) -> None:
        if self.teacher is not None:
            self.teacher.to(self.device)
        if self.trainable is None:
            return
        for name, p in self.model.named_parameters():
            if p.requires_grad != self.trainable(name):
                raise RuntimeError(f"{self.meta.stage}: {name} should {'' if self.trainable(name) else 'not '}train")

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The training loss (the weighted sum over heads, the phase's head, or the distillation loss) and each
        head's loss (with a teacher: the student's LM loss and the distillation's parts)."""
        if self.teacher is not None:
            return distill_losses(self.model, self.teacher, batch["input_ids"], batch["labels"], self.distill_mse)
        if self.phase_head is not None:
            head = self.phase_head(self.global_step)
            losses = self.model.lm_losses(batch["input_ids"], batch["labels"], [head])
            return losses[head], losses
        losses = self.model.lm_losses(batch["input_ids"], batch["labels"])
        loss = sum((self.weights[h] * v for h, v in losses.items()), torch.zeros((), device=batch["input_ids"].device))
        return loss, losses

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The weighted MLM loss of all the model's heads (or the phase's head); logs each head's loss and the lr.
        A phased run logs its loss as ``train/loss`` whatever the phase's head."""
        loss, losses = self.loss(batch)  # a NaN/inf loss stops the run at the update's gradient check (guard)
        heads = list(losses)
        if self.teacher is not None:  # the student's LM loss as every stage logs it, and the distillation's parts
            logs = {"train/loss": losses["lm"], **{f"train/{k}": v.detach() for k, v in losses.items() if k != "lm"},
                    "train/loss_total": loss.detach()}
            self.log_dict(logs, prog_bar=True, on_step=True, on_epoch=False)
            self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
            return loss
        if self.phase_head is not None:
            logs = {"train/loss": loss.detach()}
        else:
            logs = {f"train/{head_metric(h, heads)}": v.detach() for h, v in losses.items()}
        if len(losses) > 1:
            logs["train/loss_total"] = loss.detach()
        self.log_dict(logs, prog_bar=True, on_step=True, on_epoch=False)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Once per update, with the final gradients: clip, check, count (``UpdateGuard``)."""
        norm = self.guard(optimizer, getattr(self.trainer.precision_plugin, "scaler", None), self.global_step)
        self.log("train/grad_norm", norm.detach(), on_step=True, on_epoch=False)
        if self.guard.skipped:
            self.log("train/skipped_updates", float(self.guard.skipped), on_step=True, on_epoch=False)

    def on_train_batch_start(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Active forgetting: before the first micro-batch of update K+1, 2K+1, ... re-initialise the embeddings.
        Doing it at the start of the next update (not at the end of update K) puts every checkpoint of update K
        before the reset, so a run resumed from it makes the same reset again: resume stays exact."""
        step = self.global_step
        if self.forget_every and step and step % self.forget_every == 0 and self._forgot_at != step:
            self._forgot_at = step
            self.forget(step)

    def forget(self, step: int) -> None:
        """Fresh token embeddings (``forget_init``; every tied MLM projection follows by the tie) and fresh AdamW
        state for them (moments and bias-correction step restart at 0); nothing else changes."""
        emb = self.model.embeddings.tokens.weight
        fresh = forget_init(emb.shape[0], emb.shape[1], self.model.cfg.init_std, self.model.cfg.pad_id,
                            self.forget_seed, step)
        with torch.no_grad():
            emb.copy_(fresh.to(device=emb.device, dtype=emb.dtype))
        optimizer = self.optimizers()
        optimizer = getattr(optimizer, "optimizer", optimizer)  # Lightning's wrapper -> the torch optimiser
        optimizer.state.pop(emb, None)
        log.info(f"active forgetting: token embeddings re-initialised after update {step}")

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.val.update(self.model, batch)

    def on_validation_epoch_end(self) -> None:
        self.val.log(self)

    def configure_optimizers(self) -> dict:
        if not (self.forget_every and self.forget_lr_restart):
            return lightning_optim(self.model.parameters(), self.optim_cfg, adamw=self.adamw)
        # the embeddings in a group of their own, whose schedule restarts at each re-initialisation
        emb = self.model.embeddings.tokens.weight
        rest = [p for p in self.model.parameters() if p is not emb]
        o = self.optim_cfg
        every, total, warm = self.forget_every, o.updates, o.warmup_updates
        return lightning_optim(rest, o, first=[emb],
                               first_factor=lambda step: window_factor(step, every, total, warm), adamw=self.adamw)

    def cumulative_flops(self, step: int | None = None) -> float:
        return self.flops.at(self.global_step if step is None else step)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        meta = replace(self.meta, step=self.global_step, flops=self.cumulative_flops())
        if self.phase_head is not None:
            meta = replace(meta, extra={**meta.extra, "phase": self.phase_head(self.global_step)})
        checkpoint["minimodel"] = meta.to_dict()
        checkpoint["update_guard"] = self.guard.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.guard.load_state_dict(checkpoint.get("update_guard", {}))
