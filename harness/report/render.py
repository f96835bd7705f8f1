"""A Table as Markdown (pandas to_markdown) and as a LaTeX booktabs tabular for a paper: the two-level header
spans each vocabulary over its columns, and each setup is a block with its GPUs and sequence length once."""
from harness.report.tables import Table

LATEX_ESCAPES = str.maketrans({"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                               "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                               "^": r"\textasciicircum{}", "–": "--"})


def flat_names(table: Table) -> list[str]:
    return [bottom if not top else f"{top} {bottom}" for top, bottom in table.data.columns]


def markdown(table: Table) -> str:
    keys = sum(1 for top, _ in table.data.columns if not top)
    align = ["left"] * keys + ["right"] * (len(table.data.columns) - keys)
    # disable_numparse keeps the cells as formatted ('45.10' stays '45.10')
    return table.data.set_axis(flat_names(table), axis=1).to_markdown(index=False, disable_numparse=True,
                                                                     colalign=align)


def escape(text: str) -> str:
    return str(text).translate(LATEX_ESCAPES)


def _header(columns) -> list[str]:
    """The spanning row of the top names with their cmidrules (booktabs), then the row of the bottom names."""
    spans, start = [], 0
    tops = [top for top, _ in columns]
    for i in range(1, len(tops) + 1):
        if i == len(tops) or tops[i] != tops[start]:
            spans.append((tops[start], start, i))
            start = i
    cells = []
    for top, begin, end in spans:
        if top:
            cells.append(fr"\multicolumn{{{end - begin}}}{{c}}{{{escape(top)}}}")
        else:
            cells += [""] * (end - begin)
    rules = " ".join(fr"\cmidrule(lr){{{begin + 1}-{end}}}" for top, begin, end in spans if top)
    names = " & ".join(escape(bottom) for _, bottom in columns) + r" \\"
    return [" & ".join(cells) + r" \\", rules, names] if rules else [names]


def latex(table: Table) -> str:
    columns = list(table.data.columns)
    keys = sum(1 for top, _ in columns if not top)
    lines = [f"% {escape(table.title)}: {escape(table.note)}",
             r"\begin{tabular}{" + "l" * keys + "r" * (len(columns) - keys) + "}", r"\toprule",
             *_header(columns), r"\midrule"]
    previous = None
    for row in table.data.itertuples(index=False):
        block = tuple(row[: table.blocks])
        if previous is not None and block != previous:
            lines.append(r"\midrule")
        shown = ["" if block == previous and i < table.blocks else escape(v) for i, v in enumerate(row)]
        lines.append(" & ".join(shown) + r" \\")
        previous = block
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)
