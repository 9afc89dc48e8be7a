"""Step 1: MLM pretraining of the primary model, every parameter trained on the MLM loss of its heads (one
head for BL_BASE / BL_SMALL; for MiniJoint the primary and every secondary head, by default their mean,
``pretrain.head_weights`` otherwise)."""

from __future__ import annotations

from dataclasses import asdict

from minimodel.config.schema import ExperimentConfig
from minimodel.data.mlm import mlm_datamodule
from minimodel.data.prepare import load_source_tokenizer
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.errors import ConfigError
from minimodel.flops import LayerShape, pretrain_flops
from minimodel.models.families import build as build_model
from minimodel.models.families import predicted_share
from minimodel.store.checkpoints import TrainingMeta
from minimodel.systems import stage_plan
from minimodel.training.mlm import MLMModule
from minimodel.training.runner import Runner, Stage, StageResult, Training


def run_pretrain(cfg: ExperimentConfig, progress_bar: bool = True) -> StageResult:
    """Train (or resume, or skip if finished) step 1."""
    plan = stage_plan(cfg, "pretrain")
    if not plan.runs_here:
        raise ConfigError(f"system {cfg.system} has no step 1 of its own: its primary model is "
                          f"{plan.runs.primary} (pretrain that system instead)")
    run_dir = plan.writes
    p, t = cfg.pretrain.optim, cfg.pretrain.trainer

    def build(tok: AnyTokenizer) -> Training:
        model = build_model(cfg.model)
        flops = pretrain_flops(cfg.model.layers, cfg.model.hidden, cfg.data.seq_len, cfg.model.vocab_size,
                               predicted_share(cfg), p.global_batch, 1, extra_heads=len(cfg.model.mini_heads),
                               shape=LayerShape.of(cfg.model))
        meta = TrainingMeta(stage="pretrain", system=cfg.system, lang=cfg.source_lang, model_config=asdict(cfg.model),
                            tokenizer={"path": str(tok.path), "sha256": tok.sha256})
        module = MLMModule(model, p, meta, flops, weights=cfg.pretrain.head_weights or None,
                           forget_every=cfg.pretrain.forget_every, forget_lr_restart=cfg.pretrain.forget_lr_restart,
                           forget_seed=t.seed, adamw=t.adamw)
        return Training(module, mlm_datamodule(cfg, cfg.source_lang, p, t.seed, tok), p, t,
                        flops_per_update=flops, tokens_per_update=p.global_batch * cfg.data.seq_len)

    return Runner(cfg, Stage("pretrain", run_dir, t.seed), lambda: load_source_tokenizer(cfg), build).run(progress_bar)
