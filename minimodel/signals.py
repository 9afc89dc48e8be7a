"""Stop requests that arrive before a stage is ready for them.

SLURM sends USR1 ``signal_lead_s`` before a job's time limit and SIGTERM at it. A training stage or an
evaluation installs its own handlers once it runs (finish the current update or row, checkpoint, exit 3); a
signal that arrives earlier, while torch is imported or data is read, would meet Python's default action, which
for SIGUSR1 ends the process at once: no checkpoint, the job fails and its dependants are cancelled instead of
a requeue. The commands that train or evaluate call :func:`catch_early` first; the stage's handlers honour what
it recorded as soon as they take over (training stops after its first update, with a checkpoint). Nothing here
imports torch."""

from __future__ import annotations

import signal
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_received: list[str] = []


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


def take() -> str | None:
    """The name of the last stop signal recorded before a stage's own handlers took over, or None; the stage
    that takes it honours it, so it is forgotten here."""
    name = _received[-1] if _received else None
    _received.clear()
    return name
