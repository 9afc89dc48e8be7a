"""Step 2 on a real model: one embedding-adaptation update over SmolLM2-135M in minimodel against the same update
written with plain transformers, side by side in one process, fp32 and bf16 autocast.

minimodel: ``hf_decoder.from_hf(GGUF)``, a new target-vocabulary embedding (random, ``--vocab`` x hidden) swapped in
and everything else frozen as step 2 does it (``swap_embeddings``, ``tie_biases``, ``freeze_all_but(
adaptation_trainable)``), loss ``lm_losses(ids, labels)["primary"]`` with labels the next tokens; over all the layers
and over MiniPost's mini-model (``build_minipost(model, --depth, --bridge, seed=0)``, then the same swap and freeze).
transformers: ``LlamaForCausalLM`` from the same GGUF, ``resize_token_embeddings`` to the same vocabulary holding the
same new matrix (the output projection tied to it), everything else ``requires_grad_(False)``, ``model(ids,
labels=ids).loss`` (transformers shifts the labels itself), and for the mini-model the model truncated to its first
``depth + bridge`` layers (the bridge layers' weights copied from minimodel's, so that both compute the same loss).
Both: the same batch, ``build_optimizer``'s AdamW and the stages' gradient clipping (``UpdateGuard``), the same
precision. Before timing, each pair's fp32 losses are compared (the same computation, or the comparison means
nothing).

Timing: warm-up, then ``--reps`` interleaved pairs of single updates (order alternating A B, B A, ...); the median
counts, the spread is (max - min) / median, and the ratio minimodel / transformers (tokens/s) is the median of the
per-pair ratios with their min and max. Peak: the best fp32 and bf16 ``torch.mm`` at n = 2048 (8 calls), before and
after (the higher counts); FLOPs: ``adapt_flops(layers, h, s, V, 1.0, B, 1, LayerShape.of(cfg))``.

    .venv/bin/python benchmarks/bench_real_adapt.py [--batch 8] [--seq-len 128] [--threads 1] [--reps 5]
    .venv/bin/python benchmarks/bench_real_adapt.py --tiny --json /tmp/tiny.json   # seconds-long smoke, no GGUF
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
import torch
from torch import nn

from minimodel.config.schema import OptimConfig
from minimodel.flops import LayerShape, adapt_flops
from minimodel.models.hf_decoder import from_hf, our_state_dict_to_hf
from minimodel.models.model import IGNORE_INDEX
from minimodel.models.surgery import adaptation_trainable, build_minipost, freeze_all_but, swap_embeddings, tie_biases
from minimodel.training.optim import UpdateGuard, build_optimizer

TARGET = 1.0  # minimodel tokens/s >= transformers' at the same precision
SYSTEMS = ("minimodel", "transformers")
PRECISIONS = ("fp32", "bf16")
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "rope_theta": 10_000.0,
        "tie_word_embeddings": True, "pad_token_id": 2, "bos_token_id": 1, "eos_token_id": 2}


# --------------------------------------------------------------------------------------------- models


def smollm2_gguf() -> Path:
    """The cached SmolLM2-135M GGUF (``scripts/get_smollm2.sh`` prints its path, fetching it first if need be)."""
    res = subprocess.run(["bash", str(common.ROOT / "scripts" / "get_smollm2.sh")], cwd=common.ROOT,
                         capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"scripts/get_smollm2.sh failed: {res.stderr.strip()}")
    return common.ROOT / res.stdout.strip().splitlines()[-1]


def load_pair(tiny: bool, gguf: Path | None) -> tuple[Any, Any]:
    """(minimodel's ``DecoderLM``, transformers' ``LlamaForCausalLM``), both fp32 from the same weights: the GGUF,
    or (tiny) a random GQA Llama saved with ``save_pretrained`` and read back by both."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if tiny:
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as tmp:
            LlamaForCausalLM(LlamaConfig(**TINY)).save_pretrained(tmp)
            return from_hf(tmp), AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    assert gguf is not None
    mm = from_hf(gguf)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return mm, hf


def minimodel_step2(model: Any, weight: torch.Tensor) -> Any:
    """Step 2's body as ``stages.adapt.run_adapt`` builds it: the new embeddings swapped in, output biases tied,
    everything but ``adaptation_trainable`` frozen."""
    swap_embeddings(model, weight)
    tie_biases(model)
    freeze_all_but(model, adaptation_trainable)
    return model.train()


def truncate(hf: Any, layers: int) -> Any:
    """A copy of a transformers causal LM keeping its first ``layers`` decoder layers."""
    out = copy.deepcopy(hf)
    out.model.layers = out.model.layers[:layers]
    out.config.num_hidden_layers = layers
    if getattr(out.config, "layer_types", None):
        out.config.layer_types = out.config.layer_types[:layers]
    return out


def transformers_step2(hf: Any, weight: torch.Tensor) -> Any:
    """The same update as a transformers user writes it: the vocabulary resized to the new one and set to ``weight``
    (the output projection stays tied to it), the embeddings trainable, the body frozen."""
    hf.resize_token_embeddings(weight.shape[0], mean_resizing=False)
    with torch.no_grad():
        hf.get_input_embeddings().weight.copy_(weight)
    if hf.get_output_embeddings().weight is not hf.get_input_embeddings().weight:
        raise RuntimeError("transformers' output projection is not tied to the input embeddings")
    hf.requires_grad_(False)
    hf.get_input_embeddings().weight.requires_grad_(True)
    hf.config.use_cache = False
    return hf.train()


def bodies(mm: Any, hf: Any, weight: torch.Tensor, depth: int, bridge: int) -> dict[str, tuple[Any, Any]]:
    """{body name: (minimodel model, transformers model)}: all the layers, and MiniPost's mini-model."""
    layers = mm.cfg.layers
    mini_mm = minimodel_step2(build_minipost(mm, depth, bridge, seed=0), weight)
    mini_hf = transformers_step2(truncate(hf, depth + bridge), weight)
    sd = our_state_dict_to_hf(mini_mm)  # the bridge layers are new: give transformers the same weights
    missing, unexpected = mini_hf.load_state_dict(sd, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"mini-model weights do not map: missing {missing}, unexpected {unexpected}")
    full = (minimodel_step2(mm, weight), transformers_step2(hf, weight))
    return {f"all {layers} layers": full, f"MiniPost {depth}+{bridge} layers": (mini_mm, mini_hf)}


# --------------------------------------------------------------------------------------------- updates


class Update:
    """One step-2 update: loss under the precision's autocast, backward, the stages' clipping and finite check,
    AdamW (``build_optimizer``: foreach on CPU) and its schedule (kept in warm-up), gradients set to None."""

    def __init__(self, model: nn.Module, loss: Callable[[], torch.Tensor], precision: str, device: torch.device):
        self.model, self.loss_fn = model, loss
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt, self.sched = build_optimizer(self.params, OptimConfig(warmup_updates=1_000_000, updates=2_000_000))
        self.guard = UpdateGuard(1.0)
        self.cast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16" \
            else contextlib.nullcontext

    def loss(self) -> torch.Tensor:
        with self.cast():
            return self.loss_fn()

    def __call__(self) -> torch.Tensor:
        return common.apply_update(self.loss(), self.guard, self.opt, self.sched)


def losses(mm: Any, hf: Any, ids: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """Mean next-token cross-entropy over the same positions: minimodel with labels shifted left (-100 last),
    transformers with ``labels=ids`` (it shifts them itself)."""
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, :-1] = ids[:, 1:]
    return {"minimodel": lambda: mm.lm_losses(ids, labels)["primary"],
            "transformers": lambda: hf(input_ids=ids, labels=ids, use_cache=False).loss}


def split_times(updates: dict[str, Update], reps: int) -> dict[str, dict[str, float]]:
    """Median seconds of the forward (loss), the backward and the optimiser (clip + AdamW) of each update, the
    updates interleaved (order alternating from rep to rep) as the timing is."""
    parts = {name: {"forward": [], "backward": [], "optimizer": []} for name in updates}
    names = list(updates)
    for r in range(reps):
        for name in names if r % 2 == 0 else names[::-1]:
            u, times = updates[name], parts[name]
            t0 = time.perf_counter()
            loss = u.loss()
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            u.guard(u.opt, None, 0)
            u.opt.step()
            u.opt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            for k, t in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                times[k].append(t)
    return {name: {k: common.median(v) for k, v in p.items()} for name, p in parts.items()}


# --------------------------------------------------------------------------------------------- peak, load


def matmul_peak(dtype: torch.dtype, n: int, reps: int) -> dict[str, Any]:
    """Best FLOP/s of an n^3 ``torch.mm`` in ``dtype`` at the current thread count (after one untimed call)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.mm(a, b, out=out)
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return {"flops_per_s": best, "n": n, "dtype": str(dtype).removeprefix("torch."), "reps": reps,
            "threads": torch.get_num_threads()}


def peaks(n: int, reps: int) -> dict[str, dict[str, Any]]:
    return {"fp32": matmul_peak(torch.float32, n, reps), "bf16": matmul_peak(torch.bfloat16, n, reps)}


def load() -> dict[str, Any]:
    """The machine's load now: ``uptime``'s line and the 1/5/15-minute load averages."""
    try:
        line = subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        line = ""
    return {"uptime": line, "loadavg": list(os.getloadavg()), "at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


# --------------------------------------------------------------------------------------------- main


def arguments(argv: list[str] | None) -> Any:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a tiny random GQA Llama instead of SmolLM2 (no GGUF; smoke)")
    p.add_argument("--gguf", type=Path, default=None, help="default: what scripts/get_smollm2.sh prints")
    p.add_argument("--batch", type=int, default=0, help="sequences per update (default 8, tiny 2)")
    p.add_argument("--seq-len", type=int, default=0, help="tokens per sequence (default 128, tiny 32)")
    p.add_argument("--vocab", type=int, default=0, help="the new target vocabulary (default 4000, tiny 300)")
    p.add_argument("--depth", type=int, default=0, help="MiniPost's bottom layers (default 10 = 30/3, tiny 2)")
    p.add_argument("--bridge", type=int, default=2, help="MiniPost's new layers")
    p.add_argument("--reps", type=int, default=0, help="timed pairs per body and precision (default 5, tiny 2)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--peak-n", type=int, default=0, help="matmul size for the peak (default 2048, tiny 256)")
    p.add_argument("--profile", action="store_true", help="forward/backward/optimiser split and top operators "
                   "everywhere (default: where minimodel misses the target; never in --tiny)")
    args = p.parse_args(argv)
    args.tiny = args.tiny or args.quick
    small = args.tiny
    args.batch = args.batch or (2 if small else 8)
    args.seq_len = args.seq_len or (32 if small else 128)
    args.vocab = args.vocab or (300 if small else 4000)
    args.depth = args.depth or (2 if small else 10)
    args.reps = args.reps or (2 if small else 5)
    args.peak_n = args.peak_n or (256 if small else 2048)
    if args.json is None and not small:
        host = common.machine_info(torch.device("cpu"))["hostname"]
        args.json = common.ROOT / "benchmarks" / "results" / f"real-adapt-{host}.json"
    return args


def measure(args: Any, pairs: dict[str, tuple[Any, Any]], ids: torch.Tensor, device: torch.device
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, dict[str, Update]]]:
    rows, ratios, kept = [], [], {}
    for precision in args.precisions:
        for body, (mm, hf) in pairs.items():
            fns = losses(mm, hf, ids)
            updates = {s: Update(m, fns[s], precision, device) for s, m in zip(SYSTEMS, (mm, hf))}
            times = common.interleaved_times(updates, device, args.warmup, args.reps, 1)  # type: ignore[arg-type]
            kept[f"{body}, {precision}"] = updates
            tokens = args.batch * args.seq_len
            flops = adapt_flops(mm.cfg.layers, mm.cfg.hidden, args.seq_len, mm.cfg.vocab_size, 1.0, args.batch, 1,
                                LayerShape.of(mm.cfg))
            for s in SYSTEMS:
                t = common.median(times[s])
                rows.append({"body": body, "layers": mm.cfg.layers, "precision": precision, "system": s,
                             "trainable": sum(p.numel() for p in updates[s].params), "s_per_update": t,
                             "tokens_per_s": tokens / t, "best_s": min(times[s]),
                             "spread": common.spread(times[s]), "times": times[s], "flops": flops,
                             "flops_per_s": flops / t})
            per_pair = [b / a for a, b in zip(times["minimodel"], times["transformers"])]
            ratio = common.median(per_pair)
            of_medians = common.median(times["transformers"]) / common.median(times["minimodel"])
            ratios.append({"body": body, "precision": precision, "ratio": ratio, "min": min(per_pair),
                           "max": max(per_pair), "per_pair": per_pair, "target_met": ratio >= TARGET,
                           "ratio_of_medians": of_medians,
                           "ratio_of_best": min(times["transformers"]) / min(times["minimodel"])})
            print(f"  {body}, {precision}: minimodel {tokens / common.median(times['minimodel']):,.0f} tokens/s, "
                  f"transformers {tokens / common.median(times['transformers']):,.0f} tokens/s", flush=True)
    return rows, ratios, kept


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = arguments(argv)
    device = common.setup(args)
    if device.type != "cpu":
        raise SystemExit("bench_real_adapt measures the CPU (bf16 autocast on CPU); run it with --device cpu")
    common.rule("bench_real_adapt: step 2 on " + ("a tiny random GQA Llama" if args.tiny else "SmolLM2-135M")
                + ", minimodel against transformers")
    info = common.machine_info(device)
    load_before = load()
    print(f"device cpu ({info['cpu']}), torch {info['torch']}, {info['threads']} threads; "
          f"load: {load_before['uptime']}")
    gguf = None if args.tiny else (args.gguf or smollm2_gguf())
    t0 = time.perf_counter()
    mm, hf = load_pair(args.tiny, gguf)
    print(f"loaded {'tiny config' if args.tiny else gguf} twice in {time.perf_counter() - t0:.0f} s: {mm.cfg.layers} "
          f"layers, h={mm.cfg.hidden}, {mm.cfg.heads} heads / {mm.cfg.key_value_heads} kv heads, ffn {mm.cfg.ffn}")
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, mm.cfg.hidden, generator=g) * 0.02
    ids = torch.randint(0, args.vocab, (args.batch, args.seq_len), generator=g)
    pairs = bodies(mm, hf, weight, args.depth, args.bridge)
    checks = {}
    for body, (m, h) in pairs.items():
        fns = losses(m, h, ids)
        with torch.no_grad():
            a, b = fns["minimodel"]().item(), fns["transformers"]().item()
        checks[body] = {"minimodel": a, "transformers": b, "abs_diff": abs(a - b)}
        if abs(a - b) > 1e-3:
            raise RuntimeError(f"{body}: the two updates compute different losses ({a:.6f} vs {b:.6f})")
    print("same loss (fp32): " + ", ".join(f"{k} |diff| {v['abs_diff']:.1e}" for k, v in checks.items()))
    print(f"sizes: batch {args.batch} x seq {args.seq_len} = {args.batch * args.seq_len} tokens, "
          f"new vocab {args.vocab}; "
          f"{args.warmup} warm-up round(s), then {args.reps} interleaved pairs of single updates")

    peak_reps = 2 if args.tiny else 8  # bf16 (AMX) rates vary 2x from call to call under load: take the best
    before = peaks(args.peak_n, peak_reps)
    rows, ratios, updates = measure(args, pairs, ids, device)
    after = peaks(args.peak_n, peak_reps)
    peak = {p: max(before[p]["flops_per_s"], after[p]["flops_per_s"]) for p in PRECISIONS}
    load_after = load()
    print(f"matmul peak (n={args.peak_n}, best of before/after): fp32 {peak['fp32'] / 1e9:,.1f} GFLOP/s, "
          f"bf16 {peak['bf16'] / 1e9:,.1f} GFLOP/s")

    print(f"\n{'body':<22} {'prec':<5} {'system':<13} {'s/update':>9} {'tokens/s':>9} {'spread':>7} {'GFLOP/s':>8} "
          f"{'% peak':>7}")
    for r in rows:
        r["share_of_peak"] = r["flops_per_s"] / peak[r["precision"]]
        print(f"{r['body']:<22} {r['precision']:<5} {r['system']:<13} {r['s_per_update']:>9.3f} "
              f"{r['tokens_per_s']:>9,.0f} {100 * r['spread']:>6.1f}% {r['flops_per_s'] / 1e9:>8.1f} "
              f"{100 * r['share_of_peak']:>6.1f}%")
    print(f"\n{'ratio minimodel / transformers (tokens/s)':<44} {'median':>7} {'min':>6} {'max':>6} {'best':>6}  "
          f"target >= {TARGET}")
    for r in ratios:
        print(f"{r['body'] + ', ' + r['precision']:<44} {r['ratio']:>7.3f} {r['min']:>6.3f} {r['max']:>6.3f} "
              f"{r['ratio_of_best']:>6.3f}  {'MET' if r['target_met'] else 'MISSED'}")
    print(f"load before: {load_before['uptime']}\nload after:  {load_after['uptime']}")
    print("(FLOPs: adapt_flops with p = 1, every position predicted; the ratio: median, min and max of the per-pair "
          "ratios; best: of the fastest update of each, the least disturbed by other load)")

    profiles: dict[str, Any] = {}
    for r in ratios:
        key = f"{r['body']}, {r['precision']}"
        if not (args.profile or (not r["target_met"] and not args.tiny)):
            continue
        profiles[key] = {}
        splits = split_times(updates[key], 2 if args.tiny else 4)
        for s, u in updates[key].items():
            ops = common.top_ops(u, device, steps=2, k=12)
            profiles[key][s] = {"split_s": splits[s], "top_ops": ops}
            print(f"\nwhere the time goes: {key}, {s}: " + ", ".join(f"{k} {v:.3f} s" for k, v in splits[s].items()))
            common.print_top_ops(ops)
    figures = {"model": "tiny random GQA Llama" if args.tiny else str(gguf), "tiny": args.tiny, "batch": args.batch,
               "seq_len": args.seq_len, "vocab": args.vocab, "depth": args.depth, "bridge": args.bridge,
               "warmup": args.warmup, "reps": args.reps, "precisions": args.precisions, "loss_check": checks,
               "rows": rows, "ratios": ratios, "target": TARGET,
               "target_met": all(r["target_met"] for r in ratios), "peak_before": before, "peak_after": after,
               "peak_flops_per_s": peak, "load_before": load_before, "load_after": load_after,
               "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "profiles": profiles, "machine": info}
    common.write_json(args.json, figures)
    if args.json:
        print(f"figures: {args.json}")
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
