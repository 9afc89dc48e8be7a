"""Corpus -> token shards (memory-mapped numpy arrays, ``data.shards``), resumable and never re-encoding a finished
shard.

The main process reads the corpus and cuts it into pieces (``data.corpus.iter_raw_chunks``); worker processes
(``data.encode_threads``; in this process when there is one) encode each piece and write it as a shard; the main
process records the finished shards in the manifest, in order.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
from collections.abc import Callable
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from minimodel.data.corpus import CountingReader, RawChunk, Undecodable, iter_raw_chunks, parse_documents
from minimodel.data.shards import (
    ShardError,
    check_writable,
    file_digest,
    read_manifest,
    shard_ok,
    token_dtype,
    write_manifest,
)
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.errors import UserError
from minimodel.log import Progress, get_logger
from minimodel.store import atomic

log = get_logger(__name__)

ENCODE_BATCH = 1024  # lines encoded at once: the token lists of one batch are the only Python objects per token


def encode_documents(docs: list[list[str]], tok: AnyTokenizer, threads: int) -> np.ndarray:
    """The token stream of ``docs``: every line's pieces followed by ``</s>``, one more ``</s>`` after each
    document. Encoded in batches of ``ENCODE_BATCH`` lines, each turned into a numpy array at once, so memory
    is the text plus a few bytes per token, not a Python object per token."""
    dtype, eos = token_dtype(tok.vocab_size), tok.specials.eos
    lines = [line for doc in docs for line in doc]
    last = [k == len(doc) - 1 for doc in docs for k in range(len(doc))]  # one more </s> after these lines
    parts: list[np.ndarray] = []
    for b in range(0, len(lines), ENCODE_BATCH):
        ids = tok.encode(lines[b:b + ENCODE_BATCH], threads=threads)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
        step = lengths + 1 + np.asarray(last[b:b + ENCODE_BATCH], dtype=np.int64)  # pieces, </s>, end of document
        start_out = np.cumsum(step) - step
        start_flat = np.cumsum(lengths) - lengths
        segment = np.full(int(step.sum()), eos, dtype=dtype)
        segment[np.arange(len(flat)) + np.repeat(start_out - start_flat, lengths)] = flat
        parts.append(segment)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


CHUNKING = 2
"""How the corpus is cut into shards (``data.corpus.iter_raw_chunks``), recorded in the manifest: a stopped
prepare resumes only shards cut the same way. Version 1 grouped parsed documents; both give the same token
stream, so finished shards of either kind are read alike."""


def available_cpus() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``: what SLURM's ``--cpus-per-task`` or
    ``taskset`` allow), or the machine's count where affinity is not available (macOS)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def workers_for(setting: int) -> int:
    """``data.encode_threads``: 0 means every CPU this process may use."""
    return setting if setting > 0 else available_cpus()


def _tokenizer_spec(tok: AnyTokenizer) -> tuple[str, str, str]:
    """How a worker process loads the same tokenizer (a GGUF file's: from the copy the parent converted)."""
    from minimodel.data.tokenizer import HFTokenizer, Tokenizer

    if isinstance(tok, HFTokenizer):
        return "hf-causal" if tok.causal else "hf", str(tok.path), tok.runs_dir
    if isinstance(tok, Tokenizer):
        return "spm", str(tok.path), ""
    raise TypeError(f"cannot encode with {type(tok).__name__} in worker processes; use one worker")


def _load_tokenizer(spec: tuple[str, str, str]) -> AnyTokenizer:
    from minimodel.data.tokenizer import HFTokenizer, Tokenizer

    kind, ref, runs_dir = spec
    return HFTokenizer(ref, kind == "hf-causal", runs_dir) if kind.startswith("hf") else Tokenizer(ref)


def encode_chunk(chunk: RawChunk, first_line: int, tok: AnyTokenizer, out_dir: Path) -> tuple[dict, Undecodable]:
    """One chunk of the corpus parsed, encoded and written as shard ``chunk.index``; its manifest entry and its
    undecodable lines."""
    undecodable = Undecodable()
    docs = parse_documents(chunk.data, undecodable, first_line)
    arr = encode_documents(docs, tok, 1)
    name = f"shard_{chunk.index:05d}.npy"
    atomic.write_with(out_dir / name, lambda f: np.save(f, arr), needed=arr.nbytes + 128)
    entry = {"index": chunk.index, "file": name, "tokens": int(len(arr)), "documents": len(docs),
             "start": chunk.start, "end": chunk.end, "lines": chunk.data.count(b"\n"),
             **file_digest(out_dir / name)}
    return entry, undecodable


def _worker(spec: tuple[str, str, str], out_dir: Path, tasks: Any, results: Any, parent: int) -> None:
    """An encoding process: chunks in, manifest entries (or the error that stopped it) out. Stop signals and Ctrl-C
    are the parent's to handle (it lets the workers finish their shards, or stops them with SIGUSR2: a clean exit
    that leaves no temporary file); it leaves when the parent is gone."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, _leave)
    _die_with_parent()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker (a Hugging Face tokenizer would use all)
    tok = _load_tokenizer(spec)
    while True:
        try:
            task = tasks.get(timeout=5)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        if task is None:
            return
        chunk, first_line = task
        try:
            results.put(("ok", *encode_chunk(chunk, first_line, tok, out_dir)))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
            if not isinstance(e, UserError):
                e = ShardError(f"writing shards to {out_dir} failed: {type(e).__name__}: {e}; finished shards are "
                               f"kept, rerun to go on")
            results.put(("error", e))
            return


START_METHOD = "spawn"
"""How worker processes start: fresh interpreters. A fork of a process with threads (a Hugging Face tokenizer's
pool, wandb's, a tqdm monitor) copies locks those threads hold, and a worker can wait on one forever."""


def _die_with_parent() -> None:
    """Linux: this process is killed when its parent dies (kill -9 included), so that no worker writes on after
    it; elsewhere the worker notices within seconds (``os.getppid``)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _leave(signum: int, frame: Any) -> None:
    raise SystemExit(1)


class _Encoders:
    """``n`` worker processes (``_worker``) fed through a queue. Killed (SIGKILL) when the parent stops for any
    reason other than a normal end, so that none writes on after it; a worker that dies is reported, not waited
    for forever."""

    def __init__(self, n: int, tok: AnyTokenizer, out_dir: Path) -> None:
        ctx = mp.get_context(START_METHOD)
        self.tasks, self.results = ctx.Queue(maxsize=n), ctx.Queue()
        args = (_tokenizer_spec(tok), out_dir, self.tasks, self.results, os.getpid())
        self.procs = [ctx.Process(target=_worker, args=args, daemon=True, name=f"encode-{i}") for i in range(n)]
        for p in self.procs:
            p.start()

    def submit(self, chunk: RawChunk, first_line: int) -> None:
        while True:
            try:
                self.tasks.put((chunk, first_line), timeout=1)
                return
            except queue.Full:
                self._check_alive()

    def result(self) -> tuple[dict, Undecodable]:
        while True:
            try:
                message = self.results.get(timeout=1)
            except queue.Empty:
                self._check_alive()
                continue
            if message[0] == "ok":
                return message[1], message[2]
            raise message[1]

    def _check_alive(self) -> None:
        dead = [p for p in self.procs if not p.is_alive()]
        if dead:
            raise ShardError(f"an encoding process ({dead[0].name}) died (exit code {dead[0].exitcode}; -9 is "
                             f"usually the out-of-memory killer): finished shards are kept, rerun to go on, with "
                             f"fewer data.encode_threads if memory is short")

    def close(self) -> None:
        for _ in self.procs:
            self.tasks.put(None)
        for p in self.procs:
            p.join()

    def kill(self) -> None:
        """Stop every worker now: SIGUSR2 (it leaves at once, removing a half-written shard), SIGKILL after 10 s.
        Pieces still queued for them are dropped (the queue's feeder thread must not keep this process alive)."""
        for q in (self.tasks, self.results):
            q.cancel_join_thread()
        for p in self.procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGUSR2)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()


class _InProcess:
    """One worker: the chunk is encoded in this process (no copy of it to another)."""

    def __init__(self, tok: AnyTokenizer, out_dir: Path) -> None:
        self.tok, self.out_dir, self.pending = tok, out_dir, []

    def submit(self, chunk: RawChunk, first_line: int) -> None:
        self.pending.append(encode_chunk(chunk, first_line, self.tok, self.out_dir))

    def result(self) -> tuple[dict, Undecodable]:
        return self.pending.pop(0)

    def close(self) -> None:
        pass

    def kill(self) -> None:
        pass


def _manifest_to_go_on(corpus: Path, tok: AnyTokenizer, out_dir: Path, shard_bytes: int) -> dict:
    """The manifest of ``out_dir`` when it was made from this corpus and tokenizer (complete, or to go on from),
    a new one when there is none (or its shards were cut by an earlier version); ShardError when it was made from
    other ones."""
    source = {"corpus": str(corpus), "corpus_bytes": corpus.stat().st_size if corpus.exists() else -1,
              "tokenizer_sha256": tok.sha256, "shard_bytes": shard_bytes,
              "dtype": token_dtype(tok.vocab_size).name, "vocab_size": tok.vocab_size}
    manifest = read_manifest(out_dir)
    if manifest is not None:
        differs = [k for k, v in source.items() if k != "corpus" and manifest.get(k) != v]
        if differs:
            raise ShardError(
                f"{out_dir} holds shards made from a different corpus or tokenizer ({', '.join(differs)} differ); "
                f"nothing was overwritten: delete {out_dir} or set data.prepared_dir elsewhere"
            )
        if manifest.get("complete") and all(shard_ok(out_dir, e) for e in manifest["shards"]):
            return manifest
        if manifest.get("chunking", 1) == CHUNKING or not manifest["shards"]:
            return {**manifest, "chunking": CHUNKING, "complete": False}
        log.info(f"{out_dir}: the finished shards of a stopped prepare were cut by an earlier version; encoding "
                 f"again from the start")
    return {**source, "chunking": CHUNKING, "shards": [], "complete": False}


def encode_corpus(
    corpus: Path,
    tok: AnyTokenizer,
    out_dir: Path,
    shard_bytes: int = 64 * 2**20,
    workers: int = 1,
    progress: bool = True,
    stop: Callable[[], str | None] = lambda: None,
    what: str = "",
) -> dict:
    """Encode ``corpus`` into ``out_dir`` with ``workers`` processes; returns the manifest. Safe to interrupt and
    call again: it goes on after the finished shards (reading the text from the end of the last of a run of
    finished shards: a seek in plain text, decompression without parsing in xz).

    ``stop()`` is asked after each shard: when it names a reason (a stop signal), no further shard is started,
    those being encoded are finished and recorded, and the manifest is returned with ``"stopped": reason``."""
    manifest = _manifest_to_go_on(corpus, tok, out_dir, shard_bytes)
    if manifest.get("complete"):
        return manifest
    check_writable(out_dir)  # before encoding, not after the first shard's worth of work
    for leftover in atomic.leftovers(out_dir):  # of a writer that was killed (this one holds the language's lock)
        leftover.unlink(missing_ok=True)
    done = {e["index"]: e for e in manifest["shards"] if shard_ok(out_dir, e)}
    manifest["shards"] = [done[i] for i in sorted(done)]
    resume = 0  # the first chunk not in an unbroken run of finished shards from the start
    while resume in done:
        resume += 1
    start = done[resume - 1]["end"] if resume else 0
    first_line = 1 + sum(done[i]["lines"] for i in range(resume))
    if resume:
        log.info(f"{what or corpus.name}: {len(done)} finished shard(s) kept; reading on from byte {start:,} of the "
                 f"text{' (xz: decompressed up to there first)' if corpus.suffix == '.xz' else ''}")
    reader = CountingReader(corpus)
    bar = Progress(f"{what or 'encode ' + corpus.name}", reader.size, bar=progress)
    encoders: _Encoders | _InProcess = _Encoders(workers, tok, out_dir) if workers > 1 else _InProcess(tok, out_dir)
    undecodable, text, in_flight, window = Undecodable(), 0, 0, 2 * workers
    finished = False

    def record(entry: dict, bad: Undecodable) -> None:
        done[entry["index"]] = entry
        undecodable.merge(bad)
        manifest["shards"] = [done[i] for i in sorted(done)]
        write_manifest(out_dir, manifest)

    try:
        for chunk in iter_raw_chunks(corpus, shard_bytes, start, resume, reader):
            text += len(chunk.data)
            line_of_chunk, first_line = first_line, first_line + chunk.data.count(b"\n")
            if chunk.index in done:
                continue
            while in_flight >= window:
                record(*encoders.result())
                in_flight -= 1
            bar.update(reader.position, text, f"shard {chunk.index}")
            if stop():
                break
            encoders.submit(chunk, line_of_chunk)
            in_flight += 1
            if isinstance(encoders, _InProcess):
                record(*encoders.result())
                in_flight -= 1
        else:
            finished = True
        while in_flight:
            record(*encoders.result())
            in_flight -= 1
        encoders.close()
    except OSError as e:
        encoders.kill()
        raise ShardError(f"writing shards to {out_dir} failed: {e}; finished shards are kept, rerun to go on") from e
    except BaseException:
        encoders.kill()
        raise
    finally:
        bar.close()
        reader.close()
    undecodable.warn(corpus)
    if not finished:
        return {**manifest, "stopped": stop() or "stop"}
    manifest["complete"] = True
    write_manifest(out_dir, manifest)
    return manifest
