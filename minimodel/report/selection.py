"""Two checks a report makes on the target-language **dev** sets (never the test sets), before it reads the test scores:

- **Languages that transfer** (``transfer``): a language enters the averages and the claims only when BL_BASE's dev
  score at the end of step 2 (mean over seeds) beats the dev majority class by at least ``report.transfer_margin``
  points. The others are reported on a line of their own, outside every average: a language where the reference
  learns nothing usable cannot say which system gets there sooner.
- **Plateau** (``plateaus``): how much each dev curve moves over the last ``report.plateau_share`` of step 2's
  updates; the rule asks BL_BASE's to move by less than ``report.plateau_points`` in every language, so that "95% of
  BL_BASE's final score" is a target near convergence and not where the curves were cut.

``restrict`` gives the results of some languages only (the languages that transfer; one language, for per-language
verdicts). Nothing here imports torch."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from minimodel.report.curves import Point
from minimodel.report.formatting import markdown_table
from minimodel.report.reading import REFERENCE, Results


@dataclass(frozen=True)
class Transfer:
    """BL_BASE's final dev score in one language against the dev majority class."""

    lang: str
    score: float | None  # BL_BASE's dev score at the last adaptation checkpoint, mean over seeds (None: no dev rows)
    majority: float | None  # the dev majority-class score (always the most frequent English training label)
    margin: float

    @property
    def passes(self) -> bool:
        return self.score is not None and self.majority is not None and self.score >= self.majority + self.margin - 1e-9

    def why(self) -> str:
        """The reason, in words, for a language that does not pass."""
        if self.score is None:
            return f"no {REFERENCE} dev score"
        if self.majority is None:
            return "no dev majority-class baseline"
        return (f"{REFERENCE} dev {self.score:.1f} vs majority class {self.majority:.1f}: "
                f"{self.score - self.majority:+.1f} < +{self.margin:g}")


def transfer(dev: Results, task: str, langs: Collection[str], margin: float) -> list[Transfer]:
    """The transfer rule for each of ``langs`` (in that order), read from the dev results ``dev``."""
    out = []
    for lang in langs:
        final = dev.final_stat(REFERENCE, task, lang)
        out.append(Transfer(lang, None if final is None else final.mean, dev.baselines.get((task, lang)), margin))
    return out


@dataclass(frozen=True)
class Plateau:
    """How much one seed-averaged dev curve moves over the last part of step 2."""

    system: str
    lang: str
    start: Point  # the last checkpoint at or before (1 - share) of the final step
    end: Point  # the final checkpoint

    @property
    def move(self) -> float:
        return self.end.score - self.start.score

    def holds(self, points: float) -> bool:
        return abs(self.move) < points


def plateau(dev: Results, system: str, task: str, lang: str, share: float) -> Plateau | None:
    """The plateau check of one curve; None without a curve or without a checkpoint before the last ``share``."""
    curve = dev.curves.get((system, task, lang))
    if not curve or curve[-1].step <= 0:
        return None
    cut = (1.0 - share) * curve[-1].step
    before = [p for p in curve[:-1] if p.step <= cut + 1e-9]
    return Plateau(system, lang, before[-1], curve[-1]) if before else None


def plateaus(dev: Results, task: str, langs: Collection[str], share: float) -> dict[tuple[str, str], Plateau]:
    """(system, lang) -> its plateau check, for every system with dev curves."""
    return {(s, lang): p for s in dev.systems for lang in langs if (p := plateau(dev, s, task, lang, share))}


def restrict(res: Results, task: str, langs: Collection[str]) -> Results:
    """``res`` with only ``langs`` of ``task`` (other tasks as they are; English scores kept), its other metrics too."""
    keep = set(langs)

    def ok(key: tuple[str, str, str]) -> bool:
        return key[1] != task or key[2] in keep

    return replace(res, curves={k: v for k, v in res.curves.items() if ok(k)},
                   by_seed={k: v for k, v in res.by_seed.items() if ok(k)},
                   secondary={t: {m: restrict(o, task, langs) for m, o in by_metric.items()}
                              for t, by_metric in res.secondary.items()})


def fmt_move(p: Plateau | None, points: float) -> str:
    if p is None:
        return "—"
    return f"{p.move:+.1f} {'✓' if p.holds(points) else '✗'}"


@dataclass(frozen=True)
class DevChecks:
    """What ``ReportConfig`` asks of a report, with the dev majority-class baselines: (task, lang) -> metric -> score."""

    languages: str = "all"  # all | transfer
    margin: float = 5.0
    share: float = 0.25
    points: float = 1.0
    baselines: Mapping[tuple[str, str], Mapping[str, float]] = field(default_factory=dict)


@dataclass
class Checked:
    """The test results a report reads (only the languages that transfer, with ``languages: transfer``), the
    languages left out per task with the reason, and the dev checks' section of the report."""

    res: Results
    left_out: dict[str, list[Transfer]] = field(default_factory=dict)
    full: Results | None = None  # every language, for the scores of those left out
    section: list[str] = field(default_factory=list)


def apply_checks(res: Results, dev: Results, checks: DevChecks) -> Checked:
    """Choose the languages (transfer rule) and write the dev checks' section: one table per task of the transfer
    rule and of every dev curve's plateau check, then the verdict of each rule in words."""
    out = Checked(res=res, full=res)
    if not dev.curves:
        out.section = ["## Checks on the dev sets", "",
                       "No dev rows (split dev) in the results: the transfer rule and the plateau check were not "
                       "made. `evaluate.dev=true` adds the evaluate-dev steps to `minimodel run`; `minimodel evaluate "
                       "CONFIG evaluate.split=dev` scores the finished adaptations on the dev sets.", ""]
        return out
    lines = ["## Checks on the dev sets", "",
             f"Both read the target-language **dev** sets only (the test sets are never used to choose anything). "
             f"**Transfer rule**: a language enters the averages and claims only when {REFERENCE}'s dev score at the "
             f"end of step 2 (mean over seeds) beats the dev majority class by at least {checks.margin:g} points"
             + ("" if checks.languages == "transfer" else " (not applied here: report.languages is all)")
             + f". **Plateau rule**: over the last {checks.share:.0%} of step 2's updates, {REFERENCE}'s dev curve "
             f"moves by less than {checks.points:g} point{'' if checks.points == 1 else 's'} in every language; the table shows the move of every "
             f"system's curve (dev score at the last checkpoint minus that at the last checkpoint at or before "
             f"{1 - checks.share:.0%} of the updates; ✓ below {checks.points:g} in absolute value).", ""]
    kept = res
    for task in res.tasks:
        langs = res.langs(task)
        rule = transfer(dev, task, langs, checks.margin)
        rows = [[t.lang, fmt_opt(t.score), fmt_opt(t.majority),
                 "—" if t.score is None or t.majority is None else f"{t.score - t.majority:+.1f}",
                 "yes" if t.passes else "no"] for t in rule]
        lines += [f"**{task}**: transfer rule", "",
                  markdown_table(["language", f"{REFERENCE} dev (final)", "dev majority class", "difference",
                                  f"transfers (≥ +{checks.margin:g})"], rows), ""]
        checks_of = plateaus(dev, task, langs, checks.share)
        systems = [s for s in dev.systems if any((s, lang) in checks_of for lang in langs)]
        if systems:
            steps = sorted({(p.start.step, p.end.step) for p in checks_of.values()})
            span = ", ".join(f"{a} → {b}" for a, b in steps)
            lines += [f"**{task}**: plateau check (dev score moves over updates {span})", "",
                      markdown_table(["system", *langs], [[s, *(fmt_move(checks_of.get((s, lang)), checks.points)
                                                                for lang in langs)] for s in systems]), ""]
        ref = [checks_of.get((REFERENCE, lang)) for lang in langs]
        if all(p is not None for p in ref):
            bad = [p.lang for p in ref if p is not None and not p.holds(checks.points)]
            lines.append(f"**{task}**: the plateau rule "
                         + ("holds: " + f"{REFERENCE}'s dev curve moves by less than {checks.points:g} in every "
                            "language." if not bad else f"does **not** hold in {', '.join(bad)}: {REFERENCE}'s dev "
                            "curve still moves there, and the near-maximal targets there depend on where step 2 "
                            "stops."))
        else:
            lines.append(f"**{task}**: the plateau rule is not checked ({REFERENCE} has no dev curve in "
                         f"{', '.join(lang for lang, p in zip(langs, ref) if p is None)}).")
        lines.append("")
        failing = [t for t in rule if not t.passes]
        if checks.languages == "transfer" and failing:
            out.left_out[task] = failing
            kept = restrict(kept, task, [t.lang for t in rule if t.passes])
            lines += [f"**{task}: left out of every average, speedup and claim** (they fail the transfer rule): "
                      + "; ".join(f"{t.lang} ({t.why()})" for t in failing) + ". Their test scores are in "
                      "the table after Table 2.", ""]
    out.res, out.section = kept, lines
    return out


def fmt_opt(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"
