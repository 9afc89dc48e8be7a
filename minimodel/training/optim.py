"""The optimiser and schedule every training stage uses, and the checks around an update."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from minimodel.config.schema import OptimConfig
from minimodel.errors import NonFiniteLossError
from minimodel.training.device import adamw_fused

MIN_LOSS_SCALE = 1e-4
"""fp16: a run whose loss scale falls below this (fairseq's ``min_loss_scale``) keeps overflowing whatever the
scale, i.e. its loss or gradients are NaN/inf in themselves: it stops as a non-finite loss does in bf16/fp32."""


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig, total_updates: int | None = None,
                    warmup: int | None = None, first: list[torch.nn.Parameter] | None = None,
                    first_factor: Callable[[int], float] | None = None, adamw: str = "auto",
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (all trainable parameters, decoupled weight decay as fairseq) with linear warmup then linear decay.
    ``first`` (with ``first_factor``): parameters in a group of their own, ahead of the others, whose learning
    rate follows ``first_factor`` instead (active forgetting's restarted embedding schedule). ``adamw``: the
    implementation (``trainer.adamw``; ``device.adamw_fused``)."""
    params = [p for p in params if p.requires_grad]
    head = [p for p in (first or []) if p.requires_grad]
    if not params and not head:
        raise ValueError("nothing to train: no parameter requires a gradient")
    fused = adamw_fused(params + head, adamw)
    groups: list = [{"params": head}, {"params": params}] if head else params
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,  # type: ignore[arg-type]
                            weight_decay=cfg.weight_decay, fused=fused or None, foreach=None if fused else True)
    total = total_updates if total_updates is not None else cfg.updates
    warm = warmup if warmup is not None else cfg.warmup_updates

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / max(1, warm)
        return max(0.0, (total - step) / max(1, total - warm))

    if head:
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, [first_factor or factor, factor])
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def lightning_optim(params: Iterable[torch.nn.Parameter], cfg: OptimConfig,
                    first: list[torch.nn.Parameter] | None = None,
                    first_factor: Callable[[int], float] | None = None, adamw: str = "auto") -> dict:
    """``configure_optimizers``' answer: the optimiser and its per-update schedule."""
    opt, sched = build_optimizer(params, cfg, first=first, first_factor=first_factor, adamw=adamw)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}


def accumulation(optim: OptimConfig, world: int) -> int:
    """Micro-batches per update on each process, so that an update sees ``global_batch`` sequences."""
    per_pass = optim.micro_batch * world
    if optim.global_batch % per_pass:
        raise ValueError(f"global_batch {optim.global_batch} is not a multiple of micro_batch x devices "
                         f"({optim.micro_batch} x {world})")
    return optim.global_batch // per_pass


def non_finite(step: int, detail: str) -> NonFiniteLossError:
    return NonFiniteLossError(
        f"the loss or its gradient is not finite at update {step + 1} ({detail}): stopping on every process; the "
        f"last checkpoint written before it is kept (lower the learning rate or check the data, then rerun the "
        f"same command to resume)")


class UpdateGuard:
    """What every training stage does once per update, when the gradients are final (accumulated over the
    micro-batches, all-reduced over the processes, unscaled): clip them and decide whether the update may go on.

    One place instead of Lightning's clipping (``Trainer(gradient_clip_val=...)``), which refuses an optimizer
    that unscales fp16 gradients internally (fused AdamW) in every mixed precision, bf16 included:
    - fp16 with fused AdamW: the gradients are unscaled here (``GradScaler.unscale_``, which the scaler's step
      then honours), so clipping sees true gradients; with foreach AdamW Lightning has already unscaled them;
    - the total gradient norm (clipped to ``max_norm``, not clipped with 0) is the one host sync of an update;
      it is NaN/inf when any process's loss was: DDP has summed the gradients, so every process sees the same
      norm and stops at the same update with the same message (no rank is left waiting in a collective);
    - with a loss scaler (fp16), a non-finite norm is an overflow: the scaler skips the update and lowers its
      scale; ``skipped`` counts such updates (they are still updates in ``global_step``, the schedule and the
      FLOPs, which were spent); a scale that falls below ``MIN_LOSS_SCALE`` stops the run as above.
    """

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm
        self.skipped = 0  # fp16 updates the scaler skipped (inf/NaN gradients); saved with the checkpoints
        self.last_norm: torch.Tensor | None = None

    def __call__(self, optimizer: Any, scaler: Any, step: int) -> torch.Tensor:
        """Called from ``configure_gradient_clipping`` with the torch optimizer and the precision plugin's scaler
        (None without fp16); returns the gradient norm before clipping."""
        opt = getattr(optimizer, "optimizer", optimizer)  # Lightning's wrapper -> the torch optimiser
        if scaler is not None and getattr(opt, "_step_supports_amp_scaling", False):
            scaler.unscale_(opt)  # fused: Lightning left the gradients scaled
        grads = [p for group in opt.param_groups for p in group["params"] if p.grad is not None]
        if self.max_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(grads, self.max_norm)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in grads])
        self.last_norm = norm.detach()
        if bool(torch.isfinite(norm)):  # the update's one host sync
            return norm
        if scaler is None:
            raise non_finite(step, f"gradient norm {float(norm)}")
        self.skipped += 1
        scale = float(scaler.get_scale())
        if scale * scaler.get_backoff_factor() < MIN_LOSS_SCALE:
            raise non_finite(step, f"fp16 loss scale {scale:g} cannot fall further; {self.skipped} updates skipped")
        return norm

    def state_dict(self) -> dict:
        return {"skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.skipped = int(state.get("skipped", 0))
