"""``precision: auto`` (issue 55, part 2): one resolver for training stages and evaluation
(``device.resolve_precision``), each device branch taken on the CPU: a CUDA card with and without native bf16
(pretended), a CPU with AMX (pretended ``/proc/cpuinfo``), a CPU without AMX where a (pretended) matmul measurement is
slow or fast in bf16; the measurement cached per machine and reused; a stage run records what auto chose and a resume
keeps it; the identity of a run made with auto."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from minimodel.cluster.memory import StageModel, act_bytes
from minimodel.config.load import save_config
from minimodel.errors import ConfigError, UserError
from minimodel.stages.pretrain import run_pretrain
from minimodel.store.identity import check_finished, started_precision
from minimodel.store.layout import CONFIG, PRECISION, read_precision, write_precision
from minimodel.training import cpu_bf16
from minimodel.training import device as dev
from minimodel.training.cpu_bf16 import Measurement
from minimodel.training.runner import Outcome
from tests.conftest import TINY_STAGE, stage_overrides, tiny_config
from tests.test_gpu_path import pretend_cuda

CPU = torch.device("cpu")
SLOW = Measurement(fp32=190.0, bf16=90.0)  # this VM's AMD EPYC as issue 55 measured it: bf16 0.47x fp32
FAST = Measurement(fp32=100.0, bf16=210.0)


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict]:
    """A pretended CPU: ``machine["flags"]`` its /proc/cpuinfo flags, ``machine["rates"]`` what a measurement finds;
    ``machine["measured"]`` counts the measurements. The cache in ``tmp_path``, the suite's MINIMODEL_CPU_BF16 unset."""
    state: dict = {"model": "Pretend CPU 9000", "flags": {"avx512f", "avx512_bf16"}, "rates": SLOW, "measured": 0}

    def measure() -> Measurement:
        state["measured"] += 1
        return state["rates"]

    monkeypatch.delenv(cpu_bf16.ANSWER_ENV, raising=False)
    monkeypatch.setenv(cpu_bf16.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_bf16, "cpu_info", lambda path=cpu_bf16.CPUINFO: (state["model"], frozenset(state["flags"])))
    monkeypatch.setattr(cpu_bf16, "measure", measure)
    monkeypatch.setattr(dev, "_SAID", set())
    yield state


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """INFO lines of the ``minimodel`` logger (which stops propagating once the CLI has set it up)."""
    logger = logging.getLogger("minimodel")
    propagate = logger.propagate
    logger.addHandler(caplog.handler)
    logger.propagate = False  # each line once, whether or not the CLI has set it up in this process
    caplog.set_level(logging.INFO, logger="minimodel")
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.propagate = propagate


# ------------------------------------------------------------------------------------------ the CPU


def test_cpuinfo_is_read_for_the_model_and_its_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                    "flags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n\nprocessor\t: 1\nmodel name\t: other\n")
    model, flags = cpu_bf16.cpu_info(info)
    assert model == "Intel(R) Xeon(R) Platinum 8480+" and {"amx_bf16", "amx_tile", "avx512f"} <= flags
    assert cpu_bf16.cpu_info(tmp_path / "absent") == ("", frozenset())


def test_a_cpu_with_amx_runs_auto_in_bf16_without_measuring(machine):
    machine["flags"] |= {"amx_bf16", "amx_tile"}
    choice = dev.resolve_precision(CPU)
    assert choice.precision == "bf16-mixed" and "AMX" in choice.why
    assert machine["measured"] == 0


def test_a_cpu_without_amx_where_bf16_measures_slow_runs_auto_in_fp32(machine, tmp_path):
    choice = dev.resolve_precision(CPU)
    assert choice.precision == "32-true"
    assert choice.why.startswith("CPU without AMX; bf16 matmul 0.47x fp32 (90 against 190 GFLOP/s")
    assert f"measured, cached in {tmp_path / 'cache' / 'cpu_bf16.json'}" in choice.why
    assert choice.line("adapt.trainer.precision").startswith("adapt.trainer.precision: auto -> 32-true: CPU without")


def test_a_cpu_without_amx_where_bf16_measures_fast_runs_auto_in_bf16(machine):
    machine["rates"] = FAST
    assert dev.resolve_precision(CPU).precision == "bf16-mixed"
    machine["rates"] = Measurement(fp32=100.0, bf16=115.0)  # faster, but under SPEEDUP (1.2x): not worth it
    machine["model"] = "Another CPU"  # another cache key: measured again
    assert dev.resolve_precision(CPU).precision == "32-true"


def test_the_measurement_is_cached_per_machine_and_reused(machine, tmp_path):
    first = dev.resolve_precision(CPU)
    assert machine["measured"] == 1
    machine["rates"] = FAST  # were it measured again, bf16 would win
    again = dev.resolve_precision(CPU)
    assert machine["measured"] == 1 and again.precision == "32-true"
    assert f"cached in {tmp_path / 'cache' / 'cpu_bf16.json'}" in again.why and "measured" not in again.why.split(";")[-1]
    cache = json.loads((tmp_path / "cache" / "cpu_bf16.json").read_text())
    key = f"Pretend CPU 9000 | torch {torch.__version__} | {torch.get_num_threads()} threads"
    assert list(cache) == [key] and cache[key]["fp32_gflops"] == 190.0 and cache[key]["bf16_gflops"] == 90.0
    assert first.precision == "32-true"


def test_a_damaged_or_unwritable_cache_costs_a_measurement_only(machine, tmp_path, monkeypatch):
    path = tmp_path / "cache" / "cpu_bf16.json"
    path.parent.mkdir()
    path.write_text("{not json")
    assert dev.resolve_precision(CPU).precision == "32-true" and machine["measured"] == 1
    assert json.loads(path.read_text())  # rewritten whole
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    machine["model"] = "Uncached CPU"
    monkeypatch.setenv(cpu_bf16.CACHE_ENV, str(blocked / "sub"))  # its parent is a file: nothing can be written there
    choice = dev.resolve_precision(CPU)
    assert choice.precision == "32-true" and "measured; not cached:" in choice.why and machine["measured"] == 2


def test_the_environment_can_give_the_cpu_answer(machine, monkeypatch):
    monkeypatch.setenv(cpu_bf16.ANSWER_ENV, "1")
    choice = dev.resolve_precision(CPU)
    assert choice == dev.PrecisionChoice("bf16-mixed", "MINIMODEL_CPU_BF16=1") and machine["measured"] == 0
    monkeypatch.setenv(cpu_bf16.ANSWER_ENV, "yes")
    with pytest.raises(UserError, match=r"MINIMODEL_CPU_BF16 must be 1 .* or 0 .*got 'yes'"):
        dev.resolve_precision(CPU)


def test_the_real_measurement_is_quick_and_positive():
    m = cpu_bf16.measure(size=128, rounds=2, per_round=2)
    assert m.fp32 > 0 and m.bf16 > 0 and m.speedup == m.bf16 / m.fp32


# ------------------------------------------------------------------------------------------ other devices


def test_cuda_takes_bf16_where_native_and_fp16_where_not(machine, monkeypatch):
    pretend_cuda(monkeypatch, capability=(9, 0), name="NVIDIA H100 80GB HBM3")
    device = dev.stage_device("gpu")
    assert device == torch.device("cuda", 0)
    choice = dev.resolve_precision(device)
    assert choice == dev.PrecisionChoice("bf16-mixed", "NVIDIA H100 80GB HBM3 (compute capability 9.0) has native "
                                                       "bfloat16")
    assert dev.autocast_dtype(device, "auto") is torch.bfloat16
    pretend_cuda(monkeypatch, capability=(7, 0), name="Tesla V100-SXM2-32GB")
    choice = dev.resolve_precision(dev.stage_device("auto"))
    assert choice.precision == "16-mixed" and "Tesla V100-SXM2-32GB (compute capability 7.0) has no native" in choice.why
    dev.check_precision(choice.precision, "gpu", "adapt.trainer.precision")  # what auto chose runs there
    assert dev.autocast_dtype(torch.device("cuda", 0), "auto") is torch.float16
    assert machine["measured"] == 0
    assert dev.stage_device("cpu") == CPU  # a CPU stage on a GPU machine: the CPU's rule
    assert dev.resolve_precision(dev.stage_device("cpu")).precision == "32-true" and machine["measured"] == 1


def test_an_accelerator_without_a_rule_runs_auto_in_fp32():
    assert dev.stage_device("mps") is None
    assert dev.resolve_precision(None).precision == "32-true"


def test_evaluation_resolves_auto_as_training_does_and_says_so_once(machine, said):
    assert dev.autocast_dtype(CPU, "auto") is None
    machine["rates"], machine["model"] = FAST, "Fast CPU"
    assert dev.autocast_dtype(CPU, "auto") is torch.bfloat16
    assert dev.autocast_dtype(CPU, "auto") is torch.bfloat16
    assert dev.autocast_dtype(CPU, "32-true") is None  # as configured: no resolution
    lines = [r.getMessage() for r in said.records if r.getMessage().startswith("evaluate.precision: auto")]
    assert [line.split(":")[1].strip() for line in lines] == ["auto -> 32-true", "auto -> bf16-mixed"]


def test_the_memory_plan_reads_auto_as_the_device_resolves_it(machine):
    sm = StageModel("adapt", "x", 0, 0, 0, 0, 0, "none", 0, "train", 100, 64, 4, 4, "auto")
    assert act_bytes(sm) == 2  # the plan is for GPUs: bf16 or fp16
    assert act_bytes(sm, "cpu") == 4
    machine["rates"], machine["model"] = FAST, "Fast CPU"
    assert act_bytes(sm, "cpu") == 2


# ------------------------------------------------------------------------------------------ configuration


def test_auto_is_accepted_at_load_and_a_bad_value_names_its_key(tmp_path, corpus_dir):
    cfg = tiny_config(tmp_path, corpus_dir, "adapt.trainer.precision=auto", "finetune.trainer.precision=auto")
    assert (cfg.adapt.trainer.precision, cfg.finetune.trainer.precision) == ("auto", "auto")
    with pytest.raises(ConfigError, match=r"bridge\.trainer\.precision must be auto or one of 32-true, bf16-mixed, "
                                          r"16-mixed, got 'bf16'"):
        tiny_config(tmp_path, corpus_dir, "bridge.trainer.precision=bf16")
    with pytest.raises(ConfigError, match=r"evaluate\.precision must be auto or one of .*got 'fp32'"):
        tiny_config(tmp_path, corpus_dir, "evaluate.precision=fp32")


def test_a_run_made_in_a_precision_is_the_result_of_auto(tmp_path, corpus_dir):
    """The identity keeps the configured value; ``auto`` accepts a run made in any precision, and a run made with
    auto is compared by the precision it chose (``precision.json``)."""
    run = tmp_path / "run"
    run.mkdir()
    pinned = tiny_config(tmp_path, corpus_dir, "pretrain.trainer.precision=bf16-mixed")
    auto = tiny_config(tmp_path, corpus_dir, "pretrain.trainer.precision=auto")
    save_config(pinned, run / CONFIG)
    check_finished(auto, "pretrain", run)  # made in bf16 before the config said auto: still its result
    assert started_precision(run, "pretrain") == ("bf16-mixed", run / CONFIG)  # and resumed in bf16
    save_config(auto, run / CONFIG)
    assert started_precision(run, "pretrain") is None  # auto, and no record of what it chose
    write_precision(run, "auto", "32-true", "CPU without AMX")
    assert started_precision(run, "pretrain") == ("32-true", run / PRECISION)
    check_finished(auto, "pretrain", run)
    check_finished(tiny_config(tmp_path, corpus_dir, "pretrain.trainer.precision=32-true"), "pretrain", run)
    with pytest.raises(ConfigError, match=r"pretrain\.trainer\.precision: '32-true' -> 'bf16-mixed'"):
        check_finished(pinned, "pretrain", run)
    (run / PRECISION).write_text("[]")
    with pytest.raises(UserError, match=r"precision\.json holds no \"precision\""):
        read_precision(run)


# ------------------------------------------------------------------------------------------ a stage run


def test_a_stage_records_what_auto_chose_and_resumes_in_it(machine, said, tmp_path, prepared, corpus_dir):
    """Pretraining with ``trainer.precision=auto`` on a CPU where bf16 measures slow: 32-true, said in the log and
    recorded (precision.json, done.json); stopped at update 2 and resumed where bf16 would now win, it finishes in
    the precision it started in; without its record it refuses to resume."""
    stages = stage_overrides(["pretrain"], updates=4, **TINY_STAGE, ckpt_every=2, val_every=4, log_every=1)

    def config(*more: str):
        return tiny_config(tmp_path, corpus_dir, *stages, "pretrain.trainer.precision=auto", "system=bl_base",
                           "model.mini_heads=[]", *more, prepared=prepared)

    assert run_pretrain(config("pretrain.trainer.stop_at=2"), progress_bar=False).outcome is Outcome.STOPPED
    run = tmp_path / "runs" / "tiny" / "bl_base" / "pretrain"
    recorded = json.loads((run / PRECISION).read_text())
    assert recorded["configured"] == "auto" and recorded["precision"] == "32-true"
    assert recorded["why"].startswith("CPU without AMX; bf16 matmul 0.47x fp32")
    assert any(r.getMessage().startswith("pretrain.trainer.precision: auto -> 32-true: CPU without AMX")
               for r in said.records)
    assert "precision: auto" in (run / CONFIG).read_text()  # the identity keeps the configured value

    machine["rates"], machine["model"] = FAST, "Fast CPU"  # auto would now choose bf16-mixed
    assert dev.resolve_precision(CPU).precision == "bf16-mixed"
    (run / PRECISION).rename(run / "precision.json.away")
    with pytest.raises(dev.PrecisionError, match=r"pretrain\.trainer\.precision=auto: .*/precision\.json, the "
                                                 r"precision it started in, is missing"):
        run_pretrain(config(), progress_bar=False)
    (run / "precision.json.away").rename(run / PRECISION)
    said.clear()
    result = run_pretrain(config(), progress_bar=False)
    assert result.outcome is Outcome.FINISHED and result.done["precision"] == "32-true"
    assert any(r.getMessage().startswith("pretrain.trainer.precision: auto -> 32-true: the precision this run "
                                         "started in") for r in said.records)
    assert json.loads((run / PRECISION).read_text()) == recorded  # a resume does not rewrite it
