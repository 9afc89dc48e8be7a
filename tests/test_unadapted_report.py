"""The report's claim "adapted beats unadapted" (minimodel/report/unadapted.py) and ``report.systems``, which reads a
pair of recipe rows under the paper's names: on synthetic rows whose verdicts are known."""

import json

import pytest

from minimodel.report.document import render_report, write_report
from minimodel.report.reading import renamed, results_from_rows
from minimodel.report.unadapted import compare, load_references, unadapted_section

STEPS = (0, 10, 20)


def rows(system: str, lang: str, finals: dict[int, float]) -> list[dict]:
    """Accuracy rows of one system in one language: seed -> final score (step 0 at 20, step 10 halfway)."""
    return [{"system": system, "body": "primary", "task": "t", "lang": lang, "seed": seed, "step": step,
             "flops": step * 1e10, "v100_days": step * 1e-8, "split": "test", "metric": "accuracy",
             "value": {0: 20.0, 10: (20.0 + v) / 2, 20: v}[step]} for seed, v in finals.items() for step in STEPS]


def refs(lang: str, values: dict[int, float], system: str = "unadapted") -> list[dict]:
    return [{"system": system, "task": "t", "lang": lang, "seed": s, "split": "test", "metric": "accuracy", "value": v}
            for s, v in values.items()]


def write_jsonl(path, items) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))


def test_verdicts_follow_the_intervals_and_the_pairing_by_seed() -> None:
    res = results_from_rows(rows("bl_base", "fr", {1: 60, 2: 62, 3: 61}) + rows("bl_base", "ru", {1: 30, 2: 50, 3: 40})
                            + rows("bl_base", "el", {1: 10, 2: 11, 3: 12}))
    ref = {}
    for r in refs("fr", {1: 40, 2: 41, 3: 42}) + refs("ru", {1: 35, 2: 45, 3: 40}) + refs("el", {1: 30, 2: 31, 3: 33}):
        ref.setdefault(("unadapted", "t", r["lang"], "test", "accuracy"), {})[r["seed"]] = r["value"]
    fr, ru, el = (compare(res, ref, "bl_base", "t", lang) for lang in ("fr", "ru", "el"))
    assert fr.verdict == "beats" and fr.adapted.mean == 61 and fr.unadapted.mean == 41 and fr.adapted.n == 3
    assert fr.difference.point == 20 and fr.difference.low == 19 and fr.difference.high == 21  # paired: 20, 21, 19
    assert ru.verdict == "overlapping" and el.verdict == "below"
    assert compare(res, ref, "minipost", "t", "fr") is None  # no such system
    text = "\n".join(unadapted_section(res, ref))
    assert "| fr | bl_base | 3 | 61.0 ± 1.0 [60.0, 62.0] | 41.0 ± 1.0 [40.0, 42.0] | +20.0 [+19.0, +21.0] | — | **beats** |" in text
    assert "**bl_base** beats the unadapted model in 1 of 3 languages (fr): **not held**." in text


def test_seeds_missing_on_one_side_are_left_out_of_the_pairing() -> None:
    res = results_from_rows(rows("bl_base", "fr", {1: 60, 2: 62, 3: 64}))
    c = compare(res, {("unadapted", "t", "fr", "test", "accuracy"): {1: 40, 3: 44}}, "bl_base", "t", "fr")
    assert c.adapted.n == 2 and c.adapted.mean == 62 and c.unadapted.mean == 42


def test_report_reads_unadapted_jsonl_and_renames_systems(tmp_path) -> None:
    root = tmp_path / "exp"
    for system, finals in (("bl_base", {1: 45, 2: 46, 3: 47}), ("bl_base@mean", {1: 70, 2: 71, 3: 72}),
                           ("minipost-recipe@mean", {1: 69, 2: 70, 3: 71})):
        (root / system).mkdir(parents=True)
        write_jsonl(root / system / "results.jsonl", rows(system, "fr", finals))
    write_jsonl(root / "unadapted.jsonl", refs("fr", {1: 50, 2: 51, 3: 52}) + refs("fr", {0: 33.3}, "bag_of_words"))
    out = write_report(tmp_path, "exp", out=tmp_path / "all.md")
    text = out.read_text()
    assert "## Adapted against unadapted" in text and "| 33.3 | **below** |" in text and "bl_base@mean" in text
    recipe = write_report(tmp_path, "exp", out=tmp_path / "recipe.md",
                          systems={"bl_base@mean": "bl_base", "minipost-recipe@mean": "minipost"}).read_text()
    assert "bl_base@mean" not in recipe and "minipost-recipe" not in recipe
    assert "| fr | bl_base | 3 | 71.0 ± 1.0" in recipe and "| fr | minipost | 3 | 70.0 ± 1.0" in recipe
    assert "**bl_base** beats the unadapted model in 1 of 1 languages (fr): **held**." in recipe
    assert "## Adapted against unadapted" not in render_report(results_from_rows(rows("bl_base", "fr", {1: 1})), "x", {})


def test_bad_reference_rows_and_names_are_refused(tmp_path) -> None:
    assert load_references(tmp_path) == {}
    (tmp_path / "unadapted.jsonl").write_text('{"system": "unadapted"}\n')
    with pytest.raises(ValueError, match="line 1: not a reference row"):
        load_references(tmp_path)
    with pytest.raises(ValueError, match="the same name"):
        renamed([], {"a": "x", "b": "x"})
    assert renamed([{"system": "a"}, {"system": "c"}], {"a": "bl_base"}) == [{"system": "bl_base"}]
