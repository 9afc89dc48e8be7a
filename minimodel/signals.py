"""Stop requests that arrive before a stage is ready for them.

SLURM sends USR1 ``signal_lead_s`` before a job's time limit and SIGTERM at it. A training stage or an
evaluation installs its own handlers once it runs (finish the current update or row, checkpoint, exit 3); a
signal that arrives earlier, while torch is imported or data is read, would meet Python's default action, which
for SIGUSR1 ends the process at once: no checkpoint, the job fails and its dependants are cancelled instead of
a requeue. The commands that train or evaluate call :func:`catch_early` first; the stage's handlers honour what
it recorded as soon as they take over (training stops after its first update, with a checkpoint).

Ctrl-C (SIGINT) is not deferred: before a stage's handlers take over (and in every command that is not a training
stage) it stops the command at once, which the command line reports as ``interrupted``, exit 130. A training stage
takes the first Ctrl-C like SIGTERM and a second as "stop now" (``training.callbacks``); Lightning turns a
KeyboardInterrupt inside training into ``sys.exit(1)``, so the stage notes it here (``note_interrupt``) for the
command line to report it the same way. Nothing here imports torch."""

from __future__ import annotations

import signal
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_received: list[str] = []
_interrupted: list[bool] = []


def _record(signum: int, frame: Any) -> None:
    _received.append(signal.Signals(signum).name)


def catch_early() -> dict[int, Any]:
    """Record SIGTERM / SIGUSR1 from now on instead of dying (main thread only); returns the handlers it
    replaced, for ``restore``."""
    return {sig: signal.signal(sig, _record) for sig in STOP_SIGNALS}


def restore(handlers: dict[int, Any]) -> None:
    """Put back the handlers ``catch_early`` replaced and forget what it recorded (a command has ended)."""
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    _received.clear()


def requested() -> str | None:
    """The last stop signal recorded by ``catch_early`` so far, without forgetting it: work that polls (``prepare``
    between shards) stops at its next safe point."""
    return _received[-1] if _received else None


def take() -> str | None:
    """The name of the last stop signal recorded before a stage's own handlers took over, or None; the stage
    that takes it honours it, so it is forgotten here."""
    name = _received[-1] if _received else None
    _received.clear()
    return name


def note_interrupt() -> None:
    """A KeyboardInterrupt (Ctrl-C) stopped a training stage at once; Lightning exits with 1 right after."""
    _interrupted.append(True)


def interrupted() -> bool:
    """Whether ``note_interrupt`` was called since the last call (and forget it)."""
    was = bool(_interrupted)
    _interrupted.clear()
    return was
