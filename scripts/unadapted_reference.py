"""The unadapted reference of an experiment over a public primary model: each finetuned primary model (source
embeddings, step 3's English head) evaluated zero-shot on the target languages' test (and, with ``evaluate.dev``,
dev) sets *with the source model's own tokenizer* (no step 2 at all: what a user gets by running the
English-finetuned model on French text), and the source model's loss per character on each language's held-out
text (the text step 4's ``loss_per_char`` reads). Beside them, system ``bag_of_words``: a naive Bayes classifier
on the English training words applied unchanged to every language (``minimodel.data.bag_of_words``), the input-level
reference.

    python scripts/unadapted_reference.py experiments/study_real.yaml [--out FILE] [key=value ...]

Writes one JSON line per (system, task, language, split, seed, metric) to FILE (default:
runs/{name}/unadapted.jsonl), which `minimodel report` reads beside the adapted systems (the claim "adapted beats
unadapted"). Evaluation follows the experiment's ``evaluate.precision`` and ``finetune.eval_batch``; the test files
and label ids are those the finetuned model was trained with (``stages.evaluate.task_of``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from minimodel.config.schema import ExperimentConfig
from minimodel.data.bag_of_words import BagOfWords
from minimodel.data.downstream import predict, score
from minimodel.data.tasks import TaskData
from minimodel.data.tokenizer import HFTokenizer
from minimodel.errors import UserError
from minimodel.experiment import load_experiment
from minimodel.metrics import classification_scores
from minimodel.models.families import causal
from minimodel.models.families import of as family_of
from minimodel.pipeline import variants
from minimodel.stages.bridge import load_primary
from minimodel.stages.evaluate import device_for, task_of
from minimodel.stages.perplexity import held_out_texts, loss_per_char
from minimodel.store import atomic
from minimodel.store.checkpoints import load_finetuned
from minimodel.store.layout import finetuned_model
from minimodel.systems import REFERENCE, StagePlan, stage_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    cfg = load_experiment(args.experiment, [*args.overrides, f"system={REFERENCE}"])
    plan = stage_plan(cfg, "evaluate")
    if not plan.external_primary:
        raise SystemExit(f"{args.experiment}: no public primary model (bridge.source): the unadapted reference "
                         f"needs one whose tokenizer reads the target languages")
    tok = HFTokenizer(plan.tokenizer, causal=causal(cfg.model), runs_dir=cfg.runs_dir)
    device, r = device_for(cfg), plan.runs
    splits = ["dev", "test"] if cfg.evaluate.dev else ["test"]
    text_cfg, text_of = held_out_config(cfg, args.experiment, args.overrides)
    per_char = source_loss_per_char(text_cfg, plan, tok, device)
    rows = []
    for task in cfg.finetune.tasks:
        rows += bag_of_words_rows(cfg, task, splits)
        for seed in cfg.finetune.seeds:
            path = finetuned_model(r.finetune(task, seed))
            body, head, finetuned = load_finetuned(path)
            data = task_of(cfg, task, finetuned, path)
            body.to(device), head.to(device)
            for lang, split in ((lang, split) for lang in data.languages(cfg.target_langs) for split in splits):
                started = time.perf_counter()
                records = data.records(split, lang)
                features, cut = data.featurise(records, tok)
                predictions = predict(body, head, features, cfg.finetune.eval_batch, device, cfg.evaluate.precision)
                scores = score(data, records, features, predictions, lang)
                if lang in per_char:
                    scores["loss_per_char"] = per_char[lang]
                base = {"system": "unadapted", "task": task, "lang": lang, "seed": seed, "split": split,
                        "tokenizer": tok.path, "truncated": cut or 0, "examples": len(records),
                        **({"held_out_text": text_of} if lang in per_char else {})}
                rows += [{**base, "metric": m, "value": v} for m, v in scores.items() if not m.startswith("confusion")]
                print(f"{task} seed {seed} {lang} {split}: accuracy {scores.get('accuracy', float('nan')):.1f}, macro-F1 "
                      f"{scores.get('macro_f1', float('nan')):.1f} ({len(records)} examples, {cut or 0} cut to "
                      f"max_len; {time.perf_counter() - started:.0f} s)", flush=True)
    out = Path(args.out or r.layout.root / "unadapted.jsonl")
    atomic.write_jsonl(out, rows)
    print(json.dumps({"out": str(out), "rows": len(rows)}))


def held_out_config(cfg: ExperimentConfig, experiment: str, overrides: list[str]) -> tuple[ExperimentConfig, str]:
    """The configuration whose held-out text the source model's loss per character reads, and the row it belongs to:
    the sweep's first row (the held-out blocks are its vocabulary's: a study whose rows all extend the source's
    vocabulary prepares no replaced one, and the blocks of two tokenizers do not hold the same text), or the
    experiment's own where it has no sweep."""
    rows = variants(experiment, overrides)
    if not rows:
        return cfg, stage_plan(cfg, "adapt").runs.label
    first = rows[0]
    print(f"loss per character on the held-out text of {first.label}'s vocabulary "
          f"(adapt.vocabulary={first.cfg.adapt.vocabulary})", flush=True)
    return first.cfg, first.label


def source_loss_per_char(cfg: ExperimentConfig, plan: StagePlan, tok: HFTokenizer, device: torch.device
                         ) -> dict[str, float]:
    """The source model's loss per character, with its own tokenizer, on each target language's held-out text (the
    decoded held-out blocks step 4's ``loss_per_char`` scores with the adapted embeddings): languages not prepared
    yet are left out, with a line saying so."""
    if not family_of(cfg.model).perplexity:
        return {}
    model, _ = load_primary(plan.runs.primary, cfg.model.family, runs_dir=cfg.runs_dir)
    model.to(device)
    out = {}
    for lang in cfg.target_langs:
        try:
            texts = held_out_texts(cfg, lang)
        except (FileNotFoundError, UserError) as e:
            print(f"{lang}: no held-out text ({e}); no loss per character", flush=True)
            continue
        out[lang] = loss_per_char(model, tok, texts, cfg.data.seq_len)["nats_per_char"]
        print(f"{lang}: the source model with its own tokenizer: {out[lang]:.4f} nats per character", flush=True)
    return out


def bag_of_words_rows(cfg: ExperimentConfig, task: str, splits: list[str]) -> list[dict]:
    """The bag-of-words reference's scores (``minimodel.data.bag_of_words``) in every target language and split, and on
    English test, as rows of system ``bag_of_words`` (seed 0: it has none)."""
    data = TaskData(task, cfg.tasks[task])
    if data.is_qa:
        return []
    train = data.train_records()

    def text(record: dict) -> str:
        return " ".join(str(record[f]) for f in data.text_fields)

    bow = BagOfWords.fit([text(r) for r in train], [int(r["label"]) for r in train], len(data.labels))
    rows = []
    for lang, split in [("en", "test"), *((lang, split) for lang in data.languages(cfg.target_langs) for split in splits)]:
        records = data.records(split, lang)
        predicted = torch.tensor([bow.predict(text(r)) for r in records])
        gold = torch.tensor([int(r["label"]) for r in records])
        scores = classification_scores(predicted, gold, data.labels, data.metrics)
        base = {"system": "bag_of_words", "task": task, "lang": lang, "seed": 0, "split": split,
                "examples": len(records)}
        rows += [{**base, "metric": m, "value": v} for m, v in scores.items() if not m.startswith("confusion")]
        print(f"{task} bag of words {lang} {split}: accuracy {scores.get('accuracy', float('nan')):.1f}", flush=True)
    return rows


if __name__ == "__main__":
    main()
