"""The memory plan: the per-GPU memory of each training stage of an experiment, predicted from its config.

What one process holds at the peak of a training update, in bytes. The peak comes in the backward pass of a
micro-batch after the first of an update, with the gradients of the earlier micro-batches already there:

* **weights**: an fp32 master copy of every parameter the stage's model holds (frozen ones too, tied ones once);
* **gradients**: fp32, trainable parameters only; **DDP buckets**: one more fp32 copy of them on several GPUs
  (``DistributedDataParallel``'s buckets, ``gradient_as_bucket_view`` off);
* **optimizer**: AdamW's two fp32 moments per trainable parameter;
* **weight copies** (mixed precision): autocast's half-precision copy of every linear weight on the gradient's
  path, kept for the backward pass;
* **activations**: what autograd saves for the backward pass of the layers the stage computes, at the stage's
  micro-batch and sequence length. Per token and layer (``a`` = 4 bytes in ``32-true``, 2 in the mixed
  precisions, where norm inputs stay fp32 and every other saved tensor is an autocast copy): a layer whose
  weights train keeps ``a (6h + 2f) + 4 (2h)`` bytes (q/k/v and the attention output; the inputs of the two
  linear maps that read a norm's output; the FFN activation's input and output; the two norm inputs), a frozen
  layer the gradient only flows through ``a (4h + f) + 4 (2h)`` (a frozen linear map keeps no input); each adds two
  dropout masks (1 byte per element on CUDA), attention's log-sum-exp and the norms' statistics. The decoder's
  options add to this: rotary positions keep the rotated q and k (``2h``); SwiGLU keeps the FFN input map's
  ``2f`` outputs and SiLU's ``f`` (``f`` more for the product when the output map trains); RMSNorm keeps one
  statistic per row instead of two, and on the CPU, where it is composed of elementwise operations, its fp32
  normalised input when its weight trains (torch's fused CUDA kernel keeps its input and statistic only: read in
  torch's source, not measured here). Fused attention (flash / memory-efficient, what CUDA runs) keeps no (T x T)
  matrix. Layers below the first trainable one keep nothing when the embeddings are frozen (the bridge's copied
  layers; finetuning's embeddings); adaptation's frozen layers keep theirs because the gradient flows down to the
  embeddings. The LM heads see only the positions that predict (N rows: ``mask_prob`` x tokens for a masked LM,
  every position but a block's last for a causal one, ``families.predicted_rows``): per row and head their
  dense, GELU, norm and projection inputs as far as needed (a decoder's head is its final norm and the
  projection); a decoder's finetuning also runs the last layer's output through the final norm;
* **logits**: each LM head keeps its fp32 log-probabilities (N x V) for the backward pass;
* **backward**: the backward pass's own transient peak: the cross-entropy's two fp32 (N x V) gradients (one head
  at a time), or, where larger, the top layer's gradients with the embeddings' pending gradient.

``total`` is the sum (what ``torch.cuda.max_memory_allocated`` measures); ``needed`` adds what the card loses
besides: ``CONTEXT_GIB`` for the CUDA context, cuBLAS workspaces and NCCL buffers, and ``FRAGMENTATION`` of the
total for the caching allocator's rounding and fragmentation.

Not counted: ``torch.compile`` (it recomputes and fuses: a compiled stage needs less), rotary positions' cos and
sin tables (``seq_len x head_dim`` per layer, shared by the batch), padding (finetuning is
planned at the longest ``max_len`` of its tasks, the most a batch can hold), the optimizer step's temporaries
(fused AdamW has none; the step comes after the activations are freed), a finetuned mini-model (``body=mini``,
smaller than the primary model) and pinned host memory. ``tests/test_memory.py`` holds the formula to live tensor
memory measured on the CPU. Nothing here imports torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from minimodel.config.schema import ExperimentConfig, ModelConfig
from minimodel.errors import ConfigError
from minimodel.models import families
from minimodel.models.families import predicted_rows
from minimodel.systems import Body, stage_plan

GiB = 2**30
CONTEXT_GIB = 1.0  # CUDA context (~0.5 GiB), cuBLAS workspaces, NCCL buffers: outside torch's tensors
FRAGMENTATION = 0.10  # the caching allocator's rounding and fragmentation, as a share of the tensors
ACT_BYTES = {"32-true": 4, "bf16-mixed": 2, "16-mixed": 2}  # bytes of a saved activation element
QA_TASKS = ("mlqa", "xquad")  # the hub tasks with a span head (extractive QA)
INDEX_BYTES = 16  # per predicting row: its position and its target (int64)


@dataclass(frozen=True)
class StageModel:
    """What one stage's model holds, trains and computes: counts from the config (no torch)."""

    stage: str  # pretrain | bridge | adapt | finetune
    note: str  # what the model is, for the plan's table
    params: int  # every parameter the model holds (tied ones once)
    trainable: int
    grad_path_linear: int  # weights of the linear maps the gradient flows through (copied under autocast)
    train_layers: int  # computed layers whose weights train (full activations)
    frozen_layers: int  # computed frozen layers the gradient flows through (activations for the input gradient)
    embeddings: str  # what the embedding layer keeps: train | grad (frozen, the gradient flows through) | none
    heads: int  # LM heads computed by one forward pass (0: finetuning's task head)
    head_kind: str  # train (every weight trains) | adapt (only the output projection and bias) | frozen
    vocab: int  # rows of the token embeddings (the target vocabulary in adaptation)
    seq_len: int
    micro_batch: int  # 0: a stage this experiment does not run (MiniPost's pretraining is BL_BASE's)
    global_batch: int
    precision: str
    span_head: bool = False  # finetuning an extractive QA task: the span head keeps the last layer's output
    final_norm: bool = False  # finetuning reads the last layer through the primary head's (frozen) norm
    # bridge.objective=distill: besides the two heads' log-probabilities (heads = 2: the student's and the frozen
    # teacher's), KL(teacher || student) has two more (rows x vocabulary) fp32 tensors alive at its peak (exp(teacher)
    # and the difference, then the gradient: measured on the CPU, tests/test_memory.py)
    distill: bool = False
    affine_map: bool = False  # bridge.init=affine: the trained map keeps its input for its weight gradient


@dataclass(frozen=True)
class MemoryEstimate:
    """A stage's predicted per-GPU memory at one micro-batch, by component (bytes)."""

    stage: str
    micro_batch: int
    seq_len: int
    precision: str
    gpus: int
    weights: int
    gradients: int
    ddp_buckets: int
    optimizer: int
    weight_copies: int
    activations: int
    logits: int
    backward: int

    def components(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "int" and f.name not in
                ("micro_batch", "seq_len", "gpus")}

    @property
    def total(self) -> int:
        """The tensors at the peak (comparable with ``torch.cuda.max_memory_allocated``)."""
        return sum(self.components().values())

    @property
    def needed(self) -> int:
        """``total`` plus the allowance for the CUDA context and the allocator: what the card must have."""
        return round(self.total * (1 + FRAGMENTATION) + CONTEXT_GIB * GiB)


# ------------------------------------------------------------------------------------------ parameter counts


def norm_params(m: ModelConfig) -> int:
    """One norm: a LayerNorm's weight and bias (its weight only with ``model.bias: false``), an RMSNorm's weight."""
    return m.hidden * (2 if m.norm == "layernorm" and m.bias else 1)


def gated(m: ModelConfig) -> bool:
    """SwiGLU: the FFN's input map computes a gate and an up projection (2 x ffn outputs)."""
    return m.activation == "swiglu"


def ffn_in_width(m: ModelConfig) -> int:
    return (2 if gated(m) else 1) * m.ffn


def embedding_params(m: ModelConfig, vocab: int) -> int:
    """Token embeddings, learned position embeddings (rotary positions have none) and RoBERTa's LayerNorm."""
    positions = m.max_positions if m.positions == "learned" else 0
    return (vocab + positions) * m.hidden + (norm_params(m) if families.of(m).embedding_norm else 0)


def layer_params(m: ModelConfig) -> int:
    qkv = m.attn_width + 2 * m.kv_width
    # every linear map's (GPT-2's): q, k, v, both output maps (h each), the FFN input; or q, k, v's only (Qwen2)
    biases = qkv + 2 * m.hidden + ffn_in_width(m) if m.bias else qkv if m.qkv_bias else 0
    qk_norm = 2 * m.head_dim if m.qk_norm else 0  # Qwen3: one RMSNorm weight over head_dim each for q and k
    return layer_linear(m) + 2 * norm_params(m) + biases + qk_norm


def layer_linear(m: ModelConfig) -> int:  # qkv, attention output, FFN in and out
    return m.layer_linear


def head_linear(m: ModelConfig) -> int:
    """The weights of an LM head's own linear maps: RoBERTa's dense layer (a decoder's head has none)."""
    return m.hidden**2 if families.of(m).head_dense else 0


def head_params(m: ModelConfig, vocab: int, bias: bool = True) -> int:
    """An LM head without its output projection (``output_params``): RoBERTa's dense layer, LayerNorm and output
    bias (``bias``: the head's own; adaptation ties every head's into one), a decoder's final norm."""
    f = families.of(m)
    dense = head_linear(m) + (m.hidden if f.head_dense else 0)
    return dense + norm_params(m) + (vocab if bias and f.output_bias else 0)


def output_params(m: ModelConfig, vocab: int) -> int:
    """The output projection where it is not the token embeddings (``model.tie_embeddings: false``): one matrix,
    the primary head's, shared by every head; 0 when tied (counted with the embeddings)."""
    return 0 if m.tie_embeddings else vocab * m.hidden


def task_head_params(hidden: int, qa: bool, labels: int = 3) -> int:
    """Finetuning's head: a span head, or a classification head of ``labels`` classes (3, XNLI's: a few
    parameters more or less do not show)."""
    return 2 * hidden + 2 if qa else hidden**2 + hidden + labels * (hidden + 1)


def is_qa(cfg: ExperimentConfig, task: str) -> bool:
    return cfg.tasks[task].kind == "hub" and task in QA_TASKS


# ------------------------------------------------------------------------------------------ the stages' models


def stage_models(cfg: ExperimentConfig) -> list[StageModel]:
    """The training stages of the experiment's system, each with the model it trains, as ``stages/*.py`` build
    them: pretraining the whole model with every head; MiniPost's bridge the mini-model (embeddings and head
    frozen, the copied layers below it too); adaptation its step-2 body (``systems``: the whole model, MiniJoint's
    bottom layers or the bridged mini-model; with ``adapt.schedule`` its deepest phase) over the target
    vocabulary; finetuning the primary model at the longest ``max_len`` of its tasks, embeddings frozen."""
    pretrain, adapt = stage_plan(cfg, "pretrain"), stage_plan(cfg, "adapt")
    s, m, d = pretrain.system, cfg.model, cfg.data
    lm = "LM" if families.causal(m) else "MLM"
    out: list[StageModel] = []
    if pretrain.external_primary:  # a public model (bridge.source): no step 1 here
        out.append(StageModel("pretrain", f"none (the public model {cfg.bridge.source})", 0, 0, 0, 0, 0, "none", 0,
                              "train", m.vocab_size, d.seq_len, 0, 0, cfg.pretrain.trainer.precision))
    elif pretrain.runs_here:
        p, heads = cfg.pretrain.optim, len(m.head_names)
        params = (embedding_params(m, m.vocab_size) + m.layers * layer_params(m)
                  + heads * head_params(m, m.vocab_size) + output_params(m, m.vocab_size))
        out.append(StageModel(
            "pretrain", f"{m.layers} layers, {heads} {lm} head{'s' if heads > 1 else ''}", params, params,
            m.layers * layer_linear(m) + heads * head_linear(m) + m.vocab_size * m.hidden, m.layers, 0, "train",
            heads, "train", m.vocab_size, d.seq_len, p.micro_batch, p.global_batch, cfg.pretrain.trainer.precision))
    elif s.primary_from:
        out.append(StageModel("pretrain", f"{s.primary_from}'s (shared)", 0, 0, 0, 0, 0, "none", 0, "train",
                              m.vocab_size, d.seq_len, 0, 0, cfg.pretrain.trainer.precision))
    if s.bridge:
        b = cfg.bridge
        affine = m.hidden**2 + m.hidden if b.init == "affine" else 0  # bridge.init=affine: a trained h x h map
        params = (embedding_params(m, m.vocab_size) + (b.depth + b.layers) * layer_params(m)
                  + head_params(m, m.vocab_size) + output_params(m, m.vocab_size) + affine)
        distill = b.objective == "distill"  # the frozen source model stays loaded as the teacher
        teacher = (embedding_params(m, m.vocab_size) + m.layers * layer_params(m) + head_params(m, m.vocab_size)
                   + output_params(m, m.vocab_size)) if distill else 0
        note = (f"{b.depth} copied + {b.layers} trained layers" + (" + affine map" if affine else "")
                + (f", {m.layers}-layer teacher" if distill else ""))
        out.append(StageModel(
            "bridge", note, params + teacher, b.layers * layer_params(m) + affine,
            b.layers * layer_linear(m) + head_linear(m) + m.vocab_size * m.hidden + affine, b.layers, 0, "none",
            2 if distill else 1, "frozen", m.vocab_size, d.seq_len, b.optim.micro_batch, b.optim.global_batch,
            b.trainer.precision, distill=distill, affine_map=bool(affine)))
    a, vocab, depth = cfg.adapt.optim, adapt.target_vocab, adapt.depth  # (extend: every row has AdamW moments)
    heads = len(adapt.phases) if cfg.adapt.schedule else 1  # a staged body holds every phase's head
    body = {Body.OWN: "whole model", Body.HEAD: "bottom layers", Body.BRIDGE: "bridged mini-model"}[adapt.body]
    # trained: the new embeddings, the heads' one output bias (tie_biases) and an untied output projection
    learned = vocab * m.hidden + (vocab if families.of(m).output_bias else 0) + output_params(m, vocab)
    out.append(StageModel(
        "adapt", f"{depth} layers ({body}), vocab {vocab:,}",
        embedding_params(m, vocab) + depth * layer_params(m) + heads * head_params(m, vocab, bias=False)
        + learned - vocab * m.hidden, learned, depth * layer_linear(m) + head_linear(m) + vocab * m.hidden, 0, depth,
        "grad", 1, "adapt", vocab, d.seq_len, a.micro_batch, a.global_batch, cfg.adapt.trainer.precision))
    f = cfg.finetune
    if f.tasks:
        task = max(f.tasks, key=lambda t: cfg.tasks[t].max_len)
        qa = is_qa(cfg, task)
        head = task_head_params(m.hidden, qa)
        k = min(f.layer or m.layers, m.layers)  # finetune.layer: the layers above the readout are neither run nor trained
        note = f"{m.layers} layers" if k == m.layers else f"{m.layers} layers, read after {k} (finetune.layer)"
        out.append(StageModel(
            "finetune", f"{note}, {task} (max_len {cfg.tasks[task].max_len})",
            embedding_params(m, m.vocab_size) + m.layers * layer_params(m) + head_params(m, m.vocab_size)
            + output_params(m, m.vocab_size) + head,
            k * layer_params(m) + head, k * layer_linear(m) + (0 if qa else m.hidden**2), k, 0,
            "none", 0, "train", m.vocab_size, cfg.tasks[task].max_len, f.micro_batch, f.batch_size,
            f.trainer.precision, span_head=qa, final_norm=families.of(m).encode_norm))
    return out


# ------------------------------------------------------------------------------------------ the estimate


def act_bytes(sm: StageModel, device: str = "cuda") -> int:
    """Bytes of a saved activation element in ``sm``'s precision; ``auto`` as it resolves on ``device``: on CUDA
    bf16 or fp16 (2 bytes either way), on the CPU what ``resolve_precision`` chooses on this machine."""
    precision = sm.precision
    if precision == "auto":
        if device == "cuda":
            return 2
        import torch

        from minimodel.training.device import resolve_precision

        precision = resolve_precision(torch.device(device)).precision
    if precision not in ACT_BYTES:
        key = "finetune.trainer.precision" if sm.stage == "finetune" else f"{sm.stage}.trainer.precision"
        raise ConfigError(f"{key}={sm.precision!r}: the memory plan knows auto, {', '.join(ACT_BYTES)}")
    return ACT_BYTES[precision]


def mask_bytes(device: str, a: int) -> int:
    """Bytes per element of a dropout mask: CUDA's fused dropout keeps a bool mask; the CPU's multiplies by a
    mask of the input's dtype (``a`` bytes)."""
    return 1 if device == "cuda" else a


def norm_bytes(m: ModelConfig, trains: bool, device: str = "cuda") -> int:
    """Bytes one norm keeps per row: its fp32 input and statistics (LayerNorm: mean and 1/std; RMSNorm: 1/rms)
    and, on the CPU, where RMSNorm is composed of elementwise operations, its fp32 normalised input for its
    weight's gradient (torch's fused CUDA kernel recomputes it)."""
    if m.norm == "rmsnorm":
        return 4 * m.hidden + 4 + (4 * m.hidden if trains and device != "cuda" else 0)
    return 4 * m.hidden + 8


def layer_activation_bytes(m: ModelConfig, a: int, trains: bool, device: str = "cuda") -> int:
    """Bytes one layer saves per token (see the module's docstring): ``a``-byte elements (the inputs of the linear
    maps that read a norm's output where they train, q/k/v, rotary's rotated q and k, the attention output, the
    FFN's activation inputs and, where the output map trains, the tensor it reads), two norms, two dropout masks
    and attention's log-sum-exp."""
    h, f, q, kv = m.hidden, m.ffn, m.attn_width, m.kv_width
    normed = 2 * h if trains else 0
    # q, k, v (narrower k and v under grouped-query attention; CUDA expands them to every query head for the
    # attention kernel, the CPU's kernel reads them grouped: decoder.native_gqa), rotary's rotated q and k, the
    # attention output
    grouped = 2 * q if m.key_value_heads != m.heads and device == "cuda" else 0
    attention = q + 2 * kv + (q + kv if m.positions == "rotary" else 0) + grouped + q
    # measured on the CPU, not derived: a bf16 attention there runs in fp32 (decoder.cpu_bf16_backward), and Qwen3's
    # q/k RMSNorm (elementwise operations) keeps fp32 inputs (and, where its weights train, normalised ones)
    upcast = ((2 if trains else 1) * (2 * q + 2 * kv)
              if a == 2 and device != "cuda" and families.of(m).cpu_fp32_attention else 0)
    if m.qk_norm and device != "cuda":
        upcast += 4 * (q + kv) * ((2 if trains else 1) if a == 2 else (1 if trains else 0))
    ffn = ffn_in_width(m) + (f if gated(m) else 0) + (f if trains else 0)  # SwiGLU: SiLU's output too
    return (a * (normed + attention + ffn) + upcast + 2 * norm_bytes(m, trains, device)
            + 2 * h * mask_bytes(device, a) + 4 * m.heads)


def embedding_activation_bytes(m: ModelConfig, kind: str, device: str = "cuda") -> int:
    """Per token: the dropout mask (of an fp32 tensor) and RoBERTa's embedding layer: its LayerNorm's and, when
    the position embeddings train, their int64 indices (made per token from the input ids; a decoder's positions
    0..T-1 are one row shared by the batch)."""
    if kind == "none":
        return 0
    roberta = norm_bytes(m, False, device) + (8 if kind == "train" else 0) if families.of(m).embedding_norm else 0
    return mask_bytes(device, 4) * m.hidden + roberta


def head_row_bytes(m: ModelConfig, a: int, kind: str, device: str = "cuda") -> int:
    """Per predicting row and head: its norm (fp32 input and statistics) and the ``a``-byte inputs of RoBERTa's
    GELU, of its dense map where it trains, and of the projection where it trains (a decoder's head: the norm
    and the projection)."""
    if families.of(m).head_dense:
        copies = {"train": 3, "adapt": 2, "frozen": 1}[kind]
    else:
        copies = 0 if kind == "frozen" else 1
    return a * copies * m.hidden + norm_bytes(m, kind == "train", device)


def logit_tensors(sm: StageModel) -> int:
    """The fp32 (predicted rows x vocabulary) tensors alive at the loss's peak: each head's log-probabilities, and
    under distillation the KL divergence's two more (``StageModel.distill``)."""
    return sm.heads + (2 if sm.distill else 0)


def teacher_forward_bytes(m: ModelConfig, a: int, tokens: int) -> int:
    """``bridge.objective=distill``: the frozen teacher runs its forward pass after the student's, whose saved tensors
    are held. Its widest moment, per token, is inside a layer's FFN without gradient: the FFN's pre-activation and
    activation output beside its input, the residual stream and the norms' (5.5h in all, measured on the CPU),
    ``a``-byte elements. It sets the stage's peak only where the KL divergence's (rows x vocabulary) tensors are
    small (a tiny vocabulary, or few predicted rows)."""
    return tokens * a * (ffn_in_width(m) + m.ffn + 11 * m.hidden // 2)


def backward_bytes(m: ModelConfig, sm: StageModel, a: int, tokens: int, rows: int, device: str = "cuda") -> int:
    """The backward pass's transient peak over the saved tensors: the cross-entropy's two fp32 (N x V) gradients
    at the first head, or, where larger, the top layer's: the FFN's gradients and the residual's two fp32 ones,
    with the embeddings' gradient from the tied projection (pending until the embedding layer's backward), less
    what is freed by then (the logits, the top layer's norm input and mask)."""
    h, f = m.hidden, m.ffn
    head = 2 * rows * sm.vocab * 4
    if not sm.train_layers + sm.frozen_layers:
        return head
    pending = 4 * sm.vocab * h if sm.embeddings in ("train", "grad") else 0
    freed = logit_tensors(sm) * rows * sm.vocab * 4 + tokens * (4 * h + mask_bytes(device, a) * h)
    # the FFN's gradients at their peak: GELU's output and input (2f); SwiGLU's product and its two inputs (3f),
    # less the product's own output, saved for the output map's weight gradient and freed by then, where it trains
    ffn = (3 * f - (f if sm.train_layers else 0)) if gated(m) else 2 * f
    return max(head, tokens * (ffn * a + 2 * h * 4) + pending - freed)


def estimate(cfg: ExperimentConfig, sm: StageModel, micro_batch: int | None = None, gpus: int = 1,
             device: str = "cuda") -> MemoryEstimate:
    """The memory of ``sm`` (one of ``stage_models(cfg)``) at ``micro_batch`` (default: the configured one) on
    each of ``gpus`` GPUs. ``device``: cuda (the plan) or cpu (dropout masks of the input's dtype: what the
    tests measure)."""
    m = cfg.model
    mb = sm.micro_batch if micro_batch is None else micro_batch
    a = act_bytes(sm, device)
    tokens = mb * sm.seq_len
    rows = predicted_rows(cfg, mb, sm.seq_len) if sm.heads else 0
    act = tokens * (sm.train_layers * layer_activation_bytes(m, a, True, device)
                    + sm.frozen_layers * layer_activation_bytes(m, a, False, device)
                    + embedding_activation_bytes(m, sm.embeddings, device)
                    + (norm_bytes(m, False, device) if sm.final_norm else 0)
                    + (a * m.hidden if sm.span_head else 0) + (a * m.hidden if sm.affine_map else 0))
    act += rows * (sm.heads * head_row_bytes(m, a, sm.head_kind, device) + INDEX_BYTES) if rows else 0
    logits = rows * sm.vocab * 4 * logit_tensors(sm)
    backward = backward_bytes(m, sm, a, tokens, rows, device)
    if sm.distill:  # the teacher's forward pass comes before any logits exist: its peak is over act alone
        backward = max(backward, teacher_forward_bytes(m, a, tokens) - logits)
    return MemoryEstimate(
        stage=sm.stage, micro_batch=mb, seq_len=sm.seq_len, precision=sm.precision, gpus=gpus,
        weights=4 * sm.params, gradients=4 * sm.trainable, ddp_buckets=4 * sm.trainable if gpus > 1 else 0,
        optimizer=8 * sm.trainable, weight_copies=2 * sm.grad_path_linear if a < 4 else 0, activations=act,
        logits=logits, backward=backward)


def micro_batches(global_batch: int, gpus: int) -> list[int]:
    """The micro-batches a stage may use on ``gpus`` GPUs: the divisors of ``global_batch / gpus`` (each GPU
    accumulates a whole number of them per update); [] when ``gpus`` does not divide the batch."""
    if gpus < 1 or global_batch % gpus:
        return []
    per_gpu = global_batch // gpus
    small = [n for n in range(1, math.isqrt(per_gpu) + 1) if per_gpu % n == 0]  # bounded: O(sqrt) of the batch
    return sorted({*small, *(per_gpu // n for n in small)})
