"""The steps of an experiment, in order, with their dependencies: what `minimodel run` executes
locally and what `minimodel submit` turns into dependent SLURM jobs.

One experiment file is one system (``experiments/minijoint.yaml``); ``sweep:`` entries expand it into
variants (the depth sweep). Which steps a system has and which runs it shares with another system
(MiniPost's step 1 and finetuned models are BL_BASE's) come from its declaration in ``systems.py``.
Data are prepared one step per language (``prepare-{lang}``): pretraining waits for the source language only,
a target language's adaptation and evaluation for that language only; a bridge that reads other languages' text
(``bridge.langs``) also for their ``prepare-{lang}-source`` steps. Nothing here imports torch."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from minimodel.config.schema import ExperimentConfig
from minimodel.errors import ConfigError
from minimodel.experiment import load_experiment
from minimodel.log import get_logger
from minimodel.store.layout import is_done
from minimodel.systems import Runs, stage_plan

log = get_logger(__name__)


@dataclass(frozen=True)
class Step:
    name: str  # unique within the plan: pretrain, bridge, adapt-de, finetune-xnli-s1, evaluate, ...
    stage: str  # prepare | pretrain | bridge | adapt | finetune | evaluate | report (picks cluster resources)
    args: tuple[str, ...]  # `minimodel` arguments: (command, config, key=value, ...)
    after: tuple[str, ...] = ()
    distributed: bool = False  # a multi-GPU step: training (srun + DDP) or evaluation (one process per GPU)
    run_dir: str = ""  # a training step's run directory: its done.json says the step is finished
    stage_name: str = ""  # that run's name for identity.check_finished (pretrain, adapt/de, finetune/xnli/seed1, ...)
    lang: str = ""  # a prepare step's language: {prepared_dir}/{lang}/done.json says it is finished (is_prepared)


@dataclass
class Variant:
    """One system run of the experiment (a sweep gives several)."""

    label: str  # the system run's name in run directories and results (``StagePlan.runs.label``)
    overrides: list[str]
    cfg: ExperimentConfig = field(repr=False)
    entry: str = ""  # the sweep entry it comes from ("" without a sweep)


def variants(config: str | Path, overrides: list[str]) -> list[Variant]:
    """The system runs of ``config``: one, or one per ``sweep:`` entry. The command line wins over a sweep for the keys
    it sets. For the keys that name a run (``SELECTORS``: system, tag) an entry that sets another value is left out,
    one that sets the same value or none is kept (``minimodel run demo.yaml system=bl_base`` runs the demo's BL_BASE
    entry alone; where no entry is left, the command line alone is the one run); any other key the command line
    sets overrides the entries' (``data.prepared_dir=X``: every variant prepares there)."""
    try:
        base: ExperimentConfig | None = load_experiment(config, overrides)
        sweep = base.sweep  # type: ignore[union-attr]
    except ConfigError:  # the command line's words may be valid only with an entry's (system=minijoint: its heads)
        base = None
        sweep = load_experiment(config, [o for o in overrides if _key(o) == "sweep"]).sweep
        if not sweep:
            raise
    if base is not None and not sweep:
        return [Variant(stage_plan(base, "adapt").runs.label, list(overrides), base)]
    given = {_key(o): _value(o) for o in overrides if "=" in o}
    out, left_out = [], []
    for entry in sweep:
        try:
            words = shlex.split(entry)  # key=value words; quote a value holding spaces: k='[{a: 1}, {a: 2}]'
        except ValueError as e:
            raise ConfigError(f"{config}: sweep entry {entry!r}: {e}") from e
        if any(_key(w) in SELECTORS and _key(w) in given and _value(w) != given[_key(w)] for w in words):
            left_out.append(entry)
            continue
        extra = [*words, *overrides]  # the command line last: it wins
        cfg = load_experiment(config, extra)
        out.append(Variant(stage_plan(cfg, "adapt").runs.label, extra, cfg, entry))
    if left_out:
        keys = sorted({_key(w) for e in left_out for w in shlex.split(e)} & set(given) & set(SELECTORS))
        log.info(f"{config}: the command line's {', '.join(f'{k}={given[k]}' for k in keys)} leaves out the sweep "
                 f"entries {', '.join(repr(e) for e in left_out)}" + ("" if out else ": the command line alone is the "
                                                                           "one run"))
    if not out:
        base = load_experiment(config, overrides)
        return [Variant(stage_plan(base, "adapt").runs.label, list(overrides), base)]
    labels = [v.label for v in out]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{config}: two sweep entries give the same system run ({', '.join(labels)}): "
                          "give each a tag= (or, for several heads of one MiniJoint model, an adapt.head=)")
    return out


SELECTORS = ("system", "tag")
"""The keys that name a system run: on the command line they pick the sweep entries that have them."""


def _key(word: str) -> str:
    """The config key of a ``key=value`` word (``+key=`` / ``~key`` forms: the key)."""
    return word.split("=", 1)[0].lstrip("+~")


def _value(word: str) -> str:
    return word.split("=", 1)[1].strip() if "=" in word else ""


def check_reused(config: str, overrides: list[str], cfg: ExperimentConfig, r: Runs, bridge: bool,
                 adapt_missing: bool = False) -> list[str]:
    """``models_from``: every run this experiment reads from the other one is finished, else a ConfigError naming
    the first that is not and the commands that finish it. A target language the reused experiment was never
    adapted to (``Layout.adapt``: this experiment's own run of it) is returned instead when ``adapt_missing``
    (``minimodel run --adapt-missing``): the plan then adapts it in this experiment's own directory, said in the
    log; the reused experiment is never written."""
    needed = [("pretraining", r.pretrain), ("bridge", r.bridge if bridge else None)]
    for what, where in needed:
        if where is not None and not is_done(where):
            raise ConfigError(f"models_from={cfg.models_from}: this experiment reuses the {what} {where}, which is "
                              f"not finished (no done.json); finish it in experiment {cfg.models_from} (e.g. "
                              f"`minimodel run` on its experiment file with the same settings) first: this one "
                              f"never trains or writes there")
    own = r.layout.root.resolve()
    for lang in cfg.target_langs:  # a run of the reused experiment that is there but not finished: finish it there
        where = r.adapt(lang)
        if not where.resolve().is_relative_to(own) and not is_done(where):
            raise ConfigError(
                f"models_from={cfg.models_from}: this experiment reuses the adaptation to {lang} {where}, which is not "
                f"finished (no done.json); finish it in experiment {cfg.models_from} (e.g. `minimodel adapt` on its "
                f"experiment file with lang={lang}) first: this one never trains or writes there")
    missing = [lang for lang in cfg.target_langs if not is_done(r.adapt(lang))]
    if missing and not adapt_missing:
        lang = missing[0]
        args = shlex.join([config, *overrides])
        raise ConfigError(
            f"models_from={cfg.models_from}: experiment {cfg.models_from} has no adaptation to {lang} for {r.label} "
            f"({r.layout.models_root / r.label / 'adapt' / lang}), and this experiment has no finished one of its own "
            f"({r.adapt(lang)}). Adapt it here, in this experiment's own runs (the reused experiment is never "
            f"written), once per system: `minimodel prepare {args} --langs={lang}` then `minimodel adapt {args} "
            f"lang={lang}`; or let this run do it: `minimodel run {args} --adapt-missing` (it adapts "
            f"{', '.join(missing)} into {r.layout.root}). A corpus of your own for it: see docs/running.md "
            f"(reusing models)")
    return missing


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


def prepare_steps(config: str, vs: list[Variant]) -> tuple[list[Step], dict[tuple[str, ...], str]]:
    """One prepare step per language (source language first, then the targets, then the languages only step 1b reads:
    ``bridge.langs``; each of those also gets ``prepare-{lang}-source``, its text in the source tokenizer), shared by
    every variant that
    prepares that language into the same place (``{prepared_dir}/{lang}``, or the source language's Hugging Face
    shards); a variant that prepares it elsewhere gets a step of its own (``{label}:prepare-{lang}``). Two
    variants that would prepare a language into the same place with other data settings are refused (one would
    overwrite, or refuse, the other's tokenizer and shards). Returns the steps and, per (variant label,
    language), the name of the step that variant waits for."""
    steps: list[Step] = []
    by_place: dict[Path, tuple[Step, Variant]] = {}  # the language's done.json -> its step and the variant it is from
    # (variant label, lang) -> the step it waits for; (variant label, lang, "source"): its text in the source tokenizer
    names: dict[tuple[str, ...], str] = {}
    from minimodel.data.prepare import bridge_reads, prepared_paths  # numpy and sentencepiece, no torch

    wanted = [(v, v.cfg.source_lang) for v in vs] + [(v, lang) for v in vs for lang in v.cfg.target_langs]
    # bridge.langs: a language step 1b reads needs its own data too (the held-out text the bridge leaves out)
    wanted += [(v, lang) for v in vs for lang in bridge_reads(v.cfg) if lang not in v.cfg.target_langs]
    # then its text in the source tokenizer, a step of its own (``--only=source``) after the language's own
    jobs = [(v, lang, False) for v, lang in wanted] + [(v, lang, True) for v in vs for lang in bridge_reads(v.cfg)]
    for v, lang, in_source in jobs:
        cfg = v.cfg
        paths = prepared_paths(cfg, lang, in_source)
        place = paths.done.absolute()
        if place in by_place:
            step, first = by_place[place]
            check_same_data(config, lang, first, v, in_source)
        else:
            suffix = "-source" if in_source else ""
            taken = any(s.name.split(":")[-1] == f"prepare-{lang}{suffix}" for s in steps)
            name = f"{v.label}:prepare-{lang}{suffix}" if taken else f"prepare-{lang}{suffix}"
            # adapt.vocabulary=extend: the language's tokenizer extends the source language's; bridge.langs: the text
            # is encoded by the source language's tokenizer, and its held-out part is read from the language's own
            after = ((names[(v.label, cfg.source_lang)], names[(v.label, lang)]) if in_source else
                     (names[(v.label, cfg.source_lang)],) if paths.base else ())
            only = ("--only=source",) if in_source else ("--only=own",) if lang in bridge_reads(cfg) else ()
            step = Step(name, "prepare", ("prepare", config, *v.overrides, f"--langs={lang}", *only), after, lang=lang)
            by_place[place] = (step, v)
            steps.append(step)
        names[(v.label, lang, "source") if in_source else (v.label, lang)] = step.name
    return steps, names


def check_same_data(config: str, lang: str, a: Variant, b: Variant, in_source: bool = False) -> None:
    """Two variants share a language's prepare step: a ConfigError naming their sweep entries unless they prepare it
    with the same data settings (``data.prepare.prepare_settings``: corpus, tokenizer, shards)."""
    from minimodel.data.prepare import prepare_settings  # numpy and sentencepiece, no torch

    sa, sb = prepare_settings(a.cfg, lang, in_source), prepare_settings(b.cfg, lang, in_source)
    if sa != sb:
        keys = ", ".join(f"{k}: {sa.get(k)!r} vs {sb.get(k)!r}" for k in sorted({*sa, *sb}) if sa.get(k) != sb.get(k))
        raise ConfigError(f"{config}: sweep entries {a.entry!r} and {b.entry!r} prepare {lang} into the same "
                          f"{Path(a.cfg.data.prepared_dir) / lang} with other data settings ({keys}); every variant "
                          f"shares one prepare step per language: give the sweep entry {b.entry!r} a data.prepared_dir "
                          f"of its own, or the same data settings")


def plan(config: str | Path, overrides: list[str] | None = None, adapt_missing: bool = False) -> list[Step]:
    """Every step of the experiment (all variants), dependencies first: the prepare steps (one per language), then
    per variant its training, finetuning and per language adaptation and evaluation, then the report.
    ``adapt_missing``: with ``models_from``, adapt the target languages the reused experiment lacks into it."""
    overrides = list(overrides or [])
    config = str(config)
    vs = variants(config, overrides)
    steps, prepare_of = prepare_steps(config, vs)
    evaluations = []
    shared: dict[Path, str] = {}  # run dir -> the step that produces it (a system may reuse another's runs)
    for v in vs:
        cfg, o = v.cfg, v.overrides
        sp = stage_plan(cfg, "pretrain")  # (the system's steps and runs: the same in every stage's plan)
        system, r = sp.system, sp.runs
        p = "" if len(vs) == 1 else f"{v.label}:"

        def step(name: str, stage: str, args: list[str], after: list[str], distributed: bool = False,
                 run_dir: Path | None = None, stage_name: str = "") -> Step:
            return Step(p + name, stage, (args[0], config, *o, *args[1:]), tuple(dict.fromkeys(after)), distributed,
                        str(run_dir) if run_dir is not None else "", stage_name)

        def data(lang: str) -> str:
            return prepare_of[(v.label, lang)]

        steps_of = sp.steps
        reused = bool(cfg.models_from)  # steps 1, 1b and 2 are another experiment's: finished, never rerun here
        missing = check_reused(config, o, cfg, r, "bridge" in steps_of, adapt_missing) if reused else []
        # the step that makes the primary model; none of this experiment's (an external model, or another
        # experiment's): the source language's prepare step (its tokenizer and shards)
        primary = data(cfg.source_lang)
        if r.pretrain is not None and not reused:
            if r.pretrain not in shared:
                owner = ["system=" + system.primary_from, "tag="] if system.primary_from else []
                steps.append(step("pretrain", "pretrain", ["pretrain", *owner], [primary], True, r.pretrain,
                                  "pretrain"))
                shared[r.pretrain] = p + "pretrain"
            primary = shared[r.pretrain]
        body = primary
        if "bridge" in steps_of and not reused:
            if r.bridge not in shared:
                langs = [prepare_of[(v.label, lang, "source")] for lang in cfg.bridge.langs]
                steps.append(step("bridge", "bridge", ["bridge"], [primary, *langs], True, r.bridge, "bridge"))
                shared[r.bridge] = p + "bridge"
            body = shared[r.bridge]
            if r.pretrain is None:
                primary = body  # an external primary model: steps 3-4 wait for the bridge's checks of it
        finetunes = finetune_steps(cfg, r, system.mini_finetune, step, primary, shared, p, steps)
        # step 4 per language, as soon as that language's embeddings, its prepared data (the target tokenizer) and
        # the finetuned models are there (one process per GPU when the launcher gives the job several)
        for lang in cfg.target_langs:
            adapts_here = not reused or lang in missing
            if adapts_here:
                args = ["adapt", f"lang={lang}"]  # with models_from: into this experiment's own runs (Layout.adapt)
                steps.append(step(f"adapt-{lang}", "adapt", args, [body, data(lang)], True, r.adapt(lang),
                                  f"adapt/{lang}"))
            adapted = [p + f"adapt-{lang}"] if adapts_here else []
            steps.append(step(f"evaluate-{lang}", "evaluate", ["evaluate", f"lang={lang}"],
                              [*adapted, *finetunes, data(lang)], True))
            evaluations.append(p + f"evaluate-{lang}")
            if cfg.evaluate.dev and cfg.evaluate.split != "dev":  # the dev rows the report's checks read
                steps.append(step(f"evaluate-dev-{lang}", "evaluate", ["evaluate", f"lang={lang}", "evaluate.split=dev"],
                                  [*adapted, *finetunes, data(lang)], True))
                evaluations.append(p + f"evaluate-dev-{lang}")
    steps.append(Step("report", "report", ("report", config, *overrides), tuple(evaluations)))
    return steps
