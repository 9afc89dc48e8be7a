"""Outside models load once (issue 55, part 1).

A GGUF source is converted once into a Hugging Face directory beside the runs (``{runs_dir}/.sources/``), keyed by the
file's content, and every later load of its model or tokenizer reads that copy: the same logits and the same
tokenizer (its sha256) as a load of the GGUF file itself, without transformers decoding the file again. A file of
another content is converted again, a copy cut short, emptied or of another transformers version is never read, and
a conversion stopped halfway leaves no copy. An architecture minimodel does not read is refused from the header
before transformers decodes anything; a hub id is refused at once where the environment says offline, and after one
short attempt otherwise. The real-model check (SmolLM2's GGUF) is in ``test_smollm2.py``."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from minimodel.data.tokenizer import HFTokenizer, TokenizerError
from minimodel.errors import CheckpointError, ConfigError
from minimodel.models import gguf_copy, hf_decoder, hub, outside
from minimodel.store import atomic
from minimodel.store.provenance import Outside
from tests.test_outside import TINY_TOKENS, write_gguf

transformers = pytest.importorskip("transformers")


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """minimodel's log lines (after ``log.setup``, its logger does not pass them on to the root logger's capture)."""
    logger = logging.getLogger("minimodel")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="minimodel")
    yield caplog
    logger.removeHandler(caplog.handler)


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    """The messages logged that hold ``text``, each once (a record also passed on to the root logger is seen twice)."""
    records = {id(r): r for r in caplog.records}.values()
    return [r.getMessage() for r in records if text in r.getMessage()]


def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way transformers (or gguf's own reader) decodes a GGUF file raise."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a GGUF file was decoded")

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", refuse)
    try:
        import transformers.integrations.gguf.reader as reader
    except ImportError:  # an older transformers: gguf's GGUFReader is its reader
        pass
    else:
        monkeypatch.setattr(reader, "_mapped", refuse)
    gguf = pytest.importorskip("gguf")
    monkeypatch.setattr(gguf.GGUFReader, "__init__", refuse)
    monkeypatch.setattr(gguf_copy, "_GGUF_TOKENIZERS", {})


def logits(model: torch.nn.Module) -> torch.Tensor:
    x = torch.randint(0, len(TINY_TOKENS), (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model.logits(x)


def copies(runs: Path) -> list[Path]:
    return sorted(p for p in (runs / gguf_copy.SOURCES).iterdir() if not atomic.is_temp(p))


def test_a_gguf_source_is_converted_once_and_then_read_from_its_copy(tmp_path, monkeypatch, logged):
    """The first load converts (the log says where to), the marker records the file; the next loads, of the model and
    of the tokenizer, read the copy (the log says so) without decoding the GGUF file, with the same logits, bit for
    bit, as a load of the file itself and the same tokenizer (sha256, ids)."""
    (tmp_path / "m").mkdir()
    path = write_gguf(tmp_path / "m" / "tiny.gguf", tokenizer=True)
    runs = tmp_path / "runs"
    runs.mkdir()  # its digest of the file is remembered there (.file-digests.json)
    direct = hf_decoder.from_hf(path)
    first = hf_decoder.from_hf(path, runs_dir=runs)
    [copy] = copies(runs)
    assert lines(logged, "converted once to") == [f"{path}: converted once to {copy}"]
    marker = json.loads((copy / gguf_copy.MARKER).read_text())
    st = path.stat()
    assert marker["source"] == str(path.resolve()) and (marker["size"], marker["mtime_ns"]) == (st.st_size,
                                                                                                st.st_mtime_ns)
    assert marker["sha256"] == atomic.file_sha256(path) and copy.name == f"tiny-{marker['sha256'][:16]}"
    assert marker["transformers"] == transformers.__version__ and marker["tokenizer"] is True
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(marker["files"])
    assert torch.equal(logits(first), logits(direct))

    no_decoding(monkeypatch)
    again = hf_decoder.from_hf(path, runs_dir=runs)
    tok = HFTokenizer(str(path), causal=True, runs_dir=str(runs))
    assert lines(logged, "from the converted copy") == [f"{path}: from the converted copy {copy}"] * 2
    assert torch.equal(logits(again), logits(direct))
    assert tok.path == str(path) and tok.encode_one("ab abcd") == [7, 6, 11]
    monkeypatch.undo()
    assert tok.sha256 == HFTokenizer(str(path), causal=True).sha256  # the GGUF file's own tokenizer
    # the experiment's record of the source names the GGUF file, as before: the copy is not an input
    stamp = Outside("source", str(path), str(runs)).stamp()
    assert stamp is not None and list(stamp["parts"]) == ["tiny.gguf"]


def test_the_tokenizer_converts_first_and_its_workers_read_the_copy(tmp_path, monkeypatch, logged):
    """``prepare`` loads the tokenizer before any model: the conversion happens there, and a worker process
    (``encode._load_tokenizer``, given the parent's spec) reads the copy."""
    from minimodel.data import encode

    path = write_gguf(tmp_path / "tiny.gguf", tokenizer=True)
    tok = HFTokenizer(str(path), causal=True, runs_dir=str(tmp_path / "runs"))
    assert len(lines(logged, "converted once to")) == 1
    no_decoding(monkeypatch)
    worker = encode._load_tokenizer(encode._tokenizer_spec(tok))
    assert worker.sha256 == tok.sha256 and len(lines(logged, "from the converted copy")) == 1
    hf_decoder.from_hf(path, runs_dir=tmp_path / "runs")  # the model too: one conversion made both
    assert len(lines(logged, "from the converted copy")) == 2


def test_every_stage_reads_the_copy_through_load_primary(tmp_path, monkeypatch, logged):
    """``load_primary`` (bridge, adapt, finetune, perplexity, export) hands the experiment's runs_dir on."""
    from minimodel.stages.bridge import load_primary

    path = write_gguf(tmp_path / "tiny.gguf")
    runs = tmp_path / "runs"
    first, _ = load_primary(str(path), "decoder", runs_dir=str(runs))
    no_decoding(monkeypatch)
    again, record = load_primary(str(path), "decoder", runs_dir=str(runs))
    assert record == {} and again.training and torch.equal(logits(again.eval()), logits(first.eval()))
    assert len(lines(logged, "converted once to")) == len(lines(logged, "from the converted copy")) == 1


def test_a_changed_gguf_file_is_converted_again_and_its_old_copy_removed(tmp_path, logged):
    path = write_gguf(tmp_path / "tiny.gguf")
    runs = tmp_path / "runs"
    before = logits(hf_decoder.from_hf(path, runs_dir=runs))
    [old] = copies(runs)
    write_gguf(path, seed=1)  # the same name, other weights
    after = hf_decoder.from_hf(path, runs_dir=runs)
    [new] = copies(runs)
    assert new != old and len(lines(logged, "converted once to")) == 2
    assert torch.equal(logits(after), logits(hf_decoder.from_hf(path))) and not torch.equal(logits(after), before)


@pytest.mark.parametrize("damage", ["cut", "no-marker", "marker-garbage", "other-transformers", "emptied"])
def test_a_damaged_or_outdated_copy_is_converted_again_never_read(tmp_path, logged, damage):
    path = write_gguf(tmp_path / "tiny.gguf")
    runs = tmp_path / "runs"
    expected = logits(hf_decoder.from_hf(path, runs_dir=runs))
    [copy] = copies(runs)
    weights, marker = copy / "model.safetensors", copy / gguf_copy.MARKER
    if damage == "cut":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "no-marker":
        marker.unlink()
    elif damage == "marker-garbage":
        marker.write_text("{not json")
    elif damage == "other-transformers":
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "transformers": "0.0.1"}))
    else:
        for f in copy.iterdir():
            f.unlink()
    assert torch.equal(logits(hf_decoder.from_hf(path, runs_dir=runs)), expected)
    assert len(lines(logged, "converted once to")) == 2 and not lines(logged, "from the converted copy")
    assert copies(runs) == [copy]


def test_a_conversion_stopped_halfway_leaves_no_copy(tmp_path, monkeypatch, logged):
    """Stopped while writing the weights (Ctrl-C): nothing at the copy's place and no temporary directory; the next
    load converts."""
    import safetensors.torch

    path = write_gguf(tmp_path / "tiny.gguf")
    runs = tmp_path / "runs"

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(safetensors.torch, "save_model", interrupted)
        with pytest.raises(KeyboardInterrupt):
            hf_decoder.from_hf(path, runs_dir=runs)
    assert copies(runs) == [] and atomic.leftovers(runs) == []
    hf_decoder.from_hf(path, runs_dir=runs)
    assert len(copies(runs)) == 1 and len(lines(logged, "converted once to")) == 1


def test_a_copy_that_cannot_be_written_leaves_the_file_itself_to_be_read(tmp_path, monkeypatch, logged):
    """A full disk (or a read-only runs directory) while converting: a warning, the GGUF file read as without a runs
    directory, nothing left behind."""
    import errno

    path = write_gguf(tmp_path / "tiny.gguf", tokenizer=True)
    runs = tmp_path / "runs"

    def full(fd: int, p: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(p))

    monkeypatch.setattr(atomic, "_durable", full)
    model = hf_decoder.from_hf(path, runs_dir=runs)
    tok = HFTokenizer(str(path), causal=True, runs_dir=str(runs))
    monkeypatch.undo()
    assert torch.equal(logits(model), logits(hf_decoder.from_hf(path)))
    assert tok.sha256 == HFTokenizer(str(path), causal=True).sha256
    warned = lines(logged, "its converted copy cannot be written")
    assert len(warned) == 2 and "no space left on device" in warned[0] and "read from the GGUF file itself" in warned[0]
    assert copies(runs) == [] and atomic.leftovers(runs) == []


@pytest.mark.parametrize("arch", ["gemma3", "bloom"])
def test_an_unsupported_architecture_is_refused_from_the_header_before_any_decoding(tmp_path, monkeypatch, arch):
    """Gemma 3's GGUF was refused only after 23-30 s of decoding; the header says its architecture at once. Model
    and tokenizer both, with or without a runs directory; nothing is converted."""
    path = write_gguf(tmp_path / f"{arch}.gguf", arch=arch, tokenizer=True)
    runs = tmp_path / "runs"
    no_decoding(monkeypatch)
    start = time.perf_counter()
    for runs_dir in (runs, ""):
        with pytest.raises(ConfigError, match=rf"{arch}\.gguf: a GGUF file of architecture '{arch}': minimodel reads "
                                              rf"model_type in \['gpt2', 'llama', 'mistral', 'qwen2', 'qwen3'\]"):
            hf_decoder.from_hf(path, runs_dir=runs_dir)
        with pytest.raises(TokenizerError, match=rf"{arch}\.gguf: a GGUF file of architecture '{arch}': minimodel "
                                                 rf"reads GGUF files of the architectures \['gpt2', 'llama'"):
            HFTokenizer(str(path), causal=True, runs_dir=str(runs_dir))
    assert time.perf_counter() - start < 2.0
    assert not (runs / gguf_copy.SOURCES).exists()


def test_the_gguf_architectures_are_the_decoder_familys():
    assert outside.GGUF_ARCHITECTURES == hf_decoder.MODEL_TYPES


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_a_hub_id_not_cached_fails_at_once_where_the_environment_says_offline(monkeypatch, value):
    """``HF_HUB_OFFLINE`` set after huggingface_hub read it (at import) counts too; the hub is never asked."""
    import huggingface_hub

    def asked(*args: object, **kwargs: object) -> None:
        raise AssertionError("the hub was asked")

    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", asked)
    name = "no-such-owner/no-such-model-55"
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=rf"{name}: no such local directory, and not a model id the hub answers "
                                              rf"for here \(not in the local Hugging Face cache, and HF_HUB_OFFLINE "
                                              rf"is set"):
        hf_decoder.from_hf(name)
    with pytest.raises(TokenizerError, match=r"HF_HUB_OFFLINE is set"):
        HFTokenizer(name, causal=True)
    assert time.perf_counter() - start < 2.0


def test_a_hub_id_is_tried_once_briefly_otherwise(monkeypatch):
    """Without the offline setting, one request with a short timeout and no retries (huggingface_hub's own download
    retried for half a minute without a network): its failure is the refusal."""
    import huggingface_hub
    import huggingface_hub.constants

    calls: list[float] = []

    def unreachable(url: str, timeout: float = 10.0, **kwargs: object) -> None:
        calls.append(timeout)
        raise OSError("Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", unreachable)
    with pytest.raises(CheckpointError, match=r"no-such-owner/no-such-model-55: no such local directory, and not a "
                                              r"model id the hub answers for here \(one attempt at the hub, 5 s at "
                                              r"most: Name or service not known\)"):
        hf_decoder.from_hf("no-such-owner/no-such-model-55")
    assert calls == [hub.HUB_TIMEOUT]


def test_a_hub_id_in_the_local_cache_is_read_offline(tmp_path, monkeypatch):
    """The offline refusal is for ids the local cache lacks: one it holds loads without asking the hub."""
    import huggingface_hub

    from tests.test_outside import save

    cache = tmp_path / "hub"
    repo = cache / "models--someone--tiny-gpt2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = save("gpt2", repo / "snapshots" / ("0" * 40))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert Path(snapshot, "config.json").is_file()
    hub.check_hub("someone/tiny-gpt2")  # found: no refusal, nothing asked
