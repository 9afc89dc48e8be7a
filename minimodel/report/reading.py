"""The results of one experiment as ``Results``: every ``{runs_dir}/{name}/*/results.jsonl`` row read, pretraining
seeds pooled, the main metric of each task, adaptation curves per seed and averaged over seeds, English scores."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean as mean

from minimodel import systems
from minimodel.config.schema import pooled_label
from minimodel.report.curves import Point, mean_curve, time_to_target, uninformative_target
from minimodel.report.statistics import Seeds, Stat, stat
from minimodel.store.layout import Layout
from minimodel.store.results import ResultsTable
from minimodel.task_metrics import CHANCE

REFERENCE = systems.REFERENCE  # BL_BASE: standard adaptation of the 12-layer model, the reference of every speedup
SYSTEM_ORDER = systems.ORDER
NEAR_MAX = 0.95  # near-maximal performance: 95% of BL_BASE's final score
# depth-sweep labels: minijoint-n2, minipost-n6 (a tag per depth), minijoint@l2 (one head of a multi-head model)
LOWER_IS_BETTER = frozenset({"perplexity", "loss", "loss_per_char"})  # metrics where a lower score is the better one
INVERSE_PERPLEXITY = "1/perplexity"  # exp(-loss): the geometric-mean probability of the next token (higher is better)
SWEEP = re.compile(r"^(?P<base>.+?)(?P<sep>-n|@l)(?P<depth>\d+)$")


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
    source_langs: dict[str, str] = field(default_factory=dict)  # task -> the language of its English scores
    seeds: set[Seeds] = field(default_factory=set)
    n_rows: int = 0
    baselines: dict[tuple[str, str], float] = field(default_factory=dict)  # (task, lang) -> majority-class score
    baseline_metrics: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)  # ... every metric
    # (task, lang) -> the best input-blind predictor's score (main metric), and every scalar metric's
    chance: dict[tuple[str, str], float] = field(default_factory=dict)
    chance_metrics: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    split: str = "test"  # the target-language sets the scores are on: test, or dev (choosing settings)
    # task -> metric -> the same results in another scalar metric of the task (accuracy beside macro-F1, ...)
    secondary: dict[str, dict[str, Results]] = field(default_factory=dict)

    def set_baselines(self, baselines: Mapping[tuple[str, str], Mapping[str, float]] | None) -> None:
        """The majority-class baseline of each (task, language), every metric; the main metric's is ``baselines``.
        Entries ``chance/{metric}`` are the best input-blind predictor's (``task_metrics.chance_scores``):
        ``chance_metrics``, the main metric's ``chance``."""
        items = (baselines or {}).items()
        self.baseline_metrics = {k: {m: x for m, x in v.items() if not m.startswith(CHANCE)} for k, v in items}
        self.chance_metrics = {k: {m[len(CHANCE):]: x for m, x in v.items() if m.startswith(CHANCE)} for k, v in items}
        self.baselines = {(t, lang): v[self.metrics[t]] for (t, lang), v in self.baseline_metrics.items()
                          if t in self.metrics and self.metrics[t] in v}
        self.chance = {(t, lang): v[self.metrics[t]] for (t, lang), v in self.chance_metrics.items()
                       if t in self.metrics and self.metrics[t] in v}
        for by_metric in self.secondary.values():
            for other in by_metric.values():
                other.set_baselines(baselines)

    def sign(self, task: str) -> float:
        """1 when a higher score of the task's metric is better, -1 when lower is (perplexity, ``LOWER_IS_BETTER``)."""
        return -1.0 if self.metrics.get(task) in LOWER_IS_BETTER else 1.0

    def below_baseline(self, system: str, task: str, lang: str) -> bool:
        """The system's final score (mean over seeds) does not beat the majority-class baseline."""
        final, base, k = self.final_stat(system, task, lang), self.baselines.get((task, lang)), self.sign(task)
        return final is not None and base is not None and k * final.mean <= k * base + 1e-9

    def seed_below_baseline(self, system: str, task: str, lang: str) -> bool:
        """At least one seed's final score does not beat the majority-class baseline."""
        base, k = self.baselines.get((task, lang)), self.sign(task)
        return base is not None and any(k * v <= k * base + 1e-9 for v in self.final_values(system, task, lang))

    def below_step0(self, system: str, task: str, lang: str) -> bool:
        """The final score (mean over seeds) is worse than the system's own step-0 score: adaptation made it worse
        (below it, or above it for a metric where lower is better)."""
        final, step0, k = self.final_stat(system, task, lang), self.step0_stat(system, task, lang), self.sign(task)
        return final is not None and step0 is not None and k * final.mean < k * step0.mean - 1e-9

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
        return [s for s in self.systems if not SWEEP.match(s)]

    @property
    def sweep_systems(self) -> list[str]:
        return [s for s in self.systems if SWEEP.match(s)]

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

    def reference_step0(self, task: str, lang: str) -> float | None:
        """BL_BASE's score at step 0 (seed-averaged), when its curve starts there."""
        curve = self.curves.get((REFERENCE, task, lang))
        return curve[0].score if curve and curve[0].step == 0 else None

    def chance_bar(self, task: str, lang: str) -> float | None:
        """The one chance bar of every mark and of the claims gate: the better of the majority class and the best
        input-blind predictor (``chance``: a constant label or labels drawn at the training frequencies), where
        known (None: neither is)."""
        known = [b for b in (self.baselines.get((task, lang)), self.chance.get((task, lang))) if b is not None]
        return max(known) if known else None

    def target_flag(self, task: str, lang: str) -> str | None:
        """Why the target of ``lang`` is uninformative (at or below the chance bar, ``chance_bar``: the better of the
        majority class and the input-blind predictor, or BL_BASE's step-0 score, ``curves.uninformative_target``:
        reaching it means nothing), or None when it is not."""
        target, step0 = self.target(task, lang), self.reference_step0(task, lang)
        if target is None or not uninformative_target(target, self.chance_bar(task, lang), step0):
            return None
        bar, majority = self.chance_bar(task, lang), self.baselines.get((task, lang))
        chance = "majority class" if bar is not None and bar == majority else "input-blind predictor"
        named = ((chance, bar), (f"{REFERENCE} at step 0", step0))
        why = [f"{name} {x:.1f}" for name, x in named if x is not None and uninformative_target(target, x, None)]
        return f"target {target:.1f} ≤ {' and '.join(why)}"

    def falls_back(self, system: str, task: str, lang: str) -> bool:
        """``system``'s seed-averaged curve reaches the target after some adaptation and falls back below it at a
        later checkpoint: its time to target is that of a score it does not keep."""
        target, curve = self.target(task, lang), self.curves.get((system, task, lang))
        if target is None or not curve:
            return False
        tol = 1e-9 * max(1.0, abs(target))
        first = next((i for i, p in enumerate(curve) if p.score >= target - tol), None)
        return first is not None and any(p.score < target - tol for p in curve[first + 1:])

    def final_stat(self, system: str, task: str, lang: str) -> Stat | None:
        """The final score over seeds (mean, std, n), at the last step of the seed-averaged curve."""
        values = self.final_values(system, task, lang)
        return stat(values) if values else None

    def final_values(self, system: str, task: str, lang: str) -> list[float]:
        """Each seed's final score (at the last step of the seed-averaged curve)."""
        final = self.final(system, task, lang)
        if final is None:
            return []
        return [p.score for c in self.by_seed[(system, task, lang)].values() for p in c if p.step == final.step]

    def average_stat(self, system: str, task: str) -> Stat | None:
        """The final score averaged over the task's languages, then over seeds; None when a language is missing, or
        when no seed is shared by every language (de of seed 1, tr of seed 2 only: no seed to average over)."""
        langs = self.langs(task)
        finals = [self.final(system, task, lang) for lang in langs]
        if not finals or any(f is None for f in finals) or not self.seeds_of(system, task):
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
        m = SWEEP.match(label)
        base, depth = (m["base"], int(m["depth"])) if m else (label, -1)
        rank = SYSTEM_ORDER.index(base) if base in SYSTEM_ORDER else len(SYSTEM_ORDER)
        return (m is not None, rank, base, depth, label)
    return sorted(labels, key=key)


def results_from_rows(rows: Iterable[dict], main_metrics: Mapping[str, str] | None = None,
                      split: str = "test") -> Results:
    """Average over seeds, main metric of each task (``main_metrics``, else F1 when the task has F1 rows,
    accuracy otherwise), rows of ``split`` (test, or dev: the target dev sets). A checkpoint counts only once every seed seen for its (system, task, language) has it,
    so a half-finished evaluation does not mix seeds. Every other scalar metric of a task's rows (a name without
    ``/``: not ``f1/LABEL`` or ``confusion/GOLD/PREDICTED``) is read the same way into ``Results.secondary``."""
    rows = list(rows)
    res = _read(rows, main_metrics, split)
    others = sorted({(r["task"], r["metric"]) for r in rows if int(r["step"]) >= 0 and r.get("split") == split
                     and isinstance(r.get("metric"), str) and "/" not in r["metric"]})
    for task, metric in others:
        if metric != res.metrics.get(task):
            other = _read([r for r in rows if r["task"] == task], {task: metric}, split)
            if other.curves:
                res.secondary.setdefault(task, {})[metric] = other
    return res


def _read(rows: list[dict], main_metrics: Mapping[str, str] | None, split: str) -> Results:
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
            res.source_langs[task] = lang
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
                 split: str = "test", systems: Mapping[str, str] | None = None) -> Results:
    """Every ``{runs_dir}/{name}/*/results.jsonl`` (a partial last line is ignored); with ``systems`` (label ->
    name, ``report.systems``), only those systems' rows, under the names given."""
    rows = [r for path in Layout(Path(runs_dir), name).all_results() for r in ResultsTable(path).rows()]
    return results_from_rows(renamed(rows, systems) if systems else rows, main_metrics, split)


def renamed(rows: Iterable[dict], names: Mapping[str, str]) -> list[dict]:
    """The rows of the systems in ``names`` (label -> new name, ``report.systems``), renamed; the others left out."""
    if len(set(names.values())) != len(names):
        raise ValueError(f"report.systems gives two systems the same name: {dict(names)}")
    return [{**r, "system": names[r["system"]]} for r in rows if r.get("system") in names]


def inverse_perplexity(res: Results, task: str) -> Results | None:
    """The task's target-language perplexity rows (``Results.secondary[task]["perplexity"]``) as 1/perplexity, the
    geometric-mean probability a model gives the next token: higher is better, so the near-maximal target (95% of
    BL_BASE's final 1/perplexity, i.e. a perplexity at most BL_BASE's final / 0.95), times to target and speedups
    read exactly as for a task score. A checkpoint's perplexity does not depend on the finetuning seed (every
    (task, seed) row of it carries the same value), so one finetuning seed per pretraining seed is kept: n is the
    number of adaptation runs. None without perplexity rows."""
    ppl = res.secondary.get(task, {}).get("perplexity")
    if ppl is None or not ppl.curves:
        return None
    out = Results(metrics={task: INVERSE_PERPLEXITY}, n_rows=ppl.n_rows, split=ppl.split)
    for key, seeds in ppl.by_seed.items():
        first: dict[int, Seeds] = {}
        for s in sorted(seeds):
            first.setdefault(s[0], s)
        kept = {s: [Point(p.step, p.flops, p.days, 1.0 / p.score) for p in seeds[s]] for s in first.values()}
        out.by_seed[key] = kept
        out.seeds |= set(kept)
        out.curves[key] = mean_curve(list(kept.values()))
    return out
