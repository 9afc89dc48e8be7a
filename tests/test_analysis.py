"""Result analysis: time to near-maximal performance, speedups, and the report on a hand-made results tree."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from minimodel.flops import V100_DAY
from minimodel.report.curves import speedups, time_to_target
from minimodel.report.document import summary, write_report
from minimodel.report.formatting import fmt_stat, speedup_verdict
from minimodel.report.intervals import time_to_target_interval
from minimodel.report.reading import load_results, results_from_rows
from minimodel.report.statistics import stat

PNG = b"\x89PNG\r\n\x1a\n"


# ---- time_to_target -----------------------------------------------------------------------------

def test_paper_example():
    assert time_to_target([5000, 10000], [48, 52], 50) == 7500


def test_never_hit_is_inf():
    assert time_to_target([1, 2, 3], [10, 20, 30], 31) == math.inf
    assert time_to_target([], [], 1) == math.inf


def test_hit_at_the_first_checkpoint_is_its_x():
    assert time_to_target([2.0, 4.0], [60, 70], 50) == 2.0


def test_a_step_zero_point_is_interpolated_from():
    assert time_to_target([0.0, 2.0, 4.0], [40, 60, 70], 50) == pytest.approx(1.0)


def test_hit_exactly_at_a_checkpoint():
    assert time_to_target([1, 2, 3], [40, 50, 60], 50) == 2
    assert time_to_target([1.0, 1.5], [56, 0.95 * 60], 0.95 * 60) == 1.5
    assert time_to_target([1.0, 1.5], [56, 57], 0.95 * 60) == 1.5  # 0.95 * 60 is 56.99999999999999


def test_dips_after_the_first_hit_do_not_matter():
    assert time_to_target([1, 2, 3, 4], [40, 60, 45, 70], 50) == pytest.approx(1.5)


def test_bad_input():
    with pytest.raises(ValueError):
        time_to_target([2, 1], [1, 2], 1)
    with pytest.raises(ValueError):
        time_to_target([1, 2], [1], 1)


# ---- speedups -----------------------------------------------------------------------------------

def test_speedup_is_the_mean_of_ratios_not_the_ratio_of_means():
    base, mini = {"ar": 10.0, "de": 2.0}, {"ar": 1.0, "de": 2.0}
    sp = speedups(base, mini)
    assert sp.mean == pytest.approx(5.5)  # (10 + 1) / 2
    assert sp.mean != pytest.approx(sum(base.values()) / sum(mini.values()))  # 12 / 3 = 4
    assert sp.used == ("ar", "de") and sp.excluded == ()


def test_speedup_excludes_infinite_languages():
    sp = speedups({"ar": math.inf, "de": 4.0, "tr": 3.0}, {"ar": 1.0, "de": 2.0, "tr": math.inf, "sw": 1.0})
    assert sp.mean == pytest.approx(2.0) and sp.used == ("de",) and sp.excluded == ("ar", "tr")
    assert math.isnan(speedups({"ar": math.inf}, {"ar": 1.0}).mean)


# ---- a synthetic results tree -------------------------------------------------------------------

STEPS = (1000, 2000, 3000, 4000)
# system -> V100-days at each step, and seed-averaged XNLI accuracy at each step per language
DAYS = {"bl_base": (1, 2, 3, 4), "bl_small": (0.4, 0.8, 1.2, 1.6), "minijoint": (0.5, 1, 1.5, 2),
        "minipost": (0.5, 1, 1.5, 2), "minijoint-n2": (0.25, 0.5, 0.75, 1.0), "minijoint-n10": (0.9, 1.8, 2.7, 3.6)}
SCORES = {
    "bl_base": {"ar": (70, 74, 78, 80), "de": (50, 58, 59, 60)},  # targets: ar 76, de 57
    "bl_small": {"ar": (70, 72, 74, 76), "de": (50, 52, 54, 56)},  # ar hit exactly at the last; de never
    "minijoint": {"ar": (72, 77, 75, 79), "de": (57, 58, 59, 59)},  # ar dips after the hit; de hit at first
    "minipost": {"ar": (60, 65, 70, 75), "de": (55, 56, 57, 58)},  # ar never; de hit exactly at step 3
    "minijoint-n2": {"ar": (70, 76.5, 80, 81), "de": (40, 50, 57.5, 60)},
    "minijoint-n10": {"ar": (70, 74, 78, 80), "de": (50, 58, 59, 60)},
}
ENGLISH = {("bl_base", "primary"): 85.0, ("bl_small", "primary"): 80.0, ("minijoint", "primary"): 84.5,
           ("minijoint", "mini"): 78.0, ("minipost", "primary"): 85.0}


def rows_of(system: str) -> list[dict]:
    rows = []
    for seed, delta in ((1, -1.0), (2, 1.0)):  # the two seeds average to the score above
        for lang, scores in SCORES[system].items():
            for step, days, score in zip(STEPS, DAYS[system], scores):
                rows.append({"system": system, "body": "primary", "task": "xnli", "lang": lang, "seed": seed,
                             "step": step, "flops": days * V100_DAY, "v100_days": days, "split": "test",
                             "metric": "accuracy", "value": score + delta})
        for (s, body), score in ENGLISH.items():
            if s == system:
                for split in ("dev", "test"):
                    rows.append({"system": system, "body": body, "task": "xnli", "lang": "en", "seed": seed,
                                 "step": -1, "flops": 0.0, "v100_days": 0.0, "split": split, "metric": "accuracy",
                                 "value": score + delta + (5 if split == "dev" else 0)})
    return rows


def write_rows(path: Path, rows: list[dict], partial: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if partial:
        text += json.dumps(rows[0])[:40]  # a writer killed mid-line
    path.write_text(text, encoding="utf-8")


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    for system in SCORES:
        write_rows(tmp_path / "demo" / system / "results.jsonl", rows_of(system), partial=system == "minipost")
    return tmp_path


def test_partial_last_line_is_ignored(tmp_path: Path):
    write_rows(tmp_path / "x" / "minipost" / "results.jsonl", rows_of("minipost"), partial=True)
    res = load_results(tmp_path, "x")
    assert res.n_rows == len(rows_of("minipost"))
    assert [p.score for p in res.curves[("minipost", "xnli", "ar")]] == [60, 65, 70, 75]


def test_days_to_target_by_hand(tree: Path):
    res = load_results(tree, "demo")
    expected = {"bl_base": (2.5, 1.875), "bl_small": (1.6, math.inf), "minijoint": (0.9, 0.5),
                "minipost": (math.inf, 1.5), "minijoint-n2": (0.25 + 6 / 6.5 * 0.25, 0.5 + 7 / 7.5 * 0.25)}
    for system, (ar, de) in expected.items():
        assert res.days_to_target(system, "xnli", "ar") == pytest.approx(ar)
        assert res.days_to_target(system, "xnli", "de") == pytest.approx(de)
    assert res.systems == ["bl_base", "bl_small", "minijoint", "minipost", "minijoint-n2", "minijoint-n10"]


def test_report(tree: Path):
    path = write_report(tree, "demo")
    assert path == tree / "demo" / "report.md"
    text = path.read_text(encoding="utf-8")
    # Table 2: final scores, their average, and the target row
    assert "| minijoint | 2 | 79.0 ± 1.4 | 59.0 ± 1.4 | 69.0 ± 1.4 | 5.18 | 2 |" in text  # 2 V100-days = 5.184 EFLOPs
    assert "| target (95% of bl_base) |  | 76.0 | 57.0 | 66.5 |  |  |" in text
    # Table 3, by hand (see SCORES)
    assert "| system | ar | de | avg | 95% interval |" in text
    assert "| bl_base | 2.5 | 1.88 | 2.19 |" in text
    assert "| bl_small | 1.6 | ∞ | — | — |" in text and "- bl_small: no average (∞ in de)" in text  # not a number
    assert "| minijoint | 0.9 | 0.5 | 0.7 |" in text
    assert "| minipost | ∞ | 1.5 | — | — |" in text
    # Figure 1: mean of (2.5 / 0.9, 1.875 / 0.5) = 3.26, not 2.1875 / 0.7 = 3.125
    assert "| minijoint | 3.26× (2/2 langs) [" in text
    assert "| minipost | 1.25× (1/2 langs) [" in text
    assert "minipost / xnli: 1 language(s) excluded" in text and "bl_small / xnli: 1 language(s) excluded" in text
    # Table 4: columns by depth, N=2 before N=10
    assert "| language | bl_base | minijoint N=2 | minijoint N=10 |" in text
    assert "| ar | 2.5 | 0.481 | 2.25 |" in text
    assert "| de | 1.88 | 0.733 | 1.69 |" in text
    # Table 5: English test scores, the mini-model on its own row
    assert "| minijoint | 84.5 ± 1.4 (n=2) |" in text and "| minijoint (mini) | 78.0 ± 1.4 (n=2) |" in text
    # Figure 3
    assert "![xnli](plots/xnli.png)" in text
    png = tree / "demo" / "plots" / "xnli.png"
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 1000
    assert "xnli" in summary(tree, "demo") and "3.26×" in summary(tree, "demo")


def test_tiny_days_stay_readable(tmp_path: Path):
    rows = [r | {"v100_days": r["v100_days"] * 1e-9} for r in rows_of("bl_base")]
    write_rows(tmp_path / "d" / "bl_base" / "results.jsonl", rows)
    text = write_report(tmp_path, "d").read_text(encoding="utf-8")
    assert "| bl_base | 2.5e-09 | 1.88e-09 | 2.19e-09 |" in text


def test_no_reference_no_crash(tmp_path: Path):
    write_rows(tmp_path / "d" / "minijoint" / "results.jsonl", rows_of("minijoint"))
    text = write_report(tmp_path, "d").read_text(encoding="utf-8")
    assert "No bl_base (BL_BASE) results" in text and "Table 3" not in text and "| minijoint | 2 | 79.0 ± 1.4 |" in text
    assert (tmp_path / "d" / "plots" / "xnli.png").read_bytes()[:8] == PNG
    assert "No bl_base" in summary(tmp_path, "d")


def test_no_results_at_all(tmp_path: Path):
    out = write_report(tmp_path, "empty", out=tmp_path / "elsewhere" / "r.md")
    assert out.exists() and "No results yet" in out.read_text(encoding="utf-8")
    assert summary(tmp_path, "empty") == "no results"


def test_seeds_averaged_and_half_evaluated_checkpoints_dropped():
    rows = rows_of("bl_base")
    rows = [r for r in rows if not (r["seed"] == 2 and r["step"] == 4000 and r["lang"] == "ar")]
    res = results_from_rows(rows)
    assert [p.step for p in res.curves[("bl_base", "xnli", "ar")]] == [1000, 2000, 3000]
    assert [p.score for p in res.curves[("bl_base", "xnli", "de")]] == [50, 58, 59, 60]


def test_qa_main_metric_is_f1():
    base = {"system": "bl_base", "body": "primary", "task": "mlqa", "lang": "de", "seed": 1, "step": 10,
            "flops": 1.0, "v100_days": 1.0, "split": "test"}
    res = results_from_rows([base | {"metric": "exact_match", "value": 30.0}, base | {"metric": "f1", "value": 45.0}])
    assert res.metrics == {"mlqa": "f1"} and res.final("bl_base", "mlqa", "de").score == 45.0


def curve_rows(system: str, seed: int, scores: tuple[float, ...], lang: str = "de") -> list[dict]:
    return [{"system": system, "body": "primary", "task": "t", "lang": lang, "seed": seed, "step": step,
             "flops": days * V100_DAY, "v100_days": days, "split": "test", "metric": "accuracy", "value": score}
            for step, days, score in zip(STEPS, (1, 2, 3, 4), scores)]


def test_scores_are_mean_and_std_over_seeds():
    res = results_from_rows([*curve_rows("bl_base", 1, (50, 60, 70, 80)), *curve_rows("bl_base", 2, (50, 60, 70, 84)),
                             *curve_rows("bl_base", 3, (50, 60, 70, 82))])
    st = res.final_stat("bl_base", "t", "de")
    assert (st.mean, st.n) == (82.0, 3) and st.std == pytest.approx(2.0)
    assert res.average_stat("bl_base", "t") == st  # one language
    assert fmt_stat(st) == "82.0 ± 2.0" and fmt_stat(stat([5.0])) == "5.0"


def test_time_to_target_and_speedup_intervals_by_hand():
    """BL_BASE reaches its target (76) at 3.6 days with either seed. The system reaches it at day 1 with seed 1 and at
    3.95 with seed 2 (3.9 with both averaged). Resampling the two paired seeds gives {1}, {1, 2} or {2}: the interval
    is [1, 3.95], and the speedup's [3.6 / 3.95, 3.6 / 1] spans 1: inconclusive, not a headline."""
    rows = [*curve_rows("bl_base", 1, (50, 60, 70, 80)), *curve_rows("bl_base", 2, (50, 60, 70, 80)),
            *curve_rows("minijoint", 1, (80, 80, 80, 80)), *curve_rows("minijoint", 2, (0, 0, 0, 80))]
    res = results_from_rows(rows)
    tt = time_to_target_interval(res, "minijoint", "t")
    assert tt is not None and tt.paired and tt.seeds == 2
    assert (tt.days.point, tt.days.low, tt.days.high) == pytest.approx((3.9, 1.0, 3.95))
    assert (tt.speedup.point, tt.speedup.low, tt.speedup.high) == pytest.approx((3.6 / 3.9, 3.6 / 3.95, 3.6))
    assert speedup_verdict(tt) == "inconclusive (interval spans 1)"
    assert time_to_target_interval(res, "minijoint", "t") == tt  # seeded: the same interval every time
    # one seed: no spread to resample
    one = time_to_target_interval(results_from_rows([r for r in rows if r["seed"] == 1]), "minijoint", "t")
    assert (one.days.low, one.days.high, speedup_verdict(one)) == (1.0, 1.0, "one seed: no interval")
    # seeds that are not the reference's are resampled independently of its seeds
    other = [r | {"seed": r["seed"] + 10} if r["system"] == "minijoint" else r for r in rows]
    assert not time_to_target_interval(results_from_rows(other), "minijoint", "t").paired


def test_claims_by_hand(tree: Path):
    """The synthetic tree (two seeds at -1 / +1 of the scores in SCORES, the same for every system: paired)."""
    from minimodel.report.claims import claims, claims_table

    res = load_results(tree, "demo")
    got = {c.claim.split(" ")[0] + " " + c.claim.split(" ")[1]: c for c in
           claims(res, "xnli", depths={"minijoint-n2": 2, "minijoint-n10": 10}, reps=200)}
    assert got["MiniJoint reaches"].verdict == "held"  # 3.26x, both seeds shift every curve alike
    assert got["MiniJoint reaches"].ours.startswith("3.26× [")
    minipost = got["MiniPost keeps"]  # 66.5 / 70 = 95.0%, below the 97% rule, at 2 / 4 = 50% of the cost
    assert minipost.verdict == "not held" and "at 50.0% of the cost" in minipost.ours
    assert got["BL_SMALL plateaus"].verdict == "held"  # 66 vs 69 and 70
    assert got["BL_SMALL plateaus"].ours.startswith("-3.0 [-3.0, -3.0] vs minijoint; -4.0 [-4.0, -4.0] vs bl_base")
    depth = got["Shallower mini-models"]  # N=2 is faster (3.88x vs 1.11x) but does not plateau lower (70.5 vs 70)
    assert depth.verdict == "not held" and "final +0.5 [+0.5, +0.5]" in depth.ours
    assert got["Dual-head pretraining"].verdict == "held"  # 84.5 vs 85.0: -0.5, above -1
    assert got["Distant (SOV)"].verdict == "not measured"  # ar and de only
    table = claims_table(res, {"minijoint-n2": 2, "minijoint-n10": 10}, reps=50)
    assert table.count("\n| ") == 7 and "**not held**" in table


def test_claims_beyond_the_paper_by_hand():
    """Multi-head vs dedicated, progressive vs its fixed heads, forgetting with full and low data: variants made
    from minijoint-n2's curves with known shifts of score (points) and of cost (days scaled)."""
    from minimodel.report.claims import VariantInfo, claims_table, extension_claims

    def like(src: str, label: str, shift: float = 0.0, days: float = 1.0) -> list[dict]:
        return [r | {"system": label, "value": r["value"] + shift, "v100_days": r["v100_days"] * days,
                     "flops": r["flops"] * days} for r in rows_of(src) if r["step"] >= 0]

    rows = [*rows_of("bl_base"), *rows_of("minijoint-n2"), *like("minijoint-n2", "minijoint-multi@l2", shift=-2.0),
            *like("minijoint-n2", "minijoint-multi@progressive", days=0.5),
            *like("minijoint-n2", "minijoint-forget", days=0.5),
            *like("minijoint-n2", "minijoint-low", shift=-5.0), *like("minijoint-n2", "minijoint-forget-low", shift=-3.0)]
    res = results_from_rows(rows)
    variants = {"minijoint-n2": VariantInfo(2, "minijoint-n2"),
                "minijoint-multi@l2": VariantInfo(2, "minijoint-multi", multi_head=True),
                "minijoint-multi@progressive": VariantInfo(10, "minijoint-multi", multi_head=True, progressive=True),
                "minijoint-forget": VariantInfo(2, "minijoint-forget", forget=True),
                "minijoint-low": VariantInfo(2, "minijoint-low", data_fraction=0.1),
                "minijoint-forget-low": VariantInfo(2, "minijoint-forget-low", forget=True, data_fraction=0.1),
                "minijoint-n10": VariantInfo(10, "minijoint-n10")}  # no results: left out
    got = {c.claim.split(" ")[0] + " " + c.claim.split(" ")[1]: c for c in extension_claims(res, "xnli", variants, 200)}
    assert set(got) == {"One multi-head", "Progressive adaptation", "Active forgetting"} and len(got) == 3
    multi = got["One multi-head"]
    assert multi.verdict == "not held" and "minijoint-multi@l2 − minijoint-n2 (N=2): -2.0 [-2.0, -2.0]" in multi.ours
    prog = got["Progressive adaptation"]  # half the days of its fixed head, 2 points better at the end
    assert prog.verdict == "held" and "vs minijoint-multi@l2" in prog.ours and "final +2.0 [+2.0, +2.0]" in prog.ours
    rows_by_claim = extension_claims(res, "xnli", variants, 200)
    forget_full, forget_low = [c for c in rows_by_claim if c.claim.startswith("Active forgetting")]
    assert forget_full.verdict == "held" and forget_full.ours.startswith("minijoint-forget − minijoint-n2: +")
    assert forget_low.verdict == "held" and "(10% of the corpus): +2.0 [+2.0, +2.0]" in forget_low.ours
    assert all(c.paper == "— (not in the paper)" for c in rows_by_claim)
    table = claims_table(res, {"minijoint-n2": 2}, reps=50, variants=variants)
    assert table.count("not in the paper") == 4
