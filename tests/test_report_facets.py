"""The reports' figure grids (harness.report.facets) hold the values they are given: one line per hue level at the
mean of each x (as seaborn's relplot drew them), panels in order; and the experiments of a report are shared out
between processes by record count."""
import matplotlib.pyplot as plt
import pandas as pd

from harness.report.build import _shares
from harness.report.facets import line_panels, rank_rows


def _lines(ax) -> dict:
    return {line.get_color(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()
            if len(line.get_xdata())}


def test_line_panels_draw_the_mean_of_each_x_per_hue_level_in_panel_order():
    data = pd.DataFrame({"panel": ["b", "b", "b", "a", "a"], "method": ["m1", "m1", "m2", "m1", "m1"],
                         "x": [2, 2, 1, 4, 1], "y": [1.0, 3.0, 5.0, 7.0, 8.0]})
    fig, panels = line_panels(data, "x", "y", "method", ["m2", "m1"], "panel", ["a", "b"], col_wrap=4)
    assert [ax.get_title() for ax in panels] == ["a", "b"]
    a, b = (sorted(_lines(ax).values()) for ax in panels)
    assert a == [([1, 4], [8.0, 7.0])]  # sorted by x
    assert sorted(b) == [([1], [5.0]), ([2], [2.0])]  # the two values at x = 2 averaged
    plt.close(fig)


def test_rank_rows_put_each_panel_on_its_own_segment_of_the_row():
    data = pd.DataFrame({"setup": ["s"] * 6, "method": ["m1"] * 3 + ["m2"] * 3, "vocab": ["32k"] * 6,
                         "rank": [0, 1, 2] * 2, "value": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]})
    fig = rank_rows(data, "vocab", ["32k"], "method", ["m1", "m2"], "setup", ["s"])
    [ax] = fig.axes
    lines = [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()
             if len(line.get_xdata()) == 3]
    assert lines == [([0, 1, 2], [1.0, 2.0, 3.0]), ([4, 5, 6], [4.0, 5.0, 6.0])]  # m2's rank 0 after a gap
    assert [t.get_text() for t in ax.texts] == ["m1", "m2", "s"]  # the panels above, the row beside
    plt.close(fig)


def test_experiments_are_shared_out_by_record_count():
    assert _shares([192, 72, 24, 30], 2) == [[0], [1, 3, 2]]
    assert _shares([10, 10, 10], 3) == [[0], [1], [2]]
    assert sorted(i for share in _shares([5, 1, 9, 3, 7], 2) for i in share) == [0, 1, 2, 3, 4]
