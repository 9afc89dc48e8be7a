"""`minimodel export`: an adapted model out of minimodel, into ``transformers``.

``minimodel export CONFIG lang=de [step=N] [task=T seed=S] --out DIR`` writes a standard ``transformers``
directory: the primary model with the target language's embeddings (``RobertaForMaskedLM``; a decoder's
``GPT2LMHeadModel`` or ``LlamaForCausalLM``, for ``AutoModelForCausalLM`` and ``pipeline("text-generation")``), or with
``task``/``seed`` the finetuned model of step 3 with them (``RobertaForSequenceClassification`` with the task's
label names, ``RobertaForQuestionAnswering``; a decoder's classifier: its causal LM and head, ``decoder_task``), the
language's SentencePiece model as a fast tokenizer with the same ids (``hf.fast_tokenizer``; a classifier's with step
3's template ``<s> A </s>``; with ``adapt.vocabulary=extend`` the extended tokenizer, a byte-level BPE one as its own
``tokenizer.json``: ``extended_fast_tokenizer``), and ``minimodel.json`` (where it came from). ``step`` picks an adaptation
checkpoint (default: the last). ``--embeddings-only`` writes the small artifact instead: ``embeddings.pt`` (the
adaptation checkpoint: embeddings, output bias, tokenizer identity, step, FLOPs), the SentencePiece model and
``minimodel.json``; ``--embeddings DIR`` plugs such an artifact (from any experiment whose primary model it was
trained for) into this experiment's primary or finetuned model. ``--push-to-hub REPO`` uploads the directory with
``huggingface_hub`` (not tested here: no network)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minimodel.config.schema import ExperimentConfig, ModelConfig
from minimodel.data.tokenizer import AnyTokenizer, HFTokenizer, Tokenizer
from minimodel.errors import ConfigError
from minimodel.log import get_logger
from minimodel.models.surgery import PlugError, plug_embeddings
from minimodel.store import atomic
from minimodel.store.checkpoints import Adaptation, CheckpointError, load_adaptation, load_finetuned
from minimodel.store.layout import adaptation_checkpoints, checkpoint_step, finetuned_model
from minimodel.store.provenance import check_producer, require_finished, run_identity
from minimodel.systems import stage_plan

log = get_logger(__name__)

EMBEDDINGS, TOKENIZER, PROVENANCE = "embeddings.pt", "sentencepiece.model", "minimodel.json"
HF_TOKENIZER = "tokenizer"  # an embeddings export's Hugging Face tokenizer (an extended byte-level BPE)


@dataclass(frozen=True)
class Embeddings:
    """Target-language embeddings with the tokenizer they were trained with."""

    adapted: Adaptation
    tokenizer: AnyTokenizer
    source: str  # the checkpoint or artifact they were read from
    adapt_id: str = ""  # the identity of the finished adaptation run they come from (provenance.run_identity)

    @property
    def provenance(self) -> dict[str, Any]:
        a = self.adapted
        return {"system": a.system, "lang": a.lang, "step": int(a.step), "flops": float(a.flops),
                "v100_days": float(a.v100_days), "phase": a.phase, "primary": a.primary, "body": a.body,
                "body_layers": a.body_layers, "vocab_size": int(a.embeddings.shape[0]),
                "hidden": int(a.embeddings.shape[1]), "tokenizer_sha256": a.tokenizer["sha256"], "from": self.source,
                "adapt_id": self.adapt_id, "kept_rows": int(a.kept)}


def adapted_embeddings(cfg: ExperimentConfig, step: int | None = None) -> Embeddings:
    """The embeddings of ``cfg.lang``'s adaptation run at update ``step`` (default: its last checkpoint)."""
    from minimodel.data.prepare import load_prepared_tokenizer
    from minimodel.stages.evaluate import check_adaptation

    if not cfg.lang:
        raise ConfigError("export needs lang=xx: the target language whose embeddings to export")
    run = stage_plan(cfg, "adapt").writes  # the adaptation run, read here
    require_finished(run, f"the adaptation of {cfg.lang}", f"minimodel adapt ... lang={cfg.lang}")
    check_producer(cfg, run, "export")
    found = {checkpoint_step(p): p for p in adaptation_checkpoints(run)}
    if not found:
        raise CheckpointError(f"no adaptation checkpoints in {run}: run `minimodel adapt ... lang={cfg.lang}` first")
    if step is not None and step not in found:
        raise CheckpointError(f"{run} has no adaptation checkpoint at step {step}; it has steps {sorted(found)}")
    path = found[max(found) if step is None else step]
    adapted = load_adaptation(path)
    check_adaptation(adapted, cfg, cfg.lang, path)
    tok = load_prepared_tokenizer(cfg, cfg.lang)  # SentencePiece, or (adapt.vocabulary=extend) an extended HF one
    return Embeddings(adapted, tok, str(path), adapt_id=run_identity(run) or "")


def load_artifact(directory: str | Path, causal: bool = False) -> Embeddings:
    """An ``--embeddings-only`` export: the adaptation checkpoint and its SentencePiece model (or, for a vocabulary
    that extends a Hugging Face tokenizer, that tokenizer's directory ``tokenizer/``; ``causal``: a causal LM's)."""
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"--embeddings {d}: {'no such directory' if not d.exists() else 'a file, not a directory'}"
                              f"; it names the directory an embeddings export was written to (`minimodel export ... "
                              f"--embeddings-only --out DIR`)")
    hf = (d / HF_TOKENIZER / "tokenizer.json").is_file()
    for name in (EMBEDDINGS, *(() if hf else (TOKENIZER,))):
        if not (d / name).is_file():
            kind = _export_kind(d)
            what = f"a {kind} export, not an embeddings export" if kind else "not an embeddings export"
            raise CheckpointError(f"--embeddings {d} is {what}: it lacks {name}; write one with `minimodel export ... "
                                  f"--embeddings-only --out DIR` (DIR: a new directory) and pass --embeddings DIR")
    tok: AnyTokenizer = HFTokenizer(str(d / HF_TOKENIZER), causal) if hf else Tokenizer(d / TOKENIZER)
    return Embeddings(load_adaptation(d / EMBEDDINGS), tok, str(d))


def _write_provenance(out: Path, emb: Embeddings, **extra: Any) -> None:
    atomic.write_json(out / PROVENANCE, {**emb.provenance, **extra})


def _check_out(out: Path, force: bool) -> bool:
    """``out`` may be written: a new or empty directory, or (``force``) one this command wrote before, which the
    new export replaces (True) once it is complete."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory: choose another --out")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"--out {out}: {above} is a file, so no directory can be made under it: choose another "
                          f"--out")
    if not out.exists():  # can it be made? (a probe that leaves nothing: the export itself comes much later)
        first = next(p for p in (out, *out.parents) if p.parent == above or p.parent == p)
        try:
            first.mkdir()
            first.rmdir()
        except OSError as e:  # a full, read-only or forbidden disk is said as every write says it
            raise atomic.disk_error(e, first) or ConfigError(
                f"--out {out}: cannot make {first} ({e.strerror or e}): choose another --out") from None
    if out.exists() and any(out.iterdir()):
        if not force:
            raise ConfigError(f"--out {out} exists and is not empty: choose another directory (or --force to "
                              f"replace an earlier export)")
        if not _export_kind(out):
            raise ConfigError(f"--out {out} holds files that are not a minimodel export (it has no {PROVENANCE}): "
                              f"not replacing them, even with --force; choose a new or empty directory as --out")
        return True
    return False


def _export_kind(d: Path) -> str:
    """The kind an export directory's ``minimodel.json`` records (``fill-mask``, ``embeddings``, ...); "" for a
    directory that is not a minimodel export (or whose record cannot be read)."""
    import json

    try:
        record = json.loads((d / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(record.get("kind") or "minimodel") if isinstance(record, dict) else ""


def check_exportable(model: ModelConfig) -> None:
    """Refuse, before anything is loaded or written, a model no ``transformers`` class holds: an affine map between
    layers (``model.affine_after``: transformers would drop it), a decoder that is neither GPT-2 nor of the Llama
    family (``hf_decoder.hf_config``). A ``ConfigError`` naming the ``model.*`` keys."""
    from minimodel.models.families import causal, hf_module

    if model.affine_after:
        raise ConfigError(f"model.affine_after={model.affine_after}: the model maps its state by an affine map after "
                          f"layer {model.affine_after}, which no transformers class has (it would be dropped without a "
                          f"word): it cannot be exported as a transformers model; export the embeddings alone "
                          f"(--embeddings-only)")
    if causal(model):
        hf = hf_module(model)
        kind = None if model.positions == "learned" else hf.export_type(model, new_tokenizer=True)
        hf.hf_config(model, 0, 2, 1, kind)


def export(cfg: ExperimentConfig, out: Path, step: int | None = None, embeddings_only: bool = False,
           embeddings_from: str = "", force: bool = False) -> Path:
    """Write the export (see the module docstring) to ``out`` and return it. Every file is written into a
    temporary directory beside ``out``, which becomes ``out`` when the export is complete: a full disk, a read-only
    file system or Ctrl-C leaves no partial export (and ``--force`` the earlier one)."""
    from minimodel.models.families import causal

    if embeddings_only and embeddings_from:
        raise ConfigError("--embeddings-only with --embeddings: the artifact is already an embeddings export")
    if cfg.task and not cfg.seed:
        raise ConfigError(f"export task={cfg.task} needs seed=N, the finetuning run to export (finetune.seeds: "
                          f"{cfg.finetune.seeds})")
    replace = _check_out(out, force)
    if not embeddings_only and not stage_plan(cfg, "adapt").external_primary:  # an outside primary is checked as it is read
        check_exportable(cfg.model)
    emb = load_artifact(embeddings_from, causal(cfg.model)) if embeddings_from else adapted_embeddings(cfg, step)
    with atomic.replacing_dir(out, replace=replace) as d:
        kind = _write(cfg, emb, d, embeddings_only)
    system = exported_system(cfg)
    if embeddings_only:
        log.info(f"{system}'s {emb.adapted.lang} embeddings ({emb.provenance['vocab_size']} x "
                 f"{emb.provenance['hidden']}, step {emb.adapted.step}) -> {out}")
    else:
        task = f" (task {cfg.task}, seed {cfg.seed})" if cfg.task else ""
        log.info(f"{kind} model of {system}{task}, {emb.adapted.lang} embeddings of step {emb.adapted.step} -> {out}")
    return out


def exported_system(cfg: ExperimentConfig) -> str:
    """The system run an export of ``cfg`` comes from, as run directories and results name it (``minipost``,
    ``minijoint-n6``)."""
    return stage_plan(cfg, "adapt").runs.label


def _write(cfg: ExperimentConfig, emb: Embeddings, out: Path, embeddings_only: bool) -> str:
    """The files of the export, into the (temporary) directory ``out``; returns what kind of export it is."""
    from minimodel.models.families import causal, hf_module, max_tokens
    from minimodel.models.hf import fast_tokenizer
    from minimodel.stages.bridge import load_primary

    hf = hf_module(cfg.model)  # the family's conversion (hf.py, hf_decoder.py)

    tok = emb.tokenizer
    hf_tok = isinstance(tok, HFTokenizer)
    if embeddings_only:
        atomic.save_torch(emb.adapted.to_dict(), out / EMBEDDINGS)
        if hf_tok:
            tok.hf.save_pretrained(str(out / HF_TOKENIZER))  # type: ignore[union-attr]
        else:
            atomic.copy_file(tok.path, out / TOKENIZER)
        _write_provenance(out, emb, kind="embeddings")
        return "embeddings"
    ids = {"bos": tok.specials.bos, "eos": tok.specials.eos, "pad": tok.specials.pad} if hf_tok else {}
    r = stage_plan(cfg, "finetune").runs
    if cfg.task:
        if not hasattr(hf, "task_to_hf"):
            raise ConfigError(f"export task={cfg.task}: a finetuned model of model.family={cfg.model.family} has no "
                              f"transformers class here; export the adapted language model (without task=)")
        model_path = finetuned_model(r.finetune(cfg.task, cfg.seed))
        if not model_path.is_file():
            raise CheckpointError(f"{model_path} not found: run `minimodel finetune ... task={cfg.task} "
                                  f"seed={cfg.seed}` first")
        body, head, finetuned = load_finetuned(model_path)
        check_exportable(body.cfg)  # the model as it was saved (an outside primary's own config)
        plug_embeddings(body, emb.adapted, tok.sha256, tok.vocab_size)
        hf.task_to_hf(body.eval(), head.eval(), list(finetuned.labels), finetuned.qa, out)
        what = {"kind": "question-answering" if finetuned.qa else "text-classification", "task": cfg.task,
                "seed": cfg.seed, "labels": [str(x) for x in finetuned.labels], "finetuned": str(model_path)}
    else:
        model, _ = load_primary(r.primary, cfg.model.family, runs_dir=cfg.runs_dir)
        check_exportable(model.cfg)
        plug_embeddings(model, emb.adapted, tok.sha256, tok.vocab_size)
        hf.to_hf(model.eval(), out, **(ids if causal(cfg.model) else {}))  # a decoder's config names its ids
        what = {"kind": "text-generation" if causal(cfg.model) else "fill-mask", "primary_model": r.primary}
        body = model
    # a classifier (either family) reads step 3's template <s> A </s>; a causal LM's prompt is <s> A
    prompt = causal(body.cfg) and not cfg.task
    fast = (extended_fast_tokenizer(tok, max_tokens(body.cfg), prompt) if hf_tok  # type: ignore[arg-type]
            else fast_tokenizer(tok.path, max_tokens(body.cfg), causal=prompt))
    fast.save_pretrained(str(out))
    _check_auto_tokenizer(out, fast)
    _write_provenance(out, emb, **what)
    return str(what["kind"])


def extended_fast_tokenizer(tok: HFTokenizer, model_max_length: int, causal: bool = False) -> Any:
    """The ``transformers`` fast tokenizer of an extended Hugging Face tokenizer (``data.extend``), with the templates
    the model was trained and finetuned with: ``<bos> A <eos>`` and ``<bos> A <eos><eos> B <eos>`` (step 3's, in the
    tokenizer's own special tokens), or (``causal``) ``<bos> A`` and ``<bos> A <eos> B`` as ``fast_tokenizer`` writes
    for a SentencePiece model."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    rust = RustTokenizer.from_str(tok.hf.backend_tokenizer.to_str())
    sp = tok.specials
    bos, eos = tok.hf.convert_ids_to_tokens([sp.bos, sp.eos])
    single, pair = (f"{bos} $A", f"{bos} $A {eos} $B") if causal else (f"{bos} $A {eos}", f"{bos} $A {eos} {eos} $B {eos}")
    rust.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                        special_tokens=[(bos, sp.bos), (eos, sp.eos)])
    names = dict(zip(("bos", "eos", "unk", "pad", "mask"), tok.hf.convert_ids_to_tokens(
        [sp.bos, sp.eos, sp.unk, sp.pad, sp.mask])))
    return PreTrainedTokenizerFast(tokenizer_object=rust, **{f"{k}_token": v for k, v in names.items()},
                                   sep_token=names["eos"], cls_token=names["bos"], model_max_length=model_max_length)


PROBE = ["Das ist ein kleiner Test.", "La capitale de la France est Paris.", "El 3 de mayo de 1999, ¿qué pasó?",
         "Ölçüm sonuçları: 42 %", "The quick brown fox jumps over the lazy dog"]
"""Text the exported tokenizer must encode as ours does, read back the way users read it (``AutoTokenizer``)."""


def _check_auto_tokenizer(out: Path, fast: Any) -> None:
    """Refuse an export whose tokenizer ``AutoTokenizer`` would not load as written (transformers can substitute a
    model type's own tokenizer class for the one a directory declares)."""
    import transformers

    loaded = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in PROBE:
        if loaded(text)["input_ids"] != fast(text)["input_ids"]:
            raise PlugError(f"{out}: AutoTokenizer loads the exported tokenizer as {type(loaded).__name__}, which "
                            f"encodes {text!r} differently from the target language's SentencePiece model; this "
                            f"model type cannot carry a new tokenizer in this transformers version")


def push_to_hub(out: Path, repo: str) -> None:  # pragma: no cover - needs the network and credentials
    """Upload an export directory to the Hugging Face hub."""
    try:
        from huggingface_hub import HfApi
    except ImportError as e:
        raise PlugError("--push-to-hub needs huggingface_hub: pip install huggingface_hub") from e
    HfApi().create_repo(repo, exist_ok=True)
    HfApi().upload_folder(folder_path=str(out), repo_id=repo)
