"""``minimodel layers CONFIG``: choosing the mini-model's depth N from data, before any training (not a training
stage: it reads what step 1b reads, the source model and the prepared source-language shards, and writes nothing but
its table and, with ``--json``, its rows).

Per layer l of the source model, on the source language's validation blocks:
- **block influence** (ShortGPT, Men et al., arXiv 2403.03853): 1 - the mean cosine of layer l's input and output
  states; a layer that barely turns the residual stream is redundant;
- **angular distance to the last layer** (Gromov et al., arXiv 2403.17887): the mean arccos of the cosine of the
  state after layer l and the state after layer L, over pi; near 0, layer l already holds what the top holds;
- **the affine mini-model's step-0 loss** at depth N = l: the loss of layers 1..N, the least-squares map of
  ``bridge.init=affine`` (fitted on ``bridge.fit_tokens`` training tokens) and the top ``bridge.layers`` layers,
  before any update, beside the source model's own loss;
- **the step-2 price**: a step-2 update over that mini-model (N + k layers) as a share of one over the full model
  (A3, at the experiment's sizes)."""

from __future__ import annotations

import math
from pathlib import Path

from minimodel.config.schema import ExperimentConfig
from minimodel.data.mlm import mlm_datamodule
from minimodel.data.prepare import load_source_tokenizer
from minimodel.errors import UserError
from minimodel.flops import LayerShape, adapt_flops
from minimodel.log import get_logger
from minimodel.models.bridge_init import LayerRow, layer_table
from minimodel.models.families import predicted_share, sequence_lengths
from minimodel.stages.bridge import fit_blocks, load_primary
from minimodel.store import atomic
from minimodel.systems import stage_plan

log = get_logger(__name__)


def layer_rows(cfg: ExperimentConfig) -> tuple[list[dict], dict]:
    """The table's rows (one per layer) and what they were measured on."""
    plan = stage_plan(cfg, "bridge")
    source = plan.runs.primary
    primary, trained_with = load_primary(source, cfg.model.family, sequence_lengths(cfg, tasks=False),
                                         stage="pretrain" if plan.reads else "", runs_dir=cfg.runs_dir)
    tok = load_source_tokenizer(cfg, primary, f"bridge.source={source}", trained_with)
    b = cfg.bridge
    data = mlm_datamodule(cfg, cfg.source_lang, b.optim, b.trainer.seed, tok)
    data.setup()
    val = data.val_set
    items = [val[i] for i in range(len(val))]
    fit = fit_blocks(data, b.fit_tokens)
    rows, full_loss = layer_table(primary, fit, [x["input_ids"].long() for x in items],
                                  [x["labels"].long() for x in items], b.layers)
    m, d = primary.cfg, cfg.data
    # step 2 projects onto the target vocabulary (under adapt.vocabulary=extend the source's pieces too)
    common = dict(hidden=m.hidden, seq_len=d.seq_len, vocab=stage_plan(cfg, "adapt").target_vocab,
                  mask_prob=predicted_share(cfg), batch=1, updates=1, shape=LayerShape.of(m))
    full = adapt_flops(m.layers, **common)
    out = [_row(r, full_loss, adapt_flops(r.layer + b.layers, **common) / full if r.layer + b.layers < m.layers
                else math.nan) for r in rows]
    about = {"source": source, "layers": m.layers, "bridge_layers": b.layers, "lang": cfg.source_lang,
             "fit_tokens": sum(int(x.numel()) for x in fit), "val_tokens": len(items) * d.seq_len,
             "source_loss": full_loss}
    return out, about


def _row(r: LayerRow, full_loss: float, share: float) -> dict:
    return {"layer": r.layer, "block_influence": r.block_influence, "angular_to_last": r.angular_to_last,
            "affine_loss": r.affine_loss, "affine_gap": r.affine_loss - full_loss, "affine_r2": r.affine_r2,
            "step2_share": share}


def _num(x: float, fmt: str) -> str:
    return "—" if math.isnan(x) else format(x, fmt)


def layers_table(rows: list[dict], about: dict) -> str:
    k = about["bridge_layers"]
    head = (f"{about['source']}: {about['layers']} layers, {about['lang']} validation ({about['val_tokens']:,} "
            f"tokens); the source model's loss {about['source_loss']:.3f}. Mini-model of depth N: layers 1..N, an "
            f"affine map fitted on {about['fit_tokens']:,} tokens, the top {k} layers (bridge.init=affine, "
            f"bridge.layers={k}), before any update.\n\n")
    lines = ["| N | block influence | angular distance to L | mini-model loss | gap (nats) | R² of the map | "
             "step-2 cost vs full |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['layer']} | {r['block_influence']:.4f} | {r['angular_to_last']:.4f} | "
                     f"{_num(r['affine_loss'], '.3f')} | {_num(r['affine_gap'], '+.3f')} | {_num(r['affine_r2'], '.3f')}"
                     f" | {_num(100 * r['step2_share'], '.0f')}{'' if math.isnan(r['step2_share']) else '%'} |")
    return head + "\n".join(lines)


def run_layers(cfg: ExperimentConfig, json_out: str = "") -> str:
    rows, about = layer_rows(cfg)
    if json_out:
        path = Path(json_out)
        if path.exists():
            raise UserError(f"{path} exists: the table is not written over a file (choose another --json path)")
        atomic.write_json(path, {"about": about, "rows": rows})
        log.info(f"layer table written to {path}")
    return layers_table(rows, about)
