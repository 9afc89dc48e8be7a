"""``benchmarks/bench_real_adapt.py --tiny`` (a tiny random GQA Llama, no GGUF) runs end to end and writes the figures
the docs quote. Speed is not asserted: the benchmark prints figures, this only checks that it can make them."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

pytest.importorskip("transformers")


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    threads = torch.get_num_threads()
    yield importlib.import_module("bench_real_adapt")
    torch.set_num_threads(threads)
    for name in ("bench_real_adapt", "common"):
        sys.modules.pop(name, None)


def test_tiny_mode_writes_every_figure(bench, tmp_path: Path):
    out = tmp_path / "real.json"
    bench.main(["--tiny", "--threads", "1", "--reps", "2", "--profile", "--json", str(out)])
    fig = json.loads(out.read_text())
    assert fig["tiny"] and fig["batch"] == 2 and fig["seq_len"] == 32 and fig["vocab"] == 300
    assert fig["machine"]["threads"] == 1
    bodies = {"all 6 layers", "MiniPost 2+2 layers"}
    # both systems compute the same loss from the same weights (else the comparison would mean nothing)
    assert set(fig["loss_check"]) == bodies
    assert all(c["abs_diff"] < 1e-4 for c in fig["loss_check"].values())
    rows = {(r["body"], r["precision"], r["system"]): r for r in fig["rows"]}
    assert set(rows) == {(b, p, s) for b in bodies for p in ("fp32", "bf16") for s in ("minimodel", "transformers")}
    for (body, _, _), r in rows.items():
        assert r["layers"] == (6 if body.startswith("all") else 4)
        assert r["trainable"] == 300 * 64  # the new embeddings, tied to the output projection: nothing else trains
        assert len(r["times"]) == 2 and r["tokens_per_s"] > 0 and r["flops"] > 0 and 0 < r["share_of_peak"]
    for r in fig["ratios"]:
        assert r["min"] <= r["ratio"] <= r["max"] and len(r["per_pair"]) == 2
        assert r["target_met"] == (r["ratio"] >= fig["target"])
    assert len(fig["ratios"]) == 4
    for p in ("fp32", "bf16"):
        assert fig["peak_flops_per_s"][p] > 0 and fig["peak_before"][p]["dtype"] == {"fp32": "float32",
                                                                                       "bf16": "bfloat16"}[p]
    assert fig["load_before"]["loadavg"] and "load average" in fig["load_after"]["uptime"]
    assert set(fig["profiles"]) == {f"{b}, {p}" for b in bodies for p in ("fp32", "bf16")}
    for per_system in fig["profiles"].values():
        assert set(per_system) == {"minimodel", "transformers"}
        assert all(set(v["split_s"]) == {"forward", "backward", "optimizer"} for v in per_system.values())
