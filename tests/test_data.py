import logging
import lzma
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from minimodel.data.corpus import CorpusError, find_corpus, iter_documents
from minimodel.data.encode import encode_corpus
from minimodel.data.mlm import N_SPECIAL, ORDER, MLMDataModule, ResumableSampler, mask_tokens
from minimodel.data.prepare import prepared_paths
from minimodel.data.shards import ShardError, TokenStream, read_manifest
from minimodel.data.spm_training import train_tokenizer
from minimodel.data.tokenizer import BOS, EOS, MASK, Tokenizer, TokenizerError
from minimodel.models.model import IGNORE_INDEX
from tests.conftest import tiny_config


def test_tokenizer_special_ids_and_round_trip_on_real_text(prepared, corpus_dir):
    tok = Tokenizer(prepared / "prepared" / "de" / "spm.model")
    assert tok.vocab_size == 1000
    assert [tok.sp.id_to_piece(i) for i in range(5)] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    line = next(iter_documents(corpus_dir / "de.txt"))[0]
    assert tok.decode(tok.encode_one(line)) == " ".join(line.split())


def test_shards_decode_back_to_the_corpus_with_document_boundaries(prepared, corpus_dir):
    paths = tiny_paths(prepared, "en")
    tok = Tokenizer(paths.tokenizer)
    stream = TokenStream.open(paths.shards)
    assert stream.arrays[0].dtype == np.uint16
    tokens = stream.slice(0, len(stream))
    docs = list(iter_documents(corpus_dir / "en.txt"))
    # lines end with </s>; documents with one more </s>
    assert tokens[-2:].tolist() == [EOS, EOS]
    assert int((tokens == EOS).sum()) == sum(len(d) for d in docs) + len(docs)
    first_doc_tokens = tokens[: int(np.flatnonzero((tokens[:-1] == EOS) & (tokens[1:] == EOS))[0])]
    lines = [tok.decode(part) for part in np.split(first_doc_tokens, np.flatnonzero(first_doc_tokens == EOS) + 1)
             if len(part)]
    assert [l.replace("</s>", "").strip() for l in lines] == [" ".join(l.split()) for l in docs[0]]


def tiny_paths(prepared: Path, lang: str):
    cfg = tiny_config(prepared, Path("unused"))
    return prepared_paths(cfg, lang)


def test_encoding_resumes_and_never_reencodes_a_finished_shard(tmp_path, corpus_dir, prepared):
    tok = Tokenizer(tiny_paths(prepared, "en").tokenizer)
    out = tmp_path / "shards"
    m1 = encode_corpus(corpus_dir / "en.txt", tok, out, shard_bytes=50_000, progress=False)
    assert len(m1["shards"]) >= 4
    # simulate an interruption: the last two shards and the completion flag are gone
    manifest = read_manifest(out)
    lost = manifest["shards"][-2:]
    for e in lost:
        (out / e["file"]).unlink()
    manifest["complete"] = False
    (out / "manifest.json").write_text(__import__("json").dumps(manifest))
    kept = {e["file"]: os.stat(out / e["file"]).st_mtime_ns for e in manifest["shards"][:-2]}
    m2 = encode_corpus(corpus_dir / "en.txt", tok, out, shard_bytes=50_000, progress=False)
    assert m2["complete"] and m2["shards"] == m1["shards"]
    assert {f: os.stat(out / f).st_mtime_ns for f in kept} == kept  # untouched
    # a corrupt shard is detected on open
    (out / m2["shards"][0]["file"]).write_bytes(b"garbage")
    with pytest.raises(ShardError, match=r"shard_00000.npy is missing or corrupt"):
        TokenStream.open(out)


def test_shards_from_another_tokenizer_are_refused_and_kept(tmp_path, corpus_dir, prepared):
    en = Tokenizer(tiny_paths(prepared, "en").tokenizer)
    de = Tokenizer(tiny_paths(prepared, "de").tokenizer)
    out = tmp_path / "shards"
    encode_corpus(corpus_dir / "en.txt", en, out, progress=False)
    before = (out / "shard_00000.npy").read_bytes()
    with pytest.raises(ShardError, match="different corpus or tokenizer .*tokenizer_sha256"):
        encode_corpus(corpus_dir / "en.txt", de, out, progress=False)
    assert (out / "shard_00000.npy").read_bytes() == before


def test_corpus_errors(tmp_path):
    with pytest.raises(CorpusError, match=r"no corpus for language 'xx': expected .*xx.txt or .*xx.txt.xz"):
        find_corpus(tmp_path, "xx")
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(CorpusError, match=r"empty.txt is empty"):
        list(iter_documents(tmp_path / "empty.txt"))
    good = lzma.compress(b"one line\n\nanother document\n" * 1000)
    (tmp_path / "bad.txt.xz").write_bytes(good[: len(good) // 2])
    with pytest.raises(CorpusError, match=r"bad.txt.xz is not a readable xz file"):
        list(iter_documents(tmp_path / "bad.txt.xz"))


def test_tokenizer_too_large_for_the_corpus(tmp_path):
    (tmp_path / "small.txt").write_text("a tiny corpus\n\nwith two documents\n")
    with pytest.raises(TokenizerError, match="too small for a vocabulary of 5000 pieces"):
        train_tokenizer(tmp_path / "small.txt", tmp_path / "spm.model", 5000)
    assert not (tmp_path / "spm.model").exists()


def test_masking_proportions_and_specials():
    rng = np.random.default_rng(0)
    V = 1000
    tokens = rng.integers(N_SPECIAL, V, size=200_000)
    tokens[::50] = EOS
    tokens[0] = BOS
    inputs, labels = mask_tokens(tokens, np.random.default_rng(1), 0.15, V)
    chosen = labels != IGNORE_INDEX
    n_candidates = int((tokens >= N_SPECIAL).sum())
    assert abs(chosen.sum() / n_candidates - 0.15) < 0.005
    assert not chosen[tokens < N_SPECIAL].any()  # specials never masked
    assert (inputs[~chosen] == tokens[~chosen]).all()
    assert (labels[chosen] == tokens[chosen]).all()
    frac_mask = (inputs[chosen] == MASK).mean()
    frac_same = (inputs[chosen] == tokens[chosen]).mean()
    frac_rand = 1 - frac_mask - frac_same
    assert abs(frac_mask - 0.8) < 0.01 and abs(frac_same - 0.1) < 0.01 and abs(frac_rand - 0.1) < 0.01
    assert inputs[chosen][inputs[chosen] != MASK].min() >= N_SPECIAL  # random replacements are not specials


def make_dm(prepared: Path, micro=4, global_batch=8, seq_len=64) -> MLMDataModule:
    dm = MLMDataModule(tiny_paths(prepared, "en").shards, seq_len, 0.15, 1000, micro, global_batch, 8, 0, seed=3)
    dm.setup()
    return dm


def test_blocks_start_with_bos_and_pack_the_stream(prepared):
    dm = make_dm(prepared)
    stream = dm.train_set.stream
    b0, b1 = dm.train_set.block(0), dm.train_set.block(1)
    assert len(b0) == 64 and b0[0] == BOS and b1[0] == BOS
    assert (np.concatenate([b0[1:], b1[1:]]) == stream.slice(0, 126)).all()
    assert len(dm.train_set) + len(dm.val_set) == len(stream) // 63
    assert set(dm.val_set.blocks).isdisjoint(dm.train_set.blocks)


def test_datamodule_resumes_with_the_exact_next_batch(prepared):
    dm = make_dm(prepared)
    it = iter(dm.train_dataloader())
    seen = [next(it) for _ in range(6)]  # 3 updates of 2 micro-batches
    resumed = make_dm(prepared)
    resumed.load_state_dict({**dm.state_dict(), "consumed": 2 * 8})  # checkpoint after 2 updates
    nxt = iter(resumed.train_dataloader())
    for expected in seen[4:]:
        got = next(nxt)
        assert torch.equal(got["input_ids"], expected["input_ids"]) and torch.equal(got["labels"], expected["labels"])


def test_a_checkpoint_of_the_earlier_sample_order_resumes_with_a_warning(prepared, caplog):
    dm = make_dm(prepared)
    assert dm.state_dict()["order"] == ORDER
    logger = logging.getLogger("minimodel")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="minimodel")
    try:
        dm.load_state_dict({"consumed": 16, "global_batch": 8})  # written before the order was saved
        assert dm.consumed == 16 and "earlier sample order" in caplog.text
        caplog.clear()
        dm.load_state_dict(dm.state_dict())
        assert not caplog.text
    finally:
        logger.removeHandler(caplog.handler)


def test_ranks_see_disjoint_complete_slices_of_each_global_batch():
    single = list(zip(range(16), ResumableSampler(0, 2, 0, 1)))
    r0 = [g for _, g in zip(range(8), ResumableSampler(0, 2, 0, 2))]
    r1 = [g for _, g in zip(range(8), ResumableSampler(0, 2, 1, 2))]
    assert set(r0).isdisjoint(r1) and sorted(r0 + r1) == [g for _, g in single]
    assert r0[:2] == [0, 1] and r1[:2] == [2, 3]


def test_epochs_reshuffle_and_remask(prepared):
    dm = make_dm(prepared)
    n = len(dm.train_set)
    a, b = dm.train_set[0], dm.train_set[n]  # same position in two data epochs
    assert not torch.equal(a["labels"], b["labels"])
    order = sorted(dm.train_set.block_at(g) for g in range(n))
    assert order == list(dm.train_set.blocks)  # one epoch visits every block once
    assert [dm.train_set.block_at(g) for g in range(n)] != [dm.train_set.block_at(g) for g in range(n, 2 * n)]


def test_a_workers_dataset_pickles_small(prepared):
    """What a DataLoader worker receives: the splits are ranges and the order a few round keys, not arrays of
    block ids (8 bytes per block, ~1 GiB per worker at CC-100 English size)."""
    dm = make_dm(prepared)
    for ds in (dm.train_set, dm.val_set):
        ds[len(ds) + 1]  # an order of a later epoch is cached
        assert isinstance(ds.blocks, range)
        assert len(pickle.dumps(ds)) < 16 * 1024
        copy = pickle.loads(pickle.dumps(ds))
        assert [copy.block_at(g) for g in range(2 * len(ds))] == [ds.block_at(g) for g in range(2 * len(ds))]


def test_a_gguf_tokenizer_is_converted_once_per_process_and_again_when_its_file_changes(tmp_path, monkeypatch):
    """``HFTokenizer`` over a GGUF file keeps transformers' conversion (seconds for a real vocabulary) for the
    process, keyed by the file's path, size and modification time."""
    import minimodel.models.gguf_copy as tokenizer  # a GGUF source's conversions are kept there

    calls: list[tuple[str, dict]] = []

    class Auto:
        @staticmethod
        def from_pretrained(where: str, **options: str) -> object:
            calls.append((where, options))
            return object()

    monkeypatch.setattr(tokenizer, "_GGUF_TOKENIZERS", {})
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    options = {"gguf_file": "m.gguf"}
    first = tokenizer.gguf_tokenizer(Auto, str(tmp_path), options)
    assert tokenizer.gguf_tokenizer(Auto, str(tmp_path), options) is first and len(calls) == 1
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file replaced by another
    assert tokenizer.gguf_tokenizer(Auto, str(tmp_path), options) is not first and len(calls) == 2
    assert calls == [(str(tmp_path), options)] * 2
