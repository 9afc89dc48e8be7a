"""Compute accounting and result analysis: cost tables from the paper's formulas."""

from __future__ import annotations

from minimodel.config import ExperimentConfig
from minimodel.flops import adapt_flops, bridge_flops, pretrain_flops, v100_days


def cost_rows(cfg: ExperimentConfig) -> list[dict]:
    """One row per training step of the experiment: what trains, over how many layers, and its cost."""
    m, d = cfg.model, cfg.data
    common = dict(hidden=m.hidden, seq_len=d.seq_len, vocab=m.vocab_size, mask_prob=d.mask_prob)
    p = cfg.pretrain.optim
    extra = len(m.mini_heads)
    rows = [{"step": "1 pretrain" + (" (BL_BASE, shared)" if cfg.system == "minipost" else ""), "formula": "A1" + (f" + {extra} head" if extra else ""), "layers": m.layers,
             "updates": p.updates, "batch": p.global_batch,
             "flops": pretrain_flops(m.layers, batch=p.global_batch, updates=p.updates, extra_heads=extra, **common)}]
    if cfg.system == "minipost":
        b = cfg.bridge
        layers = b.depth + b.layers
        rows.append({"step": "1b bridge", "formula": "A4", "layers": layers, "updates": b.optim.updates,
                     "batch": b.optim.global_batch,
                     "flops": bridge_flops(layers, batch=b.optim.global_batch, updates=b.optim.updates,
                                           trainable_layers=b.layers, **common)})
    a = cfg.adapt.optim
    per_lang = adapt_flops(cfg.mini_depth, batch=a.global_batch, updates=a.updates, **common)
    rows.append({"step": "2 adapt (per language)", "formula": "A3", "layers": cfg.mini_depth, "updates": a.updates,
                 "batch": a.global_batch, "flops": per_lang})
    n = len(cfg.target_langs)
    if n > 1:
        rows.append({"step": f"2 adapt ({n} languages)", "formula": "A3", "layers": cfg.mini_depth,
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
    return head + "\n".join(lines)
