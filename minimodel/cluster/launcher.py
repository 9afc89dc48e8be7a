"""Launcher files: the cluster resources of `minimodel submit`'s jobs, and the memory plan on their GPUs (the
estimates of ``minimodel.cluster.memory`` per stage, what fits the card, and what the jobs would refuse).

Cluster resources live in launcher files, apart from the hyperparameters: ``conf/launcher/{name}.yaml``
(``local``, ``v100``, ``a100``, ``h100``; or any YAML given by path) sets the partition, account, QoS,
and per stage (prepare | pretrain | bridge | adapt | finetune | evaluate | report) the time limit,
nodes, GPUs per node, CPUs per task and memory. Edit or copy them for your cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from minimodel.cluster.memory import (
    CONTEXT_GIB,
    FRAGMENTATION,
    GiB,
    MemoryEstimate,
    StageModel,
    estimate,
    micro_batches,
    stage_models,
)
from minimodel.config.load import find_conf_dir, load_structured
from minimodel.config.schema import ExperimentConfig
from minimodel.errors import ConfigError
from minimodel.experiment import load_experiment
from minimodel.pipeline import variants

TRAINING_STAGES = ("pretrain", "bridge", "adapt")  # may span several GPUs / nodes (srun + DDP)
TRAINER_STAGES = ("pretrain", "bridge", "adapt", "finetune")  # stages with a `{stage}.trainer` config
MAX_TIME_DAYS = 365  # a time limit beyond a year is a typo (SLURM itself stores minutes in 32 bits)
_MEM = re.compile(r"[0-9]+[KMGTkmgt]?")  # sbatch's --mem: a whole number, in megabytes or with a unit K, M, G, T
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # a line break ends an #SBATCH line: what follows is no longer read


def parse_time(value: str) -> int:
    """The seconds of a SLURM time limit, in SLURM's formats: MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (a bare
    number of minutes is refused: YAML reads an unquoted 24:00:00 as 86400, which SLURM would take for 60 days).
    Each field within its range (seconds and minutes below 60, hours below 24 after a day; minutes of MM:SS and hours
    of HH:MM:SS may be larger), the whole above 0 and at most ``MAX_TIME_DAYS``. ``ValueError`` says what is wrong."""
    v = value.strip()
    days, dash, rest = v.partition("-")
    if not dash:
        days, rest = "0", v
    parts = rest.split(":")
    if not all(p.isascii() and p.isdigit() for p in [days, *parts]) or not 1 <= len(parts) <= 3:
        raise ValueError("not one of SLURM's formats MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS")
    if not dash and len(parts) == 1:
        raise ValueError("a bare number, which SLURM reads as minutes, and YAML makes of an unquoted 24:00:00 "
                         "(86400): write it as a quoted 'HH:MM:SS' (or 'MM:SS', 'D-HH:MM:SS')")
    n = [int(p) for p in parts]
    if dash:  # D-HH[:MM[:SS]]
        h, m, sec = (n + [0, 0])[:3]
        if h > 23 or m > 59 or sec > 59:
            raise ValueError("after D- the hours must be 0-23, the minutes and seconds 0-59")
    elif len(n) == 2:  # MM:SS
        h, m, sec = 0, n[0], n[1]
        if sec > 59:
            raise ValueError("the seconds must be 0-59")
    else:  # HH:MM:SS
        h, m, sec = n
        if m > 59 or sec > 59:
            raise ValueError("the minutes and seconds must be 0-59")
    total = ((int(days) * 24 + h) * 60 + m) * 60 + sec
    if total <= 0:
        raise ValueError("a time limit of 0 (SLURM: none at all): give the job's real limit")
    if total > MAX_TIME_DAYS * 86400:
        raise ValueError(f"more than {MAX_TIME_DAYS} days")
    return total


def control_characters(value: str, allowed: str = "") -> str:
    """The first control character of ``value`` (a line break, a tab, NUL, ...) not in ``allowed``, as Python writes
    it, or ""."""
    for c in _CONTROL.findall(value):
        if c not in allowed:
            return repr(c)
    return ""


class LauncherConfigError(ConfigError):
    """A launcher file problem, naming the file and the key."""


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
    # `minimodel plan` and `submit` check each training stage's micro-batch against it (minimodel.cluster.memory); 0 = unknown
    gpu_memory_gib: float = 0.0
    stages: StageResources = field(default_factory=StageResources)
    source: str = field(default="", metadata={"omegaconf_ignore": True})  # the file it came from

    def resources(self, stage: str) -> Resources:
        if stage not in {f.name for f in fields(StageResources)}:
            raise LauncherConfigError(f"{self.source}: no resources for stage {stage!r}")
        return getattr(self.stages, stage)


MAX_CPUS_PER_TASK, MAX_GPUS_PER_NODE, MAX_NODES = 1024, 16, 1024
"""Bounds of a launcher's resources, far above any node of today's clusters: a typo's 10**9 is refused at load."""


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

    _no_control_characters(c, fail)
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
        _validate_stage(c, f.name, getattr(c.stages, f.name), fail)


def _validate_stage(c: LauncherConfig, stage: str, r: Resources, fail: Callable[[str], None]) -> None:
    """One stage's resources: its time in SLURM's range and longer than ``signal_lead_s``, its counts, its memory."""
    key = f"stages.{stage}"
    try:
        seconds = parse_time(r.time)
    except ValueError as e:
        fail(f"{key}.time must be a quoted 'HH:MM:SS' or 'D-HH:MM:SS' (SLURM's time limit), got {r.time!r}: {e}")
    if c.signal_lead_s and seconds <= c.signal_lead_s:  # USR1 at the start: checkpoint and requeue, over and over
        fail(f"{key}.time {r.time!r} ({seconds:,} s) is not longer than signal_lead_s ({c.signal_lead_s:,} s): "
             f"SLURM would send USR1 (stop, checkpoint, requeue) as the job starts, so it would requeue without "
             f"doing any work; give the stage more time, or a smaller signal_lead_s")
    if r.mem and not _MEM.fullmatch(r.mem):
        fail(f"{key}.mem must be sbatch's --mem: a whole number of megabytes or one with a unit K, M, G or T "
             f"(e.g. '64G'; '0': all of the node's memory), got {r.mem!r}")
    if r.nodes < 1 or r.gpus_per_node < 0 or r.cpus_per_task < 1:
        fail(f"{key}: nodes and cpus_per_task must be >= 1 and gpus_per_node >= 0")
    if r.cpus_per_task > MAX_CPUS_PER_TASK or r.gpus_per_node > MAX_GPUS_PER_NODE or r.nodes > MAX_NODES:
        fail(f"{key}: cpus_per_task {r.cpus_per_task:,}, gpus_per_node {r.gpus_per_node:,}, nodes {r.nodes:,}: at most "
             f"{MAX_CPUS_PER_TASK:,} CPUs per task, {MAX_GPUS_PER_NODE} GPUs per node and {MAX_NODES:,} nodes (more "
             f"than any node or job sbatch would place; it would refuse the job after the ones before it were queued)")
    if stage not in TRAINING_STAGES and (r.nodes != 1 or r.gpus_per_node > 1):
        fail(f"{key}: {stage} runs one process: nodes must be 1 and gpus_per_node 0 or 1 "
             f"(got {r.nodes} x {r.gpus_per_node})")
    if r.gpus_per_node == 0 and r.nodes != 1:
        fail(f"{key}: a CPU-only step runs on one node (got nodes: {r.nodes})")
    for i, opt in enumerate(r.extra_sbatch):
        if not opt.startswith("-"):
            fail(f"{key}.extra_sbatch[{i}] must be an sbatch option, got {opt!r}")


def _no_control_characters(c: LauncherConfig, fail: Callable[[str], None]) -> None:
    """Every value written into an sbatch script is one line: a line break (or any control character) in one would
    end its ``#SBATCH`` line there, and SLURM stops reading options at the first line that is not one, so the options
    after it (``--signal``, ``--requeue``) would be dropped without a word. ``setup`` is shell lines: line breaks and
    tabs are its own, any other control character is refused."""
    values: list[tuple[str, str]] = [(k, getattr(c, k)) for k in ("partition", "account", "qos", "constraint")]
    values += [(f"extra_sbatch[{i}]", v) for i, v in enumerate(c.extra_sbatch)]
    values += [(f"trainer[{i}]", v) for i, v in enumerate(c.trainer)]
    for f in fields(StageResources):
        r: Resources = getattr(c.stages, f.name)
        values += [(f"stages.{f.name}.{k}", getattr(r, k)) for k in ("time", "mem", "partition", "qos", "constraint")]
        values += [(f"stages.{f.name}.extra_sbatch[{i}]", v) for i, v in enumerate(r.extra_sbatch)]
    for key, value in values:
        bad = control_characters(str(value))
        if bad:
            fail(f"{key}={value!r} holds the control character {bad}: it is written into the job's sbatch script, "
                 f"where a line break ends the #SBATCH line and SLURM stops reading the options after it; write "
                 f"the value on one line")
    bad = control_characters(c.setup, "\n\t")
    if bad:
        fail(f"setup holds the control character {bad} (a Windows line end \\r?): the shell would read it as part "
             f"of a command; save the file with plain line ends")


def stage_gpus(lc: LauncherConfig) -> dict[str, int]:
    """The GPUs (processes) of each training stage under the launcher: nodes x GPUs per node for the distributed
    stages, one for finetuning (and wherever the launcher gives no GPU)."""
    def gpus(stage: str) -> int:
        r = lc.resources(stage)
        return max(1, r.nodes * r.gpus_per_node) if stage in TRAINING_STAGES else 1

    return {stage: gpus(stage) for stage in TRAINER_STAGES}


def memory_plan(config: str, overrides: list[str], lc: LauncherConfig) -> list[tuple[str, list[PlanRow]]]:
    """The memory plan (``minimodel.cluster.memory``) of every variant of the experiment on the launcher's GPUs, with the
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
            for label, rows in plans for line in misfits([r for r in rows if not r.batch_problem])]


def batch_problems(config: str, overrides: list[str], lc: LauncherConfig) -> list[str]:
    """A sentence per training stage whose micro-batch, times the launcher's GPUs and nodes, does not divide its
    global batch: what the job would refuse at its start (``training.optim.accumulation``), known before any
    job is queued."""
    plans = memory_plan(config, overrides, lc)
    return [f"{label + ': ' if len(plans) > 1 else ''}{r.model.stage}: {r.batch_problem} (launcher {lc.source})"
            for label, rows in plans for r in rows if r.batch_problem]


# ------------------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class PlanRow:
    """One stage of the plan: the estimate at its configured micro-batch and what fits on the card."""

    model: StageModel
    estimate: MemoryEstimate | None  # None: a stage of another system's (shared)
    capacity_gib: float  # the card's memory; 0: unknown
    largest: MemoryEstimate | None  # at the largest allowed micro-batch that fits (None: none does, or unknown)
    choices: tuple[int, ...]  # the micro-batches the stage may use on its GPUs

    @property
    def batch_problem(self) -> str:
        """What the job itself would refuse at its start (``training.optim.accumulation``): a configured micro-batch
        that, times the GPUs, does not divide the global batch; "" when none."""
        if self.estimate is None or self.estimate.micro_batch in self.choices:
            return ""
        e, g = self.estimate, self.model.global_batch
        return (f"{self.key}={e.micro_batch} x {e.gpus} GPU(s) does not divide the global batch {g}: the job would "
                f"stop at its start" + (f" (micro-batches that do: {', '.join(map(str, self.choices[:12]))}"
                                        f"{', ...' if len(self.choices) > 12 else ''})" if self.choices else
                                        f" (and no micro-batch can: {e.gpus} GPUs do not divide {g})"))

    @property
    def fits(self) -> bool | None:
        if self.estimate is None:
            return None
        if self.batch_problem:
            return False
        if not self.capacity_gib:
            return None
        return self.estimate.needed <= self.capacity_gib * GiB

    @property
    def key(self) -> str:
        return "finetune.micro_batch" if self.model.stage == "finetune" else f"{self.model.stage}.optim.micro_batch"


def plan_rows(cfg: ExperimentConfig, gpus: dict[str, int], capacity_gib: float) -> list[PlanRow]:
    """The plan of every training stage; ``gpus``: the GPUs (processes) of each stage (default 1)."""
    out = []
    for sm in stage_models(cfg):
        if not sm.micro_batch:
            out.append(PlanRow(sm, None, capacity_gib, None, ()))
            continue
        n = max(1, gpus.get(sm.stage, 1))
        choices = tuple(micro_batches(sm.global_batch, n))
        fitting = [e for e in (estimate(cfg, sm, mb, n) for mb in choices) if e.needed <= capacity_gib * GiB]
        out.append(PlanRow(sm, estimate(cfg, sm, gpus=n), capacity_gib,
                           fitting[-1] if fitting and capacity_gib else None, choices))
    return out


def gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def plan_table(rows: list[PlanRow]) -> str:
    """The plan as a Markdown table, the allowance stated under it."""
    lines = ["| stage | model | GPUs | micro-batch | seq | precision | weights | grads | AdamW | activations | "
             "logits + backward | total | needed | card | fits | largest micro-batch that fits |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        e, sm = r.estimate, r.model
        if e is None:
            lines.append(f"| {sm.stage} | {sm.note} |" + " |" * 14)
            continue
        card = f"{r.capacity_gib:g}" if r.capacity_gib else "?"
        fits = "**no** (batch)" if r.batch_problem else {None: "?", True: "yes", False: "**no**"}[r.fits]
        if not r.choices:
            largest = f"none: {e.gpus} GPUs do not divide the batch ({sm.global_batch})"
        elif not r.capacity_gib:
            largest = "?"
        else:
            largest = f"{r.largest.micro_batch} ({gib(r.largest.needed)})" if r.largest else "none"
        lines.append(
            f"| {sm.stage} | {sm.note} | {e.gpus} | {e.micro_batch} | {e.seq_len} | {e.precision} | {gib(e.weights)} | "
            f"{gib(e.gradients + e.ddp_buckets)} | {gib(e.optimizer)} | {gib(e.activations + e.weight_copies)} | "
            f"{gib(e.logits + e.backward)} | {gib(e.total)} | {gib(e.needed)} | {card} | {fits} | {largest} |")
    note = (f"GiB per GPU, eager (torch.compile needs less). total: the tensors at the peak of an update (grads "
            f"include DDP's buckets on several GPUs, activations mixed precision's weight copies); needed: total "
            f"+ {FRAGMENTATION:.0%} (allocator) + {CONTEXT_GIB:g} GiB (CUDA context, cuBLAS, NCCL). Finetuning at the "
            f"longest max_len of its tasks.")
    return "\n".join(lines) + "\n\n" + note


def misfits(rows: list[PlanRow]) -> list[str]:
    """One sentence per stage that would not fit its card, naming the micro-batch that would."""
    out = []
    for r in rows:
        if r.fits is not False or r.estimate is None:
            continue
        if r.batch_problem:
            out.append(f"{r.model.stage}: {r.batch_problem}")
            continue
        e = r.estimate
        if r.largest:
            fix = f"{r.key}={r.largest.micro_batch} would ({gib(r.largest.needed)} GiB)"
        elif not r.choices:
            fix = f"no micro-batch works: {e.gpus} GPUs do not divide the global batch {r.model.global_batch}"
        else:
            fix = (f"no micro-batch dividing {r.model.global_batch // e.gpus} (the global batch per GPU) fits: use "
                   f"more GPUs or a card with more memory")
        out.append(f"{r.model.stage} needs about {gib(e.needed)} GiB per GPU at {r.key}={e.micro_batch}, more than "
                   f"the card's {r.capacity_gib:g} GiB: {fix}")
    return out
