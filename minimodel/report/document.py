"""The report of an experiment: ``report.md`` (every table, the claims, Figure 3's PNGs next to it) and the short
plain-text summary printed at the end of ``minimodel report`` and of a demo."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minimodel import atomic
from minimodel.layout import Layout
from minimodel.report.claims import claims_table
from minimodel.report.figures import plot_curves
from minimodel.report.formatting import (
    AT_STEP0,
    BELOW,
    MISSING,
    fmt_days,
    fmt_score,
    mean_or_none,
    speedup_cell,
    speedup_interval,
)
from minimodel.report.intervals import BOOTSTRAP_REPS, seeds_of_system, time_to_target_interval
from minimodel.report.reading import NEAR_MAX, REFERENCE, Results, load_results
from minimodel.report.tables import (
    system_speedup,
    table_baselines,
    table_depth,
    table_english,
    table_final,
    table_speedup,
    table_time,
)
from minimodel.truncation import read_dir as read_truncation
from minimodel.truncation import report_section

DEV_NOTE = (": the target-language dev sets, for choosing settings; the results are the test split's, in "
            "report.md")
NO_REFERENCE = (f"No {REFERENCE} (BL_BASE) results: there is no near-maximal target ({NEAR_MAX:.0%} of BL_BASE's "
                "final score), so the times to target, the speedups and the depth sweep are left out.")


def pretraining_note(res: Results) -> str:
    """What the header says of systems with several pretraining seeds (nothing when there are none)."""
    several = [s for s in res.systems if len({p for p, _ in seeds_of_system(res, s)}) > 1]
    if not several:
        return ""
    seeds = sorted({p for p, _ in res.seeds})
    note = (f" and, for {', '.join(several)}, over pretraining seeds too ({', '.join(map(str, seeds))}; every "
            f"(pretraining, finetuning) pair is one sample, and bootstrap resamples draw pretraining seeds, then "
            f"finetuning seeds within each")
    if len(seeds) < 3:
        note += (f"; with {len(seeds)} pretrainings that resampling can only mix them, so the pretraining part of "
                 f"an interval is the range of the pretrainings, not a 95% interval: read verdicts that rest on it "
                 f"as indicative")
    return note + ")"


def render_report(res: Results, name: str, plots: Mapping[str, str], depths: Mapping[str, int] | None = None,
                  variants: Mapping[str, Any] | None = None, truncation: list[str] | None = None) -> str:
    """The Markdown report; ``variants``: MiniJoint label -> ``claims.VariantInfo`` (the claims beyond the paper);
    ``plots``: task -> relative link of its PNG; ``depths``: MiniJoint label -> depth of its
    mini-model (for the claim about depth); ``truncation``: the section ``truncation.report_section`` writes."""
    out = [f"# Mini-model adaptation: {name}", ""]
    if not res.curves and not res.english:
        return "\n".join(out + ["No results yet (no `*/results.jsonl` rows): run `minimodel evaluate` first.", ""])
    out += [f"Systems: {', '.join(res.systems) or MISSING}. Tasks: {', '.join(res.tasks) or MISSING} "
            f"(main metric: {', '.join(f'{t}: {m}' for t, m in sorted(res.metrics.items()))}; {res.split} split{DEV_NOTE if res.split != 'test' else ''}). Scores are mean ± standard deviation over "
            f"finetuning seeds (n per system in Table 2; seeds {', '.join(map(str, sorted({f for _, f in res.seeds})))})"
            f"{pretraining_note(res)}; curves, "
            f"times to target and speedups use the seed-averaged scores, and their 95% intervals come from "
            f"{BOOTSTRAP_REPS} bootstrap resamples of the seeds (paired when two systems share seeds). A speedup "
            f"whose interval spans 1 is reported as inconclusive. {res.n_rows} rows read.", ""]
    if res.curves:
        out += ["## Performance at training completion (Table 2)", "",
                "Zero-shot score at the last adaptation checkpoint per target language, its average over the "
                "task's languages (— when a language is missing), and the cost of step 2 (embedding adaptation) "
                "per language in EFLOPs and V100-days (30 TFLOP/s). The last row is the near-maximal target. "
                f"{BELOW}: the score does not beat the majority-class baseline (always the most frequent training "
                "label).", "",
                table_final(res), ""]
        flagged = below_baseline_list(res)
        if flagged:
            out += [f"**{BELOW} Below the majority-class baseline:** {flagged}. A model that does not beat always "
                    "predicting the most frequent label has learned nothing usable there; check the task's label "
                    "balance and its other metrics (baselines below) before reading the other tables.", ""]
        baselines = table_baselines(res)
        if baselines:
            out += ["## Baselines", "",
                    "Every metric of the majority-class baseline (the most frequent English training label, "
                    "predicted for every test example), and each system's score before adaptation (step 0: "
                    "the unadapted target embeddings, initialised from the pieces shared with the source "
                    "language).", "", baselines, ""]
        time_table = table_time(res)
        if time_table is None:
            out += [NO_REFERENCE, ""]
        else:
            out += ["## V100-days to near-maximal performance (Table 3)", "",
                    f"Adaptation V100-days until the score first reaches {NEAR_MAX:.0%} of BL_BASE's final score for "
                    "that task and language (the same target for every system), linearly interpolated between the "
                    "checkpoint before and the first checkpoint that reaches it; ∞ when never reached "
                    f"(the average is then ∞ too); *{AT_STEP0}* when already reached before any adaptation (the "
                    "target is at or below the score of the unadapted embeddings: no compute is needed, and "
                    "speedups there are undefined).", "", time_table, ""]
            speed = table_speedup(res)
            if speed:
                out += ["## Speedup over BL_BASE (Figure 1)", "",
                        "Mean over languages of the per-language ratio BL_BASE days / system days (not the ratio "
                        "of mean days); languages where either side never reaches the target are excluded.", "",
                        speed, ""]
            depth = table_depth(res)
            if depth:
                out += ["## Depth of the secondary head (Table 4)", "",
                        "V100-days to near-maximal performance (still 95% of BL_BASE) for each depth N of the "
                        "mini-model; the last row is the average speedup over BL_BASE.", "", depth, ""]
    if res.curves and any(s == REFERENCE for s, _, _ in res.curves):
        out += ["## The paper's claims", "",
                "Each claim of the paper, its figure there, ours with a 95% bootstrap interval over finetuning seeds "
                "(n per system), the rule that decides *held*, and the verdict: *held* when the interval lies on the "
                "claim's side of the rule, *not held* when it lies on the other side, *inconclusive* when it spans "
                "the rule's threshold. Rows marked \"not in the paper\" check minimodel's extensions of the method "
                "(multi-head pretraining, progressive adaptation, active forgetting) the same way.", "",
                claims_table(res, depths, variants=variants), ""]
    english = table_english(res)
    if english:
        out += ["## English (Table 5)", "",
                "English test scores of each finetuned primary model (source embeddings) and, for MiniJoint, "
                "of its mini-model finetuned on its own.", "", english, ""]
    if plots:
        out += ["## Score against V100-days (Figure 3)", "",
                "Average over languages at matching checkpoints; bands: ± one standard deviation over seeds; "
                "dashed: mean near-maximal target.", ""]
        out += [f"![{task}]({link})\n" for task, link in plots.items()]
    out += truncation or []
    return "\n".join(out)


def write_report(runs_dir: str | Path, name: str, out: Path | None = None,
                 baselines: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
                 depths: Mapping[str, int] | None = None, variants: Mapping[str, Any] | None = None,
                 main_metrics: Mapping[str, str] | None = None, split: str = "test") -> Path:
    """Read every ``{runs_dir}/{name}/*/results.jsonl``; write ``report.md`` (default
    ``{runs_dir}/{name}/report.md``) and its PNGs under ``plots/`` next to it. Returns the report path.
    ``baselines``: (task, lang) -> metric -> majority-class score; ``main_metrics``: task -> main metric."""
    res = load_results(runs_dir, name, main_metrics, split)
    res.set_baselines(baselines)
    out = Path(out) if out is not None else Layout(Path(runs_dir), name).report_of(split)
    atomic.make_dirs(out.parent)
    pngs = plot_curves(res, out.parent / ("plots" if split == "test" else f"plots-{split}")) if res.curves else {}
    truncated = report_section({p.parent.name: read_truncation(p.parent) for p in Layout(Path(runs_dir), name).all_results()},
                               res.tasks, {task: res.langs(task) for task in res.tasks}, split)
    text = render_report(res, name, {task: path.relative_to(out.parent).as_posix() for task, path in pngs.items()},
                         depths, variants, truncated)
    atomic.write_text(out, text)
    return out


def summary_text(res: Results) -> str:
    """Per task: final average score, V100-days to target averaged over languages, speedup over BL_BASE."""
    if not res.curves:
        return "no results"
    has_ref = any(s == REFERENCE for s, _, _ in res.curves)
    lines = [f"{'task':<10} {'system':<16} {'final':>7}{'':<6} {'days to 95%':>12} {'speedup':>9}  95% interval"]
    for task in res.tasks:
        langs = res.langs(task)
        for system in res.systems:
            finals = [res.final(system, task, lang) for lang in langs]
            if all(p is None for p in finals):
                continue
            score = mean_or_none([None if p is None else p.score for p in finals])
            days = mean_or_none([res.days_to_target(system, task, lang) for lang in langs]) if has_ref else None
            step0 = has_ref and all(res.at_step0(system, task, lang) for lang in langs)
            sp = MISSING if system == REFERENCE or not has_ref else speedup_cell(system_speedup(res, system, task))
            ci = time_to_target_interval(res, system, task) if has_ref and system != REFERENCE else None
            extra = "" if ci is None else f"  {speedup_interval(ci)}"
            spread = res.average_stat(system, task)
            spread_text = f" ±{spread.std:.1f}" if spread is not None and spread.n > 1 and not math.isnan(spread.std) else ""
            when = AT_STEP0 if step0 else fmt_days(days)
            lines.append(f"{task:<10} {system:<16} {fmt_score(score):>7}{spread_text:<6} {when:>12} {sp:>9}{extra}")
    for task in res.tasks:
        base = [res.baselines.get((task, lang)) for lang in res.langs(task)]
        if any(b is not None for b in base):
            per_lang = ", ".join(f"{lang} {fmt_score(b)}" for lang, b in zip(res.langs(task), base))
            lines.append(f"{task:<10} {'majority class':<16} {fmt_score(mean_or_none(base)):>7}{'':<6}   ({per_lang})")
    flagged = below_baseline_list(res)
    if flagged:
        lines.append(f"{BELOW} below the majority-class baseline: {flagged}")
    if not has_ref:
        lines.append(NO_REFERENCE)
    return "\n".join(lines)


def below_baseline_list(res: Results) -> str:
    """``system / task: langs; ...`` for every final score that does not beat the majority class ("" if none)."""
    parts = []
    for task in res.tasks:
        for system in res.systems:
            langs = [lang for lang in res.langs(task) if res.below_baseline(system, task, lang)]
            if langs:
                parts.append(f"{system} / {task}: {', '.join(langs)}")
    return "; ".join(parts)


def summary(runs_dir: str | Path, name: str, baselines: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
            main_metrics: Mapping[str, str] | None = None, split: str = "test") -> str:
    """A short plain-text table for the end of a demo (see ``summary_text``)."""
    res = load_results(runs_dir, name, main_metrics, split)
    res.set_baselines(baselines)
    return summary_text(res)
