"""The steps of an experiment, in order, with their dependencies: what `minimodel run` executes
locally and what `minimodel submit` turns into dependent SLURM jobs.

One experiment file is one system (``experiments/minijoint.yaml``); ``sweep:`` entries expand it into
variants (the depth sweep). MiniPost's step 1 is BL_BASE's pretraining (shared run directory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from minimodel.config import ExperimentConfig, load_config
from minimodel.stages.finetune import finetune_dir


@dataclass(frozen=True)
class Step:
    name: str  # unique within the plan: pretrain, bridge, adapt-de, finetune-xnli-s1, evaluate, ...
    stage: str  # prepare | pretrain | bridge | adapt | finetune | evaluate | report (picks cluster resources)
    args: tuple[str, ...]  # `minimodel` arguments: (command, config, key=value, ...)
    after: tuple[str, ...] = ()
    distributed: bool = False  # a multi-GPU training step (srun + DDP)


@dataclass
class Variant:
    """One system run of the experiment (a sweep gives several)."""

    label: str
    overrides: list[str]
    cfg: ExperimentConfig = field(repr=False)


def variants(config: str | Path, overrides: list[str]) -> list[Variant]:
    base = load_config(config, overrides)
    if not base.sweep:
        return [Variant(base.label, list(overrides), base)]
    out = []
    for entry in base.sweep:
        extra = [*overrides, *entry.split()]
        cfg = load_config(config, extra)
        out.append(Variant(cfg.label, extra, cfg))
    return out


def plan(config: str | Path, overrides: list[str] | None = None) -> list[Step]:
    """Every step of the experiment (all variants), dependencies first."""
    overrides = list(overrides or [])
    config = str(config)
    vs = variants(config, overrides)
    first = vs[0].cfg
    langs = [first.source_lang, *first.target_langs]
    steps = [Step("prepare", "prepare", ("prepare", config, *overrides, f"--langs={','.join(langs)}"))]
    evaluations = []
    shared: dict[Path, str] = {}  # run dir -> the step that produces it (MiniPost reuses BL_BASE's runs)
    for v in vs:
        cfg, o = v.cfg, v.overrides
        p = "" if len(vs) == 1 else f"{v.label}:"

        def step(name: str, stage: str, args: list[str], after: list[str], distributed: bool = False) -> Step:
            return Step(p + name, stage, (args[0], config, *o, *args[1:]), tuple(after), distributed)

        if cfg.system == "minipost" and not cfg.bridge.source:
            base_dir = cfg.run_dir.parent / "bl_base" / "pretrain"
            if base_dir not in shared:
                steps.append(step("pretrain", "pretrain", ["pretrain", "system=bl_base", "tag="], ["prepare"], True))
                shared[base_dir] = p + "pretrain"
            primary = shared[base_dir]
            steps.append(step("bridge", "bridge", ["bridge"], [primary], True))
            body = p + "bridge"
        elif cfg.system == "minipost":
            steps.append(step("bridge", "bridge", ["bridge"], ["prepare"], True))
            body = primary = p + "bridge"
        else:
            steps.append(step("pretrain", "pretrain", ["pretrain"], ["prepare"], True))
            body = primary = p + "pretrain"
            shared[cfg.run_dir / "pretrain"] = primary
        adapts = []
        for lang in cfg.target_langs:
            steps.append(step(f"adapt-{lang}", "adapt", ["adapt", f"lang={lang}"], [body], True))
            adapts.append(p + f"adapt-{lang}")
        finetunes = []
        for task in cfg.finetune.tasks:
            for seed in cfg.finetune.seeds:
                where = finetune_dir(cfg, task, seed)
                if where not in shared:
                    steps.append(step(f"finetune-{task}-s{seed}", "finetune",
                                      ["finetune", f"task={task}", f"seed={seed}"], [primary]))
                    shared[where] = p + f"finetune-{task}-s{seed}"
                finetunes.append(shared[where])
        if cfg.system == "minijoint":
            for task in cfg.finetune.mini_tasks:
                for seed in cfg.finetune.seeds:
                    steps.append(step(f"finetune-mini-{task}-s{seed}", "finetune",
                                      ["finetune", f"task={task}", f"seed={seed}", "body=mini"], [primary]))
                    finetunes.append(p + f"finetune-mini-{task}-s{seed}")
        steps.append(step("evaluate", "evaluate", ["evaluate"], adapts + finetunes))
        evaluations.append(p + "evaluate")
    steps.append(Step("report", "report", ("report", config, *overrides), tuple(evaluations)))
    return steps
