"""The encoder study's GPU-scale experiment (experiments/study_gpu.yaml, issue 46 part 3): the same study as
experiments/study.yaml (systems, data, languages, task, seeds, dev and report rules) at the paper's depths, wider and
deeper, on the GPU trainer, fitting one H100 and sized to a few minutes of it. Read from the configs; the systems' code
paths run end to end in tests/test_downstream.py."""

from __future__ import annotations

import functools

from minimodel.experiment import load_experiment
from minimodel.pipeline import variants
from minimodel.report.costs import cost_rows
from minimodel.systems import stage_plan
from tests.conftest import ROOT

GPU = ROOT / "experiments" / "study_gpu.yaml"
CPU = ROOT / "experiments" / "study.yaml"


@functools.cache
def by_label(path) -> dict:
    """The experiment's system runs by label (``pipeline.variants``), loaded once per file."""
    return {v.label: v.cfg for v in variants(path, [])}


def test_it_is_the_cpu_study_with_the_papers_depths_wider_and_deeper():
    gpu, cpu = load_experiment(GPU, []), load_experiment(CPU, [])
    assert (gpu.target_langs, gpu.source_lang, gpu.finetune.tasks, gpu.finetune.seeds) == (
        cpu.target_langs, cpu.source_lang, cpu.finetune.tasks, cpu.finetune.seeds)
    assert gpu.tasks["lohelp"].source == cpu.tasks["lohelp"].source
    assert gpu.evaluate.dev and gpu.evaluate.dev_checkpoints == cpu.evaluate.dev_checkpoints
    assert gpu.report == cpu.report  # the transfer rule, its margin and the plateau check, unchanged
    assert gpu.data.corpus_dir == cpu.data.corpus_dir
    assert gpu.model.hidden > cpu.model.hidden and gpu.model.layers > cpu.model.layers
    runs = by_label(GPU)
    depths = {label: (stage_plan(cfg, "adapt").depth, cfg.model.layers) for label, cfg in runs.items()}
    assert depths == {"bl_base": (12, 12), "bl_small": (4, 4), "minijoint": (4, 12), "minijoint-n2": (2, 12),
                      "minipost": (6, 12)}  # MiniPost: BL_BASE's bottom 4 layers + 2 bridge layers
    minipost = runs["minipost"]
    assert (minipost.bridge.depth, minipost.bridge.layers) == (4, 2)
    systems = {cfg.system for cfg in by_label(CPU).values()}
    assert {cfg.system for cfg in runs.values()} == systems == {"bl_base", "bl_small", "minijoint", "minipost"}


def test_every_training_stage_uses_the_gpu_in_bf16():
    cfg = load_experiment(GPU, [])
    for stage in (cfg.pretrain, cfg.bridge, cfg.adapt, cfg.finetune):
        assert (stage.trainer.accelerator, stage.trainer.precision) == ("gpu", "bf16-mixed")
    assert cfg.evaluate.precision == "auto"


def test_it_fits_one_h100_and_its_training_is_a_few_minutes_of_one():
    from minimodel.cluster.launcher import plan_rows

    total, estimated = 0.0, 0
    for label, cfg in by_label(GPU).items():
        for r in plan_rows(cfg, {"pretrain": 1, "bridge": 1, "adapt": 1, "finetune": 1}, 79.0):
            if r.estimate is not None:  # docs/study.md: every stage under 2.4 GiB
                estimated += 1
                assert r.estimate.needed < 2.4 * 2**30, (label, r.model.stage, r.estimate)
        # each pretraining once (MiniPost's is BL_BASE's); step 2 over every target language
        total += sum(r["flops"] for r in cost_rows(cfg) if "shared" not in r["step"] and "(per language)" not in
                     r["step"])
    assert estimated >= 10  # every system's stages were planned (MiniPost's shared pretraining has no row of its own)
    # steps 1, 1b and 2: 7.7 PFLOP, about 4 minutes at 30 TFLOP/s (3% of an H100's dense bf16 peak), under 1.5 at 100
    assert 5e15 < total < 10e15, total
