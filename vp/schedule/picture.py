"""Timeline pictures of a simulated schedule, in the style of the paper's figures: one row per rank,
one box per pass with its microbatch inside, idle time left white."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402

from vp.schedule.actions import Schedule  # noqa: E402
from vp.schedule.simulate import SimResult  # noqa: E402

COLORS = {"F": "#4e79a7", "B": "#59a14f", "W": "#8cd17d", "S": "#f28e2b", "T": "#e15759",
          "IF": "#b07aa1", "IB": "#d4a6c8"}
CHUNK_SHADE = 0.35  # later chunks are drawn lighter


def _shade(color: str, chunk: int) -> tuple:
    rgb = matplotlib.colors.to_rgb(color)
    mix = min(1.0, CHUNK_SHADE * chunk)
    return tuple(c + (1 - c) * mix for c in rgb)


def draw(s: Schedule, result: SimResult, path: str, title: str | None = None, unit: str | None = None) -> str:
    """Write a PNG (or PDF, by suffix) timeline of `result` to `path`, time in `unit` (None: cost units)."""
    span = result.makespan or 1.0
    boxes = sum(len(tl) for tl in result.timeline)
    width = min(40.0, max(8.0, 0.12 * boxes / s.pp))
    fig, ax = plt.subplots(figsize=(width, 0.45 * s.pp + 1.0))
    label = boxes / s.pp <= 400  # microbatch numbers only where they can be read
    boxes_of: dict[tuple, list] = {}  # (kind, chunk) -> the corners of each of its boxes, on every rank
    for r, tl in enumerate(result.timeline):
        for a, t0, t1 in tl:
            if a.kind in COLORS and t1 > t0:
                boxes_of.setdefault((a.kind, a.chunk), []).append(
                    ((t0, r - 0.4), (t0, r + 0.4), (t1, r + 0.4), (t1, r - 0.4)))
                if label and (t1 - t0) / span > 0.006:
                    ax.text((t0 + t1) / 2, r, str(a.mb), ha="center", va="center", fontsize=6)
    for (kind, chunk), corners in boxes_of.items():  # one collection per pass kind and chunk: fast for long schedules
        ax.add_collection(PolyCollection(corners, facecolors=_shade(COLORS[kind], chunk), edgecolors="black",
                                         linewidths=0.3 if label else 0.0))
    ax.set_xlim(0, span)
    ax.set_ylim(s.pp - 0.5, -0.5)
    ax.set_yticks(range(s.pp), [f"rank {r}" for r in range(s.pp)])
    ax.set_xlabel(f"time ({unit})" if unit else "time (cost units)")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), ncol=1, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7,
              frameon=False)
    ax.set_title(title or f"{s.method}  pp={s.pp}  microbatches={s.microbatches}  "
                 f"bubble={result.bubble_rate:.3f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
