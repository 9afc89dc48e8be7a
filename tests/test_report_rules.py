"""A report that cannot mislead on a user's own task (issue 29, parts 1-6): an imbalanced binary task (80% one class)
with macro-F1 as its main metric and accuracy requested beside it, English training, Spanish and Turkish tests, three
seeds. Every rule is checked on hand-made results rows (the style of test_analysis.py and test_task_metrics.py)."""

from __future__ import annotations

import math

import pytest

from minimodel.report.claims import verdict
from minimodel.report.curves import mean_days, speedups
from minimodel.report.document import render_report, summary_text
from minimodel.report.formatting import BELOW, LOWERED, NO_TARGET, SEED_BELOW, speedup_interval, speedup_verdict
from minimodel.report.intervals import time_to_target_interval
from minimodel.report.marks import claims_gate
from minimodel.report.reading import results_from_rows
from minimodel.report.statistics import percentile_interval
from minimodel.report.tables import days_average, system_speedup, table_final, table_other_metrics, table_time

STEPS = (0, 10, 20)
BASELINES = {("t", lang): {"accuracy": 79.6, "macro_f1": 44.3} for lang in ("es", "tr")}


def rows(system: str, lang: str, seeds: dict[int, tuple[float, ...]], metric: str = "macro_f1") -> list[dict]:
    """One row per (seed, step): ``seeds`` maps a seed to its scores at STEPS; 1e-8 V100-days per step."""
    return [{"system": system, "body": "primary", "task": "t", "lang": lang, "seed": seed, "step": step,
             "flops": step * 1e10, "v100_days": step * 1e-8, "split": "test", "metric": metric, "value": v}
            for seed, scores in seeds.items() for step, v in zip(STEPS, scores)]


def same(scores: tuple[float, ...]) -> dict[int, tuple[float, ...]]:
    return {seed: scores for seed in (1, 2, 3)}


def own_task() -> list[dict]:
    """The issue's numbers. BL_BASE: es reaches its target (95% of 49.4 = 46.9) after 9.9e-8 days; tr ends at
    45.5 ± 1.6 (one seed at 43.9, below the majority class's 44.3) and below its own step-0 score (47.9), so its
    target (43.2) is below both. MiniPost never reaches es's target and is past tr's at step 0. Accuracy: every
    system below the majority class's 79.6."""
    return [*rows("bl_base", "es", same((40.0, 47.0, 49.4))),
            *rows("bl_base", "tr", {1: (47.9, 46.0, 43.9), 2: (47.9, 46.0, 45.5), 3: (47.9, 46.0, 47.1)}),
            *rows("minipost", "es", {1: (40.0, 43.0, 44.0), 2: (40.0, 43.0, 44.5), 3: (40.0, 47.0, 48.0)}),
            *rows("minipost", "tr", same((47.5, 46.0, 45.0))),
            *rows("bl_base", "es", same((70.0, 75.0, 76.0)), "accuracy"),
            *rows("bl_base", "tr", same((79.0, 78.0, 77.0)), "accuracy"),
            *rows("minipost", "es", same((70.0, 74.0, 75.0)), "accuracy"),
            *rows("minipost", "tr", same((79.0, 78.0, 80.0)), "accuracy")]


def read(data: list[dict], baselines: bool = True):
    r = results_from_rows(data, {"t": "macro_f1"})
    r.set_baselines(BASELINES if baselines else None)
    return r


@pytest.fixture()
def res():
    return read(own_task())


# ---- 1. an undefined speedup has no interval and no verdict ------------------------------------------

def test_no_interval_without_a_point_estimate_or_from_mostly_undefined_resamples():
    assert math.isnan(percentile_interval(math.nan, [1.86] * 100).low)  # the "undefined [1.86×, 1.86×]"
    few = percentile_interval(2.0, [1.5] * 90 + [math.nan] * 10)  # 10% of the resamples undefined: no interval
    assert math.isnan(few.low) and few.undefined == pytest.approx(0.10)
    enough = percentile_interval(2.0, [1.5] * 96 + [2.5] * 1 + [math.nan] * 3)  # 3%: an interval of the others
    assert (enough.low, enough.high, enough.undefined) == (1.5, 1.5, pytest.approx(0.03))
    assert verdict(few, above=1.0) == "no interval" and verdict(percentile_interval(math.nan, []), above=1.0) == \
        "not measured"


def test_an_undefined_speedup_prints_neither_interval_nor_verdict(res):
    sp = system_speedup(res, "minipost", "t")  # es: never reached; tr: target below the baseline
    assert math.isnan(sp.mean) and sp.excluded == ("es",) and sp.no_target == ("tr",)
    tt = time_to_target_interval(res, "minipost", "t", reps=300)
    assert math.isnan(tt.speedup.point) and math.isnan(tt.speedup.low)
    assert speedup_interval(tt) == "(no interval)" and speedup_verdict(tt) == "no interval"
    report = render_report(res, "mytask", {})
    # the claims gate fails on t (accuracy under the majority class): the speedup says so, as the verdict does
    assert "| minipost | undefined (no interval; no answer on this task) |" in report
    line = next(x for x in summary_text(res).splitlines() if x.startswith("t          minipost"))
    assert "undefined" in line and "faster" not in line and "[" not in line


# ---- 2. "at step 0" and ∞ make an average of days not a number -----------------------------------------

def test_an_average_over_a_language_met_at_step_0_or_never_is_not_a_number(res):
    assert math.isnan(mean_days([9.9e-8, 0.0])) and math.isnan(mean_days([1.0, math.inf]))
    assert mean_days([math.inf, math.inf]) == math.inf and mean_days([1.0, 3.0]) == 2.0
    assert days_average(res, "bl_base", "t") == ("—", f"at step 0 in tr; target {NO_TARGET} in tr")
    assert days_average(res, "minipost", "t") == ("—", f"∞ in es; at step 0 in tr; target {NO_TARGET} in tr")
    time = table_time(res)
    assert "| bl_base | 9.9e-08 | at step 0 | — | — |" in time  # not (9.9e-08 + 0) / 2 = 4.95e-08
    assert "4.95e-08" not in time and f"- bl_base: no average (at step 0 in tr; target {NO_TARGET} in tr)" in time
    text = summary_text(res)
    bl = next(x for x in text.splitlines() if x.startswith("t          bl_base"))
    assert "e-0" not in bl and " — " in bl
    assert "days to 95% —: no average over languages for bl_base / t (at step 0 in tr; target ⊘ in tr)" in text


def test_days_without_seeds_of_every_language_stay_missing_and_an_all_infinite_average_is_inf():
    r = read([*rows("bl_base", "es", same((40.0, 47.0, 60.0))), *rows("bl_small", "es", same((40.0, 41.0, 42.0)))])
    assert days_average(r, "bl_small", "t") == ("∞", "")


# ---- 3. a target at or below the baseline is flagged and left out of speedups ---------------------------

def test_a_target_at_or_below_the_majority_class_or_step_0_is_flagged_and_left_out(res):
    assert res.target_flag("t", "tr") == "target 43.2 ≤ majority class 44.3 and bl_base at step 0 47.9"
    assert res.target_flag("t", "es") is None
    final = table_final(res)
    assert f"| target (95% of bl_base) |  | 46.9 | 43.2 {NO_TARGET} |" in final
    assert f"| system | es | tr {NO_TARGET} | avg | 95% interval |" in table_time(res)
    assert speedups({"tr": 1.0}, {"tr": 0.5}, skip={"tr"}).no_target == ("tr",)
    report = render_report(res, "mytask", {})
    assert f"minipost / t: {NO_TARGET} target at or below the baseline in tr" in report
    assert f"**{NO_TARGET} Target at or below the baseline (left out of speedups and averages of days):** t: tr " \
           "(target 43.2 ≤ majority class 44.3 and bl_base at step 0 47.9)." in report
    assert f"{NO_TARGET} target at or below the baseline" in summary_text(res)
    # only the baseline: a target above the step-0 score but at the majority class is flagged too
    r = read(rows("bl_base", "es", same((30.0, 40.0, 46.0))))
    assert r.target_flag("t", "es") == "target 43.7 ≤ majority class 44.3"


def test_a_resample_whose_target_falls_to_the_baseline_leaves_that_language_out():
    """Both seeds reach the target after 5 of 10 steps; one seed's final score puts its target at the baseline: in
    the resamples that draw it twice, the language is left out, so that speedup is undefined."""
    # the target of seed 2 alone: 95% of 46 = 43.7 ≤ 44.3
    r = read([*rows("bl_base", "es", {1: (0.0, 60.0, 60.0), 2: (0.0, 44.0, 46.0)}),
              *rows("minijoint", "es", {1: (0.0, 60.0, 60.0), 2: (0.0, 44.0, 46.0)})])
    tt = time_to_target_interval(r, "minijoint", "t", reps=400)
    assert tt.speedup.point == pytest.approx(1.0) and 0.15 < tt.speedup.undefined < 0.35
    assert math.isnan(tt.speedup.low) and speedup_verdict(tt).startswith("no interval: ")


# ---- 4. a seed at the baseline, and adaptation that lowered the score ---------------------------------

def test_a_seed_at_the_baseline_and_a_final_below_step_0_are_marked(res):
    final = table_final(res)
    assert f"| bl_base | 3 | 49.4 ± 0.0 | 45.5 ± 1.6 {SEED_BELOW} {LOWERED} |" in final  # a seed at 43.9; 47.9 at step 0
    assert f"| minipost | 3 | 45.5 ± 2.2 {SEED_BELOW} | 45.0 ± 0.0 {LOWERED} |" in final  # seed 1 ends at 44.0
    report = render_report(res, "mytask", {})
    for mark in (SEED_BELOW, LOWERED, NO_TARGET, BELOW):  # the legend explains every mark
        assert f"{mark}: " in report or f"{mark} (target row): " in report
    assert f"**{SEED_BELOW} A seed at or below the majority-class baseline:** bl_base / t: tr; minipost / t: es." \
        in report
    assert f"**{LOWERED} Below its own step-0 score (adaptation lowered it):** bl_base / t: tr; minipost / t: tr; " \
           "bl_base / t (accuracy): tr." in report
    text = summary_text(res)
    assert f"{SEED_BELOW} a seed at or below the majority-class baseline: bl_base / t: tr; minipost / t: es" in text
    assert f"{LOWERED} below its own step-0 score (adaptation lowered it): bl_base / t: tr" in text


# ---- 5. every requested scalar metric, with its own baseline ------------------------------------------

def test_every_requested_scalar_metric_gets_its_table_and_baseline(res):
    assert set(res.secondary["t"]) == {"accuracy"}  # f1/LABEL and confusion/... rows would not count
    other = table_other_metrics(res)
    assert "**t** (accuracy)" in other
    assert f"| bl_base | 3 | 76.0 ± 0.0 {BELOW} | 77.0 ± 0.0 {BELOW} {LOWERED} | 76.5 ± 0.0 |" in other  # 79 at step 0
    assert "| minipost | 3 | 75.0 ± 0.0 ▼ | 80.0 ± 0.0 | 77.5 ± 0.0 |" in other  # tr: beats 79.6 and its step 0
    assert "| majority class (train) |  | 79.6 | 79.6 | 79.6 |" in other
    report = render_report(res, "mytask", {})
    assert "## Performance at training completion in the other metrics" in report
    assert f"**{BELOW} Below the majority-class baseline:** bl_base / t (accuracy): es, tr; minipost / t " \
           "(accuracy): es." in report
    text = summary_text(res)
    assert "t          accuracy         bl_base 76.5, minipost 77.5; majority class 79.6" in text
    assert "bl_base / t (accuracy): es, tr" in text
    expanded = [r | {"metric": "f1/yes"} for r in own_task() if r["metric"] == "accuracy"]
    assert set(results_from_rows(own_task() + expanded, {"t": "macro_f1"}).secondary["t"]) == {"accuracy"}
    assert table_other_metrics(results_from_rows([r for r in own_task() if r["metric"] == "macro_f1"])) is None


# ---- 6. the paper's claims only where the systems clearly beat chance -------------------------------

def test_the_claims_are_left_out_where_bl_base_does_not_clearly_beat_the_majority_class(res):
    gate = ("bl_base's final score does not beat the better of the majority class and the best input-blind predictor "
            "clearly in tr macro_f1 (45.5, lowest seed 43.9 vs majority class 44.3)")
    # every metric shown is gated: accuracy, below the majority class in both languages, too
    assert claims_gate(res, "t") == (gate + ", es accuracy (76.0, lowest seed 76.0 vs majority class 79.6), tr "
                                     "accuracy (77.0, lowest seed 77.0 vs majority class 79.6): the claims compare "
                                     "scores near chance there")
    res = read([r for r in own_task() if r["metric"] == "macro_f1"])  # macro-F1 alone: es clears the gate
    assert claims_gate(res, "t") == gate + ": the claims compare scores near chance there"
    report = render_report(res, "mytask", {})
    assert f"**t**: left out: {gate}" in report
    # no claims table over the task's languages: only the exploratory one over es, which clears the gate, says so
    claims = report.split("## The paper's claims")[1]
    before, after = claims.split("**t, exploratory**")
    assert "| claim | paper |" not in before and "| claim | paper |" in after
    assert "(es)" in after and "reads test scores" in after and "| es (1 of 1) |" in after


def test_the_claims_are_shown_where_every_seed_beats_the_majority_class_by_the_margin():
    clear = [*rows("bl_base", "es", {1: (40.0, 50.0, 47.0), 2: (40.0, 50.0, 49.0)}),
             *rows("minijoint", "es", same((40.0, 50.0, 48.0)))]
    r = read(clear)  # mean 48.0, lowest seed 47.0: 3.7 points above 44.3
    assert claims_gate(r, "t") is None
    assert "| claim | paper |" in render_report(r, "x", {})
    near = read(rows("bl_base", "es", same((40.0, 50.0, 46.0))))  # every seed above, the mean only 1.7 points
    assert "46.0, lowest seed 46.0 vs majority class 44.3" in claims_gate(near, "t")
    unknown = read(clear, baselines=False)  # no baseline: shown, and said to be unchecked
    report = render_report(unknown, "x", {})
    assert "| claim | paper |" in report and "**t**: not checked in es (no majority-class baseline" in report


def test_a_lower_is_better_metric_is_marked_when_it_rises_not_when_it_falls():
    """Perplexity (a causal LM's second metric): falling with adaptation is the improvement; ↓ marks a rise."""
    data = [*rows("bl_base", "es", same((40.0, 47.0, 49.4))), *rows("bl_base", "tr", same((40.0, 47.0, 49.4))),
            *rows("bl_base", "es", same((900.0, 400.0, 300.0)), "perplexity"),
            *rows("bl_base", "tr", same((900.0, 950.0, 1000.0)), "perplexity")]
    res = read(data)
    ppl = res.secondary["t"]["perplexity"]
    assert ppl.sign("t") == -1.0 and res.sign("t") == 1.0
    assert not ppl.below_step0("bl_base", "t", "es") and ppl.below_step0("bl_base", "t", "tr")
    es, tr = table_other_metrics(res).split("| bl_base |")[1].split("|")[1:3]
    assert LOWERED not in es and LOWERED in tr  # es: 900 -> 300; tr: 900 -> 1000


# ---- issue 44: gates that mean something, claims that say what they rest on, a verdict per task -----------------

MAN = ("de", "es", "tr")


def man_rows(system: str, metric: str, scores: dict[str, tuple[float, ...]]) -> list[dict]:
    return [dict(r, task="man") for lang, s in scores.items() for r in rows(system, lang, same(s), metric)]


def manpages() -> list[dict]:
    """The man-page case: 6 sections, macro-F1 9-17 for every system, MiniJoint reaching BL_BASE's target in German
    alone (2x faster there), adaptation lowering scores; always answering the most frequent section: 28.6% accuracy
    in German, 2.2 macro-F1 (one label's F1 over six), which any model clears."""
    return [*man_rows("bl_base", "macro_f1", {"de": (10.0, 12.0, 13.0), "es": (15.0, 12.0, 11.0), "tr": (16.0, 12.0, 9.0)}),
            *man_rows("minijoint", "macro_f1", {"de": (10.0, 13.0, 13.5), "es": (15.0, 11.0, 10.0), "tr": (16.0, 11.0, 9.0)}),
            *man_rows("bl_base", "accuracy", {"de": (25.0, 26.0, 27.0), "es": (30.0, 29.0, 28.0), "tr": (31.0, 30.0, 29.0)}),
            *man_rows("minijoint", "accuracy", {"de": (25.0, 26.0, 28.0), "es": (30.0, 28.0, 27.0), "tr": (31.0, 29.0, 28.0)})]


MAN_BASELINES = {("man", lang): {"accuracy": acc, "macro_f1": 2.2, "chance/accuracy": acc, "chance/macro_f1": 16.4}
                 for lang, acc in zip(MAN, (28.6, 25.0, 24.0))}


def test_the_man_page_case_has_no_claims_and_says_so():
    r = results_from_rows(manpages(), {"man": "macro_f1"})
    r.set_baselines(MAN_BASELINES)
    why = claims_gate(r, "man")
    assert why and "de macro_f1 (13.0, lowest seed 13.0 vs input-blind predictor 16.4)" in why
    assert "de accuracy (27.0, lowest seed 27.0 vs majority class 28.6)" in why
    report = render_report(r, "man", {})
    assert "| claim | paper |" not in report and "**held**" not in report
    verdict_section = report.split("## Verdict")[1].split("\n## ")[0]
    assert "**man**: no answer on this task: bl_base's final score does not beat" in verdict_section
    assert "| best input-blind predictor: macro_f1 | 16.4 | 16.4 | 16.4 | 16.4 |" in report
    assert "verdict: man: no answer on this task" in summary_text(r)


def test_a_speedup_resting_on_one_language_of_three_is_exploratory_and_names_it():
    """BL_BASE clears every baseline; MiniJoint reaches the target twice as fast in German and never elsewhere."""
    data = [*man_rows("bl_base", "macro_f1", {lang: (20.0, 40.0, 60.0) for lang in MAN}),
            *man_rows("minijoint", "macro_f1", {"de": (20.0, 58.0, 59.0), "es": (20.0, 30.0, 40.0),
                                                 "tr": (20.0, 30.0, 40.0)})]
    r = results_from_rows(data, {"man": "macro_f1"})
    r.set_baselines(MAN_BASELINES)
    assert claims_gate(r, "man") is None
    report = render_report(r, "man", {})
    row = next(line for line in report.splitlines() if line.startswith("| MiniJoint"))
    assert "**exploratory**" in row and "| de (1 of 3) |" in row and "**held**" not in row
    assert "minijoint: **exploratory**: reached BL_BASE's target with less step-2 compute in de (1 of 3 languages " \
           "that count); never reached it in es, tr" in report
    everywhere = [*man_rows("bl_base", "macro_f1", {lang: (20.0, 40.0, 60.0) for lang in MAN}),
                  *man_rows("minijoint", "macro_f1", {lang: (20.0, 58.0, 59.0) for lang in MAN})]
    r = results_from_rows(everywhere, {"man": "macro_f1"})
    r.set_baselines(MAN_BASELINES)
    report = render_report(r, "man", {})
    row = next(line for line in report.splitlines() if line.startswith("| MiniJoint"))
    assert "**held**" in row and "| de, es, tr (3 of 3) |" in row
    assert "minijoint: **yes**: reached BL_BASE's target with less step-2 compute in de, es, tr (3 of 3" in report


def test_english_rows_carry_their_baseline_and_marks():
    english = [{"system": s, "body": "primary", "task": "t", "lang": "en", "seed": seed, "step": -1, "flops": 0.0,
                "v100_days": 0.0, "split": "test", "metric": "macro_f1", "value": v}
               for s, values in (("bl_base", (50.0, 52.0, 54.0)), ("minipost", (30.0, 46.0, 50.0)))
               for seed, v in zip((1, 2, 3), values)]
    r = results_from_rows([*own_task(), *english], {"t": "macro_f1"})
    r.set_baselines({**BASELINES, ("t", "en"): {"accuracy": 80.0, "macro_f1": 44.4}})
    table = render_report(r, "mytask", {}).split("## English (Table 5)")[1]
    assert "| bl_base | 52.0 ± 2.0 (n=3) |" in table  # every seed above 44.4: no mark
    assert f"| minipost | 42.0 ± 10.6 (n=3) {BELOW} |" in table
    assert "| majority class (train) | 44.4 |" in table
