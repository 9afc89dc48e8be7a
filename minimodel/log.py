"""minimodel's console messages: the ``minimodel`` logger, rank-zero filtered, one prefix.

Modules call ``log = get_logger(__name__)`` and ``log.info(...)``. The command line calls
``setup()`` once: messages go to stderr as ``HH:MM:SS [minimodel] ...`` (the local time first); processes other
than rank 0 of a distributed run print warnings and errors only; Lightning's start-up banners and tips are silenced.
Nothing here imports torch."""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

PREFIX = "[minimodel]"
TIME_FORMAT = "%H:%M:%S"  # the local time each line starts with: ``12:04:31 [minimodel] ...``
_RANK_VARS = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "JSM_NAMESPACE_RANK")


def stamp() -> str:
    """The time a line written without ``logging`` starts with, as the logger's lines do."""
    return time.strftime(TIME_FORMAT)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("minimodel") else f"minimodel.{name}")


def process_rank() -> int:
    """This process's global rank, from the variables DDP launchers and SLURM set (0 when none is set)."""
    for var in _RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class RankZero(logging.Filter):
    """Info and below only from rank 0; warnings and errors from every rank, tagged with it."""

    def filter(self, record: logging.LogRecord) -> bool:
        rank = process_rank()
        if rank and record.levelno < logging.WARNING:
            return False
        record.rank_tag = f" (rank {rank})" if rank else ""
        return True


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a message is emitted (pytest and notebooks swap it)."""

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup(level: int = logging.INFO) -> None:
    """Configure the ``minimodel`` logger once per process (idempotent)."""
    root = logging.getLogger("minimodel")
    if not any(getattr(h, "_minimodel", False) for h in root.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter(f"%(asctime)s {PREFIX}%(rank_tag)s %(message)s", datefmt=TIME_FORMAT))
        handler.addFilter(RankZero())
        handler._minimodel = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(level)
    quiet_lightning()


def quiet_lightning() -> None:
    """Lightning announces devices, tips and `max_steps reached` at INFO on every start: keep warnings only
    (and drop one deprecation notice its own code triggers in torch's pytree, which no user can act on)."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)


PROGRESS_EVERY_S = 30.0
BARS_ENV = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
"""What ``--no-progress`` sets in the environment: tqdm reads TQDM_DISABLE when it is imported, the Hugging Face hub
and datasets theirs when they are, and the processes this one starts (DDP ranks, ``run``'s steps) inherit them."""
_bars_off = False


def progress_bars_off() -> None:
    """``--no-progress``: no progress bar from anything this process or its children load, minimodel's own (the
    commands pass ``progress=False``) or a library's: the environment of ``BARS_ENV`` for what is not loaded yet, the
    switches of huggingface_hub, transformers and datasets where they are, and the GGUF conversion's bar
    (``quiet_gguf``: transformers draws it with a tqdm of its own, whatever its switch says)."""
    global _bars_off
    _bars_off = True
    os.environ.update(BARS_ENV)
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        import transformers.utils.logging

        transformers.utils.logging.disable_progress_bar()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    quiet_gguf()


def bars_off() -> bool:
    """Whether ``progress_bars_off`` ran in this process."""
    return _bars_off


def quiet_gguf() -> None:
    """After ``progress_bars_off``: the bar transformers draws while it converts a GGUF file's tensors ("Converting
    and de-quantizing GGUF tensors...", ``tqdm.auto.tqdm`` imported before TQDM_DISABLE could count) drawn disabled.
    Called before every GGUF read, and by ``progress_bars_off`` itself; nothing when the bars are on or transformers
    is not loaded."""
    if not _bars_off or "transformers" not in sys.modules:
        return
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf
    except ImportError:  # a transformers without GGUF support: no bar to quiet
        return
    if getattr(gguf.tqdm, "_minimodel_quiet", False):
        return
    bar = gguf.tqdm

    def quiet(*args: Any, **kwargs: Any) -> Any:
        return bar(*args, **{**kwargs, "disable": True})

    quiet._minimodel_quiet = True  # type: ignore[attr-defined]
    gguf.tqdm = quiet


def bar_wanted(requested: bool, stream: Any = None) -> bool:
    """A progress bar is drawn only on a terminal: in a file (a SLURM log, ``> log 2>&1``) tqdm's redraws become
    one endless line, so there the long commands log a line every ``PROGRESS_EVERY_S`` seconds instead."""
    stream = sys.stderr if stream is None else stream
    try:
        return requested and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """Progress of a long read of a file: a line every ``every`` seconds in the log (bytes read, MB/s, ETA: what a
    SLURM job's log shows, with or without ``--no-progress``) and, on a terminal, a tqdm bar.

    ``update(position, text)``: ``position`` is how far into the file on disk (compressed bytes for xz: what the
    ETA is computed from), ``text`` the bytes of text read so far."""

    def __init__(self, what: str, total: int, bar: bool = False, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic, start: int = 0) -> None:
        self.what, self.total, self.clock = what, total, clock
        self.every = PROGRESS_EVERY_S if every is None else every
        self.t0 = self.last = clock()
        self.start = self.position = start
        self.text = 0
        self._bar = None
        if bar_wanted(bar):
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, unit="B", unit_scale=True, desc=what, file=sys.stderr,
                             dynamic_ncols=True)

    def update(self, position: int, text: int, extra: str = "") -> None:
        if self._bar is not None:
            self._bar.update(position - self.position)
        self.position, self.text = position, text
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            get_logger("minimodel.progress").info(self.line(extra))

    def line(self, extra: str = "") -> str:
        elapsed = max(self.clock() - self.t0, 1e-9)
        rate = (self.position - self.start) / elapsed  # bytes of the file per second
        left = (self.total - self.position) / rate if rate > 0 else float("inf")
        eta = "?" if left == float("inf") else clock_time(left)
        share = f"{self.position / self.total:.0%} of {_size(self.total)} on disk" if self.total else "?"
        return (f"{self.what}: {_size(self.text)} of text read ({share}), {self.text / elapsed / 1e6:.1f} MB/s of "
                f"text, ETA {eta}{', ' + extra if extra else ''}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def clock_time(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
