"""MLM blocks, dynamic masking and the one LightningDataModule every MLM stage trains on.

Blocks: the token stream is cut into consecutive pieces of ``seq_len - 1`` tokens and ``<s>`` is
prepended to each (fairseq's ``tokens_per_sample`` with a prepended BOS). The last ``val_blocks``
blocks are the validation split; the training blocks are the ``range`` before them (its first
``train_fraction`` share when a stage trains on part of the corpus). Splits are ``range`` objects, never
arrays of block ids.

Order and masks are functions of the *global sample position* g = 0, 1, 2, ...: position g reads
block ``perm_e[g mod n]`` of data epoch ``e = g // n`` and masks it with a generator seeded by
``(seed, g)``. ``perm_e`` is :class:`minimodel.data.order.FeistelPermutation` keyed by ``(seed, e)``: a
pseudo-random bijection of ``[0, n)`` evaluated one position at a time (validation is read in order).
A worker's copy of the order is therefore a few hundred bytes whatever the number of blocks (it was
an 8-byte-per-block shuffled array, about 1 GiB per worker at CC-100 English size), and a new epoch
costs nothing to start. Nothing depends on worker or process state, so

* a resumed run continues with the exact next batch (the state is just how many samples the
  optimiser has consumed), and
* with ``W`` processes each update reads global positions ``[u*G, (u+1)*G)`` split into micro-batches
  round-robin over ranks: the same samples, with the same masks, as one process at the same global batch.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from minimodel.data.order import FeistelPermutation
from minimodel.data.shards import ShardError, TokenStream, check_blocks, train_blocks
from minimodel.data.tokenizer import SENTENCEPIECE_SPECIALS, SpecialTokens
from minimodel.log import get_logger
from minimodel.models.model import IGNORE_INDEX
from minimodel.training.device import pin_memory

if TYPE_CHECKING:
    from minimodel.config.schema import ExperimentConfig, OptimConfig
    from minimodel.data.tokenizer import AnyTokenizer

log = get_logger(__name__)

N_SPECIAL = 5  # SentencePiece: <s> <pad> </s> <unk> <mask> are ids 0-4
ORDER = "feistel-1"
"""The sample order a checkpoint's position counts in (saved with it): a Feistel permutation per data epoch.
Checkpoints without it were written with the earlier order (a shuffled array of the blocks per epoch)."""


class Masker:
    """BERT masking for one vocabulary: choose ``mask_prob`` of the non-special tokens; of those 80%
    -> <mask>, 10% -> a random non-special token, 10% unchanged. Special tokens (``specials.ids``, e.g.
    RoBERTa's <mask> = 50264, the last id) are never chosen and never drawn as replacements."""

    def __init__(self, vocab_size: int, mask_prob: float, specials: SpecialTokens = SENTENCEPIECE_SPECIALS) -> None:
        self.vocab_size, self.mask_prob, self.mask_id = vocab_size, mask_prob, specials.mask
        self.special_ids = np.asarray(specials.ids, dtype=np.int64)
        if self.special_ids.max() >= vocab_size:
            raise ValueError(f"special token id {int(self.special_ids.max())} is outside a vocabulary of {vocab_size}")
        # the common case, specials = 0..k-1: comparisons instead of lookups (same draws either way)
        self.leading = int(self.special_ids[-1]) + 1 if np.array_equal(self.special_ids, np.arange(len(self.special_ids))) else 0
        self.regular = None if self.leading else np.setdiff1d(np.arange(vocab_size), self.special_ids)

    def __call__(self, tokens: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, labels with -100 where nothing was masked)."""
        inputs = tokens.copy()
        labels = np.full_like(tokens, IGNORE_INDEX)
        special = tokens < self.leading if self.leading else np.isin(tokens, self.special_ids)
        candidates = np.flatnonzero(~special)
        n = int(self.mask_prob * len(candidates) + rng.random())  # probabilistic rounding, as fairseq
        if n == 0:
            return inputs, labels
        chosen = rng.choice(candidates, size=n, replace=False)
        labels[chosen] = tokens[chosen]
        u = rng.random(n)
        inputs[chosen[u < 0.8]] = self.mask_id
        rand = chosen[(u >= 0.8) & (u < 0.9)]
        if self.leading:
            inputs[rand] = rng.integers(self.leading, self.vocab_size, size=len(rand))
        else:
            inputs[rand] = self.regular[rng.integers(0, len(self.regular), size=len(rand))]
        return inputs, labels


def mask_tokens(tokens: np.ndarray, rng: np.random.Generator, mask_prob: float, vocab_size: int,
                specials: SpecialTokens = SENTENCEPIECE_SPECIALS) -> tuple[np.ndarray, np.ndarray]:
    """One-off ``Masker(vocab_size, mask_prob, specials)(tokens, rng)``."""
    return Masker(vocab_size, mask_prob, specials)(tokens, rng)


class BlockDataset(Dataset):
    """Map-style dataset indexed by global sample position (see the module docstring) over the blocks ``blocks``
    (a ``range``: its memory, like the order's, does not grow with the number of blocks)."""

    def __init__(self, stream: TokenStream, blocks: range, seq_len: int, mask_prob: float,
                 vocab_size: int, seed: int, shuffle: bool, specials: SpecialTokens = SENTENCEPIECE_SPECIALS,
                 causal: bool = False, stream_id: int = 0) -> None:
        """``causal``: a causal LM's blocks (labels = the next token, -100 at the last position; nothing masked).
        ``stream_id``: which of several corpora read together this is (``MixedBlocks``; 0, the first, draws its order
        and masks as a corpus read alone does)."""
        if not isinstance(blocks, range):
            raise TypeError(f"blocks must be a range, got {type(blocks).__name__}")
        self.stream, self.blocks, self.seq_len = stream, blocks, seq_len
        self.mask_prob, self.vocab_size, self.seed, self.shuffle = mask_prob, vocab_size, seed, shuffle
        self.stream_id = stream_id
        self.bos, self.causal = specials.bos, causal
        self.masker = None if causal else Masker(vocab_size, mask_prob, specials)
        self._order: FeistelPermutation | None = None  # the current data epoch's permutation (a few round keys)
        self._order_epoch = -1

    def __len__(self) -> int:
        return len(self.blocks)

    def block(self, b: int) -> np.ndarray:
        span = self.seq_len - 1
        return np.concatenate([[self.bos], self.stream.slice(b * span, (b + 1) * span)])

    def order(self, epoch: int) -> FeistelPermutation:
        """The permutation of ``range(len(self))`` that data epoch ``epoch`` reads (training order)."""
        if self._order is None or epoch != self._order_epoch:
            key = (self.seed, epoch, self.stream_id) if self.stream_id else (self.seed, epoch)
            self._order, self._order_epoch = FeistelPermutation(len(self.blocks), key), epoch
        return self._order

    def block_at(self, g: int) -> int:
        """The block global sample position ``g`` reads."""
        epoch, i = divmod(int(g), len(self.blocks))
        return self.blocks[self.order(epoch)(i) if self.shuffle else i]

    def __getitem__(self, g: int) -> dict[str, torch.Tensor]:
        tokens = self.block(self.block_at(g))
        if self.masker is None:  # causal: position t predicts token t + 1
            labels = np.concatenate([tokens[1:], [IGNORE_INDEX]]).astype(tokens.dtype)
            return {"input_ids": torch.from_numpy(tokens), "labels": torch.from_numpy(labels)}
        key = [self.seed, 1 + int(self.shuffle), g, *([self.stream_id] if self.stream_id else [])]
        inputs, labels = self.masker(tokens, np.random.default_rng(key))
        return {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}


class MixedBlocks(Dataset):
    """The training blocks of several corpora read in turn (``bridge.langs``): global position ``g`` reads position
    ``g // k`` of corpus ``g mod k``, so each corpus keeps its own order and masks (a function of its position:
    exact resume holds) and each update holds the corpora in equal shares, to within one block."""

    def __init__(self, parts: list[BlockDataset]) -> None:
        if not parts:
            raise ValueError("MixedBlocks needs at least one corpus")
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def __getitem__(self, g: int) -> dict[str, torch.Tensor]:
        k = len(self.parts)
        return self.parts[int(g) % k][int(g) // k]


@dataclass(frozen=True)
class MixPart:
    """Another corpus a stage trains on beside its own (``bridge.langs``): its shards, and how many blocks at the end
    of its stream (at least ``data.val_blocks``, its validation split) are never trained on."""

    shard_dir: Path
    held_out: int
    name: str = ""


class ResumableSampler(Sampler[int]):
    """Endless global sample positions for one rank, starting at ``start`` (a multiple of world*micro)."""

    def __init__(self, start: int, micro_batch: int, rank: int, world: int) -> None:
        if start % (micro_batch * world):
            raise ValueError(f"start {start} is not a multiple of micro_batch*world ({micro_batch * world})")
        self.start, self.micro, self.rank, self.world = start, micro_batch, rank, world

    def __iter__(self) -> Iterator[int]:
        size = self.micro * self.world
        for r in count(self.start // size):
            base = r * size + self.rank * self.micro
            yield from range(base, base + self.micro)


def leave_sigint_to_main(worker_id: int) -> None:
    """A data worker ignores Ctrl-C: a terminal sends it to the whole process group, and the main process stops
    after the current update with a checkpoint, which a worker that died of it would turn into a crash."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class MLMDataModule(L.LightningDataModule):
    """Train/validation MLM blocks over one prepared corpus; DDP-aware and resumable."""

    def __init__(self, shard_dir: str | Path, seq_len: int, mask_prob: float, vocab_size: int,
                 micro_batch: int, global_batch: int, val_blocks: int, num_workers: int = 2, seed: int = 1,
                 specials: SpecialTokens = SENTENCEPIECE_SPECIALS, tokenizer_sha256: str = "",
                 train_fraction: float = 1.0, causal: bool = False, mix: tuple[MixPart, ...] = ()) -> None:
        """``mix``: other corpora (encoded by the same tokenizer) whose training blocks are read in turn with this
        one's (``MixedBlocks``); validation reads this corpus only, and each part's validation blocks are
        ``mix_val[i]``."""
        super().__init__()
        self.mix = mix
        self.mix_val: list[BlockDataset] = []
        self.causal = causal  # a causal LM's blocks (``BlockDataset``)
        self.train_fraction = train_fraction  # train on the first share of the training blocks only
        self.shard_dir = Path(shard_dir)
        self.specials, self.tokenizer_sha256 = specials, tokenizer_sha256
        self.seq_len, self.mask_prob, self.vocab_size = seq_len, mask_prob, vocab_size
        self.micro_batch, self.global_batch, self.val_blocks = micro_batch, global_batch, val_blocks
        self.num_workers, self.seed = num_workers, seed
        self.consumed = 0  # samples consumed by optimiser updates, over all ranks
        self.train_set: BlockDataset | MixedBlocks | None = None
        self.own_train: BlockDataset | None = None  # this corpus' training blocks (``train_set`` without ``mix``)
        self.val_set: BlockDataset | None = None

    def _open(self, shard_dir: Path) -> tuple[TokenStream, int]:
        """A corpus' token stream, checked against this vocabulary and tokenizer, and its number of blocks."""
        stream = TokenStream.open(shard_dir)
        if stream.vocab_size != self.vocab_size:
            raise ShardError(f"shards in {shard_dir} were made with a tokenizer of {stream.vocab_size} pieces, "
                             f"but the model's vocabulary has {self.vocab_size}")
        if self.tokenizer_sha256 and stream.tokenizer_sha256 and stream.tokenizer_sha256 != self.tokenizer_sha256:
            raise ShardError(f"shards in {shard_dir} were made with another tokenizer (sha256 "
                             f"{stream.tokenizer_sha256[:12]}, this run's is {self.tokenizer_sha256[:12]}); "
                             f"run `minimodel prepare` with this configuration (into another data.prepared_dir)")
        n_blocks = len(stream) // (self.seq_len - 1)
        check_blocks(shard_dir, n_blocks, self.val_blocks, self.seq_len)
        return stream, n_blocks

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        stream, n_blocks = self._open(self.shard_dir)
        blocks = range(n_blocks)  # a range, not an array: O(1) memory in every worker
        common = dict(seq_len=self.seq_len, mask_prob=self.mask_prob, vocab_size=self.vocab_size, seed=self.seed,
                      specials=self.specials, causal=self.causal)
        train = train_blocks(n_blocks, self.val_blocks, self.train_fraction)
        own = BlockDataset(stream=stream, blocks=train, shuffle=True, **common)
        self.val_set = BlockDataset(stream=stream, blocks=blocks[n_blocks - self.val_blocks:], shuffle=False, **common)
        parts = [own]
        for i, part in enumerate(self.mix, start=1):
            s, n = self._open(part.shard_dir)
            if not self.val_blocks <= part.held_out <= n - self.val_blocks:
                raise ShardError(f"{part.shard_dir}: {part.held_out} blocks held out of {n}: at least its "
                                 f"{self.val_blocks} validation blocks, and as many left to train on")
            parts.append(BlockDataset(stream=s, blocks=train_blocks(n, part.held_out, self.train_fraction),
                                      shuffle=True, stream_id=i, **common))
            self.mix_val.append(BlockDataset(stream=s, blocks=range(n)[n - self.val_blocks:], shuffle=False,
                                             stream_id=i, **common))
        self.own_train = own
        self.train_set = MixedBlocks(parts) if self.mix else own

    def _rank_world(self) -> tuple[int, int]:
        if self.trainer is not None:
            return self.trainer.global_rank, self.trainer.world_size
        return 0, 1

    def _loader(self, dataset: Dataset, sampler: Sampler | list[int]) -> DataLoader:
        # a private generator: creating an iterator must not draw from the global RNG (exact resume)
        return DataLoader(dataset, batch_size=self.micro_batch, sampler=sampler, num_workers=self.num_workers,
                          pin_memory=pin_memory(), persistent_workers=False, worker_init_fn=leave_sigint_to_main,
                          generator=torch.Generator().manual_seed(self.seed),
                          prefetch_factor=4 if self.num_workers else None)

    def train_dataloader(self) -> DataLoader:
        self.setup()
        rank, world = self._rank_world()
        if self.global_batch % (self.micro_batch * world):
            raise ValueError(f"global batch {self.global_batch} is not a multiple of micro_batch x devices "
                             f"({self.micro_batch} x {world})")
        return self._loader(self.train_set, ResumableSampler(self.consumed, self.micro_batch, rank, world))

    def val_dataloader(self) -> DataLoader:
        self.setup()
        rank, world = self._rank_world()
        return self._loader(self.val_set, list(range(rank, len(self.val_set), world)))

    def state_dict(self) -> dict:
        consumed = self.trainer.global_step * self.global_batch if self.trainer is not None else self.consumed
        return {"consumed": int(consumed), "global_batch": self.global_batch, "order": ORDER}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = int(state["consumed"])
        if state.get("order") != ORDER:
            log.warning(f"this checkpoint counts its {self.consumed} samples in an earlier sample order "
                        f"({state.get('order', 'a shuffled array of the blocks per data epoch')}); the run goes on "
                        f"at that position in the current order ({ORDER}), so the rest of this data epoch may "
                        f"repeat or skip blocks: not the batches an uninterrupted run of the earlier version reads")


def mlm_datamodule(cfg: ExperimentConfig, lang: str, optim: OptimConfig, seed: int, tok: AnyTokenizer,
                   train_fraction: float = 1.0, mix: tuple[MixPart, ...] = ()) -> MLMDataModule:
    """The MLM data of ``lang`` as the experiment prepared it, encoded by ``tok`` (training on the first
    ``train_fraction`` of its training blocks; ``mix``: other corpora read in turn with it); a causal LM's
    (``families.causal``) labels are the next tokens."""
    from minimodel.data.prepare import prepared_paths
    from minimodel.models.families import causal

    d = cfg.data
    return MLMDataModule(prepared_paths(cfg, lang).shards, d.seq_len, d.mask_prob, tok.vocab_size,
                         optim.micro_batch, optim.global_batch, d.val_blocks, d.num_workers, seed,
                         specials=tok.specials, tokenizer_sha256=tok.sha256, train_fraction=train_fraction,
                         causal=causal(cfg.model), mix=mix)
