"""The report's account of step 1b: what each MiniPost mini-model's bridge cost and how closely it follows its source
model, read from the finished bridge runs of the experiment (``{root}/{label}/bridge/done.json``; the recipe's
figures from ``bridge_info.json``). Step 1b is paid once per mini-model and serves every target language (the
paper's footnote 2), so Table 2 and the curves price step 2 only; this table is where the one-time cost is said."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

from minimodel.errors import UserError
from minimodel.flops import v100_days
from minimodel.report.formatting import MISSING, fmt_days, markdown_table
from minimodel.store.layout import BRIDGE_INFO, read_done

HEADER = ["system", "bridge", "updates", "EFLOPs", "V100-days", "step-0 gap (nats)", "final gap (nats)",
          "final KL", "final top-1"]


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _num(x: object, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and not math.isnan(x) else MISSING


def _minus(a: object, b: object) -> float:
    """``a - b`` where both were recorded as numbers, else NaN (a run that predates the record)."""
    return a - b if isinstance(a, (int, float)) and isinstance(b, (int, float)) else math.nan


SEED = re.compile(r"^(?P<system>.+)-ps(?P<seed>\d+)$")
"""A system directory of another pretraining seed (``schema.pretrain_seed_suffix``: ``minipost-ps2``)."""


def _shown(label: str, chosen: Mapping[str, str] | None) -> str | None:
    """The name a bridge run's system directory goes by in the report: its pooled label (another pretraining seed's
    directory says which seed), or under ``report.systems`` the names of the chosen rows adapted over it
    (``minipost-recipe@mean`` -> ``minipost`` reads ``minipost-recipe``'s bridge); None where no chosen row reads
    it. An empty ``chosen`` is the config's default (``report.systems: {}``): every system, under its own label."""
    seeded = SEED.match(label)
    pooled = seeded["system"] if seeded else label
    seed = f" (pretraining seed {seeded['seed']})" if seeded else ""
    if not chosen:
        return pooled + seed
    names = sorted({shown for row, shown in chosen.items() if row.split("@")[0] == pooled})
    return ", ".join(names) + seed if names else None


def bridge_rows(root: Path, chosen: Mapping[str, str] | None = None) -> list[list[str]]:
    """One row per finished bridge run under ``root`` (``Layout.models_root``: an experiment's own runs, or those of
    the experiment its ``models_from`` reuses), a damaged or unfinished one left out (nothing to price); ``chosen``:
    ``report.systems`` (which rows the report shows, under which names)."""
    rows = []
    for run in sorted(p.parent for p in root.glob("*/bridge/done.json")):
        shown = _shown(run.parent.name, chosen)
        if shown is None:
            continue
        try:
            done = read_done(run) or {}
        except UserError:  # a damaged done.json: the stage reruns it; nothing to price here
            continue
        if done.get("stage") != "bridge" or not isinstance(done.get("flops"), (int, float)):
            continue
        info = {**_read(run / BRIDGE_INFO), **(done.get("bridge") or {})}
        recipe = f"{info.get('init', 'random')}, {info.get('objective', 'lm')}"
        if info.get("objective") == "distill" and info.get("distill_mse"):
            recipe += f" + {info['distill_mse']:g} MSE"
        if "depth" in info:
            recipe += f", N = {info['depth']} + {info.get('bridge_layers', '?')}"
        if isinstance(info.get("langs"), dict) and info["langs"]:  # bridge.langs: the other languages it read
            recipe += f", + {', '.join(info['langs'])} text"
        source, final = info.get("source_loss"), info.get("final") or {}
        flops = float(done["flops"])
        rows.append([shown, recipe, f"{int(done.get('step', 0)):,}", f"{flops / 1e18:.4g}",
                     fmt_days(v100_days(flops)), _num(_minus(info.get("step0_loss"), source), "+.3f"),
                     _num(_minus(final.get("lm_loss"), source), "+.3f"), _num(final.get("kl"), ".3f"),
                     _num(final.get("top1_agreement"), ".1%")])
    return rows


def bridge_section(root: Path, chosen: Mapping[str, str] | None = None) -> list[str]:
    """The report's section on step 1b, or nothing when the experiment has no finished bridge."""
    rows = bridge_rows(root, chosen)
    if not rows:
        return []
    return ["## Step 1b: the mini-models' bridges (a one-time cost)", "",
            "Each finished MiniPost bridge of this experiment: how it started and what it minimised (bridge.init, "
            "bridge.objective), its updates and FLOPs (A4; a distilled bridge's include the frozen source model's "
            "forward pass, an affine one the map's), and how far the mini-model is from its source on the source "
            "language's validation blocks (a bridge that also read other languages' text, bridge.langs, keeps its "
            "figures on theirs in bridge_info.json): its loss minus the source's before any update and after the last one, "
            "and KL(source || mini-model) per token and top-1 agreement after the last one (— where the run "
            "predates that record). The cost is paid once per mini-model and shared by every target language, so "
            "Table 2, the curves and the times to target price step 2 only, as the paper does.", "",
            markdown_table(HEADER, rows, left=2), ""]
