"""The optimiser and schedule every training stage uses, and the checks around an update."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from minimodel.config import OptimConfig
from minimodel.errors import NonFiniteLossError


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig, total_updates: int | None = None,
                    warmup: int | None = None, first: list[torch.nn.Parameter] | None = None,
                    first_factor: Callable[[int], float] | None = None,
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (all trainable parameters, decoupled weight decay as fairseq) with linear warmup then linear decay.
    ``first`` (with ``first_factor``): parameters in a group of their own, ahead of the others, whose learning
    rate follows ``first_factor`` instead (active forgetting's restarted embedding schedule)."""
    params = [p for p in params if p.requires_grad]
    head = [p for p in (first or []) if p.requires_grad]
    if not params and not head:
        raise ValueError("nothing to train: no parameter requires a gradient")
    fused = all(p.is_cuda for p in params + head)
    groups: list = [{"params": head}, {"params": params}] if head else params
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,  # type: ignore[arg-type]
                            weight_decay=cfg.weight_decay, fused=fused or None)
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
                    first_factor: Callable[[int], float] | None = None) -> dict:
    """``configure_optimizers``' answer: the optimiser and its per-update schedule."""
    opt, sched = build_optimizer(params, cfg, first=first, first_factor=first_factor)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}


def accumulation(optim: OptimConfig, world: int) -> int:
    """Micro-batches per update on each process, so that an update sees ``global_batch`` sequences."""
    per_pass = optim.micro_batch * world
    if optim.global_batch % per_pass:
        raise ValueError(f"global_batch {optim.global_batch} is not a multiple of micro_batch x devices "
                         f"({optim.micro_batch} x {world})")
    return optim.global_batch // per_pass


def check_finite(loss: torch.Tensor, step: int, what: str = "loss") -> None:
    if not bool(torch.isfinite(loss.detach())):
        raise NonFiniteLossError(
            f"{what} is {loss.item()} at update {step}: stopping; the last checkpoint written before it is kept "
            f"(lower the learning rate or check the data, then rerun the same command to resume)")
