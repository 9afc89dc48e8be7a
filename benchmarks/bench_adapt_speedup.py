"""Step 2 (embedding adaptation) throughput over the 12-layer body, MiniJoint's 4-layer mini-model and
MiniPost's 6-layer mini-model, measured side by side, against the analytic speedup of appendix A.3.

One update = forward + backward + AdamW step with dropout on, only the token embeddings (tied to the
output projection) and the output bias training, the MLM loss at the masked positions only.
The three are interleaved (warm-up, then timed windows in rotating order) and the median window counts.

    .venv/bin/python benchmarks/bench_adapt_speedup.py [--quick] [--device cpu|cuda]
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any

import common

from minimodel.flops import adapt_flops

TARGET = 0.9  # measured speedup >= 0.9 x analytic


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=0, help="timed windows per body (default 9, quick 3)")
    p.add_argument("--iters", type=int, default=0, help="updates per window (default 2, quick 2)")
    p.add_argument("--compile", action="store_true", help="torch.compile the transformer layers")
    args = p.parse_args(argv)
    device = common.setup(args)
    sizes = common.default_sizes(device, args.quick)
    windows = args.windows or (3 if args.quick else 9)
    iters = args.iters or 2
    warmup = 1 if args.quick else 2

    common.rule("bench_adapt_speedup: step-2 update, 12-layer body vs mini-models")
    info = common.machine_info(device)
    print(f"device {device.type} ({info.get('gpu', info['cpu'])}), torch {info['torch']}, {info['threads']} threads"
          f"{', bf16 autocast' if device.type == 'cuda' else ', fp32'}{', compiled layers' if args.compile else ''}")
    print(f"sizes: {sizes.describe()} ({sizes.tokens} tokens per update)")
    print(f"timing: {warmup} warm-up rounds, then {windows} interleaved windows of {iters} updates; median window")

    steps: dict[str, common.TrainStep] = {}
    batch = common.make_batch(sizes, device)
    for layers, name in common.ADAPT_BODIES.items():
        model = common.adaptation_model(sizes, layers).to(device)
        if args.compile:
            common.compile_layers(model)
        steps[name] = common.TrainStep(model, batch, device)
    times = common.interleaved_times(steps, device, warmup, windows, iters)  # type: ignore[arg-type]

    base_name = common.ADAPT_BODIES[common.BODY_LAYERS]
    base_t = common.median(times[base_name])
    rows = []
    for layers, name in common.ADAPT_BODIES.items():
        t = common.median(times[name])
        analytic = (adapt_flops(common.BODY_LAYERS, sizes.hidden, sizes.seq_len, sizes.vocab, sizes.mask_prob, 1, 1)
                    / adapt_flops(layers, sizes.hidden, sizes.seq_len, sizes.vocab, sizes.mask_prob, 1, 1))
        measured = base_t / t
        rows.append({"name": name, "layers": layers, "trainable": steps[name].trainable, "s_per_update": t,
                     "tokens_per_s": sizes.tokens / t, "spread": common.spread(times[name]),
                     "speedup": measured, "analytic": analytic, "ratio": measured / analytic})

    print(f"\n{'body':<20} {'trainable':>10} {'s/update':>9} {'tokens/s':>10} {'spread':>7} "
          f"{'speedup':>8} {'analytic':>9} {'meas/anal':>9}")
    for r in rows:
        print(f"{r['name']:<20} {r['trainable']:>10,} {r['s_per_update']:>9.4f} {r['tokens_per_s']:>10,.0f} "
              f"{100 * r['spread']:>6.1f}% {r['speedup']:>7.2f}x {r['analytic']:>8.2f}x {r['ratio']:>9.3f}")
    minis = [r for r in rows if r["layers"] != common.BODY_LAYERS]
    met = all(r["ratio"] >= TARGET for r in minis)
    print(f"\ntarget: measured speedup >= {TARGET} x analytic for the mini-models: "
          f"{'MET' if met else 'MISSED'} (" + ", ".join(f"{r['layers']} layers {r['ratio']:.3f}" for r in minis) + ")")
    print("(spread = (max - min) / median of the timed windows; analytic = adapt_flops(12)/adapt_flops(L), A3)")
    figures = {"sizes": asdict(sizes), "compile": args.compile, "windows": windows, "iters": iters, "rows": rows,
               "target": TARGET, "target_met": met, "machine": info}
    common.write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
