"""Step 4: zero-shot evaluation with swapped embeddings.

For every finetuned seed, every target language and every adaptation checkpoint: swap that
checkpoint's embeddings (and its tokenizer) into the finetuned body and evaluate on the language's
test set. Each finetuned body is loaded once and many embeddings are swapped into it; each
language's test set is featurised once. Rows go to ``{run_dir}/results.jsonl``; an interrupted
evaluation resumes without duplicates."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm import tqdm

from minimodel.checkpoints import Adaptation, CheckpointError, Finetuned, load_adaptation, load_finetuned
from minimodel.config import ExperimentConfig
from minimodel.data.downstream import evaluate
from minimodel.data.prepare import load_prepared_tokenizer
from minimodel.data.tasks import TaskData
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.errors import TaskDataError
from minimodel.layout import adaptation_checkpoints, checkpoint_step, finetuned_model, read_done
from minimodel.locks import exclusive
from minimodel.log import get_logger
from minimodel.results import KEY, ResultsTable
from minimodel.surgery import PlugError, plug_embeddings
from minimodel.systems import Runs, of, runs
from minimodel.wandb_results import ResultsLogger

log = get_logger(__name__)


def device_for(cfg: ExperimentConfig) -> torch.device:
    accel = cfg.finetune.trainer.accelerator
    if accel in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def english_rows(cfg: ExperimentConfig, task: str, seed: int, body: str) -> list[dict]:
    """Rows of the English scores a finished finetuning run recorded (Table 5)."""
    info = read_done(runs(cfg).finetune(task, seed, body))
    if info is None:
        return []
    base = {"system": runs(cfg).label, "body": body, "task": task, "lang": cfg.source_lang, "seed": seed, "step": -1,
            "flops": 0.0, "v100_days": 0.0}
    return [{**base, "split": split, "metric": metric, "value": value}
            for split, scores in info["english"].items() for metric, value in scores.items()]


def check_adaptation(adapted: Adaptation, cfg: ExperimentConfig, lang: str, path: Path) -> None:
    if adapted.system != cfg.system or adapted.lang != lang:
        raise PlugError(f"{path} is an adaptation checkpoint of {adapted.system}/{adapted.lang}, "
                        f"not of {cfg.system}/{lang}")


def task_of(cfg: ExperimentConfig, task: str, finetuned: Finetuned, where: Path) -> TaskData:
    """The task as the model ``where`` was finetuned on it: test labels map to the label ids saved with the
    model (not to those of today's train file), and a train file changed since then is an error."""
    data = TaskData(task, cfg.tasks[task], None if finetuned.qa else tuple(finetuned.labels))
    now = data.train_sha256()
    if finetuned.train_sha256 and now and finetuned.train_sha256 != now:
        raise TaskDataError(
            f"tasks.{task}: {data.train_file()} changed since {where} was finetuned on it (sha256 "
            f"{finetuned.train_sha256[:12]} then, {now[:12]} now), so its scores would not be this task's: "
            f"finetune again (delete {where.parent}) or restore the file")
    if now and not finetuned.train_sha256:
        log.warning(f"{where} does not record the train file it was finetuned on (written by an older minimodel): "
                    f"evaluating with the labels saved with it, {list(finetuned.labels)}")
    return data


def run_evaluate(cfg: ExperimentConfig, progress: bool = True) -> Path:
    """Every missing result row of the system, holding the lock of its results (one writer)."""
    r = runs(cfg)
    with exclusive(r.results.parent, f"evaluation of {r.label}"):
        wandb = ResultsLogger(cfg, r.label, r.results.parent)
        try:
            return _evaluate(cfg, r, progress, wandb)
        finally:
            wandb.close()


def _evaluate(cfg: ExperimentConfig, r: Runs, progress: bool, wandb: ResultsLogger) -> Path:
    table = ResultsTable(r.results)
    done = table.keys()
    tasks = [cfg.task] if cfg.task else list(cfg.finetune.tasks)
    seeds = [cfg.seed] if cfg.seed else list(cfg.finetune.seeds)
    device = device_for(cfg)
    cache: dict[tuple[str, tuple[str, ...], str], tuple[AnyTokenizer, list, list]] = {}
    plan = []  # (task, seed, lang, checkpoint)
    for task in tasks:
        langs = [cfg.lang] if cfg.lang else TaskData(task, cfg.tasks[task]).languages(cfg.target_langs)
        for seed in seeds:
            for lang in langs:
                ckpts = adaptation_checkpoints(r.adapt(lang))
                if not ckpts:
                    raise CheckpointError(f"no adaptation checkpoints for {lang} in {r.adapt(lang)} "
                                          f"(run `minimodel adapt ... lang={lang}`)")
                plan += [(task, seed, lang, c) for c in ckpts]
    bodies = ("primary", "mini") if of(cfg).mini_finetune else ("primary",)
    english = [row for task in tasks for seed in seeds for body in bodies
               for row in english_rows(cfg, task, seed, body) if tuple(row[k] for k in KEY) not in done]
    table.append(english)
    for key in dict.fromkeys((row["task"], row["seed"], row["body"]) for row in english):
        wandb.log([row for row in english if (row["task"], row["seed"], row["body"]) == key])
    todo = [p for p in plan if (r.label, "primary", p[0], p[2], p[1], checkpoint_step(p[3])) not in done]
    log.info(f"evaluate {r.label}: {len(plan)} (task, seed, language, checkpoint) evaluations, "
             f"{len(plan) - len(todo)} already in {table.path}")
    started = time.perf_counter()
    bar = tqdm(total=len(todo), desc="evaluate", disable=not progress, dynamic_ncols=True, mininterval=0.5)
    loaded: tuple[str, int] | None = None
    body = head = data = None
    for task, seed, lang, path in todo:
        if loaded != (task, seed):
            model_path = finetuned_model(r.finetune(task, seed))
            if not model_path.exists():
                raise CheckpointError(f"{model_path} not found: run `minimodel finetune ... task={task} seed={seed}`")
            body, head, finetuned = load_finetuned(model_path)
            data = task_of(cfg, task, finetuned, model_path)
            body.to(device), head.to(device)
            loaded = (task, seed)
        key = (task, data.labels, lang)
        if key not in cache:
            tok = load_prepared_tokenizer(cfg, lang)
            records = data.records("test", lang)
            cache[key] = (tok, records, data.features(records, tok))
        tok, records, features = cache[key]
        adapted = load_adaptation(path)
        check_adaptation(adapted, cfg, lang, path)
        plug_embeddings(body, adapted, tok.sha256, tok.vocab_size)
        body.to(device)
        scores = evaluate(data, body, head, records, features, lang, cfg.finetune.eval_batch, device)
        base = {"system": r.label, "body": "primary", "task": task, "lang": lang, "seed": seed,
                "step": int(adapted.step), "flops": float(adapted.flops), "v100_days": float(adapted.v100_days),
                "split": "test"}
        rows = [{**base, "metric": m, "value": v} for m, v in scores.items()]
        table.append(rows)
        wandb.log(rows)
        bar.update(1)
    bar.close()
    if todo:
        took = time.perf_counter() - started
        log.info(f"evaluated {len(todo)} checkpoints in {took:.1f} s ({took / len(todo):.2f} s each)")
    return table.path
