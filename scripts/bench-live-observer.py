"""What a live W&B run costs the rank that trains: CPU seconds of the observer per iteration (the call the training
loop makes after each iteration), and the wall seconds the rank waits at the end for the writer to log the record
and finish. Offline W&B in a throwaway folder; prints figures, asserts nothing.

    .venv/bin/python scripts/bench-live-observer.py [--calls 20000] [--repeats 5]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


def main() -> None:
    from harness.live import LiveRun

    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    record = json.loads(next((ROOT / "tests/fixtures/records/mini").glob("*.json")).read_text())
    logger = {"mode": "offline", "project": "bench", "entity": None, "live_timeout_s": 300}
    per_call, finish = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{record['run_id']}.json"
            path.write_text(json.dumps(record))
            live = LiveRun({**record, "status": "running"}, logger, Path(tmp), "primary", False, "rank0")
            t0 = time.process_time()
            for it in range(args.calls):
                live(it, 1.0, 0.1)
            per_call.append((time.process_time() - t0) / args.calls)
            t0 = time.perf_counter()
            assert live.finish(record, path), "the writer failed"
            finish.append(time.perf_counter() - t0)
    print(f"observer: {statistics.median(per_call) * 1e6:.2f} CPU-us per iteration (median of {args.repeats}; "
          f"min {min(per_call) * 1e6:.2f}, max {max(per_call) * 1e6:.2f})")
    print(f"finish ({args.calls} iterations queued, then the record): {statistics.median(finish):.1f} s wall "
          f"(min {min(finish):.1f}, max {max(finish):.1f})")


if __name__ == "__main__":
    main()
