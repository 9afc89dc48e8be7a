"""Every benchmark in sequence, each in its own process, then a summary table; the figures go to
``benchmarks/results/{hostname or GPU}.json`` (``-quick`` appended for ``--quick``).

    make bench                                   # = .venv/bin/python benchmarks/run_all.py
    .venv/bin/python benchmarks/run_all.py --quick            # seconds-long smoke run
    .venv/bin/python benchmarks/run_all.py --device cuda      # on a GPU machine (the default there)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import torch

HERE = Path(__file__).resolve().parent
BENCHES = ["bench_adapt_speedup", "bench_efficiency", "bench_data", "bench_memory"]


def run(name: str, args: list[str], tmp: Path) -> dict[str, Any]:
    out = tmp / f"{name}.json"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(HERE / f"{name}.py"), *args, "--json", str(out)], check=True)
    figures = json.loads(out.read_text())
    figures["wall_s"] = time.perf_counter() - t0
    print(f"[{name}: {figures['wall_s']:.0f} s]", flush=True)
    return figures


def results_name(device: torch.device, quick: bool) -> str:
    info = common.machine_info(device)
    name = info.get("gpu", info["hostname"]) if device.type == "cuda" else info["hostname"]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-").lower() or "unknown"
    return slug + ("-quick" if quick else "")


def yes(flag: bool) -> str:
    return "met" if flag else "MISSED"


def summary(res: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, value, target) rows."""
    rows: list[tuple[str, str, str]] = []
    if "bench_adapt_speedup" in res:
        r = res["bench_adapt_speedup"]
        for row in r["rows"]:
            if row["layers"] == common.BODY_LAYERS:
                rows.append((f"adapt tokens/s, {row['name']}", f"{row['tokens_per_s']:,.0f}", ""))
                continue
            rows.append((f"adapt speedup, {row['name']}",
                         f"{row['speedup']:.2f}x measured / {row['analytic']:.2f}x analytic = {row['ratio']:.3f}",
                         f">= {r['target']}: {yes(row['ratio'] >= r['target'])}"))
    if "bench_efficiency" in res:
        r = res["bench_efficiency"]
        rows.append(("matmul peak", f"{r['peak_flops_per_s'] / 1e9:,.1f} GFLOP/s", ""))
        for row in r["rows"]:
            on_target = row["hidden"] == r["widths"][0]
            rows.append((f"efficiency, {row['kind']} 12 layers h={row['hidden']}",
                         f"{100 * row['share_of_peak']:.1f}% of peak ({row['flops_per_s'] / 1e9:,.1f} GFLOP/s)",
                         f">= {100 * r['target']:.0f}%: {yes(row['share_of_peak'] >= r['target'])}" if on_target else ""))
    if "bench_data" in res:
        r = res["bench_data"]
        rows.append((f"tokenizer training (vocab {r['tokenizer_vocab']})", f"{r['tokenizer_train_s']:.1f} s", ""))
        rows.append(("encode_corpus, 2 threads", f"{r['encode_corpus_mb_per_s']:.2f} MB/s", ""))
        raw = r["raw_encode_mb_per_s"]
        rows.append(("Tokenizer.encode, 1 / 2 threads", f"{raw['1']:.2f} / {raw['2']:.2f} MB/s", ""))
        for row in r["loaders"]:
            ratio = row["ratio"]["pretrain 12-layer"]
            rows.append((f"loader, {row['workers']} workers", f"{row['tokens_per_s']:,.0f} tokens/s = {ratio:.1f}x "
                         f"pretrain step ({row['ratio']['adapt MiniJoint 4-layer']:.1f}x 4-layer adapt)",
                         f">= {r['target']:.0f}x: {yes(ratio >= r['target'])}"))
    if "bench_memory" in res:
        for row in res["bench_memory"]["rows"]:
            rows.append((f"peak memory, {row['label']}", f"{row['peak'] / 2**20:,.0f} MB "
                         f"(weights {row['weights'] / 2**20:,.0f} + update {row['update'] / 2**20:,.0f})", ""))
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="torch.compile the layers (speedup and efficiency)")
    p.add_argument("--only", nargs="*", choices=BENCHES, default=None, help="run only these")
    p.add_argument("--out", type=Path, default=None, help="results file (default benchmarks/results/{name}.json)")
    args = p.parse_args(argv)
    device = common.setup(args)
    shared = ["--device", device.type] + (["--quick"] if args.quick else []) + (
        ["--threads", str(args.threads)] if args.threads else [])
    res: dict[str, Any] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_") as tmp_name:
        tmp = Path(tmp_name)
        for name in args.only or BENCHES:
            compiled = args.compile and name in ("bench_adapt_speedup", "bench_efficiency")
            extra: list[str] = ["--compile"] if compiled else []
            if name == "bench_efficiency" and not args.quick:
                extra += ["--profile"]  # record where the time goes, on target or not
            if name == "bench_data":  # the consumers measured by the earlier benchmarks, at the same sizes
                eff, spd = res.get("bench_efficiency"), res.get("bench_adapt_speedup")
                if eff:
                    pre = next(r for r in eff["rows"] if r["kind"] == "pretrain" and r["hidden"] == eff["widths"][0])
                    extra += ["--step-tokens-per-s", str(pre["tokens_per_s"])]
                if spd:
                    mini = next(r for r in spd["rows"] if r["layers"] == common.MINI_DEPTH)
                    extra += ["--adapt4-tokens-per-s", str(mini["tokens_per_s"])]
            res[name] = run(name, shared + extra, tmp)

    common.rule("summary")
    info = common.machine_info(device)
    print(f"{info.get('gpu', info['cpu'])}, {info['cores']} cores, torch {info['torch']}, {info['threads']} threads"
          f"{' (quick: smoke-test sizes, not figures to record)' if args.quick else ''}")
    table = summary(res)
    w0 = max(len(r[0]) for r in table)
    w1 = max(len(r[1]) for r in table)
    for a, b, c in table:
        print(f"{a:<{w0}}  {b:<{w1}}  {c}")
    out = args.out or HERE / "results" / f"{results_name(device, args.quick)}.json"
    figures = {"machine": info, "quick": args.quick, "compile": args.compile, "wall_s": time.perf_counter() - t0,
               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "summary": [list(r) for r in table], **res}
    common.write_json(out, figures)
    print(f"\nwritten: {out.relative_to(common.ROOT) if out.is_relative_to(common.ROOT) else out} "
          f"({figures['wall_s']:.0f} s in all)")
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
