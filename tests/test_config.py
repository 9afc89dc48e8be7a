import pytest

from minimodel.config.load import save_config
from minimodel.errors import ConfigError
from minimodel.experiment import load_experiment
from minimodel.systems import REGISTRY, stage_plan
from tests.conftest import ROOT

ALL_YAML = sorted((ROOT / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: p.name)
def test_every_experiment_composes(path):
    cfg = load_experiment(path)
    assert cfg.system in REGISTRY


EXPERIMENT_PARTS = sorted(p for p in (ROOT / "conf").glob("*/*.yaml") if p.parent.name != "launcher")  # test_launch


@pytest.mark.parametrize("path", EXPERIMENT_PARTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_base_file_composes(path, tmp_path):
    group = path.parent.name
    package = {"optim": "pretrain.optim", "trainer": "pretrain.trainer"}.get(group, group)
    exp = tmp_path / "experiments" / "x.yaml"
    exp.parent.mkdir()
    # on top of a small model and data (so that cross-checks such as max_positions >= seq_len + 2 hold)
    base = "  - model: roberta-base\n  - data: cc100\n" if path.stem not in ("tiny", "demo") else \
        "  - model: tiny\n  - data: demo\n"
    exp.write_text(f"defaults:\n{base}  - {group}@{package}: {path.stem}\nname: x\nsystem: bl_base\n")
    import os

    os.environ["MINIMODEL_CONF"] = str(ROOT / "conf")
    try:
        load_experiment(exp)
    finally:
        del os.environ["MINIMODEL_CONF"]


def test_paper_defaults():
    cfg = load_experiment(ROOT / "experiments" / "minijoint.yaml")
    o = cfg.pretrain.optim
    assert (o.updates, o.global_batch, o.lr, o.warmup_updates, o.betas, o.eps, o.weight_decay) == (
        125_000, 2048, 7e-4, 10_000, [0.9, 0.98], 1e-6, 0.01)
    assert cfg.data.seq_len == 512 and cfg.data.vocab_size == 50_000 and cfg.data.mask_prob == 0.15
    assert cfg.model.mini_heads == [4] and cfg.model.layers == 12 and stage_plan(cfg, "adapt").depth == 4
    assert len(cfg.target_langs) == 14


def test_overrides_are_typed():
    cfg = load_experiment(ROOT / "experiments" / "tiny.yaml", ["pretrain.optim.updates=7", "target_langs=[de]",
                                                           "data.vocab_size=500"])
    assert cfg.pretrain.optim.updates == 7 and cfg.target_langs == ["de"]
    assert cfg.model.vocab_size == 500  # interpolated from data.vocab_size


def test_unknown_key_in_override_names_it():
    with pytest.raises(ConfigError, match=r"override 'pretrain.optim.lrr=1': unknown config key 'pretrain.optim.lrr'; "
                                          r"valid keys under 'pretrain.optim': lr, "):
        load_experiment(ROOT / "experiments" / "tiny.yaml", ["pretrain.optim.lrr=1"])


def test_overrides_merged_at_once_read_as_one_at_a_time():
    """Overrides on keys apart are merged in one go (a merge copies the whole config): the same config as merging
    them one by one; a bad one among them gives the message it gives alone; a key given twice (or inside another)
    is merged in turn, so a bad value is refused even when a later override would replace it."""
    from omegaconf import OmegaConf

    from minimodel.config import load as config_load

    tiny = ROOT / "experiments" / "tiny.yaml"
    items = ["pretrain.optim.updates=7", "target_langs=[de]", "data.vocab_size=500", "bridge.optim={lr: 0.5}",
             "adapt.trainer.ckpt_steps=[1,2]", "finetune.seeds=[3]", "name=other"]
    one_by_one = OmegaConf.structured(config_load.ExperimentConfig)
    for source, fragment in config_load._compose(tiny, config_load.find_conf_dir(tiny)):
        one_by_one = config_load._merge(one_by_one, fragment, source)
    for item in items:
        one_by_one = config_load._apply_overrides(one_by_one, [item])
    at_once = load_experiment(tiny, items)
    assert OmegaConf.to_yaml(OmegaConf.structured(at_once)) == OmegaConf.to_yaml(OmegaConf.to_object(one_by_one))
    assert at_once.bridge.optim.lr == 0.5 and at_once.bridge.optim.updates > 0  # a mapping merged, not replaced
    with pytest.raises(ConfigError, match=r"override 'pretrain.optim.updates=many': bad value for "
                                          r"'pretrain.optim.updates'"):
        load_experiment(tiny, [*items[1:], "pretrain.optim.updates=many"])
    with pytest.raises(ConfigError, match=r"override 'pretrain.optim.lrr=1': unknown config key"):
        load_experiment(tiny, [*items, "pretrain.optim.lrr=1"])
    for twice in (["pretrain.optim.updates=many", "pretrain.optim.updates=7"],
                  ["pretrain.optim={updates: many}", "pretrain.optim.updates=7"]):
        with pytest.raises(ConfigError, match="bad value for 'pretrain.optim.updates'"):
            load_experiment(tiny, twice)
    assert load_experiment(tiny, ["data.vocab_size=400", "data.vocab_size=500"]).data.vocab_size == 500


def experiment_outside_repo(tmp_path, monkeypatch, name: str, text: str):
    """An experiment file in a temporary folder, composed from the repository's conf/ (MINIMODEL_CONF)."""
    exp = tmp_path / "experiments" / name
    exp.parent.mkdir()
    exp.write_text(text)
    monkeypatch.setenv("MINIMODEL_CONF", str(ROOT / "conf"))
    return exp


def test_unknown_key_in_file_names_the_file(tmp_path, monkeypatch):
    exp = experiment_outside_repo(tmp_path, monkeypatch, "bad.yaml",
                                  "defaults:\n  - model: tiny\nname: x\nsystem: bl_base\nmodel:\n  hiden: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown config key 'model.hiden'"):
        load_experiment(exp)


def test_missing_required_value(tmp_path, monkeypatch):
    exp = experiment_outside_repo(tmp_path, monkeypatch, "noname.yaml", "system: bl_base\n")
    with pytest.raises(ConfigError, match=r"noname.yaml: missing required value\(s\) name"):
        load_experiment(exp)


def test_bad_values_are_rejected():
    with pytest.raises(ConfigError, match=r"bad value for 'pretrain.optim.lr'"):
        load_experiment(ROOT / "experiments" / "tiny.yaml", ["pretrain.optim.lr=fast"])
    with pytest.raises(ConfigError, match=r"system must be one of"):
        load_experiment(ROOT / "experiments" / "tiny.yaml", ["system=huge"])
    with pytest.raises(ConfigError, match=r"global_batch \(30\) must be a multiple of micro_batch \(16\)"):
        load_experiment(ROOT / "experiments" / "tiny.yaml", ["pretrain.optim.global_batch=30"])


def test_resolved_config_round_trips(tmp_path):
    cfg = load_experiment(ROOT / "experiments" / "tiny.yaml", ["pretrain.optim.updates=9"])
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "updates: 9" in text and "${" not in text


def test_an_experiment_extends_another(tmp_path, monkeypatch):
    """``extends:`` starts from another experiment file (its defaults and values) and holds only what differs;
    what the extended file does not say keeps the other's value; unknown files and loops are errors naming them."""
    base = experiment_outside_repo(tmp_path, monkeypatch, "base.yaml",
                                   "defaults:\n  - model: tiny\n  - data: demo\nname: base\nsystem: minijoint\nmodel:\n  hidden: 48\n"
                                   "  mini_heads: [1]\ntarget_langs: [de, fr]\nsweep: ['tag=a', 'tag=b']\n")
    child = base.parent / "child.yaml"
    child.write_text("extends: base.yaml\nname: child\ntarget_langs: [tr]\nsweep: ['tag=c']\n")
    cfg, parent = load_experiment(child), load_experiment(base)
    assert (cfg.name, cfg.system, cfg.model.hidden, cfg.model.layers) == ("child", "minijoint", 48, parent.model.layers)
    assert (cfg.target_langs, cfg.sweep) == (["tr"], ["tag=c"])  # lists replace the other's
    assert load_experiment(child, ["model.hidden=32"]).model.hidden == 32  # overrides come last
    grandchild = base.parent / "grandchild.yaml"
    grandchild.write_text("extends: child.yaml\npretrain:\n  optim: {updates: 7}\n")
    g = load_experiment(grandchild)
    assert (g.name, g.model.hidden, g.pretrain.optim.updates) == ("child", 48, 7)
    (base.parent / "missing.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"missing.yaml: extends: nowhere.yaml: no file .*base.yaml"):
        load_experiment(base.parent / "missing.yaml")
    (base.parent / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match=r"loop.yaml: defaults/extends loop"):
        load_experiment(base.parent / "loop.yaml")
    (base.parent / "old.yaml").write_text("defaults:\n  - base\n")
    with pytest.raises(ConfigError, match=r"bad defaults entry .*extends: other.yaml"):
        load_experiment(base.parent / "old.yaml")
