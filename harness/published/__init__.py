"""Published measurements to calibrate and check the cost model against: one CSV per experiment in this folder
(harness/published/<experiment>.csv), its provenance in the leading '#' lines. A row names a run by method,
pipeline size, layers, hidden size, sequence length and vocabulary size and gives its published MFU (percent)
and peak memory (GiB). An optional harness/published/<experiment>.md holds a published statement the report of
that experiment quotes beside what the runs show."""
import csv
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
# the published tables a fit may see: the 1F1B artifact only. Every other table (V-Half, the padding statement) is
# held out, predicted from the profile fitted on it (docs/cost-model.md, "Which rows are fitted, which predicted")
FITTABLE = ("paper_artifact",)


def check_fittable(name: str) -> None:
    if name not in FITTABLE:
        raise ValueError(f"--published {name}: harness/published/{name}.csv is held out (it is predicted, never "
                         f"fitted); a profile may be fitted to {', '.join(FITTABLE)} only")


@dataclass(frozen=True)
class Published:
    method: str
    pp: int
    layers: int
    hidden: int
    seq_len: int
    vocab_size: int
    vocab: str
    redis_last_layers: int | None
    mfu: float  # fraction
    peak_memory_bytes: float

    @property
    def key(self) -> tuple:
        return (self.method, self.pp, self.layers, self.hidden, self.seq_len, self.vocab_size)


def available() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.csv"))


def exists(name: str) -> bool:
    return (HERE / f"{name}.csv").is_file()


def statement(name: str) -> str | None:
    """The published statement quoted in experiment NAME's report (harness/published/NAME.md), if any."""
    path = HERE / f"{name}.md"
    return path.read_text().strip() if path.is_file() else None


def path_of(name: str) -> Path:
    path = HERE / f"{name}.csv"
    if not path.is_file():
        raise ValueError(f"no published measurements named {name!r}; available: {', '.join(available()) or 'none'} "
                         f"(files harness/published/<name>.csv)")
    return path


def source(name: str) -> str:
    """The provenance lines of a published table, as one paragraph."""
    lines = path_of(name).read_text().splitlines()
    return " ".join(line.lstrip("# ").strip() for line in lines if line.startswith("#"))


def load(name: str) -> list[Published]:
    lines = [line for line in path_of(name).read_text().splitlines() if line and not line.startswith("#")]
    rows = []
    for r in csv.DictReader(lines):
        last = r.get("redis_last_layers") or None
        rows.append(Published(r["method"], int(r["pp"]), int(r["layers"]), int(r["hidden"]), int(r["seq_len"]),
                              int(r["vocab_size"]), r["vocab"],
                              int(last) if last else None, float(r["mfu_percent"]) / 100,
                              float(r["peak_memory_gib"]) * 2**30))
    return rows


def key_of(config: dict) -> tuple:
    """The published key of a run config (a RunConfig's to_dict or a record's config)."""
    return (config["method"], int(config["pp"]), int(config["layers"]), int(config["hidden"]), int(config["seq_len"]),
            int(config["vocab_size"]))


def same_run(config: dict, row: Published) -> bool:
    """Whether a run config is the published run: the same key and, for redis, the same last-stage layers."""
    return key_of(config) == row.key and (row.redis_last_layers is None
                                          or config.get("redis_last_layers") == row.redis_last_layers)


def pair(name: str, configs: list[dict]) -> list[tuple[dict, Published]]:
    """Each run config with its published row; every row must be run and every run published, with the same
    layers on redis's last stage."""
    rows = {r.key: r for r in load(name)}
    pairs, seen = [], set()
    for config in configs:
        key = key_of(config)
        if key not in rows:
            raise ValueError(f"run {key} of experiment {name} has no published row in {path_of(name)}")
        row = rows[key]
        if row.redis_last_layers is not None and config.get("redis_last_layers") != row.redis_last_layers:
            raise ValueError(f"run {key}: redis_last_layers={config.get('redis_last_layers')} but the published run "
                             f"kept {row.redis_last_layers} layers on the last stage; set run.redis_last_layers")
        pairs.append((config, row))
        seen.add(key)
    missing = sorted(set(rows) - seen)
    if missing:
        raise ValueError(f"published rows {missing} have no run in experiment {name}; add them to its grid")
    return pairs
