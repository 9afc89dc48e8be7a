"""Step 1: MLM pretraining of BL_BASE / BL_SMALL (one head) or MiniJoint (primary + secondary head).

Loss = mean of the MLM losses of all heads."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torchmetrics import MeanMetric

from minimodel.config import ExperimentConfig, OptimConfig, save_config
from minimodel.data.mlm import MLMDataModule
from minimodel.data.prepare import prepared_paths
from minimodel.data.tokenizer import Tokenizer, TokenizerError
from minimodel.flops import pretrain_flops
from minimodel.model import PRIMARY, RobertaMLM
from minimodel.stages import common


def metric_name(head: str, heads: list[str]) -> str:
    """primary -> loss; the one secondary head -> loss_mini; several -> loss_l{N}."""
    if head == PRIMARY:
        return "loss"
    return "loss_mini" if len(heads) == 2 else f"loss_{head}"


class PretrainModule(L.LightningModule):
    def __init__(self, model: RobertaMLM, optim: OptimConfig, meta: dict, flops_per_update: float) -> None:
        super().__init__()
        self.model, self.optim_cfg, self.meta = model, optim, meta
        self.flops_per_update = flops_per_update
        self.heads = model.cfg.head_names
        self.val_loss = nn.ModuleDict({h: MeanMetric() for h in self.heads})

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        losses = self.model.mlm_losses(batch["input_ids"], batch["labels"])
        loss = torch.stack(list(losses.values())).mean()
        common.check_finite(loss, self.global_step)
        logs = {f"train/{metric_name(h, self.heads)}": v.detach() for h, v in losses.items()}
        if len(losses) > 1:
            logs["train/loss_total"] = loss.detach()
        self.log_dict(logs, prog_bar=True, on_step=True, on_epoch=False)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        losses = self.model.mlm_losses(batch["input_ids"], batch["labels"])
        n = batch["labels"].ne(-100).sum()
        for h, v in losses.items():
            self.val_loss[h].update(v, n)

    def on_validation_epoch_end(self) -> None:
        for h in self.heads:
            loss = float(self.val_loss[h].compute())
            name = metric_name(h, self.heads)
            self.log(f"val/{name}", loss, sync_dist=False)
            self.log(f"val/{name.replace('loss', 'ppl')}", common.perplexity(loss), sync_dist=False)
            self.val_loss[h].reset()

    def configure_optimizers(self) -> dict:
        return common.lightning_optim(*common.build_optimizer(self.model.parameters(), self.optim_cfg))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["minimodel"] = {**self.meta, "step": self.global_step,
                                   "flops": self.global_step * self.flops_per_update}


def load_source_tokenizer(cfg: ExperimentConfig) -> Tokenizer:
    tok = Tokenizer(prepared_paths(cfg, cfg.source_lang).tokenizer)
    if tok.vocab_size != cfg.model.vocab_size:
        raise TokenizerError(f"tokenizer {tok.path} has {tok.vocab_size} pieces but model.vocab_size is "
                             f"{cfg.model.vocab_size}")
    return tok


def mlm_datamodule(cfg: ExperimentConfig, lang: str, optim: OptimConfig, seed: int) -> MLMDataModule:
    d = cfg.data
    return MLMDataModule(prepared_paths(cfg, lang).shards, d.seq_len, d.mask_prob, cfg.model.vocab_size,
                         optim.micro_batch, optim.global_batch, d.val_blocks, d.num_workers, seed)


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
    dm = mlm_datamodule(cfg, cfg.source_lang, o, run.trainer_cfg.seed)
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
