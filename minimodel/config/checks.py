"""The checks of a loaded configuration that hold for every system (``systems.validate`` adds the system's own),
and ``check_task_fits``, run where a task is featurised."""

from __future__ import annotations

import importlib.util
import math
import re
from typing import Any

from minimodel.config.schema import ADAMW, PRECISIONS, ExperimentConfig, FinetuneConfig, OptimConfig, TrainerConfig
from minimodel.errors import ConfigError


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
    from minimodel.models.families import check_model

    check_model(cfg, fail)
    if not 0.0 < cfg.data.mask_prob < 1.0:
        fail(f"data.mask_prob must be in (0, 1), got {cfg.data.mask_prob}")
    _validate_head_weights(cfg, fail)
    if not 0 <= cfg.pretrain.forget_every < cfg.pretrain.optim.updates:
        fail(f"pretrain.forget_every must be 0 (off) or a number of updates below pretrain.optim.updates "
             f"({cfg.pretrain.optim.updates}), got {cfg.pretrain.forget_every}")
    if not 0.0 < cfg.adapt.data_fraction <= 1.0:
        fail(f"adapt.data_fraction must be in (0, 1], got {cfg.adapt.data_fraction}")
    _validate_init(cfg, fail)
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

    def batch(self, key: str, value: int) -> None:
        if value > MAX_BATCH:
            self.fail(f"{key} must be at most {MAX_BATCH:,} sequences (2^24), got {value:,}")

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
        for name in ("global_batch", "micro_batch"):
            self.batch(f"{prefix}.{name}", getattr(o, name))
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
        if t.precision not in ("auto", *PRECISIONS):
            self.fail(f"{prefix}.precision must be auto or one of {', '.join(PRECISIONS)}, got {t.precision!r}")
        if t.adamw not in ADAMW:
            self.fail(f"{prefix}.adamw must be one of {', '.join(ADAMW)}, got {t.adamw!r}")
        if isinstance(t.devices, int) and not isinstance(t.devices, bool) and (t.devices == 0 or t.devices < -1):
            self.fail(f"{prefix}.devices must be a positive number of devices, -1 (all), a list of device ids "
                      f"or auto, got {t.devices}")


MAX_BATCH = 2**24

PATH_COMPONENT_MAX = 128  # file names are at most 255 bytes; temporary files and locks add to them
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
        if len(value) > PATH_COMPONENT_MAX:
            fail(f"{key}={value[:24]!r}... ({len(value)} characters): it names {names}; at most "
                 f"{PATH_COMPONENT_MAX} characters (a file name is at most 255 bytes, and files beside it add to it)")

    check("name", cfg.name, "the experiment's directory ({runs_dir}/{name})")
    check("tag", cfg.tag, "the system's run directory ({runs_dir}/{name}/{system}-{tag})", optional=True)
    check("source_lang", cfg.source_lang, "the language's prepared data ({data.prepared_dir}/{lang}) and corpus file")
    check("lang", cfg.lang, "the adaptation run ({runs_dir}/{name}/{system}/adapt/{lang})", optional=True)
    for lang in cfg.target_langs:
        check("target_langs", lang, "a language's runs ({runs_dir}/{name}/{system}/adapt/{lang}) and prepared data")
    for key, langs in [("target_langs", list(cfg.target_langs)), ("bridge.langs", list(cfg.bridge.langs)),
                       *[(f"tasks.{task}.langs", list(t.langs)) for task, t in cfg.tasks.items()]]:
        twice = sorted({lang for lang in langs if langs.count(lang) > 1})
        if twice:  # each language would be adapted (or evaluated) twice: two jobs on one run directory
            fail(f"{key}={langs}: {', '.join(twice)} given more than once; name each language once")
    for lang in cfg.bridge.langs:
        check("bridge.langs", lang, "a language's corpus file and prepared data ({data.prepared_dir}/{lang})")
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


BRIDGE_INITS = ("random", "copy", "affine")
"""``bridge.init`` values (``models.surgery.build_minipost``)."""
BRIDGE_OBJECTIVES = ("lm", "distill")
"""``bridge.objective`` values (``training.mlm.MLMModule``'s teacher)."""
MAX_FIT_TOKENS = 1 << 20  # bridge.fit_tokens: the states of this many tokens, at every width, stay in memory


def _validate_bridge(cfg: ExperimentConfig, fail: Any) -> None:
    b, check = cfg.bridge, _Sizes(fail)
    if b.init not in BRIDGE_INITS:
        fail(f"bridge.init must be one of {', '.join(BRIDGE_INITS)}, got {b.init!r}")
    if b.objective not in BRIDGE_OBJECTIVES:
        fail(f"bridge.objective must be one of {', '.join(BRIDGE_OBJECTIVES)}, got {b.objective!r}")
    check.integer("bridge.fit_tokens", b.fit_tokens, 1, MAX_FIT_TOKENS,
                  what=f"a positive integer up to {MAX_FIT_TOKENS:,} (tokens the affine map is fitted on)")
    check.number("bridge.distill_mse", b.distill_mse, zero=True)
    if b.distill_mse and b.objective != "distill":
        fail(f"bridge.distill_mse={b.distill_mse} weighs a term of the distillation loss: set bridge.objective=distill "
             f"(or bridge.distill_mse=0)")
    if cfg.source_lang in b.langs:
        fail(f"bridge.langs={list(b.langs)}: the source language {cfg.source_lang} is always trained on; list only the "
             f"languages besides it whose text step 1b also reads")
    if b.init != "random" and b.depth + b.layers > cfg.model.layers:
        fail(f"bridge.init={b.init} copies the source's top bridge.layers={b.layers} layers above its bottom "
             f"bridge.depth={b.depth}: depth + layers must be at most model.layers ({cfg.model.layers}), got "
             f"{b.depth + b.layers}")


INITS = ("overlap", "random", "focus", "mean")
"""``adapt.init`` values (``stages.adapt.INITS`` implements each)."""


VOCABULARIES = ("replace", "extend")
"""``adapt.vocabulary`` values: a new target vocabulary (the paper), or the source's plus the target pieces it lacks."""


def _validate_init(cfg: ExperimentConfig, fail: Any) -> None:
    a, check = cfg.adapt, _Sizes(fail)
    if a.init not in INITS:
        fail(f"adapt.init must be one of {', '.join(INITS)}, got {a.init!r}")
    if a.vocabulary not in VOCABULARIES:
        fail(f"adapt.vocabulary must be one of {', '.join(VOCABULARIES)}, got {a.vocabulary!r}")
    check.count("adapt.focus.top_k", a.focus.top_k, "0 (every overlapping piece) or a positive integer")
    for name in ("dim", "epochs", "min_count", "threads"):
        check.integer(f"adapt.focus.{name}", getattr(a.focus, name))
    if a.init == "focus" and importlib.util.find_spec("fasttext") is None:
        fail("adapt.init=focus trains fastText embeddings, and the fasttext package is not installed: "
             "pip install 'minimodel[focus]' (or `make setup`), or choose adapt.init=overlap")


def _validate_evaluate(cfg: ExperimentConfig, fail: Any) -> None:
    if cfg.evaluate.split not in ("test", "dev"):
        fail(f"evaluate.split must be test or dev, got {cfg.evaluate.split!r}")
    if cfg.evaluate.save_predictions not in ("none", "final", "all"):
        fail(f"evaluate.save_predictions must be none, final or all, got {cfg.evaluate.save_predictions!r}")
    if cfg.evaluate.precision not in ("auto", *PRECISIONS):
        fail(f"evaluate.precision must be auto or one of {', '.join(PRECISIONS)}, got {cfg.evaluate.precision!r}")
    if cfg.evaluate.dev_checkpoints not in ("all", "plateau"):
        fail(f"evaluate.dev_checkpoints must be all or plateau, got {cfg.evaluate.dev_checkpoints!r}")
    rep = cfg.report
    if rep.languages not in ("all", "transfer"):
        fail(f"report.languages must be all or transfer, got {rep.languages!r}")
    if rep.languages == "transfer" and not cfg.evaluate.dev:
        fail("report.languages=transfer reads the target-language dev sets: set evaluate.dev=true too (the "
             "evaluate-dev steps score every adaptation checkpoint on them)")
    if not rep.transfer_margin >= 0:
        fail(f"report.transfer_margin must be a number of points >= 0, got {rep.transfer_margin!r}")
    if not 0 < rep.plateau_share < 1:
        fail(f"report.plateau_share must be a share of step 2's updates between 0 and 1, got {rep.plateau_share!r}")
    if not rep.plateau_points > 0:
        fail(f"report.plateau_points must be a number of points > 0, got {rep.plateau_points!r}")


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


def max_threads() -> int:
    """The most CPU threads (or worker processes) a setting may ask for: 4 per CPU of this machine
    (``os.cpu_count``), and at least 64 so that a configuration written for a cluster node still loads on a laptop.
    Beyond that a team of threads only oversubscribes the machine, and a count such as 10^9 crashes inside the OpenMP
    runtime (libgomp) rather than saying why."""
    import os

    return max(64, 4 * (os.cpu_count() or 1))


def _validate_cpu(cfg: ExperimentConfig, fail: Any) -> None:
    bound = max_threads()
    limit = f"at most {bound:,} (4 per CPU of this machine, at least 64)"
    for key, value, zero in (("cpu.threads", cfg.cpu.threads, "0 (chosen: OMP_NUM_THREADS, else from the free CPUs)"),
                             ("data.encode_threads", cfg.data.encode_threads, "0 (every CPU this process may use)"),
                             ("adapt.focus.threads", cfg.adapt.focus.threads, "")):
        low = 0 if zero else 1
        if not low <= value <= bound:
            fail(f"{key} must be {zero + ' or ' if zero else ''}a number of threads from 1, {limit}, got {value:,}")
    if not 1 <= cfg.cpu.side_by_side <= bound:
        fail(f"cpu.side_by_side must be the number of minimodel processes sharing this machine's CPUs: 1 (this one "
             f"alone) or more, {limit}, got {cfg.cpu.side_by_side:,}")


def _validate_sizes(cfg: ExperimentConfig, fail: Any) -> None:
    check, d, f = _Sizes(fail), cfg.data, cfg.finetune
    _validate_cpu(cfg, fail)
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
    _validate_bridge(cfg, fail)
    check.number("finetune.epochs", f.epochs)
    check.fraction("finetune.warmup_ratio", f.warmup_ratio)
    for name in ("batch_size", "micro_batch", "eval_batch"):
        check.integer(f"finetune.{name}", getattr(f, name))
        check.batch(f"finetune.{name}", getattr(f, name))
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
        if t.train_subset not in ("stratified", "first"):
            fail(f"tasks.{name}.train_subset must be 'stratified' or 'first', got {t.train_subset!r}")
    from minimodel.task_metrics import check_metrics

    for name, t in cfg.tasks.items():
        problem = check_metrics(name, t.kind == "hub" and name in ("mlqa", "xquad"), t.metrics, t.main_metric)
        if problem:
            fail(problem)
        if t.kind == "hub" and name in ("mlqa", "xquad", "squad") and t.id_field not in ("", "id"):
            fail(f"tasks.{name}.id_field={t.id_field!r}: a QA task's questions are identified by their 'id' field "
                 f"(the hub schema), which its predictions carry; leave tasks.{name}.id_field unset")
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
    from minimodel.models.families import max_tokens, of

    offset = f" - {of(cfg.model).position_offset}" if of(cfg.model).position_offset else ""
    if cfg.tasks[task].max_len > max_tokens(cfg.model):
        raise ConfigError(f"tasks.{task}.max_len ({cfg.tasks[task].max_len}) exceeds the model's positions "
                          f"(model.max_positions{offset} = {max_tokens(cfg.model)}): set tasks.{task}.max_len")

