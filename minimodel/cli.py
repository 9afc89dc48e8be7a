"""`minimodel STAGE CONFIG [key=value ...]`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from minimodel.config import ConfigError, ExperimentConfig, load_config



def _known_errors() -> tuple[type[Exception], ...]:
    from minimodel.data.corpus import CorpusError
    from minimodel.data.shards import ShardError
    from minimodel.data.tokenizer import TokenizerError
    from minimodel.stages.common import CheckpointError, NonFiniteLossError
    from minimodel.launch import SubmitError
    from minimodel.surgery import PlugError

    return (ConfigError, CorpusError, TokenizerError, ShardError, CheckpointError, NonFiniteLossError, PlugError,
            SubmitError)


def cmd_prepare(cfg: ExperimentConfig, args: argparse.Namespace) -> None:
    from minimodel.data.prepare import prepare_language

    langs = args.langs.split(",") if args.langs else [cfg.source_lang, *cfg.target_langs]
    for lang in langs:
        prepare_language(cfg, lang, progress=not args.no_progress)


def cmd_pretrain(cfg: ExperimentConfig, args: argparse.Namespace) -> None:
    from minimodel.stages.pretrain import run_pretrain

    run_pretrain(cfg, progress_bar=not args.no_progress)


def cmd_bridge(cfg: ExperimentConfig, args: argparse.Namespace) -> None:
    from minimodel.stages.bridge import run_bridge

    run_bridge(cfg, progress_bar=not args.no_progress)


def cmd_adapt(cfg: ExperimentConfig, args: argparse.Namespace) -> None:
    from minimodel.stages.adapt import run_adapt

    run_adapt(cfg, progress_bar=not args.no_progress)


def cmd_finetune(cfg: ExperimentConfig, args: argparse.Namespace) -> None:
    from minimodel.stages.finetune import run_all_finetuning

    run_all_finetuning(cfg, progress_bar=not args.no_progress)


def cmd_evaluate(cfg: ExperimentConfig, args: argparse.Namespace) -> None:
    from minimodel.stages.evaluate import run_evaluate

    print(run_evaluate(cfg, progress=not args.no_progress))


def cmd_run(cfg: ExperimentConfig, args: argparse.Namespace) -> None:
    """Every step of the experiment in order, in this process; finished steps are skipped."""
    from minimodel.pipeline import plan

    for step in plan(args.config, args.overrides):
        print(f"[minimodel run] {step.name}: minimodel {' '.join(step.args)}", flush=True)
        extra = ["--no-progress"] if args.no_progress else []
        rc = main([*step.args, *extra])
        if rc != 0:
            raise StepFailed(step.name, rc)


class StepFailed(RuntimeError):
    def __init__(self, step: str, rc: int) -> None:
        super().__init__(f"step {step} exited with code {rc}; rerun the same command to resume")
        self.rc = rc


def cmd_report(cfg: ExperimentConfig, args: argparse.Namespace) -> None:
    from minimodel.analysis import summary, write_report
    from minimodel.data.downstream import TaskData, majority_baseline

    baselines = {}
    for task in cfg.finetune.tasks:
        data = TaskData(task, cfg.tasks[task])
        try:
            langs = [cfg.source_lang, *data.languages(cfg.target_langs)]
            baselines.update({(task, lang): v for lang, v in majority_baseline(data, langs).items()})
        except Exception as e:  # the hub may be out of reach: the report goes on without the baseline
            print(f"[minimodel] no majority-class baseline for {task}: {e}", file=sys.stderr)
    path = write_report(cfg.runs_dir, cfg.name, baselines=baselines)
    print(summary(cfg.runs_dir, cfg.name, baselines=baselines))
    print(f"report: {path}")


def cmd_submit(cfg: ExperimentConfig, args: argparse.Namespace) -> None:
    from minimodel.launch import submit

    submit(args.config, args.overrides, launcher=args.launcher, dry_run=args.dry_run)


def cmd_flops(cfg: ExperimentConfig, args: argparse.Namespace) -> None:
    from minimodel.analysis import cost_table

    print(cost_table(cfg))


COMMANDS: dict[str, tuple[Callable[[ExperimentConfig, argparse.Namespace], None], str]] = {
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
            s.add_argument("--langs", default="", help="comma-separated languages (default: source + targets)")
        if name == "submit":
            s.add_argument("--launcher", default="local", help="conf/launcher/NAME.yaml or a path (cluster resources)")
            s.add_argument("--dry-run", action="store_true", help="write and print the scripts, submit nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    bad = [a for a in extra if "=" not in a or a.startswith("-")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    args.overrides = [*args.overrides, *extra]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    errors = _known_errors()
    from minimodel.stages import common

    try:
        cfg = load_config(args.config, args.overrides)
        COMMANDS[args.command][0](cfg, args)
    except StepFailed as e:
        print(f"minimodel {args.command}: {e}", file=sys.stderr)
        return e.rc
    except errors as e:
        print(f"minimodel {args.command}: error: {e}", file=sys.stderr)
        return 2
    if common.INTERRUPTED:
        print(f"minimodel {args.command}: stopped on {common.INTERRUPTED[0]} after writing a checkpoint; "
              f"rerun the same command to resume", file=sys.stderr)
        return common.REQUEUE_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
