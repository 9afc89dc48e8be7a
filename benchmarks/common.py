"""What the benchmarks share: sizes, device and command line, model builders that follow the real
stages (same freezing, same loss, same optimiser), one training update, interleaved timing, the
machine's matmul peak, a profiler summary and machine information.

The benchmark scripts print figures; they are not tests. Each one writes its figures as JSON when
given ``--json PATH`` (``run_all.py`` collects them)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python benchmarks/x.py` from anywhere
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from minimodel.config.schema import OptimConfig  # noqa: E402
from minimodel.data.tokenizer import BOS, MASK  # noqa: E402
from minimodel.models.model import IGNORE_INDEX, ModelConfig, RobertaMLM  # noqa: E402
from minimodel.models.surgery import adaptation_trainable, build_minipost, extract_mini, freeze_all_but  # noqa: E402
from minimodel.training.device import compile_layers as device_compile_layers  # noqa: E402
from minimodel.training.optim import UpdateGuard, build_optimizer  # noqa: E402

N_SPECIAL = 5
MINI_DEPTH, BRIDGE_LAYERS, BODY_LAYERS = 4, 2, 12


# --------------------------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    hidden: int
    heads: int
    ffn: int
    seq_len: int
    batch: int
    vocab: int
    mask_prob: float = 0.15

    @property
    def tokens(self) -> int:
        """Tokens per update (batch x sequence length)."""
        return self.batch * self.seq_len

    def config(self, layers: int, mini_heads: Sequence[int] = ()) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab, hidden=self.hidden, layers=layers, heads=self.heads,
                           ffn=self.ffn, max_positions=self.seq_len + 2, mini_heads=list(mini_heads))

    def with_width(self, hidden: int) -> Sizes:
        """Same sequence, batch and vocabulary at another width (heads of 64, ffn = 4 h)."""
        return replace(self, hidden=hidden, heads=max(1, hidden // 64), ffn=4 * hidden)

    def describe(self) -> str:
        return (f"h={self.hidden} heads={self.heads} ffn={self.ffn} seq={self.seq_len} batch={self.batch} "
                f"vocab={self.vocab} mask_prob={self.mask_prob}")


CPU_SIZES = Sizes(hidden=512, heads=8, ffn=2048, seq_len=128, batch=8, vocab=8000)
GPU_SIZES = Sizes(hidden=768, heads=12, ffn=3072, seq_len=512, batch=32, vocab=50_000)  # roberta-base
QUICK_SIZES = Sizes(hidden=128, heads=2, ffn=512, seq_len=64, batch=4, vocab=1000)


def default_sizes(device: torch.device, quick: bool) -> Sizes:
    if quick:
        return QUICK_SIZES
    return GPU_SIZES if device.type == "cuda" else CPU_SIZES


# --------------------------------------------------------------------------------------------- command line


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="seconds-long smoke run (tiny sizes, few iterations)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here as JSON")
    return p


def setup(args: argparse.Namespace) -> torch.device:
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if name == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return torch.device(name)


def write_json(path: Path | None, figures: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=1, default=str))


def machine_info(device: torch.device) -> dict[str, Any]:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    info: dict[str, Any] = {"hostname": socket.gethostname(), "cpu": cpu, "cores": len(os.sched_getaffinity(0)),
                            "torch": torch.__version__, "threads": torch.get_num_threads(),
                            "python": platform.python_version(), "device": device.type}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def rule(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 90 - len(title)), flush=True)


# --------------------------------------------------------------------------------------------- models


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on GPU (the stages' bf16-mixed), plain fp32 on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def pretrain_model(sizes: Sizes, layers: int = BODY_LAYERS, mini_heads: Sequence[int] = ()) -> RobertaMLM:
    """Step 1: every parameter trains (BL_BASE with no ``mini_heads``, MiniJoint with ``[4]``)."""
    return RobertaMLM(sizes.config(layers, mini_heads)).train()


def bridge_model(sizes: Sizes) -> RobertaMLM:
    """Step 1b: MiniPost's 6-layer mini-model, only the 2 inserted layers train."""
    primary = RobertaMLM(sizes.config(BODY_LAYERS))
    return build_minipost(primary, MINI_DEPTH, BRIDGE_LAYERS).train()


ADAPT_BODIES = {BODY_LAYERS: f"{BODY_LAYERS}-layer body", MINI_DEPTH: f"MiniJoint {MINI_DEPTH}-layer",
                MINI_DEPTH + BRIDGE_LAYERS: f"MiniPost {MINI_DEPTH + BRIDGE_LAYERS}-layer"}


def adaptation_model(sizes: Sizes, layers: int) -> RobertaMLM:
    """Step 2's body, built as ``stages.adapt.adaptation_body`` builds it: 12 = the primary model, 4 = MiniJoint's
    mini-model (``extract_mini`` of a 12-layer model with a head after layer 4), 6 = MiniPost's mini-model
    (``build_minipost(depth=4, bridge_layers=2)``); frozen but for the token embeddings (tied to the output
    projection) and the output bias (``adaptation_trainable``)."""
    if layers == MINI_DEPTH:
        model = extract_mini(RobertaMLM(sizes.config(BODY_LAYERS, [MINI_DEPTH])), MINI_DEPTH)
    elif layers == MINI_DEPTH + BRIDGE_LAYERS:
        model = build_minipost(RobertaMLM(sizes.config(BODY_LAYERS)), MINI_DEPTH, BRIDGE_LAYERS)
    else:
        model = RobertaMLM(sizes.config(layers))
    freeze_all_but(model, adaptation_trainable)
    return model.train()


def compile_layers(model: RobertaMLM) -> None:
    """What ``trainer.compile: true`` does in every training stage (the runner calls the same function)."""
    device_compile_layers(model)


def make_batch(sizes: Sizes, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random non-special tokens after <s>, exactly round(p x seq_len) masked positions per sequence (so the
    analytic counts, which assume p x s masked tokens, hold exactly), no padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(N_SPECIAL, sizes.vocab, (sizes.batch, sizes.seq_len), generator=g)
    ids[:, 0] = BOS
    n = max(1, round(sizes.mask_prob * sizes.seq_len))
    pos = torch.stack([1 + torch.randperm(sizes.seq_len - 1, generator=g)[:n] for _ in range(sizes.batch)])
    labels = torch.full_like(ids, IGNORE_INDEX)
    rows = torch.arange(sizes.batch)[:, None]
    labels[rows, pos] = ids[rows, pos]
    ids[rows, pos] = MASK
    return {"input_ids": ids.to(device), "labels": labels.to(device)}


class TrainStep:
    """One optimiser update as the stages run it: mean MLM loss of the model's heads (masked positions only,
    ``mlm_losses``), backward, gradient clipping at 1.0 and the finite check (``UpdateGuard``, as the stages),
    AdamW (``build_optimizer``: fused on GPU), lr schedule.

    ``fused`` other than None replaces ``build_optimizer``'s choice (same hyper-parameters)."""

    def __init__(self, model: RobertaMLM, batch: dict[str, torch.Tensor], device: torch.device,
                 heads: Sequence[str] | None = None, fused: bool | None = None, grad_clip: float = 1.0) -> None:
        self.model, self.batch, self.device, self.heads, self.grad_clip = model, batch, device, heads, grad_clip
        cfg = OptimConfig(warmup_updates=1_000_000, updates=2_000_000)  # stay in warm-up: lr never reaches 0
        self.params = [p for p in model.parameters() if p.requires_grad]
        if fused is None:
            self.opt, self.sched = build_optimizer(self.params, cfg)
        else:
            self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,  # type: ignore[arg-type]
                                         weight_decay=cfg.weight_decay, fused=fused)
            self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0)
        self.autocast = lambda: autocast(device)
        self.guard = UpdateGuard(grad_clip)

    @property
    def trainable(self) -> int:
        return sum(p.numel() for p in self.params)

    def __call__(self) -> torch.Tensor:
        with self.autocast():
            losses = self.model.mlm_losses(self.batch["input_ids"], self.batch["labels"], self.heads)
        return apply_update(torch.stack(list(losses.values())).mean(), self.guard, self.opt, self.sched)


def apply_update(loss: torch.Tensor, guard: UpdateGuard, opt: torch.optim.Optimizer, sched: Any) -> torch.Tensor:
    """The rest of an update as the stages make it: backward, the guard (clipping, finite check), the optimiser's
    step, the schedule's, gradients set to None; returns the loss, detached."""
    loss.backward()
    guard(opt, None, 0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


# --------------------------------------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_times(fns: dict[str, Callable[[], object]], device: torch.device, warmup: int, windows: int,
                      iters: int) -> dict[str, list[float]]:
    """Seconds per call of each function, one figure per timed window of ``iters`` calls.

    Every round times one window of each function, the order rotating from round to round, so that slow
    drift (clock, thermal, other load) reaches every function alike."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    for w in range(windows):
        k = w % len(names)
        for name in names[k:] + names[:k]:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                fns[name]()
            sync(device)
            times[name].append((time.perf_counter() - t0) / iters)
    return times


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def spread(xs: Sequence[float]) -> float:
    """(max - min) / median of the windows: how steady the measurement was."""
    return (max(xs) - min(xs)) / statistics.median(xs)


def matmul_peak(device: torch.device, quick: bool) -> dict[str, Any]:
    """The machine's practical peak: best FLOP/s of large square matrix products (CPU fp32 ``torch.mm``
    at the current thread count, GPU bf16 8192), best of several."""
    if device.type == "cuda":
        dtype, sizes, reps = torch.bfloat16, ([2048] if quick else [8192]), 10
    else:
        dtype, sizes, reps = torch.float32, ([512] if quick else [2048, 3072, 4096]), (2 if quick else 4)
    best: dict[str, Any] = {"flops_per_s": 0.0}
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        torch.mm(a, b, out=out)
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            sync(device)
            rate = 2 * n**3 / (time.perf_counter() - t0)
            if rate > best["flops_per_s"]:
                best = {"flops_per_s": rate, "n": n, "dtype": str(dtype).removeprefix("torch."),
                        "threads": torch.get_num_threads()}
    return best


# --------------------------------------------------------------------------------------------- profiling


MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}


def top_ops(fn: Callable[[], object], device: torch.device, steps: int = 3, k: int = 15) -> dict[str, Any]:
    """The ``k`` operators with the most self time over ``steps`` calls of ``fn`` (after one unprofiled call),
    and the shares of matrix products, dropout's random numbers (``bernoulli_``) and everything else."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        sync(device)
    events = prof.key_averages()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in events) or 1.0
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:k]
    matmul = sum(getattr(e, key) for e in events if e.key in MATMUL_OPS) / total
    dropout = sum(getattr(e, key) for e in events if e.key == "aten::bernoulli_") / total
    return {"total_ms_per_step": total / 1e3 / steps,
            "groups": {"matrix products": matmul, "dropout RNG (bernoulli_)": dropout, "other": 1 - matmul - dropout},
            "rows": [{"op": e.key, "self_ms_per_step": getattr(e, key) / 1e3 / steps, "share": getattr(e, key) / total,
                      "calls_per_step": e.count / steps} for e in rows]}


def print_top_ops(prof: dict[str, Any]) -> None:
    print(f"  {'operator':<48} {'self ms/step':>12} {'share':>7} {'calls/step':>10}")
    for r in prof["rows"]:
        print(f"  {r['op'][:48]:<48} {r['self_ms_per_step']:>12.1f} {100 * r['share']:>6.1f}% {r['calls_per_step']:>10.0f}")
    print(f"  profiled self time {prof['total_ms_per_step']:.0f} ms/step: "
          + ", ".join(f"{name} {100 * v:.1f}%" for name, v in prof["groups"].items()))


@contextlib.contextmanager
def timer() -> Iterator[list[float]]:
    """``with timer() as t: ...`` then ``t[0]`` holds the seconds taken."""
    out: list[float] = []
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - t0)

