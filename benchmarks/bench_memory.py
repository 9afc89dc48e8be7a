"""Peak memory of one training update per stage, each stage in its own process.

Stages: pretraining (12 layers + MiniJoint's head after layer 4, every parameter trains), the MiniPost
bridge (6-layer mini-model, the 2 inserted layers train), adaptation over the 12-layer body, MiniJoint's
4-layer mini-model and MiniPost's 6-layer mini-model (embeddings + output bias train).

CPU: resident set size from ``getrusage(RUSAGE_SELF).ru_maxrss``. The baseline is the RSS after the
imports; the model (and its surgery) is built, the high-water mark is reset (``/proc/self/clear_refs``)
so that building does not count, then 1 + 3 updates run: "peak" is the high-water mark minus the baseline,
"weights" the RSS before the first update minus the baseline, "update" the difference of the two
(gradients, AdamW state, activations, allocator slack).
GPU: ``torch.cuda.max_memory_allocated`` over the same updates, ``memory_allocated`` before them.

    .venv/bin/python benchmarks/bench_memory.py [--quick] [--device cpu|cuda]
"""

from __future__ import annotations

import gc
import json
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import common
import torch

from minimodel.models.model import RobertaMLM

MB = 2**20
STAGES: dict[str, tuple[str, Callable[[common.Sizes], RobertaMLM]]] = {
    "pretrain": ("pretrain, 12 layers + MiniJoint head",
                 lambda s: common.pretrain_model(s, mini_heads=[common.MINI_DEPTH])),
    "bridge": ("bridge, MiniPost 6 layers (2 train)", common.bridge_model),
    "adapt12": ("adapt, 12-layer body", lambda s: common.adaptation_model(s, common.BODY_LAYERS)),
    "adapt4": ("adapt, MiniJoint 4-layer", lambda s: common.adaptation_model(s, common.MINI_DEPTH)),
    "adapt6": ("adapt, MiniPost 6-layer",
               lambda s: common.adaptation_model(s, common.MINI_DEPTH + common.BRIDGE_LAYERS)),
}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def reset_peak() -> bool:
    """Reset the RSS high-water mark (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(stage: str, sizes: common.Sizes, device: torch.device) -> dict[str, Any]:
    """One stage in this process: weights, peak and the update's share, in bytes."""
    base = rss_bytes() if device.type == "cpu" else torch.cuda.memory_allocated(device)
    model = STAGES[stage][1](sizes)
    gc.collect()
    model.to(device)
    step = common.TrainStep(model, common.make_batch(sizes, device), device)
    out: dict[str, Any] = {"stage": stage, "trainable": step.trainable, "parameters": model.num_parameters()}
    if device.type == "cpu":
        weights = rss_bytes()
        out["peak_reset"] = reset_peak()
        for _ in range(4):
            step()
        out.update(weights=weights - base, peak=maxrss_bytes() - base)
    else:
        torch.cuda.synchronize(device)
        weights = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(4):
            step()
        torch.cuda.synchronize(device)
        out.update(weights=weights - base, peak=torch.cuda.max_memory_allocated(device) - base)
    out["update"] = out["peak"] - out["weights"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--stage", choices=list(STAGES), default=None, help="measure one stage in this process")
    args = p.parse_args(argv)
    device = common.setup(args)
    sizes = common.default_sizes(device, args.quick)
    if args.stage:
        figures = measure(args.stage, sizes, device)
        common.write_json(args.json, figures)
        return figures

    common.rule("bench_memory: peak memory of one update per stage (one process each)")
    info = common.machine_info(device)
    what = "RSS (ru_maxrss) over the RSS after imports" if device.type == "cpu" else "torch.cuda.max_memory_allocated"
    print(f"device {device.type}, {what}; sizes: {sizes.describe()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_memory_") as tmp:
        for stage in STAGES:
            out = Path(tmp) / f"{stage}.json"
            cmd = [sys.executable, __file__, "--stage", stage, "--device", device.type, "--json", str(out)]
            cmd += ["--quick"] if args.quick else []
            cmd += ["--threads", str(args.threads)] if args.threads else []
            subprocess.run(cmd, check=True)
            rows.append(json.loads(out.read_text()))
    print(f"\n{'stage':<38} {'params':>11} {'trainable':>11} {'weights MB':>10} {'update MB':>10} {'peak MB':>9}")
    for r in rows:
        r["label"] = STAGES[r["stage"]][0]
        print(f"{r['label']:<38} {r['parameters']:>11,} {r['trainable']:>11,} {r['weights'] / MB:>10.0f} "
              f"{r['update'] / MB:>10.0f} {r['peak'] / MB:>9.0f}")
    if device.type == "cpu" and not all(r.get("peak_reset") for r in rows):
        print("note: the RSS high-water mark could not be reset; peaks include building the model")
    figures = {"sizes": asdict(sizes), "rows": rows, "measure": what, "machine": info}
    common.write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
