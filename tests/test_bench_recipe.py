"""``benchmarks/bench_recipe.py summary``: issue 52's targets read from the benchmark's JSON alone (no model), on
figures made up here so that each verdict can be checked by hand."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

from tests.conftest import ROOT


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    yield importlib.import_module("bench_recipe")
    sys.modules.pop("bench_recipe", None)


def step2(system: str, losses: list[float], flops_per_update: float, seed: int | None = None,
          outcome: str = "finished") -> dict:
    steps = [0, 100, 250, 500]
    return {"system": system, "outcome": outcome, "updates": 500, "tokens_per_update": 1024, "seed": seed,
            "bridge": "N12/affine:distill@lr2e-3" if system == "minipost" else None,
            "checkpoints": {str(s): {"nats_per_char": y, "flops": s * flops_per_update}
                            for s, y in zip(steps, losses)}}


def test_first_reach_and_at_interpolate_between_checkpoints(bench):
    curve = [(0.0, 2.0), (100.0, 1.0), (200.0, 0.5)]
    assert bench.first_reach(curve, 0.75) == pytest.approx(150.0)
    assert bench.first_reach(curve, 1.0) == pytest.approx(100.0)  # reached at a checkpoint: that checkpoint
    assert bench.first_reach(curve, 2.5) == 0.0  # already there at step 0
    assert bench.first_reach(curve, 0.4) is None  # never
    assert bench.at(curve, 50.0) == pytest.approx(1.5) and bench.at(curve, 200.0) == 0.5
    assert bench.at(curve, 250.0) is None


def test_targets_read_the_bridge_gap_at_1m_tokens_and_step_2_against_bl_base(bench, tmp_path):
    # a bridge of 1,000 updates of 1,024 tokens: 1M tokens fall between its last two checkpoints (768k, 1.024M)
    bridge = {"outcome": "finished", "updates": 1000, "tokens": 1_024_000, "step0_loss": 6.0, "source_loss": 3.5,
              "val_loss": {"249": 4.5, "499": 4.2, "749": 4.1, "999": 3.9}}
    far = {**bridge, "val_loss": {"249": 4.5, "499": 4.2, "749": 4.1, "999": 4.05}}
    # BL_BASE at 2 FLOPs an update: 1.4 -> 0.7; 95% of its improvement is 0.735, reached 65% of the way from update
    # 250 (0.8) to 500 (0.7), at update 412.5: 825 FLOPs
    figures = {
        "bridge": {"N12/affine:distill@lr2e-3": bridge, "N12/far": far},
        "embeddings": {"fr": {
            "smollm2_own_tokenizer": {"nats_per_char": 1.0},
            "held_out": {"blocks": 3},
            "bl_base/mean": step2("bl_base", [1.4, 1.0, 0.8, 0.7], 2.0),
            "bl_base/mean#s2": step2("bl_base", [1.4, 1.1, 0.8, 0.7], 2.0, seed=2),
            # MiniPost at 1 FLOP an update: reaches 0.735 between 250 (0.9) and 500 (0.72): 250 + 250 * 0.165 / 0.18
            "minipost/mean@lr2e-3": step2("minipost", [1.4, 1.1, 0.9, 0.72], 1.0),
            "minipost/mean@lr2e-3#s2": step2("minipost", [1.4, 1.1, 0.95, 0.80], 1.0, seed=2),  # never reaches it
            "minipost/overlap@lr2e-3": step2("minipost", [2.0, 1.5, 1.2, 1.05], 1.0),  # no BL_BASE row: left out
            "minipost/random@lr2e-3": step2("minipost", [2.0, 1.5, 1.2, 0.9], 1.0, outcome="stopped"),
        }}}
    t = bench.targets(figures)
    gap = 4.1 + (3.9 - 4.1) * (1_000_000 - 768_000) / 256_000 - 3.5
    assert t["bridges"]["N12/affine:distill@lr2e-3"] == {"gap_at_1M": pytest.approx(gap), "met": True}
    assert t["bridges"]["N12/far"]["met"] is False  # 4.05 at the end: 0.56 above
    assert set(t["step2"]) == {"fr/minipost/mean@lr2e-3"}
    r = t["step2"]["fr/minipost/mean@lr2e-3"]
    assert r["bridge_meets_target_1"] is True and r["below_own_within_1M"] is True
    first, second = r["seeds"]
    assert first["goal"] == pytest.approx(0.735) and first["bl_base_flops"] == pytest.approx(2 * 412.5)
    assert first["flops"] == pytest.approx(250 + 250 * 0.165 / 0.18)
    assert first["share"] == pytest.approx((250 + 250 * 0.165 / 0.18) / 825)
    assert second["seed"] == 2 and second["flops"] is None and second["share"] is None
    assert r["compute_met"] is False  # a seed that has not reached it by 500 FLOPs, past half of BL_BASE's 825
    assert r["final"]["n"] == 2 and r["final"]["mean"] == pytest.approx(0.76)
    c = t["curves"]["fr/bl_base/mean"]  # each setting over its seeds, checkpoint by checkpoint
    assert list(c) == ["0", "100", "250", "500"] and c["100"]["n"] == 2 and c["100"]["mean"] == pytest.approx(1.05)
    assert c["100"]["std"] == pytest.approx(0.0707107, abs=1e-6) and c["500"]["flops"] == 1000
    assert "fr/minipost/random@lr2e-3" not in t["curves"]  # a stopped run: not a figure
    # every seed within half of BL_BASE's FLOPs: met
    figures["embeddings"]["fr"]["minipost/mean@lr2e-3#s2"] = step2("minipost", [1.4, 0.9, 0.7, 0.6], 1.0, seed=2)
    figures["embeddings"]["fr"]["minipost/mean@lr2e-3"] = step2("minipost", [1.4, 0.9, 0.7, 0.6], 1.0)
    assert bench.targets(figures)["step2"]["fr/minipost/mean@lr2e-3"]["compute_met"] is True
    # the summary part writes the same under "targets" and prints a verdict per row
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(figures))
    assert bench.main(["summary", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["targets"]["bridges"]["N12/far"]["met"] is False


def test_the_summary_says_what_it_cannot_read_instead_of_failing(bench, tmp_path, capsys):
    """A BL_BASE that never improves (its goal met at step 0), a language without SmolLM2's own figure, a row that is
    not below by the end of what was measured (512k tokens, short of 1M), a seed BL_BASE lacks, a tagged BL_BASE
    setting: each read and said plainly; the JSON's machine record is left as the measuring run wrote it."""
    flat = step2("bl_base", [1.4, 1.4, 1.4, 1.4], 2.0)
    figures = {
        "machine": {"cpu": "the measuring VM"},
        "bridge": {},
        "embeddings": {
            "fr": {"smollm2_own_tokenizer": {"nats_per_char": 1.0},
                   "bl_base/mean": flat,
                   "bl_base/mean@tagged": step2("bl_base", [1.4, 1.0, 0.8, 0.7], 2.0),
                   "minipost/mean@tagged": step2("minipost", [1.4, 1.2, 1.1, 1.05], 1.0),
                   "minipost/mean@tagged#s3": step2("minipost", [1.4, 1.2, 1.1, 0.95], 1.0, seed=3),
                   "minipost/mean[copy:lm]": step2("minipost", [1.4, 1.3, 1.2, 1.1], 1.0)},
            "ru": {"bl_base/mean": step2("bl_base", [2.0, 1.5, 1.3, 1.2], 2.0),
                   "minipost/mean@x": step2("minipost", [2.0, 1.8, 1.7, 1.6], 1.0)}}}
    t = bench.targets(figures)
    tagged = t["step2"]["fr/minipost/mean@tagged"]
    assert tagged["seeds"][0]["bl_base_flops"] == pytest.approx(2 * 412.5)  # bl_base/mean@tagged, not the flat one
    assert [s["bl_base_seed"] for s in tagged["seeds"]] == [0, 0]  # seed 3 has no BL_BASE of its own: said
    assert tagged["seeds"][0]["below_own"] is None and tagged["seeds"][1]["below_own"] is True
    assert tagged["below_own_within_1M"] is None  # one seed not below by 512k tokens: not measured to 1M
    flat_pair = t["step2"]["fr/minipost/mean[copy:lm]"]["seeds"][0]
    assert flat_pair["bl_base_flops"] == 0 and flat_pair["share"] is None
    assert t["step2"]["fr/minipost/mean[copy:lm]"]["compute_met"] is None  # undefined, not "missed"
    assert t["step2"]["ru/minipost/mean@x"]["own_tokenizer"] is None
    assert t["step2"]["ru/minipost/mean@x"]["below_own_within_1M"] is None
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(figures))
    assert bench.main(["summary", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "BL_BASE needs no update to reach it (undefined)" in out and "(against BL_BASE seed 0)" in out
    assert "below within 1M tokens: not measured that far" in out and "own tokenizer's (not measured)" in out
    assert "target 1 unknown" in out and "compute undecided" in out
    assert "not reached by 5e+02 FLOPs (BL_BASE: 8.2e+02)" in out
    assert json.loads(path.read_text())["machine"] == {"cpu": "the measuring VM"}


def test_the_step_2_grid_as_a_markdown_table(bench):
    """Every start and vocabulary in the docs' order, seeds folded into mean +- std, what is missing said."""
    figures = {"embeddings": {"fr": {
        "smollm2_own_tokenizer": {"nats_per_char": 1.0774},
        "minipost/mean@lr2e-3": step2("minipost", [1.4, 1.2, 1.1, 1.06], 2.4e11),
        "minipost/mean@lr2e-3#s2": step2("minipost", [1.4, 1.0, 0.9, 1.04], 2.4e11, seed=2),
        "bl_base/mean": step2("bl_base", [1.4, 0.9, 0.8, 0.74], 4.8e11),
        "bl_base/extend/overlap": step2("bl_base", [2.3, 1.5, 1.2, 1.0], 6.6e11),
        "bl_base/random": step2("bl_base", [2.0, 1.5, 1.4, 1.3], 4.8e11, outcome="interrupted"),
    }}}
    table = bench.step2_table(figures, "fr")
    assert table[0] == "| fr: start, vocabulary | system | 0 | 100 | 250 | 500 | FLOPs |"
    assert len(table) == 2 + 2 * (4 + 3) + 1  # extend has no random row: it is the overlap start there
    assert all(line.count("|") == 8 for line in table)
    assert table[2] == "| mean, replace | MiniPost | 1.400 ± 0.000 | 1.100 ± 0.141 | 1.000 ± 0.141 | 1.050 ± 0.014 | 1.2e+14 |"
    assert table[3] == "| mean, replace | BL_BASE | 1.400 | 0.900 | 0.800 | 0.740 | 2.4e+14 |"
    assert table[4] == "| focus, replace | MiniPost | not measured | | | | |"
    assert "| random, replace | BL_BASE | not measured |" in table[9]  # a stopped run is not a row
    assert table[-2] == "| overlap, extend | BL_BASE | 2.300 | 1.500 | 1.200 | 1.000 | 3.3e+14 |"
    assert table[-1] == "| SmolLM2's own tokenizer | | 1.077 | | | | |"


def test_the_docs_tables_are_replaced_in_place_and_a_missing_one_is_refused(bench, tmp_path):
    """``table --into docs/extensions.md``: each language's block of table lines replaced, the prose around kept;
    a file without the table (or with two) is refused and left as it was."""
    figures = {"embeddings": {"fr": {"smollm2_own_tokenizer": {"nats_per_char": 1.0774},
                                     "bl_base/mean": step2("bl_base", [1.4, 0.9, 0.8, 0.74], 4.8e11)}}}
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(figures))
    doc = tmp_path / "extensions.md"
    before = "Prose.\n\n| fr: start, vocabulary | old |\n|---|---|\n| mean | 9 |\n\nAfter the table.\n"
    doc.write_text(before)
    assert bench.main(["table", "--json", str(path), "--langs", "fr", "--into", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("Prose.\n\n| fr: start, vocabulary | system |") and text.endswith("|\n\nAfter the table.\n")
    assert "| mean, replace | BL_BASE | 1.400 | 0.900 | 0.800 | 0.740 | 2.4e+14 |" in text and "| 9 |" not in text
    assert text.count("| fr: start") == 1
    again = text
    with pytest.raises(SystemExit, match="0 step-2 tables of 'ru'"):
        bench.main(["table", "--json", str(path), "--langs", "fr,ru", "--into", str(doc)])
    assert doc.read_text() == again
