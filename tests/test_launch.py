"""`minimodel submit` against fake SLURM tools (sbatch / srun / scontrol on PATH that record their calls)."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from minimodel.cluster.launch import submit
from minimodel.cluster.launcher import LauncherConfigError, launcher_path, load_launcher
from minimodel.cluster.sbatch import SubmitError, safe_name, sbatch_script
from minimodel.experiment import load_experiment
from minimodel.pipeline import Step, plan
from tests.conftest import ROOT

MINIJOINT = str(ROOT / "experiments" / "minijoint.yaml")
OVERRIDES = ["target_langs=[de,tr]", "finetune.tasks=[xnli]", "finetune.seeds=[1,2]",
             f"data.corpus_dir={ROOT / 'data' / 'demo' / 'corpus'}"]

FAKE_TOOL = """#!{python}
# fake {name}: records argv (and, for sbatch, the script) as one JSON line in $FAKE_SLURM_LOG
import json, os, sys
log = os.environ["FAKE_SLURM_LOG"]
args = sys.argv[1:]
entry = {{"tool": "{name}", "argv": args, "setup": os.environ.get("MM_SETUP_RAN", "")}}
if "{name}" == "sbatch":
    entry["script"] = open(args[-1]).read()
    with open(log + ".count", "a+") as f:
        f.seek(0)
        n = len(f.read())
        f.write("x")
    if os.environ.get("FAKE_SBATCH_FAIL_AT") == str(n + 1):
        print("sbatch: error: Batch job submission failed: Invalid account or account/partition combination",
              file=sys.stderr)
        sys.exit(1)
with open(log, "a") as f:
    f.write(json.dumps(entry) + "\\n")
if "{name}" == "sbatch":
    print(f"{{1000 + n}};fakecluster")
if "{name}" == "squeue":
    print(os.environ.get("FAKE_SQUEUE", ""))
sys.exit(int(os.environ.get("FAKE_SRUN_RC", "0")) if "{name}" == "srun" else 0)
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake sbatch/srun/scontrol/squeue first on PATH; returns the log file they append to."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name in ("sbatch", "srun", "scontrol", "squeue"):
        tool = bin_dir / name
        tool.write_text(FAKE_TOOL.format(python=sys.executable, name=name))
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    log = tmp_path / "slurm.log"
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(log))
    return log


def calls(log: Path, tool: str) -> list[dict]:
    return [e for e in map(json.loads, log.read_text().splitlines()) if e["tool"] == tool]


def command_of(script: str) -> list[str]:
    """The command a script runs, parsed back with shell rules (proves the quoting round-trips)."""
    line, = [ln for ln in script.splitlines() if ln.startswith("cmd=(")]
    return shlex.split(line[len("cmd=("):-1])


def sbatch_option(script: str, name: str) -> str | None:
    found = [ln.split("=", 1)[1] for ln in script.splitlines() if ln.startswith(f"#SBATCH --{name}=")]
    return found[0] if found else None


def check_dependencies(steps: list[Step], sbatch: list[dict]) -> dict[str, str]:
    """One sbatch per step in plan order, each depending on exactly the job ids of its ``after``."""
    assert len(sbatch) == len(steps)
    ids: dict[str, str] = {}
    for step, call in zip(steps, sbatch):
        deps = [a for a in call["argv"] if a.startswith("--dependency")]
        if step.after:
            assert deps == [f"--dependency=afterok:{':'.join(ids[a] for a in step.after)}"], step.name
        else:
            assert deps == [], step.name
        assert call["argv"][0] == "--parsable" and call["argv"][-1].endswith(".sbatch")
        ids[step.name] = str(1000 + len(ids))
    return ids


def test_shipped_launchers_load():
    for name in ("local", "v100", "a100", "h100"):
        path = launcher_path(name, MINIJOINT)
        assert path == ROOT / "conf" / "launcher" / f"{name}.yaml"
        first = path.read_text().splitlines()[0]
        assert first.startswith("# minimodel submit") and f"--launcher {name}" in first
        lc = load_launcher(path)
        assert lc.stages.prepare.gpus_per_node == 0 and lc.stages.report.gpus_per_node == 0
    a100, v100 = load_launcher(launcher_path("a100", MINIJOINT)), load_launcher(launcher_path("v100", MINIJOINT))
    assert (a100.stages.pretrain.nodes, a100.stages.pretrain.gpus_per_node) == (1, 8)
    assert (v100.stages.pretrain.nodes, v100.stages.pretrain.gpus_per_node) == (2, 4)


def test_submit_minijoint(fake_slurm: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    overrides = [*OVERRIDES, f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
    steps = plan(MINIJOINT, overrides)
    assert [s.name for s in steps] == ["prepare-en", "prepare-de", "prepare-tr", "pretrain", "finetune-xnli-s1",
                                       "finetune-xnli-s2", "adapt-de", "evaluate-de", "adapt-tr", "evaluate-tr",
                                       "report"]
    by_name = {s.name: s for s in steps}
    # one prepare step per language; pretraining needs English only, a language's adaptation its own data only
    for lang in ("en", "de", "tr"):
        prep = by_name[f"prepare-{lang}"]
        assert (prep.stage, prep.lang, prep.after) == ("prepare", lang, ())
        assert prep.args == ("prepare", MINIJOINT, *overrides, f"--langs={lang}")
    assert by_name["pretrain"].after == ("prepare-en",)
    assert by_name["adapt-de"].after == ("pretrain", "prepare-de")
    assert by_name["finetune-xnli-s1"].after == ("pretrain",)
    # a language is evaluated as soon as its embeddings, its tokenizer and the finetuned models are there
    assert by_name["evaluate-de"].after == ("adapt-de", "finetune-xnli-s1", "finetune-xnli-s2", "prepare-de")
    jobs = submit(MINIJOINT, overrides, launcher="a100")
    sbatch = calls(fake_slurm, "sbatch")
    ids = check_dependencies(steps, sbatch)
    assert jobs == list(ids.items())  # "1000;fakecluster" -> "1000"
    out = capsys.readouterr().out
    assert "submitted prepare-en: job 1000\n" in out and "submitted pretrain: job 1003 after prepare-en=1000\n" in out
    assert "submitted adapt-de: job 1006 after pretrain=1003, prepare-de=1001\n" in out

    slurm = tmp_path / "runs" / "paper" / "slurm"
    for i, (step, call) in enumerate(zip(steps, sbatch)):
        script_path = Path(call["argv"][-1])
        assert script_path == slurm / f"{i:02d}-{step.name}.sbatch"
        script = script_path.read_text()
        assert call["script"] == script
        assert script.startswith("#!/bin/bash\n") and "set -euo pipefail" in script
        assert sbatch_option(script, "job-name") == f"paper-{step.name}"
        assert sbatch_option(script, "output") == f"{slurm}/{i:02d}-{step.name}.%j.out"
        assert sbatch_option(script, "error") == f"{slurm}/{i:02d}-{step.name}.%j.err"
        assert sbatch_option(script, "partition") == "gpu"
        assert sbatch_option(script, "signal") == "USR1@300"  # to the srun tasks, not B:
        assert "#SBATCH --requeue" in script and "#SBATCH --open-mode=append" in script
        assert "source .venv/bin/activate" in script and "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}" in script
        cmd = command_of(script)
        # every step runs under srun, so that USR1 before the time limit reaches it
        assert cmd[:2] == ["srun", f"--cpus-per-task={sbatch_option(script, 'cpus-per-task')}"]
        args = cmd[cmd.index("minimodel") + 1:]
        s = step.stage
        if step.distributed and s != "evaluate":
            assert args == [*step.args, f"{s}.trainer.devices=8", f"{s}.trainer.num_nodes=1",
                            f"{s}.trainer.accelerator=gpu", "--no-progress"]
            assert (sbatch_option(script, "nodes"), sbatch_option(script, "ntasks-per-node"),
                    sbatch_option(script, "gres")) == ("1", "8", "gpu:8")
        elif s == "evaluate":  # one process per GPU the launcher gives it (a100: 1), over disjoint checkpoints
            assert args == [*step.args, "--no-progress"] and "lang=" in " ".join(step.args)
            assert sbatch_option(script, "ntasks-per-node") == sbatch_option(script, "gres").split(":")[1] == "1"
        else:
            assert args == [*step.args, "--no-progress"]
            assert sbatch_option(script, "ntasks-per-node") == "1"
            assert sbatch_option(script, "gres") == (None if step.stage in ("prepare", "report") else "gpu:1")
        if s == "prepare":  # one language per job, with the launcher's prepare resources
            assert args[0] == "prepare" and [a for a in args if a.startswith("--langs")] == [f"--langs={step.lang}"]
            prepare = load_launcher(launcher_path("a100", MINIJOINT)).stages.prepare
            assert (sbatch_option(script, "time"), sbatch_option(script, "cpus-per-task")) == (
                prepare.time, str(prepare.cpus_per_task))
    # the list override survives the shell
    adapt = (slurm / "06-adapt-de.sbatch").read_text()
    assert "'target_langs=[de,tr]'" in adapt and "'finetune.seeds=[1,2]'" in adapt


def test_v100_spreads_pretraining_over_two_nodes(tmp_path: Path):
    lc = load_launcher(launcher_path("v100", MINIJOINT))
    step = next(s for s in plan(MINIJOINT, OVERRIDES) if s.stage == "pretrain")
    script = sbatch_script(step, lc, tmp_path / "paper")
    assert (sbatch_option(script, "nodes"), sbatch_option(script, "ntasks-per-node"),
            sbatch_option(script, "gres")) == ("2", "4", "gpu:4")
    cmd = command_of(script)
    assert cmd[0] == "srun"
    assert {"pretrain.trainer.devices=4", "pretrain.trainer.num_nodes=2", "pretrain.trainer.accelerator=gpu",
            "pretrain.trainer.precision=16-mixed"} <= set(cmd)


def test_sweep_gives_steps_per_variant(fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    exp = tmp_path / "experiments" / "sweep.yaml"
    exp.parent.mkdir()
    exp.write_text((ROOT / "experiments" / "minijoint.yaml").read_text()
                   + 'sweep: ["model.mini_heads=[2] tag=n2", "model.mini_heads=[6] tag=n6"]\n')
    monkeypatch.setenv("MINIMODEL_CONF", str(ROOT / "conf"))
    overrides = [*OVERRIDES, f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
    steps = plan(exp, overrides)
    jobs = submit(str(exp), overrides, launcher="a100")  # found through $MINIMODEL_CONF/launcher/
    names = [n for n, _ in jobs]
    assert names == [s.name for s in steps]
    for v in ("minijoint-n2", "minijoint-n6"):
        for name in ("pretrain", "adapt-de", "adapt-tr", "finetune-xnli-s1", "finetune-xnli-s2", "evaluate-de",
                     "evaluate-tr"):
            assert f"{v}:{name}" in names
    # the variants share one prepare step per language (the same data.prepared_dir and data settings)
    assert names[:3] == ["prepare-en", "prepare-de", "prepare-tr"] and names[-1] == "report"
    assert [n for n in names if "prepare" in n] == names[:3]
    ids = check_dependencies(steps, calls(fake_slurm, "sbatch"))
    by_name = {s.name: s for s in steps}
    assert by_name["minijoint-n2:pretrain"].after == by_name["minijoint-n6:pretrain"].after == ("prepare-en",)
    assert by_name["minijoint-n6:adapt-de"].after == ("minijoint-n6:pretrain", "prepare-de")
    assert by_name["report"].after == ("minijoint-n2:evaluate-de", "minijoint-n2:evaluate-tr",
                                       "minijoint-n6:evaluate-de", "minijoint-n6:evaluate-tr")
    i = names.index("minijoint-n6:adapt-de")
    script = (tmp_path / "runs" / "paper" / "slurm" / f"{i:02d}-minijoint-n6.adapt-de.sbatch").read_text()
    assert sbatch_option(script, "job-name") == "paper-minijoint-n6.adapt-de"
    cmd = command_of(script)
    assert "model.mini_heads=[6]" in cmd and "tag=n6" in cmd and "lang=de" in cmd
    assert len(set(ids.values())) == len(steps)


def test_dry_run_submits_nothing(fake_slurm: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                 monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))  # no sbatch needed either
    overrides = [*OVERRIDES, f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
    jobs = submit(MINIJOINT, overrides, launcher="h100", dry_run=True)
    out = capsys.readouterr().out
    assert calls(fake_slurm, "sbatch") == []
    assert [j for _, j in jobs] == [""] * len(jobs) == [""] * 11
    assert out.count("#!/bin/bash") == 11
    # "# ===== STEP: sbatch --parsable [--dependency=...] SCRIPT" per step
    deps = {name: [a for a in shlex.split(cmd) if a.startswith("--dependency")]
            for name, cmd in re.findall(r"^# ===== (\S+): (.*)$", out, flags=re.M)}
    assert list(deps) == [n for n, _ in jobs]
    assert deps["prepare-en"] == deps["prepare-de"] == deps["prepare-tr"] == []
    assert deps["pretrain"] == ["--dependency=afterok:<prepare-en>"]  # English only
    assert deps["adapt-de"] == ["--dependency=afterok:<pretrain>:<prepare-de>"]
    assert deps["evaluate-de"] == ["--dependency=afterok:<adapt-de>:<finetune-xnli-s1>:<finetune-xnli-s2>:<prepare-de>"]
    assert deps["report"] == ["--dependency=afterok:<evaluate-de>:<evaluate-tr>"]
    slurm = tmp_path / "runs" / "paper" / "slurm"
    for i, lang in enumerate(("en", "de", "tr")):  # each prepare script runs its own language only
        cmd = command_of((slurm / f"{i:02d}-prepare-{lang}.sbatch").read_text())
        assert cmd[cmd.index("minimodel") + 1] == "prepare" and cmd[-2:] == [f"--langs={lang}", "--no-progress"]
    assert "nothing submitted" in out
    assert len(list(slurm.glob("*.sbatch"))) == 11


@pytest.fixture
def test_launcher(tmp_path: Path) -> Path:
    path = tmp_path / "testcluster.yaml"
    path.write_text("setup: export MM_SETUP_RAN=yes\nmax_requeues: 2\n"
                    "stages:\n  adapt: {time: '01:00:00', nodes: 2, gpus_per_node: 4}\n")
    return path


@pytest.mark.parametrize("srun_rc,restarts,expect_rc,requeued", [
    (3, None, 0, True),  # checkpointed on USR1: requeue
    (3, "1", 0, True),
    (3, "2", 3, False),  # max_requeues reached: give up with 3
    (0, None, 0, False),  # finished
    (1, None, 1, False),  # failed
])
def test_script_requeues_on_exit_3(fake_slurm: Path, tmp_path: Path, test_launcher: Path,
                                   srun_rc: int, restarts: str | None, expect_rc: int, requeued: bool):
    step = next(s for s in plan(MINIJOINT, OVERRIDES) if s.name == "adapt-de")
    script = tmp_path / "adapt.sbatch"
    script.write_text(sbatch_script(step, load_launcher(test_launcher), tmp_path / "paper"))
    env = {k: v for k, v in os.environ.items() if k != "SLURM_RESTART_COUNT"}
    env.update(SLURM_JOB_ID="4242", FAKE_SRUN_RC=str(srun_rc))
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = restarts
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == expect_rc, res.stderr
    srun, = calls(fake_slurm, "srun")
    assert srun["setup"] == "yes"  # the launcher's setup ran first
    assert srun["argv"] == ["--cpus-per-task=4", "minimodel", *step.args, "adapt.trainer.devices=4",
                            "adapt.trainer.num_nodes=2", "adapt.trainer.accelerator=gpu", "--no-progress"]
    assert [c["argv"] for c in calls(fake_slurm, "scontrol")] == ([["requeue", "4242"]] if requeued else [])
    if srun_rc == 3 and not requeued:
        assert "max_requeues: 2" in res.stderr


@pytest.mark.parametrize("text,key", [
    ("partion: gpu\n", "partion"),
    ("stages:\n  pretrain:\n    gpus: 8\n", "stages.pretrain.gpus"),
    ("stages:\n  pretraining: {nodes: 2}\n", "stages.pretraining"),
    ("source: x.yaml\n", "source"),
])
def test_unknown_launcher_key_names_file_and_key(tmp_path: Path, text: str, key: str):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(LauncherConfigError, match=re.escape(f"{path}: unknown launcher key '{key}'")):
        submit(MINIJOINT, [f"runs_dir={tmp_path}"], launcher=str(path), dry_run=True)


@pytest.mark.parametrize("text,msg", [
    ("stages:\n  pretrain: {time: 24:00:00}\n", "stages.pretrain.time must be a quoted"),  # YAML: 86400
    ("stages:\n  finetune: {gpus_per_node: 4}\n", "stages.finetune: finetune runs one process"),
    ("stages:\n  pretrain: {nodes: oops}\n", "bad value for 'stages.pretrain.nodes'"),
    ("extra_sbatch: [exclusive]\n", "extra_sbatch[0] must be an sbatch option"),
])
def test_bad_launcher_values(tmp_path: Path, text: str, msg: str):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(LauncherConfigError, match=re.escape(f"{path}: ") + ".*" + re.escape(msg)):
        load_launcher(path)


def test_unknown_launcher_name_lists_the_known_ones():
    with pytest.raises(LauncherConfigError, match=r"no launcher 'a200'.*'a100'.*'h100'.*'local'.*'v100'"):
        launcher_path("a200", MINIJOINT)


def test_missing_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    message = "sbatch not found: run `minimodel submit` on a SLURM login node, or use --dry-run"
    with pytest.raises(SubmitError, match=re.escape(message)):
        submit(MINIJOINT, [*OVERRIDES, f"runs_dir={tmp_path}"], launcher="a100")
    # found by `which` but gone when run (FileNotFoundError from subprocess)
    monkeypatch.setattr("minimodel.cluster.launch.shutil.which", lambda name: "/nowhere/sbatch")
    with pytest.raises(SubmitError, match=re.escape(message)):
        submit(MINIJOINT, [*OVERRIDES, f"runs_dir={tmp_path}"], launcher="a100")


def test_sbatch_failure_says_what_was_submitted(fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_SBATCH_FAIL_AT", "5")
    with pytest.raises(SubmitError) as e:
        submit(MINIJOINT, [*OVERRIDES, f"runs_dir={tmp_path}", f"data.prepared_dir={tmp_path / 'prepared'}"], launcher="a100")
    msg = str(e.value)
    assert "sbatch failed for step finetune-xnli-s1" in msg and "Invalid account" in msg
    assert "already submitted: prepare-en=1000, prepare-de=1001, prepare-tr=1002, pretrain=1003" in msg
    assert "scancel 1000 1001 1002 1003" in msg


def test_safe_name():
    assert safe_name("minijoint-n2:adapt-de") == "minijoint-n2.adapt-de"
    assert safe_name("a b/c") == "a_b_c"


def test_lightning_does_not_requeue_by_itself_under_slurm(monkeypatch: pytest.MonkeyPatch):
    """Under SLURM the sbatch script owns USR1 and the requeue: Lightning's own auto-requeue is off."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from minimodel.training.runner import trainer_plugins

    for k in ("SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(k, raising=False)
    assert not [p for p in trainer_plugins() if isinstance(p, SLURMEnvironment)]
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "paper-pretrain")
    slurm = [p for p in trainer_plugins() if isinstance(p, SLURMEnvironment)]
    assert len(slurm) == 1 and slurm[0].auto_requeue is False


def configured_runs(overrides: list[str], names: tuple[str, ...]) -> dict:
    """The plan's steps by name; the run directories of ``names`` made, each with the config.yaml its step writes."""
    from minimodel.config.load import save_config

    steps = {s.name: s for s in plan(MINIJOINT, overrides)}
    for name in names:
        run = Path(steps[name].run_dir)
        run.mkdir(parents=True)
        save_config(load_experiment(MINIJOINT, list(steps[name].args[2:])), run / "config.yaml")
    return steps


def test_resubmission_leaves_out_finished_steps(fake_slurm: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    """A step whose done.json matches is not submitted again, and its dependants do not wait on it; a finished
    run with other settings is submitted (the job then says which settings differ)."""
    import yaml

    from minimodel.config.load import save_config

    overrides = [*OVERRIDES, f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
    steps = configured_runs(overrides, ("pretrain", "adapt-de"))
    for name in ("pretrain", "adapt-de"):
        (Path(steps[name].run_dir) / "done.json").write_text("{}")
    tr = Path(steps["adapt-tr"].run_dir)  # finished, but with another learning rate
    tr.mkdir(parents=True)
    save_config(load_experiment(MINIJOINT, [*steps["adapt-tr"].args[2:], "adapt.optim.lr=1e-2"]), tr / "config.yaml")
    (tr / "done.json").write_text("{}")
    jobs = submit(MINIJOINT, overrides, launcher="a100")
    names = [n for n, _ in jobs]
    assert "pretrain" not in names and "adapt-de" not in names and "adapt-tr" in names
    assert "left out (finished with these settings: done.json): pretrain, adapt-de" in capsys.readouterr().out
    by_step = {c["script"].split("minimodel step ")[1].split(" ")[0]: c for c in calls(fake_slurm, "sbatch")}
    dep = [a for a in by_step["finetune-xnli-s1"]["argv"] if a.startswith("--dependency")]
    assert dep == []  # it needed only the pretraining, which is finished
    assert [a for a in by_step["evaluate-de"]["argv"] if a.startswith("--dependency")] == [
        "--dependency=afterok:" + ":".join(dict(jobs)[n] for n in ("finetune-xnli-s1", "finetune-xnli-s2",
                                                                     "prepare-de"))]
    assert yaml.safe_load((tr / "config.yaml").read_text())["adapt"]["optim"]["lr"] == 1e-2  # untouched


def test_a_second_submit_is_refused_while_jobs_are_queued(fake_slurm: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    overrides = [*OVERRIDES, f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
    monkeypatch.setenv("FAKE_SQUEUE", "1234 paper-pretrain RUNNING\n1235 other-pretrain PENDING")
    with pytest.raises(SubmitError, match=r"jobs of experiment paper are queued or running \(1234 paper-pretrain "
                                          r"RUNNING\): submitting again would run the same steps twice"):
        submit(MINIJOINT, overrides, launcher="a100")
    assert calls(fake_slurm, "sbatch") == []
    monkeypatch.setenv("FAKE_SQUEUE", "1235 other-pretrain PENDING")
    assert submit(MINIJOINT, overrides, launcher="a100")


def test_paths_the_jobs_would_not_find_are_named_before_submitting(fake_slurm: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture):
    overrides = [*OVERRIDES[:-1], "data.corpus_dir=data/demo/corpus", f"runs_dir={tmp_path / 'runs'}",
                 f"data.prepared_dir={tmp_path / 'prepared'}"]
    monkeypatch.chdir(tmp_path)  # not the repository: data/demo/corpus and .venv/bin/activate are not here
    with pytest.raises(SubmitError) as e:
        submit(MINIJOINT, overrides, launcher="a100")
    assert "data.corpus_dir data/demo/corpus" in str(e.value) and ".venv/bin/activate" in str(e.value)
    assert calls(fake_slurm, "sbatch") == []
    submit(MINIJOINT, overrides, launcher="a100", dry_run=True)  # a dry run warns
    assert "# WARNING: the jobs run in" in capsys.readouterr().out
    monkeypatch.chdir(ROOT)
    assert submit(MINIJOINT, overrides, launcher="a100")


def test_a_finished_step_built_on_an_earlier_run_is_not_left_out(fake_slurm: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture):
    """adapt-de finished on the pretraining as it was; the pretraining finished again since: adapt-de is submitted
    (its job then stops, naming both runs) rather than left out as finished."""
    from minimodel.store.provenance import stamp

    overrides = [*OVERRIDES, f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
    steps = configured_runs(overrides, ("pretrain", "adapt-de"))
    pre, de = Path(steps["pretrain"].run_dir), Path(steps["adapt-de"].run_dir)
    (pre / "done.json").write_text(json.dumps({"step": 10, "finished_at": "2026-01-01T00:00:00+00:00"}))
    (de / "done.json").write_text(json.dumps({"step": 5, "inputs": {"body": stamp(pre)}}))
    submit(MINIJOINT, overrides, launcher="a100")
    assert "left out (finished with these settings: done.json): pretrain, adapt-de" in capsys.readouterr().out
    (pre / "done.json").write_text(json.dumps({"step": 10, "finished_at": "2026-02-01T00:00:00+00:00"}))
    names = [n for n, _ in submit(MINIJOINT, overrides, launcher="a100")]
    assert "left out (finished with these settings: done.json): pretrain\n" in capsys.readouterr().out
    assert "adapt-de" in names and "pretrain" not in names


def write_prepared(cfg, lang: str) -> None:
    """``{prepared_dir}/{lang}/done.json`` as a finished prepare step writes it (the settings it prepared with),
    beside a complete manifest (of no shards: what prepare's skip check reads)."""
    from minimodel.data.prepare import prepare_settings, prepared_paths

    paths = prepared_paths(cfg, lang)
    paths.shards.mkdir(parents=True, exist_ok=True)
    (paths.shards / "manifest.json").write_text(json.dumps({"complete": True, "shards": []}))
    paths.done.write_text(json.dumps({"settings": prepare_settings(cfg, lang)}))


def dependency_of(sbatch: list[dict], step: str) -> list[str]:
    call, = [c for c in sbatch if f"# minimodel step {step} (" in c["script"]]
    return [a for a in call["argv"] if a.startswith("--dependency")]


def test_resubmission_leaves_out_finished_prepare_steps(fake_slurm: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture):
    """A language whose done.json records the current data settings is not prepared again, and nothing waits for
    it; a language not prepared yet, or prepared with other settings (another vocabulary), is submitted."""
    overrides = [*OVERRIDES, f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
    cfg = load_experiment(MINIJOINT, overrides)
    for lang in ("en", "de"):
        write_prepared(cfg, lang)
    jobs = dict(submit(MINIJOINT, overrides, launcher="a100"))
    assert "left out (finished with these settings: done.json): prepare-en, prepare-de\n" in capsys.readouterr().out
    assert "prepare-en" not in jobs and "prepare-de" not in jobs and "prepare-tr" in jobs
    sbatch = calls(fake_slurm, "sbatch")
    assert len(sbatch) == len(jobs) == 9
    assert dependency_of(sbatch, "pretrain") == []  # English is prepared: it starts at once
    assert dependency_of(sbatch, "adapt-de") == [f"--dependency=afterok:{jobs['pretrain']}"]
    assert dependency_of(sbatch, "adapt-tr") == [f"--dependency=afterok:{jobs['pretrain']}:{jobs['prepare-tr']}"]
    assert dependency_of(sbatch, "evaluate-de") == [
        "--dependency=afterok:" + ":".join(jobs[n] for n in ("adapt-de", "finetune-xnli-s1", "finetune-xnli-s2"))]
    script = Path(sbatch[0]["argv"][-1])
    assert script.name == "00-prepare-tr.sbatch" and command_of(script.read_text())[-2:] == ["--langs=tr",
                                                                                              "--no-progress"]
    # another vocabulary: what is prepared is not what these settings need; every language is prepared again
    again = dict(submit(MINIJOINT, [*overrides, "data.vocab_size=2000"], launcher="a100"))
    assert "left out" not in capsys.readouterr().out
    assert list(again)[:4] == ["prepare-en", "prepare-de", "prepare-tr", "pretrain"]
    assert dependency_of(calls(fake_slurm, "sbatch")[len(sbatch):], "pretrain") == [
        f"--dependency=afterok:{again['prepare-en']}"]


def test_is_prepared_is_what_leaves_a_prepare_step_out(fake_slurm: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    """The launcher asks data.prepare.is_prepared, with the step's own settings and language (its own data: no
    bridge.langs here)."""
    asked = []

    def is_prepared(cfg, lang: str, in_source: bool = False) -> bool:
        assert not in_source
        asked.append((cfg.data.prepared_dir, lang))
        return lang == "tr"

    monkeypatch.setattr("minimodel.data.prepare.is_prepared", is_prepared)
    overrides = [*OVERRIDES, f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
    names = [n for n, _ in submit(MINIJOINT, overrides, launcher="a100")]
    assert asked == [(str(tmp_path / "prepared"), lang) for lang in ("en", "de", "tr")]
    assert names[:3] == ["prepare-en", "prepare-de", "pretrain"] and "prepare-tr" not in names


def test_variants_that_prepare_elsewhere_get_their_own_prepare_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    exp = tmp_path / "experiments" / "sweep.yaml"
    exp.parent.mkdir()
    other = tmp_path / "other-prepared"
    exp.write_text((ROOT / "experiments" / "minijoint.yaml").read_text()
                   + f'sweep: ["model.mini_heads=[2] tag=n2", "model.mini_heads=[6] tag=n6 data.prepared_dir={other}"]\n')
    monkeypatch.setenv("MINIMODEL_CONF", str(ROOT / "conf"))
    steps = {s.name: s for s in plan(exp, OVERRIDES)}  # (a data.prepared_dir on the command line: every variant's)
    prepares = [n for n, s in steps.items() if s.stage == "prepare"]
    assert prepares == ["prepare-en", "minijoint-n6:prepare-en", "prepare-de", "prepare-tr", "minijoint-n6:prepare-de",
                        "minijoint-n6:prepare-tr"]  # source language first, then the targets
    assert f"data.prepared_dir={other}" in steps["minijoint-n6:prepare-de"].args
    assert steps["minijoint-n6:prepare-de"].args[-1] == "--langs=de"
    assert steps["minijoint-n2:pretrain"].after == ("prepare-en",)
    assert steps["minijoint-n6:pretrain"].after == ("minijoint-n6:prepare-en",)
    assert steps["minijoint-n6:adapt-de"].after == ("minijoint-n6:pretrain", "minijoint-n6:prepare-de")
    assert steps["minijoint-n6:evaluate-tr"].after[-1] == "minijoint-n6:prepare-tr"


def test_variants_that_would_prepare_a_language_differently_in_one_place_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from minimodel.errors import ConfigError

    exp = tmp_path / "experiments" / "sweep.yaml"
    exp.parent.mkdir()
    exp.write_text((ROOT / "experiments" / "minijoint.yaml").read_text()
                   + 'sweep: ["tag=a", "data.vocab_size=2000 tag=b"]\n')
    monkeypatch.setenv("MINIMODEL_CONF", str(ROOT / "conf"))
    with pytest.raises(ConfigError, match=re.escape(
            f"{exp}: sweep entries 'tag=a' and 'data.vocab_size=2000 tag=b' prepare en into the same "
            f"{tmp_path / 'prepared' / 'en'} with other data settings (vocab_size: ") + r".*"
            + re.escape("give the sweep entry 'data.vocab_size=2000 tag=b' a data.prepared_dir of its own")):
        plan(exp, [*OVERRIDES, f"data.prepared_dir={tmp_path / 'prepared'}"])


def test_prepare_steps_without_a_pretraining_of_this_experiment(tmp_path: Path):
    """MiniPost from a public model: its bridge waits for English's prepare step only. An experiment that reuses
    another's models (models_from): finetuning waits for English's data, each evaluation for its language's."""
    from minimodel.systems import stage_plan

    minipost = str(ROOT / "experiments" / "minipost.yaml")
    steps = {s.name: s for s in plan(minipost, [*OVERRIDES, "bridge.source=roberta-base"])}
    assert "pretrain" not in steps and steps["bridge"].after == ("prepare-en",)
    assert steps["adapt-de"].after == ("bridge", "prepare-de")

    reuse = tmp_path / "reuse.yaml"
    reuse.write_text(f"extends: {MINIJOINT}\nname: reuse\nmodels_from: paper\n")
    overrides = [*OVERRIDES, f"runs_dir={tmp_path / 'runs'}"]
    r = stage_plan(load_experiment(reuse, overrides), "adapt").runs
    for run in (r.pretrain, r.adapt("de"), r.adapt("tr")):
        run.mkdir(parents=True)
        (run / "done.json").write_text("{}")
    steps = {s.name: s for s in plan(reuse, overrides)}
    assert list(steps) == ["prepare-en", "prepare-de", "prepare-tr", "finetune-xnli-s1", "finetune-xnli-s2",
                           "evaluate-de", "evaluate-tr", "report"]
    assert steps["finetune-xnli-s1"].after == ("prepare-en",)
    assert steps["evaluate-de"].after == ("finetune-xnli-s1", "finetune-xnli-s2", "prepare-de")


def test_run_executes_the_prepare_steps_one_language_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`minimodel run` runs the plan in order: each language's prepare step on its own, English first."""
    import argparse

    from minimodel import cli
    ran: list[list[str]] = []
    monkeypatch.setattr(cli, "main", lambda argv: ran.append(argv) or 0)
    overrides = [*OVERRIDES, f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}"]
    args = argparse.Namespace(config=MINIJOINT, overrides=overrides, no_progress=True, adapt_missing=False)
    assert cli.cmd_run(load_experiment(MINIJOINT, overrides), args) == ""
    assert [a[0] for a in ran] == [s.args[0] for s in plan(MINIJOINT, overrides)]
    assert [a[-2] for a in ran[:3]] == ["--langs=en", "--langs=de", "--langs=tr"] and ran[3][0] == "pretrain"
    assert all(a[-1] == "--no-progress" for a in ran)
