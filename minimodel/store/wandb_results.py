"""Results on wandb: every result row as `minimodel evaluate` writes it, and the report's tables and plots.

Runs, in the experiment's project (``logging.project``, default ``minimodel-{name}``):

* one run per system, task, language and finetuning seed, named ``{system}:{task}:{lang}:s{seed}``, in the group
  ``{system}``: ``{task}/{lang}/{metric}`` (the zero-shot score) with ``{task}/{lang}/v100_days`` (its cumulative
  step-2 compute, the default x-axis), ``{task}/{lang}/adapt_step`` and ``{task}/{lang}/flops``; a line plot of
  ``{task}/{lang}/accuracy`` over runs grouped by group is the paper's Figure 3, one line per system with a band
  over the seeds. English scores (Table 5) go to the summary of the run ``{system}:{task}:en:s{seed}``; each run
  ends with a ``results`` Table of its rows. (Per language, so that the evaluations of one language, one job or
  one GPU each, never share a run.)
* ``report``: every table of the Markdown report (Tables 2-5, time to target, speedups, claims) as a wandb Table,
  every plot as an image, every result row as a Table, and report.md itself.

Modes come from ``logging.wandb``: ``disabled`` logs nothing, ``offline`` writes the runs under the results'
directory (``wandb sync`` uploads them later) and never touches the network, ``auto`` is offline unless an API
key is configured. ``read_history`` reads an offline run's logged values back from its transaction log."""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from minimodel.config.schema import ExperimentConfig
from minimodel.log import get_logger

log = get_logger(__name__)


def project(cfg: ExperimentConfig) -> str:
    return cfg.logging.project or f"minimodel-{cfg.name}"


def wandb_mode(requested: str) -> str:
    """auto -> online only when an API key is configured (env or netrc), else offline."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "online"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


def _mode(cfg: ExperimentConfig) -> str:
    return wandb_mode(cfg.logging.wandb)


def _init(cfg: ExperimentConfig, directory: Path, key: str, name: str, group: str, job_type: str) -> Any:
    import wandb

    directory.mkdir(parents=True, exist_ok=True)
    run_id = hashlib.sha1(f"{directory.resolve()}:{key}".encode()).hexdigest()[:12]
    return wandb.init(project=project(cfg), entity=cfg.logging.entity or None, group=group, name=name,
                      job_type=job_type, id=run_id, resume="allow", dir=str(directory), mode=_mode(cfg),
                      reinit="finish_previous", settings=wandb.Settings(silent=True, console="off"),
                      config={"experiment": cfg.name, "system": group})


class ResultsLogger:
    """Logs result rows as evaluation writes them (one wandb run per system, task, language and seed; see the
    module)."""

    def __init__(self, cfg: ExperimentConfig, system: str, directory: Path) -> None:
        self.cfg, self.system, self.directory = cfg, system, directory
        self.enabled = _mode(cfg) != "disabled"
        self.run: Any = None
        self.key: tuple[str, str, int] | None = None
        self.rows: list[dict] = []
        self.defined: set[str] = set()

    def _open(self, task: str, lang: str, seed: int) -> Any:
        if self.key != (task, lang, seed):
            self.close()
            name = f"{self.system}:{task}:{lang}:s{seed}"
            self.run = _init(self.cfg, self.directory, name, name, self.system, "evaluate")
            self.key, self.defined = (task, lang, seed), set()
        return self.run

    def log(self, rows: list[dict]) -> None:
        """The rows of one evaluation (same system, task, seed, language and step; one row per metric)."""
        if not self.enabled or not rows:
            return
        first = rows[0]
        run = self._open(first["task"], first["lang"], first["seed"])
        prefix = f"{first['task']}/{first['lang']}"
        if first["step"] >= 0 and first["split"] != "test":  # evaluate.split=dev: curves of their own
            prefix += f"/{first['split']}"
        if first["step"] < 0:  # English scores of the finetuned model (Table 5)
            for r in rows:
                run.summary[f"{prefix}/{r['body']}/{r['split']}/{r['metric']}"] = r["value"]
        else:
            for r in rows:
                metric = f"{prefix}/{r['metric']}"
                if metric not in self.defined:
                    run.define_metric(metric, step_metric=f"{prefix}/v100_days")
                    self.defined.add(metric)
            run.log({f"{prefix}/v100_days": first["v100_days"], f"{prefix}/adapt_step": first["step"],
                     f"{prefix}/flops": first["flops"], **{f"{prefix}/{r['metric']}": r["value"] for r in rows}})
        self.rows += rows

    def close(self) -> None:
        if self.run is not None:
            import wandb

            if self.rows:
                columns = sorted({k for r in self.rows for k in r})
                self.run.log({"results": wandb.Table(columns=columns, data=[[r.get(c) for c in columns]
                                                                           for r in self.rows])})
            self.run.finish()
        self.run, self.key, self.rows = None, None, []


def markdown_tables(text: str) -> Iterator[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every Markdown table in ``text``; the title is the section's ``##`` heading, with
    the bold line (the task) above the table when there is one: ``Performance at training completion (Table 2) -
    lohelp (accuracy)``."""
    section, sub, lines = "", "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("#"):
            section, sub = line.lstrip("#").strip(), ""
        elif line.startswith("**"):
            sub = line.replace("**", "").strip()
        if line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|[\s:|-]+\|", lines[i + 1].strip()):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                rows.append((cells + [""] * len(header))[:len(header)])
                i += 1
            yield " - ".join(t for t in (section, sub) if t) or "table", header, rows
            continue
        i += 1


def log_report(cfg: ExperimentConfig, report: Path, rows: list[dict]) -> None:
    """The report's tables, plots, rows and Markdown to the experiment's ``report`` run (nothing when disabled)."""
    if _mode(cfg) == "disabled":
        return
    import wandb

    run = _init(cfg, report.parent, "report", "report", "report", "report")
    text = report.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    payload: dict[str, Any] = {}
    for title, header, body in markdown_tables(text):
        slug = re.sub(r"[^A-Za-z0-9]+", "_", title).strip("_")[:80] or "table"
        seen[slug] = seen.get(slug, 0) + 1
        payload[f"tables/{slug}" + (f"_{seen[slug]}" if seen[slug] > 1 else "")] = wandb.Table(columns=header, data=body)
    for png in sorted((report.parent / "plots").glob("*.png")):
        payload[f"plots/{png.stem}"] = wandb.Image(str(png))
    if rows:
        columns = sorted({k for r in rows for k in r})
        payload["results"] = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
    run.log(payload)
    run.save(str(report), base_path=str(report.parent), policy="now")
    run.finish()
    log.info(f"report logged to wandb ({_mode(cfg)}): {len(payload)} tables and plots, project {project(cfg)}")


# ------------------------------------------------------------------------------------ reading an offline run

_BLOCK, _HEADER = 32768, 7  # wandb's transaction log: a LevelDB-style log of protobuf Records after a 7-byte header
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a wandb transaction log")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a record header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        chunk, pos = data[pos + _HEADER:pos + _HEADER + length], pos + _HEADER + length
        if kind and (len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc):
            break  # a record wandb's service is still writing (read while the run is finishing): not there yet
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
        else:  # zeros: the end of what was written
            break


def read_history(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The history rows (``run.log`` calls, in order) and the final summary of an offline run directory
    (``.../wandb/offline-run-*``), read from its ``run-*.wandb`` transaction log."""
    from wandb.proto import wandb_internal_pb2 as pb

    def key(item: Any) -> str:
        return "/".join(item.nested_key) if item.nested_key else item.key

    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for path in sorted(Path(run_dir).glob("run-*.wandb")):
        for raw in _records(path):
            record = pb.Record()
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "history":
                history.append({key(i): json.loads(i.value_json) for i in record.history.item})
            elif kind == "summary":
                summary.update({key(i): json.loads(i.value_json) for i in record.summary.update})
    return history, summary


def finished(run_dir: Path) -> bool:
    """Whether an offline run directory's transaction log is whole: its last record, the run's exit, is written.
    ``run.finish`` can return before wandb's service has written it on a busy machine."""
    from wandb.proto import wandb_internal_pb2 as pb

    logs = list(Path(run_dir).glob("run-*.wandb"))
    for path in logs:
        kinds = []
        for raw in _records(path):
            record = pb.Record()
            record.ParseFromString(raw)
            kinds.append(record.WhichOneof("record_type"))
        if "exit" not in kinds:
            return False
    return bool(logs)


def offline_runs(directory: Path) -> dict[str, list[Path]]:
    """The offline runs written under ``directory`` by name (``{system}:{task}:{lang}:s{seed}``, ``report``): a resumed run
    has one ``offline-run-*`` directory per process that logged to it, oldest first."""
    out: dict[str, list[Path]] = {}
    for run_dir in sorted(Path(directory).glob("wandb/offline-run-*")):
        for path in run_dir.glob("run-*.wandb"):
            out.setdefault(_run_name(path) or run_dir.name, []).append(run_dir)
    return out


def _run_name(path: Path) -> str:
    from wandb.proto import wandb_internal_pb2 as pb

    for raw in _records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "run":
            return record.run.display_name
    return ""
