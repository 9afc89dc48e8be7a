"""The SIB-200 study's experiments (experiments/study_sib200.yaml, its GPU variant study_sib200_gpu.yaml; issue 53):
which rows they run, that the rows differ only in the recipe, that every row shares the same finetuned models, and
that the GPU variant fits one H100. Read from the configs, without loading SmolLM2."""

from __future__ import annotations

from minimodel.experiment import load_experiment
from minimodel.pipeline import variants
from minimodel.systems import stage_plan
from tests.conftest import ROOT


def path(name: str):
    return ROOT / "experiments" / f"{name}.yaml"


def rows(name: str) -> dict:
    return {stage_plan(v.cfg, "adapt").runs.label: v.cfg for v in variants(str(path(name)), [])}


def test_the_paper_recipe_and_the_recipe_of_issue_52_for_each_system():
    r = rows("study_sib200")
    assert sorted(r) == ["bl_base", "bl_base@mean", "minipost", "minipost-recipe@mean"]
    paper = [(c.bridge.init, c.bridge.objective, c.bridge.depth, c.adapt.init, c.adapt.vocabulary)
             for c in (r["bl_base"], r["minipost"])]
    assert paper == [("random", "lm", 10, "overlap", "replace")] * 2
    assert r["bl_base@mean"].adapt.init == "mean"
    recipe = r["minipost-recipe@mean"]
    assert (recipe.bridge.init, recipe.bridge.objective, recipe.bridge.depth, recipe.adapt.init) == \
        ("affine", "distill", 12, "mean")
    # the same step-2 tokens, checkpoints and finetuning seeds in every row
    assert len({(c.adapt.optim.updates, c.adapt.optim.global_batch, tuple(c.adapt.trainer.ckpt_steps),
                 c.data.seq_len, tuple(c.finetune.seeds)) for c in r.values()}) == 1
    # one set of finetuned models for every row (and for the unadapted reference)
    assert len({stage_plan(c, "adapt").runs.finetune("sib200", 1) for c in r.values()}) == 1


def test_the_cpu_study_evaluates_test_at_four_checkpoints_and_dev_with_three_seeds():
    cfg = load_experiment(path("study_sib200"), [])
    steps = {0, *cfg.adapt.trainer.ckpt_steps, cfg.adapt.optim.updates}
    assert len(steps) >= 4 and 0 in steps
    assert cfg.evaluate.dev and len(cfg.finetune.seeds) >= 3
    assert len(cfg.target_langs) >= 2 and {"el", "ru"} <= set(cfg.target_langs)  # two non-Latin scripts at least
    assert cfg.data.corpus_dir == "runs/corpora/sib200" and cfg.tasks["sib200"].source == "data/sib200"


def test_the_latin_run_keeps_sizes_and_seeds_and_changes_only_languages_and_vocabulary():
    """study_sib200_latin.yaml: French, Spanish, German; the recipe's two rows with the extended vocabulary first,
    then the paper's two rows as in the first run; every size, checkpoint and seed of study_sib200.yaml (so its rows
    read beside the first run's)."""
    first, latin = rows("study_sib200"), rows("study_sib200_latin")
    assert list(latin) == ["bl_base@extend-mean", "minipost-recipe@extend-mean", "bl_base", "minipost"]
    for label, cfg in latin.items():
        before = first[label.replace("extend-", "")]
        assert cfg.target_langs == ["fr", "es", "de"]
        if "@" in label:
            assert cfg.adapt.vocabulary == "extend" and cfg.adapt.init == "mean"
            assert before.adapt.vocabulary == "replace"
        else:  # the paper's recipe, unchanged
            assert (cfg.adapt.vocabulary, cfg.adapt.init) == (before.adapt.vocabulary, before.adapt.init) \
                == ("replace", "overlap")
            assert (cfg.bridge.objective, cfg.bridge.layers) == (before.bridge.objective, before.bridge.layers)
        for key in ("optim", "trainer"):
            assert getattr(cfg.adapt, key) == getattr(before.adapt, key)
            assert getattr(cfg.bridge, key) == getattr(before.bridge, key)
        assert (cfg.bridge.init, cfg.bridge.depth, cfg.finetune, cfg.tasks) == \
            (before.bridge.init, before.bridge.depth, before.finetune, before.tasks)
    assert len({stage_plan(c, "adapt").runs.finetune("sib200", 1) for c in latin.values()}) == 1


def test_the_gpu_variant_runs_all_six_languages_at_scale_and_fits_one_h100():
    from minimodel.cluster.launcher import plan_rows

    cpu, gpu = rows("study_sib200"), rows("study_sib200_gpu")
    assert sorted(gpu) == sorted(cpu)
    for label, cfg in gpu.items():
        assert cfg.target_langs == ["fr", "es", "de", "el", "ru", "tr"]
        assert cfg.adapt.optim.updates * cfg.adapt.optim.global_batch * cfg.data.seq_len > 2e7  # tokens per language
        assert cfg.adapt.trainer.accelerator == "gpu" and len(cfg.finetune.seeds) >= 5
        for r in plan_rows(cfg, {"bridge": 1, "adapt": 1, "finetune": 1}, 79.0):
            if r.estimate is not None:
                assert r.estimate.needed < 40 * 2**30, (label, r.model.stage, r.estimate)
