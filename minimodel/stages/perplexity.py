"""Step 4's second metric for a causal LM family (``families.ModelFamily.perplexity``): the target-language
perplexity of the primary model with an adaptation checkpoint's embeddings (and output projection) plugged in, on
the language's held-out blocks (the last ``data.val_blocks`` of its prepared shards, which no step trains on), and
the same loss per character of that text (``loss_per_char``: nats per character of the scored tokens' decoded text),
which, unlike a perplexity, compares across tokenizers (the unadapted model's own, scripts/unadapted_reference.py).

It measures the model that is deployed, the same for every system (the primary model, not MiniJoint's or
MiniPost's mini-model, whose perplexities would not be comparable), once per adaptation checkpoint; evaluation
writes them beside the task's scores as metrics ``perplexity`` and ``loss_per_char`` (lower is better), so every
(task, seed) row of a checkpoint carries the same values."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from minimodel.config.schema import ExperimentConfig
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.models.model import IGNORE_INDEX
from minimodel.models.surgery import plug_embeddings
from minimodel.store.checkpoints import Adaptation
from minimodel.systems import Runs


@dataclass(frozen=True)
class HeldOut:
    """A model's next-token loss on a language's held-out blocks."""

    loss: float  # nats per scored token (the token-weighted mean)
    tokens: int  # scored tokens
    chars: int  # characters of the scored tokens' text (each block's scored tokens decoded together, specials left out)

    @property
    def per_char(self) -> float:
        return self.loss * self.tokens / max(self.chars, 1)


@torch.no_grad()
def held_out_loss(model: torch.nn.Module, cfg: ExperimentConfig, lang: str, tok: AnyTokenizer,
                  device: torch.device, batch_size: int) -> HeldOut:
    """The token-weighted mean LM loss of ``model``'s primary head on ``lang``'s validation blocks, with the number
    of scored tokens and of the characters they spell."""
    from minimodel.data.mlm import mlm_datamodule

    data = mlm_datamodule(cfg, lang, cfg.adapt.optim, cfg.adapt.trainer.seed, tok)
    data.setup()
    blocks = data.val_set
    assert blocks is not None
    model.eval()
    total, count, chars = 0.0, 0, 0
    for start in range(0, len(blocks), batch_size):
        items = [blocks[g] for g in range(start, min(start + batch_size, len(blocks)))]
        labels = torch.stack([x["labels"] for x in items])
        chars += sum(len(scored_text(tok, row.tolist())) for row in labels)
        n = int(labels.ne(IGNORE_INDEX).sum())
        ids = torch.stack([x["input_ids"] for x in items]).to(device)
        total += float(model.lm_losses(ids, labels.to(device))["primary"]) * n
        count += n
    return HeldOut(total / max(count, 1), count, chars)


def scored_text(tok: AnyTokenizer, labels: list[int]) -> str:
    """The text a block's scored tokens spell, in order (ignored positions and special tokens left out)."""
    specials = set(tok.specials.ids)
    return tok.decode([i for i in labels if i != IGNORE_INDEX and i not in specials])


class Perplexity:
    """Perplexity per adaptation checkpoint, computed once (``__call__``); the primary model is loaded on first use."""

    def __init__(self, cfg: ExperimentConfig, r: Runs, device: torch.device) -> None:
        self.cfg, self.r, self.device = cfg, r, device
        self.model: torch.nn.Module | None = None
        self.done: dict[Path, HeldOut] = {}

    def __call__(self, path: Path, adapted: Adaptation, lang: str, tok: AnyTokenizer) -> dict[str, float]:
        """``{"perplexity": ..., "loss_per_char": ...}`` of the checkpoint at ``path``."""
        if path not in self.done:
            if self.model is None:
                from minimodel.models.families import sequence_lengths
                from minimodel.stages.bridge import load_primary

                self.model, _ = load_primary(self.r.primary, self.cfg.model.family,
                                             sequence_lengths(self.cfg, tasks=False), runs_dir=self.cfg.runs_dir)
            plug_embeddings(self.model, adapted, tok.sha256, tok.vocab_size)
            self.model.to(self.device)
            self.done[path] = held_out_loss(self.model, self.cfg, lang, tok, self.device, self.cfg.finetune.eval_batch)
        held = self.done[path]
        return {"perplexity": math.exp(min(held.loss, 50.0)), "loss_per_char": held.per_char}


def held_out_texts(cfg: ExperimentConfig, lang: str) -> list[str]:
    """The text of ``lang``'s held-out blocks (the last ``data.val_blocks``, which step 2 never trains on), decoded
    from the target tokenizer's ids, one string per block (without its BOS)."""
    from minimodel.data.mlm import mlm_datamodule
    from minimodel.data.prepare import load_prepared_tokenizer

    tok = load_prepared_tokenizer(cfg, lang)
    data = mlm_datamodule(cfg, lang, cfg.adapt.optim, 1, tok)
    data.setup()
    val = data.val_set
    return [tok.decode(val[i]["input_ids"][1:].tolist()) for i in range(len(val))]


@torch.no_grad()
def loss_per_char(model: torch.nn.Module, tok: AnyTokenizer, texts: list[str], window: int, batch: int = 4
                  ) -> dict[str, float]:
    """Next-token loss of ``model`` over ``texts`` tokenized by ``tok``, in nats per character of the text: each text
    in windows of ``window`` tokens, each window after a BOS (the first token of a window is scored on BOS alone)."""
    bos, pad = tok.specials.bos, tok.specials.pad
    windows, chars, tokens = [], 0, 0
    for text in texts:
        ids = tok.encode_one(text)
        chars, tokens = chars + len(text), tokens + len(ids)
        windows += [[bos, *ids[i:i + window - 1]] for i in range(0, len(ids), window - 1)]
    model.eval()
    total, scored = 0.0, 0
    for i in range(0, len(windows), batch):
        rows = windows[i:i + batch]
        width = max(len(r) for r in rows)
        x = torch.full((len(rows), width), pad, dtype=torch.long)
        y = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        for j, r in enumerate(rows):
            x[j, :len(r)] = torch.tensor(r)
            y[j, :len(r) - 1] = torch.tensor(r[1:])
        n = int(y.ne(IGNORE_INDEX).sum())
        total += float(model.lm_losses(x, y)["primary"]) * n
        scored += n
    return {"nats_per_char": total / chars, "tokens": tokens, "chars": chars, "tokens_per_char": tokens / chars,
            "loss_per_token": total / scored}
