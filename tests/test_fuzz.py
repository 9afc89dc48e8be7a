"""Issue 54 part 6: property-based tests (hypothesis) at the boundaries that take a user's input: the config loader
(YAML files and command-line overrides, unknown keys, wrong types, huge and negative numbers, odd strings), launcher
files (``conf/launcher/*.yaml``) and result rows (``results.jsonl``). One property everywhere: the command, called
in-process (``minimodel.cli.main``), ends with exit 0, or with exit 2 and one line ``error: …`` naming the file or the
key; never a traceback, a hang (each example has a CPU-time and a wall-time limit) or unbounded memory (each example runs under a data
limit of 1 GiB above what the process holds).

Bounded: a minute or two in all by default, the same examples every run (derandomized). More, and random, with
``MINIMODEL_FUZZ_EXAMPLES=N`` (N examples per test; docs/testing.md). Each case it found is a named regression test
at the end of this file. (Hugging Face config.json fields and GGUF bytes are fuzzed elsewhere.)"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from minimodel.cli import main  # noqa: E402
from minimodel.errors import one_line  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

TINY = ROOT / "experiments" / "tiny.yaml"
LOCAL = ROOT / "conf" / "launcher" / "local.yaml"
EXAMPLES = int(os.environ.get("MINIMODEL_FUZZ_EXAMPLES", "0") or 0)
CPU_LIMIT_S = 60  # one example's CPU time (a command on a tiny experiment takes a few seconds at most)
WALL_LIMIT_S = 600  # and its wall time, however loaded the machine
MEMORY_HEADROOM = 1 << 30


def fuzz(default: int) -> settings:
    """``default`` examples, the same every run; ``MINIMODEL_FUZZ_EXAMPLES=N``: N random ones."""
    return settings(max_examples=EXAMPLES or default, deadline=None, derandomize=not EXAMPLES, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True,
                    phases=[p for p in Phase if p is not Phase.explain])  # explain traces every line: too slow here


# ------------------------------------------------------------------------------------ the property


class Hang(BaseException):
    """An example ran past its CPU or wall-time limit (a BaseException: no ``except Exception`` of the code under test eats it)."""


def _vm_data() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def bounded():
    """For one example: a limit on the CPU time it spends (``CPU_LIMIT_S``, ITIMER_PROF: a loaded machine does not
    make it fire), one on its wall time (``WALL_LIMIT_S``: a wait that spends no CPU), and a data limit (RLIMIT_DATA:
    the heap and anonymous maps) of ``MEMORY_HEADROOM`` above what this process holds."""
    def stop(*_: Any) -> None:
        raise Hang(f"still running after {CPU_LIMIT_S} s of CPU or {WALL_LIMIT_S} s")

    handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGALRM, signal.SIGPROF)}
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _vm_data() + MEMORY_HEADROOM
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    signal.setitimer(signal.ITIMER_PROF, CPU_LIMIT_S)
    signal.alarm(WALL_LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def ends_cleanly(argv: list[str], capsys: pytest.CaptureFixture, names: list[str]) -> int:
    """Run ``minimodel argv`` in this process: exit 0, or exit 2 with one ``error:`` line that names one of ``names``
    (the file or key the input was in); any exception (a traceback), a hang or a MemoryError fails the example."""
    capsys.readouterr()
    with bounded():
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse: a malformed command line (usage, then one error line), exit 2
            rc = e.code if isinstance(e.code, int) else 2
    err = capsys.readouterr().err
    assert rc in (0, 2), f"minimodel {argv}: exit {rc}\n{err}"
    assert "Traceback" not in err, err
    if rc == 2:
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1, f"minimodel {argv}: {len(errors)} error lines\n{err}"
        assert any(n and n in errors[0] for n in names), f"the error names none of {names}: {errors[0]}"
    return rc


# ------------------------------------------------------------------------------------ strategies

ODD = ["", " ", "???", "${oc.env:HOME}", "${nosuch.key}", "${", "\n", "a\nb", "\t", "\x00", "\x1b[31m", "[", "{", "}",
       "]", ":", "- a", "*a", "&a", "!!python/object/apply:os.system ['true']", "~", "null", "1e400", "-1e400",
       "0x10", "-0", "nan", ".nan", ".inf", "-.inf", "'", '"', "\\", "é", "\U0001d518", "../..", "/", "a" * 300,
       "1:2:3", "24:00:00", "99-99:99:99", "true", "yes", "off", "[1,", "{a: 1", "a=b", "==", "%"]
NUMBERS = [0, -1, 1, 2, 2**31, -2**31, 2**63, 2**64, 10**9, 10**18, 10**30, -10**30]

scalars = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from(NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=24),
    st.sampled_from(ODD),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=6), scalars, max_size=2))


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {prefix: d} if prefix else {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _known_keys() -> list[str]:
    from omegaconf import OmegaConf

    from minimodel.config.schema import ExperimentConfig

    return sorted(_flat(OmegaConf.to_container(OmegaConf.structured(ExperimentConfig))))


KNOWN = _known_keys()
unknown_keys = st.one_of(st.text(min_size=1, max_size=12),
                         st.sampled_from(["nosuch", "model.nosuch", "pretrain.optim.lrate", "a..b", ".x", "x.",
                                          "tasks.new.kind", "tasks.*.lr", "sweep.0", "extends", "defaults",
                                          "model.mini_heads.0", "_target_", "é"]))
keys = st.one_of(st.sampled_from(KNOWN), st.sampled_from(KNOWN), unknown_keys)


def _render(value: Any) -> str:
    """A value as a user would type it after ``key=`` (YAML flow style), or as the raw odd string."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


override = st.one_of(
    st.builds(lambda k, v: f"{k}={_render(v)}", keys, values),
    st.builds(lambda k: f"+{k}=1", keys),
    st.builds(lambda k: f"~{k}", keys),
    st.sampled_from(["=1", "novalue", "-x", "--nosuch", "lang=", "task=", "seed=x", "step=1"]),
)


def _names(path: Path, overrides: list[str]) -> list[str]:
    """What an error about ``path`` or ``overrides`` may name: the file, a key (or its section) or the override."""
    out = [path.name, str(path)]
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        out += [o[:40], key, *(key.split(".")[:1])]
    return [m for n in out if n for m in (n, one_line(n))]  # an error writes control characters as escapes


# ------------------------------------------------------------------------------------ the config loader


@fuzz(60)
@given(overrides=st.lists(override, min_size=1, max_size=3))
def test_command_line_overrides(overrides, tmp_path_factory, capsys):
    runs = tmp_path_factory.mktemp("runs")
    ends_cleanly(["flops", str(TINY), f"runs_dir={runs}", *overrides], capsys, _names(TINY, overrides))


def _nest(flat: dict[str, Any]) -> dict:
    out: dict = {}
    for key, value in flat.items():
        parts = [p for p in key.split(".") if p] or ["x"]
        node = out
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    return out


@fuzz(60)
@given(entries=st.dictionaries(keys, values, min_size=1, max_size=4),
       raw=st.one_of(st.none(), st.text(max_size=80), st.sampled_from(["[1, 2]", "- a\n- b", "3", "a: [", "\x00",
                                                                        "extends: nosuch.yaml", "extends: 3",
                                                                        "extends: [a]", "defaults: 3",
                                                                        "defaults:\n  - model: nosuch", "null"])))
def test_experiment_files(entries, raw, tmp_path_factory, capsys):
    """An experiment file extending tiny.yaml with fuzzed keys and values, or a file of arbitrary text."""
    d = tmp_path_factory.mktemp("exp")
    exp = d / "fuzzed.yaml"
    if raw is None:
        exp.write_text(f"extends: {TINY}\n" + yaml.safe_dump(_nest(entries), allow_unicode=True), encoding="utf-8")
        names = _names(exp, [f"{k}=" for k in entries])
    else:
        exp.write_text(raw, encoding="utf-8")
        names = [exp.name, "extends", "defaults", "nosuch"]
    ends_cleanly(["flops", str(exp), f"runs_dir={d / 'runs'}"], capsys, names)


# ------------------------------------------------------------------------------------ launcher files

LAUNCHER = yaml.safe_load(LOCAL.read_text())
LAUNCHER_KEYS = sorted(k for k in _flat(LAUNCHER) if k)


@fuzz(40)
@given(changes=st.dictionaries(st.one_of(st.sampled_from(LAUNCHER_KEYS), unknown_keys), values, min_size=1,
                               max_size=3),
       drop=st.lists(st.sampled_from(LAUNCHER_KEYS), max_size=2), command=st.sampled_from(["plan", "submit"]))
def test_launcher_files(changes, drop, command, tmp_path_factory, capsys):
    d = tmp_path_factory.mktemp("launcher")
    flat = {k: v for k, v in _flat(LAUNCHER).items() if not isinstance(v, dict)}
    for k in drop:
        flat = {key: v for key, v in flat.items() if key != k and not key.startswith(k + ".")}
    flat.update(changes)
    path = d / "fuzzed.yaml"
    path.write_text(yaml.safe_dump(_nest(flat), allow_unicode=True), encoding="utf-8")
    argv = [command, str(TINY), f"runs_dir={d / 'runs'}", "--launcher", str(path)]
    if command == "submit":
        argv.append("--dry-run")
    ends_cleanly(argv, capsys, [path.name, str(path)])


# ------------------------------------------------------------------------------------ result rows

ROW = {"system": "minijoint", "body": "primary", "task": "lohelp", "lang": "de", "seed": 1, "step": 4, "flops": 1e9,
       "v100_days": 1e-6, "pretrain_seed": 1, "finetune_id": "32a5e0d4f12816e2", "adapt_id": "0123456789abcdef",
       "split": "test", "metric": "accuracy", "value": 55.0}
LOCAL_TASK = ["finetune.tasks=[lohelp]", "tasks.lohelp.kind=local", f"tasks.lohelp.source={ROOT / 'data/demo/task/lohelp'}"]


def _rows() -> st.SearchStrategy[str]:
    """A results.jsonl line: a good row, one with fields changed, dropped or added, other JSON, or not JSON."""
    good = [dict(ROW, lang=lang, step=step, seed=seed) for lang in ("de", "tr", "en") for step in (0, 4)
            for seed in (1, 2)]
    changed = st.builds(lambda r, k, v: json.dumps({**r, k: v}, default=str), st.sampled_from(good),
                        st.one_of(st.sampled_from(sorted(ROW)), st.text(max_size=8)), values)
    dropped = st.builds(lambda r, k: json.dumps({f: v for f, v in r.items() if f != k}), st.sampled_from(good),
                        st.sampled_from(sorted(ROW)))
    other = st.builds(json.dumps, values)
    text = st.one_of(st.text(max_size=60), st.sampled_from(["{", '{"system": ', "NaN", "[]", "", "\x00\x01",
                                                            json.dumps(ROW)[:-5]]))
    return st.one_of(st.builds(json.dumps, st.sampled_from(good)), changed, dropped, other, text)


@fuzz(8)
@given(lines=st.lists(_rows(), min_size=1, max_size=8), cut=st.booleans())
def test_result_rows(lines, cut, tmp_path_factory, capsys):
    runs = tmp_path_factory.mktemp("results")
    path = runs / "tiny" / "minijoint" / "results.jsonl"
    path.parent.mkdir(parents=True)
    body = "\n".join(lines) + ("" if cut else "\n")
    path.write_bytes(body.encode("utf-8", "surrogatepass"))
    ends_cleanly(["report", str(TINY), f"runs_dir={runs}", *LOCAL_TASK, "--no-progress"], capsys,
                 [path.name, str(path)])


# ------------------------------------------------------------------------------------ the cases it found


def test_a_key_holding_a_line_separator_gives_one_error_line(capsys):
    """Found by test_command_line_overrides: `+\x1e=1` (a key holding ASCII's record separator, a line break to
    Python's splitlines and to some terminals) was echoed raw, so the error took two lines. Control characters and
    line separators in an error are now written as escapes."""
    for bad in ("+\x1e=1", "name=a\nb", "name=a\u2028b", "x\x1b[2J=1"):
        assert main(["flops", str(TINY), bad]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "error:" in err and one_line(bad) in err, err
