"""How fast `minimodel prepare` reads, samples and encodes a corpus, and what that means for CC-100 (issue 35).

Builds corpora of the given sizes (GB of text) by repeating the bundled English documents in a shuffled order,
as plain text and as xz (level 1: the compression level barely changes the decompression speed), then measures
each phase in a fresh process (its peak RSS from the operating system):

* ``decode``: reading the text (for xz: one core's decompression), nothing else;
* ``chunk``: reading it and cutting it into 64 MiB pieces at blank lines: the serial part of encoding (the main
  process does this and nothing more while the workers encode);
* ``sample``: drawing the tokenizer's sample (``data.spm_sample_bytes``, one thread);
* ``encode W``: the whole encoding pass with W worker processes (W = 1, 2, ...).

The serial fraction s of encoding is the chunk time over the one-worker encode time (Amdahl's law: N workers
run at most 1 / (s + (1 - s) / N) times one worker's rate, and never faster than the chunk rate). The
extrapolation to the paper's 15 languages (Table 1) uses the launchers' prepare CPUs.

    python benchmarks/bench_prepare.py --sizes 0.2,1 --workers 1,2 --out benchmarks/results/prepare-vm.json
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CC100_GB = {"en": 301, "ru": 279, "vi": 138, "th": 72, "de": 67, "bg": 58, "fr": 57, "es": 54, "el": 47,
            "zh": 47, "ar": 28, "hi": 21, "tr": 21, "ur": 5.7, "sw": 1.7}  # the paper's Table 1 (GB of text)
TIME_LIMIT_H = 12.0  # the launchers' prepare time limit
SHARD = 64 * 2**20


def build(path: Path, n_bytes: int, seed: int = 1) -> None:
    """``n_bytes`` of text: the bundled English documents repeated, each pass in another order."""
    with lzma.open(ROOT / "data" / "demo" / "corpus" / "en.txt.xz", "rt", encoding="utf-8") as f:
        docs = [d.strip() + "\n\n" for d in f.read().split("\n\n") if d.strip()]
    rng, written = random.Random(seed), 0
    with open(path, "w", encoding="utf-8") as out:
        while written < n_bytes:
            rng.shuffle(docs)
            for d in docs:
                out.write(d)
                written += len(d.encode("utf-8"))
                if written >= n_bytes:
                    break


PHASE = r'''
import json, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
phase, corpus, tok_path, out, workers = sys.argv[1], Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
from minimodel.data.corpus import CountingReader, READ_BYTES, iter_raw_chunks
t0, text = time.perf_counter(), 0
if phase == "decode":
    with CountingReader(corpus) as r:
        while block := r.read(READ_BYTES):
            text += len(block)
elif phase == "chunk":
    for c in iter_raw_chunks(corpus, {shard}):
        text += len(c.data)
elif phase == "sample":
    from minimodel.data.spm_sample import _sample_lines
    lines = _sample_lines(corpus, 10_000_000, 1, 2 * 2**30)
    text = sum(len(x.encode()) + 1 for x in lines)
else:
    from minimodel.data.encode import encode_corpus
    from minimodel.data.tokenizer import Tokenizer
    m = encode_corpus(corpus, Tokenizer(tok_path), out, {shard}, workers, progress=False)
    text = m["shards"][-1]["end"]
import resource
rss = lambda who: resource.getrusage(who).ru_maxrss / 1e6  # GB (Linux reports KB)
cpu = lambda who: resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime  # CPU seconds
print(json.dumps({{"seconds": time.perf_counter() - t0, "text_bytes": text, "peak_rss_gb": rss(resource.RUSAGE_SELF),
                  "worker_peak_rss_gb": rss(resource.RUSAGE_CHILDREN), "cpu_main_s": cpu(resource.RUSAGE_SELF),
                  "cpu_workers_s": cpu(resource.RUSAGE_CHILDREN)}}))
'''


def run_phase(phase: str, corpus: Path, tok: Path, out: Path, workers: int = 1) -> dict:
    """One phase in a fresh process: seconds, MB/s of text, peak RSS (GB) of the main process and of the largest
    worker process."""
    script = PHASE.format(root=str(ROOT), shard=SHARD)
    res = subprocess.run([sys.executable, "-c", script, phase, str(corpus), str(tok), str(out), str(workers)],
                         capture_output=True, text=True, check=True)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    got["mb_s"] = got["text_bytes"] / got["seconds"] / 1e6
    return got


def amdahl(rate_1: float, serial: float, ceiling: float, n: int) -> float:
    """MB/s with ``n`` workers: one worker's rate sped up by Amdahl's law, capped by the serial part's rate."""
    return min(rate_1 / (serial + (1 - serial) / n), ceiling)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0.2,1,3", help="corpus sizes in GB of text")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--cpus", default="4,16", help="CPUs to extrapolate to (the launchers': local 4, others 16)")
    ap.add_argument("--out", default="")
    ap.add_argument("--dir", default="", help="where to build the corpora (default: a temporary directory)")
    args = ap.parse_args()
    from minimodel.data.spm_training import train_tokenizer

    work = Path(args.dir or tempfile.mkdtemp(prefix="bench_prepare_"))
    work.mkdir(parents=True, exist_ok=True)
    tok = work / "en.model"
    if not tok.exists():
        train_tokenizer(ROOT / "data" / "demo" / "corpus" / "en.txt.xz", tok, 8000, max_sentences=200_000)
    rows = []
    for size in (float(s) for s in args.sizes.split(",")):
        txt = work / f"en-{size:g}GB.txt"
        if not txt.exists():
            build(txt, int(size * 1e9))
        xz = txt.with_suffix(".txt.xz")
        if not xz.exists():
            subprocess.run(["xz", "-1", "-k", "-T2", "-f", str(txt)], check=True)
        for corpus in (txt, xz):
            row = {"size_gb": size, "format": corpus.suffix.lstrip("."), "file_gb": corpus.stat().st_size / 1e9}
            for phase in ("decode", "chunk", "sample"):
                row[phase] = run_phase(phase, corpus, tok, work / "unused")
            sample = row["sample"]  # it reads min(text, 2 GiB): its rate is of the text read, not of the lines kept
            sample["lines_bytes"], sample["text_bytes"] = sample["text_bytes"], min(int(size * 1e9), 2 * 2**30)
            sample["mb_s"] = sample["text_bytes"] / sample["seconds"] / 1e6
            for w in (int(x) for x in args.workers.split(",")):
                out = work / f"shards-{corpus.name}-{w}"
                subprocess.run(["rm", "-rf", str(out)], check=True)
                row[f"encode{w}"] = run_phase("encode", corpus, tok, out, w)
                subprocess.run(["rm", "-rf", str(out)], check=True)
            one = row["encode1"]
            row["serial_fraction"] = row["chunk"]["seconds"] / one["seconds"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    extrapolation = extrapolate(rows, [int(c) for c in args.cpus.split(",")])
    result = {"machine": f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}, load {os.getloadavg()[0]:.1f} at the end", "shard_bytes": SHARD,
              "rows": rows, "extrapolation": extrapolation}
    print(json.dumps(extrapolation, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def extrapolate(rows: list[dict], cpus: list[int]) -> dict:
    """Hours per language of CC-100 (xz, as distributed) with the measured rates of the largest xz corpus."""
    xz = max((r for r in rows if r["format"] == "xz"), key=lambda r: r["size_gb"])
    rate_1, serial, ceiling = xz["encode1"]["mb_s"], xz["serial_fraction"], xz["chunk"]["mb_s"]
    out: dict = {"from": f"{xz['size_gb']:g} GB xz", "one_worker_mb_s": rate_1, "serial_fraction": serial,
                 "serial_ceiling_mb_s": ceiling, "sample_mb_s": xz["sample"]["mb_s"], "cpus": {}}
    sample_h = {lang: min(gb * 1e9, 2 * 2**30) / 1e6 / xz["sample"]["mb_s"] / 3600 for lang, gb in CC100_GB.items()}
    for n in cpus:
        rate = amdahl(rate_1, serial, ceiling, n)
        hours = {lang: gb * 1e3 / rate / 3600 + sample_h[lang] for lang, gb in CC100_GB.items()}
        out["cpus"][n] = {"encode_mb_s": rate, "hours": hours, "longest_h": max(hours.values()),
                          "within_limit": max(hours.values()) < TIME_LIMIT_H}
    out["cpu_time_model"] = cpu_time_model(xz, cpus, sample_h)
    return out


def cpu_time_model(row: dict, cpus: list[int], sample_h: dict[str, float]) -> dict:
    """The same extrapolation from CPU seconds instead of wall seconds, which other load on the machine barely moves.

    With W >= 2 the main process (reading, xz decoding, cutting, feeding) and the workers (encoding) are separate
    processes, so their CPU seconds per MB of text split the work into its serial part ``m`` and its parallel part
    ``w``. The main process runs two threads: xz decompression (``d`` per MB, the ``decode`` phase's CPU) ahead of
    the cutting and feeding (``m - d``), so its ceiling is ``1 / max(d, m - d)``. On ``n`` CPUs the rate is at most
    that and at most ``n / (m + w)`` (every CPU busy): ``min(1 / max(d, m - d), n / (m + w))``. The parallel
    overhead is the CPU work per MB with W workers over the one-process run's."""
    many = max((int(k[6:]) for k in row if k.startswith("encode") and k[6:].isdigit()), default=1)
    mb = row["encode1"]["text_bytes"] / 1e6
    one, par = row["encode1"], row[f"encode{many}"]
    if many < 2 or "cpu_main_s" not in par:
        return {"skipped": "needs an encode run with 2 or more workers and CPU times"}
    m, w = par["cpu_main_s"] / mb, par["cpu_workers_s"] / mb
    d = row["decode"]["cpu_main_s"] / (row["decode"]["text_bytes"] / 1e6)
    ceiling = 1 / max(d, m - d)
    out: dict = {"workers_measured": many, "main_cpu_s_per_mb": m, "decode_cpu_s_per_mb": d,
                 "worker_cpu_s_per_mb": w, "serial_fraction_cpu": m / (m + w), "serial_ceiling_mb_s": ceiling,
                 "parallel_overhead": (m + w) / ((one["cpu_main_s"] + one["cpu_workers_s"]) / mb), "cpus": {}}
    for n in cpus:
        rate = min(ceiling, n / (m + w))
        hours = {lang: gb * 1e3 / rate / 3600 + sample_h[lang] for lang, gb in CC100_GB.items()}
        out["cpus"][n] = {"encode_mb_s": rate, "hours": hours, "longest_h": max(hours.values()),
                          "within_limit": max(hours.values()) < TIME_LIMIT_H}
    return out


if __name__ == "__main__":
    main()
