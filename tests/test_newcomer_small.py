"""The small things of issue 55 (part 6): `--no-progress` turns off every progress bar, the libraries' too
(transformers', the Hugging Face hub's, the GGUF conversion's); log lines start with the time; `prepare` names no
<mask> for a causal LM's tokenizer; `export` names the system it exported."""

from __future__ import annotations

import logging
import os
import re

import pytest

from minimodel import log as logs
from minimodel.cli import main
from minimodel.experiment import load_experiment
from tests.conftest import ROOT, tiny_overrides

TINY = str(ROOT / "experiments" / "tiny.yaml")


def _bars_on() -> None:
    """The libraries' bars on, as in a fresh process: undoes what ``progress_bars_off`` switched."""
    import huggingface_hub.utils
    import transformers.modeling_gguf_pytorch_utils as gguf
    import transformers.utils.logging

    huggingface_hub.utils.enable_progress_bars()
    transformers.utils.logging.enable_progress_bar()
    if getattr(gguf.tqdm, "_minimodel_quiet", False):
        gguf.tqdm = gguf.tqdm.__closure__[0].cell_contents  # the bar it wraps
    logs._bars_off = False


@pytest.fixture()
def bars_restored(monkeypatch):
    """The bars on before the test (an earlier test of the session may have run a command with --no-progress in
    this process: the switches are process-wide), and whatever ``progress_bars_off`` switches, switched back after
    it."""
    for var in logs.BARS_ENV:
        monkeypatch.delenv(var, raising=False)
    _bars_on()
    yield
    _bars_on()


def test_no_progress_turns_off_the_libraries_bars_too(bars_restored, capsys):
    import huggingface_hub.utils
    import transformers.modeling_gguf_pytorch_utils as gguf
    import transformers.utils.logging

    assert transformers.utils.logging.is_progress_bar_enabled()
    assert main(["flops", TINY, "--no-progress"]) == 0
    assert all(os.environ.get(k) == v for k, v in logs.BARS_ENV.items())  # for what loads later, and child processes
    assert huggingface_hub.utils.are_progress_bars_disabled()
    assert not transformers.utils.logging.is_progress_bar_enabled()
    assert gguf.tqdm(range(3)).disable  # "Converting and de-quantizing GGUF tensors...": not drawn


def test_a_command_without_no_progress_leaves_them_on(bars_restored):
    import transformers.utils.logging

    assert main(["flops", TINY]) == 0
    assert transformers.utils.logging.is_progress_bar_enabled() and not logs.bars_off()
    assert "TQDM_DISABLE" not in os.environ


def test_log_lines_start_with_the_time_and_keep_their_text(capsys):
    logs.setup()
    logging.getLogger("minimodel.test").warning("a message")
    err = capsys.readouterr().err
    assert re.fullmatch(r"\d\d:\d\d:\d\d \[minimodel\] a message\n", err), err


@pytest.mark.slow
def test_prepare_names_no_mask_for_a_causal_tokenizer(tmp_path, corpus_dir, capsys):
    """A causal LM's Hugging Face tokenizer (GPT-2's: one special token, no <mask>) in `prepare`: its log line gives
    the pieces and their convention, no ``<mask> = N``."""
    from minimodel.data.tokenizer import HFTokenizer
    from tests.test_hf_decoder import gpt2_tokenizer, tiny

    source = gpt2_tokenizer(tmp_path / "tiny-gpt2")
    vocab = HFTokenizer(str(source), causal=True).vocab_size
    tiny("gpt2", vocab, bos_token_id=0, eos_token_id=0).save_pretrained(source)
    args = [*tiny_overrides(tmp_path, corpus_dir), "data.num_workers=0", "sweep=[]", "system=minipost",
            "model.family=decoder", f"bridge.source={source}", "bridge.depth=1", "bridge.layers=1",
            "target_langs=[de]"]
    assert main(["prepare", str(ROOT / "experiments" / "demo.yaml"), *args, "--langs=en", "--no-progress"]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if "Hugging Face tokenizer" in x)
    assert "pieces" in line and "<mask>" not in line, line


def test_export_names_the_system(monkeypatch, tmp_path, caplog):
    """``export task=`` without ``system=`` says which system it exported (the experiment's default), and every
    export's log line names the system."""
    import minimodel.export as export_module

    def fake_export(cfg, out, **kwargs):
        return out

    monkeypatch.setattr(export_module, "export", fake_export)
    demo = str(ROOT / "experiments" / "demo.yaml")
    with caplog.at_level(logging.INFO, logger="minimodel"):
        assert main(["export", demo, "lang=de", "task=lohelp", "seed=1", "--out", str(tmp_path / "x"),
                     f"runs_dir={tmp_path}"]) == 0
    assert "export: no system= given: exporting bl_base, the experiment's default system" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="minimodel"):
        assert main(["export", demo, "lang=de", "system=minipost", "--out", str(tmp_path / "y"),
                     f"runs_dir={tmp_path}"]) == 0
    assert "no system= given" not in caplog.text
    assert export_module.exported_system(load_experiment(demo, ["system=minipost"])) == "minipost"
