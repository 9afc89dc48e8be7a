"""The paper's tables from ``Results``: final scores and step-2 cost (Table 2), the majority-class baselines, V100-days
to near-maximal performance (Table 3), the speedup over BL_BASE (Figure 1 in numbers), the depth of the secondary
head (Table 4) and the English scores (Table 5), each as Markdown (one block per task)."""

from __future__ import annotations

import math
from statistics import fmean as mean

from minimodel.flops import v100_days
from minimodel.report.curves import Speedup, mean_days, speedups
from minimodel.report.formatting import (
    AT_STEP0,
    BELOW,
    MISSING,
    NO_TARGET,
    SEED_BELOW,
    fmt_days,
    fmt_interval,
    fmt_n,
    fmt_score,
    fmt_speedup,
    fmt_stat,
    markdown_table,
    mean_or_none,
    task_title,
)
from minimodel.report.intervals import time_to_target_interval
from minimodel.report.marks import score_marks, speedup_text, target_mark
from minimodel.report.reading import NEAR_MAX, REFERENCE, SWEEP, Results, sort_systems
from minimodel.report.statistics import Stat


def table_final(res: Results) -> str:
    """Table 2: score at the last adaptation checkpoint per language, average, and step-2 cost per language."""
    blocks = []
    for task in res.tasks:
        langs = res.langs(task)
        rows = []
        for system in res.main_systems:
            finals = [res.final(system, task, lang) for lang in langs]
            if all(p is None for p in finals):
                continue
            have = [p for p in finals if p is not None]
            flops = mean(p.flops for p in have)
            rows.append([system, fmt_n(res.seeds_of(system, task)),
                         *(fmt_stat(res.final_stat(system, task, lang)) + score_marks(res, system, task, lang)
                           for lang in langs),
                         fmt_stat(res.average_stat(system, task)), fmt_days(flops / 1e18), fmt_days(v100_days(flops))])
        base = [res.baselines.get((task, lang)) for lang in langs]
        if any(b is not None for b in base):
            rows.append(["majority class (train)", "", *(fmt_score(b) for b in base), fmt_score(mean_or_none(base)),
                         "", ""])
        targets = [res.target(task, lang) for lang in langs]
        if any(t is not None for t in targets):
            kept = [t for lang, t in zip(langs, targets) if not res.target_flag(task, lang)]  # ⊘: not averaged
            rows.append([f"target ({NEAR_MAX:.0%} of {REFERENCE})", "",
                         *(fmt_score(t) + target_mark(res, task, lang) for lang, t in zip(langs, targets)),
                         fmt_score(mean_or_none(kept)), "", ""])
        blocks.append(task_title(res, task) + "\n\n"
                      + markdown_table(["system", "n", *langs, "avg", "EFLOPs", "V100-days"], rows))
    return "\n\n".join(blocks)


def table_other_metrics(res: Results) -> str | None:
    """Table 2's final scores in every other scalar metric of each task (accuracy beside macro-F1, ...), marked
    against that metric's own majority-class baseline and step-0 score; None when a task has only its main metric."""
    blocks = []
    for task in res.tasks:
        for metric, other in sorted(res.secondary.get(task, {}).items()):
            langs = other.langs(task)
            rows = [[system, fmt_n(other.seeds_of(system, task)),
                     *(fmt_stat(other.final_stat(system, task, lang)) + score_marks(other, system, task, lang)
                       for lang in langs), fmt_stat(other.average_stat(system, task))]
                    for system in other.main_systems]
            base = [other.baselines.get((task, lang)) for lang in langs]
            if any(b is not None for b in base):
                rows.append(["majority class (train)", "", *(fmt_score(b) for b in base), fmt_score(mean_or_none(base))])
            blocks.append(f"**{task}** ({metric})\n\n" + markdown_table(["system", "n", *langs, "avg"], rows))
    return "\n\n".join(blocks) or None


def table_baselines(res: Results) -> str | None:
    """Per task: every metric of the majority-class baseline per language, and each system's main-metric score
    before adaptation (step 0: the unadapted, overlap-initialised embeddings). None when there is neither."""
    blocks = []
    for task in res.tasks:
        langs = res.langs(task)
        rows = []
        names = sorted({m for (t, _), v in res.baseline_metrics.items() if t == task for m in v
                        if not m.startswith("confusion/")}, key=lambda m: (m != res.metrics.get(task), m))
        for m in names:
            base = [res.baseline_metrics.get((task, lang), {}).get(m) for lang in langs]
            rows.append([f"majority class (train): {m}", *(fmt_score(b) for b in base), fmt_score(mean_or_none(base))])
        for m in sorted({m for (t, _), v in res.chance_metrics.items() if t == task for m in v},
                        key=lambda m: (m != res.metrics.get(task), m)):
            base = [res.chance_metrics.get((task, lang), {}).get(m) for lang in langs]
            rows.append([f"best input-blind predictor: {m}", *(fmt_score(b) for b in base),
                         fmt_score(mean_or_none(base))])
        for system in res.main_systems:
            step0 = [res.step0_stat(system, task, lang) for lang in langs]
            if any(x is not None for x in step0):
                rows.append([f"{system} at step 0 ({res.metrics.get(task, '?')})", *(fmt_stat(x) for x in step0),
                             fmt_score(mean_or_none([None if x is None else x.mean for x in step0]))])
        if rows:
            blocks.append(task_title(res, task) + "\n\n" + markdown_table(["baseline", *langs, "avg"], rows))
    return "\n\n".join(blocks) or None


def days_average(res: Results, system: str, task: str) -> tuple[str, str]:
    """The V100-days to target averaged over the task's languages (``curves.mean_days``) as a table cell, and, when it
    is not a number, which languages make it so (``∞ in es; at step 0 in tr; target ⊘ in tr``). One rule wherever
    an average of days is shown (Tables 3 and 4, the summary): ∞ when no language ever reaches the target, *at step
    0* when every one does before any adaptation, — when a language is missing or its time cannot be averaged."""
    langs = res.langs(task)
    days = [res.days_to_target(system, task, lang) for lang in langs]
    if not langs or any(d is None for d in days):
        return MISSING, ""
    flawed = {lang for lang in langs if res.target_flag(task, lang)}
    if flawed == set(langs):
        return NO_TARGET, f"target {NO_TARGET} in {', '.join(sorted(flawed))}"
    if not flawed and all(res.at_step0(system, task, lang) for lang in langs):
        return AT_STEP0, ""
    value = mean_days([math.nan if lang in flawed else d for lang, d in zip(langs, days)])  # type: ignore[misc]
    if not math.isnan(value):
        return fmt_days(value), ""
    why = [(f"{what} in " + ", ".join(ls)) for what, ls in (
        ("∞", [lang for lang, d in zip(langs, days) if d is not None and math.isinf(d)]),
        (AT_STEP0, [lang for lang, d in zip(langs, days) if d is not None and d <= 0]),
        (f"target {NO_TARGET}", sorted(flawed))) if ls]
    return MISSING, "; ".join(why)


def table_time(res: Results) -> str | None:
    """Table 3: V100-days to near-maximal performance per language; None without BL_BASE."""
    if not any(s == REFERENCE for s, _, _ in res.curves):
        return None
    blocks = []
    for task in res.tasks:
        langs = res.langs(task)
        rows, notes = [], []
        for system in res.main_systems:
            days = [res.days_to_target(system, task, lang) for lang in langs]
            if all(d is None for d in days):
                continue
            ci = time_to_target_interval(res, system, task)
            avg, why = days_average(res, system, task)
            rows.append([system, *(AT_STEP0 if res.at_step0(system, task, lang) else fmt_days(d)
                                   for lang, d in zip(langs, days)),
                         avg, fmt_interval(None if ci is None else ci.days)])
            if why:
                notes.append(f"- {system}: no average ({why})")
        header = ["system", *(lang + target_mark(res, task, lang) for lang in langs), "avg", "95% interval"]
        blocks.append(task_title(res, task) + "\n\n" + markdown_table(header, rows)
                      + "".join(f"\n{n}" if i else f"\n\n{n}" for i, n in enumerate(notes)))
    return "\n\n".join(blocks)


def system_speedup(res: Results, system: str, task: str) -> Speedup:
    """The speedup of ``system`` over BL_BASE on ``task`` from their V100-days to target per language; languages with
    an uninformative target (⊘) are left out."""
    langs = res.langs(task)
    def days(s: str) -> dict[str, float]:
        return {lang: d for lang in langs if (d := res.days_to_target(s, task, lang)) is not None}
    return speedups(days(REFERENCE), days(system), skip={lang for lang in langs if res.target_flag(task, lang)})


def table_speedup(res: Results) -> str | None:
    """Figure 1 in numbers: average speedup of each system over BL_BASE per task; None without BL_BASE."""
    if not any(s == REFERENCE for s, _, _ in res.curves):
        return None
    systems = [s for s in res.main_systems if s != REFERENCE]
    if not systems:
        return None
    rows, notes = [], []
    for system in systems:
        cells = []
        for task in res.tasks:
            sp = system_speedup(res, system, task)
            ci = time_to_target_interval(res, system, task)
            cells.append(speedup_text(res, system, task, sp, ci))
            if sp.excluded:
                notes.append(f"{system} / {task}: {len(sp.excluded)} language(s) excluded (∞: the target is never "
                             f"reached by one side): {', '.join(sp.excluded)}")
            if sp.undefined:
                notes.append(f"{system} / {task}: speedup undefined in {', '.join(sp.undefined)}: the target is met "
                             f"at step 0 by one side (it is at or below the score of the unadapted embeddings), so "
                             f"there is no adaptation compute to compare; left out of the mean")
            if sp.no_target:
                notes.append(f"{system} / {task}: {NO_TARGET} target at or below the baseline in "
                             f"{', '.join(sp.no_target)} (reaching it means nothing); left out of the mean")
        rows.append([system, *cells])
    text = markdown_table(["system", *res.tasks], rows)
    if notes:
        text += "\n\n" + "\n".join(f"- {n}" for n in notes)
    return text


def _depth_name(label: str) -> str:
    m = SWEEP.match(label)
    if not m:
        return label
    return f"{m['base']} N={m['depth']}" + (" (multi-head)" if m["sep"] == "@l" else "")


def table_depth(res: Results) -> str | None:
    """Table 4: V100-days to near-maximal performance per secondary-head depth N; None without a sweep."""
    sweep = res.sweep_systems
    if not sweep or not any(s == REFERENCE for s, _, _ in res.curves):
        return None
    columns = [s for s in [REFERENCE] if any(k[0] == s for k in res.curves)] + sweep
    names = [s if s == REFERENCE else _depth_name(s) for s in columns]
    blocks = []
    for task in res.tasks:
        langs = res.langs(task)
        days = {s: [res.days_to_target(s, task, lang) for lang in langs] for s in columns}
        rows = [[lang + target_mark(res, task, lang),
                 *(AT_STEP0 if res.at_step0(s, task, lang) else fmt_days(days[s][i]) for s in columns)]
                for i, lang in enumerate(langs)]
        averages = {s: days_average(res, s, task) for s in columns}
        rows.append(["avg", *(averages[s][0] for s in columns)])
        rows.append(["speedup", *(MISSING if s == REFERENCE else fmt_speedup(system_speedup(res, s, task).mean)
                                  for s in columns)])
        notes = "".join(f"\n- {name}: no average ({averages[s][1]})" for s, name in zip(columns, names) if averages[s][1])
        blocks.append(task_title(res, task) + "\n\n" + markdown_table(["language", *names], rows)
                      + (f"\n{notes}" if notes else ""))
    return "\n\n".join(blocks)


def table_english(res: Results) -> str | None:
    """Table 5: English test scores of each finetuned primary model and of MiniJoint's mini-model."""
    if not res.english:
        return None
    tasks = sorted({t for _, _, t in res.english})
    order = sort_systems({s for s, _, _ in res.english})
    keys = sorted({(s, b) for s, b, _ in res.english}, key=lambda k: (order.index(k[0]), k[1] != "primary", k[1]))
    base = {t: english_baseline(res, t) for t in tasks}
    rows = [[s if b == "primary" else f"{s} ({b})",
             *(fmt_stat(res.english_stats.get((s, b, t))) + _n(res.english_stats.get((s, b, t)))
               + _english_marks(res, (s, b, t), base[t]) for t in tasks)]
            for s, b in keys]
    if any(v is not None for v in base.values()):
        rows.append(["majority class (train)", *(fmt_score(base[t]) for t in tasks)])
    return markdown_table(["model", *(f"{t} ({res.metrics.get(t, '?')})" for t in tasks)], rows)


def english_baseline(res: Results, task: str) -> float | None:
    """The majority-class baseline of the task's source-language test set (the language of its English rows),
    where known."""
    source = res.source_langs.get(task)
    return None if source is None else res.baselines.get((task, source))


def _english_marks(res: Results, key: tuple[str, str, str], base: float | None) -> str:
    """▼ when the mean English score does not beat the majority class, ▽ when a seed does not (as Table 2)."""
    values, k = list(res.english_by_seed.get(key, {}).values()), res.sign(key[2])
    if base is None or not values:
        return ""
    if k * mean(values) <= k * base + 1e-9:
        return f" {BELOW}"
    return f" {SEED_BELOW}" if any(k * v <= k * base + 1e-9 for v in values) else ""


def _n(x: Stat | None) -> str:
    return "" if x is None else f" (n={x.n})"
