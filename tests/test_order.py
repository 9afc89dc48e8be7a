"""The MLM sample order: a seeded Feistel permutation per data epoch, O(1) memory whatever the number of blocks."""

import pickle
import tracemalloc
from collections import Counter

import numpy as np
import pytest

from minimodel.data.mlm import BlockDataset
from minimodel.data.order import FeistelPermutation
from minimodel.data.tokenizer import BOS


def values(p: FeistelPermutation) -> list[int]:
    return [p(i) for i in range(len(p))]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 4097])
def test_a_bijection_of_range_n_for_every_seed_and_epoch(n):
    for key in [(1, 0), (1, 1), (2, 0), (12345, 7)]:
        assert sorted(values(FeistelPermutation(n, key))) == list(range(n)), key


def test_deterministic_and_different_across_epochs_and_seeds():
    n = 1000
    assert values(FeistelPermutation(n, (3, 0))) == values(FeistelPermutation(n, (3, 0)))
    orders = {tuple(values(FeistelPermutation(n, key))) for key in [(3, 0), (3, 1), (3, 2), (4, 0), (5, 0)]}
    assert len(orders) == 5
    # pinned: the order of a run must not change silently (that would move every resumed run's data)
    assert values(FeistelPermutation(10, (1, 0))) == values(FeistelPermutation(10, [1, 0]))
    assert values(FeistelPermutation(10, (1, 0))) == PINNED_10


PINNED_10 = [9, 1, 2, 5, 0, 7, 3, 6, 4, 8]


def test_out_of_range_indices_and_empty_permutations_are_refused():
    p = FeistelPermutation(5, (1, 0))
    with pytest.raises(IndexError):
        p(5)
    with pytest.raises(IndexError):
        p(-1)
    with pytest.raises(ValueError):
        FeistelPermutation(0, (1, 0))


def test_close_to_uniform():
    n, seeds = 10, 3000
    perms = [values(FeistelPermutation(n, (s, 0))) for s in range(seeds)]
    # the value at position 0 and the position of value 0: each of the 10 about 300 times (sd ~16)
    for counts in (Counter(p[0] for p in perms), Counter(p.index(0) for p in perms)):
        assert len(counts) == n and min(counts.values()) > 220 and max(counts.values()) < 380, counts
    # all 24 orders of 4 elements, each about 1/24 of the time (sd ~0.0036)
    c4 = Counter(tuple(values(FeistelPermutation(4, (s, 0)))) for s in range(seeds))
    assert len(c4) == 24 and max(abs(k / seeds - 1 / 24) for k in c4.values()) < 0.015, c4
    # a large one is far from the identity: few fixed points (1 expected), no rank correlation
    for seed in range(3):
        p = values(FeistelPermutation(1000, (seed, 0)))
        assert sum(i == x for i, x in enumerate(p)) <= 6
        assert abs(np.corrcoef(np.arange(1000), p)[0, 1]) < 0.1


class FakeStream:
    """A token stream of any length without data: token t is ``5 + t % 995`` (what BlockDataset needs of one)."""

    vocab_size = 1000

    def __init__(self, n_tokens: int) -> None:
        self.n_tokens = n_tokens

    def __len__(self) -> int:
        return self.n_tokens

    def slice(self, start: int, end: int) -> np.ndarray:
        return 5 + np.arange(start, end, dtype=np.int64) % 995


SEQ_LEN = 512


def dataset(n_blocks: int) -> BlockDataset:
    return BlockDataset(FakeStream(n_blocks * (SEQ_LEN - 1)), range(n_blocks), SEQ_LEN, 0.15, 1000, seed=1,
                        shuffle=True)


def test_per_worker_order_memory_does_not_grow_with_the_number_of_blocks():
    """10^3 blocks or 10^8 (CC-100 English has ~1.2 x 10^8 of 512 tokens): the dataset a worker holds and
    everything allocated while it reads samples across several data epochs stay under 64 KiB (a materialised
    order of 10^8 blocks was 800 MB)."""
    bound = 64 * 1024
    sizes, peaks = {}, {}
    for n in (10**3, 10**8):
        tracemalloc.start()
        ds = dataset(n)
        positions = [0, 1, n - 1, n, n + 1, 2 * n + 5, 7 * n + 3]
        blocks = [ds.block_at(g) for g in positions]
        sample = ds[positions[-1]]
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        sizes[n] = len(pickle.dumps(ds))
        assert all(0 <= b < n for b in blocks)
        assert ds.block_at(3 * n + 17) == ds.order(3)(17)
        assert sample["input_ids"].shape == (SEQ_LEN,) and int(sample["input_ids"][0]) == BOS
        assert pickle.loads(pickle.dumps(ds)).block_at(7 * n + 3) == blocks[-1]
    assert max(peaks.values()) < bound, peaks
    assert max(sizes.values()) < bound and abs(sizes[10**8] - sizes[10**3]) < 64, sizes


def test_one_epoch_of_a_training_share_visits_each_of_its_blocks_once():
    """Training blocks are a range; train_fraction keeps its first share; each epoch reads a permutation of it."""
    train = range(1000)[: round(0.1 * 1000)]
    ds = BlockDataset(FakeStream(1100 * (SEQ_LEN - 1)), train, SEQ_LEN, 0.15, 1000, seed=2, shuffle=True)
    for epoch in range(3):
        assert sorted(ds.block_at(epoch * 100 + i) for i in range(100)) == list(range(100))
    val = BlockDataset(FakeStream(1100 * (SEQ_LEN - 1)), range(1000, 1100), SEQ_LEN, 0.15, 1000, seed=2,
                       shuffle=False)
    assert [val.block_at(g) for g in range(100)] == list(range(1000, 1100))  # validation in order
    with pytest.raises(TypeError):
        BlockDataset(FakeStream(10 * (SEQ_LEN - 1)), np.arange(10), SEQ_LEN, 0.15, 1000, seed=2, shuffle=True)
