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
    from minimodel.surgery import PlugError

    return (ConfigError, CorpusError, TokenizerError, ShardError, CheckpointError, NonFiniteLossError, PlugError)


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
    try:
        cfg = load_config(args.config, args.overrides)
        COMMANDS[args.command][0](cfg, args)
    except errors as e:
        print(f"minimodel {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
