"""The real-model study's experiments (experiments/study_real.yaml, its GPU variant study_real_gpu.yaml): what they
run and what they cost, read from the configs without loading SmolLM2 (tests/test_smollm2.py runs the chain)."""

from __future__ import annotations

from minimodel.experiment import load_experiment
from tests.conftest import ROOT


def config(name: str, *overrides: str):
    return load_experiment(ROOT / "experiments" / f"{name}.yaml", list(overrides))


def test_both_variants_run_the_same_systems_model_and_task_over_smollm2():
    cpu, gpu = config("study_real"), config("study_real_gpu")
    for cfg in (cpu, gpu):
        assert cfg.bridge.source.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
        assert (cfg.bridge.depth, cfg.bridge.layers) == (10, 2)  # a third of 30 layers, the paper's 4 of 12
        assert cfg.model.layers == 30 and cfg.model.kv_heads == 3 and cfg.model.hidden == 576
        assert cfg.target_langs == ["fr", "es"] and cfg.finetune.tasks == ["wiki_topics"]
        assert len(cfg.finetune.seeds) >= 3 and cfg.evaluate.dev
    assert gpu.sweep == cpu.sweep and gpu.tasks["wiki_topics"].source == cpu.tasks["wiki_topics"].source
    assert gpu.adapt.trainer.accelerator == "gpu" and cpu.adapt.trainer.accelerator == "cpu"


def test_a_public_primary_has_no_step_1_in_the_costs_or_the_plan():
    from minimodel.cluster.launcher import plan_rows
    from minimodel.report.costs import cost_rows
    from minimodel.systems import stage_plan

    for system in ("bl_base", "minipost"):
        cfg = config("study_real_gpu", f"system={system}")
        plan = stage_plan(cfg, "pretrain")
        assert plan.external_primary and "pretrain" not in plan.steps and not plan.runs_here
        rows = cost_rows(cfg)
        assert rows[0]["flops"] == 0.0 and "public model" in rows[0]["step"]
        plan = plan_rows(cfg, {"bridge": 1, "adapt": 1, "finetune": 1}, 79.0)
        assert all(r.estimate is None for r in plan if r.model.stage == "pretrain")


def test_the_gpu_variant_fits_one_h100():
    from minimodel.cluster.launcher import plan_rows

    for system in ("bl_base", "minipost"):
        rows = plan_rows(config("study_real_gpu", f"system={system}"), {"bridge": 1, "adapt": 1, "finetune": 1}, 79.0)
        for r in rows:
            if r.estimate is not None:
                assert r.estimate.needed < 40 * 2**30, (system, r.model.stage, r.estimate)
