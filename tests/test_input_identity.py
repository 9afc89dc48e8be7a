"""Issue 54 part 2: a step records and checks the identity of everything it reads, not only the runs it builds on:
an outside model's weights (a digest cached by path, size and mtime), the target tokenizer, the prepared shards and
the corpus they came from; and a run reused through ``models_from`` is never written by the experiment reusing it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from minimodel.cli import main
from minimodel.errors import UserError
from minimodel.store import provenance
from minimodel.store.provenance import DIGESTS, Outside, check_inputs, file_digest, recorded_inputs
from tests.conftest import ROOT, stage_overrides, tiny_overrides

# ------------------------------------------------------------------------------------ the digest cache


def test_a_file_digest_is_computed_once_per_path_size_and_mtime(tmp_path, monkeypatch):
    big = tmp_path / "model.gguf"
    big.write_bytes(b"\x01" * 100_000)
    runs = tmp_path / "runs"
    runs.mkdir()
    reads = []
    real = provenance.atomic.file_sha256
    monkeypatch.setattr(provenance.atomic, "file_sha256", lambda p: reads.append(p) or real(p))
    first = file_digest(big, runs)
    assert file_digest(big, runs) == first and len(reads) == 1  # the second from the cache
    assert json.loads((runs / DIGESTS).read_text())[str(big.resolve())]["sha256"] == first
    big.write_bytes(b"\x02" * 100_000)  # replaced: same size, another mtime
    assert file_digest(big, runs) != first and len(reads) == 2
    (runs / DIGESTS).write_text("{not json")  # a damaged cache is read as empty and written again
    assert file_digest(big, runs) == real(big) and len(reads) == 3
    assert json.loads((runs / DIGESTS).read_text())[str(big.resolve())]["sha256"] == real(big)


def test_a_read_only_cache_directory_only_costs_a_rehash(tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    assert file_digest(f, tmp_path / "missing") == provenance.atomic.file_sha256(f)  # no such dir: nothing written
    assert not (tmp_path / "missing").exists()


def test_an_outside_source_is_stamped_by_its_weights_and_config(tmp_path):
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"w" * 10)
    (src / "README.md").write_text("not part of it")
    stamp = Outside("source", str(src), str(tmp_path)).stamp()
    assert stamp is not None and set(stamp["parts"]) == {"config.json", "model.safetensors"}
    assert Outside("source", "org/some-hub-id", str(tmp_path)).stamp() is None  # a hub id: nothing local to hash


# ------------------------------------------------------------------------------------ BL_BASE over an outside model


@pytest.fixture(scope="module")
def hf_source(tmp_path_factory):
    pytest.importorskip("transformers")
    import torch

    from minimodel.data.tokenizer import HFTokenizer
    from minimodel.models.hf import to_hf
    from minimodel.models.model import ModelConfig, RobertaMLM
    from tests.test_hf_source import build_hf_tokenizer

    out = build_hf_tokenizer(tmp_path_factory.mktemp("hf") / "tiny-roberta")
    vocab = len(HFTokenizer(str(out)).pieces())

    def save(seed: int) -> None:
        torch.manual_seed(seed)
        to_hf(RobertaMLM(ModelConfig(vocab_size=vocab, hidden=64, layers=2, heads=2, ffn=128, max_positions=66)), out)

    save(0)
    return out, save


@pytest.mark.slow
def test_replacing_an_outside_sources_weights_is_noticed(tmp_path, corpus_dir, hf_source, capsys):
    """The issue's case: after BL_BASE adapts over an outside source, its weights are replaced; `evaluate` used to
    reload the new body and write other rows under the same adaptation. Now every step that read it refuses,
    naming the file that changed."""
    src, save = hf_source
    args = [str(ROOT / "experiments" / "demo.yaml"), *tiny_overrides(tmp_path, corpus_dir), "data.num_workers=0",
            "sweep=[]", "system=bl_base", f"bridge.source={src}", "target_langs=[de]",
            *stage_overrides(["adapt"], global_batch=8, micro_batch=4, warmup_updates=1, updates=2, ckpt_every=2,
                             val_every=2, log_every=1),
            "tasks.lohelp.max_train_examples=32", "tasks.lohelp.max_len=48", "finetune.seeds=[1]",
            "finetune.epochs=1", "finetune.batch_size=16", "finetune.micro_batch=16", "finetune.mini_tasks=[]"]
    assert main(["run", *args, "--no-progress"]) == 0
    runs = tmp_path / "runs" / "demo" / "bl_base"
    adapt = runs / "adapt" / "de"
    recorded = recorded_inputs(adapt)
    assert set(recorded) == {"source", "target_data"} and "model.safetensors" in recorded["source"]["parts"]
    assert "source" in recorded_inputs(runs / "finetune" / "lohelp" / "seed1")
    assert (tmp_path / "runs" / DIGESTS).is_file()  # hashed once, remembered beside the runs
    rows = (runs / "results.jsonl").read_text()
    assert main(["evaluate", *args, "--no-progress"]) == 0  # unchanged: nothing to do
    save(1)  # other weights in the same files
    capsys.readouterr()
    for command in (["evaluate"], ["adapt", "lang=de"], ["finetune", "task=lohelp", "seed=1"]):
        assert main([command[0], *args, *command[1:], "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and "Traceback" not in err
        assert re.search(r"built on the outside model .*tiny-roberta, which changed since: "
                         r"model\.safetensors \(\w+ then, \w+ now\)", err), err
    assert (runs / "results.jsonl").read_text() == rows  # no row written under the same adaptation
    save(0)  # restored: the same content, accepted again
    assert main(["evaluate", *args, "--no-progress"]) == 0


# ------------------------------------------------------------------------------------ target tokenizer, shards, corpus


@pytest.fixture
def copied(tiny_finetuned, tmp_path):
    """A copy of the session's tiny BL_BASE (its runs and prepared data) that a test may alter."""
    tmp, cfg, args = tiny_finetuned
    shutil.copytree(Path(cfg.runs_dir), tmp_path / "runs")
    shutil.copytree(Path(cfg.data.prepared_dir), tmp_path / "prepared" / "prepared")
    corpus = next(a.split("=", 1)[1] for a in args if a.startswith("data.corpus_dir="))
    moved = [*(a for a in args if not a.startswith(("data.prepared_dir=", "runs_dir="))),
             *tiny_overrides(tmp_path, Path(corpus), tmp_path / "prepared", tmp_path / "runs")[1:3]]
    return tmp_path, moved


def _inputs(args: list[str], lang: str):
    from minimodel.experiment import load_experiment
    from minimodel.stages.adapt import adapt_inputs
    from minimodel.systems import stage_plan

    cfg = load_experiment(args[0], [*args[1:], f"lang={lang}"])
    runs = stage_plan(cfg, "adapt").runs
    return runs.adapt(lang), adapt_inputs(cfg, runs, lang)


@pytest.mark.slow
def test_a_changed_target_tokenizer_shards_or_corpus_is_refused_naming_it(copied, capsys):
    tmp, args = copied
    adapt, inputs = _inputs(args, "de")
    assert recorded_inputs(adapt)["target_data"]["parts"]["corpus"]["sha256"]  # prepare recorded it, step 2 read it
    check_inputs(adapt, inputs)  # as recorded
    assert main(["evaluate", *args, "lang=de", "--no-progress"]) == 0
    de = tmp / "prepared" / "prepared" / "de"
    spm, manifest, done = de / "spm.model", de / "shards" / "manifest.json", de / "done.json"
    kept = {p: p.read_bytes() for p in (spm, manifest, done)}

    spm.write_bytes((tmp / "prepared" / "prepared" / "tr" / "spm.model").read_bytes())  # another tokenizer
    with pytest.raises(UserError, match=r"built on the prepared data .*/de, which changed since: tokenizer \("):
        check_inputs(adapt, inputs)
    assert main(["evaluate", *args, "lang=de", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "which changed since: tokenizer (" in err and err.count("error:") == 1 and "Traceback" not in err
    spm.write_bytes(kept[spm])

    m = json.loads(kept[manifest])
    m["shards"][0]["sha256"] = "0" * 64  # re-encoded shards
    manifest.write_text(json.dumps(m))
    with pytest.raises(UserError, match=r"which changed since: shards \("):
        check_inputs(adapt, inputs)
    manifest.write_bytes(kept[manifest])

    d = json.loads(kept[done])  # prepared again from another corpus
    d["settings"]["corpus_bytes"] += 1
    d["corpus_sha256"] = "f" * 64
    done.write_text(json.dumps(d))
    with pytest.raises(UserError, match=r"which changed since: corpus \("):
        check_inputs(adapt, inputs)
    done.write_bytes(kept[done])
    check_inputs(adapt, inputs)
    assert main(["evaluate", *args, "lang=de", "--no-progress"]) == 0


@pytest.mark.slow
def test_runs_written_before_inputs_carried_their_identity_are_still_read(copied):
    tmp, args = copied
    adapt, inputs = _inputs(args, "de")
    done = json.loads((adapt / "done.json").read_text())
    done["inputs"].pop("target_data")
    (adapt / "done.json").write_text(json.dumps(done))
    check_inputs(adapt, inputs)  # nothing recorded of it: accepted, as other older fields
    d = tmp / "prepared" / "prepared" / "de" / "done.json"
    older = json.loads(d.read_text())
    older.pop("corpus_sha256"), older.pop("corpus_path")
    d.write_text(json.dumps(older))
    assert Outside("data", str(d.parent)).stamp()["parts"]["corpus"]["sha256"] == ""
    assert main(["evaluate", *args, "lang=de", "--no-progress"]) == 0


def test_prepare_refuses_another_corpus_over_prepared_data(prepared, tmp_path, capsys):
    """A language prepared from one corpus, asked again with another (a new experiment's own text under the same
    data.prepared_dir): refused before anything is written, saying how to prepare it apart."""
    shutil.copytree(prepared / "prepared" / "de", tmp_path / "prepared" / "de")
    other = tmp_path / "mine"
    other.mkdir()
    (other / "de.txt").write_text("Ein ganz anderer Text.\n\nNoch einer.\n" * 200, encoding="utf-8")
    before = {p: p.read_bytes() for p in (tmp_path / "prepared" / "de").rglob("*") if p.is_file()}
    args = [str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(tmp_path, other)]
    assert main(["prepare", *args, "--langs=de", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "was prepared from another corpus" in err and "set data.prepared_dir to a directory of your own" in err
    assert err.count("error:") == 1
    assert {p: p.read_bytes() for p in (tmp_path / "prepared" / "de").rglob("*") if p.is_file()} == before
