"""Step 1b (MiniPost): from a 12-layer MLM (a BL_BASE checkpoint or a Hugging Face RoBERTa/XLM-R
directory), copy the embeddings, the bottom N layers and the MLM head, insert ``bridge.layers`` new
layers between them, and train only the new layers with MLM in the source language."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from minimodel.config.schema import ExperimentConfig, is_hf_source
from minimodel.data.mlm import mlm_datamodule
from minimodel.data.prepare import load_source_tokenizer
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.errors import ConfigError
from minimodel.flops import LayerShape, bridge_flops
from minimodel.log import get_logger
from minimodel.models.families import DEFAULT as DEFAULT_FAMILY
from minimodel.models.families import hf_module, predicted_share
from minimodel.models.model import RobertaMLM
from minimodel.models.surgery import bridge_trainable, build_minipost, primary_only, trainable_parameters
from minimodel.store.checkpoints import CheckpointError, TrainingMeta, load_trained_model
from minimodel.store.layout import is_done
from minimodel.store.provenance import producers
from minimodel.systems import stage_plan
from minimodel.training.mlm import MLMModule
from minimodel.training.runner import Runner, Stage, StageResult, Training

log = get_logger(__name__)


def load_primary(source: str, family: str = DEFAULT_FAMILY) -> tuple[RobertaMLM, dict]:
    """A training checkpoint file (without its secondary heads) and the tokenizer record stored with it, or a
    Hugging Face model directory / hub id of the model family ``family`` (``model.family``; read by that family's
    ``from_hf``), whose tokenizer is its own: an empty record."""
    path = Path(source)
    if is_hf_source(source):  # a directory, a hub id, or a GGUF file; in training mode, as a checkpoint loads
        return hf_module(family).from_hf(source).train(), {}
    if path.is_file():
        model, meta = load_trained_model(path)
        return primary_only(model), meta.tokenizer
    raise CheckpointError(f"bridge source {source} not found (pretrain BL_BASE first, or set bridge.source)")


def run_bridge(cfg: ExperimentConfig, progress_bar: bool = True) -> StageResult:
    plan = stage_plan(cfg, "bridge")
    if not plan.runs_here:
        raise ConfigError(f"system {cfg.system} has no bridge (step 1b)")
    b, r = cfg.bridge, plan.runs

    def prepare() -> tuple[RobertaMLM, AnyTokenizer]:
        for run in plan.reads:  # the primary model's run, when it is one of this experiment
            if not is_done(run):
                raise CheckpointError(f"the bridge needs a finished primary model: {run} is not complete "
                                      f"(pretrain it first, or set bridge.source)")
        primary, trained_with = load_primary(r.primary, cfg.model.family)
        return primary, load_source_tokenizer(cfg, primary, f"bridge.source={r.primary}", trained_with)

    def build(inputs: tuple[RobertaMLM, AnyTokenizer]) -> Training:
        primary, tok = inputs
        mini = build_minipost(primary, b.depth, b.layers, seed=b.trainer.seed)
        n_train = trainable_parameters(mini)
        log.info(f"MiniPost mini-model: {b.depth} copied + {b.layers} new layers; {n_train:,} trainable parameters")
        flops = bridge_flops(mini.cfg.layers, mini.cfg.hidden, cfg.data.seq_len, mini.cfg.vocab_size,
                             predicted_share(cfg), b.optim.global_batch, 1, trainable_layers=b.layers,
                             shape=LayerShape.of(mini.cfg))
        meta = TrainingMeta(stage="bridge", system=cfg.system, lang=cfg.source_lang, model_config=asdict(mini.cfg),
                            tokenizer={"path": str(tok.path), "sha256": tok.sha256},
                            extra={"primary": r.primary, "depth": b.depth, "bridge_layers": b.layers,
                                   "trainable_parameters": n_train})
        module = MLMModule(mini, b.optim, meta, flops, trainable=bridge_trainable(b.depth), adamw=b.trainer.adamw)
        return Training(module, mlm_datamodule(cfg, cfg.source_lang, b.optim, b.trainer.seed, tok), b.optim, b.trainer,
                        flops_per_update=flops, tokens_per_update=b.optim.global_batch * cfg.data.seq_len)

    return Runner(cfg, Stage("bridge", plan.writes, b.trainer.seed, inputs=producers(pretrain=r.pretrain)), prepare, build).run(progress_bar)
