import json
from pathlib import Path

import pytest
import torch

from minimodel.cli import main
from minimodel.config.load import model_preset
from minimodel.config.schema import TaskConfig
from minimodel.data.downstream import evaluate, predict, task_head
from minimodel.data.tasks import TaskData
from minimodel.data.tokenizer import Tokenizer
from minimodel.models.model import RobertaMLM
from minimodel.models.surgery import plug_embeddings
from minimodel.store.checkpoints import Adaptation, load_checkpoint
from minimodel.store.results import ResultsTable
from tests.conftest import ROOT, stage_overrides, tiny_overrides

LOHELP = TaskConfig(kind="local", source=str(ROOT / "data" / "demo" / "task" / "lohelp"), max_len=48)


def test_evaluating_with_swapped_embeddings_equals_a_model_built_with_them(prepared):
    tok = Tokenizer(prepared / "prepared" / "de" / "spm.model")
    task = TaskData("lohelp", LOHELP)
    records = task.records("test", "de")[:40]
    features = task.features(records, tok)
    torch.manual_seed(0)
    cfg = model_preset("tiny", vocab_size=1000, max_positions=66)
    finetuned = RobertaMLM(cfg)  # stands for a finetuned body with source embeddings
    head = task_head(task, cfg.hidden, 0.1)
    adapted = Adaptation(embeddings=torch.randn(1000, 64) * 0.3, bias=torch.zeros(1000), system="bl_base",
                         lang="de", step=3, flops=0.0, tokenizer={"path": str(tok.path), "sha256": tok.sha256})
    direct = RobertaMLM(cfg)
    state = {k: v for k, v in finetuned.state_dict().items()}
    state["embeddings.tokens.weight"] = state["heads.primary.decoder.weight"] = adapted.embeddings
    state["heads.primary.bias"] = adapted.bias
    direct.load_state_dict(state)
    direct.tie_weights()
    plug_embeddings(finetuned, adapted, tok.sha256, tok.vocab_size)
    cpu = torch.device("cpu")
    assert predict(finetuned, head, features, 16, cpu) == predict(direct, head, features, 16, cpu)
    swapped = evaluate(task, finetuned, head, records, features, "de", 16, cpu)
    built = evaluate(task, direct, head, records, features, "de", 16, cpu)
    assert swapped == built
    ids = torch.tensor([features[0]["input_ids"]])
    assert torch.equal(head.eval()(finetuned.eval().encode(ids)), head(direct.eval().encode(ids)))


def test_results_table_survives_a_partial_line(tmp_path):
    table = ResultsTable(tmp_path / "results.jsonl")
    row = {"system": "bl_base", "body": "primary", "task": "xnli", "lang": "de", "seed": 1, "step": 5,
           "flops": 1.0, "v100_days": 0.0, "split": "test", "metric": "accuracy", "value": 50.0}
    table.append([row])
    with open(table.path, "a") as f:
        f.write('{"system": "bl_base", "body": "prim')  # a writer killed mid-line
    assert len(table.rows()) == 1
    table.append([{**row, "step": 10}])
    assert [r["step"] for r in table.rows()] == [5, 10]
    assert table.path.read_text().count("\n") == 2


ONE_STAGE = stage_overrides(["pretrain", "bridge", "adapt"], global_batch=8, micro_batch=4, warmup_updates=1,
                            val_every=4, log_every=2)


def tiny_demo(tmp: Path, prepared: Path, corpus: Path) -> list[str]:
    return [*tiny_overrides(tmp, corpus, prepared), "model.hidden=64", "model.ffn=128", *ONE_STAGE,
            *stage_overrides(["pretrain"], updates=8), *stage_overrides(["bridge"], updates=4),
            *stage_overrides(["adapt"], updates=6, ckpt_every=3, ckpt_steps=[1]),
            "tasks.lohelp.max_train_examples=64", "tasks.lohelp.max_len=48", "finetune.epochs=1",
            "finetune.batch_size=16", "finetune.micro_batch=16"]


@pytest.mark.slow
def test_all_four_systems_through_steps_1_to_4(tmp_path, prepared, corpus_dir):
    overrides = tiny_demo(tmp_path, prepared, corpus_dir)
    assert main(["run", str(ROOT / "experiments" / "demo.yaml"), *overrides, "--no-progress"]) == 0
    runs = tmp_path / "runs" / "demo"
    for system in ("bl_base", "bl_small", "minijoint", "minipost"):
        rows = ResultsTable(runs / system / "results.jsonl").rows()
        zero_shot = [r for r in rows if r["lang"] in ("de", "tr")]
        assert {(r["lang"], r["step"]) for r in zero_shot} == {(l, s) for l in ("de", "tr") for s in (0, 1, 3, 6)}
        assert all(r["metric"] == "accuracy" and 0 <= r["value"] <= 100 for r in zero_shot)
        assert all(r["flops"] > 0 for r in zero_shot if r["step"] > 0)
        english = [r for r in rows if r["lang"] == "en"]
        assert {(r["body"], r["split"]) for r in english} >= {("primary", "dev"), ("primary", "test")}
    minijoint = ResultsTable(runs / "minijoint" / "results.jsonl").rows()
    assert any(r["body"] == "mini" for r in minijoint)  # Table 5: the mini-model finetuned on its own
    # MiniPost's primary model is BL_BASE: it shares BL_BASE's finetuned runs
    assert not (runs / "minipost" / "finetune").exists()

    # finetuning kept the embedding layer bit-identical to the pretrained model
    pretrained = load_checkpoint(runs / "bl_base" / "pretrain" / "checkpoints" / "last.ckpt")["state_dict"]
    finetuned = load_checkpoint(runs / "bl_base" / "finetune" / "lohelp" / "seed1" / "model.pt")["body_state"]
    for name in ("embeddings.tokens.weight", "embeddings.positions.weight", "embeddings.norm.weight"):
        assert torch.equal(finetuned[name], pretrained[f"model.{name}"]), name
    assert not torch.equal(finetuned["layers.0.qkv.weight"], pretrained["model.layers.0.qkv.weight"])

    # rerunning evaluates nothing again and adds no rows
    before = (runs / "bl_base" / "results.jsonl").read_text()
    assert main(["evaluate", str(ROOT / "experiments" / "demo.yaml"), *overrides, "--no-progress"]) == 0
    assert (runs / "bl_base" / "results.jsonl").read_text() == before
    # an interrupted evaluation (rows lost, last line cut) resumes without duplicates
    lines = before.splitlines(keepends=True)
    (runs / "bl_base" / "results.jsonl").write_text("".join(lines[:3]) + lines[3][:20])
    assert main(["evaluate", str(ROOT / "experiments" / "demo.yaml"), *overrides, "system=bl_base",
                 "--no-progress"]) == 0
    again = ResultsTable(runs / "bl_base" / "results.jsonl").rows()
    key = lambda r: (r["task"], r["lang"], r["seed"], r["step"], r["body"], r["split"], r["metric"])
    assert sorted(map(key, again)) == sorted(map(key, (json.loads(l) for l in lines)))


@pytest.mark.slow
def test_extractive_qa_through_steps_3_and_4(tmp_path, prepared, corpus_dir):
    """MLQA from local files in the hub schema: SQuAD-format English training, German test, F1/EM rows."""
    fixtures = ROOT / "tests" / "fixtures" / "tasks"
    overrides = [*tiny_demo(tmp_path, prepared, corpus_dir), "system=bl_base", "target_langs=[de]",
                 f"tasks.mlqa.source={fixtures / 'mlqa'}", f"tasks.mlqa.train_source={fixtures / 'squad'}",
                 "tasks.mlqa.max_len=64", "tasks.mlqa.stride=16", "finetune.tasks=[mlqa]", "finetune.epochs=2",
                 "finetune.batch_size=4", "finetune.micro_batch=4"]
    exp = str(ROOT / "experiments" / "demo.yaml")
    for command in (["pretrain"], ["adapt", "lang=de"], ["finetune"], ["evaluate"]):
        assert main([command[0], exp, *overrides, *command[1:], "--no-progress"]) == 0, command
    rows = ResultsTable(tmp_path / "runs" / "demo" / "bl_base" / "results.jsonl").rows()
    de = [r for r in rows if r["lang"] == "de"]
    assert {r["metric"] for r in de} == {"f1", "exact_match"}
    assert {r["step"] for r in de} == {0, 1, 3, 6}
    assert all(0.0 <= r["value"] <= 100.0 for r in rows)
    assert {(r["split"], r["metric"]) for r in rows if r["lang"] == "en"} == {
        ("dev", "f1"), ("dev", "exact_match"), ("test", "f1"), ("test", "exact_match")}


def test_target_language_dev_sets_are_separate_from_the_test_sets():
    """dev.{lang} (translations of the dev pages, for choosing step-2 settings without a test set): labelled like
    the rest, no page in common with the test pages, English dev unchanged."""
    task = TaskData("lohelp", LOHELP)
    english_dev = task.records("dev")
    assert len(english_dev) == 600 and task.records("dev", "en") == english_dev
    for lang, n in (("de", 600), ("es", 444), ("fr", 438), ("tr", 324)):
        dev, test = task.records("dev", lang), task.records("test", lang)
        assert len(dev) == n and {r["label"] for r in dev} == {0, 1, 2, 3}
        pages = {r["id"].split("#")[0] for r in dev}
        assert not pages & {r["id"].split("#")[0] for r in test}
        assert not {r["text"] for r in dev} & {r["text"] for r in english_dev}  # translated, not copied


@pytest.mark.parametrize("family", ["encoder", "decoder"])
def test_length_sorted_batches_give_each_feature_its_own_prediction_in_the_order_given(prepared, family):
    """predict batches features of similar length together (``length_order``): every feature still gets what it
    gets alone, at its own index."""
    from minimodel.data.downstream import length_order
    from minimodel.models.families import build

    tok = Tokenizer(prepared / "prepared" / "de" / "spm.model")
    task = TaskData("lohelp", LOHELP)
    features = task.features(task.records("test", "de")[:30], tok)
    lengths = [len(f["input_ids"]) for f in features]
    assert len(set(lengths)) > 3 and lengths != sorted(lengths, reverse=True)  # the order matters here
    order = length_order(features)
    assert sorted(order) == list(range(30)) and [lengths[j] for j in order] == sorted(lengths, reverse=True)
    torch.manual_seed(0)
    cfg = model_preset("tiny", vocab_size=1000, max_positions=66)
    if family == "decoder":
        cfg.family, cfg.positions, cfg.norm = "decoder", "rotary", "rmsnorm"
    body = build(cfg)
    head = task_head(task, cfg.hidden, 0.1)
    cpu = torch.device("cpu")
    batched = predict(body, head, features, 8, cpu)
    alone = [predict(body, head, [f], 1, cpu)[0] for f in features]
    assert [p for p, _ in batched] == [p for p, _ in alone]
    assert all(a == pytest.approx(b, abs=1e-5) for (_, a), (_, b) in zip(batched, alone))
