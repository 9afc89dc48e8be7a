"""Shared fixtures: small slices of the bundled real corpora, and the real configs shrunk for CPU."""

from __future__ import annotations

import lzma
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from minimodel.config.schema import ExperimentConfig
from minimodel.experiment import load_experiment

ROOT = Path(__file__).resolve().parent.parent
DEMO_CORPUS = ROOT / "data" / "demo" / "corpus"

# the stages' thread choice (minimodel/cluster/threads.py) follows the machine's load when nothing sets it; the suite's
# golden numerics must not, so its stages use what torch uses by default (tests/test_threads.py tests the choice)
os.environ.setdefault("OMP_NUM_THREADS", str(__import__("torch").get_num_threads()))
# precision auto (trainer.precision, evaluate.precision) on the CPU: full precision on every machine, not bf16 where this
# CPU runs it faster (minimodel/training/cpu_bf16.py; tests/test_precision_auto.py tests the choice)
os.environ.setdefault("MINIMODEL_CPU_BF16", "0")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(autouse=True)
def _no_inherited_wandb_service():
    """A test that starts wandb in this process leaves its service's address in ``WANDB_SERVICE``; processes a
    later test spawns with ``os.environ`` would then share that one service, which refuses a second start of a
    run id it still holds (a requeued stage). Each test starts from an environment without it."""
    yield
    os.environ.pop("WANDB_SERVICE", None)


@pytest.fixture(autouse=True)
def _sigint_as_it_was():
    """A test that leaves SIGINT ignored (Lightning ignores Ctrl-C after it stopped a stage) would hand SIG_IGN to
    every process a later test starts, where Python then installs no KeyboardInterrupt: put it back."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not before:
        signal.signal(signal.SIGINT, before)


@contextmanager
def module_scratch(request: pytest.FixtureRequest, factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A module fixture's temporary directory, removed when the fixture ends if no test failed meanwhile (kept to be
    looked at otherwise). pytest keeps a module's directories until the session ends; the SmolLM2 chains write GBs
    each (checkpoints of a 135M model), more than a CI machine's disk may hold beside the rest of the suite."""
    failed = request.session.testsfailed
    d = factory.mktemp(name)
    yield d
    if request.session.testsfailed == failed:
        shutil.rmtree(d, ignore_errors=True)


def real_text(lang: str, max_bytes: int) -> str:
    """The first ``max_bytes`` (cut at a document boundary) of the bundled corpus of ``lang``."""
    path = DEMO_CORPUS / f"{lang}.txt.xz"
    with lzma.open(path, "rt", encoding="utf-8") as f:
        text = f.read(max_bytes * 2)
    text = text[:max_bytes]
    cut = text.rfind("\n\n")
    return text[: cut + 1] if cut > 0 else text


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """en / de / tr corpora of ~400 KB of real text each (CC-100 layout)."""
    d = tmp_path_factory.mktemp("corpus")
    for lang in ("en", "de", "tr"):
        (d / f"{lang}.txt").write_text(real_text(lang, 400_000), encoding="utf-8")
    return d


TINY = ["data.vocab_size=1000", "data.seq_len=64", "data.val_blocks=8", "model.max_positions=66",
        "logging.wandb=disabled"]
"""The data / model / logging overrides every tiny run shares (a 1000-piece vocabulary, 64-token blocks)."""

TINY_STAGE = {"global_batch": 8, "micro_batch": 4, "warmup_updates": 2, "lr": 2e-3}
"""The optimiser settings most tiny stages use: ``stage_overrides(stages, **TINY_STAGE, updates=...)``."""

OPTIM_KEYS = ("updates", "warmup_updates", "global_batch", "micro_batch", "lr")
TRAINER_KEYS = ("ckpt_every", "ckpt_steps", "val_every", "log_every", "stop_at", "max_minutes", "seed")


def tiny_overrides(tmp: Path, corpus: Path, prepared: Path | None = None, runs_dir: Path | None = None) -> list[str]:
    """Paths (corpus, ``{prepared or tmp}/prepared``, ``runs_dir`` or ``tmp/runs``) followed by ``TINY``."""
    prepared_dir = (tmp if prepared is None else prepared) / "prepared"
    runs = tmp / "runs" if runs_dir is None else runs_dir
    return [f"data.corpus_dir={corpus}", f"data.prepared_dir={prepared_dir}", f"runs_dir={runs}", *TINY]


def _value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_value(v) for v in value) + "]"
    return str(value)


def stage_overrides(stages: Iterable[str], **values: object) -> list[str]:
    """``{stage}.optim.{key}=...`` / ``{stage}.trainer.{key}=...`` for every stage, in the order given:
    ``stage_overrides(["pretrain"], updates=6, log_every=1)`` -> ``["pretrain.optim.updates=6",
    "pretrain.trainer.log_every=1"]``."""
    unknown = sorted(set(values) - set(OPTIM_KEYS) - set(TRAINER_KEYS))
    if unknown:
        raise KeyError(f"stage_overrides: unknown key(s) {unknown}; known: {OPTIM_KEYS + TRAINER_KEYS}")
    return [f"{stage}.{'optim' if key in OPTIM_KEYS else 'trainer'}.{key}={_value(value)}"
            for stage in stages for key, value in values.items()]


def tiny_config(tmp: Path, corpus: Path, *overrides: str, experiment: str = "tiny",
                prepared: Path | None = None) -> ExperimentConfig:
    """experiments/tiny.yaml (or another experiment) shrunk to seconds on a CPU, writing under ``tmp``
    (reading prepared data from ``prepared/prepared`` when ``prepared`` is given)."""
    base = [*tiny_overrides(tmp, corpus, prepared), "data.num_workers=0"]
    return load_experiment(ROOT / "experiments" / f"{experiment}.yaml", [*base, *overrides])


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Path:
    """A session-wide prepared dir (tokenizers + shards for en, de, tr) built once; returns its parent."""
    from minimodel.data.prepare import prepare_language

    tmp = tmp_path_factory.mktemp("prep")
    cfg = tiny_config(tmp, corpus_dir)
    for lang in ("en", "de", "tr"):
        prepare_language(cfg, lang, progress=False)
    return tmp


@pytest.fixture(scope="session")
def tiny_finetuned(tmp_path_factory: pytest.TempPathFactory, prepared: Path, corpus_dir: Path):
    """A tiny BL_BASE: pretrained, adapted to German and Turkish, finetuned on the LibreOffice-help task (seeds 1
    and 2), evaluated. Returns (directory, config, the `minimodel` arguments that name it)."""
    from minimodel.stages.adapt import run_adapt
    from minimodel.stages.evaluate import run_evaluate
    from minimodel.stages.finetune import run_finetune
    from minimodel.stages.pretrain import run_pretrain

    tmp = tmp_path_factory.mktemp("export")
    extra = [*stage_overrides(["pretrain", "adapt"], updates=8, **TINY_STAGE, ckpt_every=4, val_every=8),
             "system=bl_base", "model.mini_heads=[]", "target_langs=[de,tr]",
             f"tasks.lohelp.source={ROOT / 'data/demo/task/lohelp'}", "tasks.lohelp.kind=local", "tasks.lohelp.max_train_examples=64", "tasks.lohelp.max_len=64",
             "finetune.tasks=[lohelp]", "finetune.seeds=[1,2]", "finetune.epochs=1", "finetune.batch_size=8",
             "finetune.micro_batch=8", "finetune.trainer.accelerator=cpu", "finetune.trainer.precision=32-true"]
    cfg = tiny_config(tmp, corpus_dir, *extra, prepared=prepared)
    run_pretrain(cfg, progress_bar=False)
    for lang in ("de", "tr"):
        run_adapt(tiny_config(tmp, corpus_dir, *extra, f"lang={lang}", prepared=prepared), progress_bar=False)
    for seed in (1, 2):
        run_finetune(cfg, "lohelp", seed, progress_bar=False)
    run_evaluate(cfg, progress=False)
    args = [str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(tmp, corpus_dir, prepared), *extra]
    return tmp, cfg, args


def small_task(task: Path, out: Path, lines: int) -> Path:
    """A local task (``task``: a directory of JSONL splits) with its whole English train file (the label set is the
    train file's) and the first ``lines`` records of its English and French dev and test files, written to ``out``."""
    out.mkdir(parents=True)
    shutil.copy(task / "train.jsonl", out / "train.jsonl")
    for name in ("dev.jsonl", "dev.fr.jsonl", "test.en.jsonl", "test.fr.jsonl"):
        with open(task / name, encoding="utf-8") as f:
            (out / name).write_text("".join(f.readline() for _ in range(lines)), encoding="utf-8")
    return out
