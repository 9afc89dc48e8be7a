"""Errors a user can cause and fix, and the exit codes of the ``minimodel`` command.

Every module raises a subclass of ``UserError`` for bad input (config, corpus, tokenizer, shards,
checkpoints, embeddings, SLURM); the command line prints its message and exits with ``ERROR_EXIT``
without a traceback. Nothing here imports torch, so light commands stay light."""

from __future__ import annotations

ERROR_EXIT = 2  # bad input: the message names the file or key at fault
REQUEUE_EXIT = 3  # stopped early (signal, wall-time cap) after writing a checkpoint: rerun or requeue to resume
STOPPED_EXIT = 4  # stopped at trainer.stop_at, as asked, after a checkpoint: not finished, so nothing may build on it


class UserError(Exception):
    """A problem with what the user gave (a file, a key, a value); the message says what and where."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used, with a message naming the file."""


class TaskDataError(UserError, ValueError):
    """A downstream task's data (directory, file, record) that cannot be used, with a message naming the
    file and line and the fix."""


class NonFiniteLossError(UserError, RuntimeError):
    """Training produced a NaN/inf loss."""
