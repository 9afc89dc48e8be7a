"""The claim "adapted beats unadapted" (issue 53; not in the paper): per target language, each adapted system's
final zero-shot score against the same English-finetuned primary model run on the target language with the source
model's own tokenizer, no step 2 at all (``scripts/unadapted_reference.py`` writes those rows to
``{runs_dir}/{name}/unadapted.jsonl``, with an input-level reference beside them: a bag-of-words classifier trained
on the English words, system ``bag_of_words``). The finetuned models are the same ones (one per finetuning seed), so
the difference is paired by seed. Nothing here imports torch."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean as mean

from minimodel.report.formatting import markdown_table
from minimodel.report.reading import Results
from minimodel.report.statistics import Interval, Stat, percentile_interval, stat

UNADAPTED_FILE = "unadapted.jsonl"
UNADAPTED, BAG_OF_WORDS = "unadapted", "bag_of_words"
REPS = 2000
References = dict[tuple[str, str, str, str, str], dict[int, float]]  # (system, task, lang, split, metric) -> seed -> value


def load_references(root: Path) -> References:
    """The rows of ``root/unadapted.jsonl`` (empty when there is none); a row written twice: the last one."""
    path = root / UNADAPTED_FILE
    out: References = defaultdict(dict)
    if not path.is_file():
        return {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            key = (str(r["system"]), str(r["task"]), str(r["lang"]), str(r.get("split", "test")), str(r["metric"]))
            out[key][int(r["seed"])] = float(r["value"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}, line {n}: not a reference row ({e}); rerun scripts/unadapted_reference.py") from e
    return dict(out)


def mean_interval(values: Sequence[float], rng: random.Random) -> Interval:
    """The mean of ``values`` with its 95% percentile bootstrap interval (resampling the values)."""
    reps = [mean(rng.choices(values, k=len(values))) for _ in range(REPS)]
    return percentile_interval(mean(values), reps)


@dataclass(frozen=True)
class Comparison:
    """One adapted system against the unadapted model in one language (main metric, final checkpoint)."""

    system: str
    lang: str
    adapted: Stat
    unadapted: Stat
    adapted_ci: Interval
    unadapted_ci: Interval
    difference: Interval  # adapted - unadapted, paired by finetuning seed

    @property
    def verdict(self) -> str:
        """beats: the adapted interval lies above the unadapted one; below: under it; overlapping otherwise."""
        if self.adapted_ci.low > self.unadapted_ci.high:
            return "beats"
        if self.adapted_ci.high < self.unadapted_ci.low:
            return "below"
        return "overlapping"


def compare(res: Results, refs: References, system: str, task: str, lang: str, seed: int = 0) -> Comparison | None:
    """``system``'s final score in ``lang`` (each seed's) against the unadapted rows of the same finetuning seeds;
    None when either side is missing."""
    metric = res.metrics.get(task, "accuracy")
    final = res.final(system, task, lang)
    theirs = refs.get((UNADAPTED, task, lang, res.split, metric), {})
    if final is None or not theirs:
        return None
    ours = {s[1]: p.score for s, c in res.by_seed[(system, task, lang)].items() for p in c if p.step == final.step}
    paired = sorted(set(ours) & set(theirs))
    if not paired:
        return None
    rng = random.Random(f"{seed}/{system}/{task}/{lang}")
    a, u = [ours[s] for s in paired], [theirs[s] for s in paired]
    diffs = [x - y for x, y in zip(a, u)]
    return Comparison(system, lang, stat(a), stat(u), mean_interval(a, rng), mean_interval(u, rng),
                      mean_interval(diffs, rng))


def _fmt(s: Stat, ci: Interval) -> str:
    bounds = "" if math.isnan(ci.low) else f" [{ci.low:.1f}, {ci.high:.1f}]"
    return f"{s.mean:.1f} ± {s.std:.1f}{bounds}"


def unadapted_section(res: Results, refs: References, systems: Sequence[str] | None = None) -> list[str]:
    """The section of the report: per task, a table of every adapted system against the unadapted model and the
    bag-of-words reference in each language, and per system the count of languages where it beats the unadapted
    model (the claim holds for a system when that is at least half of them). Empty without reference rows."""
    if not refs or not res.curves:
        return []
    out = ["## Adapted against unadapted (not in the paper)", "",
           "Each adapted system's final score (mean ± std over finetuning seeds, n in the table, [95% bootstrap "
           "interval of the mean]) against the **unadapted** model: the same English-finetuned models run on the "
           "target language with the source model's own tokenizer, no step 2 at all "
           "(`scripts/unadapted_reference.py`). *beats* when the adapted interval lies wholly above the unadapted "
           "one, *below* when wholly under it, *overlapping* otherwise; the difference is paired by finetuning seed. "
           "**Bag of words**: a naive Bayes classifier on the English training words applied unchanged (what word "
           "overlap alone scores). The claim *adapted beats unadapted* holds for a system when it beats the "
           "unadapted model in at least half of the languages.", ""]
    for task in res.tasks:
        metric = res.metrics.get(task, "accuracy")
        chosen = [s for s in (systems or res.main_systems) if any((s, task, lang) in res.curves for lang in res.langs(task))]
        rows, tally = [], {}
        for lang in res.langs(task):
            bow = refs.get((BAG_OF_WORDS, task, lang, res.split, metric), {})
            for system in chosen:
                c = compare(res, refs, system, task, lang)
                if c is None:
                    continue
                tally.setdefault(system, []).append(c)
                rows.append([lang, system, str(c.adapted.n), _fmt(c.adapted, c.adapted_ci),
                             _fmt(c.unadapted, c.unadapted_ci),
                             f"{c.difference.point:+.1f} [{c.difference.low:+.1f}, {c.difference.high:+.1f}]",
                             f"{mean(bow.values()):.1f}" if bow else "—", f"**{c.verdict}**"])
        if not rows:
            continue
        out += [f"**{task}** ({metric}, {res.split}):", "",
                markdown_table(["language", "system", "n", "adapted", "unadapted", "difference", "bag of words",
                                "verdict"], rows), ""]
        for system, cs in tally.items():
            beats = [c.lang for c in cs if c.verdict == "beats"]
            held = len(beats) * 2 >= len(cs)
            out.append(f"- **{system}** beats the unadapted model in {len(beats)} of {len(cs)} languages"
                       f"{' (' + ', '.join(beats) + ')' if beats else ''}: **{'held' if held else 'not held'}**.")
        out.append("")
    return out

