"""Renamed: harness.plan_check (vp/renamed.py). This stand-in refuses the old name with a pointer, for one release."""
import sys

from vp.renamed import moved

if __name__ == "__main__":
    print(f"error: {moved('harness.plancheck')}", file=sys.stderr)
    sys.exit(2)
raise ImportError(moved("harness.plancheck"))
