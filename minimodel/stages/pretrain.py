"""Step 1: MLM pretraining of BL_BASE / BL_SMALL (one head) or MiniJoint (primary + secondary head).

Loss = mean of the MLM losses of all heads."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import lightning as L

from minimodel.config import ExperimentConfig, OptimConfig, save_config
from minimodel.data.mlm import MLMDataModule
from minimodel.data.prepare import load_prepared_tokenizer, prepared_paths
from minimodel.data.tokenizer import AnyTokenizer, Tokenizer, TokenizerError
from minimodel.flops import pretrain_flops
from minimodel.model import RobertaMLM
from minimodel.stages import common


class PretrainModule(common.MLMModule):
    """Step 1: every parameter trains on the mean MLM loss of the model's heads."""


def load_source_tokenizer(cfg: ExperimentConfig, model: RobertaMLM | None = None,
                          model_name: str = "") -> AnyTokenizer:
    """The source language's tokenizer (SentencePiece from `prepare`, or ``cfg.source_tokenizer``),
    checked against ``model`` (vocabulary size and padding id) or, without one, against ``model:``."""
    tok = load_prepared_tokenizer(cfg, cfg.source_lang)
    if model is None:
        vocab, pad = cfg.model.vocab_size, cfg.model.pad_id
        has_vocab, pads = f"model.vocab_size is {vocab}", f"model.pad_id is {pad}"
    else:
        vocab, pad = model.cfg.vocab_size, model.cfg.pad_id
        has_vocab = f"the model {model_name} has a vocabulary of {vocab}"
        pads = f"the model {model_name} pads with id {pad}"
    if tok.vocab_size != vocab:
        hint = ("; a public model needs its own tokenizer: set data.source_tokenizer to its directory or hub id"
                if isinstance(tok, Tokenizer) and model is not None else "")
        raise TokenizerError(f"tokenizer {tok.path} has {tok.vocab_size} pieces but {has_vocab}{hint}")
    if tok.specials.pad != pad:
        raise TokenizerError(f"tokenizer {tok.path} pads with id {tok.specials.pad} but {pads}")
    return tok


def mlm_datamodule(cfg: ExperimentConfig, lang: str, optim: OptimConfig, seed: int, tok: AnyTokenizer) -> MLMDataModule:
    d = cfg.data
    return MLMDataModule(prepared_paths(cfg, lang).shards, d.seq_len, d.mask_prob, tok.vocab_size,
                         optim.micro_batch, optim.global_batch, d.val_blocks, d.num_workers, seed,
                         specials=tok.specials, tokenizer_sha256=tok.sha256)


def run_pretrain(cfg: ExperimentConfig, progress_bar: bool = True) -> Path:
    """Train (or resume, or skip if finished) step 1; returns the stage's run directory."""
    run = common.StageRun(cfg.run_dir / "pretrain", f"{cfg.system}/pretrain", cfg.pretrain.trainer, cfg.pretrain.optim)
    if common.is_done(run.run_dir):
        print(f"[minimodel] {run.run_dir} is complete; skipping", flush=True)
        return run.run_dir
    tok = load_source_tokenizer(cfg)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run.run_dir / "config.yaml")
    L.seed_everything(run.trainer_cfg.seed, workers=True, verbose=False)
    model = RobertaMLM(cfg.model)
    if run.trainer_cfg.compile:
        for layer in model.layers:
            layer.compile()
    o = run.optim_cfg
    flops = pretrain_flops(cfg.model.layers, cfg.model.hidden, cfg.data.seq_len, cfg.model.vocab_size,
                           cfg.data.mask_prob, o.global_batch, 1, extra_heads=len(cfg.model.mini_heads))
    meta = {"stage": "pretrain", "system": cfg.system, "lang": cfg.source_lang,
            "model_config": asdict(cfg.model), "tokenizer": {"path": str(tok.path), "sha256": tok.sha256}}
    module = PretrainModule(model, o, meta, flops)
    dm = mlm_datamodule(cfg, cfg.source_lang, o, run.trainer_cfg.seed, tok)
    progress = common.StageProgress(flops, o.global_batch * cfg.data.seq_len, log_every=run.trainer_cfg.log_every)
    ckpts = common.ScheduledCheckpoints(run.ckpt_dir, run.trainer_cfg.ckpt_every, run.trainer_cfg.ckpt_steps,
                                        run.trainer_cfg.max_minutes, run.trainer_cfg.stop_at)
    trainer = common.make_trainer(cfg, run, [ckpts, progress], common.world_size(run.trainer_cfg), progress_bar)
    common.fit(trainer, module, dm, run)
    if trainer.global_step >= o.updates and trainer.is_global_zero:
        common.write_done(run.run_dir, {"step": trainer.global_step, "checkpoint": str(run.ckpt_dir / "last.ckpt"),
                                        "flops": trainer.global_step * flops,
                                        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()}})
    return run.run_dir
