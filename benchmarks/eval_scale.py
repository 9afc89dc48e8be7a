"""Step 4 at the paper's scale: how many evaluations, their compute, and how long they take.

    python benchmarks/eval_scale.py [--repeats 3]

1. Counts the evaluations of the paper's experiments (experiments/{bl_base,bl_small,minijoint,minipost}.yaml):
   per system, task, evaluation language (the task's test languages among the 14 targets), finetuning seed and
   adaptation checkpoint (0, ckpt_steps, every ckpt_every, the last).
2. Prices one evaluation in forward FLOPs: examples of the test set x layers x ``layer_flops`` at the task's
   ``max_len`` (an upper bound: batches are padded to their longest sequence only) + the classifier.
3. Measures this machine: the forward pass of `downstream.predict` over random sequences for two model sizes
   (the study's, and a wider one), giving FLOP/s; divides the paper-scale FLOPs by it (CPU) and by the paper's
   V100 throughput (30 TFLOP/s, the constant of its V100-days), which is optimistic for inference in fp16 but
   the same yardstick as every other step's V100-days.
4. Prints the other steps' V100-days at the paper's scale (A1, A3, A4: `minimodel flops`) beside step 4.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from minimodel.config.schema import ModelConfig
from minimodel.data.downstream import predict
from minimodel.data.tasks import TaskData
from minimodel.experiment import load_experiment
from minimodel.flops import V100_FLOPS_PER_SECOND, layer_flops
from minimodel.models.model import ClassificationHead, RobertaMLM
from minimodel.report.costs import cost_rows
from minimodel.systems import stage_plan

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("bl_base", "bl_small", "minijoint", "minipost")
# test examples per language (the public test sets; MLQA's differ by language, QA counts question-context pairs)
TEST_SIZE = {"xnli": {"*": 5010}, "pawsx": {"*": 2000}, "xquad": {"*": 1190},
             "mlqa": {"ar": 5335, "de": 4517, "es": 5253, "hi": 4918, "vi": 5495, "zh": 5137, "en": 11590}}


def checkpoints(updates: int, every: int, extra: list[int]) -> int:
    return len({0, updates, *range(every, updates + 1, every), *(s for s in extra if s < updates)})


def evaluation_flops(layers: int, hidden: int, seq: int, examples: int, labels: int = 3) -> float:
    return examples * (layers * layer_flops(hidden, seq) + 2 * hidden * hidden + 2 * hidden * labels)


def measure(hidden: int, layers: int, seq: int, n: int, repeats: int) -> float:
    """FLOP/s of our forward pass (body + classifier, eval mode) on this machine."""
    cfg = ModelConfig(vocab_size=2000, hidden=hidden, layers=layers, heads=max(2, hidden // 64), ffn=4 * hidden,
                      max_positions=seq + 2)
    body, head = RobertaMLM(cfg), ClassificationHead(hidden, 3, 0.1)
    gen = torch.Generator().manual_seed(0)
    features = [{"input_ids": torch.randint(5, 2000, (seq,), generator=gen).tolist(), "label": 0} for _ in range(n)]
    predict(body, head, features[:32], 32, torch.device("cpu"))  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        predict(body, head, features, 32, torch.device("cpu"))
        best = min(best, time.perf_counter() - t)
    return evaluation_flops(layers, hidden, seq, n) / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    print("## This machine: forward passes of step 4 (batch 32, best of", args.repeats, "runs)\n")
    print("| model | sequences x tokens | GFLOP/s |\n|---|---|---:|")
    rates = []
    for hidden, layers, seq, n in ((64, 6, 64, 512), (256, 4, 128, 256)):
        rate = measure(hidden, layers, seq, n, args.repeats)
        rates.append(rate)
        print(f"| {layers} layers x {hidden} | {n} x {seq} | {rate / 1e9:.1f} |")
    cpu = max(rates)  # the larger model uses the cores better: the rate that would hold at RoBERTa-base size
    print(f"\nCPU rate used below: {cpu / 1e9:.1f} GFLOP/s; V100: {V100_FLOPS_PER_SECOND / 1e12:.0f} TFLOP/s\n")

    print("## Step 4 at the paper's scale\n")
    print("| system | evaluations | per task: langs x seeds x checkpoints | EFLOPs | V100-hours | CPU-days here |")
    print("|---|---:|---|---:|---:|---:|")
    totals = [0, 0.0]
    per_lang_hours: dict[str, float] = {}
    for system in SYSTEMS:
        cfg = load_experiment(ROOT / "experiments" / f"{system}.yaml")
        m, t = cfg.model, cfg.adapt.trainer
        ckpts = checkpoints(cfg.adapt.optim.updates, t.ckpt_every, list(t.ckpt_steps))
        n_eval, flops, parts = 0, 0.0, []
        for task in cfg.finetune.tasks:
            tc = cfg.tasks[task]
            langs = TaskData(task, tc).languages(cfg.target_langs)
            seq = tc.max_len if task in ("xnli", "pawsx") else 384
            count = len(langs) * len(cfg.finetune.seeds) * ckpts
            n_eval += count
            parts.append(f"{task} {len(langs)} x {len(cfg.finetune.seeds)} x {ckpts}")
            for lang in langs:
                size = TEST_SIZE[task].get(lang, TEST_SIZE[task].get("*", 0))
                f = len(cfg.finetune.seeds) * ckpts * evaluation_flops(m.layers, m.hidden, seq, size)
                flops += f
                per_lang_hours[f"{system}/{lang}"] = per_lang_hours.get(f"{system}/{lang}", 0.0) + f / V100_FLOPS_PER_SECOND / 3600
        totals[0] += n_eval
        totals[1] += flops
        print(f"| {system} | {n_eval:,} | {'; '.join(parts)} | {flops / 1e18:.2f} | "
              f"{flops / V100_FLOPS_PER_SECOND / 3600:,.1f} | {flops / cpu / 86400:,.0f} |")
    print(f"| all | {totals[0]:,} | | {totals[1] / 1e18:.2f} | {totals[1] / V100_FLOPS_PER_SECOND / 3600:,.1f} | "
          f"{totals[1] / cpu / 86400:,.0f} |")
    worst = max(per_lang_hours, key=per_lang_hours.__getitem__)
    print(f"\nLongest per-language evaluation job: {worst}, {per_lang_hours[worst]:.1f} V100-hours "
          f"(the launchers give evaluation 24 h on one GPU)\n")

    print("## Every step at the paper's scale (V100-days, the paper's formulas)\n")
    print("| system | step | V100-days |\n|---|---|---:|")
    for system in SYSTEMS:
        cfg = load_experiment(ROOT / "experiments" / f"{system}.yaml")
        for row in cost_rows(cfg):
            print(f"| {system} | {row['step']} | {row['v100_days']:,.2f} |")
        print(f"| {system} | 2: depth of the adapted body | {stage_plan(cfg, 'adapt').depth} layers |")


if __name__ == "__main__":
    main()
