"""Every file minimodel writes goes through here: whole or not at all, with a clear error when the disk says no.

A file is written to a temporary file beside it (``.NAME.tmp-PID``), flushed to disk (fsync), then renamed over
the target, so a crash, a full disk or Ctrl-C leaves the previous file (or none) and never a partial one; the
temporary file is removed on any exception, KeyboardInterrupt included. An append (a results row, metrics rows)
is written whole or cut back to where it started. A full disk, a quota, a read-only file system or a permission
refused (``ENOSPC``, ``EDQUOT``, ``EROFS``, ``EACCES``, ``EPERM``) becomes a ``WriteError`` (a ``UserError``:
the command prints ``error: writing PATH: ...`` and exits 2) naming the file, the bytes needed and free, the
mount and the fix.

    write_text(path, text)             write_bytes(path, data)          write_json(path, obj)
    write_jsonl(path, rows)            write_with(path, writer)         save_torch(obj, path)
    append_text(path, text)            append_fd(fd, data, path)        rewrite_fd(fd, data, path)
    copy_file(src, dst)                link_or_copy(src, dst)           make_dirs(path)
    with replacing(path) as f: ...     with replacing_dir(path) as tmp_dir: ...

Every write passes ``_durable`` (the fsync) before it counts: tests inject faults there. Nothing here imports
torch (``save_torch`` imports it when called), so light commands stay light."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from minimodel.errors import CheckpointError, UserError, WriteError

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
"""The errors of a file system that refuses a write: a ``WriteError`` (exit 2), not a traceback."""

_TMP = ".tmp-"  # temporary files and directories: .{name}.tmp-{pid}


# ------------------------------------------------------------------------------------------ errors


def mount_of(path: Path) -> Path:
    """The mount point holding ``path`` (or where it would be created)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: Path) -> int:
    """Bytes free to an unprivileged user on the file system of ``path`` (-1 when it cannot be told)."""
    try:
        return shutil.disk_usage(mount_of(path)).free
    except OSError:
        return -1


def describe(e: OSError, path: Path | None = None, needed: int = 0) -> str:
    """The one-line message of a write to ``path`` (default: the error's own file name) refused with ``e``."""
    target = Path(path) if path is not None else Path(e.filename or "?")
    mount = mount_of(target)
    code = e.errno
    if code == errno.ENOSPC:
        free = free_bytes(target)
        size = f"{needed:,} bytes needed, " if needed > 0 else ""
        space = f" ({size}{free:,} free on {mount})" if free >= 0 else f" (on {mount})"
        return (f"writing {target}: no space left on device{space}; free some space (or point runs_dir / "
                f"data.prepared_dir / --out at a larger disk) and rerun the same command ({target.name} is as it "
                f"was before)")
    if code == errno.EDQUOT:
        size = f" ({needed:,} bytes needed)" if needed > 0 else ""
        return (f"writing {target}: disk quota exceeded on {mount}{size}; free some space within your quota (or "
                f"write to another disk) and rerun the same command ({target.name} is as it was before)")
    if code == errno.EROFS:
        return (f"writing {target}: read-only file system ({mount}); write somewhere writable (runs_dir, "
                f"data.prepared_dir, --out) or remount it read-write")
    return (f"writing {target}: permission denied ({e.strerror or os.strerror(code or 0)}); make "
            f"{target.parent} writable for this user or write somewhere else (runs_dir, data.prepared_dir, --out)")


def disk_error(e: BaseException, path: Path | None = None, needed: int = 0) -> WriteError | None:
    """``e`` as a ``WriteError`` when it is a file system refusing a write (``DISK_ERRNOS``), else None."""
    if isinstance(e, WriteError):
        return e
    if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
        return WriteError(describe(e, path, needed), e.errno)
    if isinstance(e, OSError) and e.errno is None and _SHORT_WRITE.fullmatch(str(e)):
        # numpy's tofile (np.save into a file) reports a full disk as a short write, without an errno
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return WriteError(describe(full, path, needed), errno.ENOSPC)
    return None


def name_error(e: BaseException) -> UserError | None:
    """``e`` as a ``UserError`` when a path given in the configuration or on the command line is longer than the file
    system takes (ENAMETOOLONG: a name over 255 bytes, a path over 4,096), wherever it was read or written; else
    None."""
    if not (isinstance(e, OSError) and e.errno == errno.ENAMETOOLONG):
        return None
    path = str(e.filename or "")
    longest = max((len(part.encode()) for part in Path(path).parts), default=0)
    return UserError(f"{path[:60]}... ({len(path)} characters, its longest name {longest} bytes): too long for the file "
                     f"system (a name holds at most 255 bytes, a path 4,096); check the setting or argument that names "
                     f"it (bridge.source, data.corpus_dir, data.source_tokenizer, tasks.*.source, runs_dir, --out, ...)")


_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")


@contextlib.contextmanager
def _converted(path: Path, needed: int = 0) -> Iterator[None]:
    """Turn a refused write of ``path`` into a ``WriteError``; other exceptions pass unchanged."""
    try:
        yield
    except OSError as e:
        err = disk_error(e, path, needed)
        if err is None:
            raise
        raise err from e


def make_dirs(path: Path) -> Path:
    """``mkdir -p path``, a refusal (read-only, full, permissions) as a ``WriteError`` naming it."""
    path = Path(path)
    with _converted(path):
        path.mkdir(parents=True, exist_ok=True)
    return path


# ------------------------------------------------------------------------------------------ replacing a file


def _durable(fd: int, path: Path) -> None:
    """Flush ``fd`` (the data of ``path``) to disk. Every write of this module passes here before it counts, so
    that a fault test can inject a full disk at one write site by patching this function."""
    os.fsync(fd)


def _sync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: some file systems cannot fsync a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def temp_path(path: Path) -> Path:
    """The temporary name of ``path`` while it is written: hidden, beside it, this process's own."""
    return path.with_name(f".{path.name}{_TMP}{os.getpid()}")


def is_temp(path: Path) -> bool:
    """A temporary file or directory of this module (one left by a process killed with -9)."""
    return path.name.startswith(".") and _TMP in path.name


@contextlib.contextmanager
def replacing(path: Path, needed: int = 0) -> Iterator[IO[bytes]]:
    """``with replacing(path) as f: f.write(...)``: ``f`` is a temporary file beside ``path``, which replaces
    ``path`` when the block ends without an exception (after an fsync) and is removed when it raises.
    ``needed``: the bytes the write needs, for the message of a full disk (default: what was written)."""
    path = Path(path)
    make_dirs(path.parent)
    tmp = temp_path(path)
    written = needed
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            written = needed or f.tell()
            _durable(f.fileno(), path)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        err = disk_error(e, path, written)
        if err is not None and err is not e:
            raise err from e
        raise
    _sync_dir(path.parent)


def write_bytes(path: Path, data: bytes) -> None:
    """``path`` holds ``data``, whole (or is as it was, on any failure)."""
    with replacing(path, len(data)) as f:
        f.write(data)


def write_text(path: Path, text: str, encoding: str = "utf-8") -> None:
    """``path`` holds ``text``, whole (or is as it was, on any failure)."""
    write_bytes(path, text.encode(encoding))


def write_json(path: Path, obj: Any, indent: int | None = 1, default: Callable[[Any], Any] | None = None,
               ensure_ascii: bool = True) -> None:
    """``path`` holds ``json.dumps(obj, indent=indent, default=default)`` and a final newline, whole."""
    write_text(path, json.dumps(obj, indent=indent, default=default, ensure_ascii=ensure_ascii) + "\n")


def write_jsonl(path: Path, rows: Iterable[Any]) -> None:
    """``path`` holds one JSON object per line (UTF-8, not escaped), whole: a predictions file, say."""
    write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def write_with(path: Path, writer: Callable[[IO[bytes]], object], needed: int = 0) -> None:
    """``writer(f)`` writes ``path`` through a binary file (``np.save``, ``fig.savefig``), whole."""
    with replacing(path, needed) as f:
        writer(f)


def payload_bytes(obj: Any) -> int:
    """About the bytes ``torch.save(obj)`` writes: those of the tensors in ``obj`` (nested dicts, lists, tuples)."""
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int) and hasattr(obj, "element_size"):  # a tensor (no torch import needed)
        return nbytes
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    return 0


def save_torch(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path``, whole (a checkpoint, an embeddings file, a finetuned model). torch reports
    some failed writes as a RuntimeError: one with less room left than the payload is a full disk too."""
    import torch

    needed = payload_bytes(obj)
    try:
        with replacing(path, needed) as f:
            torch.save(obj, f)
    except RuntimeError as e:
        free = free_bytes(Path(path).parent)
        if 0 <= free < needed:
            raise WriteError(describe(OSError(errno.ENOSPC, "No space left on device"), Path(path), needed),
                             errno.ENOSPC) from e
        raise CheckpointError(f"writing checkpoint {path} failed ({type(e).__name__}: {e}); {Path(path).name} is "
                              f"as it was before") from e


def copy_file(src: Path, dst: Path) -> None:
    """``dst`` becomes a copy of ``src``, whole."""
    with replacing(dst, Path(src).stat().st_size) as f, open(src, "rb") as s:
        shutil.copyfileobj(s, f, 1 << 20)


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` becomes the same file as ``src`` (a hard link where the file system allows, else a copy), whole."""
    src, dst = Path(src), Path(dst)
    tmp = temp_path(dst)
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.link(src, tmp)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        copy_file(src, dst)
        return
    try:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            _durable(fd, dst)
        finally:
            os.close(fd)
        os.replace(tmp, dst)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        err = disk_error(e, dst, src.stat().st_size)  # what a copy would need
        if err is not None and err is not e:
            raise err from e
        raise
    _sync_dir(dst.parent)


# ------------------------------------------------------------------------------------------ appending


def append_fd(fd: int, data: bytes, path: Path) -> int:
    """Append ``data`` to the open file ``fd`` (of ``path``; the caller may hold its lock) and make it durable;
    on any failure the file is cut back to its length before, so no partial line is left. Returns the new end."""
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        _durable(fd, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        err = disk_error(e, path, len(data))
        if err is not None and err is not e:
            raise err from e
        raise
    return start + len(data)


def append_text(path: Path, text: str, encoding: str = "utf-8") -> None:
    """Append ``text`` (whole lines) to ``path`` (created if missing), whole or not at all."""
    path = Path(path)
    make_dirs(path.parent)
    with _converted(path, len(text)):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        append_fd(fd, text.encode(encoding), path)
    finally:
        os.close(fd)


def rewrite_fd(fd: int, data: bytes, path: Path) -> None:
    """Replace the contents of the open file ``fd`` (of ``path``) in place: for a file whose lock lives on its
    descriptor (``locks.py``), which a rename would lose. On failure the file is left empty."""
    try:
        os.ftruncate(fd, 0)
        view, at = memoryview(data), 0
        while at < len(data):
            at += os.pwrite(fd, view[at:], at)
        _durable(fd, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        err = disk_error(e, path, len(data))
        if err is not None and err is not e:
            raise err from e
        raise


# ------------------------------------------------------------------------------------------ a directory


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads``, where a text nested deeper than the parser goes (``[[[[...``: a ``RecursionError``) is
    raised as the ``json.JSONDecodeError`` (a ``ValueError``) every reader of a damaged or crafted file handles."""
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        doc = text if isinstance(text, str) else text.decode("utf-8", errors="replace")
        raise json.JSONDecodeError(f"nested deeper than {sys.getrecursionlimit():,} levels", doc, 0) from None


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _umask() -> int:
    """This process's umask (read by setting it, then putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def replacing_dir(path: Path, replace: bool = False) -> Iterator[Path]:
    """``with replacing_dir(out) as d:`` write every file of ``out`` into ``d``, a temporary directory beside it;
    when the block ends, each file is flushed to disk and ``d`` is renamed to ``out``. ``out`` must not exist or be
    empty, unless ``replace`` (then the old one is removed once the new one is in place). On any exception ``d`` is
    removed and ``out`` is as it was."""
    path = Path(path)
    make_dirs(path.parent)
    tmp = temp_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    old = path.with_name(f".{path.name}.old{_TMP}{os.getpid()}")
    try:
        with _converted(path):
            tmp.mkdir()
        yield tmp
        mode = 0o666 & ~_umask()  # what a plain open() gives: writers that go through mkstemp leave 0600
        for f in sorted(p for p in tmp.rglob("*") if p.is_file() and not p.is_symlink()):
            final = path / f.relative_to(tmp)
            if stat.S_IMODE(f.stat().st_mode) != mode:
                os.chmod(f, mode)
            with _converted(final, f.stat().st_size):
                fd = os.open(f, os.O_RDONLY)
                try:
                    _durable(fd, final)
                finally:
                    os.close(fd)
        with _converted(path):
            try:
                if path.exists() and replace:
                    os.rename(path, old)
                elif path.is_dir():
                    path.rmdir()  # empty (the caller checked): the new directory takes its place
                os.rename(tmp, path)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                raise WriteError(f"{path}: another process wrote it while this one was writing (two writers of one "
                                 f"directory at once, e.g. two exports to one --out); this one's files are "
                                 f"discarded and {path} is left as the other wrote it") from None
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not path.exists():
            os.rename(old, path)  # put the previous export back
        err = disk_error(e, path)
        if err is not None and err is not e:
            raise err from e
        raise
    shutil.rmtree(old, ignore_errors=True)
    _sync_dir(path.parent)


def leftovers(root: Path) -> list[Path]:
    """Temporary files and directories of this module under ``root`` (none after any failure but kill -9)."""
    return sorted(p for p in Path(root).rglob("*") if is_temp(p) and not stat.S_ISLNK(p.lstat().st_mode))
