"""Inputs longer than a task's ``max_len``: how many examples of one task file featurisation cut (``Truncation``).

Said once per file where features are built (finetuning: its English train, dev and test files; evaluation: each
language's test, or dev, file), and recorded for the report, which is built from files, not from those runs:
finetuning records its files in its ``done.json`` (``truncation``); evaluation writes one small JSON per file it
featurised, and copies the finetuning's, under ``{system}/truncation/{task}/{split}.{lang}.json``
(``Layout.truncation``). The counts are those featurisation made (``TaskData.featurise``). Classification only: a QA
example is cut into windows over its context, which lose nothing. Nothing here imports torch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from minimodel.log import get_logger
from minimodel.store import atomic

log = get_logger(__name__)


@dataclass(frozen=True)
class Truncation:
    """``truncated`` of the ``examples`` of one file (``split`` in ``lang``) were longer than ``max_len`` tokens."""

    task: str
    split: str  # train, dev or test
    lang: str
    file: str  # "" when the records came from the Hugging Face hub
    max_len: int
    examples: int
    truncated: int

    @property
    def name(self) -> str:
        """``train (en)``, ``test de``: how the log and the report name the file."""
        return f"train ({self.lang})" if self.split == "train" else f"{self.split} {self.lang}"

    @property
    def share(self) -> float:
        return self.truncated / self.examples if self.examples else 0.0

    def counted(self) -> str:
        """``30% (900 of 3,000)``."""
        return f"{self.share:.0%} ({self.truncated:,} of {self.examples:,})"

    def message(self) -> str:
        where = f" ({self.file})" if self.file else ""
        return (f"tasks.{self.task}: {self.name}{where}: {self.counted()} examples are longer than max_len "
                f"{self.max_len} tokens and were truncated to it (the longer text loses its last tokens)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Truncation:
        return cls(str(d["task"]), str(d["split"]), str(d["lang"]), str(d["file"]), int(d["max_len"]),
                   int(d["examples"]), int(d["truncated"]))


def say(t: Truncation) -> None:
    """The log line of a file with truncated examples (a warning; nothing when none was cut)."""
    if t.truncated:
        log.warning(t.message())


def write(path: Path, t: Truncation) -> None:
    atomic.make_dirs(path.parent)
    atomic.write_json(path, t.to_dict())


def read_dir(system_dir: Path) -> list[Truncation]:
    """Every record under ``{system_dir}/truncation/`` (a file that is not one is skipped with a warning)."""
    out = []
    for path in sorted((system_dir / "truncation").glob("*/*.json")):
        try:
            out.append(Truncation.from_dict(atomic.loads(path.read_text(encoding="utf-8"))))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            log.warning(f"{path}: not a truncation record ({e}); the report leaves it out")
    return out


def _line(records: Sequence[Truncation]) -> str:
    lens = sorted({t.max_len for t in records})
    if len(lens) == 1:
        return f"truncated to max_len {lens[0]}: " + ", ".join(f"{t.name} {t.counted()}" for t in records)
    return "truncated: " + ", ".join(f"{t.name} {t.counted()} (max_len {t.max_len})" for t in records)


SECTION = ["## Inputs longer than max_len", "",
           "Examples whose tokens (with the special tokens) were more than the task's max_len, cut to fit (the longer "
           "text loses its last tokens): per file, the share and count featurisation cut (finetuning: the English "
           "files; evaluation: each language's file). QA tasks are not listed: their windows cover the whole context.",
           ""]


def report_section(by_system: Mapping[str, Iterable[Truncation]], tasks: Sequence[str],
                   langs: Mapping[str, Sequence[str]], split: str) -> list[str]:
    """The report's section (``SECTION``), one Markdown list item per task (per system where systems' counts
    differ): ``- mytask: truncated to max_len 64: train (en) 30% (900 of 3,000), test en 31% (...), test tr 38%
    (...)``. Files: the training file, and the ``split`` files of English and of the task's languages in ``langs``
    (those with results); [] with no record."""
    order = {"train": 0, "dev": 1, "test": 1}
    lines = []
    for task in tasks:
        wanted = ["en", *(lang for lang in langs.get(task, ()) if lang != "en")]
        per_system: dict[str, tuple[Truncation, ...]] = {}
        for system, records in by_system.items():
            kept = [t for t in records if t.task == task and t.split in ("train", split) and t.lang in wanted]
            kept.sort(key=lambda t: (order[t.split], wanted.index(t.lang)))
            if kept:
                per_system[system] = tuple(kept)
        if len(set(per_system.values())) == 1:
            lines.append(f"- {task}: {_line(next(iter(per_system.values())))}")
        else:
            lines += [f"- {task} ({system}): {_line(records)}" for system, records in per_system.items()]
    return [*SECTION, *lines, ""] if lines else []
