"""The paper's tables from ``Results``: final scores and step-2 cost (Table 2), the majority-class baselines, V100-days
to near-maximal performance (Table 3), the speedup over BL_BASE (Figure 1 in numbers), the depth of the secondary
head (Table 4) and the English scores (Table 5), each as Markdown (one block per task)."""

from __future__ import annotations

from statistics import fmean as mean

from minimodel.flops import v100_days
from minimodel.report.curves import Speedup, speedups
from minimodel.report.formatting import (
    AT_STEP0,
    BELOW,
    MISSING,
    fmt_days,
    fmt_interval,
    fmt_n,
    fmt_score,
    fmt_speedup,
    fmt_stat,
    markdown_table,
    mean_or_none,
    speedup_cell,
    speedup_interval,
    task_title,
)
from minimodel.report.intervals import time_to_target_interval
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
                         *(fmt_stat(res.final_stat(system, task, lang))
                           + (f" {BELOW}" if res.below_baseline(system, task, lang) else "") for lang in langs),
                         fmt_stat(res.average_stat(system, task)), fmt_days(flops / 1e18), fmt_days(v100_days(flops))])
        base = [res.baselines.get((task, lang)) for lang in langs]
        if any(b is not None for b in base):
            rows.append(["majority class (train)", "", *(fmt_score(b) for b in base), fmt_score(mean_or_none(base)),
                         "", ""])
        targets = [res.target(task, lang) for lang in langs]
        if any(t is not None for t in targets):
            rows.append([f"target ({NEAR_MAX:.0%} of {REFERENCE})", "", *(fmt_score(t) for t in targets),
                         fmt_score(mean_or_none(targets)), "", ""])
        blocks.append(task_title(res, task) + "\n\n"
                      + markdown_table(["system", "n", *langs, "avg", "EFLOPs", "V100-days"], rows))
    return "\n\n".join(blocks)


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
        for system in res.main_systems:
            step0 = [res.step0_stat(system, task, lang) for lang in langs]
            if any(x is not None for x in step0):
                rows.append([f"{system} at step 0 ({res.metrics.get(task, '?')})", *(fmt_stat(x) for x in step0),
                             fmt_score(mean_or_none([None if x is None else x.mean for x in step0]))])
        if rows:
            blocks.append(task_title(res, task) + "\n\n" + markdown_table(["baseline", *langs, "avg"], rows))
    return "\n\n".join(blocks) or None


def table_time(res: Results) -> str | None:
    """Table 3: V100-days to near-maximal performance per language; None without BL_BASE."""
    if not any(s == REFERENCE for s, _, _ in res.curves):
        return None
    blocks = []
    for task in res.tasks:
        langs = res.langs(task)
        rows = []
        for system in res.main_systems:
            days = [res.days_to_target(system, task, lang) for lang in langs]
            if all(d is None for d in days):
                continue
            ci = time_to_target_interval(res, system, task)
            rows.append([system, *(AT_STEP0 if res.at_step0(system, task, lang) else fmt_days(d)
                                   for lang, d in zip(langs, days)),
                         AT_STEP0 if all(res.at_step0(system, task, lang) for lang in langs)
                         else fmt_days(mean_or_none(days)),
                         fmt_interval(None if ci is None else ci.days)])
        blocks.append(task_title(res, task) + "\n\n" + markdown_table(["system", *langs, "avg", "95% interval"], rows))
    return "\n\n".join(blocks)


def system_speedup(res: Results, system: str, task: str) -> Speedup:
    """The speedup of ``system`` over BL_BASE on ``task`` from their V100-days to target per language."""
    langs = res.langs(task)
    def days(s: str) -> dict[str, float]:
        return {lang: d for lang in langs if (d := res.days_to_target(s, task, lang)) is not None}
    return speedups(days(REFERENCE), days(system))


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
            cells.append(speedup_cell(sp) + (f" ({len(sp.used)}/{len(res.langs(task))} langs)" if sp.used else "")
                         + f" {speedup_interval(ci)}")
            if sp.excluded:
                notes.append(f"{system} / {task}: {len(sp.excluded)} language(s) excluded (∞: the target is never "
                             f"reached by one side): {', '.join(sp.excluded)}")
            if sp.undefined:
                notes.append(f"{system} / {task}: speedup undefined in {', '.join(sp.undefined)}: the target is met "
                             f"at step 0 by one side (it is at or below the score of the unadapted embeddings), so "
                             f"there is no adaptation compute to compare; left out of the mean")
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
        rows = [[lang, *(AT_STEP0 if res.at_step0(s, task, lang) else fmt_days(days[s][i]) for s in columns)]
                for i, lang in enumerate(langs)]
        rows.append(["avg", *(fmt_days(mean_or_none(days[s])) for s in columns)])
        rows.append(["speedup", *(MISSING if s == REFERENCE else fmt_speedup(system_speedup(res, s, task).mean)
                                  for s in columns)])
        blocks.append(task_title(res, task) + "\n\n" + markdown_table(["language", *names], rows))
    return "\n\n".join(blocks)


def table_english(res: Results) -> str | None:
    """Table 5: English test scores of each finetuned primary model and of MiniJoint's mini-model."""
    if not res.english:
        return None
    tasks = sorted({t for _, _, t in res.english})
    order = sort_systems({s for s, _, _ in res.english})
    keys = sorted({(s, b) for s, b, _ in res.english}, key=lambda k: (order.index(k[0]), k[1] != "primary", k[1]))
    rows = [[s if b == "primary" else f"{s} ({b})",
             *(fmt_stat(res.english_stats.get((s, b, t))) + _n(res.english_stats.get((s, b, t))) for t in tasks)]
            for s, b in keys]
    return markdown_table(["model", *(f"{t} ({res.metrics.get(t, '?')})" for t in tasks)], rows)


def _n(x: Stat | None) -> str:
    return "" if x is None else f" (n={x.n})"
