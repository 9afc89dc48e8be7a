"""The recipe for a real model, measured on SmolLM2-135M (issue 52, part 7), through the stages themselves
(``run_bridge``, ``run_adapt`` on ``experiments/recipe_smollm2.yaml``), not a copy of them.

    .venv/bin/python benchmarks/bench_recipe.py layers               # minimodel layers' table (N = 1..30), seconds
    .venv/bin/python benchmarks/bench_recipe.py step0                # every bridge.init's step-0 loss (N = 10, 12)
    .venv/bin/python benchmarks/bench_recipe.py bridge --runs affine:distill,affine:lm,random:lm [--updates 1000]
    .venv/bin/python benchmarks/bench_recipe.py independent --depth 12 --runs affine:distill  # a finished bridge's gap
    .venv/bin/python benchmarks/bench_recipe.py alignment --depth 12 --runs affine:distill,copy:lm --langs fr,ru  # KL
    .venv/bin/python benchmarks/bench_recipe.py init --langs fr,ru --inits mean,overlap,random   # step 2's step 0
    .venv/bin/python benchmarks/bench_recipe.py embeddings --langs fr,ru [--adapt-updates 500]
    .venv/bin/python benchmarks/bench_recipe.py summary              # issue 52's targets, from the JSON alone
    .venv/bin/python benchmarks/bench_recipe.py table --langs fr,ru  # part (b)'s grid as markdown, from the JSON

Each part adds its figures under its own key of ``--json`` (default benchmarks/results/recipe-vm.json), keeping the
other parts' (each run is kept as it finishes, so a stopped benchmark loses only the run in progress). Needs the
GGUF (``bash scripts/get_smollm2.sh``) and the prepared data (``minimodel prepare experiments/recipe_smollm2.yaml
--langs en,fr,ru``). Runs go to ``--runs-dir`` (default runs/recipe_bench), one experiment name per setting, so a
rerun skips what is finished.

(a) **bridge**: the mini-model's English validation loss (32 blocks of 256 tokens, held out) at step 0 and every
250 updates of 4 x 256 tokens, per (bridge.init, bridge.objective), same data order and seed; beside SmolLM2's own
loss on the same blocks. (b) **embeddings**: target-language loss per character of SmolLM2 for each adapt.init (and
vocabulary) at step 0 and after step 2, over the full model and over the mini-model, against SmolLM2 with its own
tokenizer, on the text of the target's held-out blocks (decoded, so every tokenizer reads the same characters)."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from minimodel.config.schema import ExperimentConfig  # noqa: E402
from minimodel.experiment import load_experiment  # noqa: E402
from minimodel.stages.perplexity import held_out_texts, loss_per_char  # noqa: E402

EXPERIMENT = ROOT / "experiments" / "recipe_smollm2.yaml"
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "recipe-vm.json"
BRIDGE = "affine:distill"  # part (b)'s default mini-model: the recipe file's bridge


def config(runs: Path, name: str, *overrides: str) -> ExperimentConfig:
    return load_experiment(EXPERIMENT, [f"name={name}", f"runs_dir={runs}", *overrides])


def update_json(path: Path, key: str, value: Any, machine: bool = True) -> None:
    """Set ``key`` of the JSON at ``path``: read, changed and replaced whole under a lock, so that two parts run at
    once (the grid, and another part started beside it) keep each other's keys. (Not one key written by both: each
    part reads its key's rows earlier and writes them back whole.)"""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        figures = json.loads(path.read_text()) if path.exists() else {}
        figures[key] = value
        if machine:  # the machine that measured it (a part that only reads the JSON leaves the record as it is)
            figures["machine"] = {"cpu": platform.processor() or _cpu(), "threads": torch.get_num_threads(),
                                  "torch": torch.__version__, "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(figures, indent=1, default=str) + "\n")
        tmp.replace(path)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


def val_losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")}


def train_losses(run_dir: Path) -> dict[int, float]:
    """The logged training loss (the mini-model's own LM loss, whatever the objective) by update."""
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


# ------------------------------------------------------------------------------------------------ (a) the bridge


def _suffix(args: argparse.Namespace, sep: str) -> str:
    """``--tag``: a setting outside the grid (its ``--override``s) gets run names and JSON keys of its own."""
    return f"{sep}{args.tag}" if args.tag else ""


def _variant(vocabulary: str) -> str:
    """A step-2 row key's vocabulary part: replace keeps the keys (and adaptation runs) of the first rows, extend
    gets its own."""
    return "" if vocabulary == "replace" else f"{vocabulary}/"


def _finished(args: argparse.Namespace, part: str, lang: str | None, key: str, updates: int | None = None) -> bool:
    """Whether the JSON already holds a finished row of ``key`` (for as many updates, where a row has them): a grid
    rerun then costs only what is missing, not a re-evaluation of every finished run (``--redo`` measures it again).
    The runs a skipped bridge row stands for are rebuilt only where a later row reads them (``ensure_bridge``)."""
    figures = json.loads(args.json.read_text()).get(part, {}) if args.json.exists() else {}
    row = (figures.get(lang, {}) if lang else figures).get(key)
    done = not args.redo and row is not None and (updates is None or (
        row.get("outcome") == "finished" and row.get("updates") == updates))
    if done:
        print(f"{part} {lang or ''} {key}: in {args.json.name}, skipped (--redo measures it again)", flush=True)
    return done


def ensure_bridge(args: argparse.Namespace, init: str, objective: str) -> Path:
    """The finished run of part (a)'s bridge (``init``, ``objective``): trained here when this machine lacks it (a
    successor VM without runs/), skipped by the stage when it is finished. Returns its run directory."""
    from minimodel.stages.bridge import run_bridge
    from minimodel.store.layout import is_done

    name, cfg = bridge_run(args, init, objective, f"bridge.optim.updates={args.updates}")
    run_dir = args.runs_dir / name / "minipost" / "bridge"
    if not is_done(run_dir):
        print(f"{name}: no finished bridge run here; training it ({args.updates} updates)", flush=True)
        result = run_bridge(cfg, progress_bar=False)
        if result.outcome.value != "finished":
            raise SystemExit(f"{name}: the bridge ended {result.outcome.value}, not finished")
    return run_dir


def bridge_run(args: argparse.Namespace, init: str, objective: str, *extra: str) -> tuple[str, ExperimentConfig]:
    """Part (a)'s bridge run of (``init``, ``objective``) at ``--depth``: its experiment name and configuration (part
    (b)'s step 2 and the ``independent`` check read the same run)."""
    name = f"recipe-N{args.depth}-{init}-{objective}{_suffix(args, '-')}"
    return name, config(args.runs_dir, name, f"bridge.init={init}", f"bridge.objective={objective}",
                        f"bridge.depth={args.depth}", f"bridge.layers={args.bridge_layers}", *extra, *args.override)


def part_layers(args: argparse.Namespace) -> dict:
    from minimodel.stages.layers import layer_rows

    cfg = config(args.runs_dir, "recipe-layers", f"bridge.layers={args.bridge_layers}")
    start = time.perf_counter()
    rows, about = layer_rows(cfg)
    return {"about": about, "rows": rows, "seconds": time.perf_counter() - start}


def part_step0(args: argparse.Namespace) -> dict:
    from minimodel.data.mlm import mlm_datamodule
    from minimodel.data.prepare import load_source_tokenizer
    from minimodel.models.surgery import build_minipost
    from minimodel.stages.bridge import fit_bridge_map, load_primary, step0_losses

    out: dict[str, Any] = {}
    for depth in args.depths:
        cfg = config(args.runs_dir, "recipe-step0", f"bridge.depth={depth}", f"bridge.layers={args.bridge_layers}")
        primary, trained_with = load_primary(cfg.bridge.source, cfg.model.family, runs_dir=str(cfg.runs_dir))
        tok = load_source_tokenizer(cfg, primary, cfg.bridge.source, trained_with)
        data = mlm_datamodule(cfg, "en", cfg.bridge.optim, cfg.bridge.trainer.seed, tok)
        data.setup()
        for init in ("random", "copy", "affine"):
            start = time.perf_counter()
            fit = fit_bridge_map(cfg, primary, data) if init == "affine" else None
            mini = build_minipost(primary, depth, args.bridge_layers, seed=cfg.bridge.trainer.seed, init=init,
                                  affine=(fit.weight, fit.bias) if fit else None)
            losses = step0_losses(cfg, mini, primary, data)
            out[f"N{depth}/{init}"] = {**losses, "depth": depth, "init": init, "r2": fit.r2 if fit else None,
                                       "seconds": time.perf_counter() - start}
            print(f"N={depth} {init:7s} step-0 loss {losses['step0_loss']:.3f} (SmolLM2 {losses['source_loss']:.3f})",
                  flush=True)
    return out


def part_bridge(args: argparse.Namespace) -> None:
    from minimodel.stages.bridge import run_bridge

    for spec in args.runs:
        init, objective = spec.split(":")
        name, cfg = bridge_run(args, init, objective, f"bridge.optim.updates={args.updates}")
        if _finished(args, "bridge", None, f"N{args.depth}/{spec}{_suffix(args, '@')}", args.updates):
            continue
        start = time.perf_counter()
        result = run_bridge(cfg, progress_bar=False)
        seconds = time.perf_counter() - start
        info = json.loads((result.run_dir / "bridge_info.json").read_text())
        losses = val_losses(result.run_dir)
        row = {"init": init, "objective": objective, "depth": args.depth, "bridge_layers": args.bridge_layers,
               "updates": args.updates, "tokens": args.updates * cfg.bridge.optim.global_batch * cfg.data.seq_len,
               "step0_loss": info["step0_loss"], "source_loss": info["source_loss"], "val_loss": losses,
               "final_gap": losses[max(losses)] - info["source_loss"] if losses else None,
               "affine_r2": info.get("affine", {}).get("r2"), "seconds_this_call": seconds,
               "outcome": result.outcome.value, "stopped_at": result.step if result.outcome.value == "stopped" else None,
               "flops": result.done.get("flops"), "train_loss": train_losses(result.run_dir),
               "overrides": args.override, "cpu": platform.processor() or _cpu(),
               "langs": info.get("langs")}  # bridge.langs: per language, what it held out and its KL before and after
        key = f"N{args.depth}/{init}:{objective}{_suffix(args, '@')}"
        figures = json.loads(args.json.read_text()).get("bridge", {}) if args.json.exists() else {}
        figures[key] = row
        update_json(args.json, "bridge", figures)
        print(f"{key}: step 0 {info['step0_loss']:.3f}, " + ", ".join(f"{s}: {v:.3f}" for s, v in sorted(losses.items()))
              + f" (SmolLM2 {info['source_loss']:.3f}); {seconds:.0f} s", flush=True)


def part_independent(args: argparse.Namespace) -> None:
    """The finished bridges' gap to SmolLM2 on English text that neither step 1b nor its validation read (SIB-200's
    English sentences, every split, joined by line breaks into blocks of ``data.seq_len`` tokens): a learning rate
    chosen on the validation blocks is then read on other text."""
    from minimodel.data.mlm import mlm_datamodule
    from minimodel.data.prepare import load_source_tokenizer
    from minimodel.models.bridge_init import mean_lm_loss
    from minimodel.models.surgery import build_minipost
    from minimodel.stages.bridge import fit_bridge_map, load_primary
    from minimodel.store.checkpoints import load_final_model
    from minimodel.store.layout import last_checkpoint

    text = "\n".join(json.loads(line)["text"] for split in ("train", "dev", "test.en")
                     for line in (ROOT / "data" / "sib200" / f"{split}.jsonl").read_text().splitlines())
    out = json.loads(args.json.read_text()).get("independent", {}) if args.json.exists() else {}
    _, base = bridge_run(args, *args.runs[0].split(":"))  # SmolLM2, its tokenizer and the blocks: the same for every run
    smollm2, trained_with = load_primary(base.bridge.source, base.model.family, runs_dir=str(base.runs_dir))
    own = load_source_tokenizer(base, smollm2, base.bridge.source, trained_with)
    n = base.data.seq_len
    blocks, labels = _blocks(own.encode_one(text), n)
    source_loss = mean_lm_loss(smollm2, blocks, labels)
    for spec in args.runs:
        init, objective = spec.split(":")
        name, cfg = bridge_run(args, init, objective)
        mini, _ = load_final_model(last_checkpoint(args.runs_dir / name / "minipost" / "bridge"), "bridge")
        # the same mini-model before any update (its map fitted as the stage fits it, on the bundled English)
        data = mlm_datamodule(cfg, "en", cfg.bridge.optim, cfg.bridge.trainer.seed, own)
        data.setup()
        fit = fit_bridge_map(cfg, smollm2, data) if init == "affine" else None
        step0 = build_minipost(smollm2, args.depth, args.bridge_layers, seed=cfg.bridge.trainer.seed, init=init,
                               affine=(fit.weight, fit.bias) if fit else None)
        row = {"text": "data/sib200 en (train, dev, test)", "blocks": len(blocks), "tokens": len(blocks) * n,
               "mini_loss": mean_lm_loss(mini, blocks, labels), "source_loss": source_loss,
               "step0_loss": mean_lm_loss(step0, blocks, labels)}
        row["gap"], row["step0_gap"] = row["mini_loss"] - row["source_loss"], row["step0_loss"] - row["source_loss"]
        out[f"N{args.depth}/{init}:{objective}{_suffix(args, '@')}"] = row
        print(f"{name}: {row['mini_loss']:.3f} (step 0: {row['step0_loss']:.3f}) against SmolLM2's "
              f"{row['source_loss']:.3f} (gap {row['gap']:.3f}) "
              f"on {len(blocks)} blocks of SIB-200's English", flush=True)
    update_json(args.json, "independent", out)


def _blocks(ids: list[int], n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``ids`` cut into blocks of ``n`` tokens, each with its next-token labels (none after its last token)."""
    blocks = [torch.tensor(ids[i:i + n]) for i in range(0, len(ids) - n + 1, n)]
    return blocks, [torch.cat([b[1:], torch.tensor([-100])]) for b in blocks]


def part_alignment(args: argparse.Namespace) -> None:
    """How closely each finished bridge of part (a) follows SmolLM2, the teacher: KL(SmolLM2 || mini-model) of the
    next-token distributions, the LM loss and top-1 agreement, on the English validation blocks step 1b reads and on
    each target language's held-out text in SmolLM2's own tokens (text no bridge trained on; what step 2 must learn
    over the mini-model). The English LM loss says how good the mini-model is; the KL how much it behaves like the
    model its embeddings are plugged into."""
    from minimodel.data.mlm import mlm_datamodule
    from minimodel.data.prepare import load_source_tokenizer
    from minimodel.models.bridge_init import agreement
    from minimodel.stages.bridge import load_primary, val_blocks
    from minimodel.store.checkpoints import load_final_model
    from minimodel.store.layout import last_checkpoint

    _, base = bridge_run(args, *args.runs[0].split(":"))
    smollm2, trained_with = load_primary(base.bridge.source, base.model.family, runs_dir=str(base.runs_dir))
    own = load_source_tokenizer(base, smollm2, base.bridge.source, trained_with)
    data = mlm_datamodule(base, "en", base.bridge.optim, base.bridge.trainer.seed, own)
    data.setup()
    texts = {"en": val_blocks(base, data)}  # what step 1b's validation reads
    for lang in args.langs:
        texts[lang] = _blocks([t for text in held_out_texts(base, lang) for t in own.encode_one(text)],
                              base.data.seq_len)
    out = json.loads(args.json.read_text()).get("alignment", {}) if args.json.exists() else {}
    for spec in args.runs:
        key = f"N{args.depth}/{spec}{_suffix(args, '@')}"
        if _finished(args, "alignment", None, key) and set(out[key]) >= set(texts):
            continue
        init, objective = spec.split(":")
        name, _ = bridge_run(args, init, objective)
        mini, _ = load_final_model(last_checkpoint(ensure_bridge(args, init, objective)), "bridge")
        row = {lang: agreement(mini, smollm2, *bl) for lang, bl in texts.items()}
        out[key] = row
        print(f"{name}: " + "; ".join(f"{lang} KL {r['kl']:.3f}, LM {r['lm_loss']:.3f}, top-1 {r['top1_agreement']:.3f}"
                                      for lang, r in row.items()), flush=True)
        update_json(args.json, "alignment", out)


# ------------------------------------------------------------------------------------------- (b) the embeddings


def part_init(args: argparse.Namespace) -> None:
    """Step 0 of step 2 for every ``adapt.init``: SmolLM2 with the initial target embeddings (the stage's own
    ``INITS``, the body being SmolLM2 itself: an initialisation reads only the source's embeddings and the two
    tokenizers, so it is the same for every system), against SmolLM2 with its own tokenizer; no training."""
    import copy

    from minimodel.data.prepare import load_prepared_tokenizer, load_source_tokenizer
    from minimodel.models.model import PRIMARY
    from minimodel.models.surgery import swap_embeddings
    from minimodel.stages.adapt import INITS, Inputs, init_output, keep_source_rows
    from minimodel.stages.bridge import load_primary

    for lang in args.langs:
        starts = [(v, i) for v in args.vocabularies for i in args.inits if not _finished(args, "init", lang, f"{v}/{i}")]
        if not starts:
            continue  # every start asked for is in the JSON (--redo measures them again)
        cfg = config(args.runs_dir, "recipe-init", f"lang={lang}", "system=bl_base", *args.override)
        smollm2, trained_with = load_primary(cfg.bridge.source, cfg.model.family, runs_dir=str(cfg.runs_dir))
        own = load_source_tokenizer(cfg, smollm2, cfg.bridge.source, trained_with)
        texts = held_out_texts(cfg, lang)
        window = cfg.data.seq_len
        out: dict[str, Any] = {"smollm2_own_tokenizer": loss_per_char(smollm2, own, texts, window),
                               "held_out": {"blocks": len(texts), "chars": sum(len(t) for t in texts)}}
        print(f"{lang}: SmolLM2 with its own tokenizer {out['smollm2_own_tokenizer']['nats_per_char']:.4f} nats/char "
              f"({out['smollm2_own_tokenizer']['tokens_per_char']:.3f} tokens/char)", flush=True)
        for vocabulary, init in starts:
            start = time.perf_counter()
            c = config(args.runs_dir, "recipe-init", f"lang={lang}", "system=bl_base", f"adapt.init={init}",
                       f"adapt.vocabulary={vocabulary}", *args.override)
            target = load_prepared_tokenizer(c, lang)  # extend: SmolLM2's tokenizer plus the target's new pieces
            model = copy.deepcopy(smollm2)
            x = Inputs(model, c.bridge.source, own, target)
            initial = INITS[init](c, x, PRIMARY)
            if initial.output is None:
                initial.output = init_output(model, own, target, c.adapt.trainer.seed, PRIMARY)
            if vocabulary == "extend":
                keep_source_rows(x, initial, PRIMARY)
            swap_embeddings(model, initial.weight, initial.bias, initial.output)
            key = f"{vocabulary}/{init}"
            out[key] = {**loss_per_char(model, target, texts, window), "init_info": initial.info,
                        "copied": initial.overlap, "vocab": target.vocab_size, "seconds": time.perf_counter() - start}
            print(f"{lang} {key}: {out[key]['nats_per_char']:.4f} nats/char ({out[key]['tokens_per_char']:.3f} "
                  f"tokens/char)", flush=True)
        figures = json.loads(args.json.read_text()).get("init", {}) if args.json.exists() else {}
        figures.setdefault(lang, {}).update(out)  # another --inits adds its rows; the ones measured before stay
        update_json(args.json, "init", figures)


def part_embeddings(args: argparse.Namespace) -> None:
    """Per target language: SmolLM2 with its own tokenizer; then per (system, adapt.init): step 2 (``run_adapt``) and
    SmolLM2's loss per character with each adaptation checkpoint's embeddings plugged in."""
    from minimodel.data.prepare import load_prepared_tokenizer, load_source_tokenizer
    from minimodel.models.surgery import plug_embeddings
    from minimodel.stages.adapt import run_adapt
    from minimodel.stages.bridge import load_primary
    from minimodel.store.checkpoints import load_adaptation
    from minimodel.store.layout import adaptation_checkpoints

    bridge_init, objective = args.bridge_recipe.split(":")
    trained = f"bridge.optim.updates={args.updates}"  # the bridge's length (--updates), as part (a) trained it
    name, base = bridge_run(args, bridge_init, objective, trained)  # part (a)'s mini-model
    smollm2, trained_with = load_primary(base.bridge.source, base.model.family, runs_dir=str(base.runs_dir))
    own = load_source_tokenizer(base, smollm2, base.bridge.source, trained_with)
    window = base.data.seq_len
    for lang in args.langs:
        texts = held_out_texts(base, lang)
        figures = json.loads(args.json.read_text()).get("embeddings", {}) if args.json.exists() else {}
        entry = figures.setdefault(lang, {})
        if args.redo or "smollm2_own_tokenizer" not in entry:
            entry["smollm2_own_tokenizer"] = loss_per_char(smollm2, own, texts, window)
        entry["held_out"] = {"blocks": len(texts), "chars": sum(len(t) for t in texts)}
        update_json(args.json, "embeddings", figures)
        print(f"{lang}: SmolLM2 with its own tokenizer {entry['smollm2_own_tokenizer']['nats_per_char']:.4f} "
              f"nats/char", flush=True)
        for vocabulary in args.vocabularies:
            variant = _variant(vocabulary)
            for system in args.systems:
                for init in args.inits:
                    over = f"[{args.bridge_recipe}]" if system == "minipost" and args.bridge_recipe != BRIDGE else ""
                    seed = f"#s{args.adapt_seed}" if args.adapt_seed else ""  # another step-2 seed: a row of its own
                    key = f"{system}/{variant}{init}{over}{_suffix(args, '@')}{seed}"
                    if _finished(args, "embeddings", lang, key, args.adapt_updates):
                        continue
                    _, cfg = bridge_run(args, bridge_init, objective, trained, f"system={system}", f"lang={lang}",
                                        f"adapt.init={init}", f"adapt.vocabulary={vocabulary}",
                                        f"adapt.tag={variant.replace('/', '-')}{init}{seed.replace('#', '-')}",
                                        f"adapt.optim.updates={args.adapt_updates}",
                                        *([f"adapt.trainer.seed={args.adapt_seed}"] if args.adapt_seed else []))
                    target = load_prepared_tokenizer(cfg, lang)  # extend: SmolLM2's pieces plus the target's new ones
                    if system == "minipost":
                        ensure_bridge(args, bridge_init, objective)
                    start = time.perf_counter()
                    result = run_adapt(cfg, progress_bar=False)
                    seconds = time.perf_counter() - start
                    row: dict[str, Any] = {
                        "system": system, "init": init, "vocabulary": vocabulary, "updates": args.adapt_updates,
                        "tokens_per_update": cfg.adapt.optim.global_batch * cfg.data.seq_len,
                        "seconds_this_call": seconds, "outcome": result.outcome.value,
                        "init_info": json.loads((result.run_dir / "adapt_info.json").read_text())["init"],
                        "overrides": args.override, "cpu": platform.processor() or _cpu(), "checkpoints": {},
                        "seed": cfg.adapt.trainer.seed}
                    for path in adaptation_checkpoints(result.run_dir):
                        adapted = load_adaptation(path)
                        model, _ = load_primary(base.bridge.source, base.model.family, runs_dir=str(base.runs_dir))
                        plug_embeddings(model, adapted, target.sha256, target.vocab_size)
                        row["checkpoints"][adapted.step] = {**loss_per_char(model, target, texts, window),
                                                            "flops": adapted.flops}
                        print(f"{lang} {system} {vocabulary} {init} step {adapted.step}: "
                              f"{row['checkpoints'][adapted.step]['nats_per_char']:.4f} nats/char", flush=True)
                    row["bridge"] = f"N{args.depth}/{args.bridge_recipe}{_suffix(args, '@')}" if system == "minipost" else None
                    figures = json.loads(args.json.read_text()).get("embeddings", {})
                    figures.setdefault(lang, {})[key] = row
                    update_json(args.json, "embeddings", figures)


# ------------------------------------------------------------------------------------------------ the targets

ENGLISH_GAP = 0.5  # target 1: the mini-model's English loss within this of the source's ...
BRIDGE_TOKENS = 1_000_000  # ... after at most this many step-1b tokens
STEP2_TOKENS = 1_000_000  # target 2: below the source's own loss per character within this many step-2 tokens
NEAR_MAX = 0.95  # ... and reaching this share of standard adaptation's improvement ...
COMPUTE_SHARE = 0.5  # ... with at most this share of its compute


def first_reach(points: list[tuple[float, float]], target: float) -> float | None:
    """The x at which the loss curve ``points`` ((x, loss), x ascending) first comes down to ``target``: the report's
    time to target (``report.curves.time_to_target``, interpolated the same way) on the negated loss; None when
    never."""
    from minimodel.report.curves import time_to_target

    x = time_to_target([p[0] for p in points], [-p[1] for p in points], -target)
    return None if math.isinf(x) else x


def at(points: list[tuple[float, float]], x: float) -> float | None:
    """The curve's value at ``x`` by linear interpolation; None outside its measured span."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return points[-1][1] if points and points[-1][0] == x else None


def bridge_gap_at(row: dict[str, Any], tokens: int) -> float | None:
    """A bridge row's English gap to the source after ``tokens`` step-1b tokens (its validation curve, interpolated;
    step 0 at 0 tokens); None when the row did not train that far."""
    per_update = row["tokens"] / row["updates"]
    curve = [(0.0, row["step0_loss"])] + sorted(((int(k) + 1) * per_update, v) for k, v in row["val_loss"].items())
    loss = at(curve, float(tokens))
    return None if loss is None else loss - row["source_loss"]


def settings(rows: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """A language's finished step-2 rows grouped by setting: KEY (seed 0: the recipe file's seed) and its other step-2
    seeds KEY#sN (``--adapt-seed N``), as {seed: row}."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for key, row in rows.items():
        if isinstance(row, dict) and row.get("outcome") == "finished" and row.get("checkpoints"):
            setting, _, seed = key.partition("#s")
            out.setdefault(setting, {})[int(seed) if seed else 0] = row
    return out


def step2_curve(row: dict[str, Any], x: str = "flops") -> list[tuple[float, float]]:
    """(FLOPs or tokens, loss per character) at each checkpoint of a step-2 row, in order of updates."""
    steps = sorted(row["checkpoints"], key=int)
    if x == "flops":
        return [(float(row["checkpoints"][s]["flops"]), row["checkpoints"][s]["nats_per_char"]) for s in steps]
    return [(float(int(s) * row["tokens_per_update"]), row["checkpoints"][s]["nats_per_char"]) for s in steps]


def _stats(values: list[float]) -> dict[str, float]:
    t = torch.tensor(values, dtype=torch.float64)
    return {"mean": float(t.mean()), "std": float(t.std()) if len(values) > 1 else 0.0, "n": len(values)}


def targets(figures: dict[str, Any]) -> dict[str, Any]:
    """Whether issue 52's targets are met, from the JSON's rows alone: per bridge, its English gap after
    ``BRIDGE_TOKENS``; per MiniPost step-2 setting, whether it ends below the source's own tokenizer within
    ``STEP2_TOKENS`` and the FLOPs it takes to reach ``NEAR_MAX`` of BL_BASE's improvement (BL_BASE of the same
    language, vocabulary and initialisation; each seed against its own BL_BASE seed where there is one, else the
    first), against BL_BASE's own."""
    out: dict[str, Any] = {"bridges": {}, "step2": {}, "curves": {}}
    for key, row in figures.get("bridge", {}).items():
        if row.get("outcome") != "finished" or not row.get("val_loss"):
            continue
        gap = bridge_gap_at(row, BRIDGE_TOKENS)
        out["bridges"][key] = {"gap_at_1M": gap, "met": gap is not None and gap <= ENGLISH_GAP}
    for lang, rows in figures.get("embeddings", {}).items():
        own = rows.get("smollm2_own_tokenizer", {}).get("nats_per_char")
        groups = settings(rows)
        for key, seeds in groups.items():  # every setting's loss per character at each checkpoint, over its seeds
            runs = list(seeds.values())
            steps = sorted(set.intersection(*(set(r["checkpoints"]) for r in runs)), key=int)
            out["curves"][f"{lang}/{key}"] = {
                s: {**_stats([r["checkpoints"][s]["nats_per_char"] for r in runs]),
                    "flops": runs[0]["checkpoints"][s]["flops"]} for s in steps}
        for key, seeds in groups.items():
            if not key.startswith("minipost/"):
                continue
            rest = key[len("minipost/"):].split("[")[0]  # the step-2 setting, without the bridge it runs over
            base = groups.get("bl_base/" + rest) or groups.get("bl_base/" + rest.split("@")[0])  # tag: a bridge's
            if not base:
                continue
            per_seed = []
            for seed, run in sorted(seeds.items()):
                ref_seed = seed if seed in base else min(base)  # its own BL_BASE seed where there is one (recorded)
                ref_curve, mine = step2_curve(base[ref_seed]), step2_curve(run)
                start, final = ref_curve[0][1], ref_curve[-1][1]
                goal = start - NEAR_MAX * (start - final)
                ref_flops, my_flops = first_reach(ref_curve, goal), first_reach(mine, goal)
                tokens = step2_curve(run, "tokens")
                within = [y for x, y in tokens if x <= STEP2_TOKENS]
                best = min(within) if within else None
                below = None if own is None or best is None else best < own
                if below is False and tokens[-1][0] < STEP2_TOKENS:
                    below = None  # not below as far as it was measured, and not measured to STEP2_TOKENS
                per_seed.append({"seed": seed, "bl_base_seed": ref_seed, "goal": goal, "bl_base_flops": ref_flops,
                                 "flops": my_flops,
                                 "share": my_flops / ref_flops if my_flops is not None and ref_flops else None,
                                 "best_within_1M_tokens": best, "tokens_measured": tokens[-1][0], "below_own": below,
                                 "flops_measured": mine[-1][0]})
            bridge = next(iter(seeds.values())).get("bridge")
            out["step2"][f"{lang}/{key}"] = {
                "bridge": bridge, "bridge_meets_target_1": out["bridges"].get(bridge, {}).get("met"),
                "own_tokenizer": own, "seeds": per_seed,
                # True: every seed below; False: a seed measured to 1M tokens is not; None: not measured that far
                "below_own_within_1M": _every([r["below_own"] for r in per_seed]),
                "compute_met": _compute_met(per_seed),
                "final": _stats([step2_curve(r)[-1][1] for r in seeds.values()])}
    return out


def _every(verdicts: list[bool | None]) -> bool | None:
    """Seeds' verdicts together: True when every one holds, False when one fails, None (undecided) otherwise."""
    return True if all(v is True for v in verdicts) else (False if any(v is False for v in verdicts) else None)


def _compute_met(per_seed: list[dict[str, Any]]) -> bool | None:
    """True when every seed reaches the goal within ``COMPUTE_SHARE`` of BL_BASE's FLOPs; False when a seed is past
    that share without it (reached later, or not reached by FLOPs beyond the share); None when it cannot be read (a
    BL_BASE that needs no update, a row measured short of the share)."""
    verdicts = []
    for r in per_seed:
        if r["share"] is not None:
            verdicts.append(r["share"] <= COMPUTE_SHARE)
        elif r["bl_base_flops"] and r["flops"] is None and r["flops_measured"] >= COMPUTE_SHARE * r["bl_base_flops"]:
            verdicts.append(False)
        else:
            verdicts.append(None)
    return _every(verdicts)


def part_summary(args: argparse.Namespace) -> None:
    """Issue 52's targets read from the JSON (no model is loaded): written under ``targets`` and printed."""
    figures = json.loads(args.json.read_text())
    result = targets(figures)
    update_json(args.json, "targets", result, machine=False)  # no model ran: the benchmark's machine record stays
    for key, curve in result["curves"].items():
        print(f"step 2    {key}: " + ", ".join(
            f"{s}: {c['mean']:.3f}" + (f" +- {c['std']:.3f} (n={c['n']})" if c["n"] > 1 else "")
            for s, c in curve.items()))
    for key, b in result["bridges"].items():
        gap = "did not train that far" if b["gap_at_1M"] is None else f"{b['gap_at_1M']:.3f}"
        print(f"target 1  {key}: English gap after 1M tokens {gap} -> {'met' if b['met'] else 'missed'}")
    for key, r in result["step2"].items():
        final, own, met = r["final"], r["own_tokenizer"], r["bridge_meets_target_1"]
        below = {True: "yes", False: "no", None: "not measured that far"}[r["below_own_within_1M"]]
        reached = ", ".join(_reached(s) for s in r["seeds"])
        print(f"target 2  {key} (bridge {r['bridge']}, target 1 "
              f"{'unknown' if met is None else 'met' if met else 'missed'}): final {final['mean']:.3f} +- "
              f"{final['std']:.3f} (n={final['n']}) against the own tokenizer's "
              f"{'(not measured)' if own is None else format(own, '.3f')} -> below within 1M tokens: {below}; 95% of "
              f"BL_BASE's improvement: {reached} -> compute "
              f"{ {True: 'met', False: 'missed', None: 'undecided'}[r['compute_met']] }")


GRID_INITS = ("mean", "focus", "overlap", "random")  # part (b)'s starts, in the order the docs show them


def step2_table(figures: dict[str, Any], lang: str, bridge_tag: str = "@lr2e-3",
                steps: tuple[int, ...] = (0, 100, 250, 500)) -> list[str]:
    """Part (b)'s grid for one language as a markdown table, from the JSON alone: every start and vocabulary, over
    the mini-model (MiniPost over the bridge ``bridge_tag`` names) and the full model (BL_BASE), loss per character
    at ``steps`` (mean +- std where a setting has several seeds) and the FLOPs of the last; a setting the JSON lacks
    says "not measured". Under extension the random start is the overlap start (every source piece kept, the new
    ones random under both), so it has no row of its own."""
    curves = targets(figures)["curves"]
    rows = figures.get("embeddings", {}).get(lang, {})
    own = rows.get("smollm2_own_tokenizer", {}).get("nats_per_char")
    out = [f"| {lang}: start, vocabulary | system | " + " | ".join(str(s) for s in steps) + " | FLOPs |",
           "|---|---|" + "---:|" * (len(steps) + 1)]
    for vocabulary in ("replace", "extend"):
        for init in GRID_INITS:
            if vocabulary == "extend" and init == "random":
                continue
            for system, suffix, label in (("minipost", bridge_tag, "MiniPost"), ("bl_base", "", "BL_BASE")):
                key = f"{system}/{_variant(vocabulary)}{init}{suffix}"
                curve = curves.get(f"{lang}/{key}")
                if not curve:
                    out.append(f"| {init}, {vocabulary} | {label} | not measured |" + " |" * len(steps))
                    continue
                cells = []
                for step in steps:
                    c = curve.get(str(step))
                    cells.append("-" if c is None else f"{c['mean']:.3f}" + (
                        f" ± {c['std']:.3f}" if c["n"] > 1 else ""))
                last = curve.get(str(steps[-1]))
                out.append(f"| {init}, {vocabulary} | {label} | " + " | ".join(cells)
                           + f" | {'-' if last is None else format(last['flops'], '.1e')} |")
    if own is not None:
        out.append(f"| SmolLM2's own tokenizer | | {own:.3f} |" + " |" * len(steps))
    return out


def part_table(args: argparse.Namespace) -> None:
    """Part (b)'s grid per language, as the markdown tables docs/extensions.md shows (from the JSON alone); with
    ``--into FILE``, each language's table in that file replaced by the new one (``replace_tables``)."""
    figures = json.loads(args.json.read_text())
    tables = {lang: step2_table(figures, lang) for lang in args.langs}
    if args.into is None:
        for table in tables.values():
            print("\n".join(table) + "\n")
        return
    args.into.write_text(replace_tables(args.into.read_text(encoding="utf-8"), tables, args.into), encoding="utf-8")
    print(f"{args.into}: the step-2 table of {', '.join(tables)} replaced")


def replace_tables(text: str, tables: dict[str, list[str]], where: Path | str) -> str:
    """``text`` with each language's step-2 table (the block of ``|`` lines whose header starts ``| {lang}: start``)
    replaced by ``tables[lang]``. A language whose table the text lacks, or holds twice, is an error naming ``where``:
    nothing is written then."""
    lines = text.split("\n")
    for lang, table in tables.items():
        starts = [i for i, line in enumerate(lines) if line.startswith(f"| {lang}: start")]
        if len(starts) != 1:
            raise SystemExit(f"{where}: {len(starts)} step-2 tables of {lang!r} (lines starting '| {lang}: start'); "
                             "expected one to replace")
        end = starts[0]
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[starts[0]:end] = table
    return "\n".join(lines)


def _reached(s: dict[str, Any]) -> str:
    """One seed's reading of the compute target, said plainly."""
    pair = "" if s["seed"] == s["bl_base_seed"] else f" (against BL_BASE seed {s['bl_base_seed']})"
    if s["bl_base_flops"] == 0:
        return "BL_BASE needs no update to reach it (undefined)" + pair
    if s["flops"] is None:
        return f"not reached by {s['flops_measured']:.2g} FLOPs (BL_BASE: {s['bl_base_flops']:.2g})" + pair
    return f"{s['share']:.0%} of BL_BASE's FLOPs" + pair


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=("layers", "step0", "bridge", "independent", "alignment", "init", "embeddings",
                                    "summary", "table"))
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--into", type=Path, help="table: replace each language's step-2 table in this file "
                                             "(docs/extensions.md) instead of printing it")
    p.add_argument("--redo", action="store_true", help="measure bridge and embeddings rows the JSON already holds "
                                                        "as finished (default: skip them)")
    p.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "recipe_bench")
    p.add_argument("--bridge-layers", type=int, default=2)
    p.add_argument("--depth", type=int, default=10)
    p.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[10, 12])
    p.add_argument("--runs", type=lambda s: s.split(","), default=["affine:distill", "affine:lm", "random:lm"])
    p.add_argument("--updates", type=int, default=1000)
    p.add_argument("--langs", type=lambda s: s.split(","), default=["fr", "ru"])
    p.add_argument("--override", action="append", default=[], help="a config override for every run (repeatable)")
    p.add_argument("--tag", default="", help="names the --override setting: run names and JSON keys get it as a "
                                             "suffix, so the grid's own rows are never overwritten")
    p.add_argument("--systems", type=lambda s: s.split(","), default=["minipost", "bl_base"])
    p.add_argument("--inits", type=lambda s: s.split(","), default=["mean", "overlap", "random"])
    p.add_argument("--adapt-updates", type=int, default=500)
    p.add_argument("--adapt-seed", type=int, default=0, help="embeddings: step 2 with this adapt.trainer.seed (its data "
                                                             "order and random rows), over the same mini-model; rows "
                                                             "keyed KEY#sN (0: the recipe file's seed, the grid's rows)")
    p.add_argument("--vocabularies", type=lambda s: s.split(","), default=["replace", "extend"])
    p.add_argument("--bridge-recipe", default=BRIDGE, help="the mini-model MiniPost's step 2 runs over "
                                                                      "(the bridge run of part (a), init:objective)")
    args = p.parse_args(argv)
    from minimodel import log as logs

    logs.setup()  # the stages' progress lines (every trainer.log_every updates) on stderr
    torch.manual_seed(0)
    if args.part == "layers":
        update_json(args.json, "layers", part_layers(args))
    elif args.part == "step0":
        update_json(args.json, "step0", part_step0(args))
    elif args.part == "bridge":
        part_bridge(args)
    elif args.part == "independent":
        part_independent(args)
    elif args.part == "alignment":
        part_alignment(args)
    elif args.part == "init":
        part_init(args)
    elif args.part == "summary":
        part_summary(args)
    elif args.part == "table":
        part_table(args)
    else:
        part_embeddings(args)
    print(f"figures in {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
