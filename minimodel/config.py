"""Structured experiment configuration.

An experiment YAML names base files from ``conf/`` in a ``defaults:`` list and holds only what
differs; ``key=value`` overrides come last. Everything is merged into the dataclasses below, so an
unknown key, a wrong type or a missing required value (``???``) fails at load time, naming the key
and the file (or override) it came from.

``defaults`` entries look like Hydra's: ``- model: roberta-base`` merges ``conf/model/roberta-base.yaml``
under the key ``model``; ``- optim@pretrain.optim: pretrain`` merges ``conf/optim/pretrain.yaml``
under ``pretrain.optim``. Base files may have their own ``defaults``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field, fields
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

from minimodel import atomic
from minimodel.errors import UserError

PRIMARY = "primary"  # the MLM head after the last layer; a secondary head after layer N is "l{N}"


class ConfigError(UserError, ValueError):
    """A configuration problem, with a message that names the file/key at fault."""


@dataclass
class ModelConfig:
    vocab_size: int = 50_000
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    ffn: int = 3072
    max_positions: int = 514  # seq_len + 2: RoBERTa's positions start after the padding index
    dropout: float = 0.1
    attn_dropout: float = 0.1
    layer_norm_eps: float = 1e-5
    pad_id: int = 1
    mini_heads: list[int] = field(default_factory=list)  # depths of secondary MLM heads
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "layers", "heads", "ffn", "max_positions"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be a positive integer, got {getattr(self, name)}")
        if self.hidden % self.heads != 0:
            raise ValueError(f"model.hidden ({self.hidden}) must be divisible by model.heads ({self.heads})")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("layer_norm_eps", "init_std"):
            if not 0.0 < getattr(self, name) < math.inf:
                raise ValueError(f"model.{name} must be a positive number, got {getattr(self, name)}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"model.pad_id ({self.pad_id}) must be a token id below vocab_size ({self.vocab_size})")
        depths = list(self.mini_heads)
        if len(set(depths)) != len(depths):
            raise ValueError(f"model.mini_heads has duplicates: {depths}")
        for depth in depths:
            if not 1 <= depth <= self.layers:
                raise ValueError(f"model.mini_heads: depth {depth} is outside 1..{self.layers} (model.layers)")
        self.mini_heads = sorted(depths)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def head_names(self) -> list[str]:
        return [PRIMARY] + [f"l{d}" for d in self.mini_heads]

    def head_depth(self, name: str) -> int:
        if name == PRIMARY:
            return self.layers
        if name.startswith("l") and name[1:].isdigit() and int(name[1:]) in self.mini_heads:
            return int(name[1:])
        raise KeyError(f"no MLM head {name!r}; this model has {self.head_names}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DataConfig:
    corpus_dir: str = "data/cc100"  # holds {lang}.txt or {lang}.txt.xz (CC-100 layout)
    prepared_dir: str = "runs/prepared"  # tokenizers and token shards, shared by every system
    vocab_size: int = 50_000  # SentencePiece pieces per language
    # source language only: a Hugging Face tokenizer (directory or hub id) instead of a SentencePiece model
    # trained here, for a public primary model; "" = SentencePiece (MiniPost with a Hugging Face
    # bridge.source uses that model's own tokenizer unless this names another)
    source_tokenizer: str = ""
    spm_model_type: str = "unigram"
    spm_max_sentences: int = 10_000_000  # sentence sampling cap for tokenizer training
    # text read to draw those sentences: a plain corpus is read in windows spread over the file, an xz corpus (not
    # seekable) from its start; a corpus no larger is read whole
    spm_sample_bytes: int = 2 * 2**30
    spm_character_coverage: float = 0.9995
    shard_bytes: int = 64 * 2**20  # text per shard (cut after a blank line; see data.corpus.MAX_DOCUMENT_BYTES)
    # prepare's worker processes (encoding) and SentencePiece's training threads; 0 = every CPU this process may
    # use (os.sched_getaffinity: SLURM's --cpus-per-task)
    encode_threads: int = 0
    seq_len: int = 512
    mask_prob: float = 0.15
    val_blocks: int = 512  # held-out blocks at the end of the token stream
    num_workers: int = 2


@dataclass
class OptimConfig:
    lr: float = 7e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    weight_decay: float = 0.01
    warmup_updates: int = 10_000
    updates: int = 125_000
    global_batch: int = 2048  # sequences per optimiser update, across devices and accumulation
    micro_batch: int = 32  # sequences per device per forward pass
    grad_clip: float = 1.0  # 0 disables


PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
"""``trainer.precision`` values a stage accepts (Lightning's names)."""

ADAMW = ("auto", "fused", "foreach")
"""``trainer.adamw``: auto = fused when every trainable parameter is on CUDA, foreach otherwise."""


@dataclass
class TrainerConfig:
    accelerator: str = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "bf16-mixed"  # 32-true | bf16-mixed (A100/H100) | 16-mixed (V100: fp16 with loss scaling)
    compile: bool = False  # torch.compile the transformer layers (every training stage)
    adamw: str = "auto"  # auto (fused on CUDA, foreach otherwise) | fused | foreach
    ckpt_every: int = 5000  # updates between checkpoints
    ckpt_steps: list[int] = field(default_factory=list)  # extra early checkpoints
    val_every: int = 1000  # updates between validations
    val_batches: int = 0  # 0 = the whole validation split
    log_every: int = 10
    seed: int = 1
    max_minutes: float = 0.0  # stop cleanly (with a checkpoint) after this wall time; 0 = no limit
    stop_at: int = 0  # stop cleanly (with a checkpoint) at this update and resume later; 0 = run to the end


@dataclass
class StageConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


@dataclass
class PretrainConfig(StageConfig):
    # Weight of each MLM head's loss in the pretraining loss, by head name (primary, l2, ...). {} = the mean over
    # all heads: the paper's rule for MiniJoint's two heads, generalised; with k secondary heads the primary head
    # then gets 1/(k+1) of the loss. When given, every head of the model needs a weight (>= 0, sum > 0); the
    # loss is the weighted sum as written (not renormalised).
    head_weights: dict[str, float] = field(default_factory=dict)
    # Active forgetting (Chen et al., NeurIPS 2023): re-initialise the token embeddings every K updates (N(0,
    # init_std), padding row zero; the tied MLM projections follow) and reset their AdamW moments; 0 = off.
    forget_every: int = 0
    # with forgetting: the embeddings get a learning-rate schedule of their own, restarted (warmup, then linear
    # decay to 0 at the next re-initialisation) at each re-initialisation; false = the one schedule of the run
    forget_lr_restart: bool = False


@dataclass
class BridgeConfig:
    depth: int = 4  # N: bottom layers copied from the primary model
    layers: int = 2  # new layers inserted between layer N and the MLM head
    source: str = ""  # BL_BASE .ckpt, or Hugging Face model dir / hub id; "" = this experiment's BL_BASE
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


@dataclass
class PhaseConfig:
    """One phase of progressive adaptation: step 2 over ``head`` until ``until`` (a fraction of
    ``adapt.optim.updates`` when <= 1, else an update count; 0 on the last phase = to the end)."""

    head: str = ""
    until: float = 0.0


@dataclass
class AdaptConfig:
    init: str = "overlap"  # overlap: copy embeddings of pieces shared with the source vocabulary
    # The MLM head whose layers step 2 trains over (MiniJoint): "" = the model's one secondary head (a model
    # with several must name one), l{N} = the head after layer N, primary = the whole model.
    head: str = ""
    # Progressive adaptation (MiniJoint): phases over ever deeper heads, e.g. [{head: l2, until: 0.25},
    # {head: l4, until: 0.6}, {head: primary}]; the embeddings, output bias and their optimiser state carry over.
    schedule: list[PhaseConfig] = field(default_factory=list)
    # the share of the target corpus' training blocks step 2 may use (its first ones), e.g. 0.1 for a low-data
    # setting; validation blocks are the same whatever the share
    data_fraction: float = 1.0
    # names a step-2 variant that shares steps 1, 1b and 3 with the untagged system (a low-data adaptation, say):
    # its adaptation runs and results go under {label}@{tag} (with a head of a multi-head model: {label}@{head}+{tag})
    tag: str = ""
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


@dataclass
class TaskConfig:
    """One downstream task. ``kind: hub`` tasks are xnli / pawsx / mlqa / xquad (from the Hugging Face
    hub, or from ``source`` / ``train_source`` holding files in the hub schema); ``kind: local`` is a
    classification task in ``source`` (train/dev files and test.{lang} files)."""

    kind: str = "hub"  # hub | local
    source: str = ""  # local data of the task ("" = the hub)
    train_source: str = ""  # local English training data when the task trains on another one (SQuAD for QA)
    text_fields: list[str] = field(default_factory=lambda: ["text"])  # local tasks
    label_field: str = "label"  # local tasks
    lr: float = 1e-5
    max_len: int = 256  # classification; QA uses 384 by default
    stride: int = 128  # QA document stride
    max_answer_len: int = 30
    n_best: int = 20
    max_train_examples: int = 0  # 0 = all
    langs: list[str] = field(default_factory=list)  # evaluation languages ([] = target_langs the task has)
    metrics: list[str] = field(default_factory=list)  # [] = the kind's default (accuracy; QA: f1, exact_match)
    main_metric: str = ""  # drives targets, speedups and plots ("" = accuracy; QA: f1)


def _paper_tasks() -> dict[str, TaskConfig]:
    return {"xnli": TaskConfig(lr=1e-5), "pawsx": TaskConfig(lr=1e-5),
            "mlqa": TaskConfig(lr=3e-5, max_len=384), "xquad": TaskConfig(lr=3e-5, max_len=384)}


@dataclass
class FinetuneConfig:
    tasks: list[str] = field(default_factory=lambda: ["xnli", "pawsx", "mlqa", "xquad"])
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    epochs: float = 3.0
    warmup_ratio: float = 0.06
    batch_size: int = 32  # global
    micro_batch: int = 32
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    grad_clip: float = 1.0
    eval_batch: int = 64
    mini_tasks: list[str] = field(default_factory=list)  # MiniJoint: also finetune the mini-model alone (Table 5)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


@dataclass
class EvaluateConfig:
    # predictions (id, gold, predicted, probabilities) as JSONL beside results.jsonl: none | final (the last
    # adaptation checkpoint of each language, once that adaptation is finished) | all (every checkpoint)
    save_predictions: str = "final"
    # which test set: test (test.{lang}: the results) | dev (dev.{lang} of a local task: for choosing settings
    # without looking at a test set; rows with split "dev", and `minimodel report` then writes report.dev.md)
    split: str = "test"


@dataclass
class LoggingConfig:
    wandb: str = "auto"  # auto (offline unless an API key is configured) | online | offline | disabled
    project: str = ""  # default: minimodel-{name}
    entity: str = ""


@dataclass
class ExperimentConfig:
    name: str = "???"
    system: str = "???"  # a name registered in minimodel/systems.py
    tag: str = ""  # variant of the system within the experiment (run dir {system}-{tag}), e.g. n6 in a sweep
    sweep: list[str] = field(default_factory=list)  # `minimodel run` runs one variant per entry ("k=v k=v")
    runs_dir: str = "runs"
    models_from: str = ""  # another experiment's name: reuse its pretrained, bridged and adapted models (read only)
    source_lang: str = "en"
    target_langs: list[str] = field(default_factory=list)
    lang: str = ""  # target language of one `minimodel adapt` call
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    bridge: BridgeConfig = field(default_factory=BridgeConfig)
    adapt: AdaptConfig = field(default_factory=AdaptConfig)
    tasks: dict[str, TaskConfig] = field(default_factory=_paper_tasks)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    task: str = ""  # the task of one `minimodel finetune` call
    seed: int = 0  # the seed of one `minimodel finetune` call
    body: str = "primary"  # finetune the primary model, or (MiniJoint) its mini-model: English table 5
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def label(self) -> str:
        """The system as results, reports and run directories name it: ``minijoint`` or, in a sweep, ``minijoint-n6``;
        a pretraining seed other than 1 adds ``-ps{seed}`` (``minijoint-ps2``): its own runs, pooled with the other
        pretraining seeds of the same system in reports (``pooled_label``)."""
        base = f"{self.system}-{self.tag}" if self.tag else self.system
        return base + pretrain_seed_suffix(self.pretrain.trainer.seed)


def pretrain_seed_suffix(seed: int) -> str:
    """What a pretraining seed adds to a system's label: nothing for seed 1 (the default), ``-ps{seed}`` otherwise."""
    return "" if seed == 1 else f"-ps{seed}"


def pooled_label(label: str, pretrain_seed: int) -> str:
    """The label a results row of pretraining seed ``pretrain_seed`` is reported under: its run label without the
    ``-ps{seed}`` that ``ExperimentConfig.label`` added (``minijoint-ps2@l1`` -> ``minijoint@l1``)."""
    suffix = pretrain_seed_suffix(pretrain_seed)
    system, at, rest = label.partition("@")
    if suffix and system.endswith(suffix):
        system = system[: -len(suffix)]
    return system + at + rest


def find_conf_dir(config_file: Path) -> Path:
    """``conf/`` next to the experiment's folder, or $MINIMODEL_CONF, or ./conf."""
    candidates = [Path(os.environ["MINIMODEL_CONF"])] if "MINIMODEL_CONF" in os.environ else []
    candidates += [config_file.resolve().parent.parent / "conf", config_file.resolve().parent, Path.cwd() / "conf"]
    for c in candidates:
        if (c / "model").is_dir():
            return c
    raise ConfigError(f"{config_file}: cannot find the conf/ directory (looked in {[str(c) for c in candidates]})")


def load_yaml_mapping(path: Path, what: str = "config file", error: type[ConfigError] = ConfigError) -> DictConfig:
    """A YAML file holding a mapping; ``error`` (naming the file) when it is missing, invalid or not a mapping."""
    if not path.is_file():
        raise error(f"{what} not found: {path}")
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # yaml errors
        raise error(f"{path}: not valid YAML: {e}") from e
    if not isinstance(cfg, DictConfig):
        raise error(f"{path}: expected a mapping at the top level")
    return cfg


def _compose(path: Path, conf_dir: Path, seen: tuple[Path, ...] = (), experiment: bool = True
             ) -> list[tuple[str, DictConfig]]:
    """(source, fragment) pairs in merge order: the experiment it ``extends`` (recursively), the defaults
    (recursively), then the file itself.

    In an experiment file ``- group: name`` lands under ``group``; in a base file it lands at that
    file's own level (``conf/model/roberta-small.yaml`` can start from ``- model: roberta-base``).
    ``extends: other.yaml`` (a path relative to the file) starts an experiment from another one: the file then
    holds only what differs (a list, such as ``sweep``, replaces the other's whole list)."""
    if path.resolve() in seen:
        raise ConfigError(f"{path}: defaults/extends loop through {[str(s) for s in seen]}")
    cfg = load_yaml_mapping(path)
    parts: list[tuple[str, DictConfig]] = []
    parent = cfg.pop("extends", None)
    if parent is not None:
        if not experiment:
            raise ConfigError(f"{path}: 'extends' is for experiment files; a file in conf/ starts from another "
                              f"with a defaults entry")
        if not isinstance(parent, str) or not parent:
            raise ConfigError(f"{path}: 'extends' must name one experiment file (e.g. extends: study.yaml), "
                              f"got {parent!r}")
        base = path.parent / parent
        if not base.is_file():
            options = sorted(p.name for p in path.parent.glob("*.yaml") if p != path)
            raise ConfigError(f"{path}: extends: {parent}: no file {base} (experiments beside it: {options})")
        parts += _compose(base, conf_dir, seen + (path.resolve(),))
    defaults = cfg.pop("defaults", [])
    if not isinstance(defaults, (ListConfig, list)):
        raise ConfigError(f"{path}: 'defaults' must be a list of 'group: name' entries")
    for entry in defaults:
        if not isinstance(entry, DictConfig) or len(entry) != 1:
            raise ConfigError(f"{path}: bad defaults entry {entry!r}; expected 'group: name' or 'group@key.path: name' "
                              f"(to start from another experiment file: extends: other.yaml)")
        (spec, name), = entry.items()
        group, _, package = str(spec).partition("@")
        package = package or (group if experiment else "")
        base = conf_dir / group / f"{name}.yaml"
        if not base.is_file():
            options = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
            raise ConfigError(f"{path}: defaults entry '{spec}: {name}': no file {base} (available: {options})")
        for source, fragment in _compose(base, conf_dir, seen + (path.resolve(),), experiment=False):
            if package:
                wrapped = OmegaConf.create({})
                OmegaConf.update(wrapped, package, fragment, force_add=True)
                fragment = wrapped
            parts.append((source, fragment))
    parts.append((str(path), cfg))
    return parts


def model_preset(name: str, vocab_size: int = 50_000, conf_dir: Path | None = None, **overrides: Any) -> ModelConfig:
    """``conf/model/{name}.yaml`` (what ``- model: NAME`` gives an experiment) with ``data.vocab_size`` set to
    ``vocab_size``: the YAML files are the one definition of the model presets (roberta-base, roberta-small, tiny)."""
    conf_dir = conf_dir or Path(__file__).resolve().parent.parent / "conf"
    path = conf_dir / "model" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"no model preset {name!r}: {path} does not exist "
                          f"(available: {sorted(p.stem for p in (conf_dir / 'model').glob('*.yaml'))})")
    cfg: DictConfig = OmegaConf.structured(ExperimentConfig)
    cfg.data.vocab_size = vocab_size
    for source, fragment in [*_compose(path, conf_dir, experiment=False), ("overrides", OmegaConf.create(overrides))]:
        cfg = _merge(cfg, OmegaConf.create({"model": fragment}), source)
    OmegaConf.resolve(cfg)
    return ModelConfig(**OmegaConf.to_container(cfg.model))  # type: ignore[arg-type]


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r}: expected key=value (e.g. pretrain.optim.updates=1000)")
    try:
        parsed = OmegaConf.create({"v": value} if value == "" else f"v: {value}")["v"]
    except Exception as e:  # yaml's scanner / parser errors, or OmegaConf's on what they produced
        raise ConfigError(f"override {item!r}: not a valid value ({_value_problem(e)}); write a number, a word, "
                          f"a [list] or a {{mapping}} in YAML, and quote a string that holds YAML's signs "
                          f"(in the shell: {key.strip()}=\"'...'\")") from e
    return key.strip(), parsed


def _value_problem(e: Exception) -> str:
    """What the YAML parser (or OmegaConf) found wrong, on one line and without YAML's positions (they count
    from the ``v: `` the value is parsed under)."""
    parts = [str(getattr(e, name)) for name in ("context", "problem") if getattr(e, name, None)]
    if type(e).__module__.partition(".")[0] == "yaml":  # PyYAML's errors (omegaconf's dependency)
        return "YAML: " + (": ".join(parts) if parts else str(e).splitlines()[0])
    return str(e).splitlines()[0]


def _merge(base: DictConfig, fragment: DictConfig, source: str, error: type[ConfigError] = ConfigError,
           noun: str = "config") -> DictConfig:
    """``base`` updated with ``fragment``; unknown keys and bad values raise ``error`` naming ``source`` and the key."""
    try:
        return OmegaConf.merge(base, fragment)  # type: ignore[return-value]
    except ConfigKeyError as e:
        raise error(f"{source}: unknown {noun} key '{e.full_key}'" + _hint(base, str(e.full_key))) from e
    except ValidationError as e:
        raise error(f"{source}: bad value for '{e.full_key}': {str(e.msg).splitlines()[0]}") from e
    except OmegaConfBaseException as e:
        raise error(f"{source}: {e}") from e


def _hint(cfg: DictConfig, full_key: str) -> str:
    parent, _, _ = full_key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if isinstance(node, DictConfig):
        return f"; valid keys under '{parent or '<top level>'}': {', '.join(str(k) for k in node.keys())}"
    return ""


def load_structured(schema: type, path: Path, what: str, error: type[ConfigError] = ConfigError,
                    noun: str = "config") -> Any:
    """A YAML file read into the dataclass ``schema``: one way of failing for every config-like file."""
    cfg = _merge(OmegaConf.structured(schema), load_yaml_mapping(path, what, error), str(path), error, noun)
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise error(f"{path}: {e}") from e


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Compose, override, validate. Returns a typed ``ExperimentConfig`` (an OmegaConf-backed object)."""
    path = Path(path)
    conf_dir = find_conf_dir(path)
    cfg: DictConfig = OmegaConf.structured(ExperimentConfig)
    for source, fragment in _compose(path, conf_dir):
        cfg = _merge(cfg, fragment, source)
    for item in overrides or []:
        key, value = _parse_override(item)
        fragment = OmegaConf.create({})
        OmegaConf.update(fragment, key, value, force_add=True)
        cfg = _merge(cfg, fragment, f"override '{item}'")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{path}: missing required value(s) {', '.join(missing)} (set them in the file or as key=value)")
    try:
        OmegaConf.resolve(cfg)
        obj: ExperimentConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except (MissingMandatoryValue, OmegaConfBaseException) as e:
        raise ConfigError(f"{path}: {e}") from e
    except ValueError as e:  # __post_init__ checks (ModelConfig)
        raise ConfigError(f"{path}: {e}") from e
    validate(obj, str(path))
    from minimodel import systems  # the system-specific rules live with the declarations

    systems.validate(obj, str(path))
    return obj


def is_hf_source(source: str) -> bool:
    """A ``bridge.source`` naming a Hugging Face model (directory or hub id) rather than a checkpoint file."""
    return bool(source) and not source.endswith(".ckpt") and not Path(source).is_file()


def validate(cfg: ExperimentConfig, source: str) -> None:
    """Checks that hold for every system (``systems.validate`` adds the system's own)."""
    def fail(msg: str) -> None:
        raise ConfigError(f"{source}: {msg}")

    _validate_path_components(cfg, fail)
    _validate_logging(cfg, fail)
    _validate_evaluate(cfg, fail)
    if cfg.models_from and (cfg.models_from == cfg.name or not is_path_component(cfg.models_from)):
        fail(f"models_from={cfg.models_from!r}: the name of another experiment (its runs are "
             f"{{runs_dir}}/{{models_from}}), not this one's ({cfg.name!r}); {PATH_COMPONENT_RULE}")
    if cfg.adapt.tag and not re.fullmatch(r"[A-Za-z0-9_-]+", cfg.adapt.tag):
        fail(f"adapt.tag={cfg.adapt.tag!r}: use letters, digits, '-' and '_' (it names run directories)")
    _validate_sizes(cfg, fail)
    if cfg.model.max_positions < cfg.data.seq_len + 2:
        fail(f"model.max_positions ({cfg.model.max_positions}) must be at least data.seq_len + 2 ({cfg.data.seq_len + 2})")
    if not 0.0 < cfg.data.mask_prob < 1.0:
        fail(f"data.mask_prob must be in (0, 1), got {cfg.data.mask_prob}")
    _validate_head_weights(cfg, fail)
    if not 0 <= cfg.pretrain.forget_every < cfg.pretrain.optim.updates:
        fail(f"pretrain.forget_every must be 0 (off) or a number of updates below pretrain.optim.updates "
             f"({cfg.pretrain.optim.updates}), got {cfg.pretrain.forget_every}")
    if not 0.0 < cfg.adapt.data_fraction <= 1.0:
        fail(f"adapt.data_fraction must be in (0, 1], got {cfg.adapt.data_fraction}")
    if cfg.adapt.init not in ("overlap", "random"):
        fail(f"adapt.init must be 'overlap' or 'random', got {cfg.adapt.init!r}")
    _validate_tasks(cfg, fail)
    if cfg.body not in ("primary", "mini"):
        fail(f"body must be 'primary' or 'mini', got {cfg.body!r}")
    f = cfg.finetune
    if f.batch_size % f.micro_batch:
        fail(f"finetune.batch_size ({f.batch_size}) must be a multiple of finetune.micro_batch ({f.micro_batch})")
    for stage in ("pretrain", "bridge", "adapt"):
        o = getattr(cfg, stage).optim
        if o.global_batch % o.micro_batch:
            fail(f"{stage}.optim.global_batch ({o.global_batch}) must be a multiple of micro_batch ({o.micro_batch})")


MIN_SEQ_LEN = 8  # an MLM block is <s> and seq_len - 1 tokens, data.mask_prob of them masked
MAX_SEED = 2**32 - 1  # what numpy (and so Lightning's seed_everything) accepts


class _Sizes:
    """Checks of sizes, counts and rates: a zero or negative one fails at load time, naming the key."""

    def __init__(self, fail: Any) -> None:
        self.fail = fail

    def integer(self, key: str, value: int, low: int = 1, high: int | None = None,
                what: str = "a positive integer") -> None:
        if value < low or (high is not None and value > high):
            self.fail(f"{key} must be {what}, got {value}")

    def count(self, key: str, value: int, what: str = "0 or a positive integer") -> None:
        self.integer(key, value, 0, what=what)

    def number(self, key: str, value: float, zero: bool = False) -> None:
        if not (value >= 0.0 if zero else value > 0.0) or not value < math.inf:  # (nan fails both)
            self.fail(f"{key} must be {'0 or a positive number' if zero else 'a positive number'}, got {value}")

    def fraction(self, key: str, value: float) -> None:
        if not 0.0 <= value < 1.0:
            self.fail(f"{key} must be in [0, 1), got {value}")

    def seed(self, key: str, value: int, what: str = "") -> None:
        self.integer(key, value, 0, MAX_SEED, what=what or f"in 0..{MAX_SEED}")

    def adam(self, prefix: str, o: OptimConfig | FinetuneConfig) -> None:
        self.number(f"{prefix}.eps", o.eps)
        self.number(f"{prefix}.weight_decay", o.weight_decay, zero=True)
        self.number(f"{prefix}.grad_clip", o.grad_clip, zero=True)
        if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
            self.fail(f"{prefix}.betas must be two numbers in [0, 1) (Adam's beta1, beta2), got {list(o.betas)}")

    def optim(self, prefix: str, o: OptimConfig) -> None:
        for name in ("updates", "global_batch", "micro_batch"):
            self.integer(f"{prefix}.{name}", getattr(o, name))
        self.count(f"{prefix}.warmup_updates", o.warmup_updates)
        self.number(f"{prefix}.lr", o.lr)
        self.adam(prefix, o)

    def trainer(self, prefix: str, t: TrainerConfig) -> None:
        for name in ("ckpt_every", "val_every", "log_every", "num_nodes"):
            self.integer(f"{prefix}.{name}", getattr(t, name))
        self.count(f"{prefix}.val_batches", t.val_batches, "0 (all) or a positive integer")
        self.count(f"{prefix}.stop_at", t.stop_at, "0 (no stop) or a positive integer")
        for step in t.ckpt_steps:
            self.integer(f"{prefix}.ckpt_steps", step, what="a list of positive update counts")
        self.seed(f"{prefix}.seed", t.seed)
        self.number(f"{prefix}.max_minutes", t.max_minutes, zero=True)
        if t.precision not in PRECISIONS:
            self.fail(f"{prefix}.precision must be one of {', '.join(PRECISIONS)}, got {t.precision!r}")
        if t.adamw not in ADAMW:
            self.fail(f"{prefix}.adamw must be one of {', '.join(ADAMW)}, got {t.adamw!r}")
        if isinstance(t.devices, int) and not isinstance(t.devices, bool) and (t.devices == 0 or t.devices < -1):
            self.fail(f"{prefix}.devices must be a positive number of devices, -1 (all), a list of device ids "
                      f"or auto, got {t.devices}")


_PATH_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")
PATH_COMPONENT_RULE = "use ASCII letters, digits, '.', '_' and '-' (not empty, not '.' or '..')"
"""What a config value that names a directory or file under ``runs_dir`` / ``data.prepared_dir`` may hold."""


def is_path_component(value: str) -> bool:
    return bool(_PATH_COMPONENT.fullmatch(value)) and value not in (".", "..")


def _validate_path_components(cfg: ExperimentConfig, fail: Any) -> None:
    """Values that ``layout.py`` (and the task and corpus readers) spell into paths: each must stay one directory
    or file name, so that nothing is read or written outside ``runs_dir`` / ``data.prepared_dir``."""
    def check(key: str, value: str, names: str, optional: bool = False) -> None:
        if optional and value == "":
            return
        if not is_path_component(value):
            what = f"{key}: the task name {value!r}" if key == "tasks" else f"{key}={value!r}"
            fail(f"{what}: it names {names}; {PATH_COMPONENT_RULE}")

    check("name", cfg.name, "the experiment's directory ({runs_dir}/{name})")
    check("tag", cfg.tag, "the system's run directory ({runs_dir}/{name}/{system}-{tag})", optional=True)
    check("source_lang", cfg.source_lang, "the language's prepared data ({data.prepared_dir}/{lang}) and corpus file")
    check("lang", cfg.lang, "the adaptation run ({runs_dir}/{name}/{system}/adapt/{lang})", optional=True)
    for lang in cfg.target_langs:
        check("target_langs", lang, "a language's runs ({runs_dir}/{name}/{system}/adapt/{lang}) and prepared data")
    for task, t in cfg.tasks.items():
        check("tasks", task, "a task's finetuning runs ({runs_dir}/{name}/{system}/finetune/{task})")
        for lang in t.langs:
            check(f"tasks.{task}.langs", lang, "a language's test file (test.{lang}) and predictions directory")


WANDB_PROJECT_CHARS = "/\\#?%:"  # what wandb refuses in a project name (wandb_settings.Settings.validate_project)
WANDB_PROJECT_MAX = 128


def _validate_logging(cfg: ExperimentConfig, fail: Any) -> None:
    """The W&B project and entity, checked here rather than by wandb when a stage has already written files."""
    log = cfg.logging
    if log.wandb not in ("auto", "online", "offline", "disabled"):
        fail(f"logging.wandb must be auto|online|offline|disabled, got {log.wandb!r}")
    project = log.project or f"minimodel-{cfg.name}"
    key = "logging.project" if log.project else f"logging.project (default minimodel-{{name}}: {project!r})"
    found = [c for c in WANDB_PROJECT_CHARS if c in project]
    if found:
        fail(f"{key}={project!r}: a W&B project name cannot contain {' '.join(found)} "
             f"(wandb refuses any of {' '.join(WANDB_PROJECT_CHARS)}); set logging.project to another name")
    if len(project) > WANDB_PROJECT_MAX:
        fail(f"{key}: a W&B project name has at most {WANDB_PROJECT_MAX} characters, this one {len(project)}; "
             f"set logging.project to a shorter name")
    if log.entity and (set(log.entity) & set(WANDB_PROJECT_CHARS) or any(c.isspace() for c in log.entity)):
        fail(f"logging.entity={log.entity!r}: a W&B entity is a user or team name, without spaces or any of "
             f"{' '.join(WANDB_PROJECT_CHARS)} (it is spelled into W&B's entity/project/run paths)")


def _validate_evaluate(cfg: ExperimentConfig, fail: Any) -> None:
    if cfg.evaluate.split not in ("test", "dev"):
        fail(f"evaluate.split must be test or dev, got {cfg.evaluate.split!r}")
    if cfg.evaluate.save_predictions not in ("none", "final", "all"):
        fail(f"evaluate.save_predictions must be none, final or all, got {cfg.evaluate.save_predictions!r}")


def _validate_head_weights(cfg: ExperimentConfig, fail: Any) -> None:
    weights, heads = cfg.pretrain.head_weights, cfg.model.head_names
    if not weights:
        return
    if set(weights) != set(heads):
        fail(f"pretrain.head_weights must give a weight to each head of the model ({', '.join(heads)}), "
             f"got {', '.join(map(str, weights)) or 'none'}")
    for head, w in weights.items():
        if not 0.0 <= w < math.inf:
            fail(f"pretrain.head_weights.{head} must be a finite number >= 0, got {w}")
    if sum(weights.values()) <= 0:
        fail("pretrain.head_weights: at least one weight must be positive")


def _validate_sizes(cfg: ExperimentConfig, fail: Any) -> None:
    check, d, f = _Sizes(fail), cfg.data, cfg.finetune
    check.integer("data.vocab_size", d.vocab_size)
    check.integer("data.seq_len", d.seq_len, MIN_SEQ_LEN, what=f"at least {MIN_SEQ_LEN} (tokens per MLM block)")
    check.count("data.val_blocks", d.val_blocks)
    check.count("data.num_workers", d.num_workers)
    check.count("data.encode_threads", d.encode_threads)
    for name in ("shard_bytes", "spm_max_sentences", "spm_sample_bytes"):
        check.integer(f"data.{name}", getattr(d, name))
    if not 0.0 < d.spm_character_coverage <= 1.0:
        fail(f"data.spm_character_coverage must be in (0, 1], got {d.spm_character_coverage}")
    for stage in ("pretrain", "bridge", "adapt"):
        check.optim(f"{stage}.optim", getattr(cfg, stage).optim)
        check.trainer(f"{stage}.trainer", getattr(cfg, stage).trainer)
    check.integer("bridge.depth", cfg.bridge.depth)
    check.integer("bridge.layers", cfg.bridge.layers)
    check.number("finetune.epochs", f.epochs)
    check.fraction("finetune.warmup_ratio", f.warmup_ratio)
    for name in ("batch_size", "micro_batch", "eval_batch"):
        check.integer(f"finetune.{name}", getattr(f, name))
    check.adam("finetune", f)
    for seed in f.seeds:
        check.seed("finetune.seeds", seed, f"a list of seeds in 0..{MAX_SEED}")
    check.trainer("finetune.trainer", f.trainer)
    check.seed("seed", cfg.seed, f"in 0..{MAX_SEED} (0: every seed of finetune.seeds)")
    for name, t in cfg.tasks.items():
        check.number(f"tasks.{name}.lr", t.lr)
        check.integer(f"tasks.{name}.max_len", t.max_len, MIN_SEQ_LEN, what=f"at least {MIN_SEQ_LEN} (tokens per input)")
        for key in ("stride", "max_answer_len", "n_best"):
            check.integer(f"tasks.{name}.{key}", getattr(t, key))
        check.count(f"tasks.{name}.max_train_examples", t.max_train_examples, "0 (all) or a positive integer")


def _validate_tasks(cfg: ExperimentConfig, fail: Any) -> None:
    for name, t in cfg.tasks.items():
        if t.kind not in ("hub", "local"):
            fail(f"tasks.{name}.kind must be 'hub' or 'local', got {t.kind!r}")
        if t.kind == "local" and not t.source:
            fail(f"tasks.{name}: a local task needs tasks.{name}.source (its data directory)")
    from minimodel.task_metrics import check_metrics

    for name, t in cfg.tasks.items():
        problem = check_metrics(name, t.kind == "hub" and name in ("mlqa", "xquad"), t.metrics, t.main_metric)
        if problem:
            fail(problem)
    for key in ("tasks", "mini_tasks"):
        for name in getattr(cfg.finetune, key):
            if name not in cfg.tasks:
                fail(f"finetune.{key} names '{name}', which is not defined under tasks: (defined: {sorted(cfg.tasks)})")
    # every system's steps 3 and 4 are finetuning and its evaluation: an empty list would make them do nothing
    if not cfg.finetune.tasks and not cfg.task:
        fail("finetune.tasks is empty: steps 3 and 4 (finetuning, evaluation) would do nothing; name at least one "
             f"task (defined under tasks: {sorted(cfg.tasks)}), e.g. finetune.tasks=[{next(iter(cfg.tasks), 'xnli')}]")
    if not cfg.finetune.seeds and not cfg.seed:
        fail("finetune.seeds is empty: steps 3 and 4 (finetuning, evaluation) would do nothing; give at least one "
             "seed, e.g. finetune.seeds=[1]")
    if cfg.task and cfg.task not in cfg.tasks:
        fail(f"task={cfg.task} is not defined under tasks: (defined: {sorted(cfg.tasks)})")


def check_task_fits(cfg: ExperimentConfig, task: str) -> None:
    """Called where a task is featurised: its inputs must fit the model's positions."""
    if cfg.tasks[task].max_len > cfg.model.max_positions - 2:
        raise ConfigError(f"tasks.{task}.max_len ({cfg.tasks[task].max_len}) exceeds the model's positions "
                          f"(model.max_positions - 2 = {cfg.model.max_positions - 2}): set tasks.{task}.max_len")


def to_yaml(cfg: ExperimentConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_config(cfg: ExperimentConfig, path: Path) -> None:
    """The settings a stage ran with (``config.yaml``), written whole (``atomic``)."""
    atomic.write_text(path, to_yaml(cfg))


# ---------------------------------------------------------------------- a finished stage run, a new configuration

_DATA_READ = ("data.prepared_dir", "data.vocab_size", "data.source_tokenizer")  # tokenizers and shards a stage reads
_MLM_DATA = (*_DATA_READ, "data.seq_len", "data.mask_prob", "data.val_blocks")
_OPTIM = ("lr", "betas", "eps", "weight_decay", "warmup_updates", "updates", "global_batch", "grad_clip")
_TRAINER = ("precision", "seed")  # numerics, the random stream
_FINETUNE = ("epochs", "warmup_ratio", "batch_size", "weight_decay", "betas", "eps", "grad_clip")
_TASK = tuple(f.name for f in fields(TaskConfig) if f.name != "langs")  # langs: evaluation languages (step 4)
_PATHS = ("data.prepared_dir", "data.source_tokenizer", "bridge.source", "tasks.*.source", "tasks.*.train_source")
LENGTH = {"pretrain": "pretrain.optim.updates", "bridge": "bridge.optim.updates", "adapt": "adapt.optim.updates",
          "finetune": "finetune.epochs"}
"""The key that says how long a stage trains (its learning rate decays to 0 at the end of it)."""


def stage_identity(stage: str) -> tuple[str, ...]:
    """The config keys (a section stands for every key under it) that decide what the stage run ``stage``
    (``pretrain``, ``bridge``, ``adapt/de``, ``finetune/xnli/seed1[/mini]``) produces.

    Adaptation's checkpoint schedule is part of it (its checkpoints are the points of step 4's curves); not
    part of it: where and how fast it runs (accelerator, devices, nodes, strategy, compile, micro-batches, data
    workers), how often it logs, validates and (other stages) checkpoints, when one command stops it
    (``trainer.stop_at``, ``trainer.max_minutes``), logging and wandb, the corpus (a stage reads
    ``data.prepared_dir``), the command's selectors (lang, task, seed, body: the run directory spells them), the
    system and tag (MiniPost finetunes in BL_BASE's directories), and the settings of the runs it reads
    (checked when those run)."""
    kind, _, rest = stage.partition("/")
    trainer = tuple(f"{kind}.trainer.{k}" for k in _TRAINER)
    if kind == "finetune":
        task = rest.split("/")[0]
        return ("source_lang", "model", *_DATA_READ, "bridge.source", *(f"finetune.{k}" for k in _FINETUNE),
                *trainer, *(f"tasks.{task}.{k}" for k in _TASK))
    extra = {"pretrain": ("pretrain.head_weights", "pretrain.forget_every", "pretrain.forget_lr_restart"), "bridge": ("bridge.depth", "bridge.layers", "bridge.source"),
             "adapt": ("adapt.init", "adapt.head", "adapt.schedule", "adapt.data_fraction", "adapt.trainer.ckpt_every",
                       "adapt.trainer.ckpt_steps")}.get(kind, ())
    return ("source_lang", "model", *_MLM_DATA, *(f"{kind}.optim.{k}" for k in _OPTIM), *trainer, *extra)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _same(key: str, old: Any, new: Any) -> bool:
    if old == new:
        return True
    if any(fnmatchcase(key, p) for p in _PATHS) and isinstance(old, str) and isinstance(new, str) and old and new:
        return Path(old).expanduser().resolve() == Path(new).expanduser().resolve()
    return False


_NOT_SET = "(not set)"


def stage_changes(saved: dict, current: dict, stage: str) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, current value)`` for each key of ``stage_identity(stage)`` that differs between
    ``saved`` (a stage run's ``config.yaml`` as a plain dict) and ``current`` (a config as a plain dict).

    A key the saved file lacks (written by an older version) counts as its default; a key the schema no longer
    has is ignored; paths that resolve to the same place are the same."""
    identity = stage_identity(stage)
    old, new = _flatten(saved), _flatten(current)
    defaults = _flatten(OmegaConf.to_container(OmegaConf.structured(ExperimentConfig)))
    changes = []
    for key in sorted(new):
        if not any(key == k or key.startswith(k + ".") for k in identity):
            continue
        before = old.get(key, defaults.get(key, _NOT_SET))
        if not _same(key, before, new[key]):
            changes.append((key, before, new[key]))
    return changes


def check_finished(cfg: ExperimentConfig, stage: str, run_dir: Path, finished: bool = True) -> None:
    """A finished stage run is this configuration's result only when the settings that decide it (see
    ``stage_identity``) are those it ran with (its ``config.yaml``); otherwise a ``ConfigError`` lists them.
    The same holds for a run stopped before its end (``finished=False``): resuming it with other settings
    would mix two runs in one.

    A finished run is never extended: its learning rate has decayed to 0 at its last update
    (``training/optim.py``), so more updates on top of it are not the schedule of a longer run."""
    from minimodel.layout import CONFIG

    path = run_dir / CONFIG
    if not path.is_file():  # finished before runs kept their config: nothing to compare with
        return
    try:
        saved = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as e:  # yaml / omegaconf errors
        raise ConfigError(f"{path}: not valid YAML ({_value_problem(e)}); it records the settings the finished run "
                          f"{run_dir} ran with: restore it, or delete {run_dir} to train the stage again") from e
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: expected a mapping (the settings the finished run {run_dir} ran with): "
                          f"restore it, or delete {run_dir} to train the stage again")
    changes = stage_changes(saved, OmegaConf.to_container(OmegaConf.structured(cfg)), stage)  # type: ignore[arg-type]
    if not changes:
        return
    elsewhere = f"set another name= or runs_dir= (or delete {run_dir} to train it again)"
    key, before, after = changes[0]
    longer = key == LENGTH.get(stage.partition("/")[0]) and isinstance(before, (int, float)) and after > before
    if not finished:
        listed = "; ".join(f"{k}: {b!r} -> {a!r}" for k, b, a in changes)
        raise ConfigError(
            f"{run_dir} holds a run stopped before its end that ran with other settings than this configuration's "
            f"({path}): {listed}. Resuming it would mix the two; rerun with the settings it ran with to finish it, "
            f"or train the new ones in a new run: {elsewhere}")
    if len(changes) == 1 and longer:
        raise ConfigError(
            f"{run_dir} is finished with {key}={before} and cannot be continued to {after}: its learning rate "
            f"decayed linearly to 0 at its last update, so more updates on top of it would not follow the "
            f"schedule of a {key}={after} run. Train {key}={after} in a new run: {elsewhere}; or keep "
            f"{key}={before} to use the finished run")
    listed = "; ".join(f"{k}: {b!r} -> {a!r}" for k, b, a in changes)
    raise ConfigError(
        f"{run_dir} is finished, but it ran with other settings than this configuration's ({path}): {listed}. "
        f"Rerun with the settings it ran with, or train the new ones in a new run: {elsewhere}")
