"""A grid of line panels drawn with matplotlib alone: what seaborn's relplot(kind="line", marker="o",
errorbar=None) drew for the reports (one panel per facet, one line per hue level, the mean of the values at each x,
a shared legend on the right), at a fraction of its cost.

Seaborn lays a FacetGrid out with tight_layout twice (at creation and after the legend), each a full draw of
every panel's tick labels, and runs its semantic mapping per panel; on the paper grids' per-rank figures (48
panels) that was most of `make paper-tables`. Here the layout is fixed in inches from the grid's shape (no
measuring pass), the values are averaged in one groupby, and each line is one Axes.plot: a figure is drawn once
per file written."""
from math import ceil

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.ticker import MaxNLocator

# dash patterns of the style levels, as seaborn's (solid first), then longer dashes for any further level
DASHES = ["", (4, 1.5), (1, 1), (3, 1.25, 1.5, 1.25), (5, 1, 1, 1)]
# the fixed layout, in inches: outer margins, gaps between panels, legend text
LEFT, BOTTOM, TOP, RIGHT = 0.75, 0.5, 0.3, 0.1
GAP_SHARED, GAP_OWN, GAP_ROW = 0.15, 0.6, 0.45  # between columns sharing y / each with its own y; between rows
ROW_TITLE = 0.25  # the row names beside rank_rows' rows
CHAR, LINE = 0.07, 0.17  # legend: inches per character of a label, per entry


def _dashes(n: int) -> list:
    return DASHES[:n] + [(2 + i, 1) for i in range(max(0, n - len(DASHES)))]


def line_panels(data: pd.DataFrame, x: str, y: str, hue: str, hue_order: list, col: str, col_order: list,
                col_wrap: int | None = None, style: str | None = None, style_order: list | None = None,
                sharey: bool = True, height: float = 2.4, aspect: float = 1.25, col_title: str = "{}",
                xlabel: str = "", ylabel: str = "") -> tuple[plt.Figure, list]:
    """The figure and its panels (axes in col_order, col_wrap to a row, on a shared x axis). Each panel holds the
    rows of one `col` value; each line one `hue` (and `style`) level, at the mean `y` of each `x`, sorted by x."""
    ncols = min(col_wrap or len(col_order), len(col_order))
    nrows, cells = ceil(len(col_order) / ncols), list(col_order)
    width, high = height * aspect, height
    own_y = sharey is False
    gap = GAP_OWN if own_y else GAP_SHARED
    styles = list(style_order) if style else []
    entries = len(hue_order) + 1 + (len(styles) + 1 if styles else 0)
    legend = CHAR * max(len(str(v)) for v in [hue, *hue_order, *([style] if style else []), *styles]) + 0.6
    right = RIGHT + legend
    fig_w = LEFT + ncols * width + (ncols - 1) * gap + right
    fig_h = max(BOTTOM + nrows * high + (nrows - 1) * GAP_ROW + TOP, entries * LINE + 0.4)
    fig, grid = plt.subplots(nrows, ncols, figsize=(fig_w, fig_h), sharex=True, sharey=sharey, squeeze=False)
    fig.subplots_adjust(left=LEFT / fig_w, right=1 - right / fig_w, bottom=BOTTOM / fig_h,
                        top=(BOTTOM + nrows * high + (nrows - 1) * GAP_ROW) / fig_h, wspace=gap / width,
                        hspace=GAP_ROW / high)
    flat = list(grid.flat)
    for ax in flat[len(cells):]:  # the unused cells of a wrapped grid: the panel above shows its x labels
        above = flat[flat.index(ax) - ncols]
        above.xaxis.set_tick_params(labelbottom=True)
        above.set_xlabel(xlabel)
        ax.remove()
    panels = flat[:len(cells)]
    colors = dict(zip(hue_order, sns.color_palette(n_colors=len(hue_order))))
    dashes = dict(zip(styles, _dashes(len(styles))))
    keys = [k for k in (col, hue, style) if k is not None]
    means = data.groupby(keys + [x], sort=True, observed=True)[y].mean()
    lines = {}
    for key, values in means.groupby(level=list(range(len(keys))), sort=False):
        lines[key if isinstance(key, tuple) else (key,)] = values.droplevel(list(range(len(keys))))
    for ax, c in zip(panels, cells):
        for h in hue_order:
            for s in styles or [None]:
                key = (c, h, s) if style else (c, h)
                if key in lines:
                    line = lines[key]
                    dash = {"dashes": dashes[s]} if dashes.get(s) else {}
                    ax.plot(line.index, line.to_numpy(), color=colors[h], marker="o", mec="w", **dash)
        ax.spines[["top", "right"]].set_visible(False)
    for i, ax in enumerate(panels):
        ax.set_title(col_title.format(cells[i]))
        if i % ncols == 0 or own_y:
            ax.set_ylabel(ylabel)
        if i + ncols >= len(flat):  # the bottom row
            ax.set_xlabel(xlabel)
    handles = [plt.Line2D([], [], linestyle="none", label=hue)]
    handles += [plt.Line2D([], [], color=colors[h], marker="o", label=str(h)) for h in hue_order]
    if styles:
        handles.append(plt.Line2D([], [], linestyle="none", label=style))
        handles += [plt.Line2D([], [], color=".2", label=str(s), **({"dashes": dashes[s]} if dashes[s] else {}))
                    for s in styles]
    fig.legend(handles=handles, loc="center right", frameon=False, handlelength=2.0)
    return fig, panels


def rank_rows(data: pd.DataFrame, hue: str, hue_order: list, col: str, col_order: list, row: str, row_order: list,
              height: float = 2.0, aspect: float = 1.2, ylabel: str = "") -> plt.Figure:
    """Per-rank values (columns "rank" and "value") as a row x column grid of panels, each row drawn as one Axes:
    the columns' panels sit side by side on it, each over its own segment of the x axis (ranks 0..n-1, n the row's
    largest rank count), separated by a line, with the column's name above it in the top row. The panels of a row
    share their axes, as a row-shared grid would; drawing one Axes per row instead of one per panel (tick labels,
    grid lines) makes the 48-panel figures of the paper grids several times cheaper to draw."""
    width = height * aspect
    ncols, nrows = len(col_order), len(row_order)
    legend = CHAR * max(len(str(v)) for v in [hue, *hue_order]) + 0.6
    right = RIGHT + legend + ROW_TITLE
    fig_w = LEFT + ncols * width + right
    fig_h = max(BOTTOM + nrows * height + (nrows - 1) * GAP_ROW + TOP, (len(hue_order) + 1) * LINE + 0.4)
    fig, axes = plt.subplots(nrows, 1, figsize=(fig_w, fig_h), squeeze=False)
    fig.subplots_adjust(left=LEFT / fig_w, right=1 - right / fig_w, bottom=BOTTOM / fig_h,
                        top=(BOTTOM + nrows * height + (nrows - 1) * GAP_ROW) / fig_h, hspace=GAP_ROW / height)
    colors = dict(zip(hue_order, sns.color_palette(n_colors=len(hue_order))))
    means = data.groupby([row, col, hue, "rank"], sort=True, observed=True)["value"].mean()
    lines = {key: values.droplevel([0, 1, 2]) for key, values in means.groupby(level=[0, 1, 2], sort=False)}
    for i, (ax, r) in enumerate(zip(axes[:, 0], row_order)):
        n = int(data.loc[data[row] == r, "rank"].max()) + 1
        ticks = [int(t) for t in MaxNLocator(nbins=4, integer=True).tick_values(0, n - 1) if 0 <= t <= n - 1]
        xticks, xlabels = [], []
        for j, c in enumerate(col_order):
            off = j * (n + 1)  # this panel's rank 0; a gap of one rank between panels, the separator in it
            for h in hue_order:
                if (r, c, h) in lines:
                    line = lines[(r, c, h)]
                    ax.plot(off + line.index.to_numpy(), line.to_numpy(), color=colors[h], marker="o", mec="w")
            xticks += [off + t for t in ticks]
            xlabels += [str(t) for t in ticks]
            if j:
                ax.axvline(off - 1, color=".15", linewidth=0.8)
            if i == 0:
                ax.text(off + (n - 1) / 2, 1.02, str(c), transform=ax.get_xaxis_transform(), ha="center",
                        va="bottom")
        ax.set_xlim(-1, ncols * (n + 1) - 1)
        ax.set_xticks(xticks, xlabels)
        ax.annotate(str(r), xy=(1.01, 0.5), xycoords="axes fraction", rotation=270, ha="left", va="center")
        ax.set_ylabel(ylabel)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1, 0].set_xlabel("rank")
    handles = [plt.Line2D([], [], linestyle="none", label=hue)]
    handles += [plt.Line2D([], [], color=colors[h], marker="o", label=str(h)) for h in hue_order]
    fig.legend(handles=handles, loc="center right", frameon=False, handlelength=2.0)
    return fig
