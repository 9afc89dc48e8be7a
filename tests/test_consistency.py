"""No silent wrong result from files that changed between stages: evaluation uses the labels saved with the
finetuned model and detects a changed train file; every stage checks the source tokenizer against the one
stored with the model it loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from minimodel.cli import main
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_overrides

pytestmark = pytest.mark.slow
EXP = str(ROOT / "experiments" / "demo.yaml")


def overrides(tmp: Path, corpus: Path, prepared: Path, task: Path) -> list[str]:
    return [*tiny_overrides(tmp, corpus, prepared), "data.num_workers=0", "system=bl_base", "model.mini_heads=[]",
            *stage_overrides(["pretrain", "adapt"], updates=4, **TINY_STAGE, ckpt_every=2),
            f"tasks.lohelp.source={task}", "tasks.lohelp.langs=[de]",
            "finetune.epochs=1", "finetune.batch_size=32", "finetune.micro_batch=32", "finetune.seeds=[1]"]


@pytest.fixture(scope="module")
def chain(tmp_path_factory, prepared, corpus_dir) -> tuple[Path, list[str]]:
    """A finished BL_BASE pretraining, German adaptation and finetuning on a copy of the bundled task."""
    tmp = tmp_path_factory.mktemp("chain")
    task = tmp / "lohelp"
    task.mkdir()
    for name in ("train.jsonl", "dev.jsonl", "test.en.jsonl", "test.de.jsonl"):  # 200 examples each
        lines = (ROOT / "data" / "demo" / "task" / "lohelp" / name).read_text(encoding="utf-8").splitlines()
        (task / name).write_text("\n".join(lines[:200]) + "\n", encoding="utf-8")
    args = overrides(tmp, corpus_dir, prepared, task)
    for command in (["pretrain"], ["adapt", "lang=de"], ["finetune"]):
        assert main([command[0], EXP, *args, *command[1:], "--no-progress"]) == 0, command
    return tmp, args


def results(tmp: Path) -> dict[tuple, float]:
    path = tmp / "runs" / "demo" / "bl_base" / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {(r["lang"], r["step"], r["split"], r["metric"]): r["value"] for r in rows}


def test_evaluation_uses_the_saved_labels_and_refuses_a_changed_train_file(chain, capsys, caplog):
    tmp, args = chain
    task, run = tmp / "lohelp", tmp / "runs" / "demo" / "bl_base"
    results_file, model_file = run / "results.jsonl", run / "finetune" / "lohelp" / "seed1" / "model.pt"
    assert main(["evaluate", EXP, *args, "--no-progress"]) == 0
    before = results(tmp)
    assert len([k for k in before if k[0] == "de"]) == 3  # updates 0, 2, 4
    train = (task / "train.jsonl").read_text()
    results_file.unlink()
    capsys.readouterr()

    # one new example with a label that sorts first: every label id of the train file shifts by one
    new = json.dumps({"id": "new", "text": "A new kind of help page.", "label": "aaa"})
    (task / "train.jsonl").write_text(new + "\n" + train)
    assert main(["evaluate", EXP, *args, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"evaluate: error: tasks.lohelp: {task / 'train.jsonl'} changed since {model_file} was finetuned on it" in err
    assert f"finetune again (delete {model_file.parent}) or restore the file" in err
    assert not results(tmp).get(("de", 0, "test", "accuracy"))  # nothing evaluated
    assert main(["finetune", EXP, *args, "--no-progress"]) == 2  # the finished run is not "complete" for this file
    assert f"delete {model_file.parent} to finetune on the new file, or restore the file" in capsys.readouterr().err

    # a model written before train files were recorded: the labels saved with it decide, not today's file
    payload = torch.load(model_file, weights_only=True)
    del payload["train_sha256"]
    torch.save(payload, model_file)
    done = json.loads((model_file.parent / "done.json").read_text())  # an older run's done.json lacks it too
    del done["train_sha256"]
    (model_file.parent / "done.json").write_text(json.dumps(done))
    assert main(["evaluate", EXP, *args, "--no-progress"]) == 0
    assert results(tmp) == before
    assert "does not record the train file it was finetuned on" in caplog.text
    results_file.unlink()

    # a test label the model was not finetuned on is an error naming the file and line
    (task / "train.jsonl").write_text(train)
    test = (task / "test.de.jsonl").read_text()
    (task / "test.de.jsonl").write_text(test + json.dumps({"id": "x", "text": "Neu.", "label": "sneu"}) + "\n")
    try:
        assert main(["evaluate", EXP, *args, "--no-progress"]) == 2
    finally:
        (task / "test.de.jsonl").write_text(test)
    n = len(test.splitlines()) + 1
    assert (f"{task / 'test.de.jsonl'}, line {n}: label 'sneu' is not one of the labels the model was finetuned on, "
            f"['sbasic', 'scalc', 'simpress', 'swriter']") in capsys.readouterr().err


def test_every_stage_checks_the_source_tokenizer_against_the_model(chain, capsys, tmp_path):
    tmp, args = chain
    other = tmp_path / "prepared"
    source = next(a.split("=", 1)[1] for a in args if a.startswith("data.prepared_dir="))
    shutil.copytree(source, other)
    shutil.copy(other / "de" / "spm.model", other / "en" / "spm.model")  # another tokenizer of the same size
    swapped = [*args, f"data.prepared_dir={other}"]
    checkpoint = tmp / "runs" / "demo" / "bl_base" / "pretrain" / "checkpoints" / "last.ckpt"
    calls = {"adapt": ["adapt", "lang=tr"], "finetune": ["finetune", "finetune.seeds=[2]"],
             "bridge": ["bridge", "system=minipost", "bridge.depth=2"]}
    for name, (command, *extra) in calls.items():
        assert main([command, EXP, *swapped, *extra, "--no-progress"]) == 2, name
        err = capsys.readouterr().err
        assert f"tokenizer {other / 'en' / 'spm.model'} (sha256 " in err, (name, err)
        assert "was trained with (" in err and "restore that tokenizer" in err, (name, err)
        assert str(checkpoint) in err or name == "bridge", (name, err)
