"""``bridge.langs``: step 1b also trains on other languages' text in the source model's tokenizer, read in turn with the
source language's, never on the text step 2 is measured on (issue 52's next lever: docs/extensions.md)."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from minimodel.cli import main
from minimodel.data.mlm import BlockDataset, MixedBlocks, MixPart, mlm_datamodule
from minimodel.data.prepare import is_prepared, load_prepared_tokenizer, prepare_jobs, prepared_all, prepared_paths
from minimodel.data.shards import ShardError, TokenStream
from minimodel.errors import ConfigError, UserError
from minimodel.pipeline import plan
from minimodel.store.identity import stage_changes
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_config, tiny_overrides

MINIPOST = ["system=minipost", "model.mini_heads=[]", "bridge.depth=2", "bridge.layers=1"]


@pytest.fixture
def data(tmp_path: Path, prepared: Path) -> Path:
    """A copy of the session's prepared data (en, de, tr), which this module adds to."""
    shutil.copytree(prepared / "prepared", tmp_path / "prepared")
    return tmp_path


def cfg_of(tmp: Path, corpus: Path, *extra: str):
    return tiny_config(tmp, corpus, *MINIPOST, *extra, prepared=tmp)


def plain(cfg) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))


# ------------------------------------------------------------------------------------------------ the setting


@pytest.mark.parametrize("override, message", [
    ("bridge.langs=[en]", "the source language en is always trained on"),
    ("bridge.langs=[de,de]", "de given more than once"),
    ("bridge.langs=[../de]", "bridge.langs='../de'"),
])
def test_bad_bridge_langs_are_refused_at_load(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        cfg_of(tmp_path, tmp_path, override)


def test_bridge_langs_are_part_of_the_bridge_identity(tmp_path):
    paper, mixed = plain(cfg_of(tmp_path, tmp_path)), plain(cfg_of(tmp_path, tmp_path, "bridge.langs=[de]"))
    assert [c[0] for c in stage_changes(paper, mixed, "bridge")] == ["bridge.langs"]
    assert stage_changes(paper, mixed, "adapt/de") == []  # step 2 reads the bridge's run, not its settings
    del paper["bridge"]["langs"]  # a run recorded before the setting existed: the paper's, as its default
    assert stage_changes(paper, plain(cfg_of(tmp_path, tmp_path)), "bridge") == []


# ------------------------------------------------------------------------------------------------ the data


def test_mixed_blocks_take_the_corpora_in_turn_and_keep_the_source_order(data, corpus_dir):
    """Position 2g of a two-corpus mix is position g of the source language read alone (so a run without bridge.langs
    reads what it always read); odd positions are the other corpus' training blocks, in an order of their own; a
    resumed loader goes on at the exact next sample."""
    cfg = cfg_of(data, corpus_dir)
    en, de = load_prepared_tokenizer(cfg, "en"), prepared_paths(cfg, "de")
    alone = mlm_datamodule(cfg, "en", cfg.bridge.optim, 1, en)
    alone.setup()
    # de's own shards stand in for "another corpus in the same tokenizer" here (sha check off: another tokenizer)
    mixed = mlm_datamodule(cfg, "en", cfg.bridge.optim, 1, en, mix=(MixPart(de.shards, 20, "de"),))
    mixed.tokenizer_sha256 = ""
    mixed.vocab_size = alone.vocab_size
    mixed.setup()
    assert isinstance(mixed.train_set, MixedBlocks) and mixed.own_train is not None
    for g in range(6):
        assert torch.equal(mixed.train_set[2 * g]["input_ids"], alone.train_set[g]["input_ids"])
        assert torch.equal(mixed.train_set[2 * g]["labels"], alone.train_set[g]["labels"])
    part = mixed.train_set.parts[1]
    n = len(TokenStream.open(de.shards)) // (cfg.data.seq_len - 1)
    assert part.blocks == range(n - 20) and mixed.mix_val[0].blocks == range(n)[n - cfg.data.val_blocks:]
    visited = sorted(part.block_at(g) for g in range(len(part)))
    assert visited == list(range(n - 20))  # one data epoch of de reads each of its training blocks once
    solo_order = BlockDataset(part.stream, part.blocks, cfg.data.seq_len, cfg.data.mask_prob, part.vocab_size, 1, True)
    assert [part.block_at(g) for g in range(8)] != [solo_order.block_at(g) for g in range(8)]  # its own order
    assert len(mixed.train_set) == len(alone.train_set) + len(part)
    # the position is the whole state: a loader started at 8 samples yields what the one from 0 yields after 8
    first = [b["input_ids"] for _, b in zip(range(4), mixed.train_dataloader())]
    mixed.consumed = 2 * mixed.micro_batch
    assert torch.equal(next(iter(mixed.train_dataloader()))["input_ids"], first[2])
    with pytest.raises(ShardError, match="blocks held out"):
        bad = mlm_datamodule(cfg, "en", cfg.bridge.optim, 1, en, mix=(MixPart(de.shards, 3, "de"),))
        bad.tokenizer_sha256, bad.vocab_size = "", alone.vocab_size
        bad.setup()


def test_prepare_encodes_a_bridge_language_in_the_source_tokenizer(data, corpus_dir, tmp_path):
    cfg = cfg_of(data, corpus_dir, "bridge.langs=[de]")
    assert prepare_jobs(cfg, "de") == (False, True) and prepare_jobs(cfg, "tr") == (False,)
    assert prepare_jobs(cfg, "de", "own") == (False,) and prepare_jobs(cfg, "de", "source") == (True,)
    with pytest.raises(UserError, match="does not read tr"):
        prepare_jobs(cfg, "tr", "source")
    assert not prepared_all(cfg, "de") and is_prepared(cfg, "de")
    args = [str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(data, corpus_dir, data), "data.num_workers=0",
            *MINIPOST, "bridge.langs=[de]"]
    assert main(["prepare", *args, "--langs=de", "--no-progress"]) == 0
    assert prepared_all(cfg, "de")
    paths = prepared_paths(cfg, "de", in_source=True)
    assert paths.shards == data / "prepared" / "de" / "in-en-spm" / "shards" and paths.borrowed
    src, own = TokenStream.open(paths.shards), TokenStream.open(prepared_paths(cfg, "de").shards)
    en = load_prepared_tokenizer(cfg, "en")
    assert src.tokenizer_sha256 == en.sha256 != own.tokenizer_sha256
    assert len(src) > len(own)  # German in the English SentencePiece model: more, shorter pieces
    first_line = (corpus_dir / "de.txt").read_text(encoding="utf-8").splitlines()[0]
    assert src.slice(0, 10).tolist() == en.encode_one(first_line)[:10]  # the German corpus, in English pieces
    # BL_BASE has no bridge: bridge.langs asks nothing of its prepare
    assert prepare_jobs(cfg_of(data, corpus_dir, "bridge.langs=[de]", "system=bl_base"), "de") == (False,)
    # a SentencePiece source must be prepared first: nothing is trained in its place
    fresh = tmp_path / "fresh"
    (fresh / "prepared" / "de").mkdir(parents=True)
    assert main(["prepare", str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(fresh, corpus_dir, fresh),
                 *MINIPOST, "bridge.langs=[de]", "--langs=de", "--only=source", "--no-progress"]) != 0
    assert not (fresh / "prepared" / "en").exists()


def test_what_the_bridge_holds_out_covers_every_step_2_tokenization(data, corpus_dir):
    """The tail left out is counted in lines (every line ends in </s> under any tokenizer), over each step-2
    tokenization of the language prepared (its own SentencePiece model's and the extended one's); step 2 refuses a
    bridge whose tail does not hold its own held-out text whole."""
    from minimodel.data.prepare import prepare_language
    from minimodel.stages.bridge import check_held_out, held_out_tail, line_ends, step2_held_out_lines

    cfg = cfg_of(data, corpus_dir, "bridge.langs=[de]")
    extend = replace(cfg, adapt=replace(cfg.adapt, vocabulary="extend"))
    prepare_language(extend, "de", progress=False)  # de's extended tokenizer and its shards
    prepare_language(cfg, "de", progress=False, in_source=True)
    span, eos = cfg.data.seq_len - 1, load_prepared_tokenizer(cfg, "en").specials.eos
    lines = step2_held_out_lines(cfg, "de")
    assert set(lines) == {"replace", "extend"} and all(n > 1 for n in lines.values())
    source = TokenStream.open(prepared_paths(cfg, "de", in_source=True).shards)
    record = held_out_tail(cfg, "de", source, eos)
    n = len(source) // span
    assert record["train_blocks"] == n - record["held_out_blocks"]
    assert record["held_out_lines"] == line_ends(source, record["train_blocks"] * span, eos)
    assert record["held_out_lines"] >= math.ceil(1.25 * max(lines.values())) + 1
    # one block fewer would not hold them: the tail is the shortest that does
    assert line_ends(source, (record["train_blocks"] + 1) * span, eos) < math.ceil(1.25 * max(lines.values())) + 1
    for c in (cfg, extend):  # step 2 with either vocabulary accepts this bridge, and refuses one a line short
        stream = TokenStream.open(prepared_paths(c, "de").shards)
        mine = line_ends(stream, (len(stream) // span - cfg.data.val_blocks) * span, 2)
        check_held_out(c, "de", {"langs": {"de": record}}, stream, 2)
        check_held_out(c, "de", {"langs": {"de": {**record, "held_out_lines": mine + 1}}}, stream, 2)
        with pytest.raises(ShardError, match="measured on text the bridge trained on"):
            check_held_out(c, "de", {"langs": {"de": {**record, "held_out_lines": mine}}}, stream, 2)
        check_held_out(c, "de", {}, stream, 2)  # a bridge of the source language only: nothing to check
    with pytest.raises(ShardError, match="--langs=tr"):  # nothing of step 2's data for it: said, not guessed
        step2_held_out_lines(replace(cfg, data=replace(cfg.data, prepared_dir=str(data / "nowhere"))), "tr")


def test_prepare_only_source_prepares_what_the_bridge_reads(data, corpus_dir):
    args = [str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(data, corpus_dir, data), "data.num_workers=0",
            *MINIPOST, "bridge.langs=[de]"]
    assert main(["prepare", *args, "--only=source", "--no-progress"]) == 0  # no --langs: the bridge's languages
    cfg = cfg_of(data, corpus_dir, "bridge.langs=[de]")
    assert is_prepared(cfg, "de", in_source=True) and not (data / "prepared" / "tr" / "in-en-spm").exists()
    # with models_from the bridge is another experiment's: nothing to prepare for it
    from minimodel.data.prepare import bridge_reads

    assert bridge_reads(cfg) == ("de",)
    assert bridge_reads(cfg_of(data, corpus_dir, "bridge.langs=[de]", "models_from=other")) == ()


def test_the_source_tokenizers_data_of_another_corpus_is_refused_naming_the_bridges(data, corpus_dir, capsys):
    """German prepared in the source tokenizer from one corpus, asked again from another: refused before anything is
    written, and the message names who reads that directory (the bridges), not the adaptations."""
    args = [str(ROOT / "experiments" / "tiny.yaml"), "data.num_workers=0", *MINIPOST, "bridge.langs=[de]"]
    assert main(["prepare", *args, *tiny_overrides(data, corpus_dir, data), "--only=source", "--no-progress"]) == 0
    there = data / "prepared" / "de" / "in-en-spm"
    before = {p: p.read_bytes() for p in there.rglob("*") if p.is_file()}
    other = data / "mine"
    shutil.copytree(corpus_dir, other)
    (other / "de.txt").write_text("Ein ganz anderer Text.\n\nNoch einer.\n" * 200, encoding="utf-8")
    assert main(["prepare", *args, *tiny_overrides(data, other, data), "--only=source", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{there} was prepared from another corpus" in err and "the bridges (bridge.langs) that read" in err
    assert "adaptations" not in err and "its shards are that corpus'" in err
    assert {p: p.read_bytes() for p in there.rglob("*") if p.is_file()} == before


def test_the_plan_prepares_the_bridge_languages_before_the_bridge(tmp_path):
    overrides = [f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}",
                 f"data.corpus_dir={ROOT / 'data' / 'demo' / 'corpus'}", "target_langs=[de,tr]", "bridge.langs=[de,fr]"]
    steps = {s.name: s for s in plan(str(ROOT / "experiments" / "minipost.yaml"), overrides)}
    assert steps["prepare-de"].args[-1] == "--only=own" and steps["prepare-fr"].args[-1] == "--only=own"
    assert steps["prepare-de-source"].args[-2:] == ("--langs=de", "--only=source")
    assert steps["prepare-de-source"].after == ("prepare-en", "prepare-de")
    assert steps["prepare-fr-source"].after == ("prepare-en", "prepare-fr")  # fr: a language the bridge only reads
    assert "adapt-fr" not in steps
    assert set(steps["bridge"].after) == {"pretrain", "prepare-de-source", "prepare-fr-source"}
    assert steps["prepare-tr"].args[-1] == "--langs=tr"  # a target the bridge does not read: as before


def test_a_resubmission_asks_each_prepare_step_for_what_it_makes(tmp_path, monkeypatch):
    from minimodel.cluster.launch import finished_steps

    asked = []

    def is_prepared(cfg, lang: str, in_source: bool = False) -> bool:
        asked.append((lang, in_source))
        return lang != "fr" or not in_source

    monkeypatch.setattr("minimodel.data.prepare.is_prepared", is_prepared)
    config = str(ROOT / "experiments" / "minipost.yaml")
    overrides = [f"runs_dir={tmp_path / 'runs'}", f"data.prepared_dir={tmp_path / 'prepared'}",
                 f"data.corpus_dir={ROOT / 'data' / 'demo' / 'corpus'}", "target_langs=[de,tr]", "bridge.langs=[de,fr]"]
    done = finished_steps(config, plan(config, overrides))
    assert {"prepare-en", "prepare-de", "prepare-fr", "prepare-tr", "prepare-de-source"} <= done
    assert "prepare-fr-source" not in done  # fr's text in the source tokenizer is missing: its step runs again
    assert sorted(asked) == sorted([("en", False), ("de", False), ("tr", False), ("fr", False), ("de", True),
                                    ("fr", True)])


# ------------------------------------------------------------------------------------------------ the bridge


@pytest.mark.slow
def test_a_bridge_over_two_languages_trains_on_both_and_never_on_step_2s_held_out_text(data, corpus_dir):
    from minimodel.stages.bridge import HELD_OUT_MARGIN, run_bridge
    from minimodel.stages.pretrain import run_pretrain

    stages = stage_overrides(["pretrain", "bridge"], updates=6, **TINY_STAGE, ckpt_every=6, val_every=6, log_every=2)
    base = run_pretrain(cfg_of(data, corpus_dir, "system=bl_base", *stages), progress_bar=False).run_dir
    cfg = cfg_of(data, corpus_dir, *stages, "bridge.langs=[de]", "bridge.objective=distill", "bridge.init=copy",
                 f"bridge.source={base / 'checkpoints' / 'last.ckpt'}")
    with pytest.raises(ShardError, match="--langs=de"):  # de's text in the source tokenizer is not prepared yet
        run_bridge(cfg, progress_bar=False)
    args = [str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(data, corpus_dir, data), *MINIPOST,
            "bridge.langs=[de]"]
    assert main(["prepare", *args, "--langs=de", "--no-progress"]) == 0
    run = run_bridge(cfg, progress_bar=False)
    info = json.loads((run.run_dir / "bridge_info.json").read_text())
    de = info["langs"]["de"]
    assert de["held_out_blocks"] >= cfg.data.val_blocks and de["train_blocks"] > 0
    assert de["held_out_lines"] >= math.ceil(HELD_OUT_MARGIN * de["step2_held_out_lines"]["replace"]) + 1 > 1
    assert de["step0"]["kl"] > 0 and de["final"]["kl"] >= 0 and de["final"] != de["step0"]
    assert run.done["bridge"]["langs"]["de"]["final"] == de["final"]
    assert "data_de" in json.loads((run.run_dir / "inputs.json").read_text())
    # the text step 2 measures German on is in the German text, and not in what the bridge trained on
    en = load_prepared_tokenizer(cfg, "en")
    stream = TokenStream.open(prepared_paths(cfg, "de", in_source=True).shards)
    span = cfg.data.seq_len - 1
    n = len(stream) // span
    trained = en.decode(stream.slice(0, (n - de["held_out_blocks"]) * span).tolist())
    everything = en.decode(stream.slice(0, len(stream)).tolist())
    own, own_tok = TokenStream.open(prepared_paths(cfg, "de").shards), load_prepared_tokenizer(cfg, "de")
    n_own = len(own) // span
    step2 = [own_tok.decode(own.slice(b * span, (b + 1) * span).tolist()) for b in range(n_own - 8, n_own)]
    probes = [t[i:i + 30] for t in step2 for i in range(0, len(t) - 30, 30)]  # pieces of step 2's held-out text
    probes = [p for p in probes if all(c.isascii() and (c.isalnum() or c == " ") for c in p)]  # no English unknowns
    assert len(probes) > 5 and all(p in everything for p in probes)  # the check can see them where they are
    assert not any(p in trained for p in probes)
    assert np.isfinite(info["final"]["kl"]) and info["final"]["tokens"] > 0  # English, as without bridge.langs
    from minimodel.report.bridges import bridge_rows

    [row] = bridge_rows(run.run_dir.parent.parent)
    assert row[1] == "copy, distill, N = 2 + 1, + de text"
    # step 2 over it: its held-out German is inside what the bridge held out (check_held_out), so it runs
    from minimodel.stages.adapt import run_adapt

    adapt = stage_overrides(["adapt"], updates=2, **TINY_STAGE, ckpt_every=2, val_every=2, log_every=1)
    done = run_adapt(replace(cfg_of(data, corpus_dir, *stages, *adapt, "bridge.langs=[de]", "bridge.objective=distill",
                                    "bridge.init=copy", f"bridge.source={base / 'checkpoints' / 'last.ckpt'}"),
                             lang="de"), progress_bar=False)
    assert done.outcome.value == "finished"
    info["langs"]["de"]["held_out_lines"] = 1  # as if the bridge had trained on step 2's held-out German
    (run.run_dir / "bridge_info.json").write_text(json.dumps(info))
    with pytest.raises(ShardError, match="measured on text the bridge trained on"):
        run_adapt(replace(cfg_of(data, corpus_dir, *stages, *adapt, "bridge.langs=[de]", "bridge.objective=distill",
                                 "bridge.init=copy", f"bridge.source={base / 'checkpoints' / 'last.ckpt'}",
                                 "adapt.tag=again"), lang="de"), progress_bar=False)
