"""Composing a sweep's jobs with Hydra: compose_checked (one job, its composition errors as one refusal with the
fix) and JobComposer (a grid's jobs with Hydra composing once per option of each self-contained group)."""
import re

import yaml

from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness import schema


def _type_of(key: str) -> str | None:
    """The declared type of a typed field 'run.pp' -> 'int', from harness.schema; None when not typed."""
    from dataclasses import fields

    path, _, name = key.rpartition(".")
    cls = schema.SECTIONS.get(path)
    hint = next((f.type for f in fields(cls) if f.name == name), None) if cls else None
    return None if hint is None else getattr(hint, "__name__", str(hint))


def _schema_for(path: str, overrides: list[str]):
    if path == "cluster":  # the cluster file picked on the command line, else the default (local)
        name = next((o.split("=", 1)[1] for o in overrides if o.startswith("cluster=")), "local")
        return schema.CLUSTERS.get(name, schema.LocalCluster)
    return schema.SECTIONS.get(path, schema.SweepSchema)


def _describe(err: Exception, overrides: list[str]) -> str:
    """A Hydra or OmegaConf composition error as one refusal: what was wrong and the fix."""
    text = str(err).strip().splitlines()
    first = text[0] if text else type(err).__name__
    cause = err.__cause__
    if cause is not None and str(cause).strip():
        detail = str(cause).strip().splitlines()[0]
        key = getattr(cause, "full_key", None) or ""
        missing = re.search(r"Key '([^']+)' (?:is )?not in", detail)
        if missing and key:
            name = missing.group(1)
            path = "" if key == name else key[: -len(name) - 1] if key.endswith("." + name) else key
            if path in schema.SECTIONS or path == "cluster":
                return schema.unknown_key_message(path, name, _schema_for(path, overrides))
            return (f"{path}.{name} does not exist in {path}; add it with +{path}.{name}=VALUE, or replace "
                    f"{path} whole with '~{path}' '+{path}={{...}}'")
        kind = _type_of(key) if key else None
        override = first.removeprefix("Error merging override ").strip()
        if kind:
            return f"{override}: {detail}; {key} takes a value of type {kind}"
        first = f"{first}: {detail}"
    if first.startswith("Could not override '"):
        key = first.split("'")[1]
        path, _, name = key.rpartition(".")
        if path in schema.SECTIONS or path == "cluster":
            return schema.unknown_key_message(path, name, _schema_for(path, overrides))
    options = [line.strip() for line in text[1:] if line.strip() and not line.strip().startswith(("provider=",
                                                                                                 "Config search"))]
    hint = ""
    if first.startswith("In 'config': Could not find 'hardware/"):
        from harness.profiles import user_conf_dir

        hint = (f"; calibrated profiles are read from {user_conf_dir() / 'hardware'} (python -m harness.calibrate "
                f"--name NAME writes there)")
    return first + (f" ({' '.join(options)})" if options else "") + hint


def compose_checked(overrides: list[str]) -> DictConfig:
    try:
        cfg = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ValueError(_describe(err, overrides)) from None
    except yaml.YAMLError as err:  # a config file (a hand-edited or truncated profile) that does not parse
        raise ValueError(f"a config file is not valid YAML: {' '.join(str(err).split())}; fix or remove that "
                         f"file") from None
    schema.check(cfg)
    return cfg


class JobComposer:
    """A job's config, as compose_checked(fixed + extra) gives it, with Hydra composing far fewer times than there are
    jobs (composing is most of planning: a paper grid's 192 jobs took 97 compositions of about 0.3 s of CPU each).

    Hydra merges the defaults list (schema, each group's option, the primary config, the experiment), then applies
    the plain `key=value` overrides in order with OmegaConf.update(cfg, key, value, merge=True). So:
    - a job's values are applied the same way to a copy of the config of its group choices;
    - an option confined to its own group's node (a `@package <group>` file without a defaults list, as every
      model/vocab/method option is) changes nothing but that node, and that node is the same whatever the other
      confined groups chose: the config of (model=a, vocab=b, method=c) is the one of (model=a0, vocab=b0,
      method=c0) with its model node taken from the composition of (model=a, vocab=b0, method=c0), and so on. Hydra
      composes once per option of such a group, not once per combination (paper_1f1b: 13 times, not 97).
    The other group choices (experiment=, an option with a defaults list or another package) are composed as they
    are. Anything else (+key, ~key, key@pkg=, a value Hydra's way would refuse) goes through compose_checked itself,
    whose error is the one to show."""

    def __init__(self, fixed: list[str]):
        self.fixed, self.parser = fixed, OverridesParser.create()
        self.loader = GlobalHydra.instance().config_loader()
        self.groups = set(self.loader.list_groups(""))
        fixed_groups = {o.split("=", 1)[0] for o in fixed}
        # groups the command line chose for every job are composed with every job, never swapped
        self.swappable = {g for g in self.groups if g not in fixed_groups}
        self.confined_options, self.configs, self.anchors = {}, {}, {}
        self.compositions = 0

    def _confined(self, group: str, option: str) -> bool:
        """Whether group/option writes only its own node (its package is the group's) and pulls in nothing else."""
        key = (group, option)
        if key not in self.confined_options:
            try:
                found = self.loader.repository.load_config(f"{group}/{option}")
            except Exception:  # noqa: BLE001 - unreadable here (e.g. a file of the user's search path): compose it
                found = None
            self.confined_options[key] = found is not None and not found.defaults_list and \
                found.header.get("package") in (None, group)
        return self.confined_options[key]

    def _compose(self, overrides: tuple[str, ...]) -> DictConfig:
        if overrides not in self.configs:
            self.configs[overrides] = compose(config_name="config", overrides=self.fixed + list(overrides))
            self.compositions += 1
        return self.configs[overrides]

    def __call__(self, extra: list[str]) -> DictConfig:
        try:
            parsed = self.parser.parse_overrides(extra)
        except HydraException:
            return compose_checked(self.fixed + extra)
        if any(o.is_add() or o.is_delete() or o.is_force_add() or o.is_sweep_override() or o.package is not None
               for o in parsed):
            return compose_checked(self.fixed + extra)
        chosen = [o for o in parsed if o.key_or_group in self.groups]
        values = [o for o in parsed if o.key_or_group not in self.groups]
        swapped = {o.key_or_group: o.value() for o in chosen if o.key_or_group in self.swappable and
                   isinstance(o.value(), str) and self._confined(o.key_or_group, o.value())}
        kept = tuple(o.input_line for o in chosen if o.key_or_group not in swapped)
        try:
            # the first job of these kept choices and swapped groups anchors them: its choices are composed whole
            anchor = self.anchors.setdefault((kept, tuple(sorted(swapped))), swapped)
            cfg = self._compose(kept + _choices(anchor)).copy()  # a deep copy, with its flags (struct)
            for group, option in swapped.items():
                if option != anchor[group]:
                    cfg[group] = self._compose(kept + _choices({**anchor, group: option}))[group]
            for o in values:
                OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        except (HydraException, OmegaConfBaseException, yaml.YAMLError):
            return compose_checked(self.fixed + extra)
        schema.check(cfg)
        return cfg


def _choices(options: dict[str, str]) -> tuple[str, ...]:
    return tuple(f"{group}={options[group]}" for group in sorted(options))
