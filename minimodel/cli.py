"""`minimodel COMMAND CONFIG [key=value ...]`.

Exit codes: 0 done; 2 bad input (the message names the file or key), or a file the disk refused (full, read-only);
3 stopped by SIGTERM/SIGUSR1, Ctrl-C in a training stage or ``trainer.max_minutes`` after a checkpoint: rerun
(requeue) to resume; 4 stopped at ``trainer.stop_at`` as asked: not finished (no ``done.json``), so no step that reads
it may start; rerun without ``stop_at`` to go on; 130 interrupted by Ctrl-C at once (any other command, a stage still
starting, or a second Ctrl-C): every file written is whole, rerun to go on (``errors.INTERRUPT_EXIT``). ``submit``,
``flops``, ``plan`` and ``report`` never import torch or Lightning."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minimodel import log as logs
from minimodel import signals
from minimodel.config.schema import ExperimentConfig, pooled_label
from minimodel.errors import ERROR_EXIT, INTERRUPT_EXIT, REQUEUE_EXIT, STOPPED_EXIT, ConfigError, UserError, one_line
from minimodel.experiment import load_experiment
from minimodel.store import atomic

log = logs.get_logger("minimodel.cli")


def _stopped(results: Any) -> str:
    """Why a stage of ``results`` (one StageResult or a list) stopped short of its end, or "" (every one finished):
    a signal, the wall-time cap (``trainer.max_minutes``) or ``stop_at=N``."""
    from minimodel.training.runner import Outcome  # only training commands get here: Lightning is loaded already

    for r in results if isinstance(results, list) else [results]:
        if r.outcome in (Outcome.INTERRUPTED, Outcome.STOPPED):
            return r.reason
    return ""


def cmd_prepare(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.config.checks import PATH_COMPONENT_RULE, is_path_component
    from minimodel.data.prepare import bridge_reads, prepare_jobs, prepare_language

    every = [cfg.source_lang, *cfg.target_langs]
    if args.langs:
        langs = args.langs.split(",")
    elif args.only == "source":  # the languages step 1b reads in the source tokenizer
        langs = list(bridge_reads(cfg))
    else:
        langs = [*every, *(x for x in bridge_reads(cfg) if x not in every)]
    for lang in langs:
        if not is_path_component(lang):
            raise UserError(f"--langs={args.langs!r}: the language {lang!r} names a corpus file and a prepared "
                            f"directory ({{data.prepared_dir}}/{{lang}}); {PATH_COMPONENT_RULE}")
    for lang in langs:
        for in_source in prepare_jobs(cfg, lang, args.only):  # bridge.langs: also its text in the source tokenizer
            stopped = prepare_language(cfg, lang, progress=not args.no_progress, in_source=in_source)
            if stopped:
                return stopped
    return ""


def cmd_pretrain(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.stages.pretrain import run_pretrain

    return _stopped(run_pretrain(cfg, progress_bar=not args.no_progress))


def cmd_bridge(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.stages.bridge import run_bridge

    return _stopped(run_bridge(cfg, progress_bar=not args.no_progress))


def cmd_adapt(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.stages.adapt import run_adapt

    return _stopped(run_adapt(cfg, progress_bar=not args.no_progress))


def cmd_finetune(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.stages.finetune import run_all_finetuning

    return _stopped(run_all_finetuning(cfg, progress_bar=not args.no_progress))


def cmd_evaluate(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    """Step 4 for every system of the experiment's sweep, as ``run`` evaluates them (in any split:
    ``evaluate.split=dev`` too), unless the command line picks one (``system=``/``tag=``, ``pipeline.SELECTORS``);
    stops at the first system a signal stopped."""
    import shlex

    from minimodel.pipeline import variants
    from minimodel.stages.evaluate import run_evaluate

    # one of run's steps names its sweep entry word for word: that system alone (the loaded cfg)
    picked = any(set(shlex.split(entry)) <= set(args.overrides) for entry in cfg.sweep)
    vs = variants(args.config, args.overrides) if cfg.sweep and not picked else []
    if len(vs) > 1:
        log.info(f"evaluate: every system of {cfg.name}'s sweep ({', '.join(v.label for v in vs)}), "
                 f"{cfg.evaluate.split} split; system= evaluates one")
    for v in vs or [None]:
        done = run_evaluate(cfg if v is None else v.cfg, progress=not args.no_progress)
        print(done.path)
        if done.stopped:
            return done.stopped
    return ""


class StepFailed(RuntimeError):
    def __init__(self, step: str, rc: int) -> None:
        super().__init__(f"step {step} exited with code {rc}; rerun the same command to resume")
        self.rc = rc


def cmd_run(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    """Every step of the experiment in order, in this process; finished steps are skipped."""
    from minimodel.pipeline import plan

    steps = plan(args.config, args.overrides, adapt_missing=args.adapt_missing)
    if args.adapt_missing and cfg.models_from:
        for step in steps:
            if step.stage == "adapt":
                log.warning(f"run --adapt-missing: {step.name}: experiment {cfg.models_from} has no such adaptation; "
                            f"it is made in this experiment's own runs ({step.run_dir}), never in "
                            f"{cfg.models_from}'s")
    for step in steps:
        log.info(f"run {step.name}: minimodel {' '.join(step.args)}")
        extra = ["--no-progress"] if args.no_progress else []
        rc = main([*step.args, *extra])
        if rc != 0:
            raise StepFailed(step.name, rc)
    return ""


def variant_infos(vs: list[Any]) -> dict[str, Any]:
    """What every MiniJoint-like variant (a head of its own model) of the experiment's variants ``vs``
    (``pipeline.variants``) is (``claims.VariantInfo``)."""
    from minimodel.report.claims import VariantInfo
    from minimodel.systems import Body, stage_plan

    out: dict[str, Any] = {}
    for v in vs:  # keyed as reports name systems: pretraining seeds pooled
        plan = stage_plan(v.cfg, "adapt")
        if plan.body is not Body.HEAD:
            continue
        seed = v.cfg.pretrain.trainer.seed
        out.setdefault(pooled_label(v.label, seed), VariantInfo(
            depth=plan.depth, pretraining=pooled_label(v.cfg.label, seed),
            multi_head=len(v.cfg.model.mini_heads) > 1, progressive=bool(v.cfg.adapt.schedule),
            forget=v.cfg.pretrain.forget_every > 0, data_fraction=v.cfg.adapt.data_fraction, init=v.cfg.adapt.init))
    return out


def init_twins(vs: list[Any]) -> dict[str, str]:
    """Label of each row adapted from FOCUS (``adapt.init=focus``, a tagged step-2 variant) -> the label of the same
    system adapted from overlap, when the experiment's variants ``vs`` have it (reports pool seeds): the report's FOCUS
    claims read these pairs, so rows of another initialisation (``mean``, ``random``) are not among them."""
    plain = {pooled_label(v.label, v.cfg.pretrain.trainer.seed) for v in vs if v.cfg.adapt.init == "overlap"}
    out: dict[str, str] = {}
    for v in vs:
        tag, seed = v.cfg.adapt.tag, v.cfg.pretrain.trainer.seed
        if v.cfg.adapt.init != "focus" or not tag:
            continue
        twin = pooled_label(v.label.replace(f"+{tag}", "").replace(f"@{tag}", ""), seed)
        if twin in plain:
            out[pooled_label(v.label, seed)] = twin
    return out


def dev_checks(cfg: ExperimentConfig, baselines: dict[tuple[str, str], dict[str, float]]) -> Any:
    """The report's dev-set checks (``report:``, ``selection.DevChecks``) with the dev majority-class ``baselines``;
    None when the experiment scores no dev sets (``evaluate.dev`` false)."""
    from minimodel.report.selection import DevChecks

    r = cfg.report
    return DevChecks(r.languages, r.transfer_margin, r.plateau_share, r.plateau_points, baselines) if cfg.evaluate.dev else None


def mini_depths(infos: dict[str, Any]) -> dict[str, int]:
    """Depth of the mini-model of every dedicated single-head MiniJoint variant (the paper's depth claim), from
    ``variant_infos``."""
    return {label: v.depth for label, v in infos.items() if v.plain}


def report_tasks(cfg: ExperimentConfig) -> list[str]:
    """The tasks the experiment's results hold (every one this configuration defines), its own tasks first."""
    from minimodel.store.layout import Layout
    from minimodel.store.results import ResultsTable

    found = {r["task"] for f in Layout.of(cfg).all_results() for r in ResultsTable(f).rows()}
    unknown = sorted(found - set(cfg.tasks))
    if unknown:
        log.warning(f"results of task(s) {unknown} are not defined under tasks: in this experiment: their report "
                    f"has no majority-class baseline")
    return list(dict.fromkeys([*cfg.finetune.tasks, *sorted(found & set(cfg.tasks))]))


def cmd_report(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.data.tasks import TaskData, majority_baseline
    from minimodel.models import families
    from minimodel.report.document import summary, write_report

    if args.out.endswith("/"):  # Path() drops it: the report would be a file of that name, its plots beside it
        raise ConfigError(f"--out {args.out} ends with '/' (a directory): the report is one Markdown file (its plots "
                          f"go to plots/ beside it): give a file path, e.g. --out {args.out}report.md")
    baselines: dict[tuple[str, str], dict[str, float]] = {}
    dev: dict[tuple[str, str], dict[str, float]] = {}  # the dev sets' (evaluate.dev: the report's dev checks)
    main_metrics: dict[str, str] = {}
    for task in report_tasks(cfg):
        try:
            data = TaskData(task, cfg.tasks[task])
            main_metrics[task] = data.metric
            targets = data.languages(cfg.target_langs)
            baselines.update({(task, lang): v for lang, v in
                              majority_baseline(data, [cfg.source_lang, *targets], cfg.evaluate.split).items()})
            if cfg.evaluate.dev:  # a task without dev sets: its languages are not checked
                dev.update({(task, lang): v for lang, v in majority_baseline(data, targets, "dev").items()})
        except Exception as e:  # the hub may be out of reach: the report goes on without the baseline
            log.warning(f"no majority-class baseline for {task}: {e}")
    checks = dev_checks(cfg, dev)
    from minimodel.pipeline import variants

    vs = variants(args.config, args.overrides)  # composed once: each variant loads the experiment again
    infos = variant_infos(vs)
    path = write_report(cfg.runs_dir, cfg.name, out=Path(args.out) if args.out else None, baselines=baselines,
                        depths=mini_depths(infos), variants=infos, main_metrics=main_metrics,
                        split=cfg.evaluate.split, checks=checks, inits=init_twins(vs),
                        family=families.of(cfg.model), systems=cfg.report.systems, force=args.force,
                        models_from=cfg.models_from)
    print(summary(cfg.runs_dir, cfg.name, baselines=baselines, main_metrics=main_metrics, split=cfg.evaluate.split,
                  checks=checks, systems=cfg.report.systems))
    print(f"report: {path}")
    from minimodel.store.results import ResultsTable
    from minimodel.store.wandb_results import log_report

    rows = [row for f in sorted(Path(cfg.runs_dir, cfg.name).glob("*/results.jsonl")) for row in ResultsTable(f).rows()]
    log_report(cfg, path, rows)
    return ""


def cmd_submit(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.cluster.launch import submit

    submit(args.config, args.overrides, launcher=args.launcher, dry_run=args.dry_run)
    return ""


def cmd_flops(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.report.costs import cost_table

    print(cost_table(cfg))
    return ""


def cmd_plan(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.cluster.launcher import launcher_path, load_launcher, memory_plan, misfits, plan_table

    lc = load_launcher(launcher_path(args.launcher, args.config))
    plans = memory_plan(args.config, args.overrides, lc)
    card = f"{lc.gpu_memory_gib:g} GiB per GPU" if lc.gpu_memory_gib else "GPU memory unknown: gpu_memory_gib is 0"
    for label, rows in plans:
        print(f"{cfg.name} / {label} on launcher {Path(lc.source).stem} ({card})\n\n{plan_table(rows)}\n")
        for line in misfits(rows):
            log.warning(f"WARNING: {label}: {line}")
    return ""


def cmd_layers(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.stages.layers import run_layers

    print(run_layers(cfg, args.json))
    return ""


def cmd_export(cfg: ExperimentConfig, args: argparse.Namespace) -> str:
    from minimodel.export import export, exported_system, push_to_hub

    if cfg.sweep and not any(o.split("=", 1)[0].lstrip("+~") in ("system", "tag") for o in args.overrides):
        log.info(f"export: no system= given: exporting {exported_system(cfg)}, the experiment's default system "
                 f"(system=NAME exports another of its sweep)")
    out = export(cfg, Path(args.out), step=args.step, embeddings_only=args.embeddings_only,
                 embeddings_from=args.embeddings, force=args.force)
    if args.push_to_hub:
        push_to_hub(out, args.push_to_hub)
    print(out)
    return ""


# each returns "", or the signal that stopped a training stage early (exit 3: requeue / rerun to resume)
COMMANDS: dict[str, tuple[Callable[[ExperimentConfig, argparse.Namespace], str], str]] = {
    "prepare": (cmd_prepare, "train tokenizers and encode corpora into token shards"),
    "pretrain": (cmd_pretrain, "step 1: MLM pretraining (resumes if a checkpoint exists)"),
    "bridge": (cmd_bridge, "step 1b (MiniPost): train the bridge layers of the mini-model"),
    "adapt": (cmd_adapt, "step 2: learn target-language embeddings (needs lang=xx)"),
    "finetune": (cmd_finetune, "step 3: finetune on English tasks (task=NAME seed=N, or all tasks x seeds)"),
    "evaluate": (cmd_evaluate, "step 4: zero-shot evaluation of every adaptation checkpoint (results.jsonl)"),
    "report": (cmd_report, "tables (paper's Tables 2-5, Figure 1 speedups) and plots from the results"),
    "run": (cmd_run, "every step of the experiment in order (skips finished steps, resumes the others)"),
    "submit": (cmd_submit, "write one sbatch script per step and submit them with afterok dependencies"),
    "flops": (cmd_flops, "print the experiment's training cost (paper formulas A1, A3, A4)"),
    "plan": (cmd_plan, "predict each training stage's memory per GPU and check it against the launcher's cards"),
    "layers": (cmd_layers, "per layer of the bridge's source model: redundancy and the step-0 loss of the affine "
                           "mini-model of that depth (choosing bridge.depth)"),
    "export": (cmd_export, "a transformers model + fast tokenizer with a language's embeddings (lang=xx [step=N] "
                           "[task=T seed=S]), or the embeddings alone (--embeddings-only)"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minimodel", description="Mini-model adaptation experiments.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        s = sub.add_parser(name, help=help_text)
        s.add_argument("config", help="experiment YAML, e.g. experiments/minijoint.yaml")
        s.add_argument("overrides", nargs="*", help="key=value overrides, e.g. pretrain.optim.updates=1000")
        s.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
        if name == "prepare":
            s.add_argument("--langs", default="", help="comma-separated languages (default: source + targets, and "
                                                       "the languages bridge.langs adds)")
            s.add_argument("--only", choices=("own", "source"), default="",
                           help="a language's own tokenizer and shards only, or only its text in the source "
                                "tokenizer that step 1b reads (bridge.langs); default: both where step 1b reads it")
        if name == "run":
            s.add_argument("--adapt-missing", action="store_true",
                           help="with models_from: adapt the target languages the reused experiment lacks, in this experiment's own runs")
        if name == "report":
            s.add_argument("--out", default="", help="where to write the report (default runs_dir/NAME/report.md); "
                                                     "its plots go to plots/ beside it); an existing file "
                                                     "is replaced only when it is a report minimodel wrote")
            s.add_argument("--force", action="store_true", help="replace --out (and its plots) whatever it holds")
        if name == "layers":
            s.add_argument("--json", default="", help="also write the rows to this (new) JSON file")
        if name in ("submit", "plan"):
            s.add_argument("--launcher", default="local", help="conf/launcher/NAME.yaml or a path (cluster resources)")
        if name == "submit":
            s.add_argument("--dry-run", action="store_true", help="write and print the scripts, submit nothing")
        if name == "export":
            s.add_argument("--out", required=True, help="the directory to write (new or empty)")
            s.add_argument("--embeddings-only", action="store_true",
                           help="write the embeddings, output bias, tokenizer and provenance only")
            s.add_argument("--embeddings", default="", help="plug this --embeddings-only export in instead of "
                                                            "the experiment's own adaptation")
            s.add_argument("--force", action="store_true", help="replace an earlier export in --out")
            s.add_argument("--push-to-hub", default="", metavar="REPO", help="upload the export (huggingface_hub)")
    return p


def _int_arg(item: str) -> int:
    key, _, value = item.partition("=")
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{key}={value!r}: expected a number of updates (e.g. {key}=500)") from None


CATCH_EARLY = ("prepare", "pretrain", "bridge", "adapt", "finetune", "evaluate", "run")
"""Commands that stop cleanly on SIGUSR1 / SIGTERM (checkpoint, exit 3): a signal before they are ready is
recorded and honoured (``signals``), not fatal."""


THREADED = ("pretrain", "bridge", "adapt", "finetune", "evaluate", "export")
"""Commands whose torch operations run on the threads ``threads.apply`` chooses (prepare: ``data.encode_threads``)."""


def _cpu(command: str, cfg: ExperimentConfig) -> None:
    """OpenMP's wait policy, which it reads once when torch loads it (``threads.wait_policy``, set in the environment
    while torch is not yet imported: a command line's process, not a test's nor run's later steps); then, for a
    command of ``THREADED``, its threads (``threads.apply``)."""
    import os

    from minimodel.cluster import threads
    busy = threads.measured_busy(threads.usable_cpus())  # the load, read once for both decisions
    if command in (*THREADED, "run") and "torch" not in sys.modules:
        policy = threads.wait_policy(os.environ, threads.usable_cpus(), busy)
        if policy:
            os.environ["OMP_WAIT_POLICY"] = policy
    if command in THREADED:
        threads.apply(cfg.cpu.threads, cfg.cpu.side_by_side, command, busy)


def _interrupted(command: str) -> int:
    log.error(f"{command}: interrupted (Ctrl-C): stopped at once; every file it wrote is whole (none is left "
              f"half-written): rerun the same command to go on")
    return INTERRUPT_EXIT


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    bad = [a for a in extra if "=" not in a or a.startswith("-")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    args.overrides = [*args.overrides, *extra]
    logs.setup()
    if args.no_progress:  # first: a library reads its switch when it is imported
        logs.progress_bars_off()
    early: dict = {}  # the signal handlers catch_early replaced: put back when the command ends
    sigint = signal.getsignal(signal.SIGINT)  # put back too: Lightning ignores Ctrl-C after it stopped a stage
    try:
        if args.command in CATCH_EARLY:  # first: SLURM may send USR1 up to a minute early, even as the job starts
            early = signals.catch_early()
        if args.command == "export":  # step=N picks an adaptation checkpoint: not a config key
            steps = [o for o in args.overrides if o.startswith("step=")]
            args.overrides = [o for o in args.overrides if o not in steps]
            args.step = _int_arg(steps[-1]) if steps else None
        cfg = load_experiment(args.config, args.overrides)
        _cpu(args.command, cfg)
        stopped = COMMANDS[args.command][0](cfg, args)
    except StepFailed as e:
        log.error(f"{args.command}: {e}")
        return e.rc
    except UserError as e:
        log.error(f"{args.command}: error: {one_line(str(e))}")
        return ERROR_EXIT
    except OSError as e:  # a write outside minimodel's own (atomic): a full or read-only disk is still exit 2
        refused = atomic.disk_error(e) or atomic.name_error(e)
        if refused is None:
            raise
        log.error(f"{args.command}: error: {one_line(str(refused))}")
        return ERROR_EXIT
    except KeyboardInterrupt:
        return _interrupted(args.command)
    except SystemExit:  # Lightning's answer to Ctrl-C inside a training stage: sys.exit(1)
        if signals.interrupted():
            return _interrupted(args.command)
        raise
    finally:
        signals.restore(early)
        if sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, sigint)
    if stopped.startswith("stop_at="):
        log.warning(f"{args.command}: stopped at {stopped} as asked, after writing a checkpoint: the step is not "
                    f"finished (exit {STOPPED_EXIT}); rerun without stop_at to go on")
        return STOPPED_EXIT
    if stopped:
        saved = "saving its progress" if args.command == "prepare" else "writing a checkpoint"
        log.warning(f"{args.command}: stopped on {stopped} after {saved}; rerun the same command to resume")
        return REQUEUE_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
