"""Fused vs foreach AdamW, side by side: the optimiser step alone and a whole update (pretraining, all parameters
training; step 2 over the 12-layer body, embeddings and output bias training), with the stages' ``UpdateGuard``
(clipping at 1.0, the finite check) in every variant.

``trainer.adamw=auto`` picks fused on CUDA (``training/device.py``): this prints what that choice costs or saves
on the device at hand. On a CPU it shows the CPU kernels only; on a GPU run it there by hand (``make gpu-check`` runs
``run_all.py --quick``, which leaves it out).

    .venv/bin/python benchmarks/bench_optim.py [--quick] [--device cpu|cuda] [--json PATH]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import common
import torch

from minimodel.config.schema import OptimConfig
from minimodel.training.optim import UpdateGuard, build_optimizer


def optimizer_step(model: torch.nn.Module, adamw: str) -> Callable[[], None]:
    """One guarded AdamW step on fixed gradients (no forward or backward)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt, _ = build_optimizer(params, OptimConfig(), adamw=adamw)
    guard = UpdateGuard(1.0)

    def step() -> None:
        guard(opt, None, 0)
        opt.step()

    return step


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=0, help="timed windows per variant (default 7, quick 3)")
    args = p.parse_args(argv)
    device = common.setup(args)
    sizes = common.default_sizes(device, args.quick)
    windows, iters, warmup = args.windows or (3 if args.quick else 7), 2, 1 if args.quick else 2
    common.rule("bench_optim: fused vs foreach AdamW")
    info = common.machine_info(device)
    print(f"device {device.type} ({info.get('gpu', info['cpu'])}), torch {info['torch']}, {info['threads']} threads; "
          f"sizes: {sizes.describe()}")
    batch = common.make_batch(sizes, device)
    rows = []
    for what, build in (("pretrain", lambda: common.pretrain_model(sizes)),
                        ("adapt (12-layer body)", lambda: common.adaptation_model(sizes, common.BODY_LAYERS))):
        fns: dict[str, Any] = {}
        for adamw in ("foreach", "fused"):
            torch.manual_seed(0)
            fns[f"{what} step {adamw}"] = optimizer_step(build().to(device), adamw)
            torch.manual_seed(0)
            model = build().to(device)
            train = common.TrainStep(model, batch, device)
            train.opt, train.sched = build_optimizer(train.params, OptimConfig(warmup_updates=10**6, updates=2 * 10**6),
                                                     adamw=adamw)
            fns[f"{what} update {adamw}"] = train
        times = common.interleaved_times(fns, device, warmup, windows, iters)
        for part in ("step", "update"):
            foreach, fused = (common.median(times[f"{what} {part} {a}"]) for a in ("foreach", "fused"))
            rows.append({"stage": what, "part": part, "foreach_s": foreach, "fused_s": fused,
                         "fused_speedup": foreach / fused})
    print(f"\n{'stage':<24}{'part':<8}{'foreach s':>11}{'fused s':>11}{'foreach/fused':>15}")
    for r in rows:
        print(f"{r['stage']:<24}{r['part']:<8}{r['foreach_s']:>11.4f}{r['fused_s']:>11.4f}{r['fused_speedup']:>14.2f}x")
    figures = {"machine": info, "sizes": asdict(sizes), "windows": windows, "iters": iters, "rows": rows}
    common.write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
