"""The systems, declared once. This is the only module that knows system names.

A system says where its step-2 body comes from, which primary model its adapted embeddings plug
into, which runs it shares with another system, and which steps it has; its costs follow from its
steps (A1 for pretraining, A4 for MiniPost's bridge, A3 for adaptation over the step-2 body's
depth). For a configuration and a stage, ``stage_plan`` resolves all of it once into a ``StagePlan``: stages,
pipeline, memory plan, cost table and command line read that, never ``cfg.system``.

Adding a system: one ``System(...)`` entry in ``REGISTRY`` (see docs/architecture.md), plus stage
code only for what is really new (a new ``Body`` kind needs a loader in ``stages/adapt.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from minimodel.config.schema import PRIMARY, ExperimentConfig, is_hf_source, pretrain_seed_suffix
from minimodel.errors import ConfigError
from minimodel.store.layout import Layout, last_checkpoint


class Body(Enum):
    """Where step 2 (embedding adaptation) gets its frozen body."""

    OWN = "own"  # the system's own pretrained model (standard adaptation)
    HEAD = "head"  # layers 1..N of its own pretrained model + the secondary MLM head after layer N (MiniJoint)
    BRIDGE = "bridge"  # the mini-model built and trained by step 1b (MiniPost)


FORMULAS = {"pretrain": "A1", "bridge": "A4", "adapt": "A3"}  # the paper's appendix A.1


@dataclass(frozen=True)
class System:
    name: str  # the value of ``system:`` in a config
    title: str  # as the paper writes it
    body: Body
    mini_heads: int  # how many secondary MLM heads ``model.mini_heads`` must hold at least
    primary_from: str = ""  # "" = its own step 1; a system name = that system's pretraining and finetuned models
    bridge: bool = False  # has step 1b
    mini_finetune: bool = False  # its mini-model can be finetuned on its own (``body=mini``, Table 5)
    reference: bool = False  # the reference of every near-maximal target and speedup
    forgetting: bool = False  # its step 1 may use active forgetting (pretrain.forget_every)

    def steps(self, external_primary: bool = False) -> tuple[str, ...]:
        """The training steps, in order (prepare, evaluate and report come with every system)."""
        own_pretrain = not self.primary_from and not external_primary
        return (("pretrain",) if own_pretrain else ()) + (("bridge",) if self.bridge else ()) + ("adapt", "finetune")


REGISTRY: dict[str, System] = {s.name: s for s in (
    System("bl_base", "BL_BASE", Body.OWN, mini_heads=0, reference=True, forgetting=True),
    System("bl_small", "BL_SMALL", Body.OWN, mini_heads=0),
    System("minijoint", "MiniJoint", Body.HEAD, mini_heads=1, mini_finetune=True, forgetting=True),
    System("minipost", "MiniPost", Body.BRIDGE, mini_heads=0, primary_from="bl_base", bridge=True),
)}
ORDER = tuple(REGISTRY)  # the paper's order, used by tables
REFERENCE = next(s.name for s in REGISTRY.values() if s.reference)


def get(name: str) -> System:
    if name not in REGISTRY:
        raise ConfigError(f"unknown system {name!r}; valid systems: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def _of(cfg: ExperimentConfig) -> System:
    return get(cfg.system)


def validate(cfg: ExperimentConfig, source: str) -> None:
    """The system-specific checks of a loaded config (``experiment.load_experiment`` runs them after the checks that
    hold for every system, ``config.checks.validate``)."""
    def fail(msg: str) -> None:
        raise ConfigError(f"{source}: {msg}")

    if cfg.system not in REGISTRY:
        fail(f"system must be one of {', '.join(REGISTRY)}, got {cfg.system!r}")
    s = _of(cfg)
    heads = cfg.model.mini_heads
    if s.mini_heads and len(heads) < s.mini_heads:
        fail(f"system {s.name} needs at least {s.mini_heads} secondary head(s) (model.mini_heads: [N, ...]), "
             f"got {heads}")
    if not s.mini_heads and heads:
        fail(f"model.mini_heads is only for systems with secondary heads; system {s.name} has {heads}")
    if cfg.pretrain.forget_every and not s.forgetting:
        fail(f"pretrain.forget_every (active forgetting) is for {', '.join(n for n, x in REGISTRY.items() if x.forgetting)}"
             f", not {s.name}")
    head = cfg.adapt.head
    if cfg.adapt.schedule:
        _validate_schedule(cfg, s, fail)
    if s.body is Body.HEAD and not cfg.adapt.schedule:
        if head and head not in cfg.model.head_names:
            fail(f"adapt.head={head!r} is not a head of the model: it has {', '.join(cfg.model.head_names)}")
        if not head and len(heads) > 1:
            fail(f"adapt.head: the model has several secondary heads ({', '.join(cfg.model.head_names[1:])}); "
                 f"name the one step 2 trains over (adapt.head=l{heads[0]}, or primary for the whole model)")
    elif head not in ("", PRIMARY):
        fail(f"adapt.head={head!r}: system {s.name} adapts over its whole model (adapt.head must be empty or "
             f"{PRIMARY!r}); heads after lower layers are for {', '.join(n for n, x in REGISTRY.items() if x.body is Body.HEAD)}")
    if s.bridge and not 1 <= cfg.bridge.depth < cfg.model.layers:
        fail(f"bridge.depth must be in 1..{cfg.model.layers - 1}, got {cfg.bridge.depth}")
    if cfg.model.vocab_size != cfg.data.vocab_size and not _source_tokenizer(cfg):
        # (with a Hugging Face source tokenizer the model's vocabulary is that tokenizer's, checked when loaded)
        fail(f"model.vocab_size ({cfg.model.vocab_size}) must equal data.vocab_size ({cfg.data.vocab_size})")
    if cfg.body == "mini" and not s.mini_finetune:
        fail(f"body=mini (finetuning the mini-model on its own) is for "
             f"{', '.join(n for n, x in REGISTRY.items() if x.mini_finetune)}")
    if cfg.body == "mini" and head == PRIMARY:
        fail("body=mini finetunes the mini-model of a secondary head; adapt.head=primary names the whole model")
    _validate_readout(cfg, s, fail)


def _validate_readout(cfg: ExperimentConfig, s: System, fail: Callable[[str], None]) -> None:
    """``finetune.layer`` must be a layer of the mini-model too where one is finetuned on its own."""
    mini = cfg.body == "mini" or (s.mini_finetune and cfg.finetune.mini_tasks)
    if mini and cfg.finetune.layer > _adapt_depth(cfg):
        fail(f"finetune.layer={cfg.finetune.layer} is above the mini-model's {_adapt_depth(cfg)} layers, which "
             f"{'body=mini' if cfg.body == 'mini' else 'finetune.mini_tasks'} finetunes: set finetune.layer to "
             f"1..{_adapt_depth(cfg)} (or 0, the last){'' if cfg.body == 'mini' else ', or finetune.mini_tasks=[]'}")


def _validate_schedule(cfg: ExperimentConfig, s: System, fail: Callable[[str], None]) -> None:
    heads_of = [n for n, x in REGISTRY.items() if x.body is Body.HEAD]
    if s.body is not Body.HEAD:
        fail(f"adapt.schedule (progressive adaptation over several heads) is for {', '.join(heads_of)}; "
             f"system {s.name} has no secondary heads")
    if cfg.adapt.head:
        fail("set adapt.head or adapt.schedule, not both (the schedule names the head of each phase)")
    updates, ends, last_depth = cfg.adapt.optim.updates, [], 0
    for i, phase in enumerate(cfg.adapt.schedule):
        where = f"adapt.schedule[{i}]"
        if phase.head not in cfg.model.head_names:
            fail(f"{where}.head={phase.head!r} is not a head of the model: it has {', '.join(cfg.model.head_names)}")
        depth = cfg.model.head_depth(phase.head)
        if depth <= last_depth:
            fail(f"{where}.head={phase.head}: each phase must run over a deeper head than the one before")
        last_depth = depth
        last = i == len(cfg.adapt.schedule) - 1
        if phase.until == 0 and last:
            ends.append(updates)
            continue
        if phase.until <= 0 or (phase.until > 1 and phase.until != int(phase.until)):
            fail(f"{where}.until={phase.until}: a fraction of adapt.optim.updates in (0, 1] or a whole number of "
                 f"updates (0 only on the last phase: to the end)")
        ends.append(_phase_end(phase.until, updates))
        if not (ends[-2] if len(ends) > 1 else 0) < ends[-1] <= updates:
            fail(f"{where}.until={phase.until} ends at update {ends[-1]}: phases must end after the previous one "
                 f"and at most at adapt.optim.updates ({updates})")
    if ends[-1] != updates:
        fail(f"adapt.schedule ends at update {ends[-1]}, before adapt.optim.updates ({updates}): the last phase "
             f"needs until: 0 (to the end)")


@dataclass(frozen=True)
class Phase:
    """One phase of step 2: over ``head`` (``depth`` layers) from update ``start`` to ``end``."""

    head: str
    depth: int
    start: int
    end: int


def _phase_end(until: float, updates: int) -> int:
    """The update a phase ends at: ``until`` as a fraction of ``updates`` when <= 1, else an update count."""
    return round(until * updates) if until <= 1 else int(until)


def _adapt_phases(cfg: ExperimentConfig) -> tuple[Phase, ...]:
    """Step 2's phases: those of ``adapt.schedule`` (progressive adaptation), else one over ``_adapt_head``."""
    updates = cfg.adapt.optim.updates
    if not cfg.adapt.schedule:
        return (Phase(_adapt_head(cfg), _adapt_depth(cfg), 0, updates),)
    out, start = [], 0
    for i, p in enumerate(cfg.adapt.schedule):
        last = i == len(cfg.adapt.schedule) - 1
        end = updates if last else _phase_end(p.until, updates)
        out.append(Phase(p.head, cfg.model.head_depth(p.head), start, end))
        start = end
    return tuple(out)


def _external_primary(cfg: ExperimentConfig) -> bool:
    """The primary model is a file or a public model named by ``bridge.source``, not a run of this experiment: for
    a system with a bridge (MiniPost, which bridges from it) and for the system whose primary model a bridge system
    shares (BL_BASE, whose standard adaptation and finetunings then run over that model, with no step 1)."""
    s = _of(cfg)
    return bool(cfg.bridge.source) and (s.bridge or any(x.primary_from == s.name for x in REGISTRY.values()))


def _source_tokenizer(cfg: ExperimentConfig) -> str:
    """The source language's Hugging Face tokenizer, "" for the SentencePiece model `prepare` trains."""
    if cfg.data.source_tokenizer:
        return cfg.data.source_tokenizer
    if _external_primary(cfg) and is_hf_source(cfg.bridge.source):
        return cfg.bridge.source
    return ""


def _adapt_head(cfg: ExperimentConfig) -> str:
    """The MLM head whose layers step 2 trains over: ``adapt.head``, else the model's one secondary head
    (``Body.HEAD``), else the primary head. With ``adapt.schedule``: the deepest phase's head."""
    if _of(cfg).body is not Body.HEAD:
        return PRIMARY
    if cfg.adapt.schedule:
        return cfg.adapt.schedule[-1].head
    return cfg.adapt.head or f"l{cfg.model.mini_heads[0]}"


def _adapt_depth(cfg: ExperimentConfig) -> int:
    """Layers of the step-2 body: N for a head, N + bridge layers for a bridge, else the whole model."""
    body = _of(cfg).body
    if body is Body.HEAD:
        return cfg.model.head_depth(_adapt_head(cfg))
    if body is Body.BRIDGE:
        return cfg.bridge.depth + cfg.bridge.layers
    return cfg.model.layers


def _head_label(cfg: ExperimentConfig) -> str:
    """The name of this system's adaptation runs and results: ``cfg.label``, or ``{label}@{head}`` when step 2 runs
    over a head other than the default (a model with several secondary heads, or ``adapt.head=primary`` on a
    MiniJoint model), ``{label}@progressive`` with ``adapt.schedule``; ``adapt.tag`` adds ``+{tag}`` (``{label}@{tag}``
    alone). Pretraining and the finetuned primary models stay under ``cfg.label``, shared by every head and tag."""
    parts = []
    if _of(cfg).body is Body.HEAD:
        if cfg.adapt.schedule:
            parts.append("progressive")
        elif len(cfg.model.mini_heads) > 1 or _adapt_head(cfg) == PRIMARY:
            parts.append(_adapt_head(cfg))
    if cfg.adapt.tag:
        parts.append(cfg.adapt.tag)
    return f"{cfg.label}@{'+'.join(parts)}" if parts else cfg.label


@dataclass(frozen=True)
class Runs:
    """Where one system's steps read and write, shared runs resolved."""

    layout: Layout
    label: str  # this system's own directory (adaptation, results; ``head_label``)
    pretrain: Path | None  # the step-1 run that produces the primary model (maybe another system's); None: external
    primary: str  # the primary model: a training checkpoint, or ``bridge.source`` (file or Hugging Face model)
    body: Path | None  # the run whose finished checkpoint is the step-2 body (step 1 or step 1b); None: ``primary``
    finetune_label: str  # the system directory holding the finetuned primary models (shared with BL_BASE)

    @property
    def bridge(self) -> Path:
        """Step 1b's run: a bridge system's step-2 body (one per system run, shared by its ``adapt.tag`` variants)."""
        return self.body

    def adapt(self, lang: str) -> Path:
        return self.layout.adapt(self.label, lang)

    def finetune(self, task: str, seed: int, body: str = "primary") -> Path:
        """A finetuned primary model lives with the system that owns the primary; a mini-model with this one."""
        return self.layout.finetune(self.finetune_label if body == "primary" else self.label, task, seed, body)

    @property
    def results(self) -> Path:
        return self.layout.results(self.label)


def _runs(cfg: ExperimentConfig) -> Runs:
    s, layout = _of(cfg), Layout.of(cfg)
    if _external_primary(cfg):  # the finetuned models of the public model: with the system that owns it (BL_BASE)
        pretrain, primary, owner = None, cfg.bridge.source, s.primary_from or cfg.label
    elif s.primary_from:  # shared: the other system's untagged run (a sweep varies only this system's part),
        # of the same pretraining seed
        owner = s.primary_from + pretrain_seed_suffix(cfg.pretrain.trainer.seed)
        pretrain = layout.pretrain(owner)
        primary = str(last_checkpoint(pretrain))
    else:
        pretrain, owner = layout.pretrain(cfg.label), cfg.label
        primary = str(last_checkpoint(pretrain))
    body = layout.bridge(cfg.label) if s.body is Body.BRIDGE else pretrain
    return Runs(layout, _head_label(cfg), pretrain, primary, body, owner)


STAGES = ("prepare", "pretrain", "bridge", "adapt", "finetune", "evaluate")


@dataclass(frozen=True)
class StagePlan:
    """Everything one stage of one configuration needs to know about its system, answered once (``stage_plan``).

    Stages, the memory plan and its probe, the cost table, the pipeline, export and the command line read these
    fields; none of them asks the configuration the same questions again. The first four are the stage's own; the
    others are the same for every stage of a configuration."""

    stage: str  # one of STAGES
    reads: tuple[Path, ...]  # the runs of this experiment the stage is built on: each must have finished first
    writes: Path | None  # the stage's run directory (None where there is one per language, or per task and seed)
    layers: int  # the layers the stage trains or runs through
    formula: str  # its FLOP formula (the paper's appendix A.1: A1, A4, A3); "" for a stage that is not priced
    system: System
    steps: tuple[str, ...]  # the system's training steps here (no step 1 of its own over a public model)
    external_primary: bool  # the primary model is ``bridge.source`` (a file or a public model), not a run here
    runs: Runs  # where every step of the system reads and writes, shared runs resolved (``runs.label``: its name)
    body: Body  # where step 2 gets its frozen body
    head: str  # the MLM head step 2 trains over (PRIMARY: the whole model), which is the mini-model's head
    depth: int  # layers of step 2's body: the mini-model's depth for a ``Body.HEAD`` system
    phases: tuple[Phase, ...]  # step 2's phases: those of ``adapt.schedule``, else one over ``head``
    tokenizer: str  # the source language's Hugging Face tokenizer, "" for the SentencePiece model `prepare` trains
    bodies: tuple[str, ...]  # the bodies finetuned and evaluated: ("primary",), and "mini" for a mini_finetune system
    # step 2's vocabulary as priced before it runs: data.vocab_size; with adapt.vocabulary=extend the source's pieces
    # plus at most every target piece (a byte-level BPE source adds prefixes too: adapt_info.json has the real count)
    target_vocab: int = 0

    @property
    def runs_here(self) -> bool:
        """Whether this configuration runs the stage (MiniPost has no step 1 of its own; only MiniPost a bridge)."""
        return self.stage not in ("pretrain", "bridge") or self.stage in self.steps


def stage_plan(cfg: ExperimentConfig, stage: str) -> StagePlan:
    """The one place that resolves a configuration's system for a stage (``STAGES``)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    s, r, external = _of(cfg), _runs(cfg), _external_primary(cfg)
    steps = s.steps(external)
    head, depth = _adapt_head(cfg), _adapt_depth(cfg)
    body_layers = depth if cfg.body == "mini" else cfg.model.layers  # what finetuning trains and evaluation scores
    made_here = r.pretrain is not None  # the primary model is a run of this experiment
    layers, reads, writes = {
        "prepare": (0, (), None),  # (one prepared directory per language: ``layout.prepared``)
        "pretrain": (cfg.model.layers, (), r.layout.pretrain(cfg.label) if "pretrain" in steps else None),
        "bridge": (cfg.bridge.depth + cfg.bridge.layers, (r.pretrain,) if made_here else (), r.body if s.bridge else None),
        "adapt": (depth, (r.body,) if r.body is not None else (), r.adapt(cfg.lang) if cfg.lang else None),
        "finetune": (body_layers, (r.pretrain,) if made_here else (), None),
        "evaluate": (body_layers, (), None),
    }[stage]
    return StagePlan(stage=stage, system=s, steps=steps, external_primary=external, runs=r, reads=reads,
                     writes=writes, layers=layers, formula=FORMULAS.get(stage, ""), body=s.body, head=head, depth=depth,
                     phases=_adapt_phases(cfg), tokenizer=_source_tokenizer(cfg),
                     bodies=("primary", "mini") if s.mini_finetune else ("primary",),
                     target_vocab=cfg.data.vocab_size + (cfg.model.vocab_size if cfg.adapt.vocabulary == "extend" else 0))
