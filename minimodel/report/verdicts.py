"""One line per task saying, in plain words, whether each mini-model system reached BL_BASE's target with less
step-2 compute in the languages that count, or why the question has no answer on that task. The report's first
section and the console summary print them. Nothing here imports torch."""

from __future__ import annotations

from minimodel.report.curves import Speedup
from minimodel.report.formatting import FELL_BACK, NO_TARGET
from minimodel.report.marks import claims_gate, falling_back
from minimodel.report.reading import REFERENCE, Results
from minimodel.report.tables import system_speedup


def system_verdict(res: Results, system: str, task: str) -> str:
    """``system``'s answer on ``task``: where it reached BL_BASE's target with less compute (a per-language speedup
    above 1), where with more, where never, and whether that rests on at least half of the languages that count."""
    langs = res.langs(task)
    sp: Speedup = system_speedup(res, system, task)
    counted = [lang for lang in langs if lang not in sp.no_target]
    if not counted:
        return f"{system}: no answer (every target is {NO_TARGET}: at or below the baseline)"
    faster = [lang for lang in sp.used  # both reach the target there after some adaptation: days are numbers
              if res.days_to_target(system, task, lang) < res.days_to_target(REFERENCE, task, lang)]  # type: ignore[operator]
    slower = [lang for lang in sp.used if lang not in faster]
    never = [lang for lang in sp.excluded if res.days_to_target(system, task, lang) == float("inf")]
    parts = []
    if faster:
        parts.append(f"reached BL_BASE's target with less step-2 compute in {', '.join(faster)} ({len(faster)} of "
                     f"{len(counted)} languages that count)")
    if slower:
        parts.append(f"with as much or more in {', '.join(slower)}")
    if never:
        parts.append(f"never reached it in {', '.join(never)}")
    if sp.undefined:
        parts.append(f"reached it before any update in {', '.join(sp.undefined)} (no speedup)")
    back = falling_back(res, system, task, sp)
    if back:
        parts.append(f"{FELL_BACK} fell back below it later in {', '.join(back)}")
    if not parts:
        return f"{system}: no answer (no language where both it and {REFERENCE} reach the target)"
    # yes: with less compute in at least half of the languages that count; exploratory: in fewer; no: in none
    verdict = "yes" if 2 * len(faster) >= len(counted) else "exploratory" if faster else "no"
    return f"{system}: **{verdict}**: " + "; ".join(parts)


def task_verdicts(res: Results) -> list[str]:
    """One line per task: ``task: no answer: why``, or each mini-model system's ``system_verdict``."""
    lines = []
    for task in res.tasks:
        if not any(s == REFERENCE and t == task for s, t, _ in res.curves):
            lines.append(f"**{task}**: no answer: no {REFERENCE} results, so no target to reach")
            continue
        why = claims_gate(res, task)
        if why:
            lines.append(f"**{task}**: no answer on this task: {why}")
            continue
        flagged = [lang for lang in res.langs(task) if res.target_flag(task, lang)]
        systems = [s for s in res.main_systems if s != REFERENCE]
        if not systems:
            lines.append(f"**{task}**: only {REFERENCE}: nothing to compare")
            continue
        note = f" ({NO_TARGET} left out: {', '.join(flagged)})" if flagged else ""
        lines.append(f"**{task}**{note}: " + "; ".join(system_verdict(res, s, task) for s in systems))
    return lines


def verdict_section(res: Results) -> list[str]:
    """The report's first section: ``task_verdicts`` with the rule they follow (nothing without curves)."""
    if not res.curves:
        return []
    return ["## Verdict", "", "Per task, whether each mini-model system reached BL_BASE's target (95% of its final "
            "score) with less step-2 compute in the languages that count (**yes**: in at least half of them; "
            "**exploratory**: in fewer; **no**: in none), or why the question has no answer there.", "",
            *(line + "\n" for line in task_verdicts(res))]
