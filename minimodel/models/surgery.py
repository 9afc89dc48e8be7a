"""Model surgery: extract a MiniJoint mini-model, build a MiniPost mini-model, initialise and swap
token embeddings, plug adapted embeddings into the primary model, and freeze by name.

Every function takes and returns plain models of any family (``families.build``: ``RobertaMLM``, ``DecoderLM``), found
by module names (``embeddings.tokens``, ``layers``, ``heads``); nothing here reads files except ``plug_embeddings``,
which checks an adaptation checkpoint against a tokenizer. A head with no ``bias`` (a causal LM's) gets none, and a
model whose output projection is its own matrix (``model.tie_embeddings: false``) has it swapped and trained with
the embeddings."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from minimodel.config.checks import BRIDGE_INITS
from minimodel.errors import UserError
from minimodel.models.families import build
from minimodel.models.model import PRIMARY, ModelConfig, RobertaMLM

if TYPE_CHECKING:
    from minimodel.store.checkpoints import Adaptation


class PlugError(UserError, ValueError):
    """Embeddings that do not fit the model or tokenizer they are plugged into."""


# --------------------------------------------------------------------------------------------- freezing


def freeze_all_but(model: nn.Module, trainable: Callable[[str], bool]) -> int:
    """Set ``requires_grad`` from ``trainable(name)`` for every parameter; returns the trainable count.

    Tied parameters appear once in ``named_parameters()``, under their first name."""
    for name, p in model.named_parameters():
        p.requires_grad_(trainable(name))
    return trainable_parameters(model)


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def adaptation_trainable(name: str) -> bool:
    """Step 2: the token embeddings (tied to the output projection), the MLM output bias where the heads have one, and
    the output projection where it is not tied to the embeddings (it then appears under the primary head's name)."""
    return name in ("embeddings.tokens.weight", f"heads.{PRIMARY}.bias", f"heads.{PRIMARY}.decoder.weight")


def bridge_trainable(depth: int) -> Callable[[str], bool]:
    """Step 1b: only the layers above ``depth`` (the inserted bridge layers) and the affine map before them, where
    the mini-model has one (``bridge.init=affine``)."""

    def trainable(name: str) -> bool:
        if name.startswith("affine."):
            return True
        if not name.startswith("layers."):
            return False
        return int(name.split(".")[1]) >= depth

    return trainable


# --------------------------------------------------------------------------------------------- mini-models


def _copy_into(dst: nn.Module, src: nn.Module) -> None:
    dst.load_state_dict(copy.deepcopy(src.state_dict()))


def extract_mini(model: RobertaMLM, depth: int, head: str | None = None) -> RobertaMLM:
    """MiniJoint's mini-model: embeddings + layers 1..depth + the head at ``depth`` (as its primary head).

    Weights are copied; the result computes exactly what ``model`` computes on its bottom-``depth`` path."""
    head = head or f"l{depth}"
    if model.cfg.head_depth(head) != depth:
        raise ValueError(f"head {head!r} sits after layer {model.cfg.head_depth(head)}, not {depth}")
    return staged_body(model, [head])[0]


def staged_body(model: RobertaMLM, heads: Sequence[str]) -> tuple[RobertaMLM, dict[str, str]]:
    """The body of progressive adaptation: embeddings + layers 1..D (D: the deepest of ``heads``) with the
    heads in ``heads`` (the deepest as its primary head, the others under their names). Weights are copied.
    Returns the body and, for each head of ``model`` in ``heads``, its name in the body."""
    names = staged_names(model.cfg, heads)
    depth = max(model.cfg.head_depth(h) for h in heads)
    others = sorted(int(name[1:]) for name in names.values() if name != PRIMARY)
    body = build(replace(model.cfg, layers=depth, mini_heads=others))
    _copy_into(body.embeddings, model.embeddings)
    for i in range(depth):
        _copy_into(body.layers[i], model.layers[i])
    for h, name in names.items():
        _copy_into(body.heads[name], model.heads[h])
    body.tie_weights()
    return body, names


def staged_names(cfg: ModelConfig, heads: Sequence[str]) -> dict[str, str]:
    """The name each of ``heads`` (of a model with config ``cfg``) has in its ``staged_body``: the deepest is the
    body's primary head, the others keep ``l{N}``."""
    depths = {h: cfg.head_depth(h) for h in heads}
    deepest = max(depths, key=depths.get)  # type: ignore[arg-type]
    return {h: PRIMARY if h == deepest else f"l{d}" for h, d in depths.items()}


def tie_biases(model: RobertaMLM) -> None:
    """Every MLM head's output bias becomes the primary head's (one parameter, as the projections share the
    embeddings): progressive adaptation trains one output bias across its phases."""
    for name, head in model.heads.items():
        if name != PRIMARY and getattr(head, "bias", None) is not None:
            head.bias = model.heads[PRIMARY].bias


def build_minipost(model: RobertaMLM, depth: int, bridge_layers: int, seed: int = 0, init: str = "random",
                   affine: tuple[Tensor, Tensor] | None = None) -> RobertaMLM:
    """MiniPost (step 1b): embeddings + layers 1..depth + the primary MLM head of ``model``, with
    ``bridge_layers`` layers inserted between them. Only the inserted layers (and an affine map) train.

    ``init`` (``bridge.init``): ``random``, newly initialised layers (the paper); ``copy``, copies of the source's
    top ``bridge_layers`` layers, so the mini-model ends with the layers that feed the head; ``affine``, those copies
    after an affine map of layer ``depth``'s state (``model.affine_after``) whose (weight, bias) is ``affine``
    (``bridge_init.fit_affine``; the identity where None)."""
    if not 1 <= depth < model.cfg.layers:
        raise ValueError(f"depth must be in 1..{model.cfg.layers - 1}, got {depth}")
    if init not in BRIDGE_INITS:
        raise ValueError(f"init must be one of {', '.join(BRIDGE_INITS)}, got {init!r}")
    if model.cfg.affine_after:
        raise ValueError("the source model is itself a mini-model with an affine map (model.affine_after); "
                         "build a mini-model from a full model")
    top = model.cfg.layers - bridge_layers  # the first of the source's top layers (0-based)
    if init != "random" and top < depth:
        raise ValueError(f"init={init} copies the top {bridge_layers} of {model.cfg.layers} layers, which overlap "
                         f"the bottom {depth}: depth + bridge layers must be at most {model.cfg.layers}")
    cfg = replace(model.cfg, layers=depth + bridge_layers, mini_heads=[],
                  affine_after=depth if init == "affine" else 0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        mini = build(cfg)
    _copy_into(mini.embeddings, model.embeddings)
    for i in range(depth):
        _copy_into(mini.layers[i], model.layers[i])
    if init != "random":
        for j in range(bridge_layers):
            _copy_into(mini.layers[depth + j], model.layers[top + j])
    if init == "affine" and affine is not None:
        weight, bias = affine
        with torch.no_grad():
            mini.affine.weight.copy_(weight)
            mini.affine.bias.copy_(bias)
    _copy_into(mini.heads[PRIMARY], model.heads[PRIMARY])
    mini.tie_weights()
    freeze_all_but(mini, bridge_trainable(depth))
    return mini


def primary_only(model: RobertaMLM) -> RobertaMLM:
    """The model without its secondary heads (what steps 3 and 4 use)."""
    if not model.cfg.mini_heads:
        return model
    out = build(replace(model.cfg, mini_heads=[]))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("heads.") or k.startswith("heads.primary.")}
    out.load_state_dict(state)
    out.tie_weights()
    return out


# --------------------------------------------------------------------------------------------- embeddings


def overlap_init(source: Tensor, source_pieces: Sequence[str | None], target_pieces: Sequence[str | None],
                 std: float = 0.02, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Target embeddings as in the paper's footnote 1 (Pfeiffer et al., 2021): a piece that also exists
    in the source vocabulary copies its source embedding, every other piece is drawn from N(0, std).
    ``None`` pieces match nothing; a piece present twice in the source matches its first (lowest) id.

    Returns the (V_trg, h) matrix and, per target row, the source row it copies (-1: not copied)."""
    index: dict[str, int] = {}
    for i, piece in enumerate(source_pieces):
        if piece is not None:
            index.setdefault(piece, i)
    weight = torch.empty(len(target_pieces), source.shape[1], dtype=source.dtype)
    weight.normal_(0.0, std, generator=generator)
    rows = torch.tensor([index.get(p, -1) if p is not None else -1 for p in target_pieces], dtype=torch.long)
    copied = rows >= 0
    if copied.any():
        weight[copied] = source.detach()[rows[copied]].to(weight.dtype)
    return weight, rows


@dataclass
class MeanInit:
    """``mean_init``'s answer: the target matrix and how each of its rows was made."""

    weight: Tensor  # (V_trg, h)
    rows: Tensor  # per target piece: the source row it copies (-1: not copied), as ``overlap_init``
    segments: list[tuple[int, ...] | None]  # per target piece: the source rows it is the mean of (None: not a mean)
    out_of_range: int = 0  # segmentations refused for naming a row the source matrix does not have

    @property
    def means(self) -> Tensor:
        return torch.tensor([s is not None for s in self.segments], dtype=torch.bool)

    @property
    def info(self) -> dict[str, int]:
        copied, means = int((self.rows >= 0).sum()), int(self.means.sum())
        return {"copied": copied, "mean": means, "random": len(self.segments) - copied - means}

    def apply(self, values: Tensor, fallback: Tensor) -> Tensor:
        """``fallback`` (one entry per target piece) with every mean piece's entry the mean of ``values``' entries
        (rows of a matrix, or numbers of a vector: the source output biases) over its segmentation; a new tensor."""
        out = fallback.detach().clone()
        chosen = [i for i, s in enumerate(self.segments) if s is not None]
        if not chosen:
            return out
        index = torch.tensor([j for i in chosen for j in self.segments[i]], dtype=torch.long)  # type: ignore[union-attr]
        owner = torch.tensor([k for k, i in enumerate(chosen) for _ in self.segments[i]], dtype=torch.long)  # type: ignore[union-attr]
        picked = values.detach()[index].to(torch.float64)
        sums = torch.zeros((len(chosen), *values.shape[1:]), dtype=torch.float64).index_add_(0, owner, picked)
        counts = torch.bincount(owner, minlength=len(chosen)).to(torch.float64)
        out[torch.tensor(chosen)] = (sums / counts.view(-1, *[1] * (values.dim() - 1))).to(out.dtype)
        return out


def mean_init(source: Tensor, source_pieces: Sequence[str | None], target_pieces: Sequence[str | None],
              segments: Sequence[Sequence[int] | None], std: float = 0.02,
              generator: torch.Generator | None = None) -> MeanInit:
    """Target embeddings by fast vocabulary transfer (Gee et al., 2022): a target piece that is also a source piece
    copies its source embedding (as ``overlap_init``); every other piece with a segmentation by the source tokenizer
    (``segments[i]``: source token ids) is the mean of those ids' rows of ``source``; the rest (no segmentation: None
    or empty, or one naming a row ``source`` does not have) keep ``overlap_init``'s N(0, std) draw from ``generator``.

    Rows are indexed by token id: ``source`` may have more rows than ``source_pieces`` (a matrix padded past the
    tokenizer's vocabulary), and the draws are exactly ``overlap_init``'s (same generator, same order), so a piece
    that falls back gets what the overlap initialisation gives it."""
    weight, rows = overlap_init(source, source_pieces, target_pieces, std, generator)
    if len(segments) != len(target_pieces):
        raise ValueError(f"{len(segments)} segmentations for {len(target_pieces)} target pieces")
    n_rows, out_of_range = source.shape[0], 0
    kept: list[tuple[int, ...] | None] = []
    for copied, seg in zip((rows >= 0).tolist(), segments):
        ids = tuple(int(j) for j in seg) if seg else ()
        if copied or not ids:
            kept.append(None)
        elif any(j < 0 or j >= n_rows for j in ids):
            kept.append(None)
            out_of_range += 1
        else:
            kept.append(ids)
    r = MeanInit(weight, rows, kept, out_of_range)
    r.weight = r.apply(source, weight)
    return r


def swap_embeddings(model: RobertaMLM, weight: Tensor, bias: Tensor | None = None,
                    output: Tensor | None = None) -> RobertaMLM:
    """Install token embeddings of any vocabulary size (and the primary head's output bias), in place.

    The new matrix becomes the one object every MLM head's projection is tied to. Without a
    ``bias``, heads keep theirs when the size is unchanged and get zeros otherwise; heads without a bias get none.
    A model with an output projection of its own (``model.tie_embeddings: false``) needs ``output`` (V, h) too."""
    vocab, hidden = weight.shape
    if hidden != model.cfg.hidden:
        raise PlugError(f"embeddings have width {hidden}, the model {model.cfg.hidden}")
    pad = model.cfg.pad_id
    if pad >= vocab:
        raise PlugError(f"embeddings have {vocab} rows, fewer than the padding id {pad} + 1")
    untied = not model.cfg.tie_embeddings
    if untied and (output is None or tuple(output.shape) != tuple(weight.shape)):
        raise PlugError(f"the model's output projection is not tied to its embeddings: it needs an output matrix of "
                        f"the embeddings' shape {tuple(weight.shape)}, got "
                        f"{None if output is None else tuple(output.shape)}")
    old_vocab = model.cfg.vocab_size
    tokens = nn.Embedding(vocab, hidden, padding_idx=model.embeddings.tokens.padding_idx)
    with torch.no_grad():
        tokens.weight.copy_(weight)
    tokens.weight.requires_grad_(model.embeddings.tokens.weight.requires_grad)
    model.embeddings.tokens = tokens
    model.cfg = replace(model.cfg, vocab_size=vocab)
    out_grad = model.heads[PRIMARY].decoder.weight.requires_grad
    for name, head in model.heads.items():
        head.decoder = nn.Linear(hidden, vocab, bias=False)
        if untied and name == PRIMARY:
            head.decoder.weight = nn.Parameter(output.detach().clone().to(weight.dtype), requires_grad=out_grad)
        if getattr(head, "bias", None) is None:
            continue
        new_bias = bias if (bias is not None and name == PRIMARY) else (head.bias.detach() if vocab == old_vocab else None)
        requires_grad = head.bias.requires_grad
        head.bias = nn.Parameter(new_bias.clone() if new_bias is not None else torch.zeros(vocab),
                                 requires_grad=requires_grad)
    model.tie_weights()
    return model


def adaptation_state(model: RobertaMLM) -> dict[str, Tensor]:
    """What step 4 needs from an adapted model: embeddings, output bias (empty where the heads have none) and the
    output projection where it is not tied to the embeddings (else None); detached CPU copies."""
    head = model.heads[PRIMARY]
    bias = head.bias.detach().cpu().clone() if getattr(head, "bias", None) is not None else torch.zeros(0)
    output = None if model.cfg.tie_embeddings else head.decoder.weight.detach().cpu().clone()
    return {"embeddings": model.embeddings.tokens.weight.detach().cpu().clone(), "bias": bias, "output": output}


def plug_embeddings(model: RobertaMLM, adapted: Adaptation, tokenizer_sha256: str, tokenizer_vocab: int) -> RobertaMLM:
    """Install adapted target-language embeddings (an adaptation checkpoint) into ``model``.

    The tokenizer that will feed the model must be the one the embeddings were trained with."""
    emb = adapted.embeddings
    where = f"adaptation checkpoint ({adapted.system}, {adapted.lang}, step {adapted.step})"
    if adapted.tokenizer["sha256"] != tokenizer_sha256:
        raise PlugError(f"{where} was trained with tokenizer {adapted.tokenizer['path']} "
                        f"(sha256 {adapted.tokenizer['sha256'][:12]}), not the one given (sha256 {tokenizer_sha256[:12]})")
    if emb.shape[0] != tokenizer_vocab:
        raise PlugError(f"{where} has {emb.shape[0]} embedding rows but the tokenizer has {tokenizer_vocab} pieces")
    if emb.shape[1] != model.cfg.hidden:
        raise PlugError(f"{where} has embeddings of width {emb.shape[1]}, the model expects {model.cfg.hidden}")
    bias = adapted.bias if adapted.bias.numel() else None
    return swap_embeddings(model, emb, bias, adapted.output)
