"""Adaptation curves and the paper's measures on them: the time (V100-days) at which a curve first reaches a target,
and the speedup over the reference as the mean of per-language ratios. Plain curves in, plain numbers out."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean as mean


@dataclass(frozen=True)
class Point:
    """One adaptation checkpoint's score (averaged over seeds) and the adaptation cost up to it."""

    step: int
    flops: float
    days: float
    score: float


def mean_curve(curves: Sequence[Sequence[Point]]) -> list[Point]:
    """The average of per-seed curves at the steps all of them have (a seed may appear twice: a resample)."""
    by_step = [{p.step: p for p in c} for c in curves]
    steps = sorted(set.intersection(*(set(b) for b in by_step)))
    n = len(by_step)
    # math.fsum / n is exactly statistics.fmean (a correctly rounded sum), without its per-item counting: the
    # bootstrap calls this millions of times
    return [Point(step, math.fsum([b[step].flops for b in by_step]) / n, math.fsum([b[step].days for b in by_step]) / n,
                  math.fsum([b[step].score for b in by_step]) / n) for step in steps]


def time_to_target(xs: Sequence[float], scores: Sequence[float], target: float) -> float:
    """The x at which ``scores`` first reach ``target``, linearly interpolated between the checkpoint
    before and the first checkpoint that reaches it; ``xs[0]`` when the first one already does (no
    earlier point); ``math.inf`` when none does. Later dips do not matter.

    >>> time_to_target([5000, 10000], [48, 52], 50)
    7500.0
    """
    if len(xs) != len(scores):
        raise ValueError(f"{len(xs)} xs but {len(scores)} scores")
    if any(b < a for a, b in zip(xs, xs[1:])):
        raise ValueError("xs must be ascending")
    tol = 1e-9 * max(1.0, abs(target))  # 0.95 * 80 is 75.99999999999999 in floating point
    for i, s in enumerate(scores):
        if s >= target - tol:
            if i == 0:
                return float(xs[0])
            x0, x1, s0 = xs[i - 1], xs[i], scores[i - 1]
            frac = min(1.0, max(0.0, (target - s0) / (s - s0)))
            return float(x0 + frac * (x1 - x0))
    return math.inf


def uninformative_target(target: float, baseline: float | None, ref_step0: float | None) -> bool:
    """The target is at or below the chance bar (``baseline``: the better of the majority class and the input-blind
    predictor, ``Results.chance_bar``) or the reference's step-0 score (the unadapted embeddings): reaching it means
    nothing, so it is left out of speedups and of averages of days."""
    tol = 1e-9 * max(1.0, abs(target))
    return any(b is not None and target <= b + tol for b in (baseline, ref_step0))


def mean_days(days: Sequence[float]) -> float:
    """The average over languages of the days to target, a number only when every language reaches the target after
    some adaptation: ∞ when none ever does; nan (not a number) when one reaches it at step 0 (0 days), when some but
    not all never do, or when one has no measurable time (nan: its target is uninformative).

    >>> mean_days([1.0, 3.0]), mean_days([1.0, 0.0]), mean_days([1.0, math.inf]), mean_days([math.inf])
    (2.0, nan, nan, inf)
    """
    if not days or any(math.isnan(d) for d in days):
        return math.nan
    if all(math.isinf(d) for d in days):
        return math.inf
    return math.nan if any(math.isinf(d) or d <= 0 for d in days) else mean(days)


@dataclass(frozen=True)
class Speedup:
    """Mean over languages of BL_BASE days / system days; ``excluded``: languages where a side never reaches
    the target (∞); ``undefined``: languages where a side reaches it at step 0 (0 days: no ratio);
    ``no_target``: languages whose target is uninformative (``uninformative_target``)."""

    mean: float  # nan when no language is usable
    used: tuple[str, ...]
    excluded: tuple[str, ...]
    undefined: tuple[str, ...] = ()
    no_target: tuple[str, ...] = ()


def speedups(base_days: Mapping[str, float], system_days: Mapping[str, float],
             skip: Collection[str] = ()) -> Speedup:
    """Average speedup over the reference: the MEAN of the per-language ratios (not the ratio of mean
    days), over the languages both have; languages where either side is ∞ are excluded, and those in ``skip``
    (uninformative targets) are left out.

    >>> speedups({"ar": 10.0, "de": 2.0}, {"ar": 1.0, "de": 2.0}).mean  # (10 + 1) / 2, not 6 / 1.5
    5.5
    """
    used, excluded, undefined, ratios = [], [], [], []
    both = sorted(set(base_days) & set(system_days))
    no_target = tuple(lang for lang in both if lang in skip)
    for lang in both:
        b, s = base_days[lang], system_days[lang]
        if lang in skip:
            continue
        if math.isinf(b) or math.isinf(s):
            excluded.append(lang)
        elif b <= 0 or s <= 0:  # the target is met before any adaptation: no compute to compare
            undefined.append(lang)
        else:
            used.append(lang)
            ratios.append(b / s)
    return Speedup(sum(ratios) / len(ratios) if ratios else math.nan, tuple(used), tuple(excluded), tuple(undefined),
                   no_target)
