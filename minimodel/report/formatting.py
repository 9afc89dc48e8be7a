"""How the report writes numbers: scores, V100-days, speedups, mean ± std, intervals and their verdicts, and
Markdown tables; ``MISSING`` for what is not there."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import fmean as mean
from typing import Any

from minimodel.report.curves import Speedup
from minimodel.report.intervals import TimeToTarget
from minimodel.report.reading import Results
from minimodel.report.statistics import Interval, Seeds, Stat

MISSING = "—"
BELOW = "▼"  # a final score that does not beat the majority-class baseline
SEED_BELOW = "▽"  # a final score whose mean beats the majority-class baseline but one of whose seeds does not
LOWERED = "↓"  # a final score below the system's own step-0 score: adaptation lowered it
NO_TARGET = "⊘"  # a target at or below the chance bar or BL_BASE's step-0 score: reaching it means nothing
FELL_BACK = "⤵"  # a speedup resting on a language where the system falls back below the target later
AT_STEP0 = "at step 0"  # a target met before any adaptation


def fmt_n(seeds: Sequence[Seeds]) -> str:
    """The number of samples; with several pretraining seeds also how many (``6 (2 pretrainings)``)."""
    pretrainings = len({p for p, _ in seeds})
    return f"{len(seeds)}" + (f" ({pretrainings} pretrainings)" if pretrainings > 1 else "")


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
    """``[low, high]`` formatted like the point estimate; — without a point estimate, and ``no interval: N% of
    resamples undefined`` when too few resamples give a number (``statistics.MIN_DEFINED``)."""
    fmt = fmt or fmt_days
    if x is None or math.isnan(x.point):
        return MISSING
    if math.isnan(x.low):
        return no_interval(x)
    return f"[{fmt(x.low)}, {fmt(x.high)}]"


def no_interval(x: Interval) -> str:
    return f"no interval: {x.undefined:.1%} of resamples undefined"


def speedup_interval(tt: TimeToTarget | None) -> str:
    """``[low, high]: verdict``, or just why there is no interval (and no verdict)."""
    verdict = speedup_verdict(tt)
    if tt is None or tt.seeds < 2 or math.isnan(tt.speedup.low):
        return f"({verdict})"
    return f"{fmt_interval(tt.speedup, fmt_speedup)}: {verdict}"


def speedup_verdict(tt: TimeToTarget | None) -> str:
    """How a speedup may be read: a headline only when its interval (over at least two seeds) lies above 1; none
    when the speedup is undefined or too few resamples give one (``statistics.MIN_DEFINED``)."""
    sp = None if tt is None else tt.speedup
    if tt is None or sp is None or math.isnan(sp.point):
        return "no interval"
    if math.isnan(sp.low):
        return no_interval(sp)
    if tt.seeds < 2:
        return "one seed: no interval"
    if sp.low > 1:
        return "faster"
    if sp.high < 1:
        return "slower"
    return "inconclusive (interval spans 1)"


def mean_or_none(values: list[float | None]) -> float | None:
    """The mean when every value is there (∞ when one is ∞), else None."""
    return None if not values or any(v is None for v in values) else mean(values)  # type: ignore[arg-type]


def markdown_table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * left + ["---:"] * (len(header) - left)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def task_title(res: Results, task: str) -> str:
    return f"**{task}** ({res.metrics.get(task, '?')})"


def speedup_cell(sp: Speedup) -> str:
    """The mean speedup, or *undefined* when no language is left to compare but some were left out because the
    target is met at step 0 by one side or is at or below the baseline (⊘)."""
    return "undefined" if not sp.used and (sp.undefined or sp.no_target) else fmt_speedup(sp.mean)
