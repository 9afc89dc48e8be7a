"""Reliability round 3 (issue 43): result rows that say what they measured, plans that check what the job checks,
and inputs that used to end in a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from minimodel.errors import UserError
from minimodel.store.results import ResultsTable


def row(value: float, seed: int = 1) -> dict:
    return {"system": "bl_base", "body": "primary", "task": "t", "lang": "de", "seed": seed, "step": 10,
            "flops": 1e12, "v100_days": 1e-6, "split": "test", "metric": "accuracy", "value": value}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_result_is_refused_at_write_and_skipped_at_read(tmp_path, bad, caplog):
    table = ResultsTable(tmp_path / "results.jsonl")
    table.append([row(50.0)])
    before = table.path.read_bytes()
    with pytest.raises(UserError, match=r"refusing to write a result row with value=(nan|inf|-inf) .*seed=2.*nothing of"):
        table.append([row(51.0, seed=3), row(bad, seed=2)])
    assert table.path.read_bytes() == before  # not even the finite row of the same evaluation
    with table.path.open("a") as f:  # written by hand, or by an older version: JSON allows NaN and Infinity
        f.write(json.dumps(row(bad, seed=2)) + "\n")
    assert [r["value"] for r in ResultsTable(table.path).rows()] == [50.0]
    assert "skipped 1 line(s) that are not result rows" in caplog.text and "non-finite" in caplog.text


@pytest.mark.parametrize("key", ["name", "tag"])
def test_a_name_too_long_for_a_file_name_is_refused_at_load(tmp_path, corpus_dir, key):
    from minimodel.errors import ConfigError
    from tests.conftest import tiny_config

    with pytest.raises(ConfigError, match=rf"{key}='x{{24}}'\.\.\. \(300 characters\).*at most 128 characters"):
        tiny_config(tmp_path, corpus_dir, f"{key}={'x' * 300}")
    assert not any(tmp_path.rglob("*.lock"))  # refused before any file is written
    tiny_config(tmp_path, corpus_dir, f"{key}={'x' * 110}")


def test_plan_and_submit_refuse_a_micro_batch_the_job_would_refuse(tmp_path, capsys):
    """Pretraining at micro-batch 32 on 8 GPUs with a global batch of 32: the job would stop at its start
    (training.optim.accumulation); `plan` says so and `submit`, dry run or not, refuses before writing a script."""
    from minimodel.cli import main
    from minimodel.cluster.launch import submit
    from minimodel.cluster.sbatch import SubmitError
    from tests.conftest import ROOT

    exp = str(ROOT / "experiments" / "minijoint.yaml")
    over = ["pretrain.optim.global_batch=32", "pretrain.optim.micro_batch=32", f"runs_dir={tmp_path}"]
    assert main(["plan", exp, "--launcher", "a100", *over]) == 0
    out = capsys.readouterr()
    row = next(line for line in out.out.splitlines() if line.startswith("| pretrain |"))
    assert "| **no** (batch) |" in row
    assert ("pretrain.optim.micro_batch=32 x 8 GPU(s) does not divide the global batch 32: the job would stop at its "
            "start (micro-batches that do: 1, 2, 4)") in out.err
    for dry in (True, False):
        with pytest.raises(SubmitError, match=r"micro_batch=32 x 8 GPU\(s\) does not divide the global batch 32"):
            submit(exp, over, launcher="a100", dry_run=dry)
    assert not list(tmp_path.rglob("*.sbatch"))


def test_an_absurd_batch_is_refused_at_load_and_divisors_are_bounded(tmp_path, corpus_dir):
    from minimodel.cluster.memory import micro_batches
    from minimodel.errors import ConfigError
    from tests.conftest import tiny_config

    with pytest.raises(ConfigError, match=r"pretrain\.optim\.micro_batch must be at most 16,777,216 sequences"):
        tiny_config(tmp_path, corpus_dir, "pretrain.optim.micro_batch=100000000000000000000")
    with pytest.raises(ConfigError, match=r"finetune\.batch_size must be at most 16,777,216 sequences"):
        tiny_config(tmp_path, corpus_dir, f"finetune.batch_size={2**30}")
    assert micro_batches(2**24, 1)[-3:] == [2**22, 2**23, 2**24] and len(micro_batches(2**24, 1)) == 25
    assert micro_batches(36, 2) == [1, 2, 3, 6, 9, 18] and micro_batches(36, 5) == []


def test_two_writers_of_one_directory_and_file_modes(tmp_path):
    """Two exports to one --out at once (atomic.replacing_dir): the second to finish is told, not a traceback;
    every file of a finished directory has the mode a plain open() gives (mkstemp writers left 0600)."""
    import os
    import stat
    import tempfile

    from minimodel.errors import WriteError
    from minimodel.store import atomic

    out = tmp_path / "out"
    with pytest.raises(WriteError, match=r"another process wrote it while this one was writing"):
        with atomic.replacing_dir(out) as d:
            (d / "mine.txt").write_text("mine")
            out.mkdir()  # the other export finished first
            (out / "theirs.txt").write_text("theirs")
    assert [p.name for p in out.iterdir()] == ["theirs.txt"] and not list(tmp_path.glob(".out.tmp-*"))

    fresh = tmp_path / "fresh"
    with atomic.replacing_dir(fresh) as d:
        fd, name = tempfile.mkstemp(dir=d)  # 0600, as safetensors' and torch's temp-file writers leave
        os.close(fd)
        os.rename(name, d / "model.safetensors")
        (d / "config.json").write_text("{}")
    mask = os.umask(0o022)
    os.umask(mask)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in fresh.iterdir()} == \
        {"model.safetensors": 0o666 & ~mask, "config.json": 0o666 & ~mask}


def test_rotary_positions_with_an_odd_head_width_are_refused_at_load_leaving_nothing(tmp_path, corpus_dir, capsys):
    from minimodel.cli import main
    from tests.conftest import tiny_overrides

    args = [*tiny_overrides(tmp_path, corpus_dir), "model.family=decoder", "model.positions=rotary",
            "model.norm=rmsnorm", "model.activation=swiglu", "model.bias=false", "model.hidden=66", "model.heads=2"]
    assert main(["pretrain", "experiments/tiny.yaml", *args]) == 2
    assert "model.positions=rotary needs an even head width" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # no stage directory to block the next attempt


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """A tiny RoBERTa (our to_hf) and a tiny Llama (transformers' own class), saved as save_pretrained writes them."""
    import transformers

    from minimodel.config.schema import ModelConfig
    from minimodel.models import hf
    from minimodel.models.model import RobertaMLM

    t = tmp_path_factory.mktemp("hf")
    hf.to_hf(RobertaMLM(ModelConfig(vocab_size=60, hidden=32, layers=2, heads=2, ffn=64, max_positions=40)),
             t / "encoder")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48,
    )).save_pretrained(t / "decoder")
    return t


@pytest.mark.parametrize("family", ["encoder", "decoder"])
@pytest.mark.parametrize("damage,message", [
    ("garbage", r"model\.safetensors: not a readable safetensors file"),
    ("missing", r"checkpoint lacks \["),
    ("shape", r"model\.safetensors: tensor shapes disagree with the model its config describes: .* \[33"),
    ("integers", r"model\.safetensors: weights stored as .* \(I32\): minimodel reads floating-point weights"),
])
def test_a_damaged_hugging_face_directory_is_a_clear_error(hf_dirs, tmp_path, family, damage, message):
    """Every loader of an outside model (bridge.source: load_primary) on the four classes of damage: unreadable
    bytes, a missing tensor, a shape the config disagrees with, integer weights. Each is a CheckpointError
    (``error:``, exit 2) naming the file, where transformers raised or cast without a word."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from minimodel.errors import CheckpointError
    from minimodel.stages.bridge import load_primary

    d = tmp_path / family
    shutil.copytree(hf_dirs / family, d)
    weights = load_file(d / "model.safetensors")
    key = sorted(weights)[3]
    if damage == "garbage":
        (d / "model.safetensors").write_bytes(b"\x00not safetensors" * 64)
    elif damage == "missing":
        save_file({k: v for k, v in weights.items() if k != key}, d / "model.safetensors")
    elif damage == "shape":
        save_file({**weights, key: torch.zeros(weights[key].shape[0] + 1, *weights[key].shape[1:])},
                  d / "model.safetensors")
    else:
        save_file({**weights, key: weights[key].to(torch.int32)}, d / "model.safetensors")
    with pytest.raises(CheckpointError, match=message):
        load_primary(str(d), family)


def test_a_damaged_gguf_file_is_a_clear_error(tmp_path):
    pytest.importorskip("gguf")
    from minimodel.errors import CheckpointError
    from minimodel.stages.bridge import load_primary

    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(CheckpointError, match=r"model\.gguf: not a readable GGUF file"):
        load_primary(str(bad), "decoder")


@pytest.mark.parametrize("ext,sep", [("csv", ","), ("tsv", "\t")])
def test_a_ragged_table_row_is_refused_naming_its_line(tmp_path, ext, sep):
    from minimodel.data.task_files import read_records
    from minimodel.errors import TaskDataError

    path = tmp_path / f"train.{ext}"
    path.write_text(f"text{sep}label\nfine{sep}a\nan unquoted{sep} comma{sep}b\n")
    with pytest.raises(TaskDataError, match=rf"train\.{ext}, line 3: 3 fields where the header has 2"):
        list(read_records(path))
    path.write_text(f'text{sep}label\n"quoted{sep} fine"{sep}b\n')
    assert [r["text"] for _, r in read_records(path)] == [f"quoted{sep} fine"]


def test_an_xz_corpus_is_sampled_within_its_byte_budget_and_the_log_says_how_much(tmp_path, caplog):
    import logging
    import lzma

    from minimodel.data.spm_sample import tokenizer_sample

    corpus = tmp_path / "de.txt.xz"
    lines = [f"Zeile {i:06d} mit etwas Text darin, damit sie nicht zu kurz ist." for i in range(60_000)]
    with lzma.open(corpus, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    budget = 100_000
    with caplog.at_level(logging.INFO, logger="minimodel"):
        sample = tokenizer_sample(corpus, tmp_path / "sample.txt", 1_000_000, budget)
    assert sample and len(sample) <= budget // len(lines[0]) + 1  # not the whole 3.9 MB file
    assert max(int(s.split()[1]) for s in sample) < budget // len(lines[0]) + 1
    assert "from the first 100.0 kB of text at most" in caplog.text


def test_a_short_write_is_reported_as_a_full_disk(tmp_path):
    """numpy's tofile (np.save of a shard) reports a full disk as "N requested and M written", with no errno: the
    same message as every other full-disk write ("no space left on device", the bytes needed and free)."""
    from minimodel.errors import WriteError
    from minimodel.store import atomic

    def save(f):  # what np.save raises when the disk takes part of the shard
        f.write(b"x" * 100)
        raise OSError("348641 requested and 100288 written")

    with pytest.raises(WriteError, match=r"(?i)no space left on device") as e:
        atomic.write_with(tmp_path / "shard.npy", save, needed=348641)
    assert "shard.npy" in str(e.value) and "requested" not in str(e.value)
    assert not list(tmp_path.iterdir())  # nothing half-written left
    assert atomic.disk_error(OSError("something else")) is None


def test_a_finished_prepare_is_checked_against_what_is_on_disk(prepared, corpus_dir, tmp_path, capsys):
    """A flipped byte in a shard is found by its checksum, a cut shard and a replaced tokenizer by prepare's skip
    check; each piece of advice in the messages works when followed (issue 43)."""
    import shutil

    import numpy as np

    from minimodel.cli import main
    from minimodel.data.prepare import is_prepared
    from minimodel.data.shards import MANIFEST, ShardError, TokenStream
    from tests.conftest import tiny_config, tiny_overrides

    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    cfg = tiny_config(copy, corpus_dir, prepared=copy)
    shards = next((copy / "prepared" / "de").glob("**/shards"))
    before = TokenStream.open(shards).slice(0, 2000).copy()
    manifest = json.loads((shards / MANIFEST).read_text())
    assert all("sha256" in e and "bytes" in e for e in manifest["shards"])
    args = ["prepare", "experiments/tiny.yaml", *tiny_overrides(copy, corpus_dir, copy), "--langs=de"]

    # a flipped byte: same size, so prepare's cheap check passes; the loader's checksum does not
    first = shards / manifest["shards"][0]["file"]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x55
    first.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=r"is damaged: its sha256 differs .* delete it and run `minimodel prepare`"):
        TokenStream.open(shards)
    first.unlink()  # the advice
    assert not is_prepared(cfg, "de")
    assert main(args) == 0
    assert np.array_equal(TokenStream.open(shards).slice(0, 2000), before)

    # a cut shard: prepare does not say "finished", it re-encodes that shard
    first.write_bytes(first.read_bytes()[:-100])
    assert not is_prepared(cfg, "de")
    assert main(args) == 0 and np.array_equal(TokenStream.open(shards).slice(0, 2000), before)

    # a replaced tokenizer: not finished, and prepare refuses to mix, overwriting nothing
    spm = next((copy / "prepared" / "de").glob("**/spm.model"))
    spm.write_bytes(next((copy / "prepared" / "tr").glob("**/spm.model")).read_bytes())
    assert not is_prepared(cfg, "de")
    capsys.readouterr()
    assert main(args) == 2
    assert "made from a different corpus or tokenizer (tokenizer_sha256" in capsys.readouterr().err
    assert np.array_equal(np.load(first, mmap_mode="r")[:10], before[:10])


def test_a_finished_pretraining_whose_final_checkpoint_is_damaged_is_rebuilt_the_same(tmp_path, prepared, corpus_dir):
    """last.ckpt of a finished pretraining cut short (and so its hard-linked step file): the consumer's message says
    to delete it and rerun the stage (issue 54: it said "to fall back to an earlier one"); doing so, or not, and
    rerunning the stage rebuilds it from the newest intact checkpoint, exactly (the same identity); before, pretrain
    said "complete; skipping" and adapt "checkpoint not found"."""
    from minimodel.stages.bridge import load_primary
    from minimodel.store.checkpoints import CheckpointError
    from tests.conftest import ROOT
    from tests.test_reliability import overrides, run_to_end

    exp = str(ROOT / "experiments" / "tiny.yaml")
    args = overrides(tmp_path, prepared, corpus_dir, "pretrain.optim.updates=8")
    run_to_end("pretrain", exp, *args)
    run = tmp_path / "tiny" / "minijoint" / "pretrain"
    ckpts = run / "checkpoints"
    done = json.loads((run / "done.json").read_text())
    assert done["checkpoint_bytes"] == (ckpts / "last.ckpt").stat().st_size
    assert (ckpts / "last.ckpt").stat().st_ino == (ckpts / "step0000008.ckpt").stat().st_ino  # one file, two names

    with open(ckpts / "last.ckpt", "r+b") as f:  # cut short in place: both names
        f.truncate(done["checkpoint_bytes"] // 2)
    with pytest.raises(CheckpointError, match=r"truncated or corrupt .*finished pretrain run \(minimodel wrote it\): "
                                              r"delete .*last.ckpt and rerun `minimodel pretrain"):
        load_primary(str(ckpts / "last.ckpt"), stage="pretrain")
    out = run_to_end("pretrain", exp, *args)
    assert "finished, but its final checkpoint" in out and "cut short or replaced" in out and "rebuilding it" in out
    assert "resuming from the newest intact checkpoint" in out and "step0000004.ckpt" in out
    again = json.loads((run / "done.json").read_text())
    assert again["identity"] == done["identity"] and (run / "done.before-rebuild.json").is_file()

    (ckpts / "last.ckpt").unlink()  # the advice: delete it
    out = run_to_end("pretrain", exp, *args)
    assert f"its final checkpoint {ckpts / 'last.ckpt'} is missing" in out
    assert json.loads((run / "done.json").read_text())["identity"] == done["identity"]
    assert "is complete; skipping" in run_to_end("pretrain", exp, *args)
    load_primary(str(ckpts / "last.ckpt"), stage="pretrain")


def test_rows_record_their_evaluation_data_and_changed_data_is_evaluated_again(tiny_finetuned, tmp_path, capsys):
    """Evaluating after the task's test file changed used to say "N already in" and keep the old rows: rows now
    record the identity of the data they were computed on (file, featurisation, tokenizer), and changed data is
    evaluated again, as a redone run already is."""
    from minimodel.cli import main
    from tests.conftest import ROOT
    from tests.test_own_task import write_task

    _, cfg, args = tiny_finetuned
    task = write_task(tmp_path / "calc")
    exp = tmp_path / "calc.yaml"
    exp.write_text(f"extends: {ROOT / 'experiments' / 'tiny.yaml'}\nname: calc\nmodels_from: tiny\ntasks:\n  calc:\n"
                   f"    kind: local\n    source: {task}\n    text_fields: [passage]\n    label_field: about_calc\n"
                   f"    lr: 1.0e-3\n    max_len: 64\n")
    over = [*args[1:], "finetune.tasks=[calc]", "finetune.seeds=[1]", "logging.wandb=disabled", "target_langs=[de]",
            f"runs_dir={tmp_path / 'runs'}"]
    # the reused models live in tiny's runs_dir: link them in
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tiny").symlink_to(Path(cfg.runs_dir) / "tiny")
    assert main(["run", str(exp), *over, "--no-progress"]) == 0
    results = tmp_path / "runs" / "calc" / "bl_base" / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    zero_shot = [r for r in rows if r["step"] >= 0]
    assert zero_shot and all(isinstance(r.get("data_id"), str) for r in zero_shot)
    capsys.readouterr()
    assert main(["evaluate", str(exp), *over, "--no-progress"]) == 0
    assert "evaluation data changed" not in capsys.readouterr().err  # the same data: nothing evaluated again

    test_de = next(task.glob("test.de.*"))
    lines = test_de.read_text().splitlines()
    test_de.write_text("\n".join(lines[:-20]) + "\n")  # 20 examples fewer
    assert main(["evaluate", str(exp), *over, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "came from runs redone, or evaluation data changed, since" in err
    after = [json.loads(line) for line in results.read_text().splitlines()]
    new = [r for r in after if r["step"] >= 0 and r["lang"] == "de"]
    assert len(new) == len([r for r in zero_shot if r["lang"] == "de"])  # replaced, not added
    assert {r["data_id"] for r in new}.isdisjoint({r["data_id"] for r in zero_shot})


def test_a_stop_during_sentencepiece_training_ends_it_at_once(tmp_path):
    """SentencePiece's C++ trainer used to hold the interpreter until it finished (about 20 s here, hours on CC-100
    English): a USR1/SIGTERM or Ctrl-C took effect only then. It now trains in a child process that a stop ends."""
    import time

    from minimodel.data.spm_sample import SAMPLE_FILE, _sample_key, tokenizer_sample
    from minimodel.data.spm_training import _train_stoppably
    from tests.conftest import DEMO_CORPUS

    corpus = DEMO_CORPUS / "en.txt.xz"
    sample = tmp_path / SAMPLE_FILE
    assert tokenizer_sample(corpus, sample, 1_000_000, 2**62)
    options = dict(vocab_size=8000, model_type="unigram", num_threads=1, minloglevel=2)
    started = time.monotonic()
    asked = lambda: "SIGTERM" if time.monotonic() - started > 1.0 else None  # noqa: E731
    assert _train_stoppably(sample, _sample_key(corpus, 1_000_000, 2**62, 1), options, asked) is None
    assert time.monotonic() - started < 5.0  # the training itself takes several times longer
    assert sample.is_file()  # kept: the next run trains on it


@pytest.mark.parametrize("command,key", [("prepare", "data.corpus_dir"), ("prepare", "data.source_tokenizer"),
                                         ("bridge", "bridge.source")])
def test_a_path_too_long_for_the_file_system_is_a_clear_error(tmp_path, corpus_dir, capsys, command, key):
    """The too-long-name case of every loader of an outside file (issue 43, part 4): whichever setting names the
    path, the file system's ENAMETOOLONG is one line naming it, exit 2, not a traceback."""
    from minimodel.cli import main
    from tests.conftest import tiny_overrides

    long = str(tmp_path / ("x" * 300))
    args = [*tiny_overrides(tmp_path, corpus_dir), "system=minipost", "model.mini_heads=[]", "bridge.depth=1", f"{key}={long}",
            "--no-progress"]
    assert main([command, "experiments/tiny.yaml", *args]) == 2
    err = capsys.readouterr().err
    assert "too long for the file system (a name holds at most 255 bytes" in err and "Traceback" not in err, err


def test_a_cut_gguf_file_is_a_clear_error(tmp_path):
    """SmolLM2's real GGUF cut short inside its tensor data (header and metadata intact): a CheckpointError naming
    the file. Skipped, saying why, where the file cannot be had (tests/test_smollm2.py fetches it)."""
    from minimodel.errors import CheckpointError
    from minimodel.stages.bridge import load_primary
    from tests.conftest import ROOT

    real = ROOT / ".cache" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not real.is_file():
        pytest.skip(f"{real} is not here (bash scripts/get_smollm2.sh fetches it)")
    pytest.importorskip("gguf")
    cut = tmp_path / "cut.gguf"
    with open(real, "rb") as f:
        cut.write_bytes(f.read(30_000_000))
    with pytest.raises(CheckpointError, match=r"cut\.gguf: "):
        load_primary(str(cut), "decoder")
