"""The SIB-200 study rehearsed end to end at a tiny size (issue 53): ``minimodel run experiments/study_sib200_latin.yaml``
as written but for its sweep, cut to the recipe's two rows (BL_BASE and MiniPost over the affine, distilled
mini-model, the extended vocabulary with mean-initialised new rows, the English finetunings shared by both; the
paper's rows run the stages ``test_smollm2.py``'s chain rehearses), then ``scripts/unadapted_reference.py`` and
``minimodel report`` with the Makefile's pair of rows, on SmolLM2 itself: French only, 2 bridge and 4 adaptation
updates of 4 x 32 tokens, 16 English training sentences, two finetuning seeds. What ``make study-sib200-latin`` and
``make results-sib200-latin`` run, in about six minutes of a 2-core CPU (the slowest fixture of ``make test``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from minimodel.cli import main  # noqa: E402
from minimodel.experiment import load_experiment  # noqa: E402
from minimodel.store.checkpoints import load_adaptation  # noqa: E402
from minimodel.store.layout import adaptation_checkpoints  # noqa: E402
from minimodel.systems import stage_plan  # noqa: E402
from tests.conftest import DEMO_CORPUS, ROOT, module_scratch, small_task, stage_overrides  # noqa: E402
from tests.test_smollm2 import smollm2  # noqa: E402,F401  (the fixture: the GGUF, fetched once)

pytestmark = pytest.mark.slow
LATIN = ROOT / "experiments" / "study_sib200_latin.yaml"
SIB200 = ROOT / "data" / "sib200"
ROWS = ("bl_base@extend-mean", "minipost-recipe@extend-mean")
PAIR = "report.systems={bl_base@extend-mean: bl_base, minipost-recipe@extend-mean: minipost}"  # the Makefile's


@pytest.fixture(scope="module")
def study(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          smollm2: Path) -> Iterator[tuple[Path, list[str]]]:  # noqa: F811
    with module_scratch(request, tmp_path_factory, "sib200-latin") as tmp:
        recipe = [entry for entry in load_experiment(LATIN, []).sweep if "adapt.vocabulary=extend" in entry]
        assert len(recipe) == 2
        args = ["sweep=[" + ",".join(f"'{entry}'" for entry in recipe) + "]",
                f"runs_dir={tmp / 'runs'}", f"data.prepared_dir={tmp / 'prepared'}", f"data.corpus_dir={DEMO_CORPUS}",
                f"bridge.source={smollm2}", "target_langs=[fr]", "data.seq_len=32", "data.vocab_size=1000",
                "data.val_blocks=8", "data.encode_threads=1",
                *stage_overrides(["bridge", "adapt"], global_batch=4, micro_batch=4, warmup_updates=1, log_every=1),
                *stage_overrides(["bridge"], updates=2, ckpt_every=2, val_every=2),
                *stage_overrides(["adapt"], updates=4, ckpt_every=4, val_every=4, ckpt_steps=[1, 2]),
                f"tasks.sib200.source={small_task(SIB200, tmp / 'sib200', 14)}", "tasks.sib200.max_train_examples=16",
                "tasks.sib200.max_len=32", "finetune.seeds=[1,2]", "finetune.epochs=1", "finetune.batch_size=8",
                "finetune.micro_batch=8"]
        assert main(["run", str(LATIN), *args, "--no-progress"]) == 0
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "unadapted_reference.py"), str(LATIN), *args,
                               "tasks.sib200.max_len=64"], cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        yield tmp, args


def results(tmp: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (tmp / "runs" / "study_sib200_latin" / name).read_text().splitlines()]


def test_both_recipe_rows_adapt_an_extended_vocabulary_and_are_scored_at_every_checkpoint(study):
    tmp, args = study
    for label, layers in zip(ROWS, (30, 14)):
        system = label.split("@")[0].split("-")[0]
        extra = ["tag=recipe", "bridge.depth=12", "bridge.init=affine", "bridge.objective=distill"] \
            if system == "minipost" else []
        cfg = load_experiment(LATIN, [*args, f"system={system}", *extra, "adapt.init=mean",
                                      "adapt.vocabulary=extend", "adapt.tag=extend-mean", "lang=fr"])
        r = stage_plan(cfg, "adapt").runs
        assert r.label == label
        rows = [json.loads(line) for line in r.results.read_text().splitlines()]
        for split, expected in (("test", [0, 1, 2, 4]), ("dev", [2, 4])):
            for metric in ("accuracy", "macro_f1", "loss_per_char"):
                got = {(row["step"], row["seed"]) for row in rows
                       if row["lang"] == "fr" and row["split"] == split and row["metric"] == metric}
                assert got == {(s, seed) for s in expected for seed in (1, 2)}, (label, split, metric)
        assert all(math.isfinite(row["value"]) for row in rows)
        last = load_adaptation(adaptation_checkpoints(r.adapt("fr"))[-1])
        assert last.body_layers == layers
        info = json.loads((r.adapt("fr") / "adapt_info.json").read_text())
        vocabulary = info["init"]["vocabulary"]
        assert vocabulary["mode"] == "extend" and vocabulary["kept"] == 49152 and vocabulary["new"] > 0
    bridge = tmp / "runs" / "study_sib200_latin" / "minipost-recipe" / "bridge"
    assert (bridge / "checkpoints" / "last.ckpt").is_file() and (bridge / "metrics.csv").is_file()
    # one set of English finetunings, BL_BASE's, read by both rows and by the unadapted reference
    finetuned = sorted(p.parent.name for p in (tmp / "runs" / "study_sib200_latin").rglob("finetune/sib200/*/model.pt"))
    assert finetuned == ["seed1", "seed2"]


def test_the_references_and_the_report(study, tmp_path):
    tmp, args = study
    rows = results(tmp, "unadapted.jsonl")
    for system in ("unadapted", "bag_of_words"):
        for split in ("dev", "test"):
            assert {row["seed"] for row in rows if row["system"] == system and row["split"] == split
                    and row["lang"] == "fr" and row["metric"] == "accuracy"}, (system, split)
    # SmolLM2's own loss per character, on the held-out text of the rows' (extended) vocabulary: the study prepares no
    # replaced one, and two tokenizers' held-out blocks do not hold the same text
    per_char = [row for row in rows if row["metric"] == "loss_per_char" and row["lang"] == "fr"]
    assert per_char and all(row["held_out_text"] == ROWS[0] and 0 < row["value"] < 10 for row in per_char)
    out = tmp_path / "results.md"
    assert main(["report", str(LATIN), *args, PAIR, "--out", str(out)]) == 0
    text = out.read_text()
    # the pair read as the paper's two systems, each against the unadapted model in French
    assert "Systems: bl_base, minipost." in text and "## Adapted against unadapted" in text
    for system in ("bl_base", "minipost"):
        assert f"| fr | {system} | 2 |" in text, system
