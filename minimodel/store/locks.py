"""One writer per run: an exclusive lock on a stage directory, a system's results, a prepared language.

``with exclusive(directory, "pretrain"):`` takes an advisory lock (``flock``) on ``directory/.lock`` and
writes the holder (host, pid, command, start time) into it. A second process that asks for the same lock
fails at once with a ``LockError`` naming the holder and what to do. The kernel releases the lock when
its process ends, however it ends (kill -9 included), so a lock left by a killed process is simply
taken over by the next run, which says so. Only rank 0 of a distributed run locks; the other ranks
write nothing that needs it. Nothing here imports torch."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from minimodel.errors import UserError
from minimodel.log import get_logger, process_rank
from minimodel.store import atomic

log = get_logger(__name__)
LOCK = ".lock"


class LockError(UserError, RuntimeError):
    """Another process holds the lock, or the directory cannot hold one."""


def holder_text(holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"])) if "since" in holder else "?"
    return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, since {since}: "
            f"`{holder.get('command', '?')}`")


def _read_holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 1 << 16)
    try:
        holder = atomic.loads(raw) if raw.strip() else {}
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


@contextlib.contextmanager
def exclusive(directory: Path, what: str) -> Iterator[None]:
    """Hold the lock of ``directory`` (created if needed) for the ``with`` block; ``what`` names the work in
    messages ("stage pretrain", "evaluation", "prepare en")."""
    if process_rank() != 0:
        yield
        return
    directory = Path(directory)
    path = directory / LOCK
    created = [d for d in (directory, *directory.parents) if not d.exists()]  # removed again if left empty
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise LockError(f"cannot write to {directory} ({e.strerror or e}): {what} writes there; make it writable "
                        f"or choose another runs_dir / data.prepared_dir") from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            raise LockError(f"{directory} is in use by another minimodel process ({holder_text(holder)}); "
                            f"{what} would write the same files. Wait for it to finish, or stop it "
                            f"(kill {holder.get('pid', 'PID')} on {holder.get('host', 'its host')}) and rerun "
                            f"to resume") from None
        previous = _read_holder(fd)
        if previous:  # a clean exit empties the file: this holder was killed
            log.warning(f"{directory}: taking over the lock of a process that ended without releasing it "
                        f"({holder_text(previous)})")
        me = {"host": socket.gethostname(), "pid": os.getpid(), "command": " ".join(sys.argv), "since": time.time()}
        try:
            atomic.rewrite_fd(fd, json.dumps(me).encode(), path)  # a full disk: a WriteError naming the lock file
            yield
        finally:
            os.ftruncate(fd, 0)
            if created and [p.name for p in directory.iterdir()] == [LOCK]:  # the work wrote nothing: leave no trace
                path.unlink()
                for d in created:
                    with contextlib.suppress(OSError):
                        d.rmdir()
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
