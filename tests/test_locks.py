"""One writer per run: a second copy of a command on the same run directory exits at once naming the
holder; a lock left by a killed process is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minimodel.cli import main
from minimodel.store.locks import LOCK, LockError, exclusive
from minimodel.systems import stage_plan
from tests.conftest import ROOT, stage_overrides, tiny_config, tiny_overrides

HOLD = """
import sys, time
from pathlib import Path
from minimodel.store.locks import exclusive
with exclusive(Path(sys.argv[1]), "a test"):
    print("held", flush=True)
    time.sleep(600)
"""


def hold_lock(directory: Path) -> subprocess.Popen:
    """Another process holding the lock of ``directory`` (as a running stage would)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_fails_at_once_and_a_killed_holder_is_taken_over(tmp_path, caplog):
    holder = hold_lock(tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(LockError, match=rf"{tmp_path} is in use by another minimodel process "
                                            rf"\(host {socket.gethostname()}, pid {holder.pid}, since .*"):
            with exclusive(tmp_path, "stage pretrain"):
                pass
        assert time.monotonic() - started < 5
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with exclusive(tmp_path, "stage pretrain"):  # the kernel released the killed holder's lock
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    assert f"taking over the lock of a process that ended without releasing it (host {socket.gethostname()}, " \
           f"pid {holder.pid}" in caplog.text
    assert (tmp_path / LOCK).read_text() == ""  # released cleanly: nothing to take over next time


def test_a_second_copy_of_a_stage_exits_2_naming_the_holder(tmp_path, prepared, corpus_dir, capsys):
    extra = stage_overrides(["pretrain"], updates=2)
    run_dir = stage_plan(tiny_config(tmp_path, corpus_dir, *extra, prepared=prepared), "adapt").runs.pretrain
    holder = hold_lock(run_dir)
    try:
        rc = main(["pretrain", str(ROOT / "experiments" / "tiny.yaml"),
                   *tiny_overrides(tmp_path, corpus_dir, prepared), *extra, "--no-progress"])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    err = capsys.readouterr().err
    assert rc == 2
    assert f"pretrain: error: {run_dir} is in use by another minimodel process (host " in err
    assert f"pid {holder.pid}" in err and "Traceback" not in err
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK]  # the second copy wrote nothing (the holder made it)


def test_a_second_evaluation_of_the_same_system_exits_2(tmp_path, prepared, corpus_dir, capsys):
    cfg = tiny_config(tmp_path, corpus_dir, prepared=prepared)
    holder = hold_lock(stage_plan(cfg, "evaluate").runs.results.parent / ".evaluate-all")  # the lock of the whole system's evaluation
    try:
        rc = main(["evaluate", str(ROOT / "experiments" / "tiny.yaml"),
                   *tiny_overrides(tmp_path, corpus_dir, prepared), "--no-progress"])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert rc == 2
    assert "evaluation of minijoint (all) would write the same files" in capsys.readouterr().err
    assert not stage_plan(cfg, "adapt").runs.results.exists()


def test_a_read_only_run_directory_is_named(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True)
    if r.returncode != 0:  # not root: a read-only mode bit does the same
        ro.chmod(0o555)
    try:
        with pytest.raises(LockError, match=rf"cannot write to {ro}/stage \(.*\): stage pretrain writes there"):
            with exclusive(ro / "stage", "stage pretrain"):
                pass
    finally:
        if r.returncode == 0:
            subprocess.run(["umount", str(ro)], check=False)
        ro.chmod(0o755)


def test_a_second_prepare_of_the_same_language_exits_2(tmp_path, corpus_dir, capsys):
    holder = hold_lock(tmp_path / "prepared" / "en")
    try:
        rc = main(["prepare", str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(tmp_path, corpus_dir),
                   "--langs=en", "--no-progress"])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert rc == 2
    assert f"{tmp_path / 'prepared' / 'en'} is in use by another minimodel process" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "prepared" / "en").iterdir()) == [LOCK]  # no manifest.json.tmp race
