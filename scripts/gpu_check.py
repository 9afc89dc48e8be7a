"""`make gpu-check`: the GPU path end to end, on a machine with a CUDA GPU (about 6-8 minutes on one H100).

  chain    the tiny chain with the GPU trainer (bf16-mixed, 16-mixed on a V100; fused AdamW) through `minimodel
           run`: prepare, pretrain (MiniJoint), finetune, adapt, evaluate, report, every step exit 0; then MiniPost's
           bridge over that pretraining (`minimodel bridge`, bridge.source = its checkpoint)
  resume   a tiny pretraining killed with kill -9 between two checkpoints and resumed, against an uninterrupted run;
           a second uninterrupted run measures the GPU's own run-to-run noise (see ``resume_verdict``)
  bench    `benchmarks/run_all.py --device cuda --quick` (the benchmarks' short size)
  memory   peak memory (``torch.cuda.max_memory_allocated``) of an update of each stage's real model at roberta-base
           sizes and the experiments' micro-batch, beside the memory plan's prediction (``minimodel.cluster.memory``)

It writes benchmarks/results/gpu_check.json (device, torch, each check's status and figures) and prints a summary
table; it exits 1 when a check fails. Where no CUDA device exists it says why and exits 0, writing nothing. Never
part of `make test`.

    .venv/bin/python scripts/gpu_check.py [--only chain,resume,bench,memory] [--out PATH]
    .venv/bin/python scripts/gpu_check.py --device cpu --out /tmp/check.json   # rehearsal on the CPU (small sizes),
                                                                               # for working on this script
    python3 scripts/gpu_check.py --budget-s 480 --logs DIR --out DIR/gpu_check.json  # a lent machine whose time is
                                                                                   # counted (scripts/device_gpu_check.sh)

With ``--budget-s`` every subprocess's time limit is cut to the time left, a check that would start with less than
``MIN_LEFT_S`` left is not run (said in the JSON), and the JSON (and with ``--logs`` each check's log) is written
after every check, so that a run stopped from outside still leaves what it measured.
"""

from __future__ import annotations

import argparse
import csv
import json
import lzma
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "benchmarks" / "results" / "gpu_check.json"
EXP = ROOT / "experiments" / "tiny.yaml"
CHECKS = ("chain", "memory", "resume", "bench")  # memory second: cheap, and what a cut-short call most needs
TIMEOUT_S = {"chain": 360, "resume": 300, "bench": 300}
MIN_LEFT_S = 45.0  # with --budget-s: a check is not started with less time than this left
_DEADLINE: list[float] = []  # with --budget-s: the clock's reading (``_now``) by which every check must have ended
_now = time.monotonic  # the budget's clock (a test replaces it here, not in the time module)


def limit(check: str) -> float:
    """The time limit of one subprocess of ``check``: its own (``TIMEOUT_S``), cut to the budget left, if any."""
    if not _DEADLINE:
        return TIMEOUT_S[check]
    return max(1.0, min(TIMEOUT_S[check], _DEADLINE[0] - _now()))


def time_left() -> float:
    return _DEADLINE[0] - _now() if _DEADLINE else math.inf

TINY = ["data.vocab_size=1000", "data.seq_len=64", "data.val_blocks=8", "model.max_positions=66",
        "logging.wandb=disabled", "data.num_workers=0"]
STAGE = {"global_batch": 8, "micro_batch": 4, "warmup_updates": 2, "lr": 2e-3}

RESUME_FACTOR = 10.0
RESUME_FLOOR = 1e-6
"""A resumed run passes when its distance from an uninterrupted run is at most ``RESUME_FACTOR`` times the distance
between two uninterrupted runs (and at least ``RESUME_FLOOR``, relative). Resume is bit-exact on the CPU in fp32
(tests/test_reliability.py), but CUDA kernels are not bit-deterministic: the embedding and index_select backward
passes accumulate with atomics and flash attention's backward may too, so the same update can round differently
from run to run and the difference then grows over the updates that follow. A second uninterrupted run measures
that noise on this GPU; a resume that restored the wrong data position, optimizer state or random stream would
differ by whole updates (orders of magnitude more), one that is right by the noise (a factor of 10 leaves room
for its chance growth)."""

MEMORY_BAND = (0.75, 1.10)
"""Measured peak / plan's total: the plan may be up to 10% short (beyond that a micro-batch it lets through could
run out of memory) and up to 25% generous (beyond that it wastes the card)."""

MEMORY_STAGES = [("minijoint", "pretrain"), ("minijoint", "adapt"), ("minijoint", "finetune"),
                 ("minipost", "bridge"), ("minipost", "adapt"), ("bl_base", "adapt")]
SMALL = ["data.vocab_size=1000", "data.seq_len=64", "model.max_positions=66", "model.hidden=64", "model.heads=4",
         "model.ffn=256", "model.layers=4", "bridge.depth=2", "bridge.layers=1",
         "model.attn_dropout=0.0", *(f"{s}.optim.micro_batch=8" for s in ("pretrain", "bridge", "adapt")),
         "finetune.micro_batch=8", *(f"tasks.{t}.max_len=64" for t in ("xnli", "pawsx", "mlqa", "xquad"))]
"""The CPU rehearsal's memory sizes (tests/test_memory.py's); on CUDA the experiments run as configured."""


# ------------------------------------------------------------------------------------------ pure helpers


def no_cuda_reason() -> str:
    """Why this machine has no CUDA device for torch, or "" when it has one."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no CUDA device"
    return ""


def resume_verdict(resumed: float, noise: float, factor: float = RESUME_FACTOR,
                   floor: float = RESUME_FLOOR) -> tuple[bool, float]:
    """Whether a resumed run's distance from an uninterrupted one passes, and the limit it was held to."""
    limit = max(floor, factor * noise)
    return (math.isfinite(resumed) and resumed <= limit), limit


def memory_verdict(measured: int, predicted: int, band: tuple[float, float] = MEMORY_BAND) -> tuple[bool, float]:
    """Whether a measured peak lies in ``band`` times the plan's total, and the ratio."""
    ratio = measured / predicted
    return band[0] <= ratio <= band[1], ratio


def relative_distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """||a - b|| / ||a|| over every floating tensor of two state dicts (same keys)."""
    import torch

    if a.keys() != b.keys():
        return math.inf
    num = den = 0.0
    for k, x in a.items():
        if torch.is_tensor(x) and x.is_floating_point():
            num += float((x.double() - b[k].double()).pow(2).sum())
            den += float(x.double().pow(2).sum())
    return math.sqrt(num / den) if den else math.inf


def loss_distance(a: dict[int, float], b: dict[int, float]) -> float:
    """The largest difference between two loss curves at the updates both logged (inf: they share none)."""
    common = sorted(set(a) & set(b))
    return max((abs(a[s] - b[s]) for s in common), default=math.inf)


UNFINISHED = ("not run", "cut short")  # for want of time (--budget-s): neither a pass nor a failure


def status_of(checks: dict[str, dict[str, Any]], still: list[str] | tuple[str, ...] = ()) -> str:
    """"ok"; "failed: ..." where a check failed; "incomplete: ..." where one was not run or cut short for want of
    time, or is ``still`` to run (a result written between checks: what a run stopped from outside leaves)."""
    bad = [name for name, c in checks.items() if c.get("status") not in ("ok", "skipped", *UNFINISHED)]
    parts = [f"{label}: {', '.join(names)}" for label, names in (
        ("not run", [n for n, c in checks.items() if c.get("status") == "not run"]),
        ("cut short", [n for n, c in checks.items() if c.get("status") == "cut short"]),
        ("still to run", list(still))) if names]
    if bad:
        return f"failed: {', '.join(bad)}" + (f" ({'; '.join(parts)})" if parts else "")
    return f"incomplete: {'; '.join(parts)}" if parts else "ok"


def summary_table(result: dict[str, Any]) -> str:
    """The summary: one line per check (status, figures) and the memory table."""
    lines = [f"gpu-check on {result['device']} (torch {result['torch']}): {result['status']}", "",
             f"{'check':<8} {'status':<8} figures"]
    for name, c in result["checks"].items():
        lines.append(f"{name:<8} {c.get('status', '?'):<8} {c.get('summary', '')}")
    rows = result["checks"].get("memory", {}).get("rows", [])
    if rows:
        lines += ["", f"{'stage':<22} {'micro-batch':>11} {'seq':>5} {'measured GiB':>13} {'plan GiB':>9} "
                      f"{'ratio':>6}  verdict"]
        for r in rows:
            lines.append(f"{r['experiment'] + ' ' + r['stage']:<22} {r['micro_batch']:>11} {r['seq_len']:>5} "
                         f"{r['measured'] / 2**30:>13.2f} {r['predicted'] / 2**30:>9.2f} {r['ratio']:>6.3f}  "
                         f"{'ok' if r['ok'] else 'OUTSIDE ' + '-'.join(f'{x:g}' for x in MEMORY_BAND)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ running minimodel


def minimodel(args: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run `minimodel ARGS --no-progress`, its output to ``log``. At its time limit the whole process group is
    killed (`minimodel run` starts each step as a process of its own: none may go on holding the GPU while the
    next check runs), and ``subprocess.TimeoutExpired`` raised."""
    return run_limited([sys.executable, "-m", "minimodel.cli", *args, "--no-progress"], log, timeout)


def run_limited(cmd: list[str], log: Path, timeout: float, mode: str = "a") -> subprocess.CompletedProcess:
    """Run ``cmd`` in a session of its own, its output to ``log``; at ``timeout`` (or Ctrl-C, which no longer reaches
    it) kill it with every process it started (``kill_group``) and raise ``subprocess.TimeoutExpired``."""
    with open(log, mode) as f:
        p = start_session(cmd, f)
        try:
            rc = p.wait(timeout=timeout)
        except BaseException:
            kill_group(p)
            raise
    return subprocess.CompletedProcess(cmd, rc)


def start_session(cmd: list[str], log: Any) -> subprocess.Popen:
    """``cmd`` started in a session of its own (``kill_group`` stops it with its children), output to ``log``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL ``p`` and every process of its session (it was started with ``start_new_session``), then reap it."""
    import signal

    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.is_file() else ""


def write_corpus(folder: Path, langs: tuple[str, ...] = ("en", "de"), size: int = 400_000) -> Path:
    """The first ``size`` bytes (whole documents) of each bundled demo corpus: what the tests train on."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang in langs:
        with lzma.open(ROOT / "data" / "demo" / "corpus" / f"{lang}.txt.xz", "rt", encoding="utf-8") as f:
            text = f.read(2 * size)[:size]
        cut = text.rfind("\n\n")
        (folder / f"{lang}.txt").write_text(text[: cut + 1] if cut > 0 else text, encoding="utf-8")
    return folder


def precision(device: str) -> str:
    """conf/trainer/gpu.yaml's bf16-mixed, or 16-mixed on a card without native bf16 (a V100), which the stages
    would refuse bf16 on."""
    import torch

    from minimodel.training.device import native_bf16

    return "bf16-mixed" if native_bf16(torch.device(device)) else "16-mixed"


def trainer(stages: list[str], device: str) -> list[str]:
    """The GPU trainer on one device (``precision(device)``) for each stage."""
    accel = "gpu" if device == "cuda" else "cpu"
    return [f"{s}.trainer.{k}={v}" for s in stages
            for k, v in (("accelerator", accel), ("devices", 1), ("precision", precision(device)))]


def optim(stage: str, updates: int, ckpt_every: int, val_every: int, log_every: int = 1) -> list[str]:
    values = {**STAGE, "updates": updates, "warmup_updates": min(STAGE["warmup_updates"], updates)}
    return ([f"{stage}.optim.{k}={v}" for k, v in values.items()]
            + [f"{stage}.trainer.{k}={v}" for k, v in (("ckpt_every", ckpt_every), ("val_every", val_every),
                                                       ("log_every", log_every))])


def chain_overrides(tmp: Path, corpus: Path, device: str) -> list[str]:
    task = ROOT / "data" / "demo" / "task" / "lohelp"
    return [f"data.corpus_dir={corpus}", f"data.prepared_dir={tmp / 'prepared'}", f"runs_dir={tmp / 'runs'}", *TINY,
            "target_langs=[de]", *optim("pretrain", 40, 20, 20), *optim("adapt", 20, 10, 10),
            *trainer(["pretrain", "adapt", "finetune"], device),
            f"tasks.lohelp.source={task}", "tasks.lohelp.kind=local", "tasks.lohelp.max_train_examples=64",
            "tasks.lohelp.max_len=64", "finetune.tasks=[lohelp]", "finetune.seeds=[1]", "finetune.epochs=1",
            "finetune.batch_size=8", "finetune.micro_batch=8"]


# ------------------------------------------------------------------------------------------ the checks


def check_chain(tmp: Path, device: str) -> dict[str, Any]:
    """(a) `minimodel run` on the tiny experiment with the GPU trainer, then MiniPost's bridge over its pretraining."""
    from minimodel.pipeline import plan

    corpus = write_corpus(tmp / "corpus")
    overrides = chain_overrides(tmp, corpus, device)
    steps = [s.name for s in plan(str(EXP), overrides)]
    log = tmp / "chain.log"
    t0 = time.perf_counter()
    rc = minimodel(["run", str(EXP), *overrides], log, limit("chain")).returncode
    text = log.read_text(errors="replace")
    started = [name for name in steps if f"run {name}: minimodel" in text]
    failed = next((n for n in started if f"step {n} exited with code" in text), started[-1] if rc and started else "")
    per_step = {n: ("ok" if n != failed else f"exit {rc}") for n in started}
    per_step.update({n: "not run" for n in steps if n not in started})
    out: dict[str, Any] = {"steps": per_step, "run_rc": rc, "run_s": round(time.perf_counter() - t0, 1)}
    report = tmp / "runs" / "tiny" / "report.md"
    ok = rc == 0 and started == steps and report.is_file()
    if ok:  # MiniPost's step 1b over the chain's pretraining: the bridge stage on the GPU
        ckpt = tmp / "runs" / "tiny" / "minijoint" / "pretrain" / "checkpoints" / "last.ckpt"
        bridge = ["bridge", str(EXP), *overrides, "system=minipost", "model.mini_heads=[]", f"bridge.source={ckpt}",
                  "bridge.depth=2", "bridge.layers=1", *optim("bridge", 10, 10, 10), *trainer(["bridge"], device)]
        t1 = time.perf_counter()
        brc = minimodel(bridge, log, limit("chain")).returncode
        done = (tmp / "runs" / "tiny" / "minipost" / "bridge" / "done.json").is_file()
        per_step["bridge (minipost)"] = "ok" if brc == 0 and done else f"exit {brc}"
        out["bridge_s"] = round(time.perf_counter() - t1, 1)
        ok = brc == 0 and done
    out["status"] = "ok" if ok else "failed"
    out["summary"] = (f"{sum(v == 'ok' for v in per_step.values())}/{len(per_step)} steps exit 0 "
                      f"({', '.join(per_step)}) in {out['run_s'] + out.get('bridge_s', 0):.0f} s")
    if not ok:
        out["log_tail"] = tail(log)
    return out


def losses(run_dir: Path) -> dict[int, float]:
    out = {}
    with open(run_dir / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("train/loss"):
                out[int(row["step"])] = float(row["train/loss"])
    return out


def kill_mid_way(args: list[str], run_dir: Path, log: Path, after: int, every: int, timeout: float) -> int:
    """Start `minimodel ARGS`, SIGKILL it about half-way between checkpoint ``after`` and the next one (timed from
    the update rate between the checkpoints before), and return the update of the checkpoint it left."""
    from minimodel.store.checkpoints import load_checkpoint

    ckpts = run_dir / "checkpoints"
    with open(log, "a") as f:
        p = start_session([sys.executable, "-m", "minimodel.cli", *args, "--no-progress"], f)
        start = time.monotonic()
        first, second = ckpts / f"step{after - every:07d}.ckpt", ckpts / f"step{after:07d}.ckpt"
        try:
            while p.poll() is None and not second.is_file() and time.monotonic() - start < timeout:
                time.sleep(0.005)
            if p.poll() is None and not second.is_file():  # its time is up before the checkpoint: no run to judge
                raise subprocess.TimeoutExpired(p.args, timeout)
            if p.poll() is None and second.is_file():
                per_update = (max(0.0, (second.stat().st_mtime - first.stat().st_mtime) / every)
                              if first.is_file() else 0.0)
                time.sleep(per_update * every / 2)
                p.kill()  # SIGKILL: no handler, no checkpoint
            p.wait()
        except BaseException:
            kill_group(p)
            raise
    if p.returncode != -9:
        raise RuntimeError(f"the run to kill ended by itself (exit {p.returncode}) before it could be killed")
    return int(load_checkpoint(ckpts / "last.ckpt")["global_step"])


def check_resume(tmp: Path, device: str) -> dict[str, Any]:
    """(b) kill -9 between checkpoints, resume, compare with an uninterrupted run (and two uninterrupted runs)."""
    from minimodel.store.checkpoints import load_checkpoint

    corpus = write_corpus(tmp / "corpus", ("en",))
    updates, every = 60, 10
    log = tmp / "resume.log"

    def args(name: str) -> list[str]:
        return ["pretrain", str(EXP), f"data.corpus_dir={corpus}", f"data.prepared_dir={tmp / 'prepared'}",
                f"runs_dir={tmp / name}", *TINY, *optim("pretrain", updates, every, updates),
                *trainer(["pretrain"], device)]

    def run_dir(name: str) -> Path:
        return tmp / name / "tiny" / "minijoint" / "pretrain"

    t0 = time.perf_counter()
    prep = minimodel(["prepare", str(EXP), *args("a")[2:], "--langs=en"], log, limit("resume"))
    if prep.returncode:
        return {"status": "failed", "summary": f"prepare exit {prep.returncode}", "log_tail": tail(log)}
    for name in ("a", "b"):
        rc = minimodel(args(name), log, limit("resume")).returncode
        if rc:
            return {"status": "failed", "summary": f"uninterrupted run {name} exit {rc}", "log_tail": tail(log)}
    killed_at = kill_mid_way(args("c"), run_dir("c"), log, after=3 * every, every=every, timeout=limit("resume"))
    rc = minimodel(args("c"), log, limit("resume")).returncode
    if rc or not (run_dir("c") / "done.json").is_file():
        return {"status": "failed", "summary": f"resumed run exit {rc}", "log_tail": tail(log)}
    weights = {n: load_checkpoint(run_dir(n) / "checkpoints" / "last.ckpt")["state_dict"] for n in "abc"}
    curves = {n: losses(run_dir(n)) for n in "abc"}
    w_resume, w_noise = relative_distance(weights["a"], weights["c"]), relative_distance(weights["a"], weights["b"])
    l_resume, l_noise = loss_distance(curves["a"], curves["c"]), loss_distance(curves["a"], curves["b"])
    w_ok, w_limit = resume_verdict(w_resume, w_noise)
    l_ok, l_limit = resume_verdict(l_resume, l_noise)
    ok = w_ok and l_ok and len(curves["c"]) == len(curves["a"]) == updates
    return {"status": "ok" if ok else "failed", "updates": updates, "killed_after_checkpoint": killed_at,
            "weights_resumed_vs_straight": w_resume, "weights_straight_vs_straight": w_noise, "weights_limit": w_limit,
            "loss_resumed_vs_straight": l_resume, "loss_straight_vs_straight": l_noise, "loss_limit": l_limit,
            "loss_rows": {n: len(c) for n, c in curves.items()}, "wall_s": round(time.perf_counter() - t0, 1),
            "summary": f"killed after update {killed_at} of {updates}; weights rel. diff {w_resume:.2e} (2 straight runs "
                       f"{w_noise:.2e}, limit {w_limit:.2e}), max loss diff {l_resume:.2e} (straight {l_noise:.2e})"}


def check_bench(tmp: Path, device: str) -> dict[str, Any]:
    """(c) benchmarks/run_all.py at its short size on this device."""
    out = tmp / "run_all.json"
    log = tmp / "bench.log"
    t0 = time.perf_counter()
    rc = run_limited([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--device", device, "--quick",
                      "--out", str(out)], log, limit("bench"), mode="w").returncode
    wall = round(time.perf_counter() - t0, 1)
    if rc or not out.is_file():
        return {"status": "failed", "summary": f"run_all.py exit {rc}", "log_tail": tail(log), "wall_s": wall}
    figures = json.loads(out.read_text())
    missed = [row for row in figures.get("summary", []) if "MISSED" in row[2]]
    return {"status": "ok", "wall_s": wall, "summary_rows": figures.get("summary", []),
            "summary": f"run_all.py --quick exit 0 in {wall:.0f} s ({len(figures.get('summary', []))} figures; quick "
                       f"sizes, {len(missed)} targets missed there, which full sizes decide)"}


def check_memory(device: str) -> dict[str, Any]:
    """(d) each stage's real model, one update at the experiment's micro-batch: measured peak vs the plan."""
    import gc

    import torch

    from minimodel.cluster.memory import estimate, stage_models
    from minimodel.cluster.memory_probe import build_stage, measure_update
    from minimodel.experiment import load_experiment

    rows, errors = [], []
    for experiment, stage in MEMORY_STAGES:
        extra = [] if device == "cuda" else [*SMALL, *(["model.mini_heads=[2]"] if experiment == "minijoint" else [])]
        extra += [f"{st}.trainer.precision={precision(device)}" for st in ("pretrain", "bridge", "adapt", "finetune")]
        cfg = load_experiment(ROOT / "experiments" / f"{experiment}.yaml", extra)
        sm = next(s for s in stage_models(cfg) if s.stage == stage)
        predicted = estimate(cfg, sm, device=device)
        t0 = time.perf_counter()
        try:
            s = build_stage(cfg, stage)
            measured = measure_update(s, torch.device(device), cfg.data.mask_prob)
        except Exception as e:  # out of memory, say: the other stages still run
            errors.append(f"{experiment} {stage}: {type(e).__name__}: {e}")
            continue
        finally:
            s = None
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        ok, ratio = memory_verdict(measured.peak, predicted.total)
        rows.append({"experiment": experiment, "stage": stage, "micro_batch": predicted.micro_batch,
                     "seq_len": predicted.seq_len, "precision": predicted.precision, "measured": measured.peak,
                     "predicted": predicted.total, "ratio": ratio, "ok": ok,
                     "measured_parts": {"weights": measured.weights, "gradients": measured.gradients,
                                        "optimizer": measured.optimizer, "rest": measured.rest},
                     "predicted_parts": predicted.components(), "s": round(time.perf_counter() - t0, 1)})
    if not rows:
        return {"status": "failed", "errors": errors, "summary": "; ".join(errors)}
    ratios = [r["ratio"] for r in rows]
    return {"status": "ok" if all(r["ok"] for r in rows) and not errors else "failed", "rows": rows, "errors": errors,
            "summary": f"{len(rows)} stages, measured/plan {min(ratios):.3f}-{max(ratios):.3f} "
                       f"(band {MEMORY_BAND[0]:g}-{MEMORY_BAND[1]:g})" + "".join(f"; {e}" for e in errors)}


# ------------------------------------------------------------------------------------------ main


def run_check(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    print(f"[gpu-check] {name} ...", flush=True)
    t0 = time.perf_counter()
    try:
        out = fn()
    except subprocess.TimeoutExpired as e:
        if e.timeout < TIMEOUT_S.get(name, math.inf) - 0.5:  # the budget's limit, not the check's own: no verdict
            out = {"status": "cut short", "summary": f"stopped after {e.timeout:.0f} s: the --budget-s ran out"}
        else:
            out = {"status": "failed", "summary": f"timed out after {e.timeout:.0f} s"}
    except Exception as e:  # a check that cannot finish is a failed check; the others still run
        out = {"status": "failed", "summary": f"{type(e).__name__}: {e}"}
    out.setdefault("wall_s", round(time.perf_counter() - t0, 1))
    print(f"[gpu-check] {name}: {out['status']} ({out['wall_s']:.0f} s) {out.get('summary', '')}", flush=True)
    return out


LOGS = {"chain": "chain/chain.log", "resume": "resume/resume.log", "bench": "bench.log"}
"""Each check's log under the checks' temporary directory; ``--logs DIR`` keeps a copy as DIR/<check>.log."""


def write_result(out_path: Path, result: dict[str, Any]) -> None:
    """The JSON, whole or not at all (a run stopped from outside while it is written keeps the last one)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    part = out_path.with_name(out_path.name + ".part")
    part.write_text(json.dumps(result, indent=1, default=str) + "\n")
    part.replace(out_path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated checks among {', '.join(CHECKS)}")
    p.add_argument("--out", type=Path, default=None, help=f"the JSON to write (default {OUT.relative_to(ROOT)})")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: rehearse the checks on the CPU at small sizes (for working on this script; no GPU "
                        "figures, and nothing written unless --out is given)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="seconds every check together may take (a lent machine's time): subprocess limits are cut "
                        "to what is left, a check is not started with less than "
                        f"{MIN_LEFT_S:.0f} s left, and the JSON is written after every check")
    p.add_argument("--logs", type=Path, default=None, help="a folder to keep each check's log in (<check>.log)")
    p.add_argument("--require-cuda", action="store_true",
                   help="where torch finds no CUDA device, say why and exit 2 (a lent GPU machine: no GPU there is "
                        "a failure, not a skip)")
    args = p.parse_args(argv)
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in only if c not in CHECKS]
    if unknown:
        p.error(f"--only: unknown check(s) {', '.join(unknown)}; choose among {', '.join(CHECKS)}")
    if args.budget_s is not None and args.budget_s <= 0:
        p.error(f"--budget-s: expected a number of seconds above 0, got {args.budget_s:g}")

    if args.device == "cuda":
        reason = no_cuda_reason()
        if reason and args.require_cuda:
            print(f"gpu-check: no CUDA device: {reason}. Nothing was checked and nothing written.", file=sys.stderr)
            return 2
        if reason:
            print(f"gpu-check: skipped: {reason}. Nothing was checked and nothing written; run `make gpu-check` on a "
                  f"machine with a CUDA GPU (after `make setup` with a CUDA build of torch).")
            return 0
    out_path = args.out or (OUT if args.device == "cuda" else None)
    _DEADLINE[:] = [] if args.budget_s is None else [_now() + args.budget_s]
    try:
        return run_checks(args, only, out_path)
    finally:
        _DEADLINE[:] = []


def run_checks(args: argparse.Namespace, only: list[str], out_path: Path | None) -> int:
    """The checks of ``only`` in ``CHECKS``' order; the JSON written at the end (with a budget: also before the first
    and after each, each check's log copied to ``--logs``)."""
    import torch

    t0 = time.perf_counter()
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU (rehearsal, {os.cpu_count()} cores)"
    result: dict[str, Any] = {
        "device": device, "torch": torch.__version__, "cuda": torch.version.cuda, "precision": precision(args.device),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "budget_s": args.budget_s, "wall_s": 0.0,
        "status": status_of({}, [c for c in CHECKS if c in only]), "checks": {}}
    checks: dict[str, dict[str, Any]] = result["checks"]
    if out_path is not None and args.budget_s is not None:  # a call stopped during the first check still says so
        write_result(out_path, result)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp_name:
        tmp = Path(tmp_name)
        fns: dict[str, Callable[[], dict[str, Any]]] = {
            "chain": lambda: check_chain(tmp / "chain", args.device),
            "resume": lambda: check_resume(tmp / "resume", args.device),
            "bench": lambda: check_bench(tmp, args.device),
            "memory": lambda: check_memory(args.device),
        }
        for name in CHECKS:
            if name not in only:
                checks[name] = {"status": "skipped", "summary": "--only"}
            elif time_left() < MIN_LEFT_S:
                checks[name] = {"status": "not run", "summary": f"{max(0.0, time_left()):.0f} s of the --budget-s "
                                                                f"{args.budget_s:g} left (at least {MIN_LEFT_S:.0f})"}
                print(f"[gpu-check] {name}: not run ({checks[name]['summary']})", flush=True)
            else:
                checks[name] = run_check(name, fns[name])
            if args.logs is not None and name in LOGS and (tmp / LOGS[name]).is_file():
                args.logs.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(tmp / LOGS[name], args.logs / f"{name}.log")
            left = [c for c in CHECKS[CHECKS.index(name) + 1:] if c in only]  # what a stop now would leave unchecked
            last = name == CHECKS[-1]
            result.update(wall_s=round(time.perf_counter() - t0, 1), status=status_of(checks, left))
            if out_path is not None and (last or args.budget_s is not None):
                write_result(out_path, result)
    print("\n" + summary_table(result))
    if out_path is not None:
        shown = out_path.relative_to(ROOT) if out_path.is_relative_to(ROOT) else out_path
        print(f"\nwritten: {shown} ({result['wall_s']:.0f} s in all)")
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
