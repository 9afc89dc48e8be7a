"""Compute accounting: the cost of each training step of an experiment, from the paper's formulas
(``systems.FORMULAS``, ``flops``), as rows and as the Markdown table ``minimodel flops`` prints."""

from __future__ import annotations

from minimodel import systems
from minimodel.config.schema import ExperimentConfig
from minimodel.flops import LayerShape, adapt_flops, bridge_flops, pretrain_flops, v100_days
from minimodel.models.families import predicted_share


def cost_rows(cfg: ExperimentConfig) -> list[dict]:
    """One row per training step of the experiment's system: what trains, over how many layers, and its cost
    (A1 pretraining, A4 bridge, A3 adaptation over the step-2 body; ``systems.FORMULAS``)."""
    pre, bridge, adapt = (systems.stage_plan(cfg, s) for s in ("pretrain", "bridge", "adapt"))
    system, m, d = pre.system, cfg.model, cfg.data
    # p: the share of positions the LM head scores (data.mask_prob; 1 for a causal LM, families.predicted_share)
    common = dict(hidden=m.hidden, seq_len=d.seq_len, vocab=m.vocab_size, mask_prob=predicted_share(cfg),
                  shape=LayerShape.of(m))
    p = cfg.pretrain.optim
    extra = len(m.mini_heads)
    shared = f" ({systems.get(system.primary_from).title}, shared)" if system.primary_from else ""
    if pre.external_primary:  # a public model: its pretraining was not run here (and is not priced)
        rows = [{"step": f"1 pretrain (none: the public model {cfg.bridge.source})", "formula": "—",
                 "layers": m.layers, "updates": 0, "batch": 0, "flops": 0.0}]
    else:
        rows = [{"step": "1 pretrain" + shared,
                 "formula": pre.formula + (f" + {extra} head" if extra else ""),
                 "layers": pre.layers, "updates": p.updates, "batch": p.global_batch,
                 "flops": pretrain_flops(m.layers, batch=p.global_batch, updates=p.updates, extra_heads=extra,
                                         **common)}]
    if bridge.runs_here:
        b, layers = cfg.bridge, bridge.layers
        distill = b.objective == "distill"  # the teacher's forward pass: the source model, cfg.model's depth
        rows.append({"step": "1b bridge" + (f" (init {b.init})" if b.init != "random" else "")
                     + (f" (distilled from {m.layers} layers)" if distill else ""),
                     "formula": bridge.formula + (" + affine" if b.init == "affine" else "")
                     + (" + teacher forward" if distill else ""), "layers": layers,
                     "updates": b.optim.updates, "batch": b.optim.global_batch,
                     "flops": bridge_flops(layers, batch=b.optim.global_batch, updates=b.optim.updates,
                                           trainable_layers=b.layers, affine=b.init == "affine",
                                           teacher_layers=m.layers if distill else 0, **common)})
    a, phases = cfg.adapt.optim, adapt.phases
    common = {**common, "vocab": adapt.target_vocab}  # step 2 projects onto the target vocabulary (data.vocab_size;
    # with adapt.vocabulary=extend the source's too)
    for p in phases if len(phases) > 1 else []:  # progressive adaptation: each phase at its own depth
        rows.append({"step": f"2 adapt phase {p.head} (per language)", "formula": adapt.formula,
                     "layers": p.depth, "updates": p.end - p.start, "batch": a.global_batch,
                     "flops": adapt_flops(p.depth, batch=a.global_batch, updates=p.end - p.start, **common)})
    per_lang = sum(adapt_flops(p.depth, batch=a.global_batch, updates=p.end - p.start, **common) for p in phases)
    depth: int | str = phases[0].depth if len(phases) == 1 else "/".join(str(p.depth) for p in phases)
    rows.append({"step": "2 adapt (per language)", "formula": adapt.formula, "layers": depth,
                 "updates": a.updates, "batch": a.global_batch, "flops": per_lang})
    n = len(cfg.target_langs)
    if n > 1:
        rows.append({"step": f"2 adapt ({n} languages)", "formula": adapt.formula, "layers": depth,
                     "updates": a.updates * n, "batch": a.global_batch, "flops": per_lang * n})
    for r in rows:
        r["v100_days"] = v100_days(r["flops"])
    return rows


def cost_table(cfg: ExperimentConfig) -> str:
    """The experiment's cost as a Markdown table (EFLOPs and V100-days at 30 TFLOP/s)."""
    m, d = cfg.model, cfg.data
    head = (f"{cfg.name} / {cfg.system}: h={m.hidden}, s={d.seq_len}, V={m.vocab_size}, p={predicted_share(cfg):g}, "
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
    common = dict(hidden=m.hidden, seq_len=d.seq_len, vocab=m.vocab_size, mask_prob=predicted_share(cfg),
                  batch=p.global_batch, updates=p.updates, shape=LayerShape.of(m))
    one = pretrain_flops(m.layers, extra_heads=len(m.mini_heads), **common)
    dedicated = len(m.mini_heads) * pretrain_flops(m.layers, extra_heads=1, **common)
    return (f"Step 1 with all {len(m.mini_heads)} secondary heads (after layers {', '.join(map(str, m.mini_heads))}) "
            f"in one pretraining: {one / 1e18:.4g} EFLOPs ({v100_days(one):.4g} V100-days), against "
            f"{dedicated / 1e18:.4g} EFLOPs ({v100_days(dedicated):.4g} V100-days) for one dedicated single-head "
            f"pretraining per depth: {(dedicated - one) / 1e18:.4g} EFLOPs saved "
            f"({1 - one / dedicated:.1%} of the dedicated runs' step 1).")
