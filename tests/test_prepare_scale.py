"""`minimodel prepare` at the paper's scale (issue 35), on small corpora: the job's CPUs, a stop signal at every
phase (exit 3, and a rerun that ends byte-identical to an uninterrupted prepare), a tokenizer sample bounded in
bytes and saved, SentencePiece's large-corpus switch, memory that does not grow with a corpus without blank
lines, and progress lines in the log."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from minimodel import log as logs
from minimodel.cli import main
from minimodel.data import spm_sample, spm_training
from minimodel.data.corpus import MAX_DOCUMENT_BYTES, READ_BYTES, iter_documents, iter_raw_chunks
from minimodel.data.encode import encode_corpus, encode_documents, workers_for
from minimodel.data.shards import TokenStream, read_manifest
from minimodel.data.spm_sample import sample_windows
from minimodel.data.spm_training import large_corpus_mode, train_tokenizer
from minimodel.data.tokenizer import Tokenizer
from minimodel.errors import ConfigError
from minimodel.experiment import load_experiment
from minimodel.store import atomic
from tests.conftest import ROOT, real_text, tiny_overrides
from tests.test_interrupts import cli, driven

EXP = str(ROOT / "experiments" / "tiny.yaml")


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (not the lock, which names its last holder) by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ---- the job's CPUs -----------------------------------------------------------------------------------------------

def test_workers_follow_the_cpus_this_process_may_use(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert workers_for(0) == 3  # SLURM's --cpus-per-task=3 (an affinity mask), whatever the node has
    assert workers_for(2) == 2  # data.encode_threads set: that many
    assert load_experiment(EXP).data.encode_threads == 0  # the default: the CPUs this process may use
    with pytest.raises(ConfigError, match=r"data\.encode_threads must be 0 \(every CPU this process may use\) or a number of threads from 1, .*got -1"):
        load_experiment(EXP, ["data.encode_threads=-1"])


def test_shards_are_the_same_with_one_or_three_processes(tmp_path, prepared, corpus_dir):
    tok = Tokenizer(prepared / "prepared" / "en" / "spm.model")
    corpus = corpus_dir / "en.txt"
    for workers in (1, 3):
        manifest = encode_corpus(corpus, tok, tmp_path / f"w{workers}", shard_bytes=40_000, workers=workers,
                                 progress=False)
        assert manifest["complete"] and len(manifest["shards"]) >= 8
    assert tree(tmp_path / "w1") == tree(tmp_path / "w3")
    stream = TokenStream.open(tmp_path / "w3")
    whole = encode_documents(list(iter_documents(corpus)), tok, 1)  # the corpus as one piece
    assert np.array_equal(stream.slice(0, len(stream)), whole.astype(np.int64))


# ---- a stop signal at each phase: exit 3, the rerun ends where an uninterrupted prepare ends --------------------

USR1_SELF = "os.kill(os.getpid(), signal.SIGUSR1)"
IN_SAMPLING = f"""
import minimodel.data.spm_sample as t
_lines = t.decoded_lines
def decoded_lines(*args, **kwargs):
    {USR1_SELF}
    return _lines(*args, **kwargs)
t.decoded_lines = decoded_lines
"""
AFTER_SAMPLE = f"""
import minimodel.data.spm_training as t
_sample = t.tokenizer_sample
def tokenizer_sample(*args, **kwargs):
    lines = _sample(*args, **kwargs)
    {USR1_SELF}
    return lines
t.tokenizer_sample = tokenizer_sample
"""
IN_ENCODING = """
import minimodel.data.encode as s
_chunks = s.iter_raw_chunks
def iter_raw_chunks(*args, **kwargs):  # the main process reads piece 2: SLURM's signal comes then
    for chunk in _chunks(*args, **kwargs):
        if chunk.index == 2:
            os.kill(os.getpid(), signal.SIGUSR1)
        yield chunk
s.iter_raw_chunks = iter_raw_chunks
"""


def prepare_args(tmp: Path, corpus: Path, *extra: str) -> list[str]:
    return ["prepare", EXP, *tiny_overrides(tmp, corpus), "--langs=en", *extra]


@pytest.mark.slow
@pytest.mark.parametrize(("patch", "kept"), [
    (IN_SAMPLING, "with nothing yet (the tokenizer's sample is drawn again"),
    (AFTER_SAMPLE, "with the tokenizer's sample ("),
])
def test_a_stop_signal_while_the_tokenizer_is_made(tmp_path, prepared, corpus_dir, patch, kept):
    args = prepare_args(tmp_path, corpus_dir)
    r = driven(patch, *args)
    assert r.returncode == 3, r.stderr
    assert f"prepare en: stopped on SIGUSR1 {kept}" in r.stderr and "Traceback" not in r.stderr
    assert "prepare: stopped on SIGUSR1 after saving its progress; rerun the same command to resume" in r.stderr
    ours = tmp_path / "prepared" / "en"
    assert not (ours / "spm.model").exists() and atomic.leftovers(tmp_path) == []
    assert (ours / "spm_sample.txt").exists() == (patch == AFTER_SAMPLE)
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert ("drawn by an earlier run" in r.stderr) == (patch == AFTER_SAMPLE)
    assert tree(ours) == tree(prepared / "prepared" / "en")  # tokenizer, shards, manifest, done.json
    assert not (ours / "spm_sample.txt").exists()  # the sample goes once the tokenizer is written


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_stop_signal_while_encoding_finishes_the_shards_under_way(tmp_path, prepared, corpus_dir, workers):
    args = prepare_args(tmp_path, corpus_dir, "data.shard_bytes=40000", f"data.encode_threads={workers}")
    ours = tmp_path / "prepared" / "en"
    ours.mkdir(parents=True)
    (ours / "spm.model").write_bytes((prepared / "prepared" / "en" / "spm.model").read_bytes())
    reference = tmp_path / "reference"
    encode_corpus(corpus_dir / "en.txt", Tokenizer(ours / "spm.model"), reference, 40_000, 1, progress=False)
    r = driven(IN_ENCODING, *args)
    assert r.returncode == 3, r.stderr
    assert "prepare en: stopped on SIGUSR1 with " in r.stderr and "Traceback" not in r.stderr
    manifest = read_manifest(ours / "shards")
    assert manifest is not None and not manifest["complete"]
    assert {e["index"] for e in manifest["shards"]} == {0, 1}  # those under way when it came are finished
    assert len(manifest["shards"]) < len(read_manifest(reference)["shards"])
    assert not (ours / "done.json").exists() and atomic.leftovers(tmp_path) == []
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert f"prepare en: {len(manifest['shards'])} finished shard(s) kept; reading on from byte " in r.stderr
    assert tree(ours / "shards") == tree(reference)
    assert (ours / "done.json").exists()


@pytest.mark.slow
def test_kill_9_while_encoding_then_the_rerun_ends_byte_identical(tmp_path, prepared, corpus_dir):
    import subprocess
    import sys
    import time

    args = prepare_args(tmp_path, corpus_dir, "data.shard_bytes=20000", "data.encode_threads=2", "--no-progress")
    ours = tmp_path / "prepared" / "en"
    ours.mkdir(parents=True)
    (ours / "spm.model").write_bytes((prepared / "prepared" / "en" / "spm.model").read_bytes())
    p = subprocess.Popen([sys.executable, "-m", "minimodel.cli", *args], cwd=ROOT, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        manifest = read_manifest(ours / "shards") if (ours / "shards" / "manifest.json").exists() else None
        if manifest and len(manifest["shards"]) >= 3:
            p.kill()  # SIGKILL: no handler runs; the workers die with it (PR_SET_PDEATHSIG)
            break
        time.sleep(0.05)
    assert p.wait() == -9, "prepare ended before it could be killed"
    assert not read_manifest(ours / "shards")["complete"]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    reference = tmp_path / "reference"
    encode_corpus(corpus_dir / "en.txt", Tokenizer(ours / "spm.model"), reference, 20_000, 1, progress=False)
    assert tree(ours / "shards") == tree(reference) and atomic.leftovers(tmp_path) == []


# ---- the tokenizer's sample ---------------------------------------------------------------------------------------

def test_sample_windows_are_spread_over_the_file_and_bounded():
    assert sample_windows(1000, 4096) == [(0, 1000)]  # a corpus no larger than the budget: read whole
    windows = sample_windows(301 * 10**9, 2 * 2**30)
    assert len(windows) == 1024 and windows[0][0] == 0 and windows[-1][1] == 301 * 10**9
    assert sum(b - a for a, b in windows) <= 2 * 2**30
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(windows, windows[1:]))


def test_a_plain_corpus_larger_than_the_budget_is_sampled_from_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setattr(spm_sample, "MIN_WINDOW_BYTES", 4096)
    corpus = tmp_path / "xx.txt"
    corpus.write_text("".join(f"line {i:06d} of the corpus, some words to pad it out\n" for i in range(60_000)))
    size = corpus.stat().st_size  # ~3.4 MB
    lines = spm_sample._sample_lines(corpus, 10**9, seed=1, budget=size // 20)
    numbers = sorted(int(line.split()[1]) for line in lines)
    assert len(lines) < 60_000 // 15  # about a twentieth was read
    assert numbers[0] < 3_000 and numbers[-1] > 57_000  # from the start to the end, not a prefix
    assert all(line.startswith("line ") and line.endswith("out") for line in lines)  # whole lines only


def test_the_large_corpus_switch_is_taken_above_the_32_bit_limit(tmp_path, monkeypatch, capsys):
    limit = 2**31 - 1
    assert not large_corpus_mode(10**9, 10**7)  # 10M lines of 100 characters
    assert large_corpus_mode(2_100_000_000, 10**7)  # 10M lines of 210 characters: over the limit
    assert large_corpus_mode(int(0.98 * limit) + 1, 0) and not large_corpus_mode(int(0.97 * limit), 0)
    seen: list[bool] = []
    real = spm_training._train_stoppably  # SentencePiece trains in a child process: spy on what it is given

    def spy(sample, key, options, stop):
        seen.append(options["train_extremely_large_corpus"])
        return real(sample, key, options, stop)

    monkeypatch.setattr(spm_training, "_train_stoppably", spy)
    corpus = tmp_path / "xx.txt"
    corpus.write_text(real_text("en", 60_000), encoding="utf-8")
    logs.setup()
    train_tokenizer(corpus, tmp_path / "a.model", 300)
    monkeypatch.setattr(spm_training, "SPM_INDEX_LIMIT", 20_000)  # a sample of 60 KB is then "too large"
    train_tokenizer(corpus, tmp_path / "b.model", 300)
    assert seen == [False, True]
    err = capsys.readouterr().err
    assert "SentencePiece trains in its standard mode" in err and "SentencePiece trains in its large-corpus mode" in err


# ---- memory that does not grow with the corpus ------------------------------------------------------------------

def no_blank_lines(path: Path, n_bytes: int) -> Path:
    """Real text, one line per sentence or paragraph, and not one blank line."""
    text = "\n".join(line for line in real_text("en", 400_000).splitlines() if line.strip()) + "\n"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n_bytes // len(text.encode()) + 1):
            f.write(text)
    return path


def test_a_corpus_without_blank_lines_is_read_in_bounded_pieces(tmp_path, prepared):
    """The rule (data.corpus.MAX_DOCUMENT_BYTES): a piece ends after a blank line at or after its target size, or,
    with none within 1 MiB after it, at the next line end; so every piece (and every document) holds at most
    target + 1 MiB + one line. Encoding a shard holds its piece, its lines and its tokens: the peak of Python's
    allocations stays under 2 x READ_BYTES + 8 x (shard_bytes + 1 MiB) whatever the corpus's size (measured:
    about 2 x READ_BYTES + 6.5 x the piece)."""
    shard_bytes = 256 * 1024
    bound = 2 * READ_BYTES + 8 * (shard_bytes + MAX_DOCUMENT_BYTES)
    tok = Tokenizer(prepared / "prepared" / "en" / "spm.model")
    peaks = {}
    for size in (6_000_000, 18_000_000):  # both above READ_BYTES
        corpus = no_blank_lines(tmp_path / f"{size}.txt", size)
        longest = max(len(line) for line in corpus.read_bytes().split(b"\n"))
        assert all(len(c.data) <= shard_bytes + MAX_DOCUMENT_BYTES + longest + 1
                   for c in iter_raw_chunks(corpus, shard_bytes))
        tracemalloc.start()
        manifest = encode_corpus(corpus, tok, tmp_path / f"shards{size}", shard_bytes, 1, progress=False)
        peaks[size] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert manifest["complete"] and len(manifest["shards"]) >= size // (shard_bytes + MAX_DOCUMENT_BYTES)
    assert max(peaks.values()) < bound, peaks
    assert peaks[18_000_000] < 1.15 * peaks[6_000_000], peaks  # three times the text, not three times the memory


# ---- progress in the log ------------------------------------------------------------------------------------------

def test_a_progress_line_every_30_seconds_with_rate_and_eta(capsys):
    logs.setup()
    now = [0.0]
    bar = logs.Progress("prepare en", total=1000 * 10**6, clock=lambda: now[0])
    seen = []
    for t, position in ((10, 10**8), (29, 2 * 10**8), (31, 3 * 10**8), (45, 4 * 10**8), (62, 6 * 10**8)):
        now[0] = float(t)
        bar.update(position, text=position * 5)
        seen.append(capsys.readouterr().err)
    assert [bool(s) for s in seen] == [False, False, True, False, True]
    assert ("prepare en: 1.5 GB of text read (30% of 1.0 GB on disk), 48.4 MB/s of text, ETA 0:01:12"
            in seen[2]), seen[2]


def test_encoding_logs_progress_without_a_terminal(tmp_path, prepared, corpus_dir, monkeypatch, capsys):
    monkeypatch.setattr(logs, "PROGRESS_EVERY_S", 0.0)
    logs.setup()
    tok = Tokenizer(prepared / "prepared" / "en" / "spm.model")
    encode_corpus(corpus_dir / "en.txt", tok, tmp_path / "s", 100_000, 1, progress=False, what="prepare en")
    err = capsys.readouterr().err
    assert "prepare en: " in err and " MB/s of text, ETA " in err and "shard 2" in err


# ---- a full disk in an encoding process ---------------------------------------------------------------------------

def test_a_full_disk_in_an_encoding_process_is_exit_2_and_the_rerun_goes_on(tmp_path, prepared, corpus_dir,
                                                                           monkeypatch, capsys):
    import errno
    import os

    args = prepare_args(tmp_path, corpus_dir, "data.shard_bytes=40000", "data.encode_threads=2", "--no-progress")
    ours = tmp_path / "prepared" / "en"
    ours.mkdir(parents=True)
    (ours / "spm.model").write_bytes((prepared / "prepared" / "en" / "spm.model").read_bytes())
    real = atomic._durable

    def durable(fd: int, path: Path) -> None:  # in an encoding process
        if Path(path).name == "shard_00003.npy":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, path)

    monkeypatch.setattr(atomic, "_durable", durable)
    monkeypatch.setattr("minimodel.data.encode.START_METHOD", "fork")  # so that the workers inherit the fault
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"prepare: error: writing {ours / 'shards' / 'shard_00003.npy'}: no space left on device" in err
    assert atomic.leftovers(tmp_path) == [] and "Traceback" not in err
    monkeypatch.setattr(atomic, "_durable", real)
    assert main(args) == 0
    reference = tmp_path / "reference"
    encode_corpus(corpus_dir / "en.txt", Tokenizer(ours / "spm.model"), reference, 40_000, 1, progress=False)
    assert tree(ours / "shards") == tree(reference)
