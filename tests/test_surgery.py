from dataclasses import replace

import pytest
import torch

from minimodel.config.load import model_preset
from minimodel.models.model import IGNORE_INDEX, PRIMARY, RobertaMLM
from minimodel.models.surgery import (
    PlugError,
    adaptation_trainable,
    build_minipost,
    extract_mini,
    freeze_all_but,
    overlap_init,
    plug_embeddings,
    swap_embeddings,
    trainable_parameters,
)
from minimodel.store.checkpoints import Adaptation
from minimodel.training.optim import build_optimizer


def tiny(mini_heads=(2,), vocab=300) -> RobertaMLM:
    torch.manual_seed(0)
    return RobertaMLM(model_preset("tiny", vocab_size=vocab, mini_heads=list(mini_heads)))


def data(V=300, B=4, T=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(5, V, (B, T), generator=g)
    labels = torch.where(torch.rand(B, T, generator=g) < 0.3, x, IGNORE_INDEX)
    return x, labels


def train_steps(model: RobertaMLM, n=3, V=300) -> None:
    model.train()
    opt, _ = build_optimizer(model.parameters(), __import__("minimodel.config.schema", fromlist=["OptimConfig"]).OptimConfig(lr=1e-2))
    for i in range(n):
        x, labels = data(V, seed=i)
        loss = torch.stack(list(model.mlm_losses(x, labels).values())).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_extracted_minijoint_mini_model_matches_the_primary_bottom_path():
    full = tiny().eval()
    mini = extract_mini(full, 2).eval()
    assert mini.cfg.layers == 2 and mini.cfg.head_names == ["primary"]
    assert mini.heads[PRIMARY].decoder.weight is mini.embeddings.tokens.weight
    x, labels = data()
    masked = labels.ne(IGNORE_INDEX)
    assert torch.equal(mini.mlm_logits(x, masked), full.mlm_logits(x, masked, head="l2"))
    assert torch.equal(mini.hidden_states(x, [2])[2], full.hidden_states(x, [2])[2])
    # copies, not views: training the mini-model leaves the primary model alone
    before = snapshot(full)
    train_steps(mini)
    assert all(torch.equal(before[k], v) for k, v in full.state_dict().items())


def test_minipost_trains_only_the_new_layers():
    primary = tiny(mini_heads=())
    mini = build_minipost(primary, depth=2, bridge_layers=2, seed=1)
    assert mini.cfg.layers == 4
    per_layer = sum(p.numel() for p in mini.layers[0].parameters())
    assert trainable_parameters(mini) == 2 * per_layer
    # copied parts equal the primary model's, the new layers are fresh
    for i in range(2):
        for (n, a), b in zip(mini.layers[i].state_dict().items(), primary.layers[i].state_dict().values()):
            assert torch.equal(a, b), n
    assert not torch.equal(mini.layers[2].qkv.weight, primary.layers[2].qkv.weight)
    assert torch.equal(mini.heads[PRIMARY].dense.weight, primary.heads[PRIMARY].dense.weight)
    before = snapshot(mini)
    train_steps(mini)
    after = mini.state_dict()
    for k, v in after.items():
        if k.startswith(("layers.2.", "layers.3.")):
            if k.endswith("weight") and "norm" not in k:
                assert not torch.equal(v, before[k]), f"{k} did not train"
        else:
            assert torch.equal(v, before[k]), f"frozen {k} changed"


def test_adaptation_freezes_everything_but_embeddings_and_output_bias():
    model = extract_mini(tiny(), 2)
    V_trg = 250
    weight = torch.randn(V_trg, 64) * 0.02
    swap_embeddings(model, weight, torch.zeros(V_trg))
    assert model.cfg.vocab_size == V_trg
    assert model.heads[PRIMARY].decoder.weight is model.embeddings.tokens.weight  # the tie holds after the swap
    n = freeze_all_but(model, adaptation_trainable)
    assert n == V_trg * 64 + V_trg
    before = snapshot(model)
    train_steps(model, V=V_trg)
    after = model.state_dict()
    changed = {k for k, v in after.items() if not torch.equal(v, before[k])}
    assert changed == {"embeddings.tokens.weight", "heads.primary.decoder.weight", "heads.primary.bias"}


def test_overlap_init_copies_exactly_the_shared_pieces():
    source = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4)
    src_pieces = ["<s>", "<pad>", "▁the", "▁und", "s", "▁x"]
    trg_pieces = ["<s>", "<pad>", "▁und", "▁der", "s", "▁die", "▁x"]
    weight, rows = overlap_init(source, src_pieces, trg_pieces, generator=torch.Generator().manual_seed(0))
    assert rows.tolist() == [0, 1, 3, -1, 4, -1, 5]
    copied = rows >= 0
    for i, piece in enumerate(trg_pieces):
        if piece in src_pieces:
            assert torch.equal(weight[i], source[src_pieces.index(piece)])
    fresh = weight[~copied]
    assert fresh.abs().max() < 0.2 and fresh.std() > 0  # N(0, 0.02)
    big, _ = overlap_init(torch.zeros(1, 512), ["a"], [f"p{i}" for i in range(400)])
    assert abs(big.std().item() - 0.02) < 0.001 and abs(big.mean().item()) < 0.001


def test_plugging_checks_tokenizer_and_sizes():
    model = tiny(mini_heads=())
    adapted = Adaptation(embeddings=torch.randn(250, 64), bias=torch.zeros(250), system="minijoint", lang="de",
                         step=5, flops=0.0, tokenizer={"path": "de/spm.model", "sha256": "a" * 64})
    with pytest.raises(PlugError, match=r"minijoint, de, step 5\) was trained with tokenizer de/spm.model"):
        plug_embeddings(model, adapted, "b" * 64, 250)
    with pytest.raises(PlugError, match=r"has 250 embedding rows but the tokenizer has 300 pieces"):
        plug_embeddings(model, adapted, "a" * 64, 300)
    wide = replace(adapted, embeddings=torch.randn(250, 32))
    with pytest.raises(PlugError, match=r"width 32, the model expects 64"):
        plug_embeddings(model, wide, "a" * 64, 250)
    plug_embeddings(model, adapted, "a" * 64, 250)
    assert torch.equal(model.embeddings.tokens.weight, adapted.embeddings)
    assert model.heads[PRIMARY].decoder.weight is model.embeddings.tokens.weight
    x, _ = data(V=250)
    assert model.encode(x).shape == (4, 24, 64)
