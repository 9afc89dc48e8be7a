"""Issue 30's report rules, on hand-made results rows: the transfer rule and the plateau check read the dev rows only,
a language that fails the rule leaves every average and claim (and is reported apart), every claim row states its
language coverage and its verdict per language; and issue 31's FOCUS claims."""

from __future__ import annotations

import pytest

from minimodel.config.load import load_config
from minimodel.errors import ConfigError
from minimodel.report.claims import VariantInfo, claims_table, focus_claims
from minimodel.report.document import render_report, summary_text
from minimodel.report.reading import results_from_rows
from minimodel.report.selection import DevChecks, apply_checks, plateau, restrict, transfer

STEPS = (0, 100, 300, 400)  # the last quarter: 300 -> 400
LANGS = ("de", "es", "el")
TEST_BASE = {("t", lang): {"accuracy": 30.0} for lang in LANGS}
DEV_BASE = {("t", "de"): {"accuracy": 25.0}, ("t", "es"): {"accuracy": 40.0}, ("t", "el"): {"accuracy": 30.0}}


def rows(system: str, lang: str, scores: tuple[float, ...], split: str = "test", seeds=(1, 2, 3),
         spread: float = 0.5) -> list[dict]:
    """Scores at STEPS, the same for every seed but for a small spread (seed 1 -spread, seed 3 +spread)."""
    return [{"system": system, "body": "primary", "task": "t", "lang": lang, "seed": seed, "step": step,
             "flops": step * 1e10, "v100_days": step * 1e-8, "split": split, "metric": "accuracy",
             "value": v + (seed - 2) * spread}
            for seed in seeds for step, v in zip(STEPS, scores)]


def study() -> list[dict]:
    """BL_BASE transfers in de (dev 50 vs 25) and el (dev 37 vs 30: +7), not in es (dev 42 vs 40: +2). Its dev curve
    moves 0.5 over the last quarter in de, 3 in el (not plateaued). MiniJoint reaches BL_BASE's test targets sooner
    in de, never in el."""
    out = []
    for split, table in (("test", {"de": (30, 50, 58, 60), "es": (30, 33, 34, 34), "el": (20, 35, 40, 45)}),
                         ("dev", {"de": (26, 45, 49.5, 50), "es": (38, 41, 42, 42), "el": (25, 30, 34, 37)})):
        for lang, sc in table.items():
            out += rows("bl_base", lang, sc, split)
    for split, table in (("test", {"de": (30, 58, 59, 60), "es": (30, 34, 34, 34), "el": (20, 25, 28, 30)}),
                         ("dev", {"de": (26, 49, 50, 50), "es": (38, 42, 42, 42), "el": (25, 27, 28, 29)})):
        for lang, sc in table.items():
            out += rows("minijoint", lang, sc, split)
    return out


def read(data: list[dict], split: str):
    r = results_from_rows(data, {"t": "accuracy"}, split)
    r.set_baselines(TEST_BASE if split == "test" else DEV_BASE)
    return r


CHECKS = DevChecks("transfer", 5.0, 0.25, 1.0, DEV_BASE)


def test_the_transfer_rule_reads_the_dev_final_score_against_the_dev_majority_class():
    dev = read(study(), "dev")
    rule = {t.lang: t for t in transfer(dev, "t", LANGS, 5.0)}
    assert rule["de"].passes and rule["el"].passes and not rule["es"].passes
    assert rule["es"].score == pytest.approx(42.0) and rule["es"].majority == 40.0
    assert "+2.0 < +5" in rule["es"].why()
    # the test scores play no part: es's test score far above its test majority class changes nothing
    assert not transfer(dev, "t", ["es"], 5.0)[0].passes


def test_the_plateau_check_is_the_move_over_the_last_quarter_of_the_dev_curve():
    dev = read(study(), "dev")
    de, el = plateau(dev, "bl_base", "t", "de", 0.25), plateau(dev, "bl_base", "t", "el", 0.25)
    assert (de.start.step, de.end.step) == (300, 400) and de.move == pytest.approx(0.5) and de.holds(1.0)
    assert el.move == pytest.approx(3.0) and not el.holds(1.0)
    # no checkpoint at or before 75%: no check
    short = [r for r in study() if r["step"] in (0, 400)]
    assert plateau(read(short, "dev"), "bl_base", "t", "de", 0.25).start.step == 0
    assert plateau(read([r for r in study() if r["step"] == 400], "dev"), "bl_base", "t", "de", 0.25) is None


def test_a_language_that_does_not_transfer_leaves_every_average_and_claim():
    test, dev = read(study(), "test"), read(study(), "dev")
    checked = apply_checks(test, dev, CHECKS)
    assert checked.res.langs("t") == ["de", "el"] and checked.full.langs("t") == ["de", "el", "es"]
    assert [t.lang for t in checked.left_out["t"]] == ["es"]
    # the average is over de and el only
    assert checked.res.average_stat("bl_base", "t").mean == pytest.approx((60 + 45) / 2)
    text = render_report(checked.res, "s", {}, checked=checked)
    section = text.split("## Checks on the dev sets")[1].split("## Performance")[0]
    assert "| es | 42.0 | 40.0 | +2.0 | no |" in section and "| el | 37.0 | 30.0 | +7.0 | yes |" in section
    assert "| bl_base | +0.5 ✓ | +3.0 ✗ | +0.0 ✓ |" in section  # columns de, el, es
    assert "does **not** hold in el" in section
    assert "left out of every average, speedup and claim" in section and "es (bl_base dev 42.0" in section
    apart = text.split("## Languages that do not transfer")[1].split("##")[0]
    assert "| system | n | es | avg |" in apart
    table2 = text.split("## Performance at training completion (Table 2)")[1].split("##")[0]
    assert "| system | n | de | el | avg |" in table2
    claims = text.split("## The paper's claims")[1]
    assert "| de, el (2 of 2) |" in claims and " es" not in claims.split("| claim |")[1].split("\n")[2]


def test_with_languages_all_nothing_is_left_out_but_the_checks_are_shown():
    test, dev = read(study(), "test"), read(study(), "dev")
    checked = apply_checks(test, dev, DevChecks("all", 5.0, 0.25, 1.0, DEV_BASE))
    assert checked.res.langs("t") == ["de", "el", "es"] and not checked.left_out
    assert "not applied here" in checked.section[2]


def test_without_dev_rows_the_report_says_the_checks_were_not_made():
    test_only = [r for r in study() if r["split"] == "test"]
    checked = apply_checks(read(test_only, "test"), read(test_only, "dev"), CHECKS)
    assert checked.res.langs("t") == ["de", "el", "es"] and "No dev rows" in checked.section[2]


def test_every_claim_states_its_coverage_and_its_verdict_in_each_language():
    test = restrict(read(study(), "test"), "t", ["de", "el"])
    table = claims_table(test, reps=200)
    row = next(line for line in table.splitlines() if line.startswith("| MiniJoint reaches"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == "de (1 of 2)"  # the languages the speedup rests on: those reaching the target
    # MiniJoint is faster in de (its speedup there is a number) and never reaches el's target: the per-language
    # column says so, whatever the average's verdict
    assert cells[6] == "de held, el not held (never reaches the target)"
    assert "(1/2 langs reach the target; never: el)" in cells[2]
    english = next(line for line in table.splitlines() if line.startswith("| Dual-head"))
    assert english.rstrip().endswith("| — |")


def test_per_language_verdicts_differ_from_the_average_when_languages_disagree():
    """BL_SMALL ends 5 points below BL_BASE in de and 5 above in el: not held in el, held in de."""
    data = [r for r in study() if r["split"] == "test" and r["system"] == "bl_base"]
    data += rows("bl_small", "de", (30, 50, 54, 55)) + rows("bl_small", "el", (20, 40, 48, 50))
    res = restrict(read(data, "test"), "t", ["de", "el"])
    row = next(line for line in claims_table(res, reps=200).splitlines() if line.startswith("| BL_SMALL plateaus"))
    per = [c.strip() for c in row.strip("|").split("|")][6]
    assert per == "de held, el not held"


def focus_rows() -> list[dict]:
    """BL_BASE+FOCUS starts where overlap ends half-way and reaches the target at 1/4 of the days; MiniJoint+FOCUS
    sooner still; FOCUS's final scores 0.5 below overlap's."""
    data = rows("bl_base", "de", (30, 50, 58, 60)) + rows("bl_base", "fr", (30, 50, 58, 60))
    data += rows("minijoint", "de", (30, 58, 59, 60)) + rows("minijoint", "fr", (30, 58, 59, 60))
    data += rows("bl_base@focus", "de", (50, 58, 59, 59.5)) + rows("bl_base@focus", "fr", (50, 58, 59, 59.5))
    data += rows("minijoint@focus", "de", (55, 59, 59.5, 59.5)) + rows("minijoint@focus", "fr", (55, 59, 59.5, 59.5))
    for r in data:
        if r["system"] == "minijoint" or r["system"] == "minijoint@focus":  # a third of BL_BASE's cost per update
            r["v100_days"] /= 3
    return data


def test_focus_claims_speedup_combined_and_final_score():
    res = results_from_rows(focus_rows(), {"t": "accuracy"})
    res.set_baselines({("t", lang): {"accuracy": 30.0} for lang in ("de", "fr")})
    twins = {"bl_base@focus": "bl_base", "minijoint@focus": "minijoint"}
    assert len(focus_claims(res, "t", twins, reps=50)) == 3
    a, b, c = (next(x for x in focus_claims(res, "t", twins, reps=200) if x.rule.startswith(p))
               for p in ("speedup of BL_BASE+FOCUS", "speedup difference", "final-score difference"))
    assert a.verdict == "held" and "bl_base@focus:" in a.ours
    assert b.verdict == "held" and "minijoint@focus − max(minijoint, bl_base@focus)" in b.ours
    assert c.verdict == "held" and "bl_base@focus − bl_base: -0.5" in c.ours and "minijoint@focus − minijoint: -0.5" in c.ours
    assert all(x.paper == "— (not in the paper)" for x in (a, b, c))
    # without the twins' mapping there is no FOCUS claim, and a FOCUS MiniJoint is not a "plain" variant (depth claim)
    assert focus_claims(res, "t", {}, reps=50) == []
    assert not VariantInfo(depth=2, pretraining="minijoint", init="focus").plain
    assert VariantInfo(depth=2, pretraining="minijoint").plain


def test_focus_claims_compare_with_the_twins_at_the_focus_rows_pretraining_seeds():
    """The overlap twins pooled over two pretrainings (the study's BL_BASE and MiniJoint) while the FOCUS rows adapt
    pretraining seed 1's models: the comparison keeps seed 1 only, paired, as if seed 2 were not there."""
    second = [{**r, "pretrain_seed": 2, "value": r["value"] + 8.0} for r in focus_rows()
              if r["system"] in ("bl_base", "minijoint")]
    twins = {"bl_base@focus": "bl_base", "minijoint@focus": "minijoint"}
    pooled = results_from_rows(focus_rows() + second, {"t": "accuracy"})
    alone = results_from_rows(focus_rows(), {"t": "accuracy"})
    for res in (pooled, alone):
        res.set_baselines({("t", lang): {"accuracy": 30.0} for lang in ("de", "fr")})
    assert len(pooled.by_seed[("bl_base", "t", "de")]) == 6  # the pooled twin: two pretrainings x three seeds
    with_second = focus_claims(pooled, "t", twins, reps=200)
    without = focus_claims(alone, "t", twins, reps=200)
    assert [c.verdict for c in with_second] == [c.verdict for c in without]
    final = with_second[2].ours
    assert "bl_base@focus − bl_base: -0.5 [-0.5, -0.5], n=3/3 (pretraining seed 1)" in final  # paired: no spread
    assert final.replace(" (pretraining seed 1)", "") == without[2].ours.replace(" (pretraining seed 1)", "")


def test_a_report_shows_each_initialisations_step0_in_the_baselines():
    res = results_from_rows(focus_rows(), {"t": "accuracy"})
    res.set_baselines({("t", lang): {"accuracy": 30.0} for lang in ("de", "fr")})
    text = render_report(res, "s", {})
    baselines = text.split("## Baselines")[1].split("##")[0]
    assert "bl_base@focus" in baselines and "50.0" in baselines and "bl_base" in baselines


def test_summary_names_the_languages_left_out(tmp_path):
    from minimodel.report.document import summary
    d = tmp_path / "s" / "bl_base"
    d.mkdir(parents=True)
    import json
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in study() if r["system"] == "bl_base"))
    text = summary(tmp_path, "s", baselines=TEST_BASE, main_metrics={"t": "accuracy"}, checks=CHECKS)
    assert text.splitlines()[-1] == "t: left out (transfer rule on dev): es"
    assert "52.5" in text  # the average over de and el: (60 + 45) / 2
    assert "52.5" not in summary_text(read([r for r in study() if r["system"] == "bl_base"], "test"))


@pytest.mark.parametrize("overrides, expected", [
    (["report.languages=some"], "report.languages must be all or transfer"),
    (["report.languages=transfer"], "set evaluate.dev=true"),
    (["report.plateau_share=1.5"], "report.plateau_share must be"),
    (["report.transfer_margin=-1"], "report.transfer_margin must be"),
])
def test_bad_report_settings_are_refused_at_load_time(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config("experiments/tiny.yaml", overrides)


def test_evaluate_dev_adds_a_dev_evaluation_step_per_language():
    from minimodel.pipeline import plan
    names = [s.name for s in plan("experiments/tiny.yaml", ["evaluate.dev=true"])]
    plain = [s.name for s in plan("experiments/tiny.yaml", [])]
    langs = [n.removeprefix("evaluate-") for n in plain if n.startswith("evaluate-")]
    assert langs and all(f"evaluate-dev-{lang}" in names for lang in langs)
    assert not any(n.startswith("evaluate-dev-") for n in plain)
    dev = next(s for s in plan("experiments/tiny.yaml", ["evaluate.dev=true"]) if s.name.startswith("evaluate-dev-"))
    assert "evaluate.split=dev" in dev.args and names.index("report") == len(names) - 1


@pytest.mark.parametrize("split, which, share, expected", [
    ("dev", "plateau", 0.25, [1200, 1600]),
    ("dev", "plateau", 0.5, [800, 1600]),
    ("dev", "plateau", 0.3, [800, 1600]),  # the last checkpoint at or before 70% (1,120) is 800
    ("dev", "all", 0.25, [0, 10, 400, 800, 1200, 1600]),
    ("test", "plateau", 0.25, [0, 10, 400, 800, 1200, 1600]),  # the test sets always score every checkpoint
])
def test_dev_sets_can_score_only_the_checkpoints_the_checks_read(tmp_path, split, which, share, expected):
    from minimodel.stages.evaluate import dev_selection
    cfg = load_config("experiments/tiny.yaml", [f"evaluate.split={split}", f"evaluate.dev_checkpoints={which}",
                                                f"report.plateau_share={share}"])
    ckpts = [tmp_path / f"step{n}.pt" for n in (0, 10, 400, 800, 1200, 1600)]
    assert [int(p.stem[4:]) for p in dev_selection(cfg, ckpts)] == expected


def test_a_task_left_out_of_the_claims_gets_an_exploratory_table_over_the_languages_that_clear_the_gate():
    """BL_BASE ends at 34 in es (majority class 33): the claims are not read on the task; the exploratory table
    reads them over de and el, and says the set was chosen on test scores."""
    test = read(study(), "test")
    test.set_baselines({("t", "de"): {"accuracy": 30.0}, ("t", "el"): {"accuracy": 30.0}, ("t", "es"): {"accuracy": 33.0}})
    text = render_report(test, "s", {})
    claims = text.split("## The paper's claims")[1]
    assert "**t**: left out" in claims and "es accuracy (34.0" in claims
    assert "**t, exploratory**" in claims and "(de, el)" in claims and "reads test scores" in claims
    assert "| de, el (2 of 2) |" in claims
    # every language clears it: no exploratory table
    test.set_baselines(TEST_BASE)
    assert "**t, exploratory**" not in render_report(test, "s", {})
