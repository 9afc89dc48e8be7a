"""`minimodel submit`: one SLURM job per pipeline step, chained with ``afterok`` dependencies.

Cluster resources live in launcher files, apart from the hyperparameters: ``conf/launcher/{name}.yaml``
(``local``, ``v100``, ``a100``, ``h100``; or any YAML given by path) sets the partition, account, QoS,
and per stage (prepare | pretrain | bridge | adapt | finetune | evaluate | report) the time limit,
nodes, GPUs per node, CPUs per task and memory. Edit or copy them for your cluster.

Job layout, for an experiment ``name`` with ``runs_dir`` (the experiment's runs live in
``{runs_dir}/{name}/``)::

    {runs_dir}/{name}/slurm/
        00-prepare-en.sbatch         one script per step of `pipeline.plan`, numbered in submission order
        00-prepare-en.{jobid}.out    its stdout / stderr; a requeued job keeps its id and appends
        00-prepare-en.{jobid}.err
        01-prepare-de.sbatch         one prepare job per language: the source language, then the targets
        ...
        15-pretrain.sbatch
        ...
        NN-minijoint-n2.adapt-de.sbatch   (sweep steps ``variant:step``: ':' becomes '.')

Data are prepared by one job per language (``prepare-{lang}``, ``minimodel prepare ... --langs={lang}``), not by
one job for all of them (at CC-100 size English and the 14 targets in sequence take far longer than a 12-hour
limit) and not by a job array: each language has dependants of its own (pretraining waits for the source
language only, ``adapt-de`` and ``evaluate-de`` for German only), whereas ``afterok`` on an array waits for every
task of it. A job of its own also keeps its own log and its own time limit (each gets the launcher's
``stages.prepare`` resources), and a resubmission leaves out exactly the languages that are finished. The
languages run in parallel as far as the cluster allows. A sweep's variants share one prepare job per language
(they read the same ``data.prepared_dir``; `pipeline.plan` refuses variants that would prepare a language there
with other data settings, and gives one that prepares it elsewhere a job of its own).

Each job runs in the directory `minimodel submit` was called from (``--chdir``), so relative paths
(config, ``runs_dir``, data) mean the same thing on the compute nodes (a shared filesystem is assumed).
The script runs the launcher's ``setup`` snippet, then the step's ``minimodel`` command:

* every step runs as a job step of ``srun``: distributed training steps (pretrain / bridge / adapt) with one
  task per GPU (``--ntasks-per-node`` = GPUs per node, which Lightning's SLURM support expects) and
  ``{stage}.trainer.devices/num_nodes/accelerator`` overrides matching the allocation; every other step
  (finetune / evaluate on one GPU, prepare / report, any step of a CPU-only launcher) as one task.

``--signal=USR1@{signal_lead_s}`` asks SLURM to signal the job steps (the ``srun`` tasks) that long
before the time limit; training writes ``last.ckpt`` (evaluation finishes its row) and ``minimodel`` exits with
code 3. The script then requeues the job (``scontrol requeue``; same job id, so dependants keep waiting)
unless it has already been restarted ``max_requeues`` times, and the restarted job resumes from the
checkpoint. A signal that comes while the command is still starting is kept and honoured once training
starts (``minimodel.signals``). A step that
fails (any other non-zero code) ends its job as FAILED, and ``--kill-on-invalid-dep=yes`` cancels the
jobs waiting on it; fix the cause and submit again: finished steps are left out (a training step's ``done.json``
matches the settings; a prepare step's ``{prepared_dir}/{lang}/done.json`` records the current data settings).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field, fields
from pathlib import Path

from minimodel import atomic
from minimodel.config.load import find_conf_dir, load_structured
from minimodel.config.schema import ExperimentConfig
from minimodel.errors import REQUEUE_EXIT, ConfigError, UserError
from minimodel.experiment import load_experiment
from minimodel.layout import Layout
from minimodel.log import get_logger
from minimodel.memory import PlanRow, misfits, plan_rows
from minimodel.pipeline import Step, plan, variants

log = get_logger(__name__)

TRAINING_STAGES = ("pretrain", "bridge", "adapt")  # may span several GPUs / nodes (srun + DDP)
TRAINER_STAGES = ("pretrain", "bridge", "adapt", "finetune")  # stages with a `{stage}.trainer` config
_TIME = re.compile(r"^(\d+-\d{1,2}(:\d{2}){0,2}|\d+:\d{2}(:\d{2})?)$")  # D-HH[:MM[:SS]] | [HH:]MM:SS


class LauncherConfigError(ConfigError):
    """A launcher file problem, naming the file and the key."""


class SubmitError(UserError, RuntimeError):
    """sbatch is missing or refused a job."""


@dataclass
class Resources:
    """What one step's job asks for. Empty strings leave the option out (the cluster's default)."""

    time: str = "04:00:00"  # --time, quoted: D-HH:MM:SS or HH:MM:SS
    nodes: int = 1
    gpus_per_node: int = 0  # 0 = CPU only; distributed steps run one task per GPU
    cpus_per_task: int = 4
    mem: str = ""  # --mem per node, e.g. 64G ("0" = all of the node's memory on most clusters)
    partition: str = ""  # "" = the launcher's partition (e.g. a CPU partition for prepare)
    qos: str = ""  # "" = the launcher's qos
    constraint: str = ""  # "" = the launcher's constraint
    extra_sbatch: list[str] = field(default_factory=list)  # after the launcher's extra_sbatch


@dataclass
class StageResources:
    prepare: Resources = field(default_factory=lambda: Resources(time="12:00:00", cpus_per_task=8, mem="32G"))
    pretrain: Resources = field(default_factory=lambda: Resources(time="24:00:00", gpus_per_node=1))
    bridge: Resources = field(default_factory=lambda: Resources(time="24:00:00", gpus_per_node=1))
    adapt: Resources = field(default_factory=lambda: Resources(time="24:00:00", gpus_per_node=1))
    finetune: Resources = field(default_factory=lambda: Resources(time="08:00:00", gpus_per_node=1))
    evaluate: Resources = field(default_factory=lambda: Resources(time="24:00:00", gpus_per_node=1))
    report: Resources = field(default_factory=lambda: Resources(time="01:00:00", cpus_per_task=2, mem="8G"))


@dataclass
class LauncherConfig:
    partition: str = ""
    account: str = ""
    qos: str = ""
    constraint: str = ""  # node features, e.g. a100-80g
    setup: str = ""  # shell lines run before the step (environment, modules, exports)
    signal_lead_s: int = 300  # USR1 this many seconds before the time limit (0: none); SLURM is ~60 s coarse
    max_requeues: int = 20  # give up (exit 3, job FAILED) once SLURM_RESTART_COUNT reaches this
    trainer: list[str] = field(default_factory=list)  # key=value for {stage}.trainer of training/finetuning steps
    extra_sbatch: list[str] = field(default_factory=list)  # more #SBATCH options for every job, e.g. --mail-type=FAIL
    # the memory of one GPU in GiB, as torch reports it (torch.cuda.get_device_properties(0).total_memory / 2**30):
    # `minimodel plan` and `submit` check each training stage's micro-batch against it (minimodel.memory); 0 = unknown
    gpu_memory_gib: float = 0.0
    stages: StageResources = field(default_factory=StageResources)
    source: str = field(default="", metadata={"omegaconf_ignore": True})  # the file it came from

    def resources(self, stage: str) -> Resources:
        if stage not in {f.name for f in fields(StageResources)}:
            raise LauncherConfigError(f"{self.source}: no resources for stage {stage!r}")
        return getattr(self.stages, stage)


# ------------------------------------------------------------------------------------------ launcher files


def launcher_path(launcher: str | Path, config: str | Path) -> Path:
    """A launcher name (``conf/launcher/{name}.yaml`` next to the experiment's folder) or a YAML path."""
    s = str(launcher)
    if s.endswith((".yaml", ".yml")) or "/" in s:
        return Path(s)
    folder = find_conf_dir(Path(config)) / "launcher"
    path = folder / f"{s}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        raise LauncherConfigError(f"no launcher {s!r}: {path} does not exist (available: {known}, or give a path)")
    return path


def load_launcher(path: str | Path) -> LauncherConfig:
    """Read a launcher YAML into a validated ``LauncherConfig``; unknown keys and bad values name file and key."""
    path = Path(path)
    obj: LauncherConfig = load_structured(LauncherConfig, path, "launcher file", LauncherConfigError, "launcher")
    obj.source = str(path)
    _validate(obj)
    return obj


def _validate(c: LauncherConfig) -> None:
    def fail(msg: str) -> None:
        raise LauncherConfigError(f"{c.source}: {msg}")

    if c.signal_lead_s < 0 or c.max_requeues < 0:
        fail("signal_lead_s and max_requeues must be >= 0")
    if not 0 <= c.gpu_memory_gib < 10_000:  # (nan fails too)
        fail(f"gpu_memory_gib must be the memory of one GPU in GiB (e.g. 79.2 for an 80 GB A100), or 0 for unknown, "
             f"got {c.gpu_memory_gib}")
    for i, opt in enumerate(c.extra_sbatch):
        if not opt.startswith("-"):
            fail(f"extra_sbatch[{i}] must be an sbatch option such as --mail-type=FAIL, got {opt!r}")
    for i, kv in enumerate(c.trainer):
        if "=" not in kv or kv.startswith("-"):
            fail(f"trainer[{i}] must be key=value (a {{stage}}.trainer field such as precision=16-mixed), got {kv!r}")
    for f in fields(StageResources):
        r: Resources = getattr(c.stages, f.name)
        key = f"stages.{f.name}"
        if not _TIME.match(r.time):
            fail(f"{key}.time must be a quoted 'HH:MM:SS' or 'D-HH:MM:SS', got {r.time!r} "
                 f"(unquoted 24:00:00 is read by YAML as a number of seconds)")
        if r.nodes < 1 or r.gpus_per_node < 0 or r.cpus_per_task < 1:
            fail(f"{key}: nodes and cpus_per_task must be >= 1 and gpus_per_node >= 0")
        if f.name not in TRAINING_STAGES and (r.nodes != 1 or r.gpus_per_node > 1):
            fail(f"{key}: {f.name} runs one process: nodes must be 1 and gpus_per_node 0 or 1 "
                 f"(got {r.nodes} x {r.gpus_per_node})")
        if r.gpus_per_node == 0 and r.nodes != 1:
            fail(f"{key}: a CPU-only step runs on one node (got nodes: {r.nodes})")
        for i, opt in enumerate(r.extra_sbatch):
            if not opt.startswith("-"):
                fail(f"{key}.extra_sbatch[{i}] must be an sbatch option, got {opt!r}")


# ------------------------------------------------------------------------------------------------ memory


def stage_gpus(lc: LauncherConfig) -> dict[str, int]:
    """The GPUs (processes) of each training stage under the launcher: nodes x GPUs per node for the distributed
    stages, one for finetuning (and wherever the launcher gives no GPU)."""
    def gpus(stage: str) -> int:
        r = lc.resources(stage)
        return max(1, r.nodes * r.gpus_per_node) if stage in TRAINING_STAGES else 1

    return {stage: gpus(stage) for stage in TRAINER_STAGES}


def memory_plan(config: str, overrides: list[str], lc: LauncherConfig) -> list[tuple[str, list[PlanRow]]]:
    """The memory plan (``minimodel.memory``) of every variant of the experiment on the launcher's GPUs, with the
    launcher's trainer settings (e.g. precision=16-mixed) applied as its jobs apply them: (label, rows) pairs."""
    extra = [f"{stage}.trainer.{kv}" for stage in TRAINER_STAGES for kv in lc.trainer]
    return [(v.label, plan_rows(load_experiment(config, [*v.overrides, *extra]), stage_gpus(lc), lc.gpu_memory_gib))
            for v in variants(config, overrides)]


def memory_warnings(config: str, overrides: list[str], lc: LauncherConfig) -> list[str]:
    """A sentence per training stage that would not fit the launcher's GPUs (none when their memory is unknown)."""
    if not lc.gpu_memory_gib:
        return []
    plans = memory_plan(config, overrides, lc)
    return [f"{label + ': ' if len(plans) > 1 else ''}{line} (launcher {lc.source}; `minimodel plan` shows the plan)"
            for label, rows in plans for line in misfits(rows)]


# ------------------------------------------------------------------------------------------------ scripts


def safe_name(name: str) -> str:
    """A step name for file and job names: ``minijoint-n2:adapt-de`` -> ``minijoint-n2.adapt-de``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name.replace(":", "."))


def _no_space(path: Path, what: str) -> str:
    s = str(path)
    if re.search(r"\s", s):
        raise SubmitError(f"{what} {s!r} contains whitespace, which #SBATCH lines cannot hold; use another path")
    return s


def step_command(step: Step, launcher: LauncherConfig) -> list[str]:
    """The command line a step's job runs (before quoting), srun included for distributed steps."""
    r = launcher.resources(step.stage)
    args = list(step.args)
    if step.stage in TRAINER_STAGES:
        args += [f"{step.stage}.trainer.{kv}" for kv in launcher.trainer]
    if step.distributed and r.gpus_per_node > 0 and step.stage in TRAINER_STAGES:
        args += [f"{step.stage}.trainer.devices={r.gpus_per_node}", f"{step.stage}.trainer.num_nodes={r.nodes}",
                 f"{step.stage}.trainer.accelerator=gpu"]
    # every step is a job step of srun (one task per GPU of a distributed step, else one), so that SLURM's USR1
    # before the time limit (--signal without B:) reaches it whatever the device; srun has not inherited sbatch's
    # --cpus-per-task since SLURM 22.05: ask again
    return ["srun", f"--cpus-per-task={r.cpus_per_task}", "minimodel", *args, "--no-progress"]


def sbatch_script(step: Step, launcher: LauncherConfig, run_root: str | Path, *, stem: str | None = None,
                  workdir: str | Path | None = None) -> str:
    """The batch script of one step. ``run_root`` is ``{runs_dir}/{name}`` (logs go to its ``slurm/``);
    ``stem`` names the log files (default: the sanitised step name); ``workdir`` is the job's --chdir
    (default: the current directory)."""
    run_root = Path(run_root).absolute()
    workdir = Path(workdir or Path.cwd()).absolute()
    stem = stem or safe_name(step.name)
    logs = Layout(run_root.parent, run_root.name).slurm
    r = launcher.resources(step.stage)
    distributed = step.distributed and r.gpus_per_node > 0
    opts = [
        f"--job-name={safe_name(run_root.name)}-{safe_name(step.name)}",
        f"--output={_no_space(logs, 'log folder')}/{stem}.%j.out",
        f"--error={logs}/{stem}.%j.err",
        "--open-mode=append",
        f"--chdir={_no_space(workdir, 'working directory')}",
        f"--time={r.time}",
        f"--nodes={r.nodes}",
        f"--ntasks-per-node={r.gpus_per_node if distributed else 1}",
        f"--cpus-per-task={r.cpus_per_task}",
    ]
    if r.gpus_per_node:
        opts.append(f"--gres=gpu:{r.gpus_per_node}")
    for opt, value in (("mem", r.mem), ("partition", r.partition or launcher.partition),
                       ("account", launcher.account), ("qos", r.qos or launcher.qos),
                       ("constraint", r.constraint or launcher.constraint)):
        if value:
            opts.append(f"--{opt}={value}")
    if launcher.signal_lead_s:
        opts.append(f"--signal=USR1@{launcher.signal_lead_s}")  # to the job steps (srun tasks), not B: (the shell)
    opts += ["--requeue", "--kill-on-invalid-dep=yes", *launcher.extra_sbatch, *r.extra_sbatch]

    command = shlex.join(step_command(step, launcher))
    setup = launcher.setup.strip()
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {o}" for o in opts),
        f"# minimodel step {safe_name(step.name)} ({step.stage}) of experiment {run_root.name}, written by "
        f"`minimodel submit`; it runs after: {', '.join(map(safe_name, step.after)) or '-'}",
        "set -euo pipefail",
        'echo "[minimodel] job ${SLURM_JOB_ID:-?} step ' + safe_name(step.name) +
        ' on $(hostname), restart ${SLURM_RESTART_COUNT:-0}, $(date)"',
    ]
    if setup:
        lines += ["# --- launcher setup", "set +u  # activation scripts often read unset variables",
                  setup, "set -u", "# ---"]
    lines += [
        f"cmd=({command})",
        'echo "[minimodel] running: ${cmd[*]}"',
        "rc=0",
        '"${cmd[@]}" || rc=$?',
        "# 0: done; 3: checkpointed on USR1/SIGTERM or the wall-time cap, not finished: requeue; 4: stopped at"
        " trainer.stop_at (not finished: the job fails, so no step built on it starts); anything else: failed",
        f'if [ "$rc" -eq {REQUEUE_EXIT} ]; then',
        f'  if [ "${{SLURM_RESTART_COUNT:-0}}" -lt {launcher.max_requeues} ]; then',
        '    echo "[minimodel] checkpointed before the time limit: requeueing job $SLURM_JOB_ID"',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "    exit 0",
        "  fi",
        f'  echo "[minimodel] exit {REQUEUE_EXIT} after ${{SLURM_RESTART_COUNT:-0}} restarts (max_requeues:'
        f' {launcher.max_requeues}): not requeueing; submit again to resume" >&2',
        "fi",
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- submit


def _dependency(step: Step, ids: dict[str, str], finished: frozenset[str] = frozenset()) -> list[str]:
    """``afterok`` on the jobs of the steps ``step`` needs, except those already finished (left out)."""
    after = [a for a in step.after if a not in finished]
    missing = [a for a in after if a not in ids]
    if missing:
        raise SubmitError(f"step {step.name} depends on {missing}, which come later in the plan")
    return [f"--dependency=afterok:{':'.join(ids[a] for a in after)}"] if after else []


def finished_steps(config: str, steps: list[Step]) -> frozenset[str]:
    """The training steps whose run holds a ``done.json`` written with this configuration's settings, and the prepare
    steps whose language's ``{prepared_dir}/{lang}/done.json`` records the current data settings: a resubmission
    leaves them out (their dependants do not wait on them)."""
    from minimodel.data.prepare import is_prepared
    from minimodel.identity import check_finished
    from minimodel.layout import is_done
    from minimodel.provenance import recorded_inputs, stale_inputs

    out = set()
    for step in steps:
        if step.stage == "prepare" and step.lang:
            if is_prepared(load_experiment(config, [a for a in step.args[2:] if not a.startswith("--")]), step.lang):
                out.add(step.name)
            continue
        if not step.run_dir or not is_done(Path(step.run_dir)):
            continue
        try:
            check_finished(load_experiment(config, list(step.args[2:])), step.stage_name, Path(step.run_dir))
        except ConfigError:
            continue  # finished with other settings: the job runs and says so
        recorded = {k: Path(v["run"]) for k, v in recorded_inputs(Path(step.run_dir)).items()
                    if isinstance(v, dict) and v.get("run")}
        if stale_inputs(Path(step.run_dir), recorded):
            continue  # built on a run that finished again since: the job runs and says so
        out.add(step.name)
    return frozenset(out)


def queued_jobs(experiment: str) -> list[str]:
    """This user's queued or running jobs of ``experiment`` (``squeue``; [] when squeue is not there)."""
    if shutil.which("squeue") is None:
        return []
    try:
        res = subprocess.run(["squeue", "--noheader", "--me", "--format=%i %j %T"], capture_output=True, text=True)
    except OSError:
        return []
    prefix = f"{safe_name(experiment)}-"
    return [line.strip() for line in res.stdout.splitlines() if len(line.split()) >= 2
            and line.split()[1].startswith(prefix)]


def path_problems(cfg: ExperimentConfig, config: str, lc: LauncherConfig, workdir: Path) -> list[str]:
    """Paths the jobs read, relative to their working directory, that are not there: the experiment file, the
    corpus directory, and what the launcher's setup sources."""
    def missing(p: str) -> bool:
        path = Path(p)
        return not (path if path.is_absolute() else workdir / path).exists()

    out = [f"{what} {p}" for what, p in (("experiment file", config), ("data.corpus_dir", cfg.data.corpus_dir))
           if p and missing(p)]
    for line in lc.setup.splitlines():
        words = shlex.split(line, comments=True) if line.strip() else []
        if len(words) >= 2 and words[0] in ("source", ".") and "$" not in words[1] and missing(words[1]):
            out.append(f"launcher setup `{line.strip()}`: {words[1]}")
    return out


def submit(config: str, overrides: list[str], launcher: str = "local", dry_run: bool = False) -> list[tuple[str, str]]:
    """Write one batch script per step of ``plan(config, overrides)`` to ``{runs_dir}/{name}/slurm/`` and
    submit them in order with ``afterok`` dependencies. Returns (step name, job id) pairs; with
    ``dry_run`` prints the scripts and sbatch commands instead (job ids are then "")."""
    overrides = list(overrides)
    cfg = load_experiment(config, overrides)
    lc = load_launcher(launcher_path(launcher, config))
    steps = plan(config, overrides)
    for warning in memory_warnings(config, overrides, lc):
        log.warning(f"WARNING: {warning}")
    layout = Layout.of(cfg)
    run_root, slurm = layout.root.absolute(), layout.slurm.absolute()
    if not dry_run and shutil.which("sbatch") is None:
        raise SubmitError("sbatch not found: run `minimodel submit` on a SLURM login node, or use --dry-run")
    workdir = Path.cwd().absolute()
    problems = path_problems(cfg, config, lc, workdir)
    if problems:
        msg = (f"the jobs run in {workdir} (--chdir) and would not find: {'; '.join(problems)}. Submit from the "
               f"directory those paths are relative to, or make them absolute")
        if not dry_run:
            raise SubmitError(msg)
        print(f"# WARNING: {msg}")
    queued = [] if dry_run else queued_jobs(run_root.name)
    if queued:
        raise SubmitError(f"jobs of experiment {run_root.name} are queued or running ({'; '.join(queued[:5])}"
                          f"{' ...' if len(queued) > 5 else ''}): submitting again would run the same steps twice "
                          f"at once. Wait for them, or scancel them first")
    finished = finished_steps(config, steps)
    if finished:
        print(f"left out (finished with these settings: done.json): {', '.join(s.name for s in steps if s.name in finished)}")
    steps = [s for s in steps if s.name not in finished]
    atomic.make_dirs(slurm)
    width = max(2, len(str(len(steps) - 1)))
    scripts: list[Path] = []
    for i, step in enumerate(steps):
        stem = f"{i:0{width}d}-{safe_name(step.name)}"
        path = slurm / f"{stem}.sbatch"
        atomic.write_text(path, sbatch_script(step, lc, run_root, stem=stem))
        scripts.append(path)

    if dry_run:
        names = {s.name: f"<{s.name}>" for s in steps}
        for step, path in zip(steps, scripts):
            cmd = shlex.join(["sbatch", "--parsable", *_dependency(step, names, finished), str(path)])
            print(f"# ===== {step.name}: {cmd}\n{path.read_text()}")
        print(f"# dry run: {len(steps)} scripts written to {slurm} (launcher {lc.source}); nothing submitted")
        return [(s.name, "") for s in steps]

    ids: dict[str, str] = {}
    for step, path in zip(steps, scripts):
        cmd = ["sbatch", "--parsable", *_dependency(step, ids, finished), str(path)]

        def failed(why: str) -> SubmitError:
            done = ", ".join(f"{n}={j}" for n, j in ids.items()) or "none"
            cancel = f" (cancel them with `scancel {' '.join(ids.values())}`)" if ids else ""
            return SubmitError(f"sbatch failed for step {step.name} ({path}): {why}\n"
                               f"already submitted: {done}{cancel}")

        try:
            res = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError as e:
            raise SubmitError("sbatch not found: run `minimodel submit` on a SLURM login node, "
                              "or use --dry-run") from e
        if res.returncode != 0:
            raise failed(f"exit {res.returncode}: {res.stderr.strip() or res.stdout.strip()}")
        job = res.stdout.strip().split(";")[0].strip()
        if not job.isdigit():
            raise failed(f"cannot read a job id from its output {res.stdout.strip()!r}")
        ids[step.name] = job
        deps = ", ".join(f"{a}={ids[a]}" for a in step.after if a not in finished)
        deps = f" after {deps}" if deps else ""
        print(f"submitted {step.name}: job {job}{deps}", flush=True)
    print(f"{len(ids)} jobs submitted; scripts and logs in {slurm}")
    return list(ids.items())
