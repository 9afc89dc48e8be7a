"""Step 3: finetune the primary model on an English task with the embeddings frozen.

Frozen: the embedding layer (token and position embeddings, LayerNorm), so that target-language
embeddings learned in step 2 can be swapped in afterwards; the unused MLM heads. Trained: every
transformer layer and the task head. Paper defaults: lr 1e-5 (XNLI, PAWS-X) / 3e-5 (MLQA, XQuAD),
warmup ratio 0.06, linear decay, 3 epochs, 5 seeds, each its own run.

A finished run writes ``model.pt`` (body + task head + what step 4 needs) and ``done.json`` with the
English dev/test scores."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics.classification import MulticlassAccuracy

from minimodel.config.checks import check_task_fits
from minimodel.config.schema import ExperimentConfig, OptimConfig
from minimodel.data.downstream import evaluate, task_head
from minimodel.data.mlm import ResumableSampler
from minimodel.data.prepare import load_source_tokenizer
from minimodel.data.task_features import pad_collate
from minimodel.data.tasks import TaskData
from minimodel.data.tokenizer import PAD, AnyTokenizer
from minimodel.errors import ConfigError, TaskDataError
from minimodel.log import get_logger
from minimodel.models.families import readout
from minimodel.models.model import RobertaMLM, task_logits
from minimodel.models.surgery import extract_mini, freeze_all_but, primary_only
from minimodel.store import atomic
from minimodel.store.checkpoints import CheckpointError, Finetuned, TrainingMeta, load_final_model, load_trained_model
from minimodel.store.layout import finetuned_model, is_done, read_done
from minimodel.store.provenance import primary_source, producers
from minimodel.store.truncation import Truncation, say
from minimodel.systems import StagePlan, stage_plan
from minimodel.training.optim import UpdateGuard, lightning_optim
from minimodel.training.runner import Outcome, Runner, Stage, StageResult, Training

log = get_logger(__name__)

TRAIN_KEYS = ("input_ids", "label", "start_positions", "end_positions")


def finetune_trainable(name: str, below: int = 0) -> bool:
    """Everything but the embedding layer and the MLM heads (the task head lives outside the body), and with
    ``below`` > 0 (``finetune.layer``) but the layers above layer ``below``, which the readout never computes."""
    if name.startswith("layers.") and below:
        return int(name.split(".")[1]) < below  # layers.{i}: layer i + 1
    return not name.startswith(("embeddings.", "heads."))


class PositionShuffled(Dataset):
    """Items indexed by global sample position: epoch ``g // n`` is a seeded permutation."""

    def __init__(self, items: list[dict[str, Any]], seed: int) -> None:
        self.items, self.seed = items, seed
        self._epoch, self._perm = -1, list(range(len(items)))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, g: int) -> dict[str, Any]:
        epoch, i = divmod(g, len(self.items))
        if epoch != self._epoch:
            self._perm = torch.randperm(len(self.items), generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
            self._epoch = epoch
        return self.items[self._perm[i]]


class TaskDataModule(L.LightningDataModule):
    """English training features (resumable, DDP-aware order) and dev features."""

    def __init__(self, train: list[dict[str, Any]], dev: list[dict[str, Any]], micro_batch: int, global_batch: int,
                 eval_batch: int, seed: int, pad_id: int = PAD) -> None:
        super().__init__()
        self.collate = partial(pad_collate, pad_id=pad_id)
        self.train = [{k: f[k] for k in TRAIN_KEYS if k in f} for f in train]
        self.dev = [{k: f[k] for k in TRAIN_KEYS if k in f} for f in dev]
        self.micro_batch, self.global_batch, self.eval_batch, self.seed = micro_batch, global_batch, eval_batch, seed
        self.consumed = 0

    def _rank_world(self) -> tuple[int, int]:
        return (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        sampler = ResumableSampler(self.consumed, self.micro_batch, rank, world)
        return DataLoader(PositionShuffled(self.train, self.seed), batch_size=self.micro_batch, sampler=sampler,
                          collate_fn=self.collate, generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        return DataLoader(self.dev, batch_size=self.eval_batch, sampler=list(range(rank, len(self.dev), world)),
                          collate_fn=self.collate, generator=torch.Generator().manual_seed(self.seed))

    def state_dict(self) -> dict:
        consumed = self.trainer.global_step * self.global_batch if self.trainer is not None else self.consumed
        return {"consumed": int(consumed)}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = int(state["consumed"])


class FinetuneModule(L.LightningModule):
    def __init__(self, body: RobertaMLM, head: nn.Module, qa: bool, num_labels: int, optim: OptimConfig,
                 meta: dict, adamw: str = "auto") -> None:
        super().__init__()
        self.body, self.head, self.qa, self.optim_cfg, self.meta, self.adamw = body, head, qa, optim, meta, adamw
        self.guard = UpdateGuard(optim.grad_clip)
        self.val_acc = MulticlassAccuracy(num_classes=max(2, num_labels), average="micro") if not qa else None

    def loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = task_logits(self.body, self.head, batch["input_ids"], batch.get("attention_mask"), batch.get("padded"))
        if self.qa:
            start, end = out
            return (F.cross_entropy(start.float(), batch["start_positions"])
                    + F.cross_entropy(end.float(), batch["end_positions"])) / 2, None
        return F.cross_entropy(out.float(), batch["label"]), out

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss, _ = self.loss(batch)  # a NaN/inf loss stops the run at the update's gradient check (guard)
        self.log("train/loss", loss.detach(), prog_bar=True, on_step=True, on_epoch=False)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss, logits = self.loss(batch)
        self.log("val/loss", loss, on_epoch=True, sync_dist=True, batch_size=len(batch["input_ids"]))
        if logits is not None and self.val_acc is not None:
            self.val_acc.update(logits.argmax(-1), batch["label"])

    def on_validation_epoch_end(self) -> None:
        if self.val_acc is not None:
            self.log("val/acc", 100.0 * self.val_acc.compute())
            self.val_acc.reset()

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Once per update, with the final gradients: clip, check, count (``UpdateGuard``)."""
        norm = self.guard(optimizer, getattr(self.trainer.precision_plugin, "scaler", None), self.global_step)
        self.log("train/grad_norm", norm.detach(), on_step=True, on_epoch=False)

    def configure_optimizers(self) -> dict:
        return lightning_optim([p for p in self.parameters() if p.requires_grad], self.optim_cfg, adamw=self.adamw)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        meta = TrainingMeta(stage="finetune", system=self.meta["system"], model_config=self.meta["model_config"],
                            tokenizer=self.meta["tokenizer"], step=self.global_step,
                            extra={k: v for k, v in self.meta.items() if k not in ("system", "model_config", "tokenizer")})
        checkpoint["minimodel"] = meta.to_dict()
        checkpoint["update_guard"] = self.guard.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.guard.load_state_dict(checkpoint.get("update_guard", {}))


def finetune_body(cfg: ExperimentConfig, plan: StagePlan) -> tuple[RobertaMLM, str, dict]:
    """The model step 3 finetunes: the primary model (a run of this experiment, or ``bridge.source``), or with
    ``body=mini`` the mini-model cut from it; the checkpoint it came from and the tokenizer record stored there."""
    r = plan.runs
    if plan.external_primary:
        from minimodel.models.families import sequence_lengths
        from minimodel.stages.bridge import load_primary

        model, trained_with = load_primary(r.primary, cfg.model.family, sequence_lengths(cfg),
                                           runs_dir=cfg.runs_dir)
        return model, r.primary, trained_with
    path = Path(r.primary)
    if not path.exists() and not any(is_done(run) for run in plan.reads):  # a finished run's: rebuilt (below)
        raise CheckpointError(f"finetuning needs the step-1 model {path}: run `minimodel pretrain` first")
    for run in plan.reads:  # the step-1 run, when the primary model is one of this experiment
        if not is_done(run):
            raise CheckpointError(f"finetuning needs a finished step-1 model: {run} is not complete (no "
                                  f"done.json; it stopped early): finish `minimodel pretrain` first")
    model, meta = load_final_model(path, "pretrain") if plan.reads else load_trained_model(path)
    if cfg.body == "mini":
        return extract_mini(model, plan.depth, plan.head), r.primary, meta.tokenizer
    return primary_only(model), r.primary, meta.tokenizer


def finetune_optim(cfg: ExperimentConfig, task: str, n_train: int) -> OptimConfig:
    f = cfg.finetune
    steps = max(1, math.floor(f.epochs * n_train / f.batch_size))
    return OptimConfig(lr=cfg.tasks[task].lr, betas=list(f.betas), eps=f.eps, weight_decay=f.weight_decay,
                       warmup_updates=round(f.warmup_ratio * steps), updates=steps, global_batch=f.batch_size,
                       micro_batch=f.micro_batch, grad_clip=f.grad_clip)


def featurise_english(data: TaskData, tok: AnyTokenizer, *splits: list[dict[str, Any]]
                      ) -> tuple[list[list[dict[str, Any]]], list[Truncation]]:
    """The features of the train, dev and test records (English), and how many of each file were cut to
    ``max_len`` (said in the log when any was; none for QA)."""
    features, truncation = [], []
    for split, records in zip(("train", "dev", "test"), splits):
        rows, cut = data.featurise(records, tok)
        features.append(rows)
        if cut is not None:
            truncation.append(Truncation(data.name, split, "en", data.split_file(split), data.cfg.max_len,
                                         len(records), cut))
            say(truncation[-1])
    return features, truncation


def check_train_file(cfg: ExperimentConfig, task: str, run_dir: Path) -> None:
    """A finished run whose train file has changed since is not "complete" for today's task: say so."""
    done = read_done(run_dir)
    if not done or not done.get("train_sha256"):
        return
    data = TaskData(task, cfg.tasks[task])
    now = data.train_sha256()
    if now and now != done["train_sha256"]:
        raise TaskDataError(f"tasks.{task}: {data.train_file()} changed since {run_dir} was finetuned on it (sha256 "
                            f"{done['train_sha256'][:12]} then, {now[:12]} now): delete {run_dir} to finetune on "
                            f"the new file, or restore the file")


def log_training_subset(data: TaskData, used: list[dict]) -> None:
    """Say which training examples step 3 uses, per label, and warn loudly of a label none of them has (the model
    can never predict it; a warning, not an error: a task's label set may hold labels with no English training
    example, such as a label only some target languages have)."""
    cfg = data.cfg
    if data.is_qa:
        if cfg.max_train_examples:
            log.info(f"tasks.{data.name}: {len(used):,} training examples (max_train_examples, {cfg.train_subset})")
        return
    counts = Counter(int(r["label"]) for r in used)
    per_label = ", ".join(f"{name} {counts.get(i, 0):,}" for i, name in enumerate(data.labels))
    how = (f"a subset of max_train_examples={cfg.max_train_examples}, {cfg.train_subset}"
           f"{' by label (seed 0)' if cfg.train_subset == 'stratified' else ''}" if cfg.max_train_examples else "all")
    log.info(f"tasks.{data.name}: {len(used):,} training examples ({how}): {per_label}")
    missing = [name for i, name in enumerate(data.labels) if not counts.get(i)]
    if missing:
        log.warning(f"tasks.{data.name}: no training example of label(s) {', '.join(missing)} among the "
                    f"{len(used):,} used: the finetuned model cannot learn to predict them")


def run_finetune(cfg: ExperimentConfig, task: str, seed: int, progress_bar: bool = True) -> StageResult:
    plan = stage_plan(cfg, "finetune")
    r = plan.runs
    run_dir = r.finetune(task, seed, cfg.body)

    def prepare() -> TaskData:
        check_task_fits(cfg, task)
        return TaskData(task, cfg.tasks[task])

    def build(data: TaskData) -> Training:  # seeded: building the body draws, and so does the head's init
        body, source, trained_with = finetune_body(cfg, plan)
        tok = load_source_tokenizer(cfg, body, source, trained_with)
        train_records = data.train_records()
        log_training_subset(data, train_records)
        dev_records, test_records = data.records("dev"), data.records("test", "en")
        (train, dev, test), truncation = featurise_english(data, tok, train_records, dev_records, test_records)
        optim = finetune_optim(cfg, task, len(train))
        steps_per_epoch = max(1, optim.updates // max(1, math.ceil(cfg.finetune.epochs)))
        t = replace(cfg.finetune.trainer, val_every=min(cfg.finetune.trainer.val_every, steps_per_epoch))
        try:  # finetune.layer is checked against model.layers at load; a public model may have fewer layers
            pool, layer = readout(cfg, body.cfg.layers)
        except ConfigError as e:
            raise ConfigError(f"{e}; {source} has {body.cfg.layers} layers where model.layers says {cfg.model.layers} "
                              f"(delete {run_dir}, which this attempt started, before rerunning)") from e
        n_train = freeze_all_but(body, partial(finetune_trainable, below=layer))
        head = task_head(data, body.cfg.hidden, body.cfg.dropout, pool, layer)
        meta = {"system": cfg.system, "task": task, "seed": seed, "body": cfg.body, "source": source,
                "model_config": asdict(body.cfg), "labels": list(data.labels), "qa": data.is_qa,
                "tokenizer": {"path": str(tok.path), "sha256": tok.sha256}, "train_sha256": data.train_sha256(),
                "readout": {"pool": pool, "layer": layer}}
        reads = (f"every token of layer {layer}" if data.is_qa else f"pool {pool} of layer {layer}")
        log.info(f"finetune {cfg.system} ({cfg.body}) on {task}, seed {seed}: {len(train):,} training features, "
                 f"{optim.updates} updates, {n_train + sum(p.numel() for p in head.parameters()):,} trainable parameters"
                 f", the head reads {reads} of {body.cfg.layers}"
                 + (f" (layers {layer + 1}-{body.cfg.layers} not computed)" if layer < body.cfg.layers else ""))
        module = FinetuneModule(body, head, data.is_qa, len(data.labels), optim, meta, adamw=t.adamw)
        dm = TaskDataModule(train, dev, optim.micro_batch, optim.global_batch, cfg.finetune.eval_batch, seed,
                            body.cfg.pad_id)

        def finish(trainer: L.Trainer) -> dict:
            device = next(body.parameters()).device
            batch, precision = cfg.finetune.eval_batch, cfg.evaluate.precision
            english = {"dev": evaluate(data, body, head, dev_records, dev, "en", batch, device, precision),
                       "test": evaluate(data, body, head, test_records, test, "en", batch, device, precision)}
            model = Finetuned(**meta, body_state={k: v.cpu() for k, v in body.state_dict().items()},
                              head_state={k: v.cpu() for k, v in head.state_dict().items()},
                              english=english, step=trainer.global_step)
            atomic.save_torch(model.to_dict(), finetuned_model(run_dir))
            log.info(f"{task} seed {seed}: English dev {english['dev']}, test {english['test']}")
            return {"english": english, "train_sha256": meta["train_sha256"], "readout": meta["readout"],
                    "truncation": [t.to_dict() for t in truncation]}

        return Training(module, dm, optim, t, keep_steps=False, finish=finish)

    check_train_file(cfg, task, run_dir)
    name = f"finetune/{task}/seed{seed}" + ("/mini" if cfg.body == "mini" else "")
    return Runner(cfg, Stage(name, run_dir, seed, inputs=producers(pretrain=r.pretrain, source=primary_source(cfg, r))), prepare, build).run(progress_bar)


def run_all_finetuning(cfg: ExperimentConfig, progress_bar: bool = True) -> list[StageResult]:
    """``task=`` / ``seed=`` select one run; otherwise every task of finetune.tasks x finetune.seeds, in order,
    until one stops early (a signal, stop_at or a wall-time cap: the rest wait for the rerun)."""
    tasks = [cfg.task] if cfg.task else list(cfg.finetune.tasks)
    seeds = [cfg.seed] if cfg.seed else list(cfg.finetune.seeds)
    if not tasks:
        raise ConfigError("no task to finetune: set task=NAME or finetune.tasks")
    results = []
    for task in tasks:
        for seed in seeds:
            results.append(run_finetune(cfg, task, seed, progress_bar))
            if results[-1].outcome in (Outcome.STOPPED, Outcome.INTERRUPTED):
                return results
    return results
