import pytest
import torch

from minimodel.config.load import model_preset
from minimodel.models.model import IGNORE_INDEX, ModelConfig, RobertaMLM


def make(mini_heads=(2,), **kw) -> RobertaMLM:
    torch.manual_seed(0)
    cfg = model_preset("tiny", vocab_size=300, mini_heads=list(mini_heads), **kw)
    return RobertaMLM(cfg).eval()


def batch(B=3, T=20, V=300, pad_last=0):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(5, V, (B, T), generator=g)
    x[:, 0] = 0
    if pad_last:
        x[0, -pad_last:] = 1
    return x


def test_presets():
    base = model_preset("roberta-base")
    assert (base.layers, base.hidden, base.heads, base.ffn, base.vocab_size) == (12, 768, 12, 3072, 50_000)
    small = model_preset("roberta-small")
    assert (small.layers, small.hidden) == (4, 768)
    with pytest.raises(ValueError, match="mini_heads: depth 7 is outside 1..4"):
        model_preset("tiny", mini_heads=[7])
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(hidden=100, heads=12)


def test_every_head_is_tied_to_the_embeddings_by_identity():
    m = make(mini_heads=(1, 3))
    assert set(m.heads) == {"primary", "l1", "l3"}
    for head in m.heads.values():
        assert head.decoder.weight is m.embeddings.tokens.weight
    # the tied matrix is counted once
    n_unique = sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())
    assert m.num_parameters() == n_unique


def test_masked_only_logits_equal_full_logits_at_masked_positions():
    m = make()
    x = batch()
    masked = torch.zeros_like(x, dtype=torch.bool)
    masked[:, 3] = masked[1, 7] = masked[2, 11] = True
    for head in ("primary", "l2"):
        full = m.mlm_logits(x, head=head)  # (B, T, V)
        sparse = m.mlm_logits(x, masked, head=head)  # (N, V)
        assert sparse.shape == (int(masked.sum()), 300)
        torch.testing.assert_close(sparse, full[masked], rtol=0, atol=1e-6)


def test_mini_model_hidden_states_equal_the_bottom_of_the_full_model_and_skip_upper_layers():
    m = make()
    x = batch()
    full = m.hidden_states(x, [1, 2, 3, 4])
    calls = []
    hooks = [layer.register_forward_hook(lambda mod, i, o, k=k: calls.append(k)) for k, layer in enumerate(m.layers)]
    mini = m.hidden_states(x, [2])
    for h in hooks:
        h.remove()
    assert calls == [0, 1]  # layers 3 and 4 were never run
    assert torch.equal(mini[2], full[2])
    calls.clear()
    m.mlm_losses(x, torch.where(x > 100, x, IGNORE_INDEX), heads=["l2"])
    assert calls == []  # hooks removed; sanity of the hook test itself


def test_secondary_head_loss_reaches_only_layers_up_to_n_and_the_embeddings():
    m = make().train()
    x = batch()
    labels = torch.full_like(x, IGNORE_INDEX)
    labels[:, 5:9] = x[:, 5:9]
    loss = m.mlm_losses(x, labels, heads=["l2"])["l2"]
    loss.backward()
    for name, p in m.named_parameters():
        grad = p.grad is not None and bool(p.grad.abs().sum() > 0)
        if name.startswith(("layers.2.", "layers.3.", "heads.primary.")):
            assert not grad, f"{name} got gradient from the secondary head"
        elif name.startswith(("layers.0.", "layers.1.", "embeddings.tokens", "heads.l2.")):
            assert grad, f"{name} got no gradient"


def test_padding_does_not_change_the_outputs_of_real_tokens():
    m = make()
    x = batch(B=1, T=12)
    padded = torch.cat([x, torch.ones(1, 5, dtype=torch.long)], dim=1)
    a = m.encode(x)
    b = m.encode(padded)[:, :12]
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_positions_use_robertas_padding_offset():
    m = make()
    x = torch.tensor([[0, 7, 8, 2, 1, 1]])
    seen = {}
    m.embeddings.positions.register_forward_hook(lambda mod, i, o: seen.update(pos=i[0]))
    m.encode(x)
    assert seen["pos"].tolist() == [[2, 3, 4, 5, 1, 1]]


def test_mlm_losses_by_head_and_mean():
    m = make()
    x = batch()
    labels = torch.where(torch.rand(x.shape, generator=torch.Generator().manual_seed(3)) < 0.3, x, IGNORE_INDEX)
    losses = m.mlm_losses(x, labels)
    assert set(losses) == {"primary", "l2"}
    ref = torch.nn.functional.cross_entropy(m.mlm_logits(x, head="primary").reshape(-1, 300), labels.reshape(-1))
    torch.testing.assert_close(losses["primary"], ref)
