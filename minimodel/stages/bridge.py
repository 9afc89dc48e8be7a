"""Step 1b (MiniPost): from a 12-layer MLM (a BL_BASE checkpoint or a Hugging Face RoBERTa/XLM-R
directory), copy the embeddings, the bottom N layers and the MLM head, insert ``bridge.layers`` new
layers between them, and train only the new layers with MLM in the source language (and, ``bridge.langs``, in
other languages' text in the source tokenizer)."""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from minimodel.config.checks import VOCABULARIES
from minimodel.config.schema import ExperimentConfig, is_hf_source
from minimodel.data.mlm import BlockDataset, MixPart, MLMDataModule, mlm_datamodule
from minimodel.data.prepare import load_prepared_tokenizer, load_source_tokenizer, prepared_paths
from minimodel.data.shards import ShardError, TokenStream
from minimodel.data.tokenizer import AnyTokenizer, TokenizerError
from minimodel.errors import ConfigError
from minimodel.flops import LayerShape, bridge_flops
from minimodel.log import get_logger, process_rank
from minimodel.models.bridge_init import AffineFit, agreement, fit_affine, layer_states, mean_lm_loss
from minimodel.models.families import DEFAULT as DEFAULT_FAMILY
from minimodel.models.families import hf_module, predicted_share, sequence_lengths
from minimodel.models.model import RobertaMLM
from minimodel.models.surgery import bridge_trainable, build_minipost, primary_only, trainable_parameters
from minimodel.store import atomic
from minimodel.store.checkpoints import CheckpointError, TrainingMeta, load_final_model, load_trained_model
from minimodel.store.layout import BRIDGE_INFO, is_done
from minimodel.store.provenance import data_input, primary_source, producers
from minimodel.systems import stage_plan
from minimodel.training.mlm import MLMModule
from minimodel.training.runner import Runner, Stage, StageResult, Training

log = get_logger(__name__)


def load_primary(source: str, family: str = DEFAULT_FAMILY, lengths: dict[str, int] | None = None,
                 stage: str = "", runs_dir: str = "") -> tuple[RobertaMLM, dict]:
    """A training checkpoint file (without its secondary heads) and the tokenizer record stored with it, or a
    Hugging Face model directory / hub id of the model family ``family`` (``model.family``; read by that family's
    ``from_hf``), whose tokenizer is its own: an empty record. ``lengths`` (``families.sequence_lengths``): the
    sequences an outside model will run, checked against its own positions and window before it is loaded.
    ``stage``: the stage (pretrain) of this experiment whose finished run wrote ``source`` (its final checkpoint: a
    damaged one is rebuilt by rerunning it); "" for ``bridge.source``, a file of the user's, which no message ever says
    to delete. ``runs_dir`` (the experiment's): a GGUF source is read from its copy converted once there."""
    path = Path(source)
    if stage:
        model, meta = load_final_model(path, stage)
        return primary_only(model), meta.tokenizer
    if is_hf_source(source):  # a directory, a hub id, or a GGUF file; in training mode, as a checkpoint loads
        return hf_module(family).from_hf(source, lengths=lengths, runs_dir=runs_dir).train(), {}
    if path.is_file():
        try:
            model, meta = load_trained_model(path)
        except CheckpointError as e:
            if str(e).startswith("refusing to load"):  # its own advice: do not use files of unknown origin
                raise
            raise CheckpointError(not_a_source(source, e)) from e
        return primary_only(model), meta.tokenizer
    raise CheckpointError(f"bridge source {source} not found (pretrain BL_BASE first, or set bridge.source)")


def not_a_source(source: str, e: Exception) -> str:
    """The error for a ``bridge.source`` file that does not load as a training checkpoint (a README, a damaged file):
    what it is not, what the setting takes, and that the file was left alone. (A GGUF file, its suffix in any case, is
    read as one: ``is_hf_source``.)"""
    path = Path(source)
    return (f"bridge.source={source}: not a model minimodel can read ({e}). bridge.source names a training "
            f"checkpoint that `minimodel pretrain` wrote (.../pretrain/checkpoints/last.ckpt), a Hugging Face model "
            f"directory or hub id, or a GGUF file (*.gguf, in any case); {path.name} was left as it is")


def check_depth(cfg: ExperimentConfig, layers: int, source: str) -> None:
    """``bridge.depth`` (and, copying the top layers, ``bridge.layers``) against the layers the source model has,
    which an outside model decides (the configuration's checks know ``model.layers`` only): a ``ConfigError`` before
    anything is written."""
    b = cfg.bridge
    if not 1 <= b.depth < layers:
        fit = f"set bridge.depth in 1..{layers - 1}" if layers > 1 else "a mini-model needs a source of 2 layers or more"
        raise ConfigError(f"bridge.depth={b.depth}: the source model {source} has {layers} layer(s), and the "
                          f"mini-model keeps its layers 1..bridge.depth below the top one: {fit}")
    if b.init != "random" and b.depth + b.layers > layers:
        raise ConfigError(f"bridge.init={b.init} copies the source's top bridge.layers={b.layers} layers above its "
                          f"bottom bridge.depth={b.depth}, but the source model {source} has {layers} layer(s): "
                          f"depth + layers must be at most {layers}")


def fit_blocks(data: MLMDataModule, tokens: int) -> list[torch.Tensor]:
    """The first training blocks of ``data`` (unmasked token ids) that hold at least ``tokens`` tokens, in order."""
    train = data.own_train
    n = min(len(train), max(1, math.ceil(tokens / data.seq_len)))
    return [torch.from_numpy(train.block(train.blocks[i]).astype(np.int64)) for i in range(n)]


def fit_bridge_map(cfg: ExperimentConfig, primary: RobertaMLM, data: MLMDataModule) -> AffineFit:
    """``bridge.init=affine``: the least-squares map from the source's state after layer ``bridge.depth`` to its state
    after layer L - ``bridge.layers`` (what the copied top layers read), over ``bridge.fit_tokens`` English tokens."""
    b = cfg.bridge
    top = primary.cfg.layers - b.layers
    blocks = fit_blocks(data, b.fit_tokens)
    states = layer_states(primary, blocks, [b.depth, top])
    fit = fit_affine(states[b.depth], states[top])
    log.info(f"bridge.init=affine: layer {b.depth} -> layer {top} state map fitted on {fit.tokens:,} "
             f"{cfg.source_lang} tokens (R^2 {fit.r2:.3f})")
    return fit


def val_blocks(cfg: ExperimentConfig, data: MLMDataModule, val: BlockDataset | None = None
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The validation blocks (``val``: of another corpus than the source language's) and their labels as validation
    reads them (at most ``trainer.val_batches`` micro-batches)."""
    val = data.val_set if val is None else val
    n = len(val) if not cfg.bridge.trainer.val_batches else min(len(val),
                                                                 cfg.bridge.trainer.val_batches * data.micro_batch)
    items = [val[i] for i in range(n)]
    return [x["input_ids"].long() for x in items], [x["labels"].long() for x in items]


def step0_losses(cfg: ExperimentConfig, mini: RobertaMLM, primary: RobertaMLM, data: MLMDataModule
                 ) -> dict[str, float | int]:
    """The mini-model's loss on the validation blocks before any update, beside the source model's on the same
    blocks, and how closely it follows the source there (``agreement``: KL(source || mini-model), top-1), float32."""
    ids, labels = val_blocks(cfg, data)
    agree = agreement(mini, primary, ids, labels)  # the mini-model's loss with it: one forward of each model
    mini_loss, source_loss = agree["lm_loss"], mean_lm_loss(primary, ids, labels)
    log.info(f"step 0 (before any update): the mini-model's {cfg.source_lang} validation loss {mini_loss:.4f}, the "
             f"source model's {source_loss:.4f} ({mini_loss - source_loss:+.4f} nats) over {len(ids)} blocks; "
             f"KL(source || mini-model) {agree['kl']:.4f}, top-1 agreement {agree['top1_agreement']:.1%}")
    return {"step0_loss": mini_loss, "source_loss": source_loss, "step0_blocks": len(ids), "step0_kl": agree["kl"],
            "step0_top1": agree["top1_agreement"]}


def _on_cpu(mini: RobertaMLM, primary: RobertaMLM, ids: list[torch.Tensor], labels: list[torch.Tensor]
            ) -> dict[str, float]:
    """``agreement`` with both models on the CPU, each back where it was after: a GPU run holds nothing beyond what
    ``minimodel plan`` priced (the LM objective keeps no teacher on the device)."""
    homes = next(mini.parameters()).device, next(primary.parameters()).device
    mini.cpu()
    primary.cpu()
    try:
        return agreement(mini, primary, ids, labels)
    finally:
        mini.to(homes[0])
        primary.to(homes[1])


def final_agreement(cfg: ExperimentConfig, mini: RobertaMLM, primary: RobertaMLM, data: MLMDataModule
                    ) -> dict[str, float | int]:
    """After the last update: how closely the trained mini-model follows the source on the validation blocks (what
    step 2's embeddings need, since the full model reads them: docs/extensions.md), read on the CPU (``_on_cpu``);
    the cost is one CPU forward of each over the validation blocks."""
    agree = _on_cpu(mini, primary, *val_blocks(cfg, data))
    log.info(f"bridge: after training, KL(source || mini-model) {agree['kl']:.4f} on the {cfg.source_lang} "
             f"validation blocks, top-1 agreement {agree['top1_agreement']:.1%}, the mini-model's loss "
             f"{agree['lm_loss']:.4f}")
    return agree


def langs_agreement(cfg: ExperimentConfig, mini: RobertaMLM, primary: RobertaMLM, data: MLMDataModule, when: str
                    ) -> dict[str, dict[str, float]]:
    """``bridge.langs``: how closely the mini-model follows the source on each other language's validation blocks
    (in the source tokenizer; never trained on), ``when`` (step 0 or after training)."""
    out = {}
    for part, val in zip(data.mix, data.mix_val, strict=True):
        out[part.name] = agree = _on_cpu(mini, primary, *val_blocks(cfg, data, val))
        log.info(f"bridge, {when}: KL(source || mini-model) {agree['kl']:.4f} on the {part.name} validation blocks, "
                 f"top-1 agreement {agree['top1_agreement']:.1%}, the mini-model's loss {agree['lm_loss']:.4f}")
    return out


HELD_OUT_MARGIN = 1.25
"""``bridge.langs``: the tail of a language's text in the source tokenizer that step 1b never trains on holds at least
this many times the lines of step 2's held-out text of that language (its last ``data.val_blocks`` blocks, to the
corpus' end), counted under each of the language's step-2 tokenizations prepared when the bridge starts (its own
SentencePiece model's, ``adapt.vocabulary=replace``; the extended one's, ``extend``). The margin covers one prepared
later (an extended vocabulary's held-out blocks span a few percent more text than the language's own: 6% in French
with SmolLM2's); step 2 checks its own held-out lines against the bridge's record (``check_held_out``)."""


def line_ends(stream: TokenStream, start: int, eos: int) -> int:
    """The line ends (``</s>``: every line's, and one more per document, ``data.encode``) in tokens [start, end) of
    ``stream``: the same count for the same text under any tokenizer, so the unit in which two encodings of one
    corpus are compared."""
    return int(np.count_nonzero(stream.slice(start, len(stream)) == eos))


def held_out_lines(cfg: ExperimentConfig, stream: TokenStream, eos: int) -> int:
    """The line ends of a corpus' held-out text: from its first validation block (the last ``data.val_blocks``
    blocks) to its end, the partial block after them included."""
    span = cfg.data.seq_len - 1
    return line_ends(stream, max(0, len(stream) // span - cfg.data.val_blocks) * span, eos)


def step2_held_out_lines(cfg: ExperimentConfig, lang: str) -> dict[str, int]:
    """The line ends in step 2's held-out text of ``lang`` (``line_ends`` from its first validation block on), per
    vocabulary whose step-2 data of ``lang`` is prepared (``replace``: its own SentencePiece model; ``extend``)."""
    out = {}
    for vocabulary in VOCABULARIES:
        c = replace(cfg, adapt=replace(cfg.adapt, vocabulary=vocabulary))
        try:
            stream, eos = TokenStream.open(prepared_paths(c, lang).shards), load_prepared_tokenizer(c, lang).specials.eos
        except (ShardError, TokenizerError, OSError, ValueError):
            continue  # not prepared with this vocabulary
        out[vocabulary] = held_out_lines(cfg, stream, eos)
    if not out:
        raise ShardError(f"bridge.langs includes {lang}: the bridge holds out the text step 2 evaluates {lang} on, "
                         f"which {lang}'s own prepared data gives ({Path(cfg.data.prepared_dir) / lang}: not there); "
                         f"run `minimodel prepare` on this experiment with --langs={lang}")
    return out


def held_out_tail(cfg: ExperimentConfig, lang: str, stream: TokenStream, eos: int) -> dict:
    """How many blocks at the end of ``lang``'s text in the source tokenizer (``stream``, ``eos`` its line end) step 1b
    leaves out: its own validation blocks, and a tail holding ``HELD_OUT_MARGIN`` x the line ends of step 2's held-out
    text of ``lang`` and one more, so that its first line, cut by step 2's first validation block, is held out whole
    (whatever ``adapt.vocabulary`` is: the bridge does not depend on it). A ShardError when fewer than
    ``data.val_blocks`` blocks would be left to train on."""
    d = cfg.data
    span, step2 = d.seq_len - 1, step2_held_out_lines(cfg, lang)
    need = math.ceil(HELD_OUT_MARGIN * max(step2.values())) + 1
    n = len(stream) // span
    held = d.val_blocks
    lines = line_ends(stream, (n - held) * span, eos)
    while held < n and lines < need:  # one more block at a time, each read once
        held += 1
        lines += int(np.count_nonzero(stream.slice((n - held) * span, (n - held + 1) * span) == eos))
    if n - held < d.val_blocks or lines < need:
        raise ShardError(f"bridge.langs includes {lang}, whose text in the source tokenizer ({n} blocks) leaves "
                         f"{max(0, n - held)} to train on once the last {held} (at least {HELD_OUT_MARGIN} x the "
                         f"{max(step2.values()):,} lines step 2 holds out, and its validation blocks) are held out: "
                         f"fewer than data.val_blocks={d.val_blocks}; use a larger corpus or leave {lang} out")
    return {"held_out_blocks": held, "held_out_lines": lines, "step2_held_out_lines": step2, "train_blocks": n - held}


def check_held_out(cfg: ExperimentConfig, lang: str, bridge_info: dict, stream: TokenStream, eos: int) -> None:
    """Step 2 over a bridge that read ``lang``'s text (``bridge.langs``): a ShardError unless the tail the bridge held
    out holds step 2's held-out text of ``lang`` (``stream``: step 2's own shards) whole, which it does unless step 2's
    tokenization was prepared after the bridge and spans beyond its margin."""
    record = (bridge_info.get("langs") or {}).get(lang)
    if not isinstance(record, dict):
        return
    mine = held_out_lines(cfg, stream, eos)
    if not isinstance(record.get("held_out_lines"), int) or record["held_out_lines"] < mine + 1:
        raise ShardError(f"the bridge read {lang}'s text (bridge.langs) except its last {record.get('held_out_lines')} "
                         f"lines, but step 2's held-out text of {lang} spans {mine} lines: step 2 would be measured on "
                         f"text the bridge trained on. Prepare {lang} with this adapt.vocabulary before the bridge "
                         f"runs (it holds out the longest of the tokenizations prepared), then train the bridge again")


def mixed_languages(cfg: ExperimentConfig, tok: AnyTokenizer) -> tuple[tuple[MixPart, ...], dict[str, dict]]:
    """``bridge.langs``: each language's text in the source tokenizer as a corpus step 1b reads in turn with the
    source language's (``MixPart``), and what it holds out (``held_out_tail``)."""
    parts, record = [], {}
    for lang in cfg.bridge.langs:
        paths = prepared_paths(cfg, lang, in_source=True)
        try:
            stream = TokenStream.open(paths.shards)  # complete and undamaged; its tokenizer is checked when read
        except ShardError as e:
            raise ShardError(f"bridge.langs includes {lang}, whose text in the source tokenizer ({paths.tokenizer}) "
                             f"is not prepared ({e}): run `minimodel prepare` on this experiment with --langs={lang}"
                             ) from e
        record[lang] = held_out_tail(cfg, lang, stream, tok.specials.eos)
        parts.append(MixPart(paths.shards, record[lang]["held_out_blocks"], lang))
        log.info(f"bridge.langs: {lang} ({paths.shards}): {record[lang]['train_blocks']:,} training blocks; the last "
                 f"{record[lang]['held_out_blocks']:,} ({record[lang]['held_out_lines']:,} lines, against the "
                 f"{max(record[lang]['step2_held_out_lines'].values()):,} step 2 holds out) never trained on")
    return tuple(parts), record


def run_bridge(cfg: ExperimentConfig, progress_bar: bool = True) -> StageResult:
    plan = stage_plan(cfg, "bridge")
    if not plan.runs_here:
        raise ConfigError(f"system {cfg.system} has no bridge (step 1b)")
    b, r = cfg.bridge, plan.runs

    def prepare() -> tuple[RobertaMLM, AnyTokenizer]:
        for run in plan.reads:  # the primary model's run, when it is one of this experiment
            if not is_done(run):
                raise CheckpointError(f"the bridge needs a finished primary model: {run} is not complete "
                                      f"(pretrain it first, or set bridge.source)")
        primary, trained_with = load_primary(r.primary, cfg.model.family, sequence_lengths(cfg, tasks=False),
                                             stage="pretrain" if plan.reads else "", runs_dir=cfg.runs_dir)
        check_depth(cfg, primary.cfg.layers, r.primary)
        return primary, load_source_tokenizer(cfg, primary, f"bridge.source={r.primary}", trained_with)

    def build(inputs: tuple[RobertaMLM, AnyTokenizer]) -> Training:
        primary, tok = inputs
        mix, mixed = mixed_languages(cfg, tok)
        data = mlm_datamodule(cfg, cfg.source_lang, b.optim, b.trainer.seed, tok, mix=mix)
        data.setup()
        fit = fit_bridge_map(cfg, primary, data) if b.init == "affine" else None
        mini = build_minipost(primary, b.depth, b.layers, seed=b.trainer.seed, init=b.init,
                              affine=(fit.weight, fit.bias) if fit is not None else None)
        n_train = trainable_parameters(mini)
        teacher = primary if b.objective == "distill" else None
        log.info(f"MiniPost mini-model: {b.depth} copied + {b.layers} {'new' if b.init == 'random' else 'copied top'} "
                 f"layers{' after an affine map' if fit is not None else ''} (bridge.init={b.init}), trained on "
                 f"{'distillation from the ' + str(primary.cfg.layers) + '-layer source' if teacher else 'the LM loss'}"
                 f" over {', '.join([cfg.source_lang, *b.langs])} text; {n_train:,} trainable parameters")
        info = {"init": b.init, "objective": b.objective, "distill_mse": b.distill_mse, "depth": b.depth,
                "bridge_layers": b.layers, "trainable_parameters": n_train, **step0_losses(cfg, mini, primary, data)}
        if mix:
            step0 = langs_agreement(cfg, mini, primary, data, "step 0")
            info["langs"] = {lang: {**mixed[lang], "step0": step0[lang]} for lang in b.langs}
        if fit is not None:
            info["affine"] = {"tokens": fit.tokens, "r2": fit.r2, "from_layer": b.depth,
                              "to_layer": primary.cfg.layers - b.layers}
        if process_rank() == 0:
            atomic.write_json(plan.writes / BRIDGE_INFO, info)
        flops = bridge_flops(mini.cfg.layers, mini.cfg.hidden, cfg.data.seq_len, mini.cfg.vocab_size,
                             predicted_share(cfg), b.optim.global_batch, 1, trainable_layers=b.layers,
                             shape=LayerShape.of(mini.cfg), affine=fit is not None,
                             teacher_layers=primary.cfg.layers if teacher else 0)
        meta = TrainingMeta(stage="bridge", system=cfg.system, lang=cfg.source_lang, model_config=asdict(mini.cfg),
                            tokenizer={"path": str(tok.path), "sha256": tok.sha256},
                            extra={"primary": r.primary, "depth": b.depth, "bridge_layers": b.layers,
                                   "trainable_parameters": n_train, "init": b.init, "objective": b.objective,
                                   "langs": list(b.langs), "step0_loss": info["step0_loss"]})
        module = MLMModule(mini, b.optim, meta, flops, trainable=bridge_trainable(b.depth), adamw=b.trainer.adamw,
                           teacher=teacher, distill_mse=b.distill_mse)
        def finish(_: object) -> dict:
            info["final"] = final_agreement(cfg, module.model, primary, data)
            for lang, agree in langs_agreement(cfg, module.model, primary, data, "after training").items():
                info["langs"][lang]["final"] = agree
            atomic.write_json(plan.writes / BRIDGE_INFO, info)  # rank 0 only, as finish is
            return {"bridge": info}

        return Training(module, data, b.optim, b.trainer, flops_per_update=flops,
                        tokens_per_update=b.optim.global_batch * cfg.data.seq_len, finish=finish)

    mixed_data = {f"data_{lang}": data_input(prepared_paths(cfg, lang, in_source=True)) for lang in b.langs}
    inputs = producers(pretrain=r.pretrain, source=primary_source(cfg, r), **mixed_data)
    return Runner(cfg, Stage("bridge", plan.writes, b.trainer.seed, inputs=inputs), prepare, build).run(progress_bar)
