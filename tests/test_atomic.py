"""minimodel.store.atomic: every write whole or not at all, a refused write as one clear error (issue 25, part 3)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minimodel.errors import UserError, WriteError
from minimodel.store import atomic


def refuse(monkeypatch: pytest.MonkeyPatch, code: int = errno.ENOSPC) -> None:
    def durable(fd: int, path: Path) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(atomic, "_durable", durable)


def test_a_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "a" / "b.json"
    atomic.write_json(path, {"x": 1})
    assert path.read_text() == '{\n "x": 1\n}\n'
    atomic.write_text(path, "two")
    atomic.write_with(tmp_path / "c.bin", lambda f: f.write(b"\0\1"))
    atomic.write_jsonl(tmp_path / "d.jsonl", [{"a": "ü"}, {"b": 2}])
    assert path.read_text() == "two" and (tmp_path / "c.bin").read_bytes() == b"\0\1"
    assert (tmp_path / "d.jsonl").read_text(encoding="utf-8") == '{"a": "ü"}\n{"b": 2}\n'
    assert atomic.leftovers(tmp_path) == []


def test_a_full_disk_keeps_the_old_file_and_names_the_sizes(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    path.write_text("old")
    refuse(monkeypatch)
    with pytest.raises(WriteError) as e:
        atomic.write_text(path, "x" * 1000)
    assert isinstance(e.value, UserError) and e.value.errno == errno.ENOSPC
    assert str(e.value).startswith(f"writing {path}: no space left on device (1,000 bytes needed, ")
    assert " free on " in str(e.value) and str(e.value).endswith("(f.txt is as it was before)")
    assert path.read_text() == "old" and atomic.leftovers(tmp_path) == []


@pytest.mark.parametrize(("code", "says"), [(errno.EROFS, "read-only file system"), (errno.EDQUOT, "disk quota exceeded"),
                                            (errno.EACCES, "permission denied")])
def test_every_refusal_has_its_message(tmp_path, monkeypatch, code, says):
    refuse(monkeypatch, code)
    with pytest.raises(WriteError, match=rf"^writing {tmp_path / 'f'}: {says}"):
        atomic.write_bytes(tmp_path / "f", b"1")
    assert list(tmp_path.iterdir()) == []


def test_another_error_is_not_hidden_and_still_leaves_nothing(tmp_path, monkeypatch):
    refuse(monkeypatch, errno.EIO)
    with pytest.raises(OSError) as e:
        atomic.write_text(tmp_path / "f", "x")
    assert not isinstance(e.value, WriteError) and e.value.errno == errno.EIO
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_the_middle_of_a_write_leaves_nothing(tmp_path):
    def half_then_interrupt(f):  # noqa: ANN001
        f.write(b"half")
        raise KeyboardInterrupt

    (tmp_path / "f").write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        atomic.write_with(tmp_path / "f", half_then_interrupt)
    assert (tmp_path / "f").read_bytes() == b"old" and atomic.leftovers(tmp_path) == []


def test_an_append_is_whole_or_cut_back(tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl"
    atomic.append_text(path, '{"a": 1}\n')
    refuse(monkeypatch)
    with pytest.raises(WriteError, match=r"no space left on device \(9 bytes needed"):
        atomic.append_text(path, '{"b": 2}\n')
    assert path.read_text() == '{"a": 1}\n'  # no partial line
    monkeypatch.undo()
    with open(path, "a+", encoding="utf-8") as f:  # on a descriptor the caller holds (and may lock)
        end = atomic.append_fd(f.fileno(), b'{"c": 3}\n', path)
    assert end == path.stat().st_size and path.read_text() == '{"a": 1}\n{"c": 3}\n'


def test_rewriting_a_descriptor_in_place(tmp_path, monkeypatch):
    path = tmp_path / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        atomic.rewrite_fd(fd, b"holder one, a long one", path)
        atomic.rewrite_fd(fd, b"two", path)
        assert path.read_bytes() == b"two"
        refuse(monkeypatch)
        with pytest.raises(WriteError, match=rf"^writing {path}: no space left"):
            atomic.rewrite_fd(fd, b"three", path)
        assert path.read_bytes() == b""
    finally:
        os.close(fd)


def test_link_or_copy_and_copy_file(tmp_path):
    src = tmp_path / "step.ckpt"
    src.write_bytes(b"weights")
    atomic.link_or_copy(src, tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt").read_bytes() == b"weights" and os.path.samefile(src, tmp_path / "last.ckpt")
    atomic.copy_file(src, tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == b"weights" and atomic.leftovers(tmp_path) == []


def test_a_directory_is_written_whole_and_replaces_the_old_one_only_when_complete(tmp_path, monkeypatch):
    out = tmp_path / "export"
    with atomic.replacing_dir(out) as d:
        (d / "a").write_text("1")
        (d / "sub").mkdir()
        (d / "sub" / "b").write_text("2")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["a", "sub", "sub/b"]
    refuse(monkeypatch)
    with pytest.raises(WriteError, match=rf"^writing {out / 'a'}: no space left"):
        with atomic.replacing_dir(out, replace=True) as d:
            (d / "a").write_text("new")
    assert (out / "a").read_text() == "1" and atomic.leftovers(tmp_path) == []
    monkeypatch.undo()
    with pytest.raises(KeyboardInterrupt):
        with atomic.replacing_dir(out, replace=True) as d:
            (d / "a").write_text("new")
            raise KeyboardInterrupt
    assert (out / "a").read_text() == "1" and atomic.leftovers(tmp_path) == []
    with atomic.replacing_dir(out, replace=True) as d:
        (d / "a").write_text("new")
    assert [p.name for p in out.iterdir()] == ["a"] and (out / "a").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_save_torch_and_a_payload_estimate(tmp_path):
    import torch

    atomic.save_torch({"w": torch.zeros(10), "n": [torch.ones(2, dtype=torch.float64)]}, tmp_path / "x.pt")
    assert torch.load(tmp_path / "x.pt")["w"].shape == (10,)
    assert atomic.payload_bytes({"w": torch.zeros(10), "n": [torch.ones(2, dtype=torch.float64)], "s": "x"}) == 56


def test_the_module_is_light():
    code = "import sys, minimodel.store.atomic; print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_metrics_rows_survive_a_failed_write_and_a_retry(tmp_path, monkeypatch):
    """metrics.csv: a write that fails (a new column included) leaves the file as it was, and the retry Lightning
    makes when it shuts down writes a consistent file (the header judged from the file, not from memory)."""
    import csv

    from minimodel.training.loggers import MetricsCSV

    writer = MetricsCSV(tmp_path).experiment
    writer.log_metrics({"train/loss": 1.0}, step=0)
    writer.save()
    writer.log_metrics({"train/loss": 0.5, "val/loss": 0.7}, step=1)  # a new column: the file is written again
    with monkeypatch.context() as m:
        refuse(m)
        with pytest.raises(WriteError, match="metrics.csv: no space left"):
            writer.save()
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,train/loss", "0,1.0"]
    writer.save()  # the retry
    writer.log_metrics({"train/loss": 0.25}, step=2)
    writer.save()
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["train/loss"], r["val/loss"]) for r in rows] == [("0", "1.0", ""), ("1", "0.5", "0.7"),
                                                                          ("2", "0.25", "")]
    assert atomic.leftovers(tmp_path) == []
