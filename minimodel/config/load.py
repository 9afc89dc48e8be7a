"""Loading an experiment's configuration: YAML composition, ``key=value`` overrides, the checks that hold for
every system (``checks``); writing it back (``save_config``).

An experiment YAML names base files from ``conf/`` in a ``defaults:`` list and holds only what
differs; ``key=value`` overrides come last. Everything is merged into the dataclasses of ``schema``, so an
unknown key, a wrong type or a missing required value (``???``) fails at load time, naming the key
and the file (or override) it came from.

``defaults`` entries look like Hydra's: ``- model: roberta-base`` merges ``conf/model/roberta-base.yaml``
under the key ``model``; ``- optim@pretrain.optim: pretrain`` merges ``conf/optim/pretrain.yaml``
under ``pretrain.optim``. Base files may have their own ``defaults``.

The system's own checks are not run here (this package knows nothing of the systems): a command loads its
configuration with ``experiment.load_experiment``, which adds them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException, ValidationError

from minimodel.config.checks import validate
from minimodel.config.schema import ExperimentConfig, ModelConfig
from minimodel.errors import ConfigError
from minimodel.store import atomic


def find_conf_dir(config_file: Path) -> Path:
    """``conf/`` next to the experiment's folder, or $MINIMODEL_CONF, or ./conf."""
    candidates = [Path(os.environ["MINIMODEL_CONF"])] if "MINIMODEL_CONF" in os.environ else []
    candidates += [config_file.resolve().parent.parent / "conf", config_file.resolve().parent, Path.cwd() / "conf"]
    for c in candidates:
        if (c / "model").is_dir():
            return c
    raise ConfigError(f"{config_file}: cannot find the conf/ directory (looked in {[str(c) for c in candidates]})")


def load_yaml_mapping(path: Path, what: str = "config file", error: type[ConfigError] = ConfigError) -> DictConfig:
    """A YAML file holding a mapping; ``error`` (naming the file) when it is missing, invalid or not a mapping."""
    if path.is_dir():
        yamls = sorted(p.name for p in path.glob("*.y*ml"))[:6]
        raise error(f"{what} {path} is a directory, not a YAML file: give one of its files"
                    + (f" ({', '.join(yamls)}{', ...' if len(yamls) == 6 else ''})" if yamls else ""))
    if not path.is_file():
        raise error(f"{what} not found: {path}")
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # yaml errors
        raise error(f"{path}: not valid YAML: {e}") from e
    if not isinstance(cfg, DictConfig):
        raise error(f"{path}: expected a mapping at the top level")
    return cfg


def _compose(path: Path, conf_dir: Path, seen: tuple[Path, ...] = (), experiment: bool = True
             ) -> list[tuple[str, DictConfig]]:
    """(source, fragment) pairs in merge order: the experiment it ``extends`` (recursively), the defaults
    (recursively), then the file itself.

    In an experiment file ``- group: name`` lands under ``group``; in a base file it lands at that
    file's own level (``conf/model/roberta-small.yaml`` can start from ``- model: roberta-base``).
    ``extends: other.yaml`` (a path relative to the file) starts an experiment from another one: the file then
    holds only what differs (a list, such as ``sweep``, replaces the other's whole list)."""
    if path.resolve() in seen:
        raise ConfigError(f"{path}: defaults/extends loop through {[str(s) for s in seen]}")
    cfg = load_yaml_mapping(path)
    parts: list[tuple[str, DictConfig]] = []
    parent = cfg.pop("extends", None)
    if parent is not None:
        if not experiment:
            raise ConfigError(f"{path}: 'extends' is for experiment files; a file in conf/ starts from another "
                              f"with a defaults entry")
        if not isinstance(parent, str) or not parent:
            raise ConfigError(f"{path}: 'extends' must name one experiment file (e.g. extends: study.yaml), "
                              f"got {parent!r}")
        base = path.parent / parent
        if not base.is_file():
            options = sorted(p.name for p in path.parent.glob("*.yaml") if p != path)
            raise ConfigError(f"{path}: extends: {parent}: no file {base} (experiments beside it: {options})")
        parts += _compose(base, conf_dir, seen + (path.resolve(),))
    defaults = cfg.pop("defaults", [])
    if not isinstance(defaults, (ListConfig, list)):
        raise ConfigError(f"{path}: 'defaults' must be a list of 'group: name' entries")
    for entry in defaults:
        if not isinstance(entry, DictConfig) or len(entry) != 1:
            raise ConfigError(f"{path}: bad defaults entry {entry!r}; expected 'group: name' or 'group@key.path: name' "
                              f"(to start from another experiment file: extends: other.yaml)")
        (spec, name), = entry.items()
        group, _, package = str(spec).partition("@")
        package = package or (group if experiment else "")
        base = conf_dir / group / f"{name}.yaml"
        if not base.is_file():
            options = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
            raise ConfigError(f"{path}: defaults entry '{spec}: {name}': no file {base} (available: {options})")
        for source, fragment in _compose(base, conf_dir, seen + (path.resolve(),), experiment=False):
            if package:
                wrapped = OmegaConf.create({})
                OmegaConf.update(wrapped, package, fragment, force_add=True)
                fragment = wrapped
            parts.append((source, fragment))
    parts.append((str(path), cfg))
    return parts


def model_preset(name: str, vocab_size: int = 50_000, conf_dir: Path | None = None, **overrides: Any) -> ModelConfig:
    """``conf/model/{name}.yaml`` (what ``- model: NAME`` gives an experiment) with ``data.vocab_size`` set to
    ``vocab_size``: the YAML files are the one definition of the model presets (roberta-base, roberta-small, tiny)."""
    conf_dir = conf_dir or Path(__file__).resolve().parents[2] / "conf"
    path = conf_dir / "model" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"no model preset {name!r}: {path} does not exist "
                          f"(available: {sorted(p.stem for p in (conf_dir / 'model').glob('*.yaml'))})")
    cfg: DictConfig = OmegaConf.structured(ExperimentConfig)
    cfg.data.vocab_size = vocab_size
    for source, fragment in [*_compose(path, conf_dir, experiment=False), ("overrides", OmegaConf.create(overrides))]:
        cfg = _merge(cfg, OmegaConf.create({"model": fragment}), source)
    OmegaConf.resolve(cfg)
    return ModelConfig(**OmegaConf.to_container(cfg.model))  # type: ignore[arg-type]


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r}: expected key=value (e.g. pretrain.optim.updates=1000)")
    try:
        parsed = OmegaConf.create({"v": value} if value == "" else f"v: {value}")["v"]
    except Exception as e:  # yaml's scanner / parser errors, or OmegaConf's on what they produced
        raise ConfigError(f"override {item!r}: not a valid value ({value_problem(e)}); write a number, a word, "
                          f"a [list] or a {{mapping}} in YAML, and quote a string that holds YAML's signs "
                          f"(in the shell: {key.strip()}=\"'...'\")") from e
    return key.strip(), parsed


def value_problem(e: Exception) -> str:
    """What the YAML parser (or OmegaConf) found wrong, on one line and without YAML's positions (they count
    from the ``v: `` the value is parsed under)."""
    parts = [str(getattr(e, name)) for name in ("context", "problem") if getattr(e, name, None)]
    if type(e).__module__.partition(".")[0] == "yaml":  # PyYAML's errors (omegaconf's dependency)
        return "YAML: " + (": ".join(parts) if parts else str(e).splitlines()[0])
    return str(e).splitlines()[0]


def _merge(base: DictConfig, fragment: DictConfig, source: str, error: type[ConfigError] = ConfigError,
           noun: str = "config") -> DictConfig:
    """``base`` updated with ``fragment``; unknown keys and bad values raise ``error`` naming ``source`` and the key."""
    try:
        return OmegaConf.merge(base, fragment)  # type: ignore[return-value]
    except ConfigKeyError as e:
        raise error(f"{source}: unknown {noun} key '{e.full_key}'" + _hint(base, str(e.full_key))) from e
    except (ValidationError, TypeError) as e:  # TypeError: a list merged into a mapping, or the reverse
        key, clash = _clash(OmegaConf.to_container(base), OmegaConf.to_container(fragment))
        named = getattr(e, "full_key", None)
        if clash and (not named or named == key):  # (OmegaConf names no key for these, or only what it found)
            raise error(f"{source}: bad value for '{key}': {clash}") from e
        if isinstance(e, TypeError):
            raise
        raise error(f"{source}: bad value for '{e.full_key}': {str(e.msg).splitlines()[0]}") from e
    except OmegaConfBaseException as e:
        raise error(f"{source}: {e}") from e


def _kind(value: Any) -> str:
    return "a mapping (key: value)" if isinstance(value, dict) else "a list" if isinstance(value, list) else "a value"


def _clash(base: Any, fragment: Any, prefix: str = "") -> tuple[str, str]:
    """The first key where ``base`` holds a mapping or a list and ``fragment`` gives another kind of value (a list
    for a mapping, a number for a section: what OmegaConf's merge refuses without naming the key), and what is
    wrong there; ("", "") if none."""
    if not isinstance(base, dict) or not isinstance(fragment, dict):
        return "", ""
    for k, value in fragment.items():
        held, key = base.get(k), f"{prefix}{k}"
        if isinstance(held, dict) and isinstance(value, dict):
            found = _clash(held, value, f"{key}.")
            if found[0]:
                return found
        elif isinstance(held, (dict, list)) and value is not None and _kind(held) != _kind(value):
            return key, f"it takes {_kind(held)}, got {_kind(value)} ({value!r})"
    return "", ""


def _hint(cfg: DictConfig, full_key: str) -> str:
    parent, _, _ = full_key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if isinstance(node, DictConfig):
        return f"; valid keys under '{parent or '<top level>'}': {', '.join(str(k) for k in node.keys())}"
    return ""


def load_structured(schema: type, path: Path, what: str, error: type[ConfigError] = ConfigError,
                    noun: str = "config") -> Any:
    """A YAML file read into the dataclass ``schema``: one way of failing for every config-like file."""
    cfg = _merge(OmegaConf.structured(schema), load_yaml_mapping(path, what, error), str(path), error, noun)
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise error(f"{path}: {e}") from e


def _apply_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """``cfg`` with each ``key=value`` of ``overrides`` merged in turn, an error naming the override at fault. Merging
    copies the whole structured config, so where no key is given twice or inside another (each override reaches its
    own part of the tree, and the order cannot matter) they are merged at once; any error is then found again one
    override at a time, so its message is the one the override alone gives."""
    parsed = [(item, *_parse_override(item)) for item in overrides]

    def fragment_of(pairs: list[tuple[str, str, Any]]) -> DictConfig:
        fragment = OmegaConf.create({})
        for _, key, value in pairs:
            OmegaConf.update(fragment, key, value, force_add=True)
        return fragment

    keys = sorted(key for _, key, _ in parsed)
    apart = all(not (b == a or b.startswith(a + ".")) for a, b in zip(keys, keys[1:]))
    if apart and len(parsed) > 1:
        try:
            return OmegaConf.merge(cfg, fragment_of(parsed))  # type: ignore[return-value]
        except Exception:  # found again below, override by override, with its own message
            pass
    for item, key, value in parsed:
        cfg = _merge(cfg, fragment_of([(item, key, value)]), f"override '{item}'")
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Compose, override, validate (the checks that hold for every system; ``experiment.load_experiment`` adds the
    system's own). Returns a typed ``ExperimentConfig`` (an OmegaConf-backed object)."""
    path = Path(path)
    conf_dir = find_conf_dir(path)
    cfg: DictConfig = OmegaConf.structured(ExperimentConfig)
    for source, fragment in _compose(path, conf_dir):
        cfg = _merge(cfg, fragment, source)
    cfg = _apply_overrides(cfg, overrides or [])
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{path}: missing required value(s) {', '.join(missing)} (set them in the file or as key=value)")
    try:
        OmegaConf.resolve(cfg)
        obj: ExperimentConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except (MissingMandatoryValue, OmegaConfBaseException) as e:
        raise ConfigError(f"{path}: {e}") from e
    except ValueError as e:  # __post_init__ checks (ModelConfig)
        raise ConfigError(f"{path}: {e}") from e
    validate(obj, str(path))
    return obj



def to_yaml(cfg: ExperimentConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_config(cfg: ExperimentConfig, path: Path) -> None:
    """The settings a stage ran with (``config.yaml``), written whole (``atomic``)."""
    atomic.write_text(path, to_yaml(cfg))
