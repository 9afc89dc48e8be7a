"""Errors a user can cause and fix, and the exit codes of the ``minimodel`` command.

Every module raises a subclass of ``UserError`` for bad input (config, corpus, tokenizer, shards,
checkpoints, embeddings, SLURM); the command line prints its message and exits with ``ERROR_EXIT``
without a traceback. Nothing here imports torch, so light commands stay light."""

from __future__ import annotations

ERROR_EXIT = 2  # bad input, or a file the disk refused (full, read-only): the message names the file or key at fault
REQUEUE_EXIT = 3  # stopped early (SIGTERM/SIGUSR1, Ctrl-C in training, wall-time cap) after a checkpoint: rerun to resume
STOPPED_EXIT = 4  # stopped at trainer.stop_at, as asked, after a checkpoint: not finished, so nothing may build on it
INTERRUPT_EXIT = 130  # Ctrl-C outside training, or a second Ctrl-C in it: stopped at once; every file is whole, rerun
"""Ctrl-C (SIGINT): a training stage (pretrain, bridge, adapt, finetune) takes the first one as SIGTERM (finish the
update, checkpoint, exit 3) and a second one as "stop now" (exit 130, the last checkpoint kept); every other command
and a stage still starting stops at once with ``interrupted`` and exit 130. Nothing is left half-written (``atomic``):
rerun the same command to go on."""


def one_line(message: str) -> str:
    """``message`` as the one line an error is: the control characters and line separators a user's value brought
    into it (a key holding ``\\x1e``, a value holding a line break, a terminal escape) written as escapes (``\\n``,
    ``\\x1e``, ``\\x1b``), so that nothing a value holds breaks the line or reaches the terminal raw (tabs kept)."""
    import unicodedata

    return "".join(c.encode("unicode_escape").decode("ascii")
                   if (unicodedata.category(c) == "Cc" and c != "\t") or c in "\u2028\u2029" else c for c in message)


class UserError(Exception):
    """A problem with what the user gave (a file, a key, a value); the message says what and where."""


class ConfigError(UserError, ValueError):
    """A configuration problem, with a message that names the file/key at fault."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used, with a message naming the file."""


class TaskDataError(UserError, ValueError):
    """A downstream task's data (directory, file, record) that cannot be used, with a message naming the
    file and line and the fix."""


class WriteError(UserError):
    """A file that could not be written (full disk, quota, read-only file system, permissions; ``atomic``): the
    message names the file, the bytes needed and free where it applies, the mount and the fix. ``errno``: the file
    system's error."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.errno = code


class NonFiniteLossError(UserError, RuntimeError):
    """Training produced a NaN/inf loss."""
