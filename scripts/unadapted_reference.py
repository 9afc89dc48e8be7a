"""The unadapted reference of an experiment over a public primary model: each finetuned primary model (source
embeddings, step 3's English head) evaluated zero-shot on the target languages' test sets *with the source model's
own tokenizer* (no step 2 at all: what a user gets by running the English-finetuned model on French text).

    python scripts/unadapted_reference.py experiments/study_real.yaml [--out FILE] [key=value ...]

Writes one JSON line per (task, language, seed, metric) to FILE (default: runs/{name}/unadapted.jsonl); the study's
document reports them beside the adapted systems (docs/real/study.md). Evaluation follows the experiment's
``evaluate.precision`` and ``finetune.eval_batch``; the test files and label ids are those the finetuned model was
trained with (``stages.evaluate.task_of``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from minimodel.data.downstream import predict, score
from minimodel.data.tokenizer import HFTokenizer
from minimodel.experiment import load_experiment
from minimodel.models.families import causal
from minimodel.stages.evaluate import device_for, task_of
from minimodel.store import atomic
from minimodel.store.checkpoints import load_finetuned
from minimodel.store.layout import finetuned_model
from minimodel.systems import REFERENCE, stage_plan


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
    tok = HFTokenizer(plan.tokenizer, causal=causal(cfg.model))
    device, r = device_for(cfg), plan.runs
    rows = []
    for task in cfg.finetune.tasks:
        for seed in cfg.finetune.seeds:
            path = finetuned_model(r.finetune(task, seed))
            body, head, finetuned = load_finetuned(path)
            data = task_of(cfg, task, finetuned, path)
            body.to(device), head.to(device)
            for lang in cfg.target_langs:
                started = time.perf_counter()
                records = data.records("test", lang)
                features, cut = data.featurise(records, tok)
                predictions = predict(body, head, features, cfg.finetune.eval_batch, device, cfg.evaluate.precision)
                scores = score(data, records, features, predictions, lang)
                base = {"system": "unadapted", "task": task, "lang": lang, "seed": seed, "split": "test",
                        "tokenizer": tok.path, "truncated": cut or 0, "examples": len(records)}
                rows += [{**base, "metric": m, "value": v} for m, v in scores.items() if not m.startswith("confusion")]
                print(f"{task} seed {seed} {lang}: accuracy {scores.get('accuracy', float('nan')):.1f}, macro-F1 "
                      f"{scores.get('macro_f1', float('nan')):.1f} ({len(records)} examples, {cut or 0} cut to "
                      f"max_len; {time.perf_counter() - started:.0f} s)", flush=True)
    out = Path(args.out or r.layout.root / "unadapted.jsonl")
    atomic.write_jsonl(out, rows)
    print(json.dumps({"out": str(out), "rows": len(rows)}))


if __name__ == "__main__":
    main()
