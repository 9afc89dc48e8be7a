"""Compute accounting (cost tables from the paper's formulas) and result analysis (the paper's Tables 2-5
and Figures 1 and 3 from the experiment's ``results.jsonl`` files, written as ``report.md``)."""

from __future__ import annotations

import math
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean as mean
from typing import Any

from minimodel import atomic, systems
from minimodel.config.schema import ExperimentConfig, pooled_label
from minimodel.flops import adapt_flops, bridge_flops, pretrain_flops, v100_days
from minimodel.layout import Layout
from minimodel.results import ResultsTable


def cost_rows(cfg: ExperimentConfig) -> list[dict]:
    """One row per training step of the experiment's system: what trains, over how many layers, and its cost
    (A1 pretraining, A4 bridge, A3 adaptation over the step-2 body; ``systems.FORMULAS``)."""
    system, m, d = systems.of(cfg), cfg.model, cfg.data
    common = dict(hidden=m.hidden, seq_len=d.seq_len, vocab=m.vocab_size, mask_prob=d.mask_prob)
    p = cfg.pretrain.optim
    extra = len(m.mini_heads)
    shared = f" ({systems.get(system.primary_from).title}, shared)" if system.primary_from else ""
    rows = [{"step": "1 pretrain" + shared, "formula": systems.FORMULAS["pretrain"] + (f" + {extra} head" if extra else ""),
             "layers": m.layers, "updates": p.updates, "batch": p.global_batch,
             "flops": pretrain_flops(m.layers, batch=p.global_batch, updates=p.updates, extra_heads=extra, **common)}]
    if system.bridge:
        b = cfg.bridge
        layers = b.depth + b.layers
        rows.append({"step": "1b bridge", "formula": systems.FORMULAS["bridge"], "layers": layers,
                     "updates": b.optim.updates, "batch": b.optim.global_batch,
                     "flops": bridge_flops(layers, batch=b.optim.global_batch, updates=b.optim.updates,
                                           trainable_layers=b.layers, **common)})
    a, phases = cfg.adapt.optim, systems.adapt_phases(cfg)
    for p in phases if len(phases) > 1 else []:  # progressive adaptation: each phase at its own depth
        rows.append({"step": f"2 adapt phase {p.head} (per language)", "formula": systems.FORMULAS["adapt"],
                     "layers": p.depth, "updates": p.end - p.start, "batch": a.global_batch,
                     "flops": adapt_flops(p.depth, batch=a.global_batch, updates=p.end - p.start, **common)})
    per_lang = sum(adapt_flops(p.depth, batch=a.global_batch, updates=p.end - p.start, **common) for p in phases)
    depth: int | str = phases[0].depth if len(phases) == 1 else "/".join(str(p.depth) for p in phases)
    rows.append({"step": "2 adapt (per language)", "formula": systems.FORMULAS["adapt"], "layers": depth,
                 "updates": a.updates, "batch": a.global_batch, "flops": per_lang})
    n = len(cfg.target_langs)
    if n > 1:
        rows.append({"step": f"2 adapt ({n} languages)", "formula": systems.FORMULAS["adapt"], "layers": depth,
                     "updates": a.updates * n, "batch": a.global_batch, "flops": per_lang * n})
    for r in rows:
        r["v100_days"] = v100_days(r["flops"])
    return rows


def cost_table(cfg: ExperimentConfig) -> str:
    """The experiment's cost as a Markdown table (EFLOPs and V100-days at 30 TFLOP/s)."""
    m, d = cfg.model, cfg.data
    head = (f"{cfg.name} / {cfg.system}: h={m.hidden}, s={d.seq_len}, V={m.vocab_size}, p={d.mask_prob}, "
            f"{len(cfg.target_langs)} target languages\n\n")
    lines = ["| step | formula | layers | updates | batch | EFLOPs | V100-days |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in cost_rows(cfg):
        lines.append(f"| {r['step']} | {r['formula']} | {r['layers']} | {r['updates']:,} | {r['batch']:,} | "
                     f"{r['flops'] / 1e18:.4g} | {r['v100_days']:.4g} |")
    saved = multi_head_saving(cfg)
    return head + "\n".join(lines) + (f"\n\n{saved}" if saved else "")


def multi_head_saving(cfg: ExperimentConfig) -> str:
    """For a model with several secondary heads: step 1 once with every head against one dedicated
    single-head pretraining per depth (A1 + 1 head each), the way a depth sweep would otherwise run."""
    m, d, p = cfg.model, cfg.data, cfg.pretrain.optim
    if len(m.mini_heads) < 2:
        return ""
    common = dict(hidden=m.hidden, seq_len=d.seq_len, vocab=m.vocab_size, mask_prob=d.mask_prob,
                  batch=p.global_batch, updates=p.updates)
    one = pretrain_flops(m.layers, extra_heads=len(m.mini_heads), **common)
    dedicated = len(m.mini_heads) * pretrain_flops(m.layers, extra_heads=1, **common)
    return (f"Step 1 with all {len(m.mini_heads)} secondary heads (after layers {', '.join(map(str, m.mini_heads))}) "
            f"in one pretraining: {one / 1e18:.4g} EFLOPs ({v100_days(one):.4g} V100-days), against "
            f"{dedicated / 1e18:.4g} EFLOPs ({v100_days(dedicated):.4g} V100-days) for one dedicated single-head "
            f"pretraining per depth: {(dedicated - one) / 1e18:.4g} EFLOPs saved "
            f"({1 - one / dedicated:.1%} of the dedicated runs' step 1).")


# --------------------------------------------------------------------------------------------------
# Results analysis: the paper's Tables 2-5 and Figures 1 and 3 from the experiment's results.jsonl files.
# --------------------------------------------------------------------------------------------------

REFERENCE = systems.REFERENCE  # BL_BASE: standard adaptation of the 12-layer model, the reference of every speedup
SYSTEM_ORDER = systems.ORDER
NEAR_MAX = 0.95  # near-maximal performance: 95% of BL_BASE's final score
# depth-sweep labels: minijoint-n2, minipost-n6 (a tag per depth), minijoint@l2 (one head of a multi-head model)
_SWEEP = re.compile(r"^(?P<base>.+?)(?P<sep>-n|@l)(?P<depth>\d+)$")
MISSING = "—"
BELOW = "▼"  # a final score that does not beat the majority-class baseline
AT_STEP0 = "at step 0"  # a target met before any adaptation
DEV_NOTE = (": the target-language dev sets, for choosing settings; the results are the test split's, in "
            "report.md")


@dataclass(frozen=True)
class Point:
    """One adaptation checkpoint's score (averaged over seeds) and the adaptation cost up to it."""

    step: int
    flops: float
    days: float
    score: float


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


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval (``level``, e.g. 0.95)."""

    point: float
    low: float
    high: float
    level: float = 0.95

    def spans(self, x: float) -> bool:
        return self.low <= x <= self.high


Seeds = tuple[int, int]
"""One sample of a system: (pretraining seed, finetuning seed). Scores are averaged over every sample; bootstrap
intervals resample pretraining seeds, then finetuning seeds within each (``draw``)."""


@dataclass
class Results:
    """The results of one experiment, main metric of each task, test split: per seed, and averaged over seeds."""

    curves: dict[tuple[str, str, str], list[Point]] = field(default_factory=dict)  # (system, task, lang) -> by step
    # a sample is a (pretraining seed, finetuning seed) pair (``Seeds``); most systems have one pretraining seed
    by_seed: dict[tuple[str, str, str], dict[Seeds, list[Point]]] = field(default_factory=dict)  # ... -> seeds -> by step
    english: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (system, body, task) -> score
    english_stats: dict[tuple[str, str, str], Stat] = field(default_factory=dict)  # ... over seeds
    english_by_seed: dict[tuple[str, str, str], dict[Seeds, float]] = field(default_factory=dict)  # ... -> seeds -> score
    metrics: dict[str, str] = field(default_factory=dict)  # task -> main metric
    seeds: set[Seeds] = field(default_factory=set)
    n_rows: int = 0
    baselines: dict[tuple[str, str], float] = field(default_factory=dict)  # (task, lang) -> majority-class score
    baseline_metrics: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)  # ... every metric
    split: str = "test"  # the target-language sets the scores are on: test, or dev (choosing settings)

    def set_baselines(self, baselines: Mapping[tuple[str, str], Mapping[str, float]] | None) -> None:
        """The majority-class baseline of each (task, language), every metric; the main metric's is ``baselines``."""
        self.baseline_metrics = {k: dict(v) for k, v in (baselines or {}).items()}
        self.baselines = {(t, lang): v[self.metrics[t]] for (t, lang), v in self.baseline_metrics.items()
                          if t in self.metrics and self.metrics[t] in v}

    def below_baseline(self, system: str, task: str, lang: str) -> bool:
        """The system's final score (mean over seeds) does not beat the majority-class baseline."""
        final, base = self.final_stat(system, task, lang), self.baselines.get((task, lang))
        return final is not None and base is not None and final.mean <= base + 1e-9

    def step0_stat(self, system: str, task: str, lang: str) -> Stat | None:
        """The score of the unadapted embeddings (adaptation step 0: the overlap initialisation) over seeds."""
        seeds = self.by_seed.get((system, task, lang), {})
        values = [p.score for c in seeds.values() for p in c if p.step == 0]
        return stat(values) if values else None

    def at_step0(self, system: str, task: str, lang: str) -> bool:
        """The target is met before any adaptation: the time to target is that of step 0."""
        curve = self.curves.get((system, task, lang))
        target = self.target(task, lang)
        return bool(curve) and target is not None and curve[0].step == 0 and curve[0].score >= target - 1e-9

    @property
    def systems(self) -> list[str]:
        return sort_systems({s for s, _, _ in self.curves})

    @property
    def main_systems(self) -> list[str]:
        return [s for s in self.systems if not _SWEEP.match(s)]

    @property
    def sweep_systems(self) -> list[str]:
        return [s for s in self.systems if _SWEEP.match(s)]

    @property
    def tasks(self) -> list[str]:
        return sorted({t for _, t, _ in self.curves})

    def langs(self, task: str) -> list[str]:
        return sorted({lang for _, t, lang in self.curves if t == task})

    def final(self, system: str, task: str, lang: str) -> Point | None:
        curve = self.curves.get((system, task, lang))
        return curve[-1] if curve else None

    def target(self, task: str, lang: str) -> float | None:
        """95% of BL_BASE's final score: the same target for every system."""
        ref = self.final(REFERENCE, task, lang)
        return None if ref is None else NEAR_MAX * ref.score

    def final_stat(self, system: str, task: str, lang: str) -> Stat | None:
        """The final score over seeds (mean, std, n), at the last step of the seed-averaged curve."""
        final = self.final(system, task, lang)
        if final is None:
            return None
        return stat([p.score for c in self.by_seed[(system, task, lang)].values() for p in c if p.step == final.step])

    def average_stat(self, system: str, task: str) -> Stat | None:
        """The final score averaged over the task's languages, then over seeds; None when a language is missing."""
        langs = self.langs(task)
        finals = [self.final(system, task, lang) for lang in langs]
        if not finals or any(f is None for f in finals):
            return None
        per_seed = [mean(p.score for lang, f in zip(langs, finals)
                         for p in self.by_seed[(system, task, lang)][seed] if p.step == f.step)  # type: ignore[union-attr]
                    for seed in self.seeds_of(system, task)]
        return stat(per_seed)

    def seeds_of(self, system: str, task: str) -> list[Seeds]:
        """The seeds every language of the task has for ``system``."""
        sets = [set(v) for (s, t, _), v in self.by_seed.items() if s == system and t == task]
        return sorted(set.intersection(*sets)) if sets else []

    def days_to_target(self, system: str, task: str, lang: str) -> float | None:
        """V100-days to near-maximal performance; None when the system or the target is missing."""
        target, curve = self.target(task, lang), self.curves.get((system, task, lang))
        if target is None or not curve:
            return None
        return time_to_target([p.days for p in curve], [p.score for p in curve], target)


def sort_systems(labels: Iterable[str]) -> list[str]:
    """The paper's order (BL_BASE, BL_SMALL, MiniJoint, MiniPost), then others; sweep variants by depth."""
    def key(label: str) -> tuple:
        m = _SWEEP.match(label)
        base, depth = (m["base"], int(m["depth"])) if m else (label, -1)
        rank = SYSTEM_ORDER.index(base) if base in SYSTEM_ORDER else len(SYSTEM_ORDER)
        return (m is not None, rank, base, depth, label)
    return sorted(labels, key=key)


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


@dataclass(frozen=True)
class Speedup:
    """Mean over languages of BL_BASE days / system days; ``excluded``: languages where a side never reaches
    the target (∞); ``undefined``: languages where a side reaches it at step 0 (0 days: no ratio)."""

    mean: float  # nan when no language is usable
    used: tuple[str, ...]
    excluded: tuple[str, ...]
    undefined: tuple[str, ...] = ()


def speedups(base_days: Mapping[str, float], system_days: Mapping[str, float]) -> Speedup:
    """Average speedup over the reference: the MEAN of the per-language ratios (not the ratio of mean
    days), over the languages both have; languages where either side is ∞ are excluded.

    >>> speedups({"ar": 10.0, "de": 2.0}, {"ar": 1.0, "de": 2.0}).mean  # (10 + 1) / 2, not 6 / 1.5
    5.5
    """
    used, excluded, undefined, ratios = [], [], [], []
    for lang in sorted(set(base_days) & set(system_days)):
        b, s = base_days[lang], system_days[lang]
        if math.isinf(b) or math.isinf(s):
            excluded.append(lang)
        elif b <= 0 or s <= 0:  # the target is met before any adaptation: no compute to compare
            undefined.append(lang)
        else:
            used.append(lang)
            ratios.append(b / s)
    return Speedup(sum(ratios) / len(ratios) if ratios else math.nan, tuple(used), tuple(excluded), tuple(undefined))


BOOTSTRAP_REPS = 2000  # resamples of the seeds behind every interval


def _mean_curve(curves: Sequence[Sequence[Point]]) -> list[Point]:
    """The average of per-seed curves at the steps all of them have (a seed may appear twice: a resample)."""
    by_step = [{p.step: p for p in c} for c in curves]
    steps = sorted(set.intersection(*(set(b) for b in by_step)))
    return [Point(step, mean(b[step].flops for b in by_step), mean(b[step].days for b in by_step),
                  mean(b[step].score for b in by_step)) for step in steps]


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of ascending values (∞ allowed)."""
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def _interval(point: float, replicates: list[float], level: float = 0.95) -> Interval:
    reps = sorted(r for r in replicates if not math.isnan(r))
    if not reps:
        return Interval(point, math.nan, math.nan, level)
    return Interval(point, _percentile(reps, (1 - level) / 2), _percentile(reps, 1 - (1 - level) / 2), level)


def seeds_of_system(res: Results, system: str) -> list[Seeds]:
    """Every (pretraining, finetuning) seed pair with results of ``system`` (adaptation curves or English scores)."""
    found = {seed for (s, _, _), v in res.by_seed.items() if s == system for seed in v}
    found |= {seed for (s, _, _), v in res.english_by_seed.items() if s == system for seed in v}
    return sorted(found)


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


def resample(res: Results, draws: Mapping[str, Sequence[Seeds]]) -> Results:
    """``res`` as if the seeds of each system were ``draws[system]`` (repeats allowed: a bootstrap resample);
    systems not in ``draws`` keep their seeds. Curves are the averages over the drawn seeds."""
    out = Results(metrics=res.metrics, baselines=res.baselines, n_rows=res.n_rows, split=res.split)
    for key, seeds in res.by_seed.items():
        chosen = [x for x in draws.get(key[0], sorted(seeds)) if x in seeds]
        if chosen:
            out.by_seed[key] = {(1, i): seeds[x] for i, x in enumerate(chosen)}
            out.curves[key] = _mean_curve([seeds[x] for x in chosen])
    for key, values in res.english_by_seed.items():
        chosen = [x for x in draws.get(key[0], sorted(values)) if x in values]
        if chosen:
            out.english_by_seed[key] = {(1, i): values[x] for i, x in enumerate(chosen)}
            out.english[key] = mean(values[x] for x in chosen)
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
    for _ in range(reps):
        if paired:
            drawn = draw(rng, seeds[systems_[0]])
            draws = {s: drawn for s in systems_}
        else:
            draws = {s: draw(rng, v) for s, v in seeds.items() if v}
        replicates.append(estimate(resample(res, draws)))
    return _interval(estimate(res), replicates, level)


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
    """``TimeToTarget`` of ``system`` on ``task``; None without BL_BASE or without seeds for every language."""
    langs = res.langs(task)
    mine, ref = res.seeds_of(system, task), res.seeds_of(REFERENCE, task)
    if not langs or not mine or not ref or any((s, task, lang) not in res.by_seed
                                                for s in (system, REFERENCE) for lang in langs):
        return None
    paired = mine == ref

    def estimate(my_seeds: Sequence[Seeds], ref_seeds: Sequence[Seeds]) -> tuple[float, float]:
        mine_days, ref_days = {}, {}
        for lang in langs:
            ref_curve = _mean_curve([res.by_seed[(REFERENCE, task, lang)][x] for x in ref_seeds])
            my_curve = _mean_curve([res.by_seed[(system, task, lang)][x] for x in my_seeds])
            if not ref_curve or not my_curve:
                return math.nan, math.nan
            target = NEAR_MAX * ref_curve[-1].score
            ref_days[lang] = time_to_target([p.days for p in ref_curve], [p.score for p in ref_curve], target)
            mine_days[lang] = time_to_target([p.days for p in my_curve], [p.score for p in my_curve], target)
        return mean(mine_days.values()), speedups(ref_days, mine_days).mean

    rng = random.Random(seed)
    replicates = []
    for _ in range(reps):
        drawn = draw(rng, mine)
        replicates.append(estimate(drawn, drawn if paired else draw(rng, ref)))
    days, speedup = estimate(mine, ref)
    return TimeToTarget(_interval(days, [d for d, _ in replicates]), _interval(speedup, [s for _, s in replicates]),
                        len(mine), paired)


def results_from_rows(rows: Iterable[dict], main_metrics: Mapping[str, str] | None = None,
                      split: str = "test") -> Results:
    """Average over seeds, main metric of each task (``main_metrics``, else F1 when the task has F1 rows,
    accuracy otherwise), rows of ``split`` (test, or dev: the target dev sets). A checkpoint counts only once every seed seen for its (system, task, language) has it,
    so a half-finished evaluation does not mix seeds."""
    rows = list(rows)
    res = Results(n_rows=len(rows), split=split)
    for r in rows:
        if main_metrics and r["task"] in main_metrics:
            res.metrics[r["task"]] = main_metrics[r["task"]]
        elif r.get("metric") == "f1":
            res.metrics[r["task"]] = "f1"
        else:
            res.metrics.setdefault(r["task"], "accuracy")
    latest: dict[tuple, dict] = {}  # a row written twice: keep the last
    for r in rows:
        english = int(r["step"]) < 0  # the finetuned model's English scores: Table 5 shows the test set's
        if r.get("split") == ("test" if english else split) and r.get("metric") == res.metrics[r["task"]]:
            ps = int(r.get("pretrain_seed", 1))
            latest[(pooled_label(r["system"], ps), r["body"], r["task"], r["lang"], (ps, int(r["seed"])),
                    int(r["step"]))] = r
    res.seeds = {k[4] for k in latest}
    adapted: dict[tuple[str, str, str], dict[int, list[tuple[Seeds, dict]]]] = defaultdict(lambda: defaultdict(list))
    english: dict[tuple[str, str, str], dict[Seeds, float]] = defaultdict(dict)
    for (system, body, task, lang, seed, step), r in latest.items():
        if step < 0:
            english[(system, body, task)][seed] = float(r["value"])
        elif body == "primary":
            adapted[(system, task, lang)][step].append((seed, r))
    for key, by_step in adapted.items():
        n_seeds = len({x for rs in by_step.values() for x, _ in rs})
        complete = [(step, rs) for step, rs in sorted(by_step.items()) if len(rs) == n_seeds]
        points = [Point(step, mean(r["flops"] for _, r in rs), mean(r["v100_days"] for _, r in rs),
                        mean(r["value"] for _, r in rs)) for step, rs in complete]
        if points:
            res.curves[key] = points
            seeds: dict[Seeds, list[Point]] = defaultdict(list)
            for step, rs in complete:
                for x, r in rs:
                    seeds[x].append(Point(step, float(r["flops"]), float(r["v100_days"]), float(r["value"])))
            res.by_seed[key] = dict(seeds)
    res.english_by_seed = {k: dict(v) for k, v in english.items()}
    res.english = {k: mean(v.values()) for k, v in english.items()}
    res.english_stats = {k: stat(list(v.values())) for k, v in english.items()}
    return res


def load_results(runs_dir: str | Path, name: str, main_metrics: Mapping[str, str] | None = None,
                 split: str = "test") -> Results:
    """Every ``{runs_dir}/{name}/*/results.jsonl`` (a partial last line is ignored)."""
    rows = [r for path in Layout(Path(runs_dir), name).all_results() for r in ResultsTable(path).rows()]
    return results_from_rows(rows, main_metrics, split)


# ---- formatting ---------------------------------------------------------------------------------

def fmt_n(seeds: Sequence[Seeds]) -> str:
    """The number of samples; with several pretraining seeds also how many (``6 (2 pretrainings)``)."""
    pretrainings = len({p for p, _ in seeds})
    return f"{len(seeds)}" + (f" ({pretrainings} pretrainings)" if pretrainings > 1 else "")


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


def fmt_score(x: float | None) -> str:
    return MISSING if x is None or math.isnan(x) else f"{x:.1f}"


def fmt_days(x: float | None) -> str:
    """3 significant digits, readable from the paper's 20.9 down to a demo's 2.1e-09; ∞ for never hit."""
    if x is None or math.isnan(x):
        return MISSING
    if math.isinf(x):
        return "∞"
    return f"{x:,.0f}" if x >= 1000 else f"{x:.3g}"


def fmt_speedup(x: float) -> str:
    return MISSING if math.isnan(x) else ("∞" if math.isinf(x) else f"{x:.3g}×")


def fmt_stat(x: Stat | None) -> str:
    """``mean ± std`` (the mean alone for one value)."""
    if x is None or math.isnan(x.mean):
        return MISSING
    if x.n < 2:
        return fmt_score(x.mean)
    return f"{x.mean:.1f} ± {x.std:.1f}" if not math.isnan(x.std) else fmt_score(x.mean)


def fmt_interval(x: Interval | None, fmt: Any = None) -> str:
    """``[low, high]`` formatted like the point estimate."""
    fmt = fmt or fmt_days
    if x is None or math.isnan(x.low):
        return MISSING
    return f"[{fmt(x.low)}, {fmt(x.high)}]"


def _speedup_interval(tt: TimeToTarget | None) -> str:
    """``[low, high]: verdict``, or just why there is no interval."""
    verdict = speedup_verdict(tt)
    if tt is None or tt.seeds < 2 or verdict == "no interval":
        return f"({verdict})"
    return f"{fmt_interval(tt.speedup, fmt_speedup)}: {verdict}"


def speedup_verdict(tt: TimeToTarget | None) -> str:
    """How a speedup may be read: a headline only when its interval (over at least two seeds) lies above 1."""
    sp = None if tt is None else tt.speedup
    if tt is None or sp is None or math.isnan(sp.low):
        return "no interval"
    if tt.seeds < 2:
        return "one seed: no interval"
    if sp.low > 1:
        return "faster"
    if sp.high < 1:
        return "slower"
    return "inconclusive (interval spans 1)"


def _mean_or_none(values: list[float | None]) -> float | None:
    """The mean when every value is there (∞ when one is ∞), else None."""
    return None if not values or any(v is None for v in values) else mean(values)  # type: ignore[arg-type]


def _table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * left + ["---:"] * (len(header) - left)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _task_title(res: Results, task: str) -> str:
    return f"**{task}** ({res.metrics.get(task, '?')})"


# ---- tables -------------------------------------------------------------------------------------

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
            rows.append(["majority class (train)", "", *(fmt_score(b) for b in base), fmt_score(_mean_or_none(base)),
                         "", ""])
        targets = [res.target(task, lang) for lang in langs]
        if any(t is not None for t in targets):
            rows.append([f"target ({NEAR_MAX:.0%} of {REFERENCE})", "", *(fmt_score(t) for t in targets),
                         fmt_score(_mean_or_none(targets)), "", ""])
        blocks.append(_task_title(res, task) + "\n\n"
                      + _table(["system", "n", *langs, "avg", "EFLOPs", "V100-days"], rows))
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
            rows.append([f"majority class (train): {m}", *(fmt_score(b) for b in base), fmt_score(_mean_or_none(base))])
        for system in res.main_systems:
            step0 = [res.step0_stat(system, task, lang) for lang in langs]
            if any(x is not None for x in step0):
                rows.append([f"{system} at step 0 ({res.metrics.get(task, '?')})", *(fmt_stat(x) for x in step0),
                             fmt_score(_mean_or_none([None if x is None else x.mean for x in step0]))])
        if rows:
            blocks.append(_task_title(res, task) + "\n\n" + _table(["baseline", *langs, "avg"], rows))
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
                         else fmt_days(_mean_or_none(days)),
                         fmt_interval(None if ci is None else ci.days)])
        blocks.append(_task_title(res, task) + "\n\n" + _table(["system", *langs, "avg", "95% interval"], rows))
    return "\n\n".join(blocks)


def speedup_cell(sp: Speedup) -> str:
    """The mean speedup, or *undefined* when every language's target is met at step 0 by one side."""
    return "undefined" if not sp.used and sp.undefined else fmt_speedup(sp.mean)


def system_speedup(res: Results, system: str, task: str) -> Speedup:
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
                         + f" {_speedup_interval(ci)}")
            if sp.excluded:
                notes.append(f"{system} / {task}: {len(sp.excluded)} language(s) excluded (∞: the target is never "
                             f"reached by one side): {', '.join(sp.excluded)}")
            if sp.undefined:
                notes.append(f"{system} / {task}: speedup undefined in {', '.join(sp.undefined)}: the target is met "
                             f"at step 0 by one side (it is at or below the score of the unadapted embeddings), so "
                             f"there is no adaptation compute to compare; left out of the mean")
        rows.append([system, *cells])
    text = _table(["system", *res.tasks], rows)
    if notes:
        text += "\n\n" + "\n".join(f"- {n}" for n in notes)
    return text


def _depth_name(label: str) -> str:
    m = _SWEEP.match(label)
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
        rows.append(["avg", *(fmt_days(_mean_or_none(days[s])) for s in columns)])
        rows.append(["speedup", *(MISSING if s == REFERENCE else fmt_speedup(system_speedup(res, s, task).mean)
                                  for s in columns)])
        blocks.append(_task_title(res, task) + "\n\n" + _table(["language", *names], rows))
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
    return _table(["model", *(f"{t} ({res.metrics.get(t, '?')})" for t in tasks)], rows)


def _n(x: Stat | None) -> str:
    return "" if x is None else f" (n={x.n})"


# ---- Figure 3 -----------------------------------------------------------------------------------

def average_curve(res: Results, system: str, task: str) -> list[tuple[float, float]]:
    """(mean V100-days, mean score) over the system's languages, at the steps every language has."""
    curves = [res.curves[k] for k in sorted(res.curves) if k[0] == system and k[1] == task]
    if not curves:
        return []
    by_step = [{p.step: p for p in c} for c in curves]
    steps = sorted(set.intersection(*(set(b) for b in by_step)))
    return [(mean(b[s].days for b in by_step), mean(b[s].score for b in by_step)) for s in steps]


def seed_band(res: Results, system: str, task: str) -> list[tuple[float, float, float]]:
    """(V100-days, mean - std, mean + std) over seeds of the language-averaged score, at the steps every language
    and seed has; empty with fewer than two seeds."""
    langs, seeds = res.langs(task), res.seeds_of(system, task)
    if len(seeds) < 2 or any((system, task, lang) not in res.by_seed for lang in langs):
        return []
    per_seed = [_mean_curve([res.by_seed[(system, task, lang)][seed] for lang in langs]) for seed in seeds]
    steps = sorted(set.intersection(*({p.step for p in c} for c in per_seed)))
    band = []
    for step in steps:
        points = [next(p for p in c if p.step == step) for c in per_seed]
        st = stat([p.score for p in points])
        band.append((mean(p.days for p in points), st.mean - st.std, st.mean + st.std))
    return band


def plot_curves(res: Results, out_dir: Path) -> dict[str, Path]:
    """Figure 3: one PNG per task, score against V100-days, one line per system (averaged over
    languages) with a band of ± one standard deviation over seeds, dashed line at the mean near-maximal
    target. Returns task -> PNG path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    atomic.make_dirs(out_dir)
    paths = {}
    for task in res.tasks:
        fig = Figure(figsize=(6, 4), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for system in res.main_systems:
            curve = average_curve(res, system, task)
            if curve:
                line, = ax.plot([x for x, _ in curve], [y for _, y in curve], marker="o", markersize=3, label=system)
                band = seed_band(res, system, task)
                if band:
                    ax.fill_between([x for x, _, _ in band], [lo for _, lo, _ in band], [hi for _, _, hi in band],
                                    color=line.get_color(), alpha=0.2, linewidth=0)
        targets = [t for lang in res.langs(task) if (t := res.target(task, lang)) is not None]
        if targets:
            ax.axhline(mean(targets), linestyle="--", color="grey", linewidth=1,
                       label=f"{NEAR_MAX:.0%} of {REFERENCE} (mean target)")
        ax.set_xlabel("V100-days of adaptation (per language)")
        ax.set_ylabel(f"{res.metrics.get(task, 'score')} (%)")
        ax.set_title(f"{task}: average over {len(res.langs(task))} language(s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', task)}.png"
        atomic.write_with(path, lambda f, fig=fig: fig.savefig(f, format="png"))  # whole, or the old one kept
        paths[task] = path
    return paths


# ---- report -------------------------------------------------------------------------------------

NO_REFERENCE = (f"No {REFERENCE} (BL_BASE) results: there is no near-maximal target ({NEAR_MAX:.0%} of BL_BASE's "
                "final score), so the times to target, the speedups and the depth sweep are left out.")


def render_report(res: Results, name: str, plots: Mapping[str, str], depths: Mapping[str, int] | None = None,
                  variants: Mapping[str, Any] | None = None) -> str:
    """The Markdown report; ``variants``: MiniJoint label -> ``claims.VariantInfo`` (the claims beyond the paper);
    ``plots``: task -> relative link of its PNG; ``depths``: MiniJoint label -> depth of its
    mini-model (for the claim about depth)."""
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
        from minimodel.claims import claims_table

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
    text = render_report(res, name, {task: path.relative_to(out.parent).as_posix() for task, path in pngs.items()},
                         depths, variants)
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
            score = _mean_or_none([None if p is None else p.score for p in finals])
            days = _mean_or_none([res.days_to_target(system, task, lang) for lang in langs]) if has_ref else None
            step0 = has_ref and all(res.at_step0(system, task, lang) for lang in langs)
            sp = MISSING if system == REFERENCE or not has_ref else speedup_cell(system_speedup(res, system, task))
            ci = time_to_target_interval(res, system, task) if has_ref and system != REFERENCE else None
            extra = "" if ci is None else f"  {_speedup_interval(ci)}"
            spread = res.average_stat(system, task)
            spread_text = f" ±{spread.std:.1f}" if spread is not None and spread.n > 1 and not math.isnan(spread.std) else ""
            when = AT_STEP0 if step0 else fmt_days(days)
            lines.append(f"{task:<10} {system:<16} {fmt_score(score):>7}{spread_text:<6} {when:>12} {sp:>9}{extra}")
    for task in res.tasks:
        base = [res.baselines.get((task, lang)) for lang in res.langs(task)]
        if any(b is not None for b in base):
            per_lang = ", ".join(f"{lang} {fmt_score(b)}" for lang, b in zip(res.langs(task), base))
            lines.append(f"{task:<10} {'majority class':<16} {fmt_score(_mean_or_none(base)):>7}{'':<6}   ({per_lang})")
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
