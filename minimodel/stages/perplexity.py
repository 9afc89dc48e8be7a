"""Step 4's second metric for a causal LM family (``families.ModelFamily.perplexity``): the target-language
perplexity of the primary model with an adaptation checkpoint's embeddings (and output projection) plugged in, on
the language's held-out blocks (the last ``data.val_blocks`` of its prepared shards, which no step trains on).

It measures the model that is deployed, the same for every system (the primary model, not MiniJoint's or
MiniPost's mini-model, whose perplexities would not be comparable), once per adaptation checkpoint; evaluation
writes it beside the task's scores as metric ``perplexity`` (lower is better), so every (task, seed) row of a
checkpoint carries the same value."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from minimodel.config.schema import ExperimentConfig
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.models.model import IGNORE_INDEX
from minimodel.models.surgery import plug_embeddings
from minimodel.store.checkpoints import Adaptation
from minimodel.systems import Runs


@torch.no_grad()
def held_out_loss(model: torch.nn.Module, cfg: ExperimentConfig, lang: str, tok: AnyTokenizer,
                  device: torch.device, batch_size: int) -> float:
    """The token-weighted mean LM loss of ``model``'s primary head on ``lang``'s validation blocks."""
    from minimodel.data.mlm import mlm_datamodule

    data = mlm_datamodule(cfg, lang, cfg.adapt.optim, cfg.adapt.trainer.seed, tok)
    data.setup()
    blocks = data.val_set
    assert blocks is not None
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(blocks), batch_size):
        items = [blocks[g] for g in range(start, min(start + batch_size, len(blocks)))]
        ids = torch.stack([x["input_ids"] for x in items]).to(device)
        labels = torch.stack([x["labels"] for x in items]).to(device)
        n = int(labels.ne(IGNORE_INDEX).sum())
        total += float(model.lm_losses(ids, labels)["primary"]) * n
        count += n
    return total / max(count, 1)


class Perplexity:
    """Perplexity per adaptation checkpoint, computed once (``__call__``); the primary model is loaded on first use."""

    def __init__(self, cfg: ExperimentConfig, r: Runs, device: torch.device) -> None:
        self.cfg, self.r, self.device = cfg, r, device
        self.model: torch.nn.Module | None = None
        self.done: dict[Path, float] = {}

    def __call__(self, path: Path, adapted: Adaptation, lang: str, tok: AnyTokenizer) -> float:
        if path not in self.done:
            if self.model is None:
                from minimodel.stages.bridge import load_primary

                self.model, _ = load_primary(self.r.primary, self.cfg.model.family)
            plug_embeddings(self.model, adapted, tok.sha256, tok.vocab_size)
            self.model.to(self.device)
            loss = held_out_loss(self.model, self.cfg, lang, tok, self.device, self.cfg.finetune.eval_batch)
            self.done[path] = math.exp(min(loss, 50.0))
        return self.done[path]
