"""Measured timelines as Chrome / Perfetto trace files (open in ui.perfetto.dev or chrome://tracing).

One process per rank; on its "actions" track one complete event ("ph": "X") per executed action, from the
start of its compute to its end, in microseconds since the rank began the first measured iteration; time an
action spent waiting for a collective it consumes is a separate event on the rank's "waits" track.
Iterations follow each other on the time axis, each shifted by the measured length of those before it.
"""
from pathlib import Path

from vp.files import write_json_atomic

US = 1e6


def chrome_trace(events_per_rank: list[list[list]], seconds_per_rank: list[list[float]],
                 meta: dict | None = None) -> dict:
    """events_per_rank[rank][iteration] = [(action, arrived, start, end), ...] in seconds since the iteration
    began on that rank, seconds_per_rank[rank][iteration] its measured length -> the trace object."""
    out = []
    for rank, iterations in enumerate(events_per_rank):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "actions"}})
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 1, "args": {"name": "waits"}})
        offset = 0.0
        for it, (events, length) in enumerate(zip(iterations, seconds_per_rank[rank])):
            for text, arrived, start, end in events:
                out.append({"ph": "X", "name": text, "cat": "action", "pid": rank, "tid": 0,
                            "ts": (offset + start) * US, "dur": max(0.0, end - start) * US,
                            "args": {"iteration": it}})
                if start > arrived:
                    out.append({"ph": "X", "name": f"wait {text}", "cat": "wait", "pid": rank, "tid": 1,
                                "ts": (offset + arrived) * US, "dur": (start - arrived) * US,
                                "args": {"iteration": it}})
            offset += length
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": dict(meta or {})}


def write_trace(path, events_per_rank: list[list[list]], seconds_per_rank: list[list[float]],
                meta: dict | None = None) -> Path:
    """Write the trace whole or not at all (vp.files)."""
    return write_json_atomic(path, chrome_trace(events_per_rank, seconds_per_rank, meta))
