"""Paper-style tables and figures from result records (results/<experiment>/*.json, read with pandas, never
from W&B) into reports/<experiment>/: `build_reports`, or `python -m harness.report`."""
from harness.report.build import build_reports

__all__ = ["build_reports"]
