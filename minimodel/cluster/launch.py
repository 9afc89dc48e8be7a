"""`minimodel submit`: one SLURM job per pipeline step, chained with ``afterok`` dependencies.

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

Cluster resources come from launcher files (``minimodel.cluster.launcher``) and each step's batch script is written by
``minimodel.cluster.sbatch``. A resubmission leaves out the finished steps (``finished_steps``) and is refused while jobs of
the experiment are queued or running.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from minimodel.cluster.launcher import LauncherConfig, batch_problems, launcher_path, load_launcher, memory_warnings
from minimodel.cluster.sbatch import SubmitError, safe_name, sbatch_script
from minimodel.config.schema import ExperimentConfig
from minimodel.errors import ConfigError
from minimodel.experiment import load_experiment
from minimodel.log import get_logger
from minimodel.pipeline import Step, plan
from minimodel.store import atomic
from minimodel.store.layout import Layout

log = get_logger(__name__)


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
    from minimodel.data.prepare import prepared_all
    from minimodel.store.identity import check_finished
    from minimodel.store.layout import is_done
    from minimodel.store.provenance import recorded_producers, stale_inputs

    out = set()
    for step in steps:
        if step.stage == "prepare" and step.lang:
            only = next((a.split("=", 1)[1] for a in step.args if a.startswith("--only=")), "")
            if prepared_all(load_experiment(config, [a for a in step.args[2:] if not a.startswith("--")]), step.lang,
                            only):
                out.add(step.name)
            continue
        if not step.run_dir or not is_done(Path(step.run_dir)):
            continue
        step_cfg = load_experiment(config, list(step.args[2:]))
        try:
            check_finished(step_cfg, step.stage_name, Path(step.run_dir))
        except ConfigError:
            continue  # finished with other settings: the job runs and says so
        recorded = recorded_producers(Path(step.run_dir), step_cfg.runs_dir)  # runs, and outside inputs by content
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


def check_plan(config: str, overrides: list[str], lc: LauncherConfig) -> None:
    """What the jobs would refuse at their start refuses the submission (``batch_problems``); a stage that may not
    fit its card's memory is a warning (an estimate: ``minimodel plan``)."""
    wrong = batch_problems(config, overrides, lc)
    if wrong:
        raise SubmitError("; ".join(wrong) + ": set the micro-batch (or the GPUs) so that it divides, then submit")
    for warning in memory_warnings(config, overrides, lc):
        log.warning(f"WARNING: {warning}")


def submit(config: str, overrides: list[str], launcher: str = "local", dry_run: bool = False) -> list[tuple[str, str]]:
    """Write one batch script per step of ``plan(config, overrides)`` to ``{runs_dir}/{name}/slurm/`` and
    submit them in order with ``afterok`` dependencies. Returns (step name, job id) pairs; with
    ``dry_run`` prints the scripts and sbatch commands instead (job ids are then "")."""
    overrides = list(overrides)
    cfg = load_experiment(config, overrides)
    lc = load_launcher(launcher_path(launcher, config))
    steps = plan(config, overrides)
    check_plan(config, overrides, lc)
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
