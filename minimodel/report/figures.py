"""Figure 3: score against V100-days of adaptation, one PNG per task, one line per system (averaged over languages)
with a band of ± one standard deviation over seeds. matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

import re
from pathlib import Path
from statistics import fmean as mean

from minimodel.report.curves import mean_curve
from minimodel.report.reading import NEAR_MAX, REFERENCE, Results
from minimodel.report.statistics import stat
from minimodel.store import atomic


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
    per_seed = [mean_curve([res.by_seed[(system, task, lang)][seed] for lang in langs]) for seed in seeds]
    steps = sorted(set.intersection(*({p.step for p in c} for c in per_seed)))
    band = []
    for step in steps:
        points = [next(p for p in c if p.step == step) for c in per_seed]
        st = stat([p.score for p in points])
        band.append((mean(p.days for p in points), st.mean - st.std, st.mean + st.std))
    return band


PLOT_MARK = {"Source": "minimodel report"}
"""A PNG text chunk every plot of a report carries: what marks a PNG as one ``minimodel report`` wrote (it may be
replaced by another report's, written into the same plots/ folder)."""


def is_plot(path: Path) -> bool:
    """Whether the PNG ``path`` carries ``PLOT_MARK`` (a text chunk, before the image data)."""
    (key, value), = PLOT_MARK.items()
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"\x89PNG") and f"{key}\0{value}".encode() in head


def plot_path(out_dir: Path, task: str) -> Path:
    """The PNG of ``task``'s curves under ``out_dir``."""
    return out_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', task)}.png"


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
        path = plot_path(out_dir, task)
        atomic.write_with(path, lambda f, fig=fig: fig.savefig(f, format="png", metadata=PLOT_MARK))  # whole, or
        # the old one kept
        paths[task] = path
    return paths
