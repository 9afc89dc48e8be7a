"""MiniPost's bridge beyond the paper (issue 52): bridge.init (random | copy | affine), bridge.objective (lm | distill),
the step-0 loss every bridge run records, and `minimodel layers` (choosing N from the source model's states)."""

import csv
import json
from dataclasses import replace

import pytest
import torch

from minimodel.cli import main
from minimodel.cluster.memory import stage_models
from minimodel.config.load import model_preset
from minimodel.errors import ConfigError
from minimodel.flops import bridge_flops, layer_flops, lm_head_flops
from minimodel.models.bridge_init import agreement, fit_affine, layer_states, layer_table, mean_lm_loss
from minimodel.models.families import build
from minimodel.models.model import IGNORE_INDEX, PRIMARY
from minimodel.models.surgery import bridge_trainable, build_minipost, trainable_parameters
from minimodel.report.costs import cost_rows
from minimodel.store.checkpoints import load_trained_model
from minimodel.store.identity import stage_changes
from minimodel.training.mlm import distill_losses
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_config, tiny_overrides

DECODER = dict(family="decoder", norm="rmsnorm", positions="rotary", activation="swiglu", bias=False,
               tie_embeddings=True, dropout=0.0, attn_dropout=0.0)


def source(family: str, layers: int = 6, vocab: int = 200):
    torch.manual_seed(0)
    extra = DECODER if family == "decoder" else dict(dropout=0.0, attn_dropout=0.0)
    cfg = replace(model_preset("tiny", vocab_size=vocab), layers=layers, **extra)
    return build(cfg).eval()


def blocks(n: int = 6, T: int = 16, V: int = 200, seed: int = 0, causal: bool = True):
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(5, V, (T,), generator=g) for _ in range(n)]
    if causal:
        labels = [torch.cat([x[1:], torch.tensor([IGNORE_INDEX])]) for x in ids]
    else:
        labels = [torch.where(torch.rand(T, generator=g) < 0.3, x, IGNORE_INDEX) for x in ids]
    return ids, labels


# ----------------------------------------------------------------------------------------- the affine fit


def test_fit_affine_recovers_a_known_map():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 16, generator=g)
    a, b = torch.randn(16, 16, generator=g), torch.randn(16, generator=g)
    fit = fit_affine(x, x @ a.T + b)
    assert torch.allclose(fit.weight, a, atol=1e-3) and torch.allclose(fit.bias, b, atol=1e-3)
    assert fit.r2 == pytest.approx(1.0, abs=1e-6) and fit.tokens == 2000
    noisy = fit_affine(x, x @ a.T + b + 3 * torch.randn(2000, 16, generator=g))
    assert 0.0 < noisy.r2 < 0.99  # what is not affine stays unexplained
    with pytest.raises(ValueError, match="at least 2 tokens"):
        fit_affine(x[:1], x[:1])


@pytest.mark.parametrize("family", ["encoder", "decoder"])
def test_an_identity_affine_map_changes_nothing(family):
    model = source(family)
    mapped = build(replace(model.cfg, affine_after=3)).eval()
    mapped.load_state_dict({**model.state_dict(), "affine.weight": torch.eye(model.cfg.hidden),
                            "affine.bias": torch.zeros(model.cfg.hidden)})
    ids = torch.stack(blocks(2)[0])
    assert torch.allclose(mapped.logits(ids) if family == "decoder" else mapped.mlm_logits(ids),
                          model.logits(ids) if family == "decoder" else model.mlm_logits(ids), atol=1e-5)
    with pytest.raises(ValueError, match="model.affine_after"):
        replace(model.cfg, affine_after=6)


# ----------------------------------------------------------------------------------------- bridge.init


@pytest.mark.parametrize("family", ["encoder", "decoder"])
def test_copy_puts_the_source_top_layers_above_the_bottom_ones(family):
    model = source(family)
    mini = build_minipost(model, 2, 2, init="copy")
    assert mini.cfg.layers == 4 and mini.cfg.affine_after == 0
    for j, src in enumerate((4, 5)):
        for (name, a), (_, b) in zip(mini.layers[2 + j].state_dict().items(), model.layers[src].state_dict().items()):
            assert torch.equal(a, b), name
    for i in range(2):
        assert all(torch.equal(a, b) for a, b in zip(mini.layers[i].state_dict().values(),
                                                     model.layers[i].state_dict().values()))
    random = build_minipost(model, 2, 2, init="random")
    assert not torch.equal(random.layers[2].attn_out.weight if family == "decoder" else
                           random.layers[2].attn_out.weight, model.layers[4].attn_out.weight)


@pytest.mark.parametrize("family", ["encoder", "decoder"])
def test_a_full_depth_copy_is_the_source_model(family):
    """depth + bridge layers = L: the copied mini-model is the source itself, with or without an identity map."""
    model = source(family)
    ids, labels = blocks(causal=family == "decoder")
    full = mean_lm_loss(model, ids, labels)
    for init in ("copy", "affine"):
        mini = build_minipost(model, 4, 2, init=init)
        assert mean_lm_loss(mini, ids, labels) == pytest.approx(full, abs=1e-5), init


@pytest.mark.parametrize("family", ["encoder", "decoder"])
def test_affine_maps_layer_n_onto_what_the_copied_layers_read(family):
    model = source(family, layers=8)
    ids, _ = blocks(12)
    states = layer_states(model, ids, [2, 6])
    fit = fit_affine(states[2], states[6])
    mini = build_minipost(model, 2, 2, init="affine", affine=(fit.weight, fit.bias))
    assert mini.cfg.affine_after == 2
    assert torch.equal(mini.affine.weight, fit.weight) and torch.equal(mini.affine.bias, fit.bias)
    mapped = layer_states(mini, ids, [2])[2]  # layer 2's state is the mapped one
    assert torch.allclose(mapped, fit.apply(states[2]), atol=1e-4)
    # what trains: the two bridge layers and the map; nothing else
    trainable = {n for n, p in mini.named_parameters() if p.requires_grad}
    assert {"affine.weight", "affine.bias"} <= trainable
    assert all(n.startswith(("affine.", "layers.2.", "layers.3.")) for n in trainable)
    assert bridge_trainable(2)("affine.weight") and not bridge_trainable(2)("layers.1.qkv.weight")
    h = model.cfg.hidden
    assert trainable_parameters(mini) == trainable_parameters(build_minipost(model, 2, 2, init="copy")) + h * h + h


def test_copy_refuses_layers_that_overlap_the_bottom_ones():
    model = source("decoder")
    with pytest.raises(ValueError, match="at most 6"):
        build_minipost(model, 5, 2, init="copy")
    build_minipost(model, 5, 2, init="random")  # the paper's bridge sits on any depth
    with pytest.raises(ValueError, match="init must be one of"):
        build_minipost(model, 2, 2, init="zeros")


# ----------------------------------------------------------------------------------------- bridge.objective


def test_distillation_of_the_source_by_itself_is_zero_and_trains_only_the_student():
    teacher = source("decoder")
    ids, labels = blocks()
    x, y = torch.stack(ids), torch.stack(labels)
    same = build_minipost(teacher, 4, 2, init="copy")
    loss, parts = distill_losses(same, teacher, x, y, mse_weight=1.0)
    assert float(parts["kl"]) == pytest.approx(0.0, abs=1e-5) and float(parts["mse"]) == pytest.approx(0.0, abs=1e-6)
    assert float(parts["lm"]) == pytest.approx(mean_lm_loss(teacher, ids, labels), abs=1e-4)
    student = build_minipost(teacher, 2, 2, init="random")
    loss, parts = distill_losses(student, teacher, x, y, mse_weight=0.5)
    assert float(parts["kl"]) > 1e-4 and float(loss) == pytest.approx(float(parts["kl"] + 0.5 * parts["mse"]))
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    grads = {n for n, p in student.named_parameters() if p.grad is not None}
    assert grads and all(n.startswith(("layers.2.", "layers.3.")) for n in grads)


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_agreement_is_the_distill_kl_over_the_scored_tokens(family):
    """``agreement`` (bench_recipe.py alignment): zero KL and full top-1 agreement for a mini-model that computes
    what its source computes; for another, the token-weighted KL and LM loss that ``distill_losses`` and
    ``mean_lm_loss`` give on the same positions, whatever the batching."""
    teacher = source(family)
    ids, labels = blocks(causal=family == "decoder")
    same = agreement(build_minipost(teacher, 4, 2, init="copy"), teacher, ids, labels)
    assert same["kl"] == pytest.approx(0.0, abs=1e-5) and same["top1_agreement"] == 1.0
    assert same["tokens"] == sum(int(y.ne(IGNORE_INDEX).sum()) for y in labels)
    student = build_minipost(teacher, 2, 2, init="copy").train()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the bridge moved well away from the source's layers
        for name, p in student.named_parameters():
            if name.startswith(("layers.2.", "layers.3.")):
                p.add_(torch.randn(p.shape, generator=g) * 3 * (p.std() if p.numel() > 1 else 1.0))
    got = agreement(student, teacher, ids, labels, batch=4)  # batches of 4 and 2 blocks: weighted by token
    _, parts = distill_losses(student.eval(), teacher, torch.stack(ids), torch.stack(labels))
    assert got["kl"] == pytest.approx(float(parts["kl"]), rel=1e-4) and got["kl"] > 1e-3
    assert got["lm_loss"] == pytest.approx(mean_lm_loss(student, ids, labels), rel=1e-4)
    assert 0.0 <= got["top1_agreement"] < 1.0
    student.train()
    teacher.train()
    agreement(student, teacher, ids, labels)
    assert student.training and teacher.training  # both as the caller left them
    teacher.eval()
    agreement(student, teacher, ids, labels)
    assert student.training and not teacher.training
    noisy = build(replace(teacher.cfg, dropout=0.5)).train()  # dropout on: read in eval mode, the same every time
    assert agreement(noisy, noisy, ids, labels)["kl"] == pytest.approx(0.0, abs=1e-5) and noisy.training


# ----------------------------------------------------------------------------------------- costs


def test_bridge_flops_price_the_affine_map_and_the_teacher():
    h, s, V, p = 64, 32, 500, 1.0
    base = bridge_flops(6, h, s, V, p, 8, 10, trainable_layers=2)
    layer, head = layer_flops(h, s), lm_head_flops(h, s, V, p)
    assert base == pytest.approx(80 * ((6 + 2 * 2 - 1) * layer + 2 * head))  # A4
    assert bridge_flops(6, h, s, V, p, 8, 10, trainable_layers=2, affine=True) == pytest.approx(
        base + 80 * (layer + 4 * s * h * h))
    assert bridge_flops(6, h, s, V, p, 8, 10, trainable_layers=2, teacher_layers=12) == pytest.approx(
        base + 80 * (12 * layer + head))


def minipost(tmp_path, *extra):
    return tiny_config(tmp_path, tmp_path, "system=minipost", "model.mini_heads=[]", "bridge.depth=2",
                       "bridge.layers=1", *extra)


def test_cost_table_and_memory_plan_follow_the_recipe(tmp_path):
    paper, recipe = minipost(tmp_path), minipost(tmp_path, "bridge.init=affine", "bridge.objective=distill")
    row = {r["step"].split(" (")[0]: r for r in cost_rows(paper)}["1b bridge"]
    new = next(r for r in cost_rows(recipe) if r["step"].startswith("1b bridge"))
    assert new["formula"] == "A4 + affine + teacher forward" and "distilled from 4 layers" in new["step"]
    assert new["flops"] > row["flops"]
    old_mem = next(s for s in stage_models(paper) if s.stage == "bridge")
    new_mem = next(s for s in stage_models(recipe) if s.stage == "bridge")
    h = paper.model.hidden
    assert new_mem.trainable == old_mem.trainable + h * h + h and new_mem.heads == 2
    assert new_mem.params > 2 * old_mem.params - 4 * h  # the teacher is a second, deeper model in memory


# ----------------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("override, message", [
    ("bridge.init=zeros", "bridge.init must be one of random, copy, affine"),
    ("bridge.objective=kl", "bridge.objective must be one of lm, distill"),
    ("bridge.distill_mse=0.5", "set bridge.objective=distill"),
    ("bridge.distill_mse=-1", "bridge.distill_mse must be 0 or a positive number"),
    ("bridge.fit_tokens=0", "bridge.fit_tokens must be a positive integer"),
])
def test_bad_bridge_settings_are_refused_at_load(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        minipost(tmp_path, override)


def test_copy_deeper_than_the_model_is_refused_at_load(tmp_path):
    with pytest.raises(ConfigError, match="depth \\+ layers must be at most model.layers \\(4\\), got 5"):
        minipost(tmp_path, "bridge.init=copy", "bridge.depth=3", "bridge.layers=2")


def test_the_recipe_is_part_of_the_bridge_identity(tmp_path):
    from omegaconf import OmegaConf

    def plain(cfg):
        return OmegaConf.to_container(OmegaConf.structured(cfg))

    paper = plain(minipost(tmp_path))
    for override in ("bridge.init=copy", "bridge.objective=distill", "bridge.fit_tokens=100"):
        changed = stage_changes(paper, plain(minipost(tmp_path, override)), "bridge")
        assert [k for k, _, _ in changed] == [override.split("=")[0]]
    distilled = plain(minipost(tmp_path, "bridge.objective=distill"))
    with_mse = plain(minipost(tmp_path, "bridge.objective=distill", "bridge.distill_mse=0.5"))
    assert [k for k, _, _ in stage_changes(distilled, with_mse, "bridge")] == ["bridge.distill_mse"]
    # an older run's config without the keys counts as the paper's recipe
    old = {k: v for k, v in paper.items()}
    old["bridge"] = {k: v for k, v in paper["bridge"].items() if k not in ("init", "objective", "fit_tokens",
                                                                         "distill_mse")}
    assert stage_changes(old, paper, "bridge") == []


# ----------------------------------------------------------------------------------------- the stage, end to end


@pytest.mark.slow
def test_an_affine_distilled_bridge_records_its_step_0_loss_and_keeps_the_bottom(tmp_path, prepared, corpus_dir):
    from minimodel.stages.bridge import run_bridge
    from minimodel.stages.pretrain import run_pretrain

    stages = stage_overrides(["pretrain", "bridge"], updates=6, **TINY_STAGE, ckpt_every=6, val_every=6, log_every=2)
    common = ["model.mini_heads=[]", "bridge.depth=2", "bridge.layers=1", *stages]
    base = run_pretrain(tiny_config(tmp_path, corpus_dir, "system=bl_base", *common, prepared=prepared),
                        progress_bar=False).run_dir
    primary, _ = load_trained_model(base / "checkpoints" / "last.ckpt")
    recipe = ["bridge.init=affine", "bridge.objective=distill", "bridge.distill_mse=0.1", "bridge.fit_tokens=500"]
    run = run_bridge(tiny_config(tmp_path, corpus_dir, "system=minipost", *common, *recipe, prepared=prepared),
                     progress_bar=False)
    info = json.loads((run.run_dir / "bridge_info.json").read_text())
    assert info["init"] == "affine" and info["objective"] == "distill"
    assert info["affine"]["tokens"] == 8 * 64 and info["affine"]["from_layer"] == 2 and info["affine"]["to_layer"] == 3
    assert info["step0_blocks"] == 8 and info["step0_loss"] > 0 and info["source_loss"] > 0
    assert run.done["bridge"]["step0_loss"] == info["step0_loss"]
    mini, meta = load_trained_model(run.run_dir / "checkpoints" / "last.ckpt")
    assert mini.cfg.affine_after == 2 and meta.extra["init"] == "affine"
    assert meta.flops == pytest.approx(6 * bridge_flops(3, 64, 64, 1000, 0.15, 8, 1, trainable_layers=1, affine=True,
                                                        teacher_layers=4))
    for i in range(2):  # the copied bottom layers are bit-identical to the source's
        for (name, a), b in zip(mini.layers[i].state_dict().items(), primary.layers[i].state_dict().values()):
            assert torch.equal(a, b), name
    metrics = (run.run_dir / "metrics.csv").read_text()
    assert "train/kl" in metrics and "train/mse" in metrics
    # how closely it follows the source, before and after: the final figures are the trained model's on the
    # validation blocks (its loss there is the last val/loss), also in done.json
    assert info["step0_kl"] > 0 and 0 <= info["step0_top1"] <= 1
    final = info["final"]
    assert final["tokens"] > 0 and final["kl"] >= 0 and run.done["bridge"]["final"] == final
    val = [float(r["val/loss"]) for r in csv.DictReader(metrics.splitlines()) if r.get("val/loss")]
    assert final["lm_loss"] == pytest.approx(val[-1], rel=1e-4)

    # a full-depth copy is the source model itself: its step-0 loss is the source's
    full = ["bridge.init=copy", "bridge.depth=3", "name=tiny_full"]
    run = run_bridge(tiny_config(tmp_path, corpus_dir, "system=minipost", *common, *full,
                                 f"bridge.source={base / 'checkpoints' / 'last.ckpt'}", prepared=prepared),
                     progress_bar=False)
    info = json.loads((run.run_dir / "bridge_info.json").read_text())
    assert info["step0_loss"] == pytest.approx(info["source_loss"], abs=1e-5)
    assert info["step0_kl"] == pytest.approx(0.0, abs=1e-5) and info["step0_top1"] == 1.0

    # the paper's bridge (random layers, the LM loss) records the same: further from the source at step 0
    run = run_bridge(tiny_config(tmp_path, corpus_dir, "system=minipost", *common, "name=tiny_paper",
                                 f"bridge.source={base / 'checkpoints' / 'last.ckpt'}", prepared=prepared),
                     progress_bar=False)
    info = json.loads((run.run_dir / "bridge_info.json").read_text())
    assert (info["init"], info["objective"]) == ("random", "lm") and "affine" not in info
    assert info["step0_loss"] > info["source_loss"] and info["step0_kl"] > 0 and "final" in info
    from minimodel.report.bridges import bridge_rows

    [row] = bridge_rows(run.run_dir.parent.parent)  # the report's step-1b table reads the finished run
    assert row[:4] == ["minipost", "random, lm, N = 2 + 1", "6", f"{run.done['flops'] / 1e18:.4g}"]
    assert row[5] == f"{info['step0_loss'] - info['source_loss']:+.3f}"

    # `minimodel layers`: a row per layer of the source; the affine mini-model at N = L - k is the source
    out = tmp_path / "layers.json"
    args = [str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(tmp_path, corpus_dir, prepared),
            "data.num_workers=0", "system=minipost", *common, "bridge.fit_tokens=500"]
    assert main(["layers", *args, "--json", str(out)]) == 0
    table = json.loads(out.read_text())
    rows = table["rows"]
    assert [r["layer"] for r in rows] == [1, 2, 3, 4]
    assert rows[2]["affine_gap"] == pytest.approx(0.0, abs=1e-4) and rows[2]["affine_r2"] == pytest.approx(1.0)
    assert rows[3]["affine_loss"] != rows[3]["affine_loss"]  # nan: no mini-model of depth L
    assert all(0.0 <= r["angular_to_last"] <= 1.0 for r in rows) and rows[3]["angular_to_last"] < 1e-3
    assert 0 < rows[0]["step2_share"] < rows[1]["step2_share"] < 1
    assert main(["layers", *args, "--json", str(out)]) != 0  # never over an existing file


def test_layer_table_on_a_decoder_matches_the_mini_models_it_describes():
    model = source("decoder", layers=6)
    fit_ids, _ = blocks(10, seed=1)
    ids, labels = blocks(4, seed=2)
    rows, full = layer_table(model, fit_ids, ids, labels, bridge_layers=2)
    assert full == pytest.approx(mean_lm_loss(model, ids, labels))
    for n in (1, 3):
        states = layer_states(model, fit_ids, [n, 4])
        fit = fit_affine(states[n], states[4])
        mini = build_minipost(model, n, 2, init="affine", affine=(fit.weight, fit.bias))
        assert rows[n - 1].affine_loss == pytest.approx(mean_lm_loss(mini, ids, labels), abs=1e-4)
    assert rows[3].affine_loss == pytest.approx(full, abs=1e-4)  # N = L - k: the source itself
    assert PRIMARY in model.heads


@pytest.mark.parametrize("family", ["encoder", "decoder"])
def test_layer_redundancy_by_hand_from_each_layers_input_and_output(family):
    """Block influence (ShortGPT: 1 - cos(a layer's input, its output), per token, averaged) and the angular distance
    to the last layer (Gromov et al.: arccos(cos(state after N, state after L)) / pi), from the states the layers
    themselves read and write (forward hooks, not the table's own ``layer_states``), and the printed table."""
    from minimodel.stages.layers import _row, layers_table

    model = source(family, layers=5)
    ids, labels = blocks(3, seed=2, causal=family == "decoder")
    seen: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in range(5)}
    hooks = [layer.register_forward_hook(lambda m, args, out, i=i: seen[i].append((args[0].detach(), out.detach())))
             for i, layer in enumerate(model.layers)]
    try:
        for x in ids:  # one block at a time, as plain forwards of the whole model
            mean_lm_loss(model, [x], [labels[0]])
    finally:
        for h in hooks:
            h.remove()
    inputs = {i: torch.cat([a.flatten(0, 1) for a, _ in seen[i]]) for i in seen}
    outputs = {i: torch.cat([b.flatten(0, 1) for _, b in seen[i]]) for i in seen}
    rows, full = layer_table(model, ids, ids, labels, bridge_layers=2)
    for n in range(1, 6):
        a, b, last = inputs[n - 1], outputs[n - 1], outputs[4]
        influence = 1 - torch.nn.functional.cosine_similarity(a, b, dim=-1).mean()
        angle = torch.arccos(torch.nn.functional.cosine_similarity(b, last, dim=-1).clamp(-1, 1)).mean() / torch.pi
        assert rows[n - 1].block_influence == pytest.approx(float(influence), abs=1e-5)
        assert rows[n - 1].angular_to_last == pytest.approx(float(angle), abs=1e-4)
    assert rows[0].block_influence > 0 and rows[0].angular_to_last > 0.01  # a random layer moves its input
    table = layers_table([_row(r, full, 0.5 if r.layer < 4 else float("nan")) for r in rows],
                         {"source": "tiny", "layers": 5, "bridge_layers": 2, "lang": "en", "fit_tokens": 48,
                          "val_tokens": 48, "source_loss": full})
    lines = table.splitlines()
    assert lines[0].startswith(f"tiny: 5 layers, en validation (48 tokens); the source model's loss {full:.3f}")
    first = [c.strip() for c in lines[4].strip("|").split("|")]  # the row of N = 1
    assert first == ["1", f"{rows[0].block_influence:.4f}", f"{rows[0].angular_to_last:.4f}",
                     f"{rows[0].affine_loss:.3f}", f"{rows[0].affine_loss - full:+.3f}", f"{rows[0].affine_r2:.3f}",
                     "50%"]
    assert lines[-1].split("|")[4:8] == [" — ", " — ", " — ", " — "]  # N = 5 > L - k: no mini-model of that depth


# ----------------------------------------------------------------------------------------- the report


def test_the_report_says_what_each_bridge_cost_and_how_close_it_came(tmp_path):
    """`minimodel report`'s section on step 1b, from the finished bridge runs' done.json and bridge_info.json: the
    recipe, the FLOPs and V100-days as the run recorded them (a distilled one's include the teacher), the gap to the
    source before and after; an unfinished or damaged run is left out, and under report.systems a bridge goes by
    the names of the rows that read it (and one no chosen row reads is left out)."""
    from minimodel.flops import V100_DAY
    from minimodel.report.bridges import bridge_rows
    from minimodel.report.document import write_report
    from tests.test_unadapted_report import rows as result_rows
    from tests.test_unadapted_report import write_jsonl

    root = tmp_path / "exp"

    def bridge(label: str, done: dict | str | None, info: dict) -> None:
        d = root / label / "bridge"
        d.mkdir(parents=True)
        (d / "bridge_info.json").write_text(json.dumps(info))
        if done is not None:
            (d / "done.json").write_text(done if isinstance(done, str) else json.dumps(done))

    paper = {"init": "random", "objective": "lm", "depth": 10, "bridge_layers": 2, "step0_loss": 24.0,
             "source_loss": 3.5}
    recipe = {**paper, "init": "affine", "objective": "distill", "distill_mse": 0.1, "depth": 12, "step0_loss": 5.5,
              "final": {"kl": 0.98, "top1_agreement": 0.53, "lm_loss": 3.957}}
    bridge("minipost", {"stage": "bridge", "step": 1000, "flops": 2.5e14}, paper)
    bridge("minipost-recipe", {"stage": "bridge", "step": 1000, "flops": 2 * V100_DAY, "bridge": recipe}, {})
    bridge("minipost-cut", None, paper)  # stopped before its end: no done.json
    bridge("minipost-bad", "{not json", paper)
    bridge("minipost-ps2", {"stage": "bridge", "step": 1000, "flops": 2.5e14}, {**paper, "step0_loss": 25.0})
    assert bridge_rows(root) == [
        ["minipost", "random, lm, N = 10 + 2", "1,000", "0.00025", "9.65e-05", "+20.500", "—", "—", "—"],
        ["minipost (pretraining seed 2)", "random, lm, N = 10 + 2", "1,000", "0.00025", "9.65e-05", "+21.500", "—",
         "—", "—"],
        ["minipost-recipe", "affine, distill + 0.1 MSE, N = 12 + 2", "1,000", "5.184", "2", "+2.000", "+0.457",
         "0.980", "53.0%"]]
    assert [r[0] for r in bridge_rows(root, {"minipost@mean": "paper"})] == ["paper", "paper (pretraining seed 2)"]
    # report.systems' default ({}, as every loaded config has it) is every system, not none
    assert bridge_rows(root, {}) == bridge_rows(root)
    for system in ("minipost", "minipost-recipe@mean"):
        (root / system).mkdir(parents=True, exist_ok=True)
        write_jsonl(root / system / "results.jsonl", result_rows(system, "fr", {1: 60, 2: 61}))
    text = write_report(tmp_path, "exp", out=tmp_path / "all.md").read_text()
    assert "## Step 1b: the mini-models' bridges (a one-time cost)" in text
    assert write_report(tmp_path, "exp", out=tmp_path / "default.md", systems={}).read_text() == text
    assert "| minipost-recipe | affine, distill + 0.1 MSE, N = 12 + 2 | 1,000 | 5.184 | 2 |" in text
    named = write_report(tmp_path, "exp", out=tmp_path / "named.md", systems={"minipost-recipe@mean": "minipost"})
    section = named.read_text().split("## Step 1b")[1]
    assert "| minipost | affine, distill" in section and "random, lm" not in section
    assert bridge_rows(root, {"bl_base": "bl_base"}) == []
    # an experiment whose models are another's (models_from): the bridges it reads are that experiment's
    (tmp_path / "reuser" / "minipost").mkdir(parents=True)
    write_jsonl(tmp_path / "reuser" / "minipost" / "results.jsonl", result_rows("minipost", "fr", {1: 60, 2: 61}))
    reused = write_report(tmp_path, "reuser", out=tmp_path / "reuser.md", models_from="exp").read_text()
    assert "| minipost-recipe | affine, distill" in reused
    assert "## Step 1b" not in write_report(tmp_path, "reuser", out=tmp_path / "own.md").read_text()
