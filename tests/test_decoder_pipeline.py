"""Tiny end-to-end runs of the decoder family (``model.family: decoder``): the four systems through steps 1-4 on
real English and German, with an untied (Llama-style) causal LM, the target-language perplexity rows of step 4, and
an interrupted decoder pretraining that resumes exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from minimodel.cli import main
from minimodel.stages.adapt import run_adapt
from minimodel.stages.pretrain import run_pretrain
from minimodel.store.checkpoints import load_adaptation, load_checkpoint, load_trained_model
from minimodel.store.layout import adaptation_checkpoints
from minimodel.store.results import ResultsTable
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_config, tiny_overrides
from tests.test_pretrain import rows

pytestmark = pytest.mark.slow

LLAMA = ["model.family=decoder", "model.norm=rmsnorm", "model.positions=rotary", "model.activation=swiglu",
         "model.bias=false", "model.tie_embeddings=false"]


def small_task(tmp: Path, n: int = 60) -> Path:
    """The demo's topic task cut to its first 64 training examples and ``n`` dev / test examples of their labels
    (evaluating 1,400 German test examples at every checkpoint would be most of this test's time)."""
    src, out = ROOT / "data" / "demo" / "task" / "lohelp", tmp / "lohelp"
    out.mkdir()
    train = (src / "train.jsonl").read_text().splitlines()[:64]
    labels = {json.loads(line)["label"] for line in train}
    (out / "train.jsonl").write_text("\n".join(train) + "\n")
    for name in ("dev.jsonl", "test.en.jsonl", "test.de.jsonl"):
        kept = [line for line in (src / name).read_text().splitlines() if json.loads(line)["label"] in labels]
        (out / name).write_text("\n".join(kept[:n]) + "\n")
    return out


def run_args(tmp: Path, corpus: Path, prepared: Path) -> list[str]:
    return [*tiny_overrides(tmp, corpus, prepared), "data.num_workers=0", *LLAMA, "target_langs=[de]",
            f"tasks.lohelp.source={small_task(tmp)}",
            *stage_overrides(["pretrain", "bridge", "adapt"], global_batch=8, micro_batch=8, warmup_updates=1,
                             val_every=4, log_every=2),
            *stage_overrides(["pretrain"], updates=4), *stage_overrides(["bridge"], updates=2),
            *stage_overrides(["adapt"], updates=4, ckpt_every=2, ckpt_steps=[1]),
            "tasks.lohelp.max_train_examples=32", "tasks.lohelp.max_len=48", "finetune.epochs=1",
            "finetune.batch_size=16", "finetune.micro_batch=16", "finetune.mini_tasks=[]"]


def state(path: Path) -> dict[str, torch.Tensor]:
    return {k.removeprefix("model."): v for k, v in load_checkpoint(path)["state_dict"].items()}


def test_the_four_decoder_systems_through_steps_1_to_4(tmp_path, prepared, corpus_dir):
    args = run_args(tmp_path, corpus_dir, prepared)
    assert main(["run", str(ROOT / "experiments" / "demo.yaml"), *args, "--no-progress"]) == 0
    runs = tmp_path / "runs" / "demo"
    base_model, base_meta = load_trained_model(runs / "bl_base" / "pretrain" / "checkpoints" / "last.ckpt")
    assert type(base_model).__name__ == "DecoderLM" and base_meta.model_config["family"] == "decoder"
    assert not base_model.cfg.tie_embeddings
    for system, layers in (("bl_base", 4), ("bl_small", 2), ("minijoint", 2), ("minipost", 2)):
        adapt = runs / system / "adapt" / "de"
        info = json.loads((adapt / "adapt_info.json").read_text())
        # step 2 learns new input embeddings and a new output projection (untied), nothing else
        assert info["trainable_parameters"] == 2 * 1000 * 64 and info["body_layers"] == layers, system
        last = load_adaptation(adaptation_checkpoints(adapt)[-1])
        assert last.output is not None and last.output.shape == last.embeddings.shape == (1000, 64)
        assert last.bias.numel() == 0 and not torch.equal(last.output, last.embeddings)
        # the body step 2 trained over is bit-identical to where it came from
        body = runs / system / ("bridge" if system == "minipost" else "pretrain") / "checkpoints" / "last.ckpt"
        before, after = state(body), state(adapt / "checkpoints" / "last.ckpt")
        frozen = [k for k in after if not k.startswith(("embeddings.tokens", "heads.primary.decoder"))]
        if system == "minijoint":  # its body: layers 1-2 and the head after layer 2 (the mini-model's primary head)
            before = {k.replace("heads.l2.", "heads.primary."): v for k, v in before.items()
                      if not k.startswith(("layers.2.", "layers.3.", "heads.primary."))}
        assert frozen and all(torch.equal(after[k], before[k]) for k in frozen), system
        # step 3: every layer trained, the embeddings (and the LM heads) frozen
        primary = runs / ("bl_base" if system == "minipost" else system) / "pretrain" / "checkpoints" / "last.ckpt"
        ft = load_checkpoint(runs / ("bl_base" if system == "minipost" else system) / "finetune" / "lohelp" / "seed1"
                             / "model.pt")
        source = state(primary)
        assert torch.equal(ft["body_state"]["embeddings.tokens.weight"], source["embeddings.tokens.weight"])
        assert not torch.equal(ft["body_state"]["layers.0.qkv.weight"], source["layers.0.qkv.weight"])
        # step 4: the zero-shot score and the target-language perplexity of every adaptation checkpoint
        rows = [r for r in ResultsTable(runs / system / "results.jsonl").rows() if r["lang"] == "de"]
        steps = {0, 1, 2, 4}
        assert {r["step"] for r in rows if r["metric"] == "accuracy"} == steps
        ppl = {r["step"]: r["value"] for r in rows if r["metric"] == "perplexity"}
        assert set(ppl) == steps and all(1.0 < v < 1e6 and math.isfinite(v) for v in ppl.values()), (system, ppl)
        assert ppl[4] < ppl[0], (system, ppl)  # adaptation lowers the target-language perplexity
        # the same loss per character of the held-out text: the same text and tokenizer at every step, so loss per
        # character / loss per token (characters per token) is one figure for the language
        per_char = {r["step"]: r["value"] for r in rows if r["metric"] == "loss_per_char"}
        chars_per_token = {round(math.log(ppl[s]) / per_char[s], 9) for s in steps}
        assert set(per_char) == steps and len(chars_per_token) == 1 and 1.0 < chars_per_token.pop() < 10.0, per_char
    assert "perplexity" in (runs / "report.md").read_text()  # the report's table of every other metric


def test_an_interrupted_decoder_pretraining_and_adaptation_resume_exactly(tmp_path, prepared, corpus_dir):
    """Untied MiniJoint: step 1 stopped at update 3 and resumed, then step 2 (input embeddings and output projection,
    over the head after layer 2) stopped at update 3 and resumed, equal the uninterrupted runs bit for bit."""
    extra = [*LLAMA, "model.mini_heads=[2]", "system=minijoint",
             *stage_overrides(["pretrain", "adapt"], updates=8, **TINY_STAGE, ckpt_every=4, val_every=4, log_every=1)]
    a, b = tmp_path / "a", tmp_path / "b"
    straight = run_pretrain(tiny_config(a, corpus_dir, *extra, prepared=prepared), progress_bar=False)
    run_pretrain(tiny_config(b, corpus_dir, *extra, "pretrain.trainer.stop_at=3", prepared=prepared),
                 progress_bar=False)
    resumed = run_pretrain(tiny_config(b, corpus_dir, *extra, prepared=prepared), progress_bar=False)
    one, two = state(straight.run_dir / "checkpoints" / "last.ckpt"), state(resumed.run_dir / "checkpoints" / "last.ckpt")
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    assert rows(straight.run_dir) == rows(resumed.run_dir)

    adapted = run_adapt(tiny_config(a, corpus_dir, *extra, "lang=de", prepared=prepared), progress_bar=False)
    run_adapt(tiny_config(b, corpus_dir, *extra, "lang=de", "adapt.trainer.stop_at=3", prepared=prepared),
              progress_bar=False)
    again = run_adapt(tiny_config(b, corpus_dir, *extra, "lang=de", prepared=prepared), progress_bar=False)
    x, y = (load_adaptation(adaptation_checkpoints(r.run_dir)[-1]) for r in (adapted, again))
    assert x.step == y.step == 8 and x.output is not None
    assert torch.equal(x.embeddings, y.embeddings) and torch.equal(x.output, y.output)
    assert rows(adapted.run_dir) == rows(again.run_dir)
