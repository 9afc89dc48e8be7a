"""Step 2: learn target-language token embeddings with the transformer body frozen.

Trainable: the new token embeddings (tied to the MLM output projection) and the MLM output bias.
Frozen: position embeddings, embedding LayerNorm, every layer, the head's dense and LayerNorm.
BL_BASE / BL_SMALL adapt over their own body; MiniJoint over layers 1..N + its second head;
MiniPost over its bridged mini-model.

Besides ``checkpoints/last.ckpt`` (full state, for resuming), every scheduled update writes a small
*adaptation checkpoint* ``embeddings/step{N}.pt`` holding only what step 4 needs: embeddings,
output bias, tokenizer reference, step and cumulative FLOPs."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import lightning as L
import torch

from minimodel.config import ConfigError, ExperimentConfig, OptimConfig, save_config
from minimodel.data.prepare import load_prepared_tokenizer
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.flops import adapt_flops, v100_days
from minimodel.model import PRIMARY, RobertaMLM
from minimodel.stages import common
from minimodel.stages.bridge import primary_checkpoint
from minimodel.stages.pretrain import load_source_tokenizer, mlm_datamodule
from minimodel.surgery import (adaptation_state, adaptation_trainable, extract_mini, freeze_all_but, overlap_init,
                               primary_only, swap_embeddings)

ADAPT_FORMAT = 1


class AdaptModule(common.MLMModule):
    """Step 2: only the token embeddings and the output bias train."""

    def __init__(self, model: RobertaMLM, optim: OptimConfig, meta: dict, flops_per_update: float, export_dir: Path) -> None:
        super().__init__(model, optim, meta, flops_per_update)
        self.export_dir = export_dir

    def on_fit_start(self) -> None:
        for name, p in self.model.named_parameters():
            if p.requires_grad != adaptation_trainable(name):
                raise RuntimeError(f"adapt: {name} should {'' if adaptation_trainable(name) else 'not '}train")

    def export(self, step: int) -> Path:
        """Write the adaptation checkpoint of ``step`` (atomically)."""
        flops = self.cumulative_flops(step)
        payload = {"format": ADAPT_FORMAT, **{k: v for k, v in self.meta.items() if k != "model_config"},
                   **adaptation_state(self.model), "step": step, "flops": flops, "v100_days": v100_days(flops)}
        self.export_dir.mkdir(parents=True, exist_ok=True)
        path = self.export_dir / f"step{step:07d}.pt"
        common.atomic_torch_save(payload, path)
        return path


def adaptation_body(cfg: ExperimentConfig) -> tuple[RobertaMLM, str]:
    """The frozen body that step 2 trains embeddings over, and where it came from."""
    if cfg.system == "minipost":
        source = cfg.run_dir / "bridge" / "checkpoints" / "last.ckpt"
        if not (cfg.run_dir / "bridge" / common.DONE).exists():
            raise common.CheckpointError(f"MiniPost adapts over its bridged mini-model: run `minimodel bridge` "
                                         f"first ({cfg.run_dir / 'bridge'} is not complete)")
        model, _ = common.load_model(source)
        return model, str(source)
    source = cfg.run_dir / "pretrain" / "checkpoints" / "last.ckpt"
    if not (cfg.run_dir / "pretrain" / common.DONE).exists():
        raise common.CheckpointError(f"adaptation needs a finished step 1: {cfg.run_dir / 'pretrain'} is not complete "
                                     f"(run `minimodel pretrain` first)")
    model, _ = common.load_model(source)
    if cfg.system == "minijoint":
        return extract_mini(model, cfg.mini_depth), str(source)
    return primary_only(model), str(source)


def primary_source(cfg: ExperimentConfig) -> str:
    """The checkpoint of the primary (deep) model that steps 3 and 4 use."""
    if cfg.system == "minipost":
        return primary_checkpoint(cfg)
    return str(cfg.run_dir / "pretrain" / "checkpoints" / "last.ckpt")


def init_target_embeddings(body: RobertaMLM, source_tok: AnyTokenizer, target_tok: AnyTokenizer,
                           seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Overlap initialisation (paper, footnote 1) of embeddings and output bias; returns the overlap count.

    Pieces are compared in SentencePiece spelling, so a byte-level BPE source vocabulary (RoBERTa's
    "Ġthe") overlaps with a SentencePiece target ("▁the") as the same piece would."""
    gen = torch.Generator().manual_seed(seed)
    src_pieces, trg_pieces = source_tok.surface_pieces(), target_tok.surface_pieces()
    weight, rows = overlap_init(body.embeddings.tokens.weight, src_pieces, trg_pieces, body.cfg.init_std, gen)
    copied = rows >= 0
    bias = torch.zeros(target_tok.vocab_size)
    bias[copied] = body.heads[PRIMARY].bias.detach()[rows[copied]].to(bias.dtype)
    return weight, bias, int(copied.sum())


def run_adapt(cfg: ExperimentConfig, progress_bar: bool = True) -> Path:
    if not cfg.lang:
        raise ConfigError("adapt needs a target language: add lang=xx (e.g. lang=de)")
    if cfg.lang == cfg.source_lang:
        raise ConfigError(f"lang={cfg.lang} is the source language")
    a = cfg.adapt
    run = common.StageRun(cfg.run_dir / "adapt" / cfg.lang, f"{cfg.system}/adapt/{cfg.lang}", a.trainer, a.optim)
    if common.is_done(run.run_dir):
        print(f"[minimodel] {run.run_dir} is complete; skipping", flush=True)
        return run.run_dir
    body, body_source = adaptation_body(cfg)
    source_tok = load_source_tokenizer(cfg, body, body_source)
    target_tok = load_prepared_tokenizer(cfg, cfg.lang)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run.run_dir / "config.yaml")
    L.seed_everything(a.trainer.seed, workers=True, verbose=False)
    if a.init == "overlap":
        weight, bias, overlap = init_target_embeddings(body, source_tok, target_tok, a.trainer.seed)
    else:
        gen = torch.Generator().manual_seed(a.trainer.seed)
        weight = torch.randn(target_tok.vocab_size, body.cfg.hidden, generator=gen) * body.cfg.init_std
        bias, overlap = torch.zeros(target_tok.vocab_size), 0
    swap_embeddings(body, weight, bias)
    n_train = freeze_all_but(body, adaptation_trainable)
    info = {"lang": cfg.lang, "target_vocab": target_tok.vocab_size, "overlapping_pieces": overlap,
            "trainable_parameters": n_train, "body_layers": body.cfg.layers, "body": body_source}
    (run.run_dir / "adapt_info.json").write_text(json.dumps(info, indent=1))
    print(f"[minimodel] adapt {cfg.system} to {cfg.lang}: {overlap:,} of {target_tok.vocab_size:,} pieces overlap "
          f"with {cfg.source_lang}; {body.cfg.layers}-layer body; {n_train:,} trainable parameters", flush=True)
    flops = adapt_flops(body.cfg.layers, body.cfg.hidden, cfg.data.seq_len, target_tok.vocab_size,
                        cfg.data.mask_prob, a.optim.global_batch, 1)
    meta = {"stage": "adapt", "system": cfg.system, "lang": cfg.lang, "model_config": asdict(body.cfg),
            "body_layers": body.cfg.layers, "body": body_source, "primary": primary_source(cfg),
            "tokenizer": {"path": str(target_tok.path), "sha256": target_tok.sha256,
                          "vocab_size": target_tok.vocab_size},
            "overlapping_pieces": overlap}
    module = AdaptModule(body, a.optim, meta, flops, run.run_dir / "embeddings")
    dm = mlm_datamodule(cfg, cfg.lang, a.optim, a.trainer.seed, target_tok)
    callbacks = [common.ScheduledCheckpoints(run.ckpt_dir, a.trainer.ckpt_every, a.trainer.ckpt_steps,
                                             a.trainer.max_minutes, a.trainer.stop_at, keep_steps=False),
                 common.StageProgress(flops, a.optim.global_batch * cfg.data.seq_len, log_every=a.trainer.log_every)]
    trainer = common.make_trainer(cfg, run, callbacks, common.world_size(a.trainer), progress_bar)
    common.fit(trainer, module, dm, run)
    if trainer.global_step >= a.optim.updates and trainer.is_global_zero:
        common.write_done(run.run_dir, {"step": trainer.global_step, "flops": trainer.global_step * flops,
                                        "embeddings": sorted(p.name for p in (run.run_dir / "embeddings").glob("*.pt"))})
    return run.run_dir


def adaptation_checkpoints(run_dir: Path) -> list[Path]:
    """The adaptation checkpoints of one language's step-2 run, by step."""
    return sorted((run_dir / "embeddings").glob("step*.pt"))


def load_adaptation(path: Path) -> dict:
    ckpt = common.load_checkpoint(path)
    missing = {"embeddings", "bias", "tokenizer", "step", "flops", "lang", "system"} - set(ckpt)
    if missing:
        raise common.CheckpointError(f"{path} is not an adaptation checkpoint (missing {sorted(missing)})")
    return ckpt
