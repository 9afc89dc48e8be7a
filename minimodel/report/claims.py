"""The paper's claims, checked one by one against an experiment's results.

Each claim is an estimate computed from the seed-averaged results, a 95% percentile bootstrap interval
over finetuning seeds (``intervals.bootstrap``), the paper's figure, and a verdict from a rule stated
with the claim: *held* when the interval lies on the claim's side of the rule's threshold, *not
held* when it lies on the other side, *inconclusive* when it spans the threshold. Settings are never
chosen on these numbers (they are test-set scores). Nothing here imports torch."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from statistics import fmean as mean

from minimodel.report.curves import Speedup
from minimodel.report.formatting import NO_TARGET, fmt_speedup, no_interval
from minimodel.report.intervals import bootstrap, only_pretrainings, seeds_of_system
from minimodel.report.marks import counted, rested
from minimodel.report.reading import REFERENCE, Results
from minimodel.report.selection import restrict
from minimodel.report.statistics import Interval
from minimodel.report.tables import system_speedup

MINIJOINT, MINIPOST, BL_SMALL = "minijoint", "minipost", "bl_small"
DISTANT = ("tr", "hi", "ur", "ja", "ko")  # SOV languages, the most distant from English (paper, §5.4)
CLOSE = ("de", "es", "fr")  # the three closest to English in the paper's set
Estimate = Callable[[Results], float]


TEXTS: dict[int, tuple[str, str, str]] = {  # claim, the paper's figure, the rule for *held*
    1: ("MiniJoint reaches 95% of BL_BASE's final score with less step-2 compute",
        "2.3× average speedup (XNLI: 1.6 vs 2.1 V100-days)",
        "speedup interval above 1×"),
    2: ("MiniPost keeps ~99% of BL_BASE's final score at about half its step-2 cost",
        "99.3% at 54% of the cost (29.3 vs 54.1 EFLOPs)",
        "score ratio interval above 97% and cost ratio at most 60%"),
    3: ("BL_SMALL plateaus below the others (final score)",
        "XNLI: −4.0 vs MiniJoint, −5.7 vs BL_BASE",
        "differences BL_SMALL − MiniJoint and BL_SMALL − BL_BASE below 0"),
    4: ("Shallower mini-models adapt faster but plateau lower",
        "Table 4 / Figure 4: head after layer 2 fastest (de), lowest final score",
        "shallow − deep: speedup difference above 0 and final-score difference below 0"),
    5: ("Dual-head pretraining does not hurt English (MiniJoint vs BL_BASE, English test)",
        "86.2 vs 86.4 (−0.2)",
        "difference interval above −1 point"),
    6: ("Distant (SOV) languages need more compute to reach the target than close ones (BL_BASE)",
        "XNLI: tr 2.3 days vs de/es/fr 0.9 on average (2.6×)",
        "ratio of V100-days (distant / close) above 1"),
}


EXTENSION_TEXTS: dict[str, tuple[str, str]] = {  # claim, the rule for *held* (none of these is in the paper)
    "multi": ("One multi-head pretraining gives mini-models as good as dedicated ones (final score, same depth)",
              "difference multi-head − dedicated above −1 point"),
    "progressive": ("Progressive adaptation (shallow to deep heads) reaches the target sooner than a fixed depth "
                    "without a lower final score",
                    "speedup difference progressive − fastest fixed head above 0 and final-score difference "
                    "above −1 point"),
    "forget": ("Active forgetting in pretraining makes MiniJoint reach the target sooner",
               "speedup difference with − without forgetting above 0"),
    "focus": ("FOCUS initialisation reaches BL_BASE's target sooner than overlap initialisation (BL_BASE)",
              "speedup of BL_BASE+FOCUS over BL_BASE (overlap) above 1×"),
    "focus_joint": ("MiniJoint+FOCUS beats both alone: its speedup over BL_BASE (overlap) is larger than "
                    "MiniJoint's and than BL_BASE+FOCUS's",
                    "speedup difference MiniJoint+FOCUS − max(MiniJoint, BL_BASE+FOCUS) above 0"),
    "focus_final": ("FOCUS initialisation does not lower the final score by more than 1 point",
                    "final-score difference FOCUS − overlap (same system) above −1 point"),
    "forget_low": ("Active forgetting helps when step 2 has little data (final score, low-data adaptation; the "
                   "forgetting paper reports its largest gains there)",
                   "final-score difference with − without forgetting above 0"),
}
NOT_IN_PAPER = "— (not in the paper)"


@dataclass(frozen=True)
class VariantInfo:
    """What a MiniJoint-like variant of an experiment is, for the claims beyond the paper."""

    depth: int  # layers of its step-2 body (progressive: the deepest phase's)
    pretraining: str  # the label of the step-1 run it adapts over (shared by the heads of one multi-head model)
    multi_head: bool = False
    progressive: bool = False
    forget: bool = False
    data_fraction: float = 1.0
    init: str = "overlap"  # adapt.init: how step 2 initialises the target embeddings

    @property
    def plain(self) -> bool:
        """A dedicated single-head MiniJoint, standard pretraining, the whole target corpus, overlap initialisation."""
        return (not (self.multi_head or self.progressive or self.forget) and self.data_fraction == 1.0
                and self.init == "overlap")


@dataclass(frozen=True)
class Claim:
    claim: str
    paper: str
    rule: str  # what "held" means here
    ours: str  # the estimate with its interval and n
    verdict: str  # held / not held / inconclusive / not measured / exploratory
    langs: tuple[str, ...] | None = None  # the languages it rests on (None: every language of the task)


def avg_final(res: Results, system: str, task: str) -> float:
    finals = [res.final(system, task, lang) for lang in res.langs(task)]
    return math.nan if not finals or any(f is None for f in finals) else mean(f.score for f in finals)  # type: ignore[union-attr]


def final_cost(res: Results, system: str, task: str) -> float:
    """Step-2 FLOPs to the last checkpoint, averaged over languages."""
    finals = [f for lang in res.langs(task) if (f := res.final(system, task, lang)) is not None]
    return mean(f.flops for f in finals) if finals else math.nan


def verdict(iv: Interval, above: float | None = None, below: float | None = None) -> str:
    """held when the whole interval is above ``above`` (or below ``below``), not held when it is wholly on the other
    side, inconclusive otherwise; not measured without an estimate, no interval when too few resamples give one
    (``statistics.MIN_DEFINED``)."""
    if math.isnan(iv.point):
        return "not measured"
    if math.isnan(iv.low):
        return "no interval"
    if above is not None:
        return "held" if iv.low > above else ("not held" if iv.high < above else "inconclusive")
    assert below is not None
    return "held" if iv.high < below else ("not held" if iv.low > below else "inconclusive")


def speedup_verdict(iv: Interval, sp: Speedup) -> str:
    """``verdict`` of a speedup claim (above 1×), saying why there is no estimate: where the system never reaches
    BL_BASE's target the claim is not held, where the target is met before any update the speedup is undefined."""
    if math.isnan(iv.point) and not sp.used:
        if sp.excluded:
            return "not held (never reaches the target)"
        if sp.undefined:
            return "undefined (target met at step 0)"
    return verdict(iv, above=1.0)


def coverage(sp: Speedup, langs: Sequence[str]) -> str:
    """Which languages a speedup averages, of those that count (``marks.counted``), and why the others are not in
    it."""
    parts = [f"{len(sp.used)}/{len(counted(sp, langs))} langs reach the target"]
    parts += [f"{what}: {', '.join(ls)}" for what, ls in (("never", sp.excluded), ("at step 0", sp.undefined),
                                                          (f"target {NO_TARGET}", sp.no_target)) if ls]
    return f" ({'; '.join(parts)})"


def _both(a: str, b: str) -> str:
    if a == b:
        return a
    for worst in ("not measured", "not held", "no interval"):
        if worst in (a, b):
            return worst
    return "inconclusive"


def _iv(iv: Interval, fmt: Callable[[float], str]) -> str:
    if math.isnan(iv.low) and not math.isnan(iv.point):
        return f"{fmt(iv.point)} ({no_interval(iv)})"
    return f"{fmt(iv.point)} [{fmt(iv.low)}, {fmt(iv.high)}]"


def _points(x: float) -> str:
    return "—" if math.isnan(x) else f"{x:+.1f}"


def pct(x: float) -> str:
    return "—" if math.isnan(x) else f"{100 * x:.1f}%"


def _n(res: Results, *systems: str) -> str:
    return "n=" + "/".join(str(len(seeds_of_system(res, s))) for s in systems)


def _has(res: Results, *systems: str) -> bool:
    return all(any(k[0] == s for k in res.curves) for s in systems)


def claims(res: Results, task: str, depths: Mapping[str, int] | None = None, reps: int = 2000) -> list[Claim]:
    """Every claim the results can speak to (a row saying "not measured" for the others)."""
    out: list[Claim] = []

    def b(systems: list[str], est: Estimate) -> Interval:
        return bootstrap(res, systems, est, reps=reps)

    # 1. MiniJoint: near-maximal performance with less step-2 compute
    claim, paper, rule = TEXTS[1]
    if _has(res, REFERENCE, MINIJOINT):
        iv = b([REFERENCE, MINIJOINT], lambda r: system_speedup(r, MINIJOINT, task).mean)
        sp = system_speedup(res, MINIJOINT, task)
        where = coverage(sp, res.langs(task))
        out.append(Claim(claim, paper, rule, _iv(iv, fmt_speedup) + where + f", {_n(res, REFERENCE, MINIJOINT)}",
                         rested(speedup_verdict(iv, sp), sp, res.langs(task)), tuple(sp.used)))
    else:
        out.append(Claim(claim, paper, rule, "—", "not measured"))

    # 2. MiniPost: ~99% of BL_BASE's final score at about half its cost
    claim, paper, rule = TEXTS[2]
    if _has(res, REFERENCE, MINIPOST):
        iv = b([REFERENCE, MINIPOST], lambda r: avg_final(r, MINIPOST, task) / avg_final(r, REFERENCE, task))
        cost = final_cost(res, MINIPOST, task) / final_cost(res, REFERENCE, task)
        v = verdict(iv, above=0.97)
        if v == "held" and not cost <= 0.6:
            v = "not held"
        out.append(Claim(claim, paper, rule, f"{_iv(iv, pct)} at {pct(cost)} of the cost, "
                         f"{_n(res, REFERENCE, MINIPOST)}", v))
    else:
        out.append(Claim(claim, paper, rule, "—", "not measured"))

    # 3. BL_SMALL plateaus below the others
    claim, paper, rule = TEXTS[3]
    others = [s for s in (MINIJOINT, REFERENCE) if _has(res, s)]
    if _has(res, BL_SMALL) and others:
        parts, verdicts = [], []
        for other in others:
            iv = b([BL_SMALL, other], lambda r, o=other: avg_final(r, BL_SMALL, task) - avg_final(r, o, task))
            parts.append(f"{_iv(iv, _points)} vs {other}")
            verdicts.append(verdict(iv, below=0.0))
        v = verdicts[0] if len(verdicts) == 1 else _both(*verdicts)
        out.append(Claim(claim, paper, rule, "; ".join(parts) + f", {_n(res, BL_SMALL, *others)}", v))
    else:
        out.append(Claim(claim, paper, rule, "—", "not measured"))

    # 4. Shallower mini-models adapt faster but plateau lower
    claim, paper, rule = TEXTS[4]
    known = {s: d for s, d in (depths or {}).items() if _has(res, s)}
    if len(known) >= 2 and _has(res, REFERENCE):
        shallow, deep = min(known, key=known.get), max(known, key=known.get)  # type: ignore[arg-type]
        faster = b([REFERENCE, shallow, deep], lambda r: system_speedup(r, shallow, task).mean
                   - system_speedup(r, deep, task).mean)
        lower = b([shallow, deep], lambda r: avg_final(r, shallow, task) - avg_final(r, deep, task))
        v = _both(verdict(faster, above=0.0), verdict(lower, below=0.0))
        out.append(Claim(claim, paper, rule, f"N={known[shallow]} vs N={known[deep]}: speedup "
                         f"{_iv(faster, lambda x: f'{x:+.2f}×')}, final {_iv(lower, _points)}, "
                         f"{_n(res, shallow, deep)}", v))
    else:
        out.append(Claim(claim, paper, rule, "— (needs two MiniJoint depths)", "not measured"))

    # 5. Dual-head pretraining does not hurt English
    claim, paper, rule = TEXTS[5]
    key_mj, key_bl = (MINIJOINT, "primary", task), (REFERENCE, "primary", task)
    if key_mj in res.english_by_seed and key_bl in res.english_by_seed:
        iv = b([REFERENCE, MINIJOINT], lambda r: r.english.get(key_mj, math.nan) - r.english.get(key_bl, math.nan))
        out.append(Claim(claim, paper, rule, f"{_iv(iv, _points)}, {_n(res, REFERENCE, MINIJOINT)}",
                         verdict(iv, above=-1.0)))
    else:
        out.append(Claim(claim, paper, rule, "—", "not measured"))

    # 6. Distant languages are slower
    claim, paper, rule = TEXTS[6]
    langs = res.langs(task)
    far, close = [x for x in DISTANT if x in langs], [x for x in CLOSE if x in langs]
    if _has(res, REFERENCE) and far and close:
        def ratio(r: Results) -> float:
            days = {x: r.days_to_target(REFERENCE, task, x) for x in (*far, *close)}
            if any(d is None or math.isinf(d) or d <= 0 or r.target_flag(task, x) for x, d in days.items()):
                return math.nan
            return mean(days[x] for x in far) / mean(days[x] for x in close)  # type: ignore[misc]
        iv = b([REFERENCE], ratio)
        out.append(Claim(claim, paper, rule, f"{'/'.join(far)} vs {'/'.join(close)}: {_iv(iv, fmt_speedup)}, "
                         f"{_n(res, REFERENCE)}", verdict(iv, above=1.0)))
    else:
        out.append(Claim(claim, paper, rule, f"— (needs BL_BASE, one of {', '.join(DISTANT)} and one of "
                         f"{', '.join(CLOSE)})", "not measured"))
    return out


def extension_claims(res: Results, task: str, variants: Mapping[str, VariantInfo], reps: int = 2000) -> list[Claim]:
    """The claims about minimodel's extensions of the method (multi-head pretraining, progressive adaptation,
    active forgetting), one row for each the experiment has the variants for."""
    out: list[Claim] = []
    known = {label: v for label, v in variants.items() if _has(res, label)}

    def b(systems: list[str], est: Estimate) -> Interval:
        return bootstrap(res, systems, est, reps=reps)

    def final_diff(a: str, c: str) -> Interval:
        return b([a, c], lambda r: avg_final(r, a, task) - avg_final(r, c, task))

    def speed_diff(a: str, c: str) -> Interval:
        return b([REFERENCE, a, c], lambda r: system_speedup(r, a, task).mean - system_speedup(r, c, task).mean)

    def speed(x: float) -> str:
        return f"{x:+.2f}×"

    def match(v: VariantInfo, w: VariantInfo) -> bool:
        return v.depth == w.depth and v.data_fraction == w.data_fraction and v.init == w.init

    pairs = [(m, d) for m, v in known.items() if v.multi_head and not (v.progressive or v.forget)
             for d, w in known.items() if w.plain and match(v, w)]
    if pairs:
        claim, rule = EXTENSION_TEXTS["multi"]
        parts, verdicts = [], []
        for m, d in pairs:
            iv = final_diff(m, d)
            parts.append(f"{m} − {d} (N={known[m].depth}): {_iv(iv, _points)}, {_n(res, m, d)}")
            verdicts.append(verdict(iv, above=-1.0))
        out.append(Claim(claim, NOT_IN_PAPER, rule, "; ".join(parts), _all(verdicts)))

    if _has(res, REFERENCE):
        for p, v in known.items():
            if not v.progressive:
                continue
            fixed = [f for f, w in known.items() if w.pretraining == v.pretraining and not w.progressive
                     and w.data_fraction == v.data_fraction]
            if not fixed:
                continue
            fastest = max(fixed, key=lambda f: system_speedup(res, f, task).mean)
            claim, rule = EXTENSION_TEXTS["progressive"]
            s_iv, f_iv = speed_diff(p, fastest), final_diff(p, fastest)
            out.append(Claim(claim, NOT_IN_PAPER, rule,
                             f"{p} vs {fastest}: speedup {_iv(s_iv, speed)}, final {_iv(f_iv, _points)}, "
                             f"{_n(res, p, fastest)}", _both(verdict(s_iv, above=0.0), verdict(f_iv, above=-1.0))))

    plain_pairs = [(f, c) for f, v in known.items() if v.forget and not (v.progressive or v.multi_head)
                   for c, w in known.items() if not (w.forget or w.progressive or w.multi_head) and match(v, w)]
    full = [(f, c) for f, c in plain_pairs if known[f].data_fraction == 1.0]
    if full and _has(res, REFERENCE):
        claim, rule = EXTENSION_TEXTS["forget"]
        ivs = [(f, c, speed_diff(f, c)) for f, c in full]
        out.append(Claim(claim, NOT_IN_PAPER, rule,
                         "; ".join(f"{f} − {c}: {_iv(iv, speed)}, {_n(res, f, c)}" for f, c, iv in ivs),
                         _all([verdict(iv, above=0.0) for _, _, iv in ivs])))
    low = [(f, c) for f, c in plain_pairs if known[f].data_fraction < 1.0]
    if low:
        claim, rule = EXTENSION_TEXTS["forget_low"]
        ivs = [(f, c, final_diff(f, c)) for f, c in low]
        out.append(Claim(claim, NOT_IN_PAPER, rule,
                         "; ".join(f"{f} − {c} ({known[f].data_fraction:.0%} of the corpus): {_iv(iv, _points)}, "
                                   f"{_n(res, f, c)}" for f, c, iv in ivs),
                         _all([verdict(iv, above=0.0) for _, _, iv in ivs])))
    return out


def focus_claims(res: Results, task: str, inits: Mapping[str, str], reps: int = 2000) -> list[Claim]:
    """FOCUS initialisation (``adapt.init=focus``) against the paper's overlap initialisation: (a) BL_BASE+FOCUS
    against BL_BASE, (b) MiniJoint+FOCUS against each alone, (c) the final score of every FOCUS row against its
    overlap twin. ``inits``: label of a FOCUS row -> the label of the same system adapted from overlap.

    A FOCUS row adapts the same pretrained and finetuned models as its twin; where the twins have more pretrainings
    (a pooled row), each comparison keeps only the FOCUS row's pretraining seeds (``only_pretrainings``), so the
    initialisation is the one difference and the seeds stay paired."""
    twins = {f: o for f, o in inits.items() if _has(res, f, o)}
    if not twins or not _has(res, REFERENCE):
        return []
    out: list[Claim] = []

    def speed(x: float) -> str:
        return f"{x:.2f}×"

    def same(systems_: list[str], row: str) -> tuple[Results, str]:
        """``res`` with ``systems_`` at ``row``'s pretraining seeds, and a note naming them."""
        keep = sorted({p for p, _ in seeds_of_system(res, row)})
        return only_pretrainings(res, systems_, keep), f" (pretraining seed{'s' if len(keep) > 1 else ''} " \
                                                        f"{', '.join(map(str, keep))})"

    bl = next((f for f, o in twins.items() if o == REFERENCE), None)
    if bl is not None:
        claim, rule = EXTENSION_TEXTS["focus"]
        r, note = same([REFERENCE], bl)
        iv = bootstrap(r, [REFERENCE, bl], lambda x: system_speedup(x, bl, task).mean, reps=reps)
        sp = system_speedup(r, bl, task)
        out.append(Claim(claim, NOT_IN_PAPER, rule, f"{bl}: {_iv(iv, speed)}{coverage(sp, r.langs(task))}, "
                         f"{_n(r, REFERENCE, bl)}{note}", rested(speedup_verdict(iv, sp), sp, r.langs(task)),
                         tuple(sp.used)))
    mj = next((f for f, o in twins.items() if o == MINIJOINT), None)
    if bl is not None and mj is not None:
        claim, rule = EXTENSION_TEXTS["focus_joint"]

        def gain(x: Results) -> float:
            alone = (system_speedup(x, MINIJOINT, task).mean, system_speedup(x, bl, task).mean)
            return system_speedup(x, mj, task).mean - max(alone)  # nan when any is undefined
        r, note = same([REFERENCE, MINIJOINT, bl], mj)
        iv = bootstrap(r, [REFERENCE, MINIJOINT, bl, mj], gain, reps=reps)
        out.append(Claim(claim, NOT_IN_PAPER, rule, f"{mj} − max({MINIJOINT}, {bl}): "
                         f"{_iv(iv, lambda x: f'{x:+.2f}×')}, {_n(r, mj, MINIJOINT, bl)}{note}",
                         verdict(iv, above=0.0)))
    claim, rule = EXTENSION_TEXTS["focus_final"]
    ivs = []
    for f, o in twins.items():
        r, note = same([o], f)
        iv = bootstrap(r, [f, o], lambda x, f=f, o=o: avg_final(x, f, task) - avg_final(x, o, task), reps=reps)
        ivs.append((f, o, iv, _n(r, f, o) + note))
    out.append(Claim(claim, NOT_IN_PAPER, rule, "; ".join(f"{f} − {o}: {_iv(iv, _points)}, {n}" for f, o, iv, n in ivs),
                     _all([verdict(iv, above=-1.0) for _, _, iv, _ in ivs])))
    return out


def _all(verdicts: list[str]) -> str:
    return reduce(_both, verdicts)


PER_LANGUAGE = (5, 6)  # the paper's claims not about one language: English (5), distant vs close languages (6)


def all_claims(res: Results, task: str, depths: Mapping[str, int] | None, reps: int,
               variants: Mapping[str, VariantInfo] | None, inits: Mapping[str, str] | None) -> list[Claim]:
    return (claims(res, task, depths, reps) + extension_claims(res, task, variants or {}, reps)
            + focus_claims(res, task, inits or {}, reps))


def claims_table(res: Results, depths: Mapping[str, int] | None = None, tasks: Sequence[str] | None = None,
                 reps: int = 2000, variants: Mapping[str, VariantInfo] | None = None,
                 inits: Mapping[str, str] | None = None, family: str = "") -> str:
    """The claims as a Markdown table per task (the paper's, then those about minimodel's extensions), each with its
    language coverage and its verdict in each language alone. ``family``: the title of a model family the paper did
    not study (a decoder-only LM): the paper's claims are then marked "not in the paper", its figures (about MLMs)
    given for comparison."""
    blocks = []
    for task in tasks or res.tasks:
        langs = res.langs(task)
        rows = all_claims(res, task, depths, reps, variants, inits)
        alone = {lang: {c.claim: c.verdict for c in all_claims(restrict(res, task, [lang]), task, depths, reps,
                                                                variants, inits)} for lang in langs}
        lines = ["| claim | paper | ours: estimate [95% interval] | rule for *held* | verdict | languages | "
                 "per language |", "|---|---|---|---|---|---|---|"]
        for i, c in enumerate(rows):
            single = i + 1 in PER_LANGUAGE and i < len(TEXTS)
            per = "—" if single or len(langs) < 2 else ", ".join(
                f"{lang} {alone[lang].get(c.claim, 'not measured')}" for lang in langs)
            paper = f"{NOT_IN_PAPER}; for MLMs: {c.paper}" if family and c.paper != NOT_IN_PAPER else c.paper
            rests = langs if c.langs is None else list(c.langs)
            lines.append(f"| {c.claim} | {paper} | {c.ours} | {c.rule} | **{c.verdict}** | "
                         f"{', '.join(rests) or 'none'} ({len(rests)} of {len(langs)}) | {per} |")
        blocks.append(f"**{task}**\n\n" + "\n".join(lines))
    return "\n\n".join(blocks)

