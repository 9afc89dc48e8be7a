"""Bootstrap intervals over seeds: ``Results`` as if each system had a resample of its seeds, the percentile interval
of any estimate over such resamples (paired when systems share their seeds), and the time to the near-maximal target
and the speedup over BL_BASE with their intervals (``TimeToTarget``)."""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import fmean as mean
from typing import Any

from minimodel.report.curves import Point, mean_curve, mean_days, speedups, time_to_target, uninformative_target
from minimodel.report.reading import NEAR_MAX, REFERENCE, Results
from minimodel.report.statistics import Interval, Seeds, draw, percentile_interval

BOOTSTRAP_REPS = 2000  # resamples of the seeds behind every interval


def seeds_of_system(res: Results, system: str) -> list[Seeds]:
    """Every (pretraining, finetuning) seed pair with results of ``system`` (adaptation curves or English scores)."""
    found = {seed for (s, _, _), v in res.by_seed.items() if s == system for seed in v}
    found |= {seed for (s, _, _), v in res.english_by_seed.items() if s == system for seed in v}
    return sorted(found)


def _curve(cache: dict | None, key: tuple, seeds: Mapping[Seeds, Sequence[Point]], chosen: Sequence[Seeds]
           ) -> list[Point]:
    """``mean_curve`` of the ``chosen`` seeds' curves, kept in ``cache`` under their multiset: a bootstrap draws the
    same few multisets of a handful of seeds thousands of times, and the mean does not depend on their order (a
    correctly rounded sum), so a kept curve is the one computing it again would give."""
    if cache is None:
        return mean_curve([seeds[x] for x in chosen])
    k = (key, tuple(sorted(chosen)))
    if k not in cache:
        cache[k] = mean_curve([seeds[x] for x in chosen])
    return cache[k]


def resample(res: Results, draws: Mapping[str, Sequence[Seeds]], curves: dict | None = None) -> Results:
    """``res`` as if the seeds of each system were ``draws[system]`` (repeats allowed: a bootstrap resample);
    systems not in ``draws`` keep their seeds. Curves are the averages over the drawn seeds; ``curves`` keeps them
    across resamples (``mean_curve`` depends on the drawn seeds as a multiset: its sums are correctly rounded)."""
    out = Results(metrics=res.metrics, baselines=res.baselines, chance=res.chance, n_rows=res.n_rows,
                  split=res.split)
    for key, seeds in res.by_seed.items():
        if key[0] not in draws:  # not resampled: its curves as they are (the same mean: fsum does not depend on order)
            out.by_seed[key], out.curves[key] = seeds, res.curves[key]
            continue
        chosen = [x for x in draws[key[0]] if x in seeds]
        if chosen:
            out.by_seed[key] = {(1, i): seeds[x] for i, x in enumerate(chosen)}
            out.curves[key] = _curve(curves, key, seeds, chosen)
    for key, values in res.english_by_seed.items():
        if key[0] not in draws:
            out.english_by_seed[key], out.english[key] = values, res.english[key]
            continue
        chosen = [x for x in draws[key[0]] if x in values]
        if chosen:
            out.english_by_seed[key] = {(1, i): values[x] for i, x in enumerate(chosen)}
            out.english[key] = mean(values[x] for x in chosen)
    out.seeds = {x for v in out.by_seed.values() for x in v}
    return out


def only_pretrainings(res: Results, systems_: Collection[str], keep: Collection[int]) -> Results:
    """``res`` with the samples of ``systems_`` restricted to the pretraining seeds in ``keep`` (seed labels kept, so
    systems built on the same finetuned models stay paired in ``bootstrap``); a system with none of them is dropped."""
    out = replace(res, curves=dict(res.curves), by_seed=dict(res.by_seed), english=dict(res.english),
                  english_by_seed=dict(res.english_by_seed))
    for key, seeds in res.by_seed.items():
        if key[0] in systems_:
            kept = {x: c for x, c in seeds.items() if x[0] in keep}
            del out.by_seed[key], out.curves[key]
            if kept:
                out.by_seed[key], out.curves[key] = kept, mean_curve(list(kept.values()))
    for key, values in res.english_by_seed.items():
        if key[0] in systems_:
            kept_values = {x: v for x, v in values.items() if x[0] in keep}
            del out.english_by_seed[key], out.english[key]
            if kept_values:
                out.english_by_seed[key], out.english[key] = kept_values, mean(kept_values.values())
    out.seeds = {x for v in out.by_seed.values() for x in v}
    return out


def bootstrap(res: Results, systems_: Sequence[str], estimate: Any, reps: int = BOOTSTRAP_REPS,
              seed: int = 0, level: float = 0.95) -> Interval:
    """Percentile bootstrap interval of ``estimate(results)`` (a float, nan: not computable) over finetuning seeds.
    The seeds of ``systems_`` are resampled jointly when the systems have the same seeds (paired: e.g. MiniPost
    evaluates BL_BASE's finetuned models), otherwise independently per system."""
    seeds = {s: seeds_of_system(res, s) for s in systems_}
    paired = len({tuple(v) for v in seeds.values()}) == 1
    rng = random.Random(seed)
    replicates = []
    curves: dict = {}
    for _ in range(reps):
        if paired:
            drawn = draw(rng, seeds[systems_[0]])
            draws = {s: drawn for s in systems_}
        else:
            draws = {s: draw(rng, v) for s, v in seeds.items() if v}
        replicates.append(estimate(resample(res, draws, curves)))
    return percentile_interval(estimate(res), replicates, level)


@dataclass(frozen=True)
class TimeToTarget:
    """V100-days to the near-maximal target (averaged over languages) and the speedup over BL_BASE, each with a
    bootstrap interval over finetuning seeds (resampled jointly when both systems have the same seeds: the
    seeds are then paired, e.g. MiniPost evaluates BL_BASE's finetuned models)."""

    days: Interval
    speedup: Interval
    seeds: int
    paired: bool


def time_to_target_interval(res: Results, system: str, task: str, reps: int = BOOTSTRAP_REPS,
                            seed: int = 0) -> TimeToTarget | None:
    """``TimeToTarget`` of ``system`` on ``task``; None without BL_BASE or without seeds for every language. Each
    resample reruns the whole measure: its targets, which of them are uninformative, which languages reach them."""
    langs = res.langs(task)
    mine, ref = res.seeds_of(system, task), res.seeds_of(REFERENCE, task)
    if not langs or not mine or not ref or any((s, task, lang) not in res.by_seed
                                                for s in (system, REFERENCE) for lang in langs):
        return None
    paired = mine == ref
    curves: dict = {}

    def estimate(my_seeds: Sequence[Seeds], ref_seeds: Sequence[Seeds]) -> tuple[float, float]:
        mine_days, ref_days, no_target = {}, {}, set()
        for lang in langs:
            ref_curve = _curve(curves, (REFERENCE, task, lang), res.by_seed[(REFERENCE, task, lang)], ref_seeds)
            my_curve = _curve(curves, (system, task, lang), res.by_seed[(system, task, lang)], my_seeds)
            if not ref_curve or not my_curve:
                return math.nan, math.nan
            target = NEAR_MAX * ref_curve[-1].score
            if uninformative_target(target, res.chance_bar(task, lang),
                                    ref_curve[0].score if ref_curve[0].step == 0 else None):
                no_target.add(lang)
            ref_days[lang] = time_to_target([p.days for p in ref_curve], [p.score for p in ref_curve], target)
            mine_days[lang] = time_to_target([p.days for p in my_curve], [p.score for p in my_curve], target)
        days = mean_days([math.nan if lang in no_target else d for lang, d in mine_days.items()])
        return days, speedups(ref_days, mine_days, skip=no_target).mean

    rng = random.Random(seed)
    replicates = []
    for _ in range(reps):
        drawn = draw(rng, mine)
        replicates.append(estimate(drawn, drawn if paired else draw(rng, ref)))
    days, speedup = estimate(mine, ref)
    return TimeToTarget(percentile_interval(days, [d for d, _ in replicates]),
                        percentile_interval(speedup, [s for _, s in replicates]), len(mine), paired)
