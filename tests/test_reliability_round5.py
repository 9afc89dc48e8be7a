"""Issue 54, round 5: export's bad arguments as the project's errors (exit 2, one line naming the argument or key,
nothing written), and the advice of docs/bad-input.md followed literally (docs/bad-input.md, "Round 5")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from minimodel.cli import main
from tests.conftest import ROOT

TINY_YAML = str(ROOT / "experiments" / "tiny.yaml")


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error:" in line]


def one_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line a refused command printed (and no traceback)."""
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ part 3: export's arguments


def export(tmp_path: Path, *extra: str) -> int:
    """``minimodel export`` of the tiny experiment, whose runs (none) would be under ``tmp_path/runs``."""
    return main(["export", TINY_YAML, f"runs_dir={tmp_path / 'runs'}", "system=bl_base", "model.mini_heads=[]",
                 "logging.wandb=disabled", "--no-progress", *extra])


@pytest.mark.parametrize("extra,message", [
    # a model no transformers class holds: refused before anything is read (was a ValueError traceback after the
    # model was loaded; an affine map was dropped without a word)
    (["model.affine_after=1"], "model.affine_after=1: the model maps its state by an affine map after layer 1"),
    (["model.family=decoder", "model.norm=layernorm", "model.positions=rotary", "model.max_positions=512"],
     "a decoder with model.norm=layernorm, model.positions=rotary, model.activation=gelu"),
    # a task without its seed (was: "…/seed0/model.pt not found: run `minimodel finetune ... seed=0`")
    (["task=xnli"], "export task=xnli needs seed=N, the finetuning run to export (finetune.seeds: ["),
    (["--embeddings-only", "--embeddings", "{tmp}/emb"], "--embeddings-only with --embeddings"),
    (["--embeddings", "{tmp}/nowhere"], "--embeddings {tmp}/nowhere: no such directory"),
    (["--embeddings", "{tmp}/afile"], "--embeddings {tmp}/afile: a file, not a directory"),
    # a full export given as --embeddings: the advice names a new directory, not the export itself (which --out
    # would then refuse: a dead end)
    (["--embeddings", "{tmp}/full"], "--embeddings {tmp}/full is a fill-mask export, not an embeddings export: it "
                                     "lacks embeddings.pt; write one with `minimodel export ... --embeddings-only "
                                     "--out DIR` (DIR: a new directory) and pass --embeddings DIR"),
])
def test_export_refuses_what_it_cannot_export_before_reading_anything(tmp_path, capsys, extra, message):
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "minimodel.json").write_text(json.dumps({"kind": "fill-mask"}))
    before = tree(tmp_path)
    args = [x.replace("{tmp}", str(tmp_path)) for x in extra]
    assert export(tmp_path, "lang=de", "--out", str(tmp_path / "out"), *args) == 2
    assert message.replace("{tmp}", str(tmp_path)) in one_error(capsys)
    assert tree(tmp_path) == before and not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("out,force,message", [
    ("afile/sub/out", False, "--out {tmp}/afile/sub/out: {tmp}/afile is a file, so no directory can be made under it"),
    ("afile", False, "--out {tmp}/afile is a file, not a directory: choose another --out"),
    # a directory the system will not make (was an OSError traceback after the whole export was built)
    ("/proc/minimodel-out/x", False, "--out /proc/minimodel-out/x: cannot make /proc/minimodel-out ("),
    ("mine", False, "--out {tmp}/mine exists and is not empty: choose another directory (or --force"),
    ("mine", True, "--out {tmp}/mine holds files that are not a minimodel export (it has no minimodel.json): not "
                   "replacing them, even with --force; choose a new or empty directory as --out"),
])
def test_export_out_names_what_is_there_and_overwrites_nothing(tmp_path, capsys, out, force, message):
    """``--out`` under a file was a FileExistsError traceback; a directory of the user's is refused with advice."""
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep\n")
    before = tree(tmp_path)
    assert export(tmp_path, "lang=de", "--out", str(tmp_path / out), *(["--force"] if force else [])) == 2
    assert message.replace("{tmp}", str(tmp_path)) in one_error(capsys)
    assert tree(tmp_path) == before


def test_an_unexportable_decoder_config_is_a_config_error():
    """``hf_decoder.hf_config`` / ``export_type`` refuse with the project's error (``ConfigError``, still a
    ``ValueError``) naming the ``model.*`` keys, wherever they are called from."""
    from dataclasses import replace

    from minimodel.config.schema import ModelConfig
    from minimodel.errors import ConfigError
    from minimodel.models import hf_decoder

    cfg = replace(ModelConfig(), family="decoder", norm="rmsnorm", positions="learned", activation="swiglu",
                  bias=False)
    with pytest.raises(ConfigError, match=r"model\.norm=rmsnorm, model\.positions=learned, model\.activation=swiglu"):
        hf_decoder.hf_config(cfg, 0, 2, 1)


# ------------------------------------------------------------------------------------------ part 1: advice followed
#
# Each test below takes a row of docs/bad-input.md whose message says to do something (write a value another way,
# pass a flag or a path, delete a file, rerun a command), does literally what it says, and asserts that the command
# then works, or that it leads to the next clear step.


def test_launcher_advice_followed(tmp_path, capsys):
    """"write the value on one line"; a time "after D- the hours must be 0-23": done, the launcher loads and the
    job's script keeps --signal and --requeue."""
    from minimodel.cluster.launcher import load_launcher

    minijoint = str(ROOT / "experiments" / "minijoint.yaml")
    overrides = ["target_langs=[de,tr]", "finetune.tasks=[xnli]", "finetune.seeds=[1]", f"runs_dir={tmp_path / 'runs'}"]
    path = tmp_path / "gpu.yaml"
    path.write_text('partition: "gpu\\n#SBATCH --partition=other"\nstages:\n  pretrain: {time: "1-24:00"}\n')
    assert main(["submit", minijoint, *overrides, "--launcher", str(path), "--dry-run"]) == 2
    assert "write the value on one line" in one_error(capsys)
    path.write_text('partition: "gpu"\nstages:\n  pretrain: {time: "1-24:00"}\n')  # the value on its one line
    assert main(["submit", minijoint, *overrides, "--launcher", str(path), "--dry-run"]) == 2
    assert "after D- the hours must be 0-23" in one_error(capsys)
    path.write_text('partition: "gpu"\nstages:\n  pretrain: {time: "2-00:00"}\n')  # 24 hours after 1-: 2-00
    assert load_launcher(path).partition == "gpu"
    assert main(["submit", minijoint, *overrides, "--launcher", str(path), "--dry-run"]) == 0
    scripts = list((tmp_path / "runs").rglob("*.sbatch"))
    assert scripts and all("#SBATCH --requeue" in s.read_text() and "#SBATCH --signal=" in s.read_text()
                           for s in scripts)


@pytest.mark.parametrize("override,advice,follow", [
    ("cpu.threads=1000000000", r"or a number of threads from 1, at most ([\d,]+)", "cpu.threads={}"),
    ("cpu.side_by_side=0", r"1 \(this one alone\) or more", "cpu.side_by_side=1"),
    ("finetune.seeds=[]", r"e\.g\. (finetune\.seeds=\[1\])", "{}"),
    ("pretrain.optim.lr=[1,", r"quote a string that holds YAML's signs", "pretrain.optim.lr=0.001"),
])
def test_load_time_advice_followed(override, advice, follow):
    import re

    from minimodel.errors import UserError
    from minimodel.experiment import load_experiment

    with pytest.raises(UserError) as e:
        load_experiment(TINY_YAML, [override])
    said = re.search(advice, str(e.value))
    assert said is not None, str(e.value)
    value = follow.format(said[1].replace(",", "")) if said.groups() else follow
    load_experiment(TINY_YAML, [value])  # what the message says: loads


def test_report_out_directory_advice_followed(tmp_path, capsys):
    """``report --out DIR``: "give a file path, e.g. --out DIR/report.md"; that path, given, writes the report and
    leaves what the directory held."""
    import re

    from tests.test_reliability_round4_outputs import demo_runs, report

    runs = demo_runs(tmp_path)
    folder = tmp_path / "somewhere"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    assert report(runs, "--out", str(folder)) == 2
    suggested = re.search(r"e\.g\. --out (\S+)", one_error(capsys))
    assert suggested is not None
    assert report(runs, "--out", suggested[1]) == 0
    assert Path(suggested[1]).read_text().startswith("# Mini-model adaptation: demo")
    assert (folder / "keep.txt").read_text() == "mine"


def test_check_overlap_advice_followed(tmp_path):
    """``--min-chars 0``: "give at least 1"; ``--fields nosuch``: "its records have [...]"; a Latin-1 corpus:
    "convert it (e.g. iconv -f latin1 -t utf-8)". Each done: exit 0 with the count."""
    import re

    from tests.test_reliability_round4_outputs import script, small_task

    task, corpus = small_task(tmp_path)
    rc, _, err = script("check_overlap.py", str(task), str(corpus), "--min-chars", "0")
    assert rc == 2 and "give at least 1" in err
    rc, out, err = script("check_overlap.py", str(task), str(corpus), "--min-chars", "1")
    assert rc == 0 and "test.de.jsonl: 1 of 2 examples" in out, err
    rc, _, err = script("check_overlap.py", str(task), str(corpus), "--fields", "nosuch")
    fields = re.search(r"its records have \[([^\]]*)\]", err)
    assert rc == 2 and fields is not None
    assert "'text'" in fields[1]
    rc, out, err = script("check_overlap.py", str(task), str(corpus), "--fields", "text")
    assert rc == 0 and "test.de.jsonl: 1 of 2 examples" in out, err
    text = (corpus / "de.txt").read_text(encoding="utf-8") + "Gr\u00fc\u00dfe aus K\u00f6ln\n"
    (corpus / "de.txt").write_bytes(text.encode("latin-1"))
    rc, _, err = script("check_overlap.py", str(task), str(corpus))
    assert rc == 2 and "iconv -f latin1 -t utf-8" in err
    latin = (corpus / "de.txt").read_bytes()
    (corpus / "de.txt").write_bytes(latin.decode("latin-1").encode("utf-8"))  # what iconv -f latin1 -t utf-8 does
    rc, out, err = script("check_overlap.py", str(task), str(corpus))
    assert rc == 0 and "test.de.jsonl: 1 of 2 examples" in out, err


def test_prepare_another_corpus_advice_followed(prepared, tmp_path, capsys):
    """A language prepared from one corpus, asked again with another: "set data.prepared_dir to a directory of your
    own … or delete …/prepared/de to prepare de again from it". Either, done, prepares the new corpus."""
    import re
    import shutil

    from tests.conftest import real_text, tiny_overrides

    shutil.copytree(prepared / "prepared" / "de", tmp_path / "prepared" / "de")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "de.txt").write_text(real_text("de", 200_000)[::-1], encoding="utf-8")  # other German-ish text
    args = [TINY_YAML, *tiny_overrides(tmp_path, mine), "data.num_workers=0"]
    assert main(["prepare", *args, "--langs=de", "--no-progress"]) == 2
    err = one_error(capsys)
    assert "set data.prepared_dir to a directory of your own" in err
    deleted = re.search(r"or delete (\S+) to prepare de again", err)
    assert deleted is not None and Path(deleted[1]) == tmp_path / "prepared" / "de"
    before = tree(tmp_path / "prepared" / "de")
    own = tmp_path / "own"
    assert main(["prepare", *args, f"data.prepared_dir={own}", "--langs=de", "--no-progress"]) == 0  # advice 1
    assert (own / "de" / "done.json").is_file() and tree(tmp_path / "prepared" / "de") == before
    shutil.rmtree(deleted[1])  # advice 2
    assert main(["prepare", *args, "--langs=de", "--no-progress"]) == 0
    assert (tmp_path / "prepared" / "de" / "spm.model").read_bytes() == (own / "de" / "spm.model").read_bytes()


@pytest.fixture(scope="module")
def chain(tmp_path_factory, prepared, corpus_dir):
    """A tiny BL_BASE run to its results: pretrained (4 updates), adapted to German (4), finetuned on the
    LibreOffice-help task (seed 1, 32 examples), evaluated. Returns the `minimodel` arguments that name it and its
    system directory. Tests below damage it, follow the advice, and leave it whole again."""
    tmp = tmp_path_factory.mktemp("advice")
    return tiny_chain(tmp, corpus_dir, prepared, ROOT / "data/demo/task/lohelp"), tmp / "runs" / "tiny" / "bl_base"


def tiny_chain(tmp: Path, corpus_dir: Path, prepared: Path, task: Path) -> list[str]:
    """The `minimodel` arguments of a tiny BL_BASE run in ``tmp`` (German, the LibreOffice-help task read from
    ``task``), run through pretrain, adapt, finetune and evaluate; every command must exit 0."""
    from tests.conftest import TINY_STAGE, stage_overrides, tiny_overrides

    args = [TINY_YAML, *tiny_overrides(tmp, corpus_dir, prepared), "data.num_workers=0",
            *stage_overrides(["pretrain", "adapt"], updates=4, **TINY_STAGE, ckpt_every=2, val_every=4),
            "system=bl_base", "model.mini_heads=[]", "target_langs=[de]",
            f"tasks.lohelp.source={task}", "tasks.lohelp.kind=local",
            "tasks.lohelp.max_train_examples=32", "tasks.lohelp.max_len=64", "finetune.tasks=[lohelp]",
            "finetune.seeds=[1]", "finetune.epochs=1", "finetune.batch_size=8", "finetune.micro_batch=8",
            "finetune.trainer.accelerator=cpu", "finetune.trainer.precision=32-true", "--no-progress"]
    for command in (["pretrain"], ["adapt", "lang=de"], ["finetune"], ["evaluate"]):
        assert main([command[0], *args, *command[1:]]) == 0, command
    return args


@pytest.mark.slow
def test_a_cut_result_line_advice_followed(chain, tmp_path, capsys):
    """"rerun `minimodel evaluate` to write it again": done, the row is back whole and the report reads it."""
    args, system = chain
    results = system / "results.jsonl"
    whole = results.read_text()
    lines = whole.splitlines()
    results.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    capsys.readouterr()
    assert main(["report", *args, "--out", str(tmp_path / "r.md")]) == 0
    assert "rerun `minimodel evaluate` to write it again" in capsys.readouterr().err
    assert main(["evaluate", *args]) == 0  # the advice
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(map(json.dumps, rows)) == sorted(map(json.dumps, map(json.loads, lines)))
    assert main(["report", *args, "--out", str(tmp_path / "r.md")]) == 0
    assert "cut short" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_corrupt_done_json_advice_followed_from_a_reader(chain, tmp_path, capsys):
    """A finished adaptation's done.json cut short, found by `export` (not the stage that wrote it): the message
    named "the same command", which, rerun, could not finish anything. Now it names the stage's command; doing what
    it says finishes the run again (its identity kept: the results stay), and the export then works."""
    args, system = chain
    done = system / "adapt" / "de" / "done.json"
    before = done.read_text()
    done.write_text(before[: len(before) // 2])
    capsys.readouterr()
    assert main(["export", *args, "lang=de", "--out", str(tmp_path / "x")]) == 2
    err = one_error(capsys)
    assert f"{done} is not valid JSON" in err and "delete it and rerun `minimodel adapt ... lang=de`" in err
    done.unlink()  # the advice
    assert main(["adapt", *args, "lang=de"]) == 0
    assert json.loads(done.read_text())["identity"] == json.loads(before)["identity"]
    assert main(["export", *args, "lang=de", "--out", str(tmp_path / "x")]) == 0
    assert (tmp_path / "x" / "minimodel.json").is_file()


@pytest.mark.slow
def test_exporting_a_language_never_adapted_advice_followed(chain, tmp_path, capsys):
    """"that step never ran; run `minimodel adapt ... lang=tr` first": done, the export works."""
    args, system = chain
    capsys.readouterr()
    assert main(["export", *args, "lang=tr", "--out", str(tmp_path / "tr")]) == 2
    assert "run `minimodel adapt ... lang=tr` first" in one_error(capsys)
    assert main(["adapt", *args, "lang=tr"]) == 0  # the advice
    assert main(["export", *args, "lang=tr", "--out", str(tmp_path / "tr")]) == 0
    assert json.loads((tmp_path / "tr" / "minimodel.json").read_text())["lang"] == "tr"


def test_report_out_under_a_file_is_refused_naming_it(tmp_path, capsys):
    """``report --out FILE/r.md`` was a FileExistsError traceback (found in the round 5 hostile pass)."""
    from tests.test_reliability_round4_outputs import demo_runs, report

    runs = demo_runs(tmp_path)
    (tmp_path / "afile").write_text("mine\n")
    assert report(runs, "--out", str(tmp_path / "afile" / "r.md")) == 2
    assert f"--out {tmp_path / 'afile' / 'r.md'}: {tmp_path / 'afile'} is a file" in one_error(capsys)
    assert (tmp_path / "afile").read_text() == "mine\n"


@pytest.mark.parametrize("argv,message", [
    (["plan", str(ROOT / "experiments")], "config file {root}/experiments is a directory, not a YAML file: give one "
                                          "of its files (bl_base.yaml"),
    (["plan", TINY_YAML, "--launcher", str(ROOT / "conf" / "launcher")],
     "launcher file {root}/conf/launcher is a directory, not a YAML file: give one of its files (a100.yaml"),
])
def test_a_directory_given_as_a_yaml_file_is_named_as_one(capsys, argv, message):
    """A directory as the experiment or the launcher said "not found" (it is there): now it says what it is and
    which of its files could be meant."""
    assert main(argv) == 2
    assert message.replace("{root}", str(ROOT)) in one_error(capsys)


# ------------------------------------------------------------------------------------------ the round 5 hostile pass


@pytest.mark.parametrize("yaml,override,message", [
    # a list where a mapping is expected (or the reverse): OmegaConf's merge raised a TypeError (a traceback)
    ("", "pretrain.head_weights=[1,2]", "override 'pretrain.head_weights=[1,2]': bad value for "
                                        "'pretrain.head_weights': it takes a mapping (key: value), got a list"),
    ("", "target_langs={de: 1}", "bad value for 'target_langs': it takes a list, got a mapping"),
    ("pretrain:\n  head_weights: [1, 2]\n", "", "hostile.yaml: bad value for 'pretrain.head_weights': it takes a "
                                                "mapping (key: value), got a list ([1, 2])"),
    # a value for a whole section: "bad value for 'None': None"
    ("", "data=5", "override 'data=5': bad value for 'data': it takes a mapping (key: value), got a value (5)"),
    ("model: [1, 2]\n", "", "hostile.yaml: bad value for 'model': it takes a mapping (key: value), got a list"),
    # a list where any value goes (trainer.devices) is no clash: the one named is the mapping given a list
    ("pretrain:\n  trainer: {devices: [0, 1]}\n  head_weights: [1, 2]\n", "",
     "hostile.yaml: bad value for 'pretrain.head_weights': it takes a mapping"),
])
def test_a_value_of_another_kind_than_its_key_takes_is_named(tmp_path, capsys, yaml, override, message):
    path = tmp_path / "hostile.yaml"
    path.write_text(f"extends: {TINY_YAML}\n{yaml}")
    assert main(["flops", str(path), *([override] if override else [])]) == 2
    assert message in one_error(capsys)


@pytest.mark.parametrize("override,key", [("target_langs=[de,tr,de]", "target_langs=['de', 'tr', 'de']"),
                                          ("tasks.lohelp.langs=[de,de]", "tasks.lohelp.langs=['de', 'de']")])
def test_a_language_given_twice_is_refused(capsys, override, key):
    """``target_langs=[de,de]`` was taken as two languages: flops counted two adaptations, and `submit` queued two
    jobs adapting de into one run directory (the second fails on its lock, its evaluation never runs)."""
    assert main(["flops", TINY_YAML, override]) == 2
    assert f"tiny.yaml: {key}: de given more than once; name each language once" in one_error(capsys)


@pytest.mark.parametrize("stage,message", [
    # a time no longer than signal_lead_s: USR1 as the job starts, a checkpoint and a requeue, again and again
    ('pretrain: {time: "00:04:00"}', "stages.pretrain.time '00:04:00' (240 s) is not longer than signal_lead_s "
                                     "(300 s): SLURM would send USR1"),
    # a --mem sbatch refuses: the jobs before it were submitted, then sbatch failed (a chain half queued)
    ('pretrain: {time: "04:00:00", mem: "lots"}', "stages.pretrain.mem must be sbatch's --mem: a whole number of "
                                                  "megabytes or one with a unit K, M, G or T (e.g. '64G'"),
    # a typo's 10**9 CPUs passed the dry run; sbatch would refuse it after the jobs before it were queued
    ('pretrain: {time: "04:00:00", cpus_per_task: 1000000000}', "stages.pretrain: cpus_per_task 1,000,000,000, "
                                                                "gpus_per_node 1, nodes 1: at most 1,024 CPUs per task"),
])
def test_a_launcher_time_within_the_signal_lead_or_a_bad_mem_is_refused_at_load(tmp_path, capsys, stage, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"partition: gpu\nstages:\n  {stage}\n")
    minijoint = str(ROOT / "experiments" / "minijoint.yaml")
    assert main(["submit", minijoint, f"runs_dir={tmp_path / 'runs'}", "--launcher", str(path), "--dry-run"]) == 2
    assert f"{path}: {message}" in one_error(capsys)
    assert not (tmp_path / "runs").exists()
    for fine in ('pretrain: {time: "00:06:00", mem: "0"}', 'pretrain: {time: "04:00:00", mem: "64g"}'):
        path.write_text(f"partition: gpu\nstages:\n  {fine}\n")
        from minimodel.cluster.launcher import load_launcher
        assert load_launcher(path).stages.pretrain.time == fine.split('"')[1]


def test_report_out_ending_in_a_slash_is_refused(tmp_path, capsys):
    """``--out DIR/`` (a directory meant, not there yet) wrote the report as a file named DIR, its plots beside it."""
    from tests.test_reliability_round4_outputs import demo_runs, report

    runs = demo_runs(tmp_path)
    assert report(runs, "--out", f"{tmp_path / 'new'}/") == 2
    assert f"--out {tmp_path / 'new'}/ ends with '/' (a directory): the report is one Markdown file" in one_error(capsys)
    assert not (tmp_path / "new").exists() and not (tmp_path / "plots").exists()
    assert report(runs, "--out", str(tmp_path / "new" / "report.md")) == 0  # the advice: e.g. --out DIR/report.md


DEEP = "[" * 100_000  # JSON nested deeper than the parser goes: json.loads raised a RecursionError (a traceback)


def test_json_nested_past_the_parsers_depth_is_a_damaged_file(tmp_path, capsys, caplog):
    """A results.jsonl line, a done.json or a task file of 10^5 nested brackets: read as the damaged file it is."""
    from minimodel.errors import UserError
    from minimodel.store.layout import read_done
    from minimodel.store.results import ResultsTable
    from tests.test_reliability_round4_outputs import demo_runs, report, script, small_task

    runs = demo_runs(tmp_path)
    results = next(runs.rglob("results.jsonl"))
    whole = ResultsTable(results).rows()
    results.write_text(results.read_text() + DEEP + "\n")
    assert ResultsTable(results).rows() == whole
    assert report(runs, "--out", str(tmp_path / "r.md")) == 0
    # said once per process and file, on stderr once minimodel's logging is set up (by an earlier test's CLI call),
    # else through pytest's own capture of the root logger
    assert "skipped 1 line(s) that are not result rows" in capsys.readouterr().err + caplog.text
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "done.json").write_text(DEEP)
    with pytest.raises(UserError, match=r"done\.json is not valid JSON \(nested deeper than [\d,]+ levels"):
        read_done(tmp_path / "run")
    task, corpus = small_task(tmp_path)
    with open(task / "test.de.jsonl", "a") as f:
        f.write(DEEP + "\n")
    rc, _, err = script("check_overlap.py", str(task), str(corpus))
    # the script's own recursion limit (a library imported earlier in this process may have raised this one's)
    assert rc == 2 and re.fullmatch(rf"error: {re.escape(str(task))}/test\.de\.jsonl, line 3: invalid JSON "
                                    r"\(nested deeper than [\d,]+ levels\)", err.strip()), err


def test_check_overlap_that_compared_nothing_says_so(tmp_path):
    """``--min-chars`` above every text printed "0 of 0 examples (0.0%)", and a corpus directory without the task's
    languages "no … file has a corpus" with exit 0: nothing compared, read as no overlap."""
    from tests.test_reliability_round4_outputs import script, small_task

    task, corpus = small_task(tmp_path)
    rc, out, err = script("check_overlap.py", str(task), str(corpus), "--min-chars", "1000")
    assert rc == 2 and out == "" and err.strip() == (
        "error: no example of test.de.jsonl has a text of at least 1,000 characters in ['text'] (--min-chars): "
        "nothing was compared; give a smaller --min-chars"), err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "fr.txt").write_text("Bonjour.\n")
    rc, out, err = script("check_overlap.py", str(task), str(tmp_path / "other"))
    assert rc == 2 and err.strip() == (
        f"error: no dev.L / test.L file of {task} (['test.de.jsonl']) has a corpus of its language "
        f"{tmp_path / 'other'}/L.txt[.xz] (there: ['fr.txt']): nothing was compared"), err


def test_build_wiki_topics_corpus_never_replaces_a_corpus_of_ones_own(tmp_path):
    """``corpus --out`` a directory of one's own removed its en.txt (even when the build then failed for a missing
    pool) and would replace its fr.txt and es.txt. Now nothing there is touched; its own earlier output is rebuilt."""
    from tests.test_reliability_round4_outputs import script

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "en.txt").write_text("my own English\n")
    (mine / "fr.txt").write_text("mon fran\u00e7ais\n")
    before = tree(mine)
    for task in (tmp_path / "notask", ROOT / "data" / "wiki_topics"):
        rc, _, err = script("build_wiki_topics.py", "corpus", "--out", str(mine), "--task", str(task))
        assert rc == 2 and len(err.strip().splitlines()) == 1 and tree(mine) == before, err
    assert f"--out {mine} holds files this command did not write (en.txt, fr.txt; no .build_wiki_topics)" in err
    rc, out, err = script("build_wiki_topics.py", "corpus", "--out", str(tmp_path / "new"))
    assert rc == 0, err
    built = tree(tmp_path / "new")
    assert sorted(built) == [".build_wiki_topics", "en.txt.xz", "es.txt", "fr.txt"]
    rc, out, err = script("build_wiki_topics.py", "corpus", "--out", str(tmp_path / "new"))  # its own: rebuilt
    assert rc == 0 and tree(tmp_path / "new") == built, err


def test_build_wiki_topics_task_never_replaces_a_folder_of_ones_own(tmp_path):
    """``task --out`` a folder of one's own would have replaced its train.jsonl (and any dev/test of the task's
    names); now refused before the wheel is fetched, nothing touched. The committed task (its own output) passes."""
    from tests.test_reliability_round4_outputs import script
    from tests.test_wiki_topics import _script

    check_task_out = _script().check_task_out

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.jsonl").write_text('{"text": "mine", "label": "a"}\n')
    before = tree(mine)
    rc, _, err = script("build_wiki_topics.py", "task", "--out", str(mine), "--cache", str(tmp_path / "cache"))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and tree(mine) == before, err
    assert f"--out {mine} holds files this command did not write (train.jsonl; no SOURCES.md of this script)" in err
    assert not (tmp_path / "cache").exists()  # refused before anything was fetched
    check_task_out(ROOT / "data" / "wiki_topics")  # its own earlier output: may be rebuilt
    check_task_out(tmp_path / "new")


def test_a_bridge_refused_before_training_leaves_no_run_to_resume(tmp_path, capsys):
    """An outside source of 1 layer under ``bridge.depth=1`` was a ValueError traceback from the surgery, after the
    data was read (the configuration's check knows ``model.layers`` only). A bridge refused for its data ("no prepared
    shards") left config.yaml behind: the next attempt with another setting was refused as "a run stopped before its
    end that ran with other settings" (nothing had trained)."""
    from tests.test_outside import write_gguf

    def bridge(source: Path, *extra: str) -> int:
        return main(["bridge", TINY_YAML, f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prep'}",
                     "logging.wandb=disabled", "system=minipost", "model.mini_heads=[]", "model.family=decoder",
                     "finetune.pool=last", f"bridge.source={source}", "data.seq_len=16", "--no-progress", *extra])

    for d in ("one", "three"):
        (tmp_path / d).mkdir()
    one = write_gguf(tmp_path / "one" / "m.gguf", layers=1, tokenizer=True)
    assert bridge(one, "bridge.depth=1") == 2
    assert (f"bridge.depth=1: the source model {one} has 1 layer(s), and the mini-model keeps its layers "
            f"1..bridge.depth below the top one: a mini-model needs a source of 2 layers or more") in one_error(capsys)
    three = write_gguf(tmp_path / "three" / "m.gguf", layers=3, tokenizer=True)
    assert bridge(three, "bridge.depth=3") == 2
    said = one_error(capsys)
    assert f"bridge.depth=3: the source model {three} has 3 layer(s)" in said and "set bridge.depth in 1..2" in said
    run = tmp_path / "runs" / "tiny" / "minipost" / "bridge"
    for depth in (1, 2):  # no shards: the same refusal each time, whatever the settings, and nothing left behind
        assert bridge(three, f"bridge.depth={depth}") == 2
        assert "no prepared shards in" in one_error(capsys)
        assert not (run / "config.yaml").exists() and not (run / "inputs.json").exists()


def test_the_final_checkpoint_advice_never_says_to_delete_a_directory(tmp_path):
    """``load_final_model`` given a run directory instead of its ``last.ckpt`` said "delete <the run directory> and
    rerun": followed, a whole run gone. Now it names the file it wants and deletes nothing."""
    from minimodel.errors import CheckpointError
    from minimodel.store.checkpoints import load_final_model, rebuild_advice

    run = tmp_path / "bridge"
    run.mkdir()
    (run / "metrics.csv").write_text("step\n")
    with pytest.raises(CheckpointError) as e:
        load_final_model(run, "bridge")
    assert "delete" not in str(e.value) and f"{run} is a directory, not the final checkpoint file" in str(e.value)
    assert (run / "metrics.csv").exists()
    assert rebuild_advice(run / "last.ckpt", "bridge").startswith(f"{run / 'last.ckpt'} is the final checkpoint")
