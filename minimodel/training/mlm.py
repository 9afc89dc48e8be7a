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
from torch import nn
from torchmetrics import MeanMetric

from minimodel.checkpoints import TrainingMeta
from minimodel.config import OptimConfig
from minimodel.flops import FlopSchedule
from minimodel.model import IGNORE_INDEX, PRIMARY, RobertaMLM
from minimodel.training.optim import check_finite, lightning_optim


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
        losses = model.mlm_losses(batch["input_ids"], batch["labels"], self.heads)
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


class MLMModule(L.LightningModule):
    """Trains the parameters of ``model`` that require a gradient on the weighted sum of the MLM losses of its
    heads (``weights``: head -> weight; default the mean over the heads).

    ``trainable(name)``, when given, is what must train: fitting refuses to start otherwise."""

    def __init__(self, model: RobertaMLM, optim: OptimConfig, meta: TrainingMeta, flops: float | FlopSchedule,
                 trainable: Callable[[str], bool] | None = None, weights: Mapping[str, float] | None = None,
                 phase_head: Callable[[int], str] | None = None) -> None:
        """``flops``: per update, or a ``FlopSchedule``; ``phase_head(step)``, when given, is the one head whose
        loss trains the update after ``step`` updates (progressive adaptation) instead of the weighted sum."""
        super().__init__()
        self.model, self.optim_cfg, self.meta = model, optim, meta
        self.flops = flops if isinstance(flops, FlopSchedule) else FlopSchedule.constant(flops)
        self.trainable = trainable
        self.weights = head_weights(model.cfg.head_names, weights)
        self.phase_head = phase_head
        self.val = MLMValidation(model.cfg.head_names)

    def on_fit_start(self) -> None:
        if self.trainable is None:
            return
        for name, p in self.model.named_parameters():
            if p.requires_grad != self.trainable(name):
                raise RuntimeError(f"{self.meta.stage}: {name} should {'' if self.trainable(name) else 'not '}train")

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The training loss (the weighted sum over heads, or the phase's head) and each head's loss."""
        if self.phase_head is not None:
            head = self.phase_head(self.global_step)
            losses = self.model.mlm_losses(batch["input_ids"], batch["labels"], [head])
            return losses[head], losses
        losses = self.model.mlm_losses(batch["input_ids"], batch["labels"])
        loss = sum((self.weights[h] * v for h, v in losses.items()), torch.zeros((), device=batch["input_ids"].device))
        return loss, losses

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """The weighted MLM loss of all the model's heads (or the phase's head); logs each head's loss and the lr.
        A phased run logs its loss as ``train/loss`` whatever the phase's head."""
        loss, losses = self.loss(batch)
        check_finite(loss, self.global_step)
        heads = list(losses)
        if self.phase_head is not None:
            logs = {"train/loss": loss.detach()}
        else:
            logs = {f"train/{head_metric(h, heads)}": v.detach() for h, v in losses.items()}
        if len(losses) > 1:
            logs["train/loss_total"] = loss.detach()
        self.log_dict(logs, prog_bar=True, on_step=True, on_epoch=False)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.val.update(self.model, batch)

    def on_validation_epoch_end(self) -> None:
        self.val.log(self)

    def configure_optimizers(self) -> dict:
        return lightning_optim(self.model.parameters(), self.optim_cfg)

    def cumulative_flops(self, step: int | None = None) -> float:
        return self.flops.at(self.global_step if step is None else step)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        meta = replace(self.meta, step=self.global_step, flops=self.cumulative_flops())
        if self.phase_head is not None:
            meta = replace(meta, extra={**meta.extra, "phase": self.phase_head(self.global_step)})
        checkpoint["minimodel"] = meta.to_dict()
