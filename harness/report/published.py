"""What a report says about published measurements (harness/published/): simulated runs beside the published
run of the same config, which runs a calibrated profile was fitted to and which it predicts, and the effect of a
variant (a vocabulary padding, say) beside the published statement about it."""
import statistics

import pandas as pd

from harness import published
from harness.report.frame import MISSING, natural_key
from harness.report.tables import MESH, Table, _cell, _frame, _num, slug


def _profile(g: pd.DataFrame) -> dict:
    return (g["record"].iloc[0].get("env") or {}).get("hardware") or {}


def allocator_peak(run: dict) -> float | None:
    """The largest per-rank peak less that rank's NCCL buffers (metrics.comm_buffer_bytes): what
    torch.cuda.max_memory_reserved, the published figure, can see."""
    metrics = run["record"].get("metrics") or {}
    peak, comm = metrics.get("peak_memory_bytes") or [], metrics.get("comm_buffer_bytes") or []
    if not peak:
        return run["max_memory_bytes"]
    return max(p - (comm[i] if i < len(comm) else 0.0) for i, p in enumerate(peak))


def published_vs_sim(df: pd.DataFrame, name: str) -> tuple[list[Table], list[str]]:
    """Per sim hardware: each published run beside its simulation (MFU, peak memory) and the median error."""
    if not published.exists(name):
        return [], []
    rows = {r.key: r for r in published.load(name)}
    tables, notes = [], []
    for group, g in df[df["backend"] == "sim"].groupby("group", sort=False):
        # published tables are pure pipelines (GPUs = pp): a run on another mesh is not the published run
        pairs = [(run, rows[published.key_of(run["record"]["config"])]) for run in g.to_dict("records")
                 if published.key_of(run["record"]["config"]) in rows and run["gpus"] == run["pp"]]
        if not pairs:
            continue
        columns = [("", "GPUs"), ("", "Seq"), ("", "Method"), ("", "Vocab")]
        for what in ("MFU (%)", "Peak allocator memory (GiB)"):
            columns += [(what, "published"), (what, "simulated"), (what, "sim / pub")]
        cells, errors = [], []
        for run, row in pairs:
            line = [str(row.pp), str(row.seq_len), row.method, row.vocab]
            for value, simulated, scale in ((row.mfu, run["mfu"], 100), (row.peak_memory_bytes,
                                                                          allocator_peak(run), 2**-30)):
                line += [_num(value * scale, ".2f"), _cell(run, lambda r, s=simulated: s * scale, ".2f")]
                ok = run["status"] == "ok" and pd.notna(simulated)
                line.append(_num(simulated / value, ".3f") if ok else MISSING)
            if run["status"] == "ok" and pd.notna(run["mfu"]):
                errors.append(abs(run["mfu"] / row.mfu - 1))
            cells.append(line)
        tables.append(Table(f"published_vs_sim_{slug(group)}", f"Published against simulated, {group}",
                            "Each run of the published table beside its simulation: MFU and peak memory as "
                            "published and as simulated, and their ratio (1 means the cost model reproduces it). "
                            "Memory is what PyTorch's allocator holds (the published figures are Megatron's 'max "
                            "reserved'): the simulated peak without NCCL's buffers, which the allocator does not see.",
                            _frame(columns, cells)))
        if errors:
            notes.append(f"{group}: median |simulated MFU / published MFU - 1| over {len(errors)} runs is "
                         f"{statistics.median(errors) * 100:.2f} % (largest {max(errors) * 100:.1f} %); source: "
                         f"{published.source(name)}")
    return tables, notes


def fitted_or_predicted(df: pd.DataFrame) -> list[str]:
    """For each sim hardware fitted to a published table: which runs here were in the fit, which are predicted."""
    notes = []
    for group, g in df[df["backend"] == "sim"].groupby("group", sort=False):
        source = _profile(g).get("fitted_to") or ""
        if not published.exists(source):
            continue
        rows = {r.key: r for r in published.load(source)}
        keys = [published.key_of(rec["config"]) for rec in g["record"]]
        fitted = [k in rows and published.same_run(rec["config"], rows[k]) for k, rec in zip(keys, g["record"])]
        predicted = g[[not f for f in fitted]]
        by_gpus = []
        for gpus, p in predicted.groupby("gpus"):
            everything = len(p) == int((g["gpus"] == gpus).sum())
            methods = ", ".join(sorted(set(p["method"])))
            by_gpus.append(f"every run on {gpus} GPUs" if everything else f"{methods} on {gpus} GPUs")
        head = (f"{group}: the profile's free parameters were fitted to the published runs of "
                f"harness/published/{source}.csv (reports/{source}/). ")
        if predicted.empty:
            notes.append(head + "Every run here is a fitted run (same method, GPUs, layers, hidden size, sequence, "
                                "vocabulary and redis layers): these numbers are the fit, not predictions.")
        elif len(predicted) == len(g):
            notes.append(head + f"None of the {len(g)} runs here was in the fit: all are predictions.")
        else:
            notes.append(head + f"{sum(fitted)} of the {len(g)} runs here are fitted runs (same method, GPUs, "
                                f"layers, hidden size, sequence, vocabulary and redis layers: fitted values); the other "
                                f"{len(predicted)} are predictions, no measurement of them entered the fit: "
                                f"{'; '.join(by_gpus)}.")
    return notes


def variant_effect(df: pd.DataFrame, name: str) -> tuple[list[Table], list[str]]:
    """Runs that differ only in a variant field: tokens/s of each relative to the cell's first variant."""
    cells = [g for _, g in df.groupby(["group", "mesh_key", "seq_len", "method", "vocab_size"], sort=False)
             if g["variant"].nunique() > 1]
    if not cells:
        return [], []
    columns = [("", "Hardware"), ("", "GPUs"), ("", MESH), ("", "Seq"), ("", "Method"), ("", "Vocab"),
               ("", "Variant"), ("", "Padded vocab"), ("tokens/s", "absolute"), ("tokens/s", "relative to first")]
    rows, effects = [], []
    for g in cells:
        g = g.iloc[sorted(range(len(g)), key=lambda i: natural_key(g["variant"].iloc[i]))]
        ref = g.iloc[0]
        for i, run in enumerate(g.to_dict("records")):
            ok = ref["status"] == "ok" and run["status"] == "ok"
            ratio = run["tokens_per_s"] / ref["tokens_per_s"] if ok else None
            rows.append([run["group"], str(run["gpus"]), run["mesh"], str(run["seq_len"]), run["method"], run["vocab"],
                         run["variant"], str(run["record"]["config"].get("padded_vocab_size", MISSING)),
                         _cell(run, lambda r: r["tokens_per_s"], ".4g"), _num(ratio, ".3f")])
            if ratio is not None and i > 0:
                effects.append(f"{run['method']} ({run['group']}, {run['gpus']} GPUs): {run['variant']} gives "
                               f"{(ratio - 1) * 100:+.1f} % tokens/s against {ref['variant']}")
    notes = ["Effect of the variants in these runs: " + "; ".join(effects) + "."] if effects else []
    said = published.statement(name)
    if said:
        notes.append(f"Published: {said}")
    return [Table("variant_effect", "Effect of the variant", "Runs that differ only in the variant field: "
                  "tokens/s, and tokens/s relative to the first variant of the same cell.", _frame(columns, rows))], notes


# V-Half's two orders (vp.schedule.vhalf): the paper's runs (v-half-vocab branch, no squeeze) and the main branch's
ORDERS = {"vhalf": "vhalf-squeezed"}


def order_effect(df: pd.DataFrame) -> tuple[list[Table], list[str]]:
    """Each V-Half run beside the same run in the squeezed order: MFU, bubble rate and peak memory of each."""
    columns = [("", "Hardware"), ("", "GPUs"), ("", "Seq"), ("", "Vocab"), ("", "Method (paper's order)")]
    for what in ("MFU (%)", "Bubble rate"):
        columns += [(what, "paper's order"), (what, "squeezed"), (what, "squeezed / paper's")]
    columns += [("Peak memory (GiB)", "paper's order"), ("Peak memory (GiB)", "squeezed")]
    rows, gains = [], []
    for _, g in df[df["method"].isin(list(ORDERS) + list(ORDERS.values()))].groupby(
            ["group", "mesh_key", "seq_len", "vocab_size", "variant"], sort=False):
        by = {r["method"]: r for r in g.to_dict("records")}
        for paper, squeezed in ORDERS.items():
            a, b = by.get(paper), by.get(squeezed)
            if a is None or b is None:
                continue
            ok = a["status"] == "ok" and b["status"] == "ok"
            bubble = [r["record"]["metrics"].get("bubble_rate") if r["status"] == "ok" else None for r in (a, b)]
            line = [a["group"], str(a["gpus"]), str(a["seq_len"]), a["vocab"], paper]
            line += [_cell(a, lambda r: r["mfu"] * 100, ".2f"), _cell(b, lambda r: r["mfu"] * 100, ".2f"),
                     _num(b["mfu"] / a["mfu"] if ok else None, ".3f")]
            line += [_num(bubble[0], ".3f"), _num(bubble[1], ".3f"),
                     _num(bubble[1] / bubble[0] if ok and bubble[0] else None, ".3f")]
            line += [_cell(a, lambda r: r["max_memory_bytes"] / 2**30, ".2f"),
                     _cell(b, lambda r: r["max_memory_bytes"] / 2**30, ".2f")]
            rows.append(line)
            if ok:
                gains.append((paper, b["mfu"] / a["mfu"] - 1))
    if not rows:
        return [], []
    by_method = {m: [x for p, x in gains if p == m] for m in ORDERS}
    note = "; ".join(f"{ORDERS[m]} against {m}: {statistics.median(v) * 100:+.2f} % MFU (median over {len(v)} "
                     f"runs)" for m, v in by_method.items() if v)
    return [Table("vhalf_orders", "V-Half's order: the paper's runs against the squeezed generator",
                  "Each V-Half run in the order the paper's runs used (the v-half-vocab branch: the repeating block, "
                  "no squeeze) beside the same run in the zero-bubble main branch's squeezed order (method "
                  "vhalf-squeezed): MFU, bubble rate and peak memory (with NCCL's buffers).",
                  _frame(columns, rows))], ([f"The squeezed order: {note}."] if note else [])


def published_tables(df: pd.DataFrame, name: str) -> tuple[list[Table], list[str]]:
    tables, notes = published_vs_sim(df, name)
    more, more_notes = variant_effect(df, name)
    orders, order_notes = order_effect(df)
    return tables + more + orders, notes + fitted_or_predicted(df) + more_notes + order_notes
