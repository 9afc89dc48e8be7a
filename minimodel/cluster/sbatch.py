"""The batch script of one step of `minimodel submit` (``sbatch_script``).

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
from pathlib import Path

from minimodel.cluster.launcher import TRAINER_STAGES, LauncherConfig, control_characters
from minimodel.errors import REQUEUE_EXIT, UserError
from minimodel.pipeline import Step
from minimodel.store.layout import Layout


class SubmitError(UserError, RuntimeError):
    """sbatch is missing or refused a job."""


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

    for o in opts:  # load_launcher refuses these in the launcher's values; a path or name holding one ends here
        bad = control_characters(o)
        if bad:
            raise SubmitError(f"#SBATCH {o!r} holds the control character {bad}, which would end the #SBATCH line "
                              f"(SLURM stops reading options there: --signal and --requeue would be lost); "
                              f"{launcher.source or 'the launcher'}: write every value on one line")
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
