"""Statistics over seeds: mean and sample standard deviation, percentile intervals, and the two-level bootstrap
draw of a system's (pretraining seed, finetuning seed) samples. Plain numbers in, plain numbers out: nothing here
knows about results files or systems."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean as mean


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (n - 1; 0 when n is 1) of ``n`` values, e.g. over finetuning seeds."""

    mean: float
    std: float
    n: int


def stat(values: Sequence[float]) -> Stat:
    values = list(values)
    if not values:
        raise ValueError("no values")
    m = mean(values)
    if len(values) < 2 or any(math.isinf(v) for v in values):
        return Stat(m, 0.0 if len(values) < 2 else math.nan, len(values))
    return Stat(m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)), len(values))


MIN_DEFINED = 0.95
"""An interval is reported only when its point estimate is a number and at least this share of the bootstrap
resamples give a number too (``percentile_interval``); otherwise low and high are nan."""


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval (``level``, e.g. 0.95); ``undefined``: the share of
    resamples that gave no number (nan). low and high are nan when the point is nan or that share is above
    1 - ``MIN_DEFINED``: no interval."""

    point: float
    low: float
    high: float
    level: float = 0.95
    undefined: float = 0.0

    def spans(self, x: float) -> bool:
        return self.low <= x <= self.high


Seeds = tuple[int, int]
"""One sample of a system: (pretraining seed, finetuning seed). Scores are averaged over every sample; bootstrap
intervals resample pretraining seeds, then finetuning seeds within each (``draw``)."""


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of ascending values (∞ allowed)."""
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def percentile_interval(point: float, replicates: list[float], level: float = 0.95) -> Interval:
    """``point`` with the nearest-rank percentile interval of the bootstrap ``replicates`` (nan ones left out), or
    no interval (nan bounds) when ``point`` is nan or fewer than ``MIN_DEFINED`` of the replicates are numbers: an
    interval drawn from the few resamples where an undefined estimate happens to be defined is not one."""
    reps = sorted(r for r in replicates if not math.isnan(r))
    undefined = 1 - len(reps) / len(replicates) if replicates else 1.0
    if math.isnan(point) or not reps or len(reps) < MIN_DEFINED * len(replicates) - 1e-9:
        return Interval(point, math.nan, math.nan, level, undefined)
    return Interval(point, _percentile(reps, (1 - level) / 2), _percentile(reps, 1 - (1 - level) / 2), level,
                    undefined)


def draw(rng: random.Random, seeds: Sequence[Seeds]) -> list[Seeds]:
    """A bootstrap resample of a system's samples: its pretraining seeds with replacement, then, within each drawn
    pretraining seed, its finetuning seeds with replacement (a two-level bootstrap: samples of one pretraining
    are not independent). With one pretraining seed, the finetuning seeds with replacement."""
    by_pretraining: dict[int, list[Seeds]] = defaultdict(list)
    for x in seeds:
        by_pretraining[x[0]].append(x)
    if len(by_pretraining) == 1:
        return rng.choices(list(seeds), k=len(seeds))
    chosen = rng.choices(sorted(by_pretraining), k=len(by_pretraining))
    return [x for p in chosen for x in rng.choices(by_pretraining[p], k=len(by_pretraining[p]))]
