"""Achieved FLOP/s of a pretraining update and an adaptation update as a share of the machine's peak,
both measured in the same run.

Peak: the best FLOP/s of large square matrix products (CPU: fp32 ``torch.mm`` at the training's thread
count; GPU: bf16, 8192), taken before and after the training measurements (the higher one counts).
Work: the paper's analytic counts, ``pretrain_flops(12, h, s, V, p, B, 1)`` (A1, every parameter trains)
and ``adapt_flops(12, ...)`` (A3, embeddings + output bias train), divided by the median update time.
Below the target, ``torch.profiler`` shows where the time goes (top operators by self time).

    .venv/bin/python benchmarks/bench_efficiency.py [--quick] [--device cpu|cuda] [--compile] [--fused] [--profile]
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any

import common

from minimodel.flops import adapt_flops, pretrain_flops

TARGET = {"cpu": 0.60, "cuda": 0.50}  # CPU: mid-size width; GPU: roberta-base on an H100, bf16


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="torch.compile the transformer layers")
    p.add_argument("--fused", action="store_true", help="fused AdamW on CPU too (GPU: fused by default)")
    p.add_argument("--profile", action="store_true", help="print the profiler's top operators even when on target")
    p.add_argument("--widths", type=int, nargs="*", default=None,
                   help="widths to measure (default CPU: 512 256, GPU: 768; the first is the target's)")
    args = p.parse_args(argv)
    device = common.setup(args)
    base = common.default_sizes(device, args.quick)
    widths = args.widths or ([base.hidden] if args.quick or device.type == "cuda" else [base.hidden, 256])
    windows, warmup = (2, 1) if args.quick else (7, 2)
    fused = True if args.fused else None

    common.rule("bench_efficiency: achieved FLOP/s of training updates vs the matmul peak")
    info = common.machine_info(device)
    print(f"device {device.type} ({info.get('gpu', info['cpu'])}), torch {info['torch']}, {info['threads']} threads"
          f"{', bf16 autocast' if device.type == 'cuda' else ', fp32'}{', compiled layers' if args.compile else ''}"
          f", AdamW {'fused' if fused or device.type == 'cuda' else 'foreach (as build_optimizer on CPU)'}")
    peak_before = common.matmul_peak(device, args.quick)
    print(f"peak (before): {peak_before['flops_per_s'] / 1e9:,.1f} GFLOP/s ({peak_before['dtype']} mm, "
          f"n={peak_before['n']}, {peak_before['threads']} threads)")

    rows: list[dict[str, Any]] = []
    steps: dict[int, dict[str, common.TrainStep]] = {}
    for h in widths:
        sizes = base.with_width(h) if h != base.hidden else base
        batch = common.make_batch(sizes, device)
        pre = common.pretrain_model(sizes).to(device)
        ada = common.adaptation_model(sizes, common.BODY_LAYERS).to(device)
        if args.compile:
            common.compile_layers(pre)
            common.compile_layers(ada)
        steps[h] = {"pretrain": common.TrainStep(pre, batch, device, fused=fused),
                    "adapt": common.TrainStep(ada, batch, device, fused=fused)}
        times = common.interleaved_times(steps[h], device, warmup, windows, 1)  # type: ignore[arg-type]
        flops = {"pretrain": pretrain_flops(common.BODY_LAYERS, h, sizes.seq_len, sizes.vocab, sizes.mask_prob,
                                            sizes.batch, 1),
                 "adapt": adapt_flops(common.BODY_LAYERS, h, sizes.seq_len, sizes.vocab, sizes.mask_prob,
                                      sizes.batch, 1)}
        for kind, ts in times.items():
            t = common.median(ts)
            rows.append({"kind": kind, "hidden": h, "sizes": asdict(sizes), "flops": flops[kind], "s_per_update": t,
                         "tokens_per_s": sizes.tokens / t, "flops_per_s": flops[kind] / t,
                         "spread": common.spread(ts)})
    peak_after = common.matmul_peak(device, args.quick)
    peak = max(peak_before["flops_per_s"], peak_after["flops_per_s"])
    print(f"peak (after):  {peak_after['flops_per_s'] / 1e9:,.1f} GFLOP/s; using {peak / 1e9:,.1f} GFLOP/s")

    print(f"\n12 layers, seq={base.seq_len}, batch={base.batch}, vocab={base.vocab}, mask_prob={base.mask_prob}")
    print(f"{'update':<9} {'h':>5} {'GFLOP':>8} {'s/update':>9} {'tokens/s':>9} {'GFLOP/s':>9} {'% peak':>7} {'spread':>7}")
    for r in rows:
        r["share_of_peak"] = r["flops_per_s"] / peak
        print(f"{r['kind']:<9} {r['hidden']:>5} {r['flops'] / 1e9:>8.1f} {r['s_per_update']:>9.4f} "
              f"{r['tokens_per_s']:>9,.0f} {r['flops_per_s'] / 1e9:>9.1f} {100 * r['share_of_peak']:>6.1f}% "
              f"{100 * r['spread']:>6.1f}%")
    target = TARGET[device.type]
    mid = [r for r in rows if r["hidden"] == widths[0]]
    met = {r["kind"]: r["share_of_peak"] >= target for r in mid}
    where = "mid-size width" if device.type == "cpu" else "roberta-base, bf16"
    for r in mid:
        print(f"target: {r['kind']} at h={r['hidden']} ({where}) >= {100 * target:.0f}% of peak: "
              f"{'MET' if met[r['kind']] else 'MISSED'} ({100 * r['share_of_peak']:.1f}%)")
    print("(FLOPs: the analytic A1/A3 counts; attention backward's extra 4hs^2 per layer and the elementwise work "
          "are not counted)")

    profiles: dict[str, dict[str, Any]] = {}
    if args.profile or not all(met.values()):
        for kind, step in steps[widths[0]].items():
            profiles[kind] = common.top_ops(step, device, steps=2 if args.quick else 3)
            print(f"\nwhere the time goes: {kind} update at h={widths[0]} (top operators by self time)")
            common.print_top_ops(profiles[kind])
    figures = {"widths": widths, "rows": rows, "peak_before": peak_before, "peak_after": peak_after,
               "peak_flops_per_s": peak, "target": target, "target_met": met, "compile": args.compile,
               "fused": bool(fused) or device.type == "cuda", "profiles": profiles, "machine": info}
    common.write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
