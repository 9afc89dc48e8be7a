"""Step 4: zero-shot evaluation with swapped embeddings.

For every finetuned seed, every target language and every adaptation checkpoint: swap that
checkpoint's embeddings (and its tokenizer) into the finetuned body and evaluate on the language's
test set. Each finetuned body is loaded once and many embeddings are swapped into it; each
language's test set is featurised once. Rows go to ``{run_dir}/results.jsonl``; an interrupted
evaluation resumes without duplicates."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from minimodel import signals
from minimodel.config.schema import ExperimentConfig
from minimodel.data.downstream import predict, prediction_rows, score
from minimodel.data.prepare import load_prepared_tokenizer
from minimodel.data.task_files import has_split
from minimodel.data.tasks import TaskData
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.errors import ConfigError, TaskDataError
from minimodel.log import PROGRESS_EVERY_S, bar_wanted, get_logger
from minimodel.models.families import of as family_of
from minimodel.models.surgery import PlugError, plug_embeddings
from minimodel.stages.adapt import adapt_inputs
from minimodel.stages.perplexity import Perplexity
from minimodel.store import atomic
from minimodel.store.checkpoints import Adaptation, CheckpointError, Finetuned, load_adaptation, load_finetuned
from minimodel.store.layout import (
    adaptation_checkpoints,
    checkpoint_step,
    finetuned_model,
    read_done,
)
from minimodel.store.locks import exclusive
from minimodel.store.provenance import (
    check_inputs,
    check_producer,
    data_identity,
    primary_source,
    producers,
    require_finished,
    run_identity,
    stale_rows,
)
from minimodel.store.results import KEY, ResultsTable
from minimodel.store.truncation import Truncation, say
from minimodel.store.truncation import write as write_truncation
from minimodel.store.wandb_results import ResultsLogger
from minimodel.systems import Runs, StagePlan, stage_plan
from minimodel.training.device import cuda_in_use

log = get_logger(__name__)


def device_for(cfg: ExperimentConfig, local_rank: int = 0) -> torch.device:
    if cuda_in_use(cfg.finetune.trainer.accelerator):
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def english_rows(cfg: ExperimentConfig, r: Runs, task: str, seed: int, body: str) -> list[dict]:
    """Rows of the English scores a finished finetuning run recorded (Table 5)."""
    run = r.finetune(task, seed, body)
    info = read_done(run)
    if info is None:
        return []
    base = {"system": r.label, "body": body, "task": task, "lang": cfg.source_lang, "seed": seed, "step": -1,
            "flops": 0.0, "v100_days": 0.0, "pretrain_seed": cfg.pretrain.trainer.seed,
            "finetune_id": run_identity(run)}
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
    now = check_train_sha(data, finetuned.train_sha256, where)
    if now and not finetuned.train_sha256:
        log.warning(f"{where} does not record the train file it was finetuned on (written by an older minimodel): "
                    f"evaluating with the labels saved with it, {list(finetuned.labels)}")
    return data


def check_train_sha(data: TaskData, then: str, where: Path, now: str | None = None) -> str:
    """The train file's sha256 now (``now``, when the caller hashed it already); a ``TaskDataError`` when the model
    ``where`` was finetuned on other bytes."""
    now = data.train_sha256() if now is None else now
    if then and now and then != now:
        raise TaskDataError(
            f"tasks.{data.name}: {data.train_file()} changed since {where} was finetuned on it (sha256 "
            f"{then[:12]} then, {now[:12]} now), so its scores would not be this task's: "
            f"finetune again (delete {where.parent}) or restore the file")
    return now


def check_train_files(cfg: ExperimentConfig, plan: StagePlan, tasks: list[str], seeds: list[int]) -> None:
    """Before any row is skipped as done: a finished finetuning whose train file changed since is an error, even when
    every row it would give is in results.jsonl already (they would be rows of a model of another task's data)."""
    for task in tasks:
        runs = [plan.runs.finetune(task, seed, body) for seed in seeds for body in plan.bodies]
        recorded = [(run, (read_done(run) or {}).get("train_sha256")) for run in runs]
        recorded = [(run, then) for run, then in recorded if then]
        if recorded:  # the file is read and hashed once per task
            data = TaskData(task, cfg.tasks[task])
            now = data.train_sha256()
            for run, then in recorded:
                check_train_sha(data, then, finetuned_model(run), now)


@dataclass
class Evaluation:
    """What one ``minimodel evaluate`` process did: the results file, and the signal that stopped it early ("")."""

    path: Path
    stopped: str = ""
    rows: int = 0


class _StopOnSignal:
    """SIGUSR1 (SLURM's warning before the time limit) or SIGTERM: finish the current evaluation, then stop."""

    def __init__(self) -> None:
        self.signal = ""
        self.old: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGUSR1):
                self.old[sig] = signal.signal(sig, self._stop)
        self.signal = signals.take() or ""  # one that came while the command started: stop before any row
        return self

    def _stop(self, signum: int, frame: Any) -> None:
        self.signal = signal.Signals(signum).name

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


def shard() -> tuple[int, int, int]:
    """(rank, world size, local rank) of this process among those the launcher started for one evaluation
    (``srun --ntasks=G``, ``torchrun``): each evaluates every G-th checkpoint of the plan."""
    env = os.environ
    world = int(env.get("WORLD_SIZE") or env.get("SLURM_NTASKS") or 1)
    rank = int(env.get("RANK") or env.get("SLURM_PROCID") or 0) if world > 1 else 0
    local = int(env.get("LOCAL_RANK") or env.get("SLURM_LOCALID") or 0) if world > 1 else 0
    return rank, world, local


def save_predictions(path: Path, rows: list[dict]) -> None:
    """One JSON object per example (id, gold, predicted, probabilities), written whole or not at all."""
    atomic.make_dirs(path.parent)
    atomic.write_jsonl(path, rows)


def selection(cfg: ExperimentConfig) -> str:
    """The part of the system's evaluations one command does: ``all``, or e.g. ``lang=de``, ``task=xnli-seed=2``."""
    parts = [f"task={cfg.task}" if cfg.task else "", f"seed={cfg.seed}" if cfg.seed else "",
             f"lang={cfg.lang}" if cfg.lang else ""]
    return "-".join(p for p in parts if p) or "all"


def run_evaluate(cfg: ExperimentConfig, progress: bool = True) -> Evaluation:
    """Every missing result row of the system (or of ``task``/``seed``/``lang``), holding the lock of that selection:
    evaluations of disjoint selections (one per language, one per GPU) run at once and append to one results
    file without duplicates. Stops after the current row on SIGUSR1/SIGTERM (rerun to resume)."""
    plan = stage_plan(cfg, "evaluate")
    r, sel = plan.runs, selection(cfg)
    with exclusive(r.results.parent / f".evaluate-{sel}", f"evaluation of {r.label} ({sel})"):
        wandb = ResultsLogger(cfg, r.label, r.results.parent)
        try:
            with _StopOnSignal() as stop:
                return _evaluate(cfg, plan, progress, wandb, stop)
        finally:
            wandb.close()


def check_dev_sets(data: TaskData, langs: list[str]) -> None:
    """``evaluate.split=dev`` needs a target-language dev file per language (a local task's ``dev.{lang}``)."""
    if data.local is None:
        raise ConfigError(f"evaluate.split=dev: task {data.name} has no target-language dev sets (only local tasks "
                          f"have them, as dev.{{lang}} files); evaluate it with evaluate.split=test")
    missing = [lang for lang in langs if not has_split(data.local.root, "dev", lang)]
    if missing:
        raise ConfigError(f"evaluate.split=dev: {data.local.root} has no dev.{{lang}} file for {', '.join(missing)} "
                          f"(add dev.{missing[0]}.jsonl / .csv, or evaluate the other languages with lang=)")


def evaluation_plan(cfg: ExperimentConfig, r: Runs, tasks: list[str], seeds: list[int]
                    ) -> tuple[list[tuple[str, int, str, Path]], set[Path]]:
    """Every (task, seed, language, adaptation checkpoint) of the selection, and the last checkpoint of each
    finished adaptation (its predictions are saved by default). Refuses runs built on a model that changed since."""
    plan = []
    finals: set[Path] = set()
    if r.body is not None and r.body != r.pretrain:  # a bridge (step 1b) built on the primary model
        check_inputs(r.body, producers(pretrain=r.pretrain, source=primary_source(cfg, r)))
    for task in tasks:
        data = TaskData(task, cfg.tasks[task])
        langs = [lang for lang in data.languages(cfg.target_langs) if not cfg.lang or lang == cfg.lang]
        if cfg.evaluate.split == "dev":
            check_dev_sets(data, langs)
        for seed in seeds:
            ft = r.finetune(task, seed)
            require_finished(ft, f"the finetuning of {task} seed {seed}", f"minimodel finetune ... task={task} seed={seed}")
            # nothing built on an older model, or on an outside model whose weights changed since
            check_inputs(ft, producers(pretrain=r.pretrain, source=primary_source(cfg, r)))
            check_producer(cfg, ft, "evaluation")  # task featurisation and finetuning settings as configured
            for lang in langs:
                require_finished(r.adapt(lang), f"the adaptation of {lang}", f"minimodel adapt ... lang={lang}")
                # the body, the outside model and the language's tokenizer, shards and corpus, as adaptation read them
                check_inputs(r.adapt(lang), adapt_inputs(cfg, r, lang))
                check_producer(cfg, r.adapt(lang), "evaluation")
                ckpts = adaptation_checkpoints(r.adapt(lang))
                if not ckpts:
                    raise CheckpointError(f"no adaptation checkpoints for {lang} in {r.adapt(lang)} "
                                          f"(run `minimodel adapt ... lang={lang}`)")
                plan += [(task, seed, lang, c) for c in dev_selection(cfg, ckpts)]
                finals.add(ckpts[-1])
    return plan, finals


def dev_selection(cfg: ExperimentConfig, ckpts: list[Path]) -> list[Path]:
    """The checkpoints to score: all of them, or on the dev sets with ``evaluate.dev_checkpoints=plateau`` the two the
    report's plateau check and transfer rule read (the last, and the last at or before 1 - plateau_share of it)."""
    if cfg.evaluate.split != "dev" or cfg.evaluate.dev_checkpoints == "all":
        return ckpts
    steps = [checkpoint_step(c) for c in ckpts]
    cut = (1.0 - cfg.report.plateau_share) * steps[-1]
    before = [c for c, step in zip(ckpts[:-1], steps) if step <= cut + 1e-9]
    return [*before[-1:], ckpts[-1]]


def data_ids(cfg: ExperimentConfig, tasks: list[str], langs: set[str]) -> dict[tuple[str, str], str]:
    """(task, lang) -> the identity of the data its zero-shot rows are computed on (``provenance.data_identity``:
    the evaluation file, its featurisation settings, the target tokenizer)."""
    out = {}
    tokenizers = {lang: load_prepared_tokenizer(cfg, lang).sha256 for lang in langs}
    for task in tasks:
        data, t = TaskData(task, cfg.tasks[task]), cfg.tasks[task]
        settings = {"max_len": t.max_len, "text_fields": list(t.text_fields), "label_field": t.label_field,
                    "stride": t.stride, "max_answer_len": t.max_answer_len, "n_best": t.n_best}
        for lang in langs:
            try:
                where = data.split_file(cfg.evaluate.split, lang)
            except TaskDataError:  # no such file: the evaluation says so where it reads it
                continue
            out[(task, lang)] = data_identity(where, settings, tokenizers[lang])
    return out


def remove_stale(cfg: ExperimentConfig, plan: StagePlan, table: ResultsTable, tasks: list[str], seeds: list[int],
                 langs: set[str], data: dict[tuple[str, str], str]) -> None:
    """Rows of the selection whose adaptation or finetuning run was redone since they were written (other
    identities, ``provenance``), or whose evaluation data changed since (``data``: ``data_ids``), are removed,
    with their predictions files: the evaluation then computes them again from the runs and data as they are now."""
    r = plan.runs
    finetuned = {(t, s, b): run_identity(r.finetune(t, s, b)) for t in tasks for s in seeds for b in plan.bodies}
    adapted = {lang: run_identity(r.adapt(lang)) for lang in langs}
    current: dict[tuple, dict[str, str | None]] = {}
    for (task, seed, body), ft in finetuned.items():
        current[(task, seed, body, cfg.source_lang)] = {"finetune_id": ft}
        for lang, ad in adapted.items():
            if body == "primary":
                current[(task, seed, body, lang)] = {"finetune_id": ft, "adapt_id": ad,
                                                     **({"data_id": data[(task, lang)]} if (task, lang) in data else {})}
    stale = stale_rows((row for row in table.rows() if row["split"] == cfg.evaluate.split), current,
                       lambda row: (row["task"], row["seed"], row["body"], row["lang"]))
    if not stale:
        return
    table.remove(stale)
    for row in stale:
        if row["step"] >= 0:
            r.layout.predictions(r.label, row["task"], row["lang"], row["seed"], row["step"],
                                 row["split"]).unlink(missing_ok=True)
    which = sorted({f"{row['task']} seed {row['seed']} {row['lang']}" for row in stale})
    log.warning(f"evaluate {r.label}: {len(stale)} rows of {table.path} came from runs redone, or evaluation data "
                f"changed, since ({', '.join(which[:6])}{', ...' if len(which) > 6 else ''}): removed, with their "
                f"predictions, and evaluated again")


def record_english_truncation(r: Runs, tasks: list[str], seeds: list[int]) -> None:
    """The English files' truncation a finished finetuning recorded (its ``done.json``: the same for every seed),
    written beside the system's results for the report (``truncation.py``)."""
    for task in tasks:
        for seed in seeds:
            info = read_done(r.finetune(task, seed)) or {}
            if info.get("truncation"):
                for t in map(Truncation.from_dict, info["truncation"]):
                    write_truncation(r.layout.truncation(r.label, task, t.split, t.lang), t)
                break


def _evaluate(cfg: ExperimentConfig, plan: StagePlan, progress: bool, wandb: ResultsLogger, stop: _StopOnSignal
              ) -> Evaluation:
    r = plan.runs
    table = ResultsTable(r.results)
    tasks = [cfg.task] if cfg.task else list(cfg.finetune.tasks)
    seeds = [cfg.seed] if cfg.seed else list(cfg.finetune.seeds)
    rank, world, local = shard()
    device = device_for(cfg, local)
    cache: dict[tuple[str, tuple[str, ...], str], tuple[AnyTokenizer, list, list]] = {}
    evaluations, finals = evaluation_plan(cfg, r, tasks, seeds)
    check_train_files(cfg, plan, tasks, seeds)
    data_id = data_ids(cfg, tasks, {lang for _, _, lang, _ in evaluations})
    remove_stale(cfg, plan, table, tasks, seeds, {lang for _, _, lang, _ in evaluations}, data_id)
    done = {tuple(row[k] for k in KEY) for row in table.rows() if row["split"] == cfg.evaluate.split}
    keep = cfg.evaluate.save_predictions
    english = [row for task in tasks for seed in seeds for body in plan.bodies
               for row in english_rows(cfg, r, task, seed, body) if tuple(row[k] for k in KEY) not in done]
    english = table.append(english) if rank == 0 else []
    if rank == 0:
        record_english_truncation(r, tasks, seeds)
    for key in dict.fromkeys((row["task"], row["seed"], row["body"]) for row in english):
        wandb.log([row for row in english if (row["task"], row["seed"], row["body"]) == key])
    todo = [p for p in evaluations if (r.label, "primary", p[0], p[2], p[1], checkpoint_step(p[3])) not in done]
    # one process per GPU: every world-th (task, seed, language) of the whole plan (the same share whatever is
    # done already, so a requeued process picks up its own share)
    units = list(dict.fromkeys((task, seed, lang) for task, seed, lang, _ in evaluations))[rank::world]
    mine = [p for p in todo if p[:3] in units]
    log.info(f"evaluate {r.label}: {len(evaluations)} (task, seed, language, checkpoint) evaluations, "
             f"{len(evaluations) - len(todo)} already in {table.path}")
    started = time.perf_counter()
    if world > 1:
        log.info(f"process {rank} of {world}: {len(mine)} of them, on {device}")
    bar = tqdm(total=len(mine), desc="evaluate", disable=not bar_wanted(progress), dynamic_ncols=True, mininterval=0.5)
    loaded: tuple[str, int] | None = None
    body = head = data = None
    perplexity = Perplexity(cfg, r, device) if family_of(cfg.model).perplexity else None
    written, last_line = 0, started
    for task, seed, lang, path in mine:
        if stop.signal:
            log.warning(f"evaluate {r.label}: {stop.signal} received: stopping after {written} evaluations, "
                        f"{len(mine) - written} left; rerun the same command to resume")
            break
        if loaded != (task, seed):
            model_path = finetuned_model(r.finetune(task, seed))
            try:
                body, head, finetuned = load_finetuned(model_path)
            except CheckpointError as e:  # the finished run's last checkpoint rebuilds it, with the same identity
                raise CheckpointError(
                    f"{e}. To rebuild {model_path.name} from the finished run's last checkpoint: delete "
                    f"{model_path.parent / 'done.json'} and rerun `minimodel finetune ... task={task} seed={seed}` "
                    f"(it trains nothing and keeps the run's identity, so nothing built on it is redone)") from e
            data = task_of(cfg, task, finetuned, model_path)
            body.to(device), head.to(device)
            loaded = (task, seed)
        key = (task, data.labels, lang)
        if key not in cache:
            tok = load_prepared_tokenizer(cfg, lang)
            records = data.records(cfg.evaluate.split, lang)
            features, cut = data.featurise(records, tok)
            cache[key] = (tok, records, features)
            if cut is not None:
                trunc = Truncation(task, cfg.evaluate.split, lang, data.split_file(cfg.evaluate.split, lang),
                                   data.cfg.max_len, len(records), cut)
                say(trunc)
                write_truncation(r.layout.truncation(r.label, task, trunc.split, lang), trunc)
        tok, records, features = cache[key]
        adapted = load_adaptation(path)
        check_adaptation(adapted, cfg, lang, path)
        plug_embeddings(body, adapted, tok.sha256, tok.vocab_size)
        body.to(device)
        predictions = predict(body, head, features, cfg.finetune.eval_batch, device, cfg.evaluate.precision)
        scores = score(data, records, features, predictions, lang)
        if perplexity is not None:  # a causal LM's second metric, once per checkpoint (stages/perplexity.py)
            scores.update(perplexity(path, adapted, lang, tok))
        if keep == "all" or (keep == "final" and path in finals):
            save_predictions(r.layout.predictions(r.label, task, lang, seed, int(adapted.step), cfg.evaluate.split),
                             prediction_rows(data, records, features, predictions))
        base = {"system": r.label, "body": "primary", "task": task, "lang": lang, "seed": seed,
                "step": int(adapted.step), "flops": float(adapted.flops), "v100_days": float(adapted.v100_days),
                "split": cfg.evaluate.split, "pretrain_seed": cfg.pretrain.trainer.seed,
                "finetune_id": run_identity(r.finetune(task, seed)), "adapt_id": run_identity(r.adapt(lang)),
                **({"data_id": data_id[(task, lang)]} if (task, lang) in data_id else {})}
        rows = [{**base, "metric": m, "value": v} for m, v in scores.items()]
        wandb.log(table.append(rows))
        written += 1
        bar.update(1)
        if bar.disable and time.perf_counter() - last_line >= PROGRESS_EVERY_S:  # a log file: a line now and then
            last_line = time.perf_counter()
            left = (last_line - started) / written * (len(mine) - written)
            log.info(f"evaluate {r.label}: {written}/{len(mine)} evaluations, about {left:.0f} s left")
    bar.close()
    if written:
        took = time.perf_counter() - started
        log.info(f"evaluated {written} checkpoints in {took:.1f} s ({took / written:.2f} s each)")
    return Evaluation(table.path, stop.signal if written < len(mine) else "", written)
