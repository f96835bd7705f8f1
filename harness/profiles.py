"""Where hardware profiles live. Built-in profiles are the files of conf/hardware/ (and vp.cost.PROFILES);
calibrated ones go to the user's config folder, which conf/config.yaml adds to Hydra's config search path
(`hydra.searchpath`), so `backend=sim hardware=NAME` finds them; or to an explicit path. A calibration never
replaces a built-in unless asked to (--overwrite-builtin), and a profile is written whole or not at all."""
import re
from pathlib import Path

from omegaconf import OmegaConf

from vp.checks import check_output_file, writable_folder
from vp.cost import PROFILES, Hardware
from vp.cost import profiles as cost_profiles

CONF = Path(__file__).resolve().parents[1] / "conf"
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def user_conf_dir() -> Path:
    """The folder conf/config.yaml puts on Hydra's search path: $VP_HARNESS_CONFIG, else
    $XDG_CONFIG_HOME/vp-harness, else ~/.config/vp-harness. Read from the config itself, so both always agree."""
    entry = OmegaConf.load(CONF / "config.yaml").hydra.searchpath[0]
    return Path(entry.removeprefix("file://")).expanduser()


def builtin_names() -> set[str]:
    return {p.stem for p in (CONF / "hardware").glob("*.yaml")} | set(PROFILES)


def destination(name: str, out: str | None, overwrite_builtin: bool) -> Path:
    """The file a calibrated profile NAME goes to, checked before any work: ValueError names the field and fix."""
    if not NAME.fullmatch(name):
        raise ValueError(f"--name {name!r}: a profile name is a letter then letters, digits, _ or - (it becomes "
                         f"the option hardware=NAME and the file NAME.yaml); pick such a name")
    builtin = name in builtin_names()
    if overwrite_builtin and not builtin:
        raise ValueError(f"--overwrite-builtin: {name} is not a built-in profile ({', '.join(sorted(builtin_names()))}"
                         f"); drop the flag")
    if builtin and not overwrite_builtin:
        raise ValueError(f"--name {name} is a built-in profile (conf/hardware/{name}.yaml) and calibrating would "
                         f"replace it; pick another --name, or pass --overwrite-builtin to refit the built-in on "
                         f"purpose")
    if out is None and not builtin:  # the user folder is made when the profile is written
        path = user_conf_dir() / "hardware" / f"{name}.yaml"
        made = next(p for p in path.parents if p.exists())
        writable_folder(made, f"the user profile folder {path.parent} (set VP_HARNESS_CONFIG, or pass --out)")
        return path
    if out is None:
        path = CONF / "hardware" / f"{name}.yaml"
    else:
        path = Path(out)
        if path.stem != name:
            raise ValueError(f"--out {out}: the file must be named {name}.yaml (hardware={name} looks for that "
                             f"file); rename it, or give --name {path.stem}")
        if path.resolve().parent == (CONF / "hardware").resolve() and not builtin:
            raise ValueError(f"--out {out}: conf/hardware/ holds the built-in profiles; write calibrated ones to "
                             f"{user_conf_dir() / 'hardware'} (the default) or elsewhere")
    return check_output_file(str(path), "--out", (".yaml",))


def usage(path: Path, name: str) -> str:
    """How the sweep finds the profile written to path."""
    found = path.resolve().parent in ((CONF / "hardware").resolve(), (user_conf_dir() / "hardware").resolve())
    if found:
        return f"python -m harness.sweep backend=sim hardware={name} ..."
    if path.parent.name == "hardware":
        return (f"python -m harness.sweep backend=sim hardware={name} "
                f"'hydra.searchpath=[file://{path.resolve().parent.parent}]' ...")
    return (f"copy it to {user_conf_dir() / 'hardware' / (name + '.yaml')}, then "
            f"python -m harness.sweep backend=sim hardware={name} ...")


def read_profile(path: Path) -> dict:
    """The `profile` mapping of a profile file as write_profile writes it ({} where the file holds none), validated
    as a whole (vp.cost.profiles.check_profile); ValueError naming the file for YAML that does not parse, a file
    that is not a mapping, or a profile with a bad field."""
    import yaml

    try:
        with open(path) as f:  # the parser's marks then name the file
            data = yaml.safe_load(f)
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({' '.join(str(err).split())}); fix the file or measure the "
                         f"profile again (python -m harness.calibrate --measure)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a profile file is a mapping (name, profile), not a {type(data).__name__}")
    profile = data.get("profile") or {}
    if profile:
        try:
            cost_profiles.check_profile(profile)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
    return profile


def write_profile(hw: Hardware, path: Path, source: str) -> Path:
    """The profile as a config of the hardware group, written whole (vp.cost.profiles.write_profile)."""
    return cost_profiles.write_profile(hw, path, f"Calibrated by `python -m harness.calibrate` from {source}.\n"
                                                 f"Use it with: {usage(path, hw.name)}")
