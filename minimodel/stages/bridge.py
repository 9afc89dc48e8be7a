"""Step 1b (MiniPost): from a 12-layer MLM (a BL_BASE checkpoint or a Hugging Face RoBERTa/XLM-R
directory), copy the embeddings, the bottom N layers and the MLM head, insert ``bridge.layers`` new
layers between them, and train only the new layers with MLM in the source language."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import lightning as L

from minimodel.config import ConfigError, ExperimentConfig, is_hf_source, save_config
from minimodel.flops import bridge_flops
from minimodel.model import RobertaMLM
from minimodel.stages import common
from minimodel.stages.pretrain import load_source_tokenizer, mlm_datamodule
from minimodel.surgery import build_minipost, primary_only, trainable_parameters


class BridgeModule(common.MLMModule):
    """Step 1b: only the inserted bridge layers train; everything copied from the primary model is frozen."""

    def on_fit_start(self) -> None:
        depth = self.meta["depth"]
        for name, p in self.model.named_parameters():
            new_layer = name.startswith("layers.") and int(name.split(".")[1]) >= depth
            if p.requires_grad != new_layer:
                raise RuntimeError(f"bridge: {name} should {'' if new_layer else 'not '}train")


def primary_checkpoint(cfg: ExperimentConfig) -> str:
    """Where MiniPost's primary model comes from: ``bridge.source`` or this experiment's BL_BASE."""
    return cfg.bridge.source or str(cfg.run_dir.parent / "bl_base" / "pretrain" / "checkpoints" / "last.ckpt")


def load_primary(source: str) -> RobertaMLM:
    """A BL_BASE-style checkpoint file, or a Hugging Face model directory / hub id."""
    path = Path(source)
    if path.is_file():
        model, _ = common.load_model(path)
        return primary_only(model)
    if is_hf_source(source):
        from minimodel.hf import from_hf

        return from_hf(source)
    raise common.CheckpointError(f"bridge source {source} not found (pretrain BL_BASE first, or set bridge.source)")


def run_bridge(cfg: ExperimentConfig, progress_bar: bool = True) -> Path:
    if cfg.system != "minipost":
        raise ConfigError(f"the bridge (step 1b) is MiniPost's; this experiment's system is {cfg.system}")
    b = cfg.bridge
    run = common.StageRun(cfg.run_dir / "bridge", f"{cfg.system}/bridge", b.trainer, b.optim)
    if common.is_done(run.run_dir):
        print(f"[minimodel] {run.run_dir} is complete; skipping", flush=True)
        return run.run_dir
    source = primary_checkpoint(cfg)
    primary = load_primary(source)
    tok = load_source_tokenizer(cfg, primary, f"bridge.source={source}")
    run.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run.run_dir / "config.yaml")
    L.seed_everything(b.trainer.seed, workers=True, verbose=False)
    mini = build_minipost(primary, b.depth, b.layers, seed=b.trainer.seed)
    n_train = trainable_parameters(mini)
    print(f"[minimodel] MiniPost mini-model: {b.depth} copied + {b.layers} new layers; "
          f"{n_train:,} trainable parameters", flush=True)
    flops = bridge_flops(mini.cfg.layers, mini.cfg.hidden, cfg.data.seq_len, mini.cfg.vocab_size, cfg.data.mask_prob,
                         b.optim.global_batch, 1, trainable_layers=b.layers)
    meta = {"stage": "bridge", "system": cfg.system, "lang": cfg.source_lang, "model_config": asdict(mini.cfg),
            "primary": source, "depth": b.depth, "bridge_layers": b.layers, "trainable_parameters": n_train,
            "tokenizer": {"path": str(tok.path), "sha256": tok.sha256}}
    module = BridgeModule(mini, b.optim, meta, flops)
    dm = mlm_datamodule(cfg, cfg.source_lang, b.optim, b.trainer.seed, tok)
    callbacks = [common.ScheduledCheckpoints(run.ckpt_dir, b.trainer.ckpt_every, b.trainer.ckpt_steps,
                                             b.trainer.max_minutes, b.trainer.stop_at),
                 common.StageProgress(flops, b.optim.global_batch * cfg.data.seq_len, log_every=b.trainer.log_every)]
    trainer = common.make_trainer(cfg, run, callbacks, common.world_size(b.trainer), progress_bar)
    common.fit(trainer, module, dm, run)
    if trainer.global_step >= b.optim.updates and trainer.is_global_zero:
        common.write_done(run.run_dir, {"step": trainer.global_step, "checkpoint": str(run.ckpt_dir / "last.ckpt"),
                                        "flops": trainer.global_step * flops})
    return run.run_dir
