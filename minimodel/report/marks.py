"""What the report marks, and what it holds back because of it: final scores that do not beat the majority-class
baseline (the mean: ▼; a seed: ▽), final scores below the system's own step-0 score (↓), targets at or below the
baseline (⊘), and whether the paper's claims can be read on a task at all. Nothing here imports torch."""

from __future__ import annotations

from collections.abc import Sequence

from minimodel.report.curves import Speedup
from minimodel.report.formatting import (
    BELOW,
    FELL_BACK,
    LOWERED,
    NO_TARGET,
    SEED_BELOW,
    speedup_cell,
    speedup_interval,
    speedup_verdict,
)
from minimodel.report.intervals import TimeToTarget
from minimodel.report.reading import REFERENCE, Results

CLAIMS_MARGIN = 2.0  # points of the main metric by which BL_BASE's mean final score must beat the majority class


def score_marks(res: Results, system: str, task: str, lang: str) -> str:
    """The marks of a final score: ``▼`` (the mean does not beat the majority-class baseline) or ``▽`` (the mean does,
    a seed does not: at least as strict as asking the bootstrap interval of the mean to beat it, since no resampled
    mean is below the lowest seed), and ``↓`` (below the system's own step-0 score); "" when none applies."""
    marks = []
    if res.below_baseline(system, task, lang):
        marks.append(BELOW)
    elif res.seed_below_baseline(system, task, lang):
        marks.append(SEED_BELOW)
    if res.below_step0(system, task, lang):
        marks.append(LOWERED)
    return "".join(f" {m}" for m in marks)


def target_mark(res: Results, task: str, lang: str) -> str:
    return f" {NO_TARGET}" if res.target_flag(task, lang) else ""


def flagged(res: Results, mark: str, metric: str | None = None) -> str:
    """``system / task: langs; ...`` for every final score carrying ``mark`` (▼, ▽ or ↓); ``res`` may be a secondary
    metric's results, named by ``metric`` (``system / task (accuracy): langs``). "" when none does."""
    test = {BELOW: res.below_baseline, SEED_BELOW: lambda s, t, x: not res.below_baseline(s, t, x)
            and res.seed_below_baseline(s, t, x), LOWERED: res.below_step0}[mark]
    parts = []
    for task in res.tasks:
        for system in res.systems:
            langs = [lang for lang in res.langs(task) if test(system, task, lang)]
            if langs:
                parts.append(f"{system} / {task}{f' ({metric})' if metric else ''}: {', '.join(langs)}")
    return "; ".join(parts)


def flagged_all(res: Results, mark: str) -> str:
    """``flagged`` over the main metric, then every other scalar metric of each task."""
    parts = [flagged(res, mark)] + [flagged(other, mark, metric) for by_metric in res.secondary.values()
                                    for metric, other in by_metric.items()]
    return "; ".join(p for p in parts if p)


def flagged_targets(res: Results) -> str:
    """``task: lang (target 43.2 ≤ majority class 44.3); ...`` for every uninformative target ("" if none)."""
    return "; ".join(f"{task}: {lang} ({why})" for task in res.tasks for lang in res.langs(task)
                     if (why := res.target_flag(task, lang)))


def gate_baseline(res: Results, task: str, lang: str) -> float | None:
    """The score BL_BASE must beat clearly in ``res``'s metric for the claims to be read: the better of the majority
    class and the best input-blind predictor (``task_metrics.chance_scores``: a constant label or labels drawn at the
    training frequencies), where known."""
    return res.chance_bar(task, lang)


GATE_RULE = (f"in every language and in every metric shown, {REFERENCE}'s final score beats the better of the "
             f"majority class and the best input-blind predictor (any constant label, or labels drawn at the training "
             f"frequencies) clearly: every seed beats it, and the mean by at least {CLAIMS_MARGIN:g} points")
"""The claims gate, in the report's words."""


def claims_gate(res: Results, task: str) -> str | None:
    """Why the paper's claims are not read on ``task`` (None: they are). The rule (``GATE_RULE``): in every language
    of the task and in every scalar metric the report shows (the main one and ``res.secondary``'s), BL_BASE's final
    score beats ``gate_baseline`` clearly, i.e. every seed beats it and the mean beats it by at least
    ``CLAIMS_MARGIN`` points. A language without a known baseline is not checked (``unchecked``)."""
    weak = []
    for metric, r in [(res.metrics.get(task, "?"), res), *res.secondary.get(task, {}).items()]:
        for lang in r.langs(task):
            base, final = gate_baseline(r, task, lang), r.final_stat(REFERENCE, task, lang)
            if base is None or final is None or r.sign(task) < 0:
                continue
            lowest = min(r.final_values(REFERENCE, task, lang))
            if lowest <= base + 1e-9 or final.mean < base + CLAIMS_MARGIN - 1e-9:
                seed = f", lowest seed {lowest:.1f}" if final.n > 1 else ""
                which = "majority class" if base == r.baselines.get((task, lang)) else "input-blind predictor"
                weak.append(f"{lang} {metric} ({final.mean:.1f}{seed} vs {which} {base:.1f})")
    if not weak:
        return None
    return (f"{REFERENCE}'s final score does not beat the better of the majority class and the best input-blind "
            f"predictor clearly in {', '.join(weak)}: the claims compare scores near chance there")


def unchecked(res: Results, task: str) -> list[str]:
    """The languages of ``task`` where the claims gate could not be checked (no baseline or no BL_BASE score)."""
    return [lang for lang in res.langs(task)
            if res.baselines.get((task, lang)) is None or res.final(REFERENCE, task, lang) is None]


NO_ANSWER = "no answer on this task"
"""A speedup's word on a task where the claims gate fails (``claims_gate``): the task's verdict says the same."""


def counted(sp: Speedup, langs: Sequence[str]) -> list[str]:
    """The languages that count for a speedup: the task's languages whose target is not ⊘."""
    return [lang for lang in langs if lang not in sp.no_target]


def rested(v: str, sp: Speedup, langs: Sequence[str]) -> str:
    """A speedup's verdict over the languages it rests on (those reaching the target, ``sp.used``): *held* over fewer
    than half of the languages that count (``counted``) is *exploratory*, never *held*. The claims table, the speedup
    table, the verdict and the console summary all read a speedup by this rule."""
    return "exploratory" if v == "held" and 2 * len(sp.used) < len(counted(sp, langs)) else v


WORDS = {"faster": "held", "slower": "not held", "inconclusive (interval spans 1)": "inconclusive"}
"""``formatting.speedup_verdict``'s reading of a speedup interval, in the claims table's words."""


def speedup_word(res: Results, system: str, task: str, sp: Speedup, tt: TimeToTarget | None) -> str:
    """The word a speedup carries wherever it is shown, the claims table's: *no answer on this task* where the claims
    gate fails there (the verdict's "no answer"), else *held* / *not held* / *inconclusive* from its interval
    (above, below or spanning 1), *held* over fewer than half of the languages that count being *exploratory*;
    why there is no interval otherwise."""
    if claims_gate(res, task):
        return NO_ANSWER
    v = speedup_verdict(tt)
    return rested(WORDS.get(v, v), sp, res.langs(task))


def falling_back(res: Results, system: str, task: str, sp: Speedup) -> list[str]:
    """The languages a speedup rests on (``sp.used``) where ``system`` falls back below the target later."""
    return [lang for lang in sp.used if res.falls_back(system, task, lang)]


def speedup_text(res: Results, system: str, task: str, sp: Speedup, tt: TimeToTarget | None) -> str:
    """A speedup as the report's table and the console summary both write it: the mean, the languages it rests on of
    those that count (``(1/3 langs)``), the interval and ``speedup_word``, then ⤵ naming the languages where the
    system falls back below the target later: ``1.86× (1/3 langs) [1.15×, 2.98×]: no answer on this task``."""
    langs = counted(sp, res.langs(task))
    text = speedup_cell(sp) + (f" ({len(sp.used)}/{len(langs)} langs)" if sp.used else "")
    word, interval = speedup_word(res, system, task, sp, tt), speedup_interval(tt)
    if interval.startswith("("):  # no interval: why, and that the task has no answer where it has none
        text += f" ({interval[1:-1]}" + (f"; {NO_ANSWER})" if word == NO_ANSWER else ")")
    else:
        text += f" {interval.rsplit(': ', 1)[0]}: {word}"
    back = falling_back(res, system, task, sp)
    return text + (f" {FELL_BACK} falls back below the target later in {', '.join(back)}" if back else "")
