"""A second pretraining seed: its own runs (``-ps{seed}``), pooled with the first in reports, and a two-level
bootstrap (pretraining seeds, then finetuning seeds within each)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from minimodel.config.schema import pooled_label
from minimodel.experiment import load_experiment
from minimodel.flops import V100_DAY
from minimodel.pipeline import plan
from minimodel.report.document import write_report
from minimodel.report.intervals import bootstrap, time_to_target_interval
from minimodel.report.reading import results_from_rows
from minimodel.report.statistics import draw
from minimodel.systems import stage_plan
from tests.conftest import ROOT

EXP = ROOT / "experiments" / "study.yaml"  # only loaded and planned here: nothing runs


def test_a_pretraining_seed_other_than_1_names_its_own_runs():
    one = load_experiment(EXP, ["system=bl_base"])
    two = load_experiment(EXP, ["system=bl_base", "pretrain.trainer.seed=2"])
    assert (one.label, two.label) == ("bl_base", "bl_base-ps2")
    first, second = stage_plan(one, "adapt").runs, stage_plan(two, "adapt").runs
    assert second.pretrain != first.pretrain and second.pretrain.parent.name == "bl_base-ps2"
    # MiniPost builds on BL_BASE's pretraining of the same seed, and evaluates its finetuned models
    post = stage_plan(load_experiment(EXP, ["system=minipost", "pretrain.trainer.seed=2"]), "adapt").runs
    assert post.pretrain == second.pretrain and post.label == "minipost-ps2"
    assert post.finetune("lohelp", 1).is_relative_to(post.pretrain.parent)
    tagged = load_experiment(EXP, ["system=minijoint", "model.mini_heads=[1]", "tag=n1", "pretrain.trainer.seed=3"])
    assert tagged.label == "minijoint-n1-ps3"


def test_pooled_label_removes_only_the_suffix_of_the_rows_seed():
    assert pooled_label("minijoint-mh-ps2@l1", 2) == "minijoint-mh@l1"
    assert pooled_label("minijoint-ps2@progressive+low", 2) == "minijoint@progressive+low"
    assert pooled_label("bl_base-ps2", 2) == "bl_base"
    assert pooled_label("bl_base-ps2", 1) == "bl_base-ps2"  # a tag that happens to read ps2, pretraining seed 1
    assert pooled_label("bl_base", 1) == "bl_base"


def test_a_sweep_over_pretraining_seeds_plans_each_pretraining_once():
    sweep = 'sweep=["system=bl_base", "system=bl_base pretrain.trainer.seed=2", "system=minipost pretrain.trainer.seed=2"]'
    steps = plan(EXP, [sweep, "target_langs=[de]"])
    pretrains = sorted(Path(s.run_dir).parent.name for s in steps if s.stage == "pretrain")
    assert pretrains == ["bl_base", "bl_base-ps2"]  # MiniPost's is BL_BASE's of seed 2, not a third
    bridge = next(s for s in steps if s.stage == "bridge")
    assert bridge.name == "minipost-ps2:bridge" and bridge.after == ("bl_base-ps2:pretrain",)


def rows(label: str, pretrain_seed: int, seed: int, scores: tuple[float, ...], lang: str = "de",
         english: float | None = None) -> list[dict]:
    out = [{"system": label, "body": "primary", "task": "t", "lang": lang, "seed": seed, "step": step,
            "flops": days * V100_DAY, "v100_days": days, "split": "test", "metric": "accuracy", "value": score,
            "pretrain_seed": pretrain_seed}
           for step, days, score in zip((0, 10, 20, 30), (0, 1, 2, 3), scores)]
    if english is not None:
        out.append({**out[0], "lang": "en", "step": -1, "flops": 0.0, "v100_days": 0.0, "value": english})
    return out


def pooled_rows() -> list[dict]:
    """BL_BASE: pretraining seed 1 ends at 60 with either finetuning seed, pretraining seed 2 at 70. The rows of seed
    1 carry no pretrain_seed field (as results written before it existed)."""
    out = []
    for seed in (1, 2, 3):
        out += [{k: v for k, v in r.items() if k != "pretrain_seed"}
                for r in rows("bl_base", 1, seed, (40, 50, 55, 60), english=80.0)]
        out += rows("bl_base-ps2", 2, seed, (40, 60, 65, 70), english=82.0)
    return out


def test_pretraining_seeds_are_pooled_in_scores():
    res = results_from_rows(pooled_rows())
    assert res.systems == ["bl_base"]
    st = res.final_stat("bl_base", "t", "de")
    assert (st.n, st.mean) == (6, 65.0) and st.std == pytest.approx(30 ** 0.5)
    assert res.english[("bl_base", "primary", "t")] == 81.0
    assert res.seeds == {(p, f) for p in (1, 2) for f in (1, 2, 3)}


def test_the_report_says_how_many_pretrainings(tmp_path: Path):
    from minimodel.store.results import ResultsTable

    ResultsTable(tmp_path / "e" / "bl_base" / "results.jsonl").append(pooled_rows())
    text = write_report(tmp_path, "e", tmp_path / "report.md").read_text()
    assert "| bl_base | 6 (2 pretrainings) |" in text
    assert "for bl_base, over pretraining seeds too (1, 2;" in text
    assert "with 2 pretrainings that resampling can only mix them" in text
    assert "seeds 1, 2, 3)" in text  # the finetuning seeds


def test_the_bootstrap_draws_pretraining_seeds_then_finetuning_seeds():
    seeds = [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    rng = random.Random(0)
    for _ in range(200):
        drawn = draw(rng, seeds)
        assert len(drawn) == 6
        blocks = [drawn[:3], drawn[3:]]
        assert all(len({p for p, _ in b}) == 1 for b in blocks)  # each block: one drawn pretraining seed
    # one pretraining seed: what the one-level bootstrap drew before (same random stream)
    assert draw(random.Random(5), seeds[:3]) == random.Random(5).choices(seeds[:3], k=3)


def test_pretraining_variance_widens_the_interval():
    """Every finetuning seed of pretraining 1 ends at 60, of pretraining 2 at 70: a resample of both pretraining
    draws is one pretraining twice a quarter of the time each, so the 95% interval of the final score is [60, 70]. A
    flat bootstrap over the six (pretraining, finetuning) pairs would reach 60 only when all six draws fall on
    pretraining 1 (1/64 of the time, under the 2.5% tail): its interval is narrower."""
    res = results_from_rows(pooled_rows())
    iv = bootstrap(res, ["bl_base"], lambda r: r.final("bl_base", "t", "de").score, reps=2000)
    assert (iv.low, iv.high) == (60.0, 70.0)
    tt = time_to_target_interval(res, "bl_base", "t")
    assert tt is not None and tt.seeds == 6 and tt.paired


def test_claims_find_the_variants_of_a_sweep_run_at_another_pretraining_seed():
    from minimodel.cli import mini_depths, variant_infos
    from minimodel.pipeline import variants

    one = mini_depths(variant_infos(variants(str(ROOT / "experiments" / "depth_sweep.yaml"), [])))
    two = mini_depths(variant_infos(variants(str(ROOT / "experiments" / "depth_sweep.yaml"), ["pretrain.trainer.seed=2"])))
    assert two == one and one  # the report names them without -ps2
    infos = variant_infos(variants(str(EXP), ['sweep=["system=minijoint model.mini_heads=[2] pretrain.trainer.seed=2"]']))
    assert {k: v.pretraining for k, v in infos.items()} == {"minijoint": "minijoint"}


def test_a_row_with_a_pretrain_seed_that_is_not_an_int_is_not_a_row():
    from minimodel.store.results import is_row

    row = rows("bl_base", 2, 1, (1, 2, 3, 4))[0]
    assert is_row(row) and is_row({k: v for k, v in row.items() if k != "pretrain_seed"})
    assert not is_row(row | {"pretrain_seed": None}) and not is_row(row | {"pretrain_seed": "2"})
