"""The recipe for a real model, measured on SmolLM2-135M (issue 52, part 7), through the stages themselves
(``run_bridge``, ``run_adapt`` on ``experiments/recipe_smollm2.yaml``), not a copy of them.

    .venv/bin/python benchmarks/bench_recipe.py layers               # minimodel layers' table (N = 1..30), seconds
    .venv/bin/python benchmarks/bench_recipe.py step0                # every bridge.init's step-0 loss (N = 10, 12)
    .venv/bin/python benchmarks/bench_recipe.py bridge --runs affine:distill,affine:lm,random:lm [--updates 1000]
    .venv/bin/python benchmarks/bench_recipe.py embeddings --langs fr,ru [--updates 500]

Each part adds its figures under its own key of ``--json`` (default benchmarks/results/recipe-vm.json), keeping the
other parts' (each run is kept as it finishes, so a stopped benchmark loses only the run in progress). Needs the
GGUF (``bash scripts/get_smollm2.sh``) and the prepared data (``minimodel prepare experiments/recipe_smollm2.yaml
--langs en,fr,ru``). Runs go to ``--runs-dir`` (default runs/recipe_bench), one experiment name per setting, so a
rerun skips what is finished.

(a) **bridge**: the mini-model's English validation loss (64 blocks of 64 tokens, held out) at step 0 and every
250 updates of 16 x 64 tokens, per (bridge.init, bridge.objective), same data order and seed; beside SmolLM2's own
loss on the same blocks. (b) **embeddings**: target-language loss per character of SmolLM2 for each adapt.init (and
vocabulary) at step 0 and after step 2, over the full model and over the mini-model, against SmolLM2 with its own
tokenizer, on the text of the target's held-out blocks (decoded, so every tokenizer reads the same characters)."""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from minimodel.config.schema import ExperimentConfig  # noqa: E402
from minimodel.experiment import load_experiment  # noqa: E402

EXPERIMENT = ROOT / "experiments" / "recipe_smollm2.yaml"
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "recipe-vm.json"


def config(runs: Path, name: str, *overrides: str) -> ExperimentConfig:
    return load_experiment(EXPERIMENT, [f"name={name}", f"runs_dir={runs}", *overrides])


def update_json(path: Path, key: str, value: Any) -> None:
    figures = json.loads(path.read_text()) if path.exists() else {}
    figures[key] = value
    figures["machine"] = {"cpu": platform.processor() or _cpu(), "threads": torch.get_num_threads(),
                          "torch": torch.__version__, "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    tmp.replace(path)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


def val_losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")}


# ------------------------------------------------------------------------------------------------ (a) the bridge


def part_layers(args: argparse.Namespace) -> dict:
    from minimodel.stages.layers import layer_rows

    cfg = config(args.runs_dir, "recipe-layers", f"bridge.layers={args.bridge_layers}")
    start = time.perf_counter()
    rows, about = layer_rows(cfg)
    return {"about": about, "rows": rows, "seconds": time.perf_counter() - start}


def part_step0(args: argparse.Namespace) -> dict:
    from minimodel.data.mlm import mlm_datamodule
    from minimodel.data.prepare import load_source_tokenizer
    from minimodel.models.surgery import build_minipost
    from minimodel.stages.bridge import fit_bridge_map, load_primary, step0_losses

    out: dict[str, Any] = {}
    for depth in args.depths:
        cfg = config(args.runs_dir, "recipe-step0", f"bridge.depth={depth}", f"bridge.layers={args.bridge_layers}")
        primary, trained_with = load_primary(cfg.bridge.source, cfg.model.family)
        tok = load_source_tokenizer(cfg, primary, cfg.bridge.source, trained_with)
        data = mlm_datamodule(cfg, "en", cfg.bridge.optim, cfg.bridge.trainer.seed, tok)
        data.setup()
        for init in ("random", "copy", "affine"):
            start = time.perf_counter()
            fit = fit_bridge_map(cfg, primary, data) if init == "affine" else None
            mini = build_minipost(primary, depth, args.bridge_layers, seed=cfg.bridge.trainer.seed, init=init,
                                  affine=(fit.weight, fit.bias) if fit else None)
            losses = step0_losses(cfg, mini, primary, data)
            out[f"N{depth}/{init}"] = {**losses, "depth": depth, "init": init, "r2": fit.r2 if fit else None,
                                       "seconds": time.perf_counter() - start}
            print(f"N={depth} {init:7s} step-0 loss {losses['step0_loss']:.3f} (SmolLM2 {losses['source_loss']:.3f})",
                  flush=True)
    return out


def part_bridge(args: argparse.Namespace) -> None:
    from minimodel.stages.bridge import run_bridge

    for spec in args.runs:
        init, objective = spec.split(":")
        name = f"recipe-N{args.depth}-{init}-{objective}"
        cfg = config(args.runs_dir, name, f"bridge.init={init}", f"bridge.objective={objective}",
                     f"bridge.depth={args.depth}", f"bridge.layers={args.bridge_layers}",
                     f"bridge.optim.updates={args.updates}", *args.override)
        start = time.perf_counter()
        result = run_bridge(cfg, progress_bar=False)
        seconds = time.perf_counter() - start
        info = json.loads((result.run_dir / "bridge_info.json").read_text())
        losses = val_losses(result.run_dir)
        row = {"init": init, "objective": objective, "depth": args.depth, "bridge_layers": args.bridge_layers,
               "updates": args.updates, "tokens": args.updates * cfg.bridge.optim.global_batch * cfg.data.seq_len,
               "step0_loss": info["step0_loss"], "source_loss": info["source_loss"], "val_loss": losses,
               "final_gap": losses[max(losses)] - info["source_loss"] if losses else None,
               "affine_r2": info.get("affine", {}).get("r2"), "seconds_this_call": seconds,
               "outcome": result.outcome.value, "flops": result.done.get("flops")}
        key = f"N{args.depth}/{init}:{objective}"
        figures = json.loads(args.json.read_text()).get("bridge", {}) if args.json.exists() else {}
        figures[key] = row
        update_json(args.json, "bridge", figures)
        print(f"{key}: step 0 {info['step0_loss']:.3f}, " + ", ".join(f"{s}: {v:.3f}" for s, v in sorted(losses.items()))
              + f" (SmolLM2 {info['source_loss']:.3f}); {seconds:.0f} s", flush=True)


# ------------------------------------------------------------------------------------------- (b) the embeddings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=("layers", "step0", "bridge", "embeddings"))
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "recipe_bench")
    p.add_argument("--bridge-layers", type=int, default=2)
    p.add_argument("--depth", type=int, default=10)
    p.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[10, 12])
    p.add_argument("--runs", type=lambda s: s.split(","), default=["affine:distill", "affine:lm", "random:lm"])
    p.add_argument("--updates", type=int, default=1000)
    p.add_argument("--langs", type=lambda s: s.split(","), default=["fr", "ru"])
    p.add_argument("--override", action="append", default=[], help="a config override for every run (repeatable)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    if args.part == "layers":
        update_json(args.json, "layers", part_layers(args))
    elif args.part == "step0":
        update_json(args.json, "step0", part_step0(args))
    elif args.part == "bridge":
        part_bridge(args)
    else:
        raise SystemExit("the embeddings part is not written yet")
    print(f"figures in {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
