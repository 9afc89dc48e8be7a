"""Step 2: learn target-language token embeddings with the transformer body frozen.

Trainable: the new token embeddings (tied to the MLM output projection) and the MLM output bias.
Frozen: position embeddings, embedding LayerNorm, every layer, the head's dense and LayerNorm. The
body comes from the system's declaration (``systems.Body``): its own pretrained model, layers 1..N of
it with the secondary head at N, or the bridged mini-model of step 1b.

Besides ``checkpoints/last.ckpt`` (full state, for resuming), every scheduled update writes a small
*adaptation checkpoint* ``embeddings/step{N}.pt`` (``checkpoints.Adaptation``) holding only what
step 4 needs: embeddings, output bias, tokenizer reference, step and cumulative FLOPs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from minimodel.config.schema import PRIMARY, ExperimentConfig
from minimodel.data.mlm import mlm_datamodule
from minimodel.data.prepare import load_prepared_tokenizer, load_source_tokenizer, prepared_paths
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.errors import ConfigError
from minimodel.flops import FlopSchedule, LayerShape, adapt_flops, v100_days
from minimodel.log import get_logger, process_rank
from minimodel.models.families import predicted_share
from minimodel.models.model import RobertaMLM
from minimodel.models.surgery import (
    adaptation_state,
    adaptation_trainable,
    extract_mini,
    freeze_all_but,
    overlap_init,
    primary_only,
    staged_body,
    staged_names,
    swap_embeddings,
    tie_biases,
)
from minimodel.store import atomic
from minimodel.store.checkpoints import Adaptation, CheckpointError, TrainingMeta, load_final_model
from minimodel.store.layout import (
    ADAPT_INFO,
    BRIDGE_INFO,
    adaptation_checkpoint,
    adaptation_checkpoints,
    is_done,
    last_checkpoint,
)
from minimodel.store.provenance import Outside, data_input, primary_source, producers
from minimodel.systems import Body, Phase, Runs, StagePlan, stage_plan
from minimodel.training.callbacks import FrozenRows
from minimodel.training.mlm import MLMModule
from minimodel.training.runner import Runner, Stage, StageResult, Training

log = get_logger(__name__)

# How each kind of step-2 body is cut from the finished checkpoint of the run it comes from.
BODIES: dict[Body, Callable[[RobertaMLM, StagePlan], RobertaMLM]] = {
    Body.OWN: lambda model, plan: primary_only(model),
    Body.HEAD: lambda model, plan: extract_mini(model, plan.depth, plan.head),
    Body.BRIDGE: lambda model, plan: model,
}


def adaptation_body(cfg: ExperimentConfig, plan: StagePlan) -> tuple[RobertaMLM, str, TrainingMeta]:
    """The frozen body that step 2 trains embeddings over, the checkpoint it came from and its metadata.
    With ``adapt.schedule`` (progressive adaptation): the layers up to the deepest phase's head with every
    phase's head, their output biases tied into one."""
    r, kind = plan.runs, plan.body
    if not plan.reads:  # standard adaptation over a public primary model (bridge.source): no run to read
        from minimodel.models.families import sequence_lengths
        from minimodel.stages.bridge import load_primary

        model, trained_with = load_primary(r.primary, cfg.model.family, sequence_lengths(cfg, tasks=False),
                                           runs_dir=cfg.runs_dir)
        meta = TrainingMeta(stage="external", system=cfg.system, lang=cfg.source_lang,
                            model_config=asdict(model.cfg), tokenizer=trained_with)
        return BODIES[kind](model, plan), r.primary, meta
    (run,) = plan.reads
    if not is_done(run):
        step = "`minimodel bridge`" if kind is Body.BRIDGE else "`minimodel pretrain`"
        raise CheckpointError(f"adaptation needs a finished {run.name} run: {run} is not complete (run {step} first)")
    source = last_checkpoint(run)
    model, meta = load_final_model(source, "bridge" if kind is Body.BRIDGE else "pretrain")
    if cfg.adapt.schedule:
        body, _ = staged_body(model, [p.head for p in plan.phases])
        return body, str(source), meta
    return BODIES[kind](model, plan), str(source), meta


def phase_heads(cfg: ExperimentConfig, plan: StagePlan) -> list[tuple[Phase, str]]:
    """Each phase of step 2 with the name of its head in the adaptation body (``staged_body``; one phase over
    the body's primary head without a schedule)."""
    phases = plan.phases
    if not cfg.adapt.schedule:
        return [(phases[0], PRIMARY)]
    names = staged_names(cfg.model, [p.head for p in phases])
    return [(p, names[p.head]) for p in phases]


def phase_at(phases: list[tuple[Phase, str]], step: int) -> tuple[Phase, str]:
    """The phase of the update made after ``step`` updates (the last phase from its start on)."""
    return next(((p, h) for p, h in phases if step < p.end), phases[-1])


def init_target_embeddings(body: RobertaMLM, source_tok: AnyTokenizer, target_tok: AnyTokenizer,
                           seed: int, head: str = PRIMARY) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Overlap initialisation (paper, footnote 1) of embeddings and output bias (zeros where the heads have none);
    returns the overlap count.

    Pieces are compared in SentencePiece spelling, so a byte-level BPE source vocabulary (RoBERTa's
    "Ġthe") overlaps with a SentencePiece target ("▁the") as the same piece would."""
    gen = torch.Generator().manual_seed(seed)
    src_pieces, trg_pieces = source_tok.surface_pieces(), target_tok.surface_pieces()
    weight, rows = overlap_init(body.embeddings.tokens.weight, src_pieces, trg_pieces, body.cfg.init_std, gen)
    copied = rows >= 0
    bias = torch.zeros(target_tok.vocab_size)
    if getattr(body.heads[head], "bias", None) is not None:
        bias[copied] = body.heads[head].bias.detach()[rows[copied]].to(bias.dtype)
    return weight, bias, int(copied.sum())


def init_output(body: RobertaMLM, source_tok: AnyTokenizer, target_tok: AnyTokenizer, seed: int,
                head: str = PRIMARY) -> torch.Tensor | None:
    """The target output projection of a model whose heads do not project with the embeddings
    (``model.tie_embeddings: false``): the overlap initialisation of the source output matrix (its own random draws,
    seed + 1); None for a tied model, whose output projection is the embeddings."""
    if body.cfg.tie_embeddings:
        return None
    gen = torch.Generator().manual_seed(seed + 1)
    weight, _ = overlap_init(body.heads[head].decoder.weight, source_tok.surface_pieces(),
                             target_tok.surface_pieces(), body.cfg.init_std, gen)
    return weight


@dataclass
class Inputs:
    body: RobertaMLM
    body_source: str
    source_tok: AnyTokenizer
    target_tok: AnyTokenizer


@dataclass
class Initial:
    """The target embeddings and output bias step 2 starts from (``adapt.init``)."""

    weight: torch.Tensor
    bias: torch.Tensor
    overlap: int  # target pieces that copy a source embedding
    info: dict  # how they were made, for adapt_info.json and done.json (``init``)
    output: torch.Tensor | None = None  # the output projection of an untied model (``init_output``)


def overlap_initial(cfg: ExperimentConfig, x: Inputs, head: str) -> Initial:
    weight, bias, overlap = init_target_embeddings(x.body, x.source_tok, x.target_tok, cfg.adapt.trainer.seed, head)
    return Initial(weight, bias, overlap, {"method": "overlap"})


def random_initial(cfg: ExperimentConfig, x: Inputs, head: str) -> Initial:
    """Every row N(0, ``model.init_std``), nothing read from the source: the embeddings (seed ``adapt.trainer.seed``)
    and an untied model's output projection (seed + 1, as ``init_output`` draws); output biases 0."""
    seed, vocab, m = cfg.adapt.trainer.seed, x.target_tok.vocab_size, x.body.cfg
    weight = torch.randn(vocab, m.hidden, generator=torch.Generator().manual_seed(seed)) * m.init_std
    output = None if m.tie_embeddings else (
        torch.randn(vocab, m.hidden, generator=torch.Generator().manual_seed(seed + 1)) * m.init_std)
    return Initial(weight, torch.zeros(vocab), 0, {"method": "random"}, output)


def focus_initial(cfg: ExperimentConfig, x: Inputs, head: str) -> Initial:
    """FOCUS (``focus.py``) over auxiliary fastText vectors trained on step 2's text (``data.aux_embeddings``)."""
    from minimodel.data.aux_embeddings import AuxSettings, aux_embeddings
    from minimodel.models.focus import focus_init

    f, lang = cfg.adapt.focus, cfg.lang
    aux = aux_embeddings(cfg, lang, x.target_tok, AuxSettings(f.dim, f.epochs, f.min_count, f.threads))
    src = x.body.embeddings.tokens.weight
    src_bias = getattr(x.body.heads[head], "bias", None)  # a causal LM's heads have none: zeros mixed
    r = focus_init(src, src_bias if src_bias is not None else torch.zeros(src.shape[0]), x.source_tok.surface_pieces(),
                   x.target_tok.surface_pieces(), torch.from_numpy(aux.for_vocabulary(x.target_tok)),
                   x.body.cfg.init_std, torch.Generator().manual_seed(cfg.adapt.trainer.seed), f.top_k)
    fasttext = {k: aux.record[k] for k in ("key", "tokens", "tokens_sha256", "fasttext", "train_seconds",
                                           "flops_estimate")}
    info = {"method": "focus", **r.info, "fasttext": {**fasttext, "path": str(aux.path), "cached": aux.cached,
                                                      "pieces": len(aux.pieces)}}
    log.info(f"focus {lang}: {r.info['copied']:,} pieces copied, {r.info['mixed']:,} mixed from the "
             f"{r.info['anchors']:,} overlapping pieces with a fastText vector (sparsemax keeps "
             f"{r.info['support_mean']:.1f} on average, at most {r.info['support_max']}), {r.info['random']:,} random; "
             f"fastText {aux.record['train_seconds']:.1f} s{' (cached)' if aux.cached else ''}, "
             f"the mix {r.info['seconds']:.1f} s")
    if r.info["anchors"] >= 10 and r.info["support_mean"] > r.info["anchors"] / 2:
        log.warning(f"focus {lang}: sparsemax mixes {r.info['support_mean']:.0f} of the {r.info['anchors']} "
                    f"overlapping pieces on average: their fastText vectors barely differ, as after too little "
                    f"training ({aux.record['tokens']:,} tokens, adapt.focus.epochs={f.epochs}); more epochs (or "
                    f"text) make them informative")
    return Initial(r.weight, r.bias, r.copied, info)


def source_segments(source_tok: AnyTokenizer, target_tok: AnyTokenizer) -> tuple[list[list[int] | None], dict[int, str]]:
    """Each target piece's segmentation by the source tokenizer (``encode_piece`` of its SentencePiece spelling), or
    None where the source cannot segment it, and why (target piece id -> ``special``: a special piece of the target
    tokenizer, or one without a spelling; ``unsegmented``: no faithful segmentation; ``unknown``: it holds a special
    id of the source tokenizer, <unk> among them)."""
    trg_special, src_special = set(target_tok.specials.ids), set(source_tok.specials.ids)
    out: list[list[int] | None] = []
    why: dict[int, str] = {}
    for i, piece in enumerate(target_tok.surface_pieces()):
        ids = None if i in trg_special or not piece else source_tok.encode_piece(piece)
        if ids is None:
            why[i] = "special"
        elif not ids:
            why[i] = "unsegmented"
        elif src_special.intersection(ids):
            why[i] = "unknown"
        out.append(None if i in why else ids)
    return out, why


def mean_initial(cfg: ExperimentConfig, x: Inputs, head: str) -> Initial:
    """Fast vocabulary transfer (Gee et al., 2022; ``surgery.mean_init``): each new target piece the mean of the source
    embeddings (output biases; an untied model's output rows) of its segmentation by the source tokenizer; the overlap
    initialisation where the source cannot segment it. No training: its cost is the seconds logged here."""
    import time

    from minimodel.models.surgery import mean_init

    start, seed = time.perf_counter(), cfg.adapt.trainer.seed
    src_pieces, trg_pieces = x.source_tok.surface_pieces(), x.target_tok.surface_pieces()
    segments, why = source_segments(x.source_tok, x.target_tok)
    body, std = x.body, x.body.cfg.init_std
    r = mean_init(body.embeddings.tokens.weight, src_pieces, trg_pieces, segments, std,
                  torch.Generator().manual_seed(seed))
    bias = torch.zeros(x.target_tok.vocab_size)
    src_bias = getattr(body.heads[head], "bias", None)
    if src_bias is not None:  # copied pieces copy their bias, mean pieces average them, the rest start at 0
        copied = r.rows >= 0
        bias[copied] = src_bias.detach()[r.rows[copied]].to(bias.dtype)
        bias = r.apply(src_bias, bias)
    output = None
    if not body.cfg.tie_embeddings:  # the same rule over the source output rows, init_output's draws (seed + 1)
        output = mean_init(body.heads[head].decoder.weight, src_pieces, trg_pieces, segments, std,
                           torch.Generator().manual_seed(seed + 1)).weight
    random = [i for i, s in enumerate(r.segments) if s is None and int(r.rows[i]) < 0]
    reasons = [why.get(i, "out_of_range") for i in random]
    lengths = [len(s) for s in r.segments if s is not None]
    # the sums and divisions of the means: embeddings, an untied output matrix, the output biases
    flops = sum(lengths) * body.cfg.hidden * (1 if output is None else 2) + (sum(lengths) if src_bias is not None else 0)
    info = {"method": "mean", **r.info,
            "fallback": {k: reasons.count(k) for k in ("special", "unsegmented", "unknown", "out_of_range")},
            "segment_mean": round(sum(lengths) / len(lengths), 3) if lengths else 0.0,
            "segment_max": max(lengths, default=0), "flops_estimate": flops,
            "seconds": round(time.perf_counter() - start, 3)}
    log.info(f"mean {cfg.lang}: {info['copied']:,} pieces copied, {info['mean']:,} the mean of their segmentation by "
             f"the source tokenizer ({info['segment_mean']:.2f} source pieces on average), {info['random']:,} random "
             f"(the source cannot segment them: {info['fallback']}); {info['seconds']:.1f} s")
    return Initial(r.weight, bias, info["copied"], info, output)


INITS: dict[str, Callable[[ExperimentConfig, Inputs, str], Initial]] = {
    "overlap": overlap_initial, "random": random_initial, "focus": focus_initial, "mean": mean_initial}
"""``adapt.init``: how each kind of initialisation makes step 2's starting embeddings (``config.checks.INITS``)."""


def keep_source_rows(x: Inputs, initial: Initial, head: str) -> int:
    """``adapt.vocabulary=extend``: the target tokenizer is the source tokenizer plus new pieces (``data.extend``),
    so its first rows are the source model's pieces: their embeddings (output biases; an untied model's output rows)
    become the source's own, by token id, whatever ``adapt.init`` made of them. Returns how many rows that is: the
    source tokenizer's pieces (a source matrix padded past them, ``prepare.padded_rows``, leaves its padding behind)."""
    from minimodel.data.extend import read_extension

    body, kept = x.body, x.source_tok.vocab_size
    record = read_extension(x.target_tok.path)
    if record is None or record.get("source_sha256") != x.source_tok.sha256 or record.get("kept") != kept:
        made = "no extension record" if record is None else (
            f"an extension of {record.get('source')} ({record.get('kept')} pieces, sha256 "
            f"{str(record.get('source_sha256'))[:12]})")
        raise ConfigError(f"adapt.vocabulary=extend: the target tokenizer {x.target_tok.path} is not the source "
                          f"tokenizer {x.source_tok.path} ({kept} pieces, sha256 {x.source_tok.sha256[:12]}) extended: "
                          f"it has {made}; run `minimodel prepare ... --langs=LANG` again")
    with torch.no_grad():
        initial.weight[:kept] = body.embeddings.tokens.weight[:kept].detach().to(initial.weight.dtype)
        bias = getattr(body.heads[head], "bias", None)
        if bias is not None:
            initial.bias[:kept] = bias[:kept].detach().to(initial.bias.dtype)
        if initial.output is not None:
            initial.output[:kept] = body.heads[head].decoder.weight[:kept].detach().to(initial.output.dtype)
    initial.info = {**initial.info, "vocabulary": {"mode": "extend", "kept": kept,
                                                   "new": x.target_tok.vocab_size - kept,
                                                   **{k: record[k] for k in ("intermediate", "unreachable")
                                                      if k in record}}}
    return kept


def frozen_rows(body: RobertaMLM, kept: int) -> FrozenRows:
    """What keeps the first ``kept`` rows of the adaptation's trainable matrices (and output bias) as they are."""
    names = [n for n, p in body.named_parameters() if p.requires_grad]
    return FrozenRows(names, kept, body)


def adapt_inputs(cfg: ExperimentConfig, runs: Runs, lang: str) -> dict[str, Path | Outside]:
    """What an adaptation to ``lang`` reads, recorded and checked by content: its body run, the outside model
    when the primary model is one (``bridge.source``), and the language's prepared data (target tokenizer, shards,
    the corpus they came from). Evaluation checks the same (``evaluate.evaluation_plan``)."""
    return producers(body=runs.body, source=primary_source(cfg, runs),
                     target_data=data_input(prepared_paths(cfg, lang)))


def run_adapt(cfg: ExperimentConfig, progress_bar: bool = True) -> StageResult:
    if not cfg.lang:
        raise ConfigError("adapt needs a target language: add lang=xx (e.g. lang=de)")
    if cfg.lang == cfg.source_lang:
        raise ConfigError(f"lang={cfg.lang} is the source language")
    a, plan = cfg.adapt, stage_plan(cfg, "adapt")
    run_dir = plan.writes

    def prepare() -> Inputs:
        body, body_source, meta = adaptation_body(cfg, plan)
        return Inputs(body, body_source, load_source_tokenizer(cfg, body, body_source, meta.tokenizer),
                      load_prepared_tokenizer(cfg, cfg.lang))

    def build(x: Inputs) -> Training:
        body, vocab = x.body, x.target_tok.vocab_size
        phases = phase_heads(cfg, plan)
        initial = INITS[a.init](cfg, x, phases[0][1])  # the output bias from the first phase's head
        if initial.output is None:  # an untied output projection starts as the overlap initialisation
            initial.output = init_output(body, x.source_tok, x.target_tok, a.trainer.seed, phases[0][1])
        kept = keep_source_rows(x, initial, phases[0][1]) if a.vocabulary == "extend" else 0
        overlap = initial.overlap
        swap_embeddings(body, initial.weight, initial.bias, initial.output)
        tie_biases(body)
        n_train = freeze_all_but(body, adaptation_trainable)
        frozen = [frozen_rows(body, kept)] if kept else []
        trained = sum(p[kept:].numel() for p in body.parameters() if p.requires_grad)
        if process_rank() == 0:
            info = {"lang": cfg.lang, "target_vocab": vocab, "overlapping_pieces": overlap,
                    "trainable_parameters": n_train, "body_layers": body.cfg.layers, "body": x.body_source,
                    "init": initial.info, **({"kept_rows": kept, "trained_parameters": trained} if kept else {})}
            atomic.write_json(run_dir / ADAPT_INFO, info)
        shape = " then ".join(f"{p.head} ({p.depth} layers, updates {p.start}-{p.end})" for p, _ in phases)
        rows = (f"; the first {kept:,} rows are {cfg.source_lang}'s own, frozen: {trained:,} of them train" if kept
                else "")
        log.info(f"adapt {cfg.system} to {cfg.lang}: {overlap:,} of {vocab:,} pieces overlap with {cfg.source_lang}; "
                 f"{shape if cfg.adapt.schedule else f'{body.cfg.layers}-layer body'}; {n_train:,} trainable "
                 f"parameters{rows}")
        flops = FlopSchedule([(p.start, p.end, adapt_flops(p.depth, body.cfg.hidden, cfg.data.seq_len, vocab,
                                                            predicted_share(cfg), a.optim.global_batch, 1,
                                                            shape=LayerShape.of(body.cfg)))
                              for p, _ in phases])
        tokenizer = {"path": str(x.target_tok.path), "sha256": x.target_tok.sha256, "vocab_size": vocab}
        meta = TrainingMeta(stage="adapt", system=cfg.system, lang=cfg.lang, model_config=asdict(body.cfg),
                            tokenizer=tokenizer,
                            extra={"body_layers": body.cfg.layers, "body": x.body_source, "primary": plan.runs.primary,
                                   "overlapping_pieces": overlap})
        staged = (lambda step: phase_at(phases, step)[1]) if cfg.adapt.schedule else None
        module = MLMModule(body, a.optim, meta, flops, trainable=adaptation_trainable, phase_head=staged,
                           adamw=a.trainer.adamw)

        def export(step: int) -> Path:
            """The adaptation checkpoint of ``step``, written atomically."""
            spent = module.cumulative_flops(step)
            payload = Adaptation(system=cfg.system, lang=cfg.lang, **adaptation_state(module.model),
                                 tokenizer=tokenizer, step=step, flops=spent, v100_days=v100_days(spent),
                                 body=x.body_source, body_layers=body.cfg.layers, primary=plan.runs.primary,
                                 overlapping_pieces=overlap, kept=kept,
                                 phase=phase_at(phases, max(step - 1, 0))[0].head if cfg.adapt.schedule else "")
            path = adaptation_checkpoint(run_dir, step)
            atomic.save_torch(payload.to_dict(), path)
            return path

        def finish(_: object) -> dict:
            return {"embeddings": [p.name for p in adaptation_checkpoints(run_dir)], "init": initial.info}

        # progressive: an adaptation checkpoint at the end of every phase but the last
        ends = sorted({*a.trainer.ckpt_steps, *(p.end for p, _ in phases[:-1])})
        data = mlm_datamodule(cfg, cfg.lang, a.optim, a.trainer.seed, x.target_tok, a.data_fraction)
        bridge_info = plan.runs.body / BRIDGE_INFO if plan.runs.body is not None else None
        if bridge_info is not None and bridge_info.is_file():  # a bridge that may have read this language's text
            from minimodel.stages.bridge import check_held_out

            data.setup()
            check_held_out(cfg, cfg.lang, atomic.loads(bridge_info.read_text(encoding="utf-8")), data.val_set.stream,
                           x.target_tok.specials.eos)
        return Training(module, data, a.optim,
                        replace(a.trainer, ckpt_steps=ends), flops_per_update=flops, tokens_per_update=a.optim.global_batch * cfg.data.seq_len,
                        keep_steps=False, export=export, finish=finish, callbacks=frozen)

    return Runner(cfg, Stage(f"adapt/{cfg.lang}", run_dir, a.trainer.seed, inputs=adapt_inputs(cfg, plan.runs, cfg.lang)), prepare, build).run(progress_bar)
