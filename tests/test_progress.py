"""Progress where users read it: a bar on a terminal only, periodic lines in a log file; an xz corpus read ahead
by a decompression thread gives the same bytes as a plain read."""

from __future__ import annotations

import io
import logging
import lzma
from pathlib import Path
from types import SimpleNamespace

import pytest

from minimodel.data.corpus import READ_BYTES, CorpusError, CountingReader, iter_raw_chunks
from minimodel.log import bar_wanted
from tests.conftest import TINY_STAGE, real_text, stage_overrides, tiny_config


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_is_drawn_on_a_terminal_only():
    assert bar_wanted(True, _Terminal())
    assert not bar_wanted(False, _Terminal())  # --no-progress
    assert not bar_wanted(True, io.StringIO())  # a log file, a pipe
    closed = io.StringIO()
    closed.close()
    assert not bar_wanted(True, closed)
    assert not bar_wanted(True, object())  # no isatty at all


def test_stage_lines_log_every_interval_and_at_the_last_update(caplog):
    from minimodel.training.callbacks import StageLines

    now = [0.0]
    lines = StageLines("pretrain", every=30.0, clock=lambda: now[0])
    trainer = SimpleNamespace(global_step=0, max_steps=100, callback_metrics={})
    lines.on_train_start(trainer, None)
    logged = []
    with caplog.at_level(logging.INFO, logger="minimodel"):
        for step in range(1, 101):
            now[0] += 1.0  # one update a second
            trainer.global_step = step
            trainer.callback_metrics = {"train/loss": 5.0 - step / 100, "perf/tokens_per_sec": 1234.4}
            before = len(caplog.records)
            lines.on_train_batch_end(trainer, None)
            logged += [step] * (len(caplog.records) - before)
    assert logged == [30, 60, 90, 100]  # every 30 s, and the last update
    first = caplog.records[0].getMessage()
    assert first == "pretrain: update 30/100 (30%), loss 4.700, 1,234 tok/s, ETA 0:01:10"
    assert "ETA" not in caplog.records[-1].getMessage()  # nothing left at the end


def test_a_stage_run_into_a_log_file_draws_no_bar_and_logs_lines(tmp_path, prepared, corpus_dir, capsys, caplog):
    """progress_bar=True with stdout not a terminal (pytest captures it, as a SLURM log would): no tqdm redraws
    (no carriage returns), a line for the last update in the log."""
    from minimodel.stages.pretrain import run_pretrain

    cfg = tiny_config(tmp_path, corpus_dir, "system=bl_base", "model.mini_heads=[]",
                      *stage_overrides(["pretrain"], updates=4, **TINY_STAGE, ckpt_every=4, val_every=4),
                      prepared=prepared)
    with caplog.at_level(logging.INFO, logger="minimodel"):
        run_pretrain(cfg, progress_bar=True)
    out = capsys.readouterr()
    assert "\r" not in out.out and "\r" not in out.err
    assert any(r.getMessage().startswith("pretrain: update 4/4 (100%)") for r in caplog.records)


def _xz(path: Path, text: str) -> Path:
    with lzma.open(path, "wt", encoding="utf-8", preset=0) as f:
        f.write(text)
    return path


def test_xz_read_ahead_gives_the_bytes_and_chunks_of_a_plain_read(tmp_path):
    text = real_text("en", 300_000) * 40  # ~12 MB: several READ_BYTES blocks
    corpus = _xz(tmp_path / "en.txt.xz", text)
    assert len(text.encode()) > 2 * READ_BYTES

    def read_all(prefetch: bool) -> bytes:
        with CountingReader(corpus, prefetch=prefetch) as r:
            return b"".join(iter(lambda: r.read(READ_BYTES), b""))

    assert read_all(True) == read_all(False) == text.encode()
    plain = [(c.start, c.end, c.data) for c in iter_raw_chunks(corpus, 1 << 20, reader=CountingReader(corpus, False))]
    ahead = [(c.start, c.end, c.data) for c in iter_raw_chunks(corpus, 1 << 20)]
    assert ahead == plain and len(ahead) > 5
    resumed = [(c.start, c.end) for c in iter_raw_chunks(corpus, 1 << 20, start=plain[3][1], first_index=4)]
    assert resumed == [(s, e) for s, e, _ in plain[4:]]


def test_xz_read_ahead_stops_when_closed_early_and_reports_a_corrupt_file(tmp_path):
    corpus = _xz(tmp_path / "en.txt.xz", real_text("en", 300_000) * 40)
    r = CountingReader(corpus)
    assert r.read(READ_BYTES)
    r.close()  # the thread waits on a full queue: close must not hang
    assert r._thread is not None and not r._thread.is_alive()
    broken = tmp_path / "de.txt.xz"
    data = corpus.read_bytes()
    broken.write_bytes(data[: len(data) // 2] + bytes(1000) + data[len(data) // 2:])
    with pytest.raises(CorpusError, match="not a readable xz file"):
        for _ in iter_raw_chunks(broken, 1 << 20):
            pass


def test_the_packaging_metadata_gives_setuptools_nothing_to_warn_about(tmp_path):
    """`make setup` printed setuptools' deprecation wall (`project.license` as a TOML table): applying
    pyproject.toml the way the build backend does must warn about nothing (the old table form does)."""
    import shutil
    import warnings

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    from tests.conftest import ROOT

    def warned(pyproject: Path) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            apply_configuration(Distribution(), pyproject)
        return [str(w.message).splitlines()[0] for w in caught]

    assert warned(ROOT / "pyproject.toml") == []
    old = tmp_path / "pyproject.toml"
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    old.write_text((ROOT / "pyproject.toml").read_text().replace('license = "Apache-2.0"',
                                                                 'license = {text = "Apache-2.0"}'))
    assert any("license" in w for w in warned(old))  # the check sees the warning it guards against
