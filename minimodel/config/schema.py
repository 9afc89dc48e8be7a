"""The schema of an experiment's configuration: dataclasses, one per section, and small helpers on their values.

``load.load_config`` merges the YAML files and overrides into ``ExperimentConfig``, so an unknown key, a wrong type or a
missing required value (``???``) fails at load time. This module imports nothing of minimodel but its ``model:``
section (``model_schema``, which imports nothing): any module may read the schema, none is read back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minimodel.config.model_schema import LLAMA_OPTIONS, PRIMARY, ROPE_SCALINGS, ModelConfig  # noqa: F401 (the schema's)


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
"""The precisions a stage runs in (Lightning's names); ``trainer.precision`` and ``evaluate.precision`` also accept
``auto``, resolved on the device in use (``training.device.resolve_precision``)."""

ADAMW = ("auto", "fused", "foreach")
"""``trainer.adamw``: auto = fused when every trainable parameter is on CUDA, foreach otherwise."""


@dataclass
class TrainerConfig:
    accelerator: str = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    strategy: str = "auto"
    # 32-true | bf16-mixed (A100/H100) | 16-mixed (V100: fp16 with loss scaling) | auto (chosen where the stage runs:
    # bf16-mixed on a card with native bf16, 16-mixed on older ones; on a CPU bf16-mixed only where it is faster there,
    # with AMX or by a measured matmul check kept per machine, 32-true otherwise; the log says which and why)
    precision: str = "bf16-mixed"
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
    # how the bridge layers start (docs/extensions.md): random (the paper), copy (the source's top `layers` layers),
    # affine (a least-squares map of layer N's state onto the state those copied layers read, then the copies)
    init: str = "random"
    fit_tokens: int = 8192  # init=affine: source-language training tokens the map is fitted on (before update 1)
    # what step 1b minimises: lm (the paper: the MLM / next-token loss) or distill (KL divergence to the full source
    # model's output distribution, the teacher, plus distill_mse x the MSE to its final hidden state)
    objective: str = "lm"
    distill_mse: float = 0.0
    # languages besides source_lang whose text step 1b also trains on, in the source model's own tokenizer (`minimodel
    # prepare` encodes them so): each update's blocks are drawn from source_lang and these in turn, equal shares; each
    # language's held-out text (its own and step 2's) is never trained on. [] = the source language only (the paper)
    langs: list[str] = field(default_factory=list)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


@dataclass
class PhaseConfig:
    """One phase of progressive adaptation: step 2 over ``head`` until ``until`` (a fraction of
    ``adapt.optim.updates`` when <= 1, else an update count; 0 on the last phase = to the end)."""

    head: str = ""
    until: float = 0.0


@dataclass
class FocusConfig:
    """``adapt.init=focus`` (Dobler & de Melo, EMNLP 2023): the auxiliary fastText embeddings of the target pieces,
    trained on step 2's own training text (``data.aux_embeddings``), and how many overlapping pieces a new piece
    may mix (``focus.focus_init``)."""

    # sparsemax over the k overlapping pieces most similar to a new piece; 0 = over every overlapping piece, as the
    # paper and its code (deepfocus) do. Sparsemax keeps a prefix of the ranked similarities, so any k at least
    # that prefix's length gives the same weights (adapt_info.json records the longest prefix kept)
    top_k: int = 0
    dim: int = 100  # fastText vectors (FOCUS: 100)
    epochs: int = 3  # fastText epochs over the text (FOCUS: 3)
    min_count: int = 10  # pieces seen fewer times get no auxiliary vector, hence random N(0, init_std) (FOCUS: 10)
    # fastText's training threads: 1 is bit-reproducible; more are faster, and their result varies from run to run
    threads: int = 1


@dataclass
class AdaptConfig:
    # overlap: copy the pieces shared with the source vocabulary, the others N(0, init_std); focus / mean: the same
    # copies, the others a sparsemax mix of them (FocusConfig) / the mean of their source segmentation; random:
    # every row N(0, init_std). An untied output projection follows the same rule (focus: the overlap rule's)
    init: str = "overlap"
    vocabulary: str = "replace"  # or extend: the source's pieces (frozen rows) + the target's it lacks (data.extend)
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
    focus: FocusConfig = field(default_factory=FocusConfig)
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
    # the column whose value identifies an example in saved predictions ("" = the "id" column where a record has
    # one, else the record's 0-based position in its file); every split file read must have it
    id_field: str = ""
    lr: float = 1e-5
    max_len: int = 256  # classification; QA uses 384 by default
    stride: int = 128  # QA document stride
    max_answer_len: int = 30
    n_best: int = 20
    max_train_examples: int = 0  # 0 = all
    # which max_train_examples: stratified (a seeded draw in proportion to each label's count, at least one of each;
    # data.tasks.subset_indices) | first (the file's first N: only for a file already in random order)
    train_subset: str = "stratified"
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
    pool: str = ""  # the task head's readout: "" (the family's: <s> | last real token) | first | last | mean
    layer: int = 0  # ... after this layer: 0 = the last, else 1..model.layers (docs/extensions.md)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


@dataclass
class EvaluateConfig:
    # predictions (id, gold, predicted, probabilities) as JSONL beside results.jsonl: none | final (the last
    # adaptation checkpoint of each language, once that adaptation is finished) | all (every checkpoint)
    save_predictions: str = "final"
    # which test set: test (test.{lang}: the results) | dev (dev.{lang} of a local task: for choosing settings
    # without looking at a test set; rows with split "dev", and `minimodel report` then writes report.dev.md)
    split: str = "test"
    # also score every adaptation checkpoint on the target-language dev sets (rows of split dev: `minimodel run`
    # adds an evaluate-dev-{lang} step): what the report's plateau check and transfer rule read (ReportConfig)
    dev: bool = False
    # which checkpoints the dev sets score: all, or plateau (only the two the report's checks read: the last, and the
    # last at or before 1 - report.plateau_share of it; a fraction of the cost of all)
    dev_checkpoints: str = "all"
    # the autocast of step 4's forward passes (and of step 3's English scores): auto (bf16 on a CUDA card that has it
    # natively, fp16 on older ones; on a CPU bf16 only where it is faster there, with AMX or by a measured matmul check,
    # full precision otherwise: trainer.precision's rule) | 32-true | bf16-mixed (also on a CPU: with AMX it is about
    # 2.5x faster than fp32 for a 135M model) | 16-mixed (fp16 on CUDA, bf16 on the CPU, as Lightning does)
    precision: str = "auto"


@dataclass
class ReportConfig:
    """Checks the report makes on the target-language dev sets (rows of split dev, ``evaluate.dev``), never on test."""

    # all: every target language enters averages and claims; transfer: only those where BL_BASE's final dev score
    # (mean over seeds) beats the dev majority class by at least transfer_margin points (the others are reported
    # apart, outside every average)
    languages: str = "all"
    transfer_margin: float = 5.0
    # the plateau check: how much each dev curve moves over the last plateau_share of step 2's updates; the rule
    # holds when BL_BASE's moves by less than plateau_points in every language
    plateau_share: float = 0.25
    plateau_points: float = 1.0
    # which systems the report reads, and under which names: {} = every system under its own label; else only the
    # rows of these labels, renamed (e.g. {bl_base@mean: bl_base, minipost-recipe@mean: minipost}: the paper's
    # claims read on a recipe's pair of rows; docs/real/sib200.md)
    systems: dict[str, str] = field(default_factory=dict)


@dataclass
class CpuConfig:
    """The CPU threads of each stage's torch operations (minimodel/cluster/threads.py; not part of what a run produces)."""

    # intra-op threads; 0 = OMP_NUM_THREADS where the environment sets it, else chosen from the CPUs this process may
    # use less those other work keeps busy when the stage starts, shared among side_by_side processes
    threads: int = 0
    # how many minimodel processes share this machine's CPUs (e.g. 2 experiments run at once): each takes its share
    side_by_side: int = 1


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
    report: ReportConfig = field(default_factory=ReportConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    cpu: CpuConfig = field(default_factory=CpuConfig)

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


GGUF_SUFFIX = ".gguf"
"""The suffix of a GGUF file, in any case (``model.gguf``, ``model.GGUF``: llama.cpp's tools and hub repos write both)."""


def is_gguf_name(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF file by its suffix, whatever its case."""
    return Path(path).suffix.lower() == GGUF_SUFFIX


def is_hf_source(source: str) -> bool:
    """A ``bridge.source`` naming a Hugging Face model (directory, hub id, or a GGUF file, its suffix in any case)
    rather than a checkpoint file."""
    return bool(source) and (is_gguf_name(source) or not source.endswith(".ckpt") and not Path(source).is_file())

