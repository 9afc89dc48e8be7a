"""The command line wins over an experiment's sweep for the keys it sets (issue 44: `system=bl_base` under the demo's
sweep was silently overridden and all four systems ran)."""

from __future__ import annotations

import logging

from minimodel.pipeline import plan, variants
from tests.conftest import ROOT

DEMO = str(ROOT / "experiments" / "demo.yaml")


def test_a_system_on_the_command_line_selects_its_sweep_entry(caplog):
    assert [v.label for v in variants(DEMO, [])] == ["bl_base", "bl_small", "minijoint", "minipost"]
    with caplog.at_level(logging.INFO, logger="minimodel"):
        only = variants(DEMO, ["system=minijoint"])
    assert [v.label for v in only] == ["minijoint"]
    assert only[0].cfg.model.mini_heads == [2]  # the entry's other words still apply
    assert "the command line's system=minijoint leaves out the sweep entries 'system=bl_base'" in caplog.text
    # what docs/own-task.md suggests, as a plan: BL_BASE's steps only
    names = {s.name for s in plan(DEMO, ["system=bl_base"])}
    assert "pretrain" in names and not any(n.startswith(("minijoint", "minipost", "bl_small")) for n in names)
    assert [v.label for v in variants(DEMO, ["sweep=[system=minipost]"])] == ["minipost"]  # the other way, as before


def test_other_keys_of_the_command_line_override_every_entry(tmp_path):
    exp = tmp_path / "depths.yaml"
    exp.write_text(f"extends: {DEMO}\nname: depths\nsystem: minipost\n"
                   "sweep:\n  - 'bridge.depth=1 tag=d1'\n  - 'bridge.depth=2 tag=d2'\n")
    assert [v.cfg.bridge.depth for v in variants(str(exp), [])] == [1, 2]
    # a key that does not name a run: the command line's value for every entry
    assert [(v.cfg.bridge.depth, v.label) for v in variants(str(exp), ["bridge.depth=3"])] == \
        [(3, "minipost-d1"), (3, "minipost-d2")]
    # a tag names a run: it picks the entry, and none left means the command line alone
    assert [(v.cfg.bridge.depth, v.label) for v in variants(str(exp), ["tag=d2"])] == [(2, "minipost-d2")]
    assert [v.label for v in variants(str(exp), ["tag=d9"])] == ["minipost-d9"]
    # a key no entry sets applies to every entry, as before
    assert [v.cfg.bridge.layers for v in variants(str(exp), ["bridge.layers=3"])] == [3, 3]
