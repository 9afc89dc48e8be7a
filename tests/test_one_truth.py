"""One truth in the console summary and the report (issue 55, part 3): a speedup carries the languages it rests on
and the claims table's word for it, never "faster" where the task's verdict is "no answer"; one chance bar (the better
of the majority class and the input-blind predictor) for the ⊘ of a target; a speedup whose system falls back below
the target later is marked (⤵). Checked on hand-made results rows reproducing the issue's case: a 7-class genre
task, macro-F1, French, Spanish and German tests, three seeds."""

from __future__ import annotations

import re

from minimodel.report.claims import claims
from minimodel.report.document import render_report, summary_text
from minimodel.report.formatting import FELL_BACK, NO_TARGET
from minimodel.report.marks import NO_ANSWER, claims_gate
from minimodel.report.reading import results_from_rows
from minimodel.report.tables import system_speedup, table_final, table_speedup
from minimodel.report.verdicts import task_verdicts

STEPS = (0, 10, 20, 30)
TASK = "genre"


def rows(system: str, lang: str, scores: tuple[float, ...]) -> list[dict]:
    """Three seeds around ``scores`` (at STEPS; seed 1 lower, seed 3 higher, most in the middle of the curve), 1e-8
    V100-days per step."""
    return [{"system": system, "body": "primary", "task": TASK, "lang": lang, "seed": seed, "step": step,
             "flops": step * 1e10, "v100_days": step * 1e-8, "split": "test", "metric": "macro_f1",
             "value": v + (seed - 2) * (0.6 if step in (10, 20) else 0.3)}
            for seed in (1, 2, 3) for step, v in zip(STEPS, scores)]


def baselines(langs: tuple[str, ...]) -> dict:
    """Guessing at the training frequencies scores 14.2 macro-F1, always the majority class 3.6."""
    return {(TASK, lang): {"macro_f1": 3.6, "chance/macro_f1": 14.2} for lang in langs}


# Spanish: BL_BASE reaches its target (95% of 30 = 28.5) between steps 20 and 30, MiniPost between 10 and 20 and
# falls back below it at step 30. German: MiniPost never reaches it. A third language, "it", like German.
SPANISH = [*rows("bl_base", "es", (10.0, 20.0, 25.0, 30.0)), *rows("minipost", "es", (10.0, 25.0, 29.5, 27.0))]
GERMAN = [*rows("bl_base", "de", (10.0, 20.0, 25.0, 30.0)), *rows("minipost", "de", (10.0, 20.0, 24.0, 25.0))]
ITALIAN = [r | {"lang": "it"} for r in GERMAN]
# French: BL_BASE ends at 14.53 (target 13.8): below the input-blind predictor's 14.2, far above the majority class
FRENCH = [*rows("bl_base", "fr", (5.0, 10.0, 13.0, 14.53)), *rows("minipost", "fr", (5.0, 14.0, 14.5, 14.6))]


def read(data: list[dict], langs: tuple[str, ...]):
    res = results_from_rows(data, {TASK: "macro_f1"})
    res.set_baselines(baselines(langs))
    return res


def summary_cell(text: str, system: str) -> str:
    """The speedup of ``system``'s summary line, from the speedup column on."""
    line = next(x for x in text.splitlines() if re.match(rf"{TASK}\s+{system}\s", x))
    m = re.search(r"(\S+×)\s+(\(.*)$", line)
    assert m is not None, line
    return f"{m[1]} {m[2]}"


def table_cell(report: str, system: str) -> str:
    return next(x for x in report.splitlines() if x.startswith(f"| {system} | ") and "×" in x).split(" | ")[1].removesuffix(" |")


def test_a_target_below_the_input_blind_predictor_is_no_target_everywhere():
    res = read([*SPANISH, *GERMAN, *FRENCH], ("es", "de", "fr"))
    assert res.chance_bar(TASK, "fr") == 14.2
    assert res.target_flag(TASK, "fr") == "target 13.8 ≤ input-blind predictor 14.2"
    assert f"13.8 {NO_TARGET}" in table_final(res)
    sp = system_speedup(res, "minipost", TASK)
    assert sp.no_target == ("fr",) and sp.used == ("es",) and sp.excluded == ("de",)
    text, report = summary_text(res), render_report(res, "genre", {})
    assert f"{NO_TARGET} target at or below the baseline (left out of speedups and averages of days): {TASK}: fr " \
           "(target 13.8 ≤ input-blind predictor 14.2)" in text
    assert f"{TASK}: fr (target 13.8 ≤ input-blind predictor 14.2)." in report


def test_summary_report_and_verdict_agree_where_the_task_has_no_answer():
    """The issue's case: MiniPost is 1.8× faster in Spanish alone, and the task's verdict is "no answer" (BL_BASE
    does not beat the input-blind predictor clearly in French): no line says "faster" or "held"."""
    res = read([*SPANISH, *GERMAN, *FRENCH], ("es", "de", "fr"))
    assert claims_gate(res, TASK) is not None
    verdict = task_verdicts(res)[0]
    assert verdict.startswith(f"**{TASK}**: no answer on this task")
    text, report = summary_text(res), render_report(res, "genre", {})
    cell = summary_cell(text, "minipost")
    assert cell == table_cell(report, "minipost")  # the console says what the report's table says
    assert cell.startswith(f"{system_speedup(res, 'minipost', TASK).mean:.3g}× (1/2 langs) [")
    assert cell.endswith(f": {NO_ANSWER} {FELL_BACK} falls back below the target later in es")
    assert "faster" not in text and "held" not in cell and "faster" not in table_speedup(res)
    assert "verdict: genre: no answer on this task" in text


def test_summary_report_and_claims_agree_where_the_claims_are_read():
    """Without French the claims are read: the speedup rests on Spanish, 1 of the 3 languages that count, so it is
    *exploratory* in the claims table, the report's speedup table and the console summary alike (MiniJoint: the same
    curves as MiniPost, for claim 1), and the verdict says so too; ⤵ marks the fall back in Spanish."""
    data = [*SPANISH, *GERMAN, *ITALIAN]
    data += [r | {"system": "minijoint"} for r in data if r["system"] == "minipost"]
    res = read(data, ("es", "de", "it"))
    assert claims_gate(res, TASK) is None
    claim1 = claims(res, TASK, reps=300)[0]
    assert claim1.verdict == "exploratory" and claim1.langs == ("es",)
    assert "1/3 langs reach the target" in claim1.ours
    text, report = summary_text(res), render_report(res, "genre", {})
    for system in ("minijoint", "minipost"):
        cell = summary_cell(text, system)
        assert cell == table_cell(report, system)
        assert " (1/3 langs) [" in cell and ": exploratory " in cell and cell.endswith(f"{FELL_BACK} falls back "
                                                                                       "below the target later in es")
    row = next(x for x in report.splitlines() if x.startswith("| MiniJoint reaches 95%"))
    assert "**exploratory**" in row  # the claims table, in the same report
    assert "minipost: **exploratory**" in task_verdicts(res)[0]
    assert f"{FELL_BACK} fell back below it later in es" in task_verdicts(res)[0]
    assert "faster" not in text
