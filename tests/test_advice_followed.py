"""Issue 54, part 5: the advice of docs/bad-input.md's messages followed literally, for rows no earlier test
followed (tests/test_reliability_round5.py followed the others). Each test triggers the message as the row says,
does what the advice says, and asserts that the command then works (or that the next step is the clear error the
docs promise)."""

from __future__ import annotations

import re

import pytest

from minimodel.config.schema import TaskConfig
from minimodel.data.tasks import TaskData
from minimodel.errors import ConfigError, TaskDataError
from tests.conftest import ROOT
from tests.test_bad_data import ROWS, jsonl, local_task

TINY_YAML = str(ROOT / "experiments" / "tiny.yaml")


# ---------------------------------------------------------------------------------------------- 1: task files


def test_a_missing_test_file_advice_followed(tmp_path):
    """"add the file, or leave fr out of tasks.sentiment.langs": either, done, the task's languages all read."""
    jsonl(tmp_path / "train.jsonl", ROWS)
    jsonl(tmp_path / "test.de.jsonl", ROWS)
    with pytest.raises(TaskDataError) as e:
        task = local_task(tmp_path, langs=["de", "fr"])
        for lang in task.languages(["de", "fr"]):
            task.records("test", lang)
    said = re.search(r"\(add the file, or leave (\w+) out of tasks\.sentiment\.langs\)", str(e.value))
    assert said is not None and said[1] == "fr", str(e.value)
    # advice 2: fr left out of tasks.sentiment.langs
    task = local_task(tmp_path, langs=["de"])
    assert [len(task.records("test", lang)) for lang in task.languages(["de", "fr"])] == [2]
    # advice 1: the file added, in the first layout the message names (test.fr.{jsonl,...})
    assert "expected test.fr.{jsonl," in str(e.value)
    jsonl(tmp_path / "test.fr.jsonl", ROWS[::-1])
    task = local_task(tmp_path, langs=["de", "fr"])
    assert {lang: [r["label"] for r in task.records("test", lang)] for lang in task.languages(["de", "fr"])} == {
        "de": [1, 0], "fr": [0, 1]}  # label indices of ('neg', 'pos')


def test_a_missing_column_advice_followed(tmp_path):
    """"set tasks.sentiment.text_fields (label_field) to the file's columns: found [...]": the column the message
    lists, set, reads the file with its texts and labels."""
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\ngood,pos\nbad,neg\n", "utf-8")
    with pytest.raises(TaskDataError) as e:
        local_task(tmp_path)
    said = re.search(r"set tasks\.sentiment\.(text_fields) to the file's columns: found \[([^\]]*)\]", str(e.value))
    assert said is not None, str(e.value)
    columns = [c.strip().strip("'") for c in said[2].split(",")]
    assert columns == ["sentence", "label"]
    task = local_task(tmp_path, text_fields=[c for c in columns if c != "label"])  # the file's text column
    assert task.labels == ("neg", "pos")
    assert task.records("train") == [{"sentence": "good", "label": 1}, {"sentence": "bad", "label": 0}]
    train.write_text("text,polarity\ngood,pos\nbad,neg\n", "utf-8")
    with pytest.raises(TaskDataError) as e:
        local_task(tmp_path)
    said = re.search(r"set tasks\.sentiment\.(label_field) to the file's columns: found \[([^\]]*)\]", str(e.value))
    assert said is not None, str(e.value)
    columns = [c.strip().strip("'") for c in said[2].split(",")]
    task = local_task(tmp_path, label_field=[c for c in columns if c != "text"][0])
    assert task.labels == ("neg", "pos")


# ---------------------------------------------------------------------------------------------- 2: id_field


def test_an_id_field_the_file_lacks_advice_followed(tmp_path):
    """"set it to one of the file's columns ['id', 'text', 'label'], or leave it unset to use the 'id' column or the
    record's position": either, done, reads every file, with the ids the message promises."""
    from tests.test_task_inputs import write_task

    root = write_task(tmp_path / "long", id_column="id")
    with pytest.raises(TaskDataError) as e:  # no file has 'ref'; train is read at once
        TaskData("long", TaskConfig(kind="local", source=str(root), id_field="ref"))
    assert str(e.value).startswith(f"{root / 'train.csv'}, line 2: missing field 'ref' ")
    said = re.search(r"set it to one of the file's columns \[([^\]]*)\], or leave it unset", str(e.value))
    assert said is not None, str(e.value)
    columns = [c.strip().strip("'") for c in said[1].split(",")]
    assert "id" in columns
    for id_field in ("id", ""):  # advice 1 (the file's id column), advice 2 (unset)
        data = TaskData("long", TaskConfig(kind="local", source=str(root), id_field=id_field))
        assert [r["id"] for r in data.records("test", "tr")] == [f"test.tr-r{i}" for i in range(5)]
        assert [r["id"] for r in data.records("train")] == [f"train-r{i}" for i in range(10)]
        assert len(data.records("dev")) == 6 and len(data.records("test", "de")) == 6


def test_an_id_field_on_a_qa_task_advice_followed():
    """"leave tasks.mlqa.id_field unset": done, the experiment loads, with the QA task's ids its 'id' field."""
    from minimodel.experiment import load_experiment

    with pytest.raises(ConfigError) as e:
        load_experiment(TINY_YAML, ["tasks.mlqa.id_field=qid"])
    said = re.search(r"leave (tasks\.mlqa\.id_field) unset$", str(e.value))
    assert said is not None, str(e.value)
    cfg = load_experiment(TINY_YAML, [])  # the key left unset
    assert not cfg.tasks["mlqa"].id_field


# ---------------------------------------------------------------------------------------------- 3: FOCUS min_count


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("fasttext") is None,
                    reason="the focus extra (fastText) is not installed: pip install 'minimodel[focus]'")
def test_focus_min_count_advice_followed(tmp_path, prepared, corpus_dir):
    """adapt.init=focus with a min_count no piece reaches: "lower adapt.focus.min_count": lowered (all else the
    same), fastText keeps pieces and step 2's auxiliary vectors are written, each kept piece seen that often."""
    import json

    from minimodel.data.aux_embeddings import AuxSettings, aux_embeddings
    from minimodel.data.prepare import load_prepared_tokenizer
    from tests.conftest import tiny_config
    from tests.test_focus import copy_prepared

    copy = copy_prepared(prepared, tmp_path / "copy", langs=("de",))

    def aux(min_count: int):
        cfg = tiny_config(tmp_path, corpus_dir, "adapt.init=focus", "adapt.focus.epochs=1",
                          f"adapt.focus.min_count={min_count}", prepared=copy)
        f = cfg.adapt.focus
        return aux_embeddings(cfg, "de", load_prepared_tokenizer(cfg, "de"),
                              AuxSettings(f.dim, f.epochs, f.min_count, f.threads))  # as step 2 builds them

    with pytest.raises(ConfigError) as e:
        aux(10**9)
    said = re.search(r"none occurs adapt\.focus\.min_count=(\d+) times\): (lower adapt\.focus\.min_count)", str(e.value))
    assert said is not None and int(said[1]) == 10**9, str(e.value)
    lowered = aux(int(said[1]) // 10**8)  # the advice: min_count lowered, from 1e9 to 10
    assert lowered.vectors.shape[0] == len(lowered.pieces) > 0
    assert lowered.path.is_file() and lowered.record["fasttext"]["min_count"] == 10
    counts = json.loads(lowered.path.with_suffix(".json").read_text())["counts"]
    assert len(counts) == len(lowered.pieces) and min(counts) >= 10


# ---------------------------------------------------------------------------------------------- 7: the memory plan


def test_the_plans_micro_batch_advice_followed(tmp_path, capsys):
    """`plan` at micro-batch 32 x 8 GPUs against a global batch of 32: "(micro-batches that do: 1, 2, 4)"; each
    micro-batch it names, set, is planned (no "**no** (batch)") and `submit --dry-run` writes the job's script."""
    from minimodel.cli import main

    exp = str(ROOT / "experiments" / "minijoint.yaml")
    over = ["pretrain.optim.global_batch=32", "pretrain.optim.micro_batch=32", f"runs_dir={tmp_path / 'runs'}"]
    assert main(["plan", exp, "--launcher", "a100", *over]) == 0
    said = re.search(r"pretrain\.optim\.micro_batch=32 x 8 GPU\(s\) does not divide the global batch 32: the job "
                     r"would stop at its start \(micro-batches that do: ([\d, ]+)\)", capsys.readouterr().err)
    assert said is not None
    named = [int(m) for m in said[1].split(",")]
    assert named and all(m * 8 <= 32 for m in named)
    for micro in named:
        followed = [*over[:1], f"pretrain.optim.micro_batch={micro}", f"runs_dir={tmp_path / f'runs{micro}'}"]
        assert main(["plan", exp, "--launcher", "a100", *followed]) == 0
        out = capsys.readouterr()
        row = next(line for line in out.out.splitlines() if line.startswith("| pretrain |"))
        assert "**no**" not in row and "does not divide" not in out.err, (row, out.err)
        assert main(["submit", exp, *followed, "--launcher", "a100", "--dry-run"]) == 0
        assert list((tmp_path / f"runs{micro}").rglob("*.sbatch"))


# ---------------------------------------------------------------------------------------------- 6: result rows


def test_conflicting_result_rows_advice_followed(tmp_path):
    """"remove the wrong one": done (line 3 removed), the table reads, with the row that stayed."""
    import json

    from minimodel.errors import UserError
    from minimodel.store.results import ResultsTable

    row = {"system": "bl_base", "body": "primary", "task": "xnli", "lang": "de", "seed": 1, "step": 5,
           "flops": 1.0, "v100_days": 0.0, "split": "test", "metric": "accuracy", "value": 50.0}
    other = {**row, "step": 10}
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (row, other, {**row, "value": 40.0})))
    with pytest.raises(UserError) as e:
        ResultsTable(path).rows()
    said = re.search(r"lines (\d+) and (\d+) are results of the same evaluation .*: (remove the wrong one), or both "
                     r"and rerun `minimodel evaluate`", str(e.value))
    assert said is not None, str(e.value)
    lines = path.read_text().splitlines(keepends=True)
    wrong = int(said[2])  # the 40.0 one, line 3
    path.write_text("".join(line for i, line in enumerate(lines, 1) if i != wrong))
    assert ResultsTable(path).rows() == [row, other]


# ---------------------------------------------------------------------------------------------- a run to results


@pytest.fixture(scope="module")
def chain(tmp_path_factory, prepared, corpus_dir):
    """tests/test_reliability_round5.py's tiny BL_BASE run (pretrained 4 updates, adapted to German 4, finetuned on
    the LibreOffice-help task, seed 1, evaluated), on a copy of the task's files that tests here may change.
    Returns the `minimodel` arguments that name it, its system directory and its task directory."""
    import shutil

    from tests.test_reliability_round5 import tiny_chain

    tmp = tmp_path_factory.mktemp("advice5")
    task = shutil.copytree(ROOT / "data" / "demo" / "task" / "lohelp", tmp / "lohelp")
    return tiny_chain(tmp, corpus_dir, prepared, task), tmp / "runs" / "tiny" / "bl_base", task


@pytest.mark.slow
def test_a_changed_train_file_advice_followed(chain, capsys):
    """A train file changed after finetuning: "finetune again (delete …/seed1) or restore the file". seed1 deleted,
    `finetune` trains it again on the new file and `evaluate` scores it."""
    import json
    import shutil
    from pathlib import Path

    from minimodel.cli import main

    args, system, task = chain
    seed1 = system / "finetune" / "lohelp" / "seed1"
    before = json.loads((seed1 / "done.json").read_text())["identity"]
    train = task / "train.jsonl"
    first = json.loads(train.read_text().splitlines()[0])
    train.write_text(train.read_text() + json.dumps({**first, "id": "new", "text": "Eine neue Hilfeseite."}) + "\n")
    capsys.readouterr()
    assert main(["finetune", *args]) == 2  # "finetune says the same"
    err = capsys.readouterr().err
    said = re.search(r"delete (\S+) to finetune on the new file, or restore the file", err)
    assert said is not None and Path(said[1]) == seed1, err
    # evaluate says it too, even with every row of the old model already in results.jsonl (it used to skip them all
    # without reading the train file, and `report` then read rows of a model finetuned on another file)
    assert (system / "results.jsonl").exists()
    assert main(["evaluate", *args]) == 2
    err = capsys.readouterr().err
    said = re.search(r"finetune again \(delete (\S+)\) or restore the file", err)
    assert said is not None and f"{train} changed since" in err, err
    assert Path(said[1]) == seed1
    shutil.rmtree(said[1])  # the advice
    assert main(["finetune", *args]) == 0
    assert json.loads((seed1 / "done.json").read_text())["identity"] != before
    assert main(["evaluate", *args]) == 0
    assert "changed since" not in capsys.readouterr().err
    rows = [json.loads(line) for line in (system / "results.jsonl").read_text().splitlines()]
    assert any(r["task"] == "lohelp" and r["seed"] == 1 and r["split"] == "test" for r in rows)


@pytest.mark.slow
def test_conflicting_result_rows_advice_followed_by_evaluating_again(chain, tmp_path, capsys):
    """"remove the wrong one, or both and rerun `minimodel evaluate`": both removed, evaluate writes the row again
    (the value it had) and the report reads the table."""
    import json

    from minimodel.cli import main

    args, system, _ = chain
    results = system / "results.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    i, line = next((i, x) for i, x in enumerate(lines) if json.loads(x)["split"] == "test")
    row = json.loads(line)
    results.write_text("".join(lines) + json.dumps({**row, "value": row["value"] + 1.0}) + "\n")
    capsys.readouterr()
    assert main(["report", *args, "--out", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    said = re.search(r"lines (\d+) and (\d+) are results of the same evaluation .*: remove the wrong one, or both "
                     r"and rerun `minimodel evaluate`", err)
    assert said is not None and (int(said[1]), int(said[2])) == (i + 1, len(lines) + 1), err
    kept = results.read_text().splitlines(keepends=True)
    results.write_text("".join(x for n, x in enumerate(kept, 1) if n not in (int(said[1]), int(said[2]))))
    assert main(["evaluate", *args]) == 0  # the advice
    again = [json.loads(x) for x in results.read_text().splitlines()]
    assert sorted(map(json.dumps, again)) == sorted(json.dumps(json.loads(x)) for x in lines)
    assert main(["report", *args, "--out", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").is_file()


# ---------------------------------------------------------------------------------------------- 5: no checkpoint


def test_no_intact_checkpoint_advice_followed(tmp_path, prepared, corpus_dir, capsys):
    """A stopped pretraining with every checkpoint broken: "Delete …/pretrain to start the stage again": deleted,
    `pretrain` runs the stage from its start to its end."""
    import json
    import shutil
    from pathlib import Path

    from minimodel.cli import main
    from tests.conftest import TINY_STAGE, stage_overrides, tiny_overrides

    args = [TINY_YAML, *tiny_overrides(tmp_path, corpus_dir, prepared), "data.num_workers=0",
            *stage_overrides(["pretrain"], updates=4, **TINY_STAGE, ckpt_every=2, val_every=4), "--no-progress"]
    assert main(["pretrain", *args]) == 0
    run = next((tmp_path / "runs").rglob("pretrain/done.json")).parent
    identity = json.loads((run / "done.json").read_text())["identity"]
    for ckpt in (run / "checkpoints").glob("*.ckpt"):
        ckpt.unlink()
        ckpt.write_bytes(b"broken")
    (run / "done.json").unlink()
    capsys.readouterr()
    assert main(["pretrain", *args]) == 2
    err = capsys.readouterr().err
    said = re.search(r"no checkpoint of (\S+) can resume it\. Delete (\S+) to start the stage again", err)
    assert said is not None, err
    assert Path(said[2]) == Path(said[1]) == run
    shutil.rmtree(said[2])  # the advice
    assert main(["pretrain", *args]) == 0
    done = json.loads((run / "done.json").read_text())
    assert done["identity"] == identity  # the same 4 updates from the start: bit-exact, the same run
    assert sorted(p.name for p in (run / "checkpoints").glob("step*.ckpt"))


# ---------------------------------------------------------------------------------------------- 8: --embeddings-only


@pytest.mark.slow
@pytest.mark.parametrize("model", [
    ["model.affine_after=1"],
    ["model.family=decoder", "model.norm=layernorm", "model.positions=rotary"],
], ids=["affine", "decoder"])
def test_an_unexportable_model_advice_followed(tmp_path, prepared, corpus_dir, capsys, model):
    """A model no transformers class holds, pretrained and adapted to German: export refuses with "export the
    embeddings alone (--embeddings-only)"; that flag, added, writes the German embeddings (and only them)."""
    import json

    import torch

    from minimodel.cli import main
    from tests.conftest import TINY_STAGE, stage_overrides, tiny_overrides

    args = [TINY_YAML, *tiny_overrides(tmp_path, corpus_dir, prepared), "data.num_workers=0", *model,
            *stage_overrides(["pretrain", "adapt"], updates=2, **TINY_STAGE, ckpt_every=2, val_every=2),
            "system=bl_base", "model.mini_heads=[]", "target_langs=[de]", "--no-progress"]
    for command in (["pretrain"], ["adapt", "lang=de"]):
        assert main([command[0], *args, *command[1:]]) == 0, command
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["export", *args, "lang=de", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no transformers class" in err and "export the embeddings alone (--embeddings-only)" in err, err
    assert not out.exists()
    assert main(["export", *args, "lang=de", "--out", str(out), "--embeddings-only"]) == 0  # the advice
    assert (out / "embeddings.pt").is_file()
    meta = json.loads((out / "minimodel.json").read_text())
    assert meta["kind"] == "embeddings" and meta["lang"] == "de"
    assert not list(out.glob("*.safetensors")) and not (out / "config.json").exists()  # the embeddings alone
    saved = torch.load(out / "embeddings.pt", weights_only=True)
    tensors = [v for v in saved.values() if torch.is_tensor(v) and v.dim() == 2]
    assert tensors and {t.shape[0] for t in tensors} == {1000}  # the German vocabulary (data.vocab_size=1000)
