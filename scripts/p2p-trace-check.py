"""The pipeline receives of a real CPU run, from the runtime's own trace (vp.trace): a 2-stage baseline of 8
microbatches, 4 iterations (1 warm-up). Prints the link probe's transfer time for one activation and, per
receiving rank, its receives' durations (the first of each iteration, which waits for the sender's first pass,
and the rest). Were transfers overlapped with the receiver's compute, the later receives could take less than a
transfer; under the rendezvous the runtime has (scripts/p2p-late-receive.py) none does.

    .venv/bin/python scripts/p2p-trace-check.py [HIDDEN SEQ MBS]   (default 512 512 4: 4 MiB per activation)
"""
import json
import statistics
import sys
import tempfile
from pathlib import Path

from vp.config import RunConfig
from vp.cost.network import fit_link
from vp.launch import launch_local


def main() -> None:
    hidden, seq, mbs = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (512, 512, 4)
    cfg = RunConfig(method="baseline", pp=2, layers=2, hidden=hidden, heads=4, seq_len=seq, micro_batch_size=mbs,
                    microbatches=8, vocab_size=1000, iterations=4, warmup=1, timeout_s=600)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        rec = launch_local(cfg, trace_path=str(path))
        events = json.loads(path.read_text())["traceEvents"]
    by_iteration: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "action":
            by_iteration.setdefault((e["pid"], e["args"]["iteration"]), []).append((e["name"], e["dur"] / 1e3))
    nbytes = mbs * seq * hidden * 4
    latency, bandwidth = fit_link(rec["env"]["link_probe"])
    print(f"activation {nbytes / 2**20:.2f} MiB; link probe: latency {latency * 1e6:.0f} us, "
          f"{bandwidth / 1e9:.2f} GB/s: a transfer {1e3 * (latency + nbytes / bandwidth):.2f} ms")
    for kind, rank in (("RF", 1), ("RB", 0)):
        first, later, passes = [], [], []
        for (pid, _), acts in by_iteration.items():
            if pid == rank:
                receives = [ms for name, ms in acts if name.startswith(kind)]
                first.append(receives[0])
                later += receives[1:]
                passes += [ms for name, ms in acts if name[0] in "FB" and name[:2] not in ("RF", "RB")]
        print(f"rank {rank} {kind}: first of an iteration {statistics.median(first):.2f} ms median; the others "
              f"{statistics.median(later):.2f} ms median (least {min(later):.2f}, most {max(later):.2f}, n "
              f"{len(later)}); its F and B passes {statistics.median(passes):.2f} ms median")


if __name__ == "__main__":
    main()
