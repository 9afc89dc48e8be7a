"""The steps of an experiment, in order, with their dependencies: what `minimodel run` executes
locally and what `minimodel submit` turns into dependent SLURM jobs.

One experiment file is one system (``experiments/minijoint.yaml``); ``sweep:`` entries expand it into
variants (the depth sweep). Which steps a system has and which runs it shares with another system
(MiniPost's step 1 and finetuned models are BL_BASE's) come from its declaration in ``systems.py``.
Nothing here imports torch."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from minimodel.config import ConfigError, ExperimentConfig, load_config
from minimodel.layout import is_done
from minimodel.systems import Runs, external_primary, of, runs


@dataclass(frozen=True)
class Step:
    name: str  # unique within the plan: pretrain, bridge, adapt-de, finetune-xnli-s1, evaluate, ...
    stage: str  # prepare | pretrain | bridge | adapt | finetune | evaluate | report (picks cluster resources)
    args: tuple[str, ...]  # `minimodel` arguments: (command, config, key=value, ...)
    after: tuple[str, ...] = ()
    distributed: bool = False  # a multi-GPU step: training (srun + DDP) or evaluation (one process per GPU)
    run_dir: str = ""  # a training step's run directory: its done.json says the step is finished
    stage_name: str = ""  # that run's name for config.check_finished (pretrain, adapt/de, finetune/xnli/seed1, ...)


@dataclass
class Variant:
    """One system run of the experiment (a sweep gives several)."""

    label: str  # the system run's name in run directories and results (``systems.head_label``)
    overrides: list[str]
    cfg: ExperimentConfig = field(repr=False)


def variants(config: str | Path, overrides: list[str]) -> list[Variant]:
    base = load_config(config, overrides)
    if not base.sweep:
        return [Variant(runs(base).label, list(overrides), base)]
    out = []
    for entry in base.sweep:
        try:
            words = shlex.split(entry)  # key=value words; quote a value holding spaces: k='[{a: 1}, {a: 2}]'
        except ValueError as e:
            raise ConfigError(f"{config}: sweep entry {entry!r}: {e}") from e
        extra = [*overrides, *words]
        cfg = load_config(config, extra)
        out.append(Variant(runs(cfg).label, extra, cfg))
    labels = [v.label for v in out]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{config}: two sweep entries give the same system run ({', '.join(labels)}): "
                          "give each a tag= (or, for several heads of one MiniJoint model, an adapt.head=)")
    return out


def check_reused(cfg: ExperimentConfig, r: Runs, bridge: bool) -> None:
    """``models_from``: every run this experiment reads from the other one is finished (a ConfigError naming the
    first that is not, and how to finish it)."""
    needed = [("pretraining", r.pretrain), ("bridge", r.bridge if bridge else None),
              *((f"adaptation to {lang}", r.adapt(lang)) for lang in cfg.target_langs)]
    for what, where in needed:
        if where is not None and not is_done(where):
            raise ConfigError(f"models_from={cfg.models_from}: this experiment reuses the {what} {where}, which is "
                              f"not finished (no done.json); finish it in experiment {cfg.models_from} (e.g. "
                              f"`minimodel run` on its experiment file with the same settings) first: this one "
                              f"never trains or writes there")


def finetune_steps(cfg: ExperimentConfig, r: Runs, mini: bool, step: Callable[..., Step], primary: str,
                   shared: dict[Path, str], p: str, steps: list[Step]) -> list[str]:
    """Append the finetuning steps of one variant (a finetuned model shared with another system is one step)
    and return the names of those its evaluations wait for."""
    finetunes = []
    for task in cfg.finetune.tasks:
        for seed in cfg.finetune.seeds:
            where = r.finetune(task, seed)
            if where not in shared:
                steps.append(step(f"finetune-{task}-s{seed}", "finetune",
                                  ["finetune", f"task={task}", f"seed={seed}"], [primary], run_dir=where,
                                  stage_name=f"finetune/{task}/seed{seed}"))
                shared[where] = p + f"finetune-{task}-s{seed}"
            finetunes.append(shared[where])
    if mini:
        for task in cfg.finetune.mini_tasks:
            for seed in cfg.finetune.seeds:
                steps.append(step(f"finetune-mini-{task}-s{seed}", "finetune",
                                  ["finetune", f"task={task}", f"seed={seed}", "body=mini"], [primary]))
                finetunes.append(p + f"finetune-mini-{task}-s{seed}")
    return finetunes


def plan(config: str | Path, overrides: list[str] | None = None) -> list[Step]:
    """Every step of the experiment (all variants), dependencies first."""
    overrides = list(overrides or [])
    config = str(config)
    vs = variants(config, overrides)
    first = vs[0].cfg
    langs = [first.source_lang, *first.target_langs]
    steps = [Step("prepare", "prepare", ("prepare", config, *overrides, f"--langs={','.join(langs)}"))]
    evaluations = []
    shared: dict[Path, str] = {}  # run dir -> the step that produces it (a system may reuse another's runs)
    for v in vs:
        cfg, o = v.cfg, v.overrides
        system, r = of(cfg), runs(cfg)
        p = "" if len(vs) == 1 else f"{v.label}:"

        def step(name: str, stage: str, args: list[str], after: list[str], distributed: bool = False,
                 run_dir: Path | None = None, stage_name: str = "") -> Step:
            return Step(p + name, stage, (args[0], config, *o, *args[1:]), tuple(after), distributed,
                        str(run_dir) if run_dir is not None else "", stage_name)

        steps_of = system.steps(external_primary(cfg))
        reused = bool(cfg.models_from)  # steps 1, 1b and 2 are another experiment's: finished, never rerun here
        if reused:
            check_reused(cfg, r, "bridge" in steps_of)
        primary = "prepare"  # the step that makes the primary model (none of this experiment's: prepare)
        if r.pretrain is not None and not reused:
            if r.pretrain not in shared:
                owner = ["system=" + system.primary_from, "tag="] if system.primary_from else []
                steps.append(step("pretrain", "pretrain", ["pretrain", *owner], ["prepare"], True, r.pretrain,
                                  "pretrain"))
                shared[r.pretrain] = p + "pretrain"
            primary = shared[r.pretrain]
        body = primary
        if "bridge" in steps_of and not reused:
            if r.bridge not in shared:
                steps.append(step("bridge", "bridge", ["bridge"], [primary], True, r.bridge, "bridge"))
                shared[r.bridge] = p + "bridge"
            body = shared[r.bridge]
            if r.pretrain is None:
                primary = body  # an external primary model: steps 3-4 wait for the bridge's checks of it
        finetunes = finetune_steps(cfg, r, system.mini_finetune, step, primary, shared, p, steps)
        # step 4 per language, as soon as that language's embeddings and the finetuned models are there (one
        # process per GPU when the launcher gives the job several)
        for lang in cfg.target_langs:
            if not reused:
                steps.append(step(f"adapt-{lang}", "adapt", ["adapt", f"lang={lang}"], [body], True, r.adapt(lang),
                                  f"adapt/{lang}"))
            steps.append(step(f"evaluate-{lang}", "evaluate", ["evaluate", f"lang={lang}"],
                              [*([] if reused else [p + f"adapt-{lang}"]), *finetunes], True))
            evaluations.append(p + f"evaluate-{lang}")
    steps.append(Step("report", "report", ("report", config, *overrides), tuple(evaluations)))
    return steps
