"""One rank of the GPU check's node form, started by torchrun (vp.gpucheck.pipeline.launch_torchrun):

    python -m vp.gpucheck.node_rank --syncs-dir DIR [vp.train's flags]

vp.train's run of this rank with every runtime action strict about host syncs (vp.gpucheck.syncs: CUDA's sync debug
mode "error", a sync raises inside the action that made it; on CPU the sync-prone calls counted), and the syncs it
saw written to DIR/syncs-RANK.json, whether the run ended well or not. A rank that fails leaves its stamped
traceback (DIR/error-RANK.txt) and its progress beside it, as vp.launch's ranks do, so that the failure is explained
by the rank that caused it (vp.failure.explain), not by the order in which torchrun saw the processes end.
"""
import json
import os
import sys
import traceback
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] != "--syncs-dir":
        print("usage: python -m vp.gpucheck.node_rank --syncs-dir DIR [vp.train's flags] (under torchrun)",
              file=sys.stderr)
        return 2
    out, rest = Path(argv[1]), argv[2:]
    from vp import failure
    from vp.gpucheck.syncs import strict_actions
    from vp.train import main as train

    rank = os.environ.get("RANK", "0")
    os.environ[failure.PROGRESS_ENV] = str(out / f"progress-{rank}.txt")
    cuda = "--device" in rest and rest[rest.index("--device") + 1:][:1] == ["cuda"]
    with strict_actions(cuda) as syncs:
        try:
            return train(rest)
        except BaseException as err:
            failure.write_error(out / f"error-{rank}.txt", traceback.format_exc(), getattr(err, "failed_at", None))
            raise
        finally:
            (out / f"syncs-{rank}.json").write_text(json.dumps({"rank": int(rank), "syncs": syncs[:50]}))


if __name__ == "__main__":
    sys.exit(main())
