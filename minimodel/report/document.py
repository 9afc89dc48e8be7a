"""The report of an experiment: ``report.md`` (every table, the claims, Figure 3's PNGs next to it) and the short
plain-text summary printed at the end of ``minimodel report`` and of a demo."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minimodel.errors import ConfigError
from minimodel.log import get_logger
from minimodel.report.bridges import bridge_section
from minimodel.report.claims import claims_table
from minimodel.report.figures import is_plot, plot_curves, plot_path
from minimodel.report.formatting import (
    BELOW,
    FELL_BACK,
    LOWERED,
    MISSING,
    NO_TARGET,
    SEED_BELOW,
    fmt_score,
    mean_or_none,
    speedup_cell,
)
from minimodel.report.intervals import BOOTSTRAP_REPS, seeds_of_system, time_to_target_interval
from minimodel.report.marks import GATE_RULE, claims_gate, flagged_all, flagged_targets, speedup_text, unchecked
from minimodel.report.perplexity_claims import perplexity_claims
from minimodel.report.reading import NEAR_MAX, REFERENCE, Results, inverse_perplexity, load_results
from minimodel.report.selection import Checked, DevChecks, apply_checks, restrict
from minimodel.report.statistics import MIN_DEFINED
from minimodel.report.tables import (
    days_average,
    system_speedup,
    table_baselines,
    table_depth,
    table_english,
    table_final,
    table_other_metrics,
    table_speedup,
    table_time,
)
from minimodel.report.unadapted import References, load_references, unadapted_section
from minimodel.report.verdicts import task_verdicts, verdict_section
from minimodel.store import atomic
from minimodel.store.layout import Layout
from minimodel.store.truncation import read_dir as read_truncation
from minimodel.store.truncation import report_section

log = get_logger(__name__)

DEV_NOTE = (": the target-language dev sets, for choosing settings; the results are the test split's, in "
            "report.md")
NO_REFERENCE = (f"No {REFERENCE} (BL_BASE) results: there is no near-maximal target ({NEAR_MAX:.0%} of BL_BASE's "
                "final score), so the times to target, the speedups and the depth sweep are left out.")
INTERVAL_RULE = (f"An interval is given only when its estimate is defined and at least {MIN_DEFINED:.0%} of the "
                 "resamples give one too (otherwise: *no interval*, with the share of resamples that gave none, and "
                 "no verdict).")
MARKS = (f"{BELOW}: the mean score does not beat the majority-class baseline (always the most frequent training "
         f"label); {SEED_BELOW}: the mean does, but at least one seed does not; {LOWERED}: below the system's own "
         f"step-0 score (before adaptation: adaptation lowered it); {NO_TARGET} (target row): the target is at or "
         f"below the chance bar (the better of the majority-class baseline and the best input-blind predictor) or "
         f"{REFERENCE}'s step-0 score, so reaching it means nothing: that language is left out of speedups and "
         "averages of days.")
CLAIMS_RULE = (f"The claims are read on a task only when the systems clearly beat chance there: {GATE_RULE}. A "
               "speedup rests on the languages that reach the target (*languages* names them): *held* over fewer than "
               "half of the languages that count is reported as *exploratory*, never *held*. The speedup table and the "
               "console summary read every speedup by the same rule and in the same words, and say *no answer on "
               f"this task* where the claims are not read; {FELL_BACK} marks a speedup resting on a language where "
               "the system falls back below the target later.")



REPORT_HEADER = "# Mini-model adaptation: "
"""The first line of every report (``render_report``): what marks a file as one ``minimodel report`` wrote."""

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
                  variants: Mapping[str, Any] | None = None, truncation: list[str] | None = None,
                  checked: Checked | None = None, inits: Mapping[str, str] | None = None,
                  family: Any = None, references: References | None = None, bridges: list[str] | None = None) -> str:
    """The Markdown report; ``variants``: MiniJoint label -> ``claims.VariantInfo`` (the claims beyond the paper);
    ``plots``: task -> relative link of its PNG; ``depths``: MiniJoint label -> depth of its
    mini-model (for the claim about depth); ``truncation``: the section ``truncation.report_section`` writes;
    ``checked``: the dev checks (``selection.apply_checks``: ``res`` is then its results, the languages that
    transfer); ``inits``: label of a row adapted from another initialisation -> the label of its overlap twin;
    ``family``: the experiment's ``families.ModelFamily`` (claims about a family the paper did not study are marked
    so; a causal LM's perplexity gets claims of its own); ``references``: the unadapted model's and the
    bag-of-words rows (``unadapted.load_references``), for the claim "adapted beats unadapted"; ``bridges``: the
    section on step 1b's one-time cost (``bridges.bridge_section``)."""
    out = [f"{REPORT_HEADER}{name}", ""]
    if not res.curves and not res.english:
        return "\n".join(out + ["No results yet (no `*/results.jsonl` rows): run `minimodel evaluate` first.", ""])
    out += [f"Systems: {', '.join(res.systems) or MISSING}. Tasks: {', '.join(res.tasks) or MISSING} "
            f"(main metric: {', '.join(f'{t}: {m}' for t, m in sorted(res.metrics.items()))}; {res.split} split{DEV_NOTE if res.split != 'test' else ''}). Scores are mean ± standard deviation over "
            f"finetuning seeds (n per system in Table 2; seeds {', '.join(map(str, sorted({f for _, f in res.seeds})))})"
            f"{pretraining_note(res)}; curves, "
            f"times to target and speedups use the seed-averaged scores, and their 95% intervals come from "
            f"{BOOTSTRAP_REPS} bootstrap resamples of the seeds (paired when two systems share seeds). A speedup "
            f"whose interval spans 1 is reported as inconclusive. {res.n_rows} rows read.", ""]
    out += verdict_section(res)
    if checked is not None:
        out += checked.section
    if res.curves:
        out += ["## Performance at training completion (Table 2)", "",
                "Zero-shot score at the last adaptation checkpoint per target language, its average over the "
                "task's languages (— when a language is missing), and the cost of step 2 (embedding adaptation) "
                "per language in EFLOPs and V100-days (30 TFLOP/s). The last row is the near-maximal target. "
                + MARKS, "", table_final(res), ""]
        flagged = below_baseline_list(res)
        if flagged:
            out += [f"**{BELOW} Below the majority-class baseline:** {flagged}. A model that does not beat always "
                    "predicting the most frequent label has learned nothing usable there; check the task's label "
                    "balance and its other metrics (baselines below) before reading the other tables.", ""]
        out += [line + "\n" for line in mark_lines(res, bold=True)]
        if checked is not None and checked.left_out and checked.full is not None:
            apart = checked.full
            for task in apart.tasks:
                apart = restrict(apart, task, [t.lang for t in checked.left_out.get(task, [])])
            out += ["## Languages that do not transfer (outside every average)", "",
                    "Table 2 for the languages that fail the transfer rule (checks on the dev sets, above): their "
                    "test scores, for the record; no average, speedup or claim includes them.", "",
                    table_final(apart), ""]
        others = table_other_metrics(res)
        if others:
            out += ["## Performance at training completion in the other metrics", "",
                    "Table 2's final scores in each other metric the task reports, with that metric's majority-class "
                    "baseline (marks as in Table 2, against that baseline and the metric's own step-0 score). "
                    "Per-class F1 and the confusion matrix are rows of `results.jsonl` (`f1/LABEL`, "
                    "`confusion/GOLD/PREDICTED`).", "", others, ""]
        baselines = table_baselines(res)
        if baselines:
            out += ["## Baselines", "",
                    "Every metric of the majority-class baseline (the most frequent English training label, "
                    "predicted for every test example), the best input-blind predictor in each scalar metric (any "
                    "constant label, or labels drawn at the English training frequencies; what the claims gate "
                    "also asks BL_BASE to beat), and each system's score before adaptation (step 0: "
                    "the unadapted target embeddings, initialised from the pieces shared with the source "
                    "language).", "", baselines, ""]
        time_table = table_time(res)
        if time_table is None:
            out += [NO_REFERENCE, ""]
        else:
            out += ["## V100-days to near-maximal performance (Table 3)", "",
                    f"Adaptation V100-days until the score first reaches {NEAR_MAX:.0%} of BL_BASE's final score for "
                    "that task and language (the same target for every system), linearly interpolated between the "
                    "checkpoint before and the first checkpoint that reaches it; ∞ when never reached; "
                    "*at step 0* when already reached before any adaptation (the target is at or below the score of "
                    "the unadapted embeddings: no compute is needed, and speedups there are undefined); "
                    f"{NO_TARGET} on a language: its target is at or below the baseline. The average over languages "
                    "is a number only when every language reaches the target after some adaptation (∞ when none "
                    f"ever does, *at step 0* when all do at once); otherwise — and the languages that make it so "
                    f"are named below the table. {INTERVAL_RULE}", "", time_table, ""]
            speed = table_speedup(res)
            if speed:
                out += ["## Speedup over BL_BASE (Figure 1)", "",
                        "Mean over languages of the per-language ratio BL_BASE days / system days (not the ratio "
                        "of mean days); languages where either side never reaches the target are excluded, and "
                        f"those whose target is at or below the baseline ({NO_TARGET}) left out. {INTERVAL_RULE}", "",
                        speed, ""]
            depth = table_depth(res)
            if depth:
                out += ["## Depth of the secondary head (Table 4)", "",
                        "V100-days to near-maximal performance (still 95% of BL_BASE) for each depth N of the "
                        "mini-model; the last row is the average speedup over BL_BASE.", "", depth, ""]
    if res.curves and any(s == REFERENCE for s, _, _ in res.curves):
        out += claims_section(res, depths, variants, inits, family)
    out += unadapted_section(res, references or {})
    out += bridges or []  # step 1b's one-time cost (report.bridges)
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


def claims_section(res: Results, depths: Mapping[str, int] | None, variants: Mapping[str, Any] | None,
                   inits: Mapping[str, str] | None = None, family: Any = None) -> list[str]:
    """The paper's claims, for the tasks where the systems clearly beat chance (``marks.claims_gate``); one line
    for each task left out, saying why. For a family the paper did not study (``family.in_paper`` false) every
    row is marked "not in the paper"; with perplexity rows (a causal LM), claims 1 and 2 on perplexity too."""
    other = "" if family is None or family.in_paper else family.title
    shown = [t for t in res.tasks if claims_gate(res, t) is None]
    notes = [f"**{t}**: left out: {why}." for t in res.tasks if (why := claims_gate(res, t))]
    notes += [f"**{t}**: not checked in {', '.join(langs)} (no majority-class baseline or no {REFERENCE} score)."
              for t in shown if (langs := unchecked(res, t))]
    title = "## The paper's claims" + (f", for a {other} model (not in the paper)" if other else "")
    intro = ([f"The paper adapts masked LMs only (its Limitations section names autoregressive models as untested): "
              f"here its claims are checked on a {other} model, so every row is \"not in the paper\"; the paper's "
              "figure, about MLMs, is given for comparison.", ""] if other else [])
    out = [title, "", *intro,
           "Each claim of the paper, its figure there, ours with a 95% bootstrap interval over finetuning seeds "
           "(n per system), the rule that decides *held*, and the verdict: *held* when the interval lies on the "
           "claim's side of the rule, *not held* when it lies on the other side, *inconclusive* when it spans "
           "the rule's threshold. Rows marked \"not in the paper\" check minimodel's extensions of the method "
           f"(multi-head pretraining, progressive adaptation, active forgetting, FOCUS initialisation) the same way. "
           "*Languages* is the coverage of the estimate (the task's languages that entered it, of those that "
           "count); *per language* is "
           "the same claim, rule and interval computed on each language alone (— where a claim is not about one "
           f"language), so a claim that holds on average but not in some languages says so. {INTERVAL_RULE} "
           + CLAIMS_RULE, "", *(n + "\n" for n in notes)]
    if shown:
        out += [claims_table(res, depths, tasks=shown, variants=variants, inits=inits, family=other), ""]
    for task in (t for t in res.tasks if t not in shown):
        clear = [lang for lang in res.langs(task) if claims_gate(restrict(res, task, [lang]), task) is None]
        if clear and len(clear) < len(res.langs(task)):
            out += [f"**{task}, exploratory**: the same claims over the languages where {REFERENCE} does clear the "
                    f"baselines ({', '.join(clear)}). That set was chosen by the rule above, which reads "
                    "test scores: these verdicts are exploratory, not the experiment's claims.", "",
                    claims_table(restrict(res, task, clear), depths, variants=variants, inits=inits,
                                 family=other), ""]
    for task in res.tasks:
        inverse = inverse_perplexity(res, task)
        if inverse is not None and any(s == REFERENCE for s, _, _ in inverse.curves):
            out += [f"**{task}, target-language perplexity** (not in the paper): claims 1 and 2 read on the held-out "
                    "perplexity of the primary model with each adaptation checkpoint's embeddings, as 1/perplexity "
                    "(the geometric-mean probability of the next token), so that the target is still 95% of "
                    f"{REFERENCE}'s final value: a perplexity at most {REFERENCE}'s final / 0.95. Perplexity does "
                    "not depend on the finetuning seed and each language has one adaptation run, so these are point "
                    "estimates per language, without intervals; a claim is *held* only where it holds in every "
                    "language.", "", perplexity_claims(inverse, task), ""]
    return out


def checked_results(runs_dir: str | Path, name: str, main_metrics: Mapping[str, str] | None, split: str,
                    baselines: Mapping[tuple[str, str], Mapping[str, float]] | None,
                    checks: DevChecks | None, systems: Mapping[str, str] | None = None
                    ) -> tuple[Results, Checked | None]:
    """The results a report reads: the split's rows (of ``systems`` only, renamed, when given: ``report.systems``),
    with the dev checks applied on a test report (``checks``)."""
    res = load_results(runs_dir, name, main_metrics, split, systems)
    res.set_baselines(baselines)
    if checks is None or split == "dev":
        return res, None
    dev = load_results(runs_dir, name, main_metrics, "dev", systems)
    dev.set_baselines(checks.baselines)
    checked = apply_checks(res, dev, checks)
    return checked.res, checked


def is_report(path: Path) -> bool:
    """Whether the file ``path`` begins with a report's first line (``REPORT_HEADER``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(REPORT_HEADER.encode()))
    except OSError:
        return False
    return head == REPORT_HEADER.encode()


def check_report_out(out: Path, force: bool) -> bool:
    """Refuse (``ConfigError``, naming ``out``) to write the report over something it did not write: a directory,
    or a file that is not an earlier report (its first line is not ``REPORT_HEADER``) unless ``force``. Returns
    whether ``out`` is an earlier report (its plots may be replaced too)."""
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory: the report is one Markdown file (its plots go to plots/ "
                          f"beside it): give a file path, e.g. --out {out / 'report.md'}")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"--out {out}: {above} is a file, so no directory can be made under it: choose another "
                          f"--out")
    if not (out.exists() or out.is_symlink()):
        return False
    if not out.is_file():
        raise ConfigError(f"--out {out} exists and is not a regular file: choose another --out")
    if is_report(out):
        return True
    if force:
        log.warning(f"report: --force: replacing {out}, which is not a report minimodel wrote")
        return False
    raise ConfigError(f"--out {out} exists and is not a report minimodel wrote (its first line is not "
                      f"'{REPORT_HEADER.strip()} …'): not overwriting it; choose another --out, or add --force to "
                      f"replace it")


def check_plots_out(plots: Path, pngs: list[Path], out: Path) -> None:
    """Refuse to write the plots of a new report (``out``, chosen by ``--out``) over files already there that no
    report wrote (``figures.is_plot``: another report's plots in the same folder are replaced; ``--force`` replaces
    anything)."""
    if plots.exists() and not plots.is_dir():
        raise ConfigError(f"{plots} is a file, where the report {out} puts its plots: not overwriting it; choose "
                          f"another --out, or move the file")
    taken = [p for p in pngs if (p.exists() or p.is_symlink()) and not (p.is_file() and is_plot(p))]
    if taken:
        raise ConfigError(f"{taken[0]} exists, where the new report {out} would write its plot, and no report "
                          f"minimodel wrote is at {out}: not overwriting it; choose another --out (another folder), "
                          f"or add --force to replace it")


def write_report(runs_dir: str | Path, name: str, out: Path | None = None,
                 baselines: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
                 depths: Mapping[str, int] | None = None, variants: Mapping[str, Any] | None = None,
                 main_metrics: Mapping[str, str] | None = None, split: str = "test",
                 checks: DevChecks | None = None, inits: Mapping[str, str] | None = None, family: Any = None,
                 systems: Mapping[str, str] | None = None, force: bool = False, models_from: str = "") -> Path:
    """Read every ``{runs_dir}/{name}/*/results.jsonl``; write ``report.md`` (default
    ``{runs_dir}/{name}/report.md``) and its PNGs under ``plots/`` next to it. Returns the report path.
    ``baselines``: (task, lang) -> metric -> majority-class score; ``main_metrics``: task -> main metric;
    ``checks``: the dev-set checks (transfer rule, plateau) of ``report:``; ``inits``: see ``render_report``;
    ``systems``: ``report.systems`` (which systems, under which names). Reads ``unadapted.jsonl`` beside the runs
    when there is one (``unadapted.load_references``), and the finished bridges of step 1b where the experiment's
    models live (``models_from``: another experiment's, whose runs it reuses). ``out`` is written only where it is
    new or a report this command wrote before (``check_report_out``), and its plots only over files of such a report,
    or with ``force``."""
    chosen = out is not None
    out = Path(out) if out is not None else Layout(Path(runs_dir), name).report_of(split)
    ours = check_report_out(out, force)
    res, checked = checked_results(runs_dir, name, main_metrics, split, baselines, checks, systems)
    plots = out.parent / ("plots" if split == "test" else f"plots-{split}")
    if chosen and not ours and not force and res.curves:
        check_plots_out(plots, [plot_path(plots, task) for task in res.tasks], out)
    atomic.make_dirs(out.parent)
    pngs = plot_curves(res, plots) if res.curves else {}
    layout = Layout(Path(runs_dir), name, models_from)
    truncated = report_section({p.parent.name: read_truncation(p.parent) for p in layout.all_results()},
                               res.tasks, {task: res.langs(task) for task in res.tasks}, split)
    text = render_report(res, name, {task: path.relative_to(out.parent).as_posix() for task, path in pngs.items()},
                         depths, variants, truncated, checked, inits, family, load_references(layout.root),
                         bridge_section(layout.models_root, systems))
    atomic.write_text(out, text)
    return out


def summary_text(res: Results) -> str:
    """Per task: final average score, V100-days to target averaged over languages, speedup over BL_BASE."""
    if not res.curves:
        return "no results"
    has_ref = any(s == REFERENCE for s, _, _ in res.curves)
    lines = [f"{'task':<10} {'system':<16} {'final':>7}{'':<6} {'days to 95%':>12} {'speedup':>9}  (langs it rests on) "
             "95% interval: reading"]
    unaveraged: list[str] = []
    for task in res.tasks:
        langs = res.langs(task)
        for system in res.systems:
            finals = [res.final(system, task, lang) for lang in langs]
            if all(p is None for p in finals):
                continue
            score = mean_or_none([None if p is None else p.score for p in finals])
            when, why = days_average(res, system, task) if has_ref else (MISSING, "")
            if why:
                unaveraged.append(f"{system} / {task} ({why})")
            sp, extra = MISSING, ""
            if has_ref and system != REFERENCE:  # the speedup as the report's table writes it (marks.speedup_text)
                speedup = system_speedup(res, system, task)
                ci = time_to_target_interval(res, system, task)
                sp = speedup_cell(speedup)
                extra = "  " + speedup_text(res, system, task, speedup, ci)[len(sp):].strip()
            spread = res.average_stat(system, task)
            spread_text = f" ±{spread.std:.1f}" if spread is not None and spread.n > 1 and not math.isnan(spread.std) else ""
            lines.append(f"{task:<10} {system:<16} {fmt_score(score):>7}{spread_text:<6} {when:>12} {sp:>9}{extra}")
    for task in res.tasks:
        base = [res.baselines.get((task, lang)) for lang in res.langs(task)]
        if any(b is not None for b in base):
            per_lang = ", ".join(f"{lang} {fmt_score(b)}" for lang, b in zip(res.langs(task), base))
            lines.append(f"{task:<10} {'majority class':<16} {fmt_score(mean_or_none(base)):>7}{'':<6}   ({per_lang})")
        for metric, other in sorted(res.secondary.get(task, {}).items()):
            finals = ", ".join(f"{system} {fmt_stat_mean(other, system, task)}" for system in other.systems)
            base = mean_or_none([other.baselines.get((task, lang)) for lang in other.langs(task)])
            lines.append(f"{task:<10} {metric:<16} {finals}" + (f"; majority class {fmt_score(base)}" if base is not None else ""))
    if unaveraged:
        lines.append(f"days to 95% {MISSING}: no average over languages for {'; '.join(unaveraged)}")
    flagged = below_baseline_list(res)
    if flagged:
        lines.append(f"{BELOW} below the majority-class baseline: {flagged}")
    lines += mark_lines(res, bold=False)
    if not has_ref:
        lines.append(NO_REFERENCE)
    lines += ["verdict: " + line.replace("**", "") for line in task_verdicts(res)]
    return "\n".join(lines)


def below_baseline_list(res: Results) -> str:
    """``system / task: langs; ...`` for every final score that does not beat the majority class, in the main metric
    and then in the task's other metrics (``system / task (accuracy): langs``); "" if none."""
    return flagged_all(res, BELOW)


def mark_lines(res: Results, bold: bool) -> list[str]:
    """One line for each of the marks ▽, ↓ and ⊘ that some score or target carries (``marks``)."""
    texts = [(SEED_BELOW, "A seed at or below the majority-class baseline", flagged_all(res, SEED_BELOW)),
             (LOWERED, "Below its own step-0 score (adaptation lowered it)", flagged_all(res, LOWERED)),
             (NO_TARGET, "Target at or below the baseline (left out of speedups and averages of days)",
              flagged_targets(res))]
    return [f"**{mark} {what}:** {which}." if bold else f"{mark} {what[0].lower() + what[1:]}: {which}"
            for mark, what, which in texts if which]


def fmt_stat_mean(res: Results, system: str, task: str) -> str:
    st = res.average_stat(system, task)
    return MISSING if st is None else fmt_score(st.mean)


def summary(runs_dir: str | Path, name: str, baselines: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
            main_metrics: Mapping[str, str] | None = None, split: str = "test", checks: DevChecks | None = None,
            systems: Mapping[str, str] | None = None) -> str:
    """A short plain-text table for the end of a demo (see ``summary_text``); with ``checks``, the languages that
    transfer only, and a line naming those left out."""
    res, checked = checked_results(runs_dir, name, main_metrics, split, baselines, checks, systems)
    text = summary_text(res)
    if checked is not None and checked.left_out:
        text += "\n" + "; ".join(f"{task}: left out (transfer rule on dev): " + ", ".join(t.lang for t in failing)
                                 for task, failing in checked.left_out.items())
    return text
