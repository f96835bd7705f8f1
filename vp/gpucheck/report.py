"""The check's report: DIR/gpu-check.json (every figure) and DIR/gpu-check.md (a page to read), both brought up to
date after every part, so that whatever ran is on disk when a later part crashes or the machine goes away."""
import platform
import socket
from pathlib import Path

from vp.record import git_commit, now, write_atomic


class Report:
    def __init__(self, out: Path, doc: dict):
        self.out, self.doc = out, doc

    @classmethod
    def start(cls, out: Path, device: str, argv: list[str]) -> "Report":
        if (out / "gpu-check.json").exists() or (out / "gpu-check.md").exists():
            raise ValueError(f"--out {out} already holds a check's report (gpu-check.json/.md); give a new folder "
                             f"(the default is results/gpu-check/<UTC time>) or move the old one away")
        out.mkdir(parents=True, exist_ok=True)
        doc = {"started": now(), "device": device, "command": ["scripts/gpu-check.sh", *argv],
               "host": socket.gethostname(), "python": platform.python_version(), "git_commit": git_commit(),
               "parts": []}
        report = cls(out, doc)
        write_atomic(out / "gpu-check.json", doc)
        (out / "gpu-check.md").write_text(
            f"# GPU check, {doc['started']}\n\n`{' '.join(doc['command'])}` on {doc['host']} (device {device}, "
            f"Python {doc['python']}, commit {doc['git_commit'][:12]}). One section per part, in the order run; "
            f"every figure is in gpu-check.json.\n")
        return report

    def add(self, name: str, entry: dict):
        """Append one part's outcome: status passed | FAILED | skipped | timeout | crashed."""
        self.doc["parts"].append({"part": name, **entry})
        self.doc["updated"] = now()
        write_atomic(self.out / "gpu-check.json", self.doc)
        with open(self.out / "gpu-check.md", "a") as f:
            f.write("\n" + section(name, entry))

    def ran(self) -> list[str]:
        """The parts that ran (a skipped part did not: it could not run here, or the budget was spent)."""
        return [p["part"] for p in self.doc["parts"] if p["status"] != "skipped"]

    def finish(self) -> str:
        """The verdict over the parts that ran, as the last line of both files; returns it. A check in which no part
        ran checked nothing: it says so (and the command exits 1)."""
        failed = self.failed()
        verdict = (f"FAILED: {', '.join(failed)}" if failed else "every part that ran passed" if self.ran() else
                   "FAILED: no part ran (every part was skipped here); nothing was checked")
        self.doc |= {"finished": now(), "verdict": verdict}
        write_atomic(self.out / "gpu-check.json", self.doc)
        with open(self.out / "gpu-check.md", "a") as f:
            f.write(f"\n## Verdict: {verdict}\n")
        return verdict

    def line(self, name: str) -> str:
        entry = next(p for p in reversed(self.doc["parts"]) if p["part"] == name)
        return f"{name}: {entry['status']} ({entry.get('seconds', 0):.0f} s)"

    def failed(self) -> list[str]:
        return [p["part"] for p in self.doc["parts"] if p["status"] in ("FAILED", "timeout", "crashed")]


def section(name: str, entry: dict) -> str:
    """A part's markdown: its status, its summary lines, and (when it did not finish) the end of its stderr."""
    result = entry.get("result") or {}
    lines = [f"## {name}: {entry['status']}" + (f" ({entry['seconds']:.0f} s)" if "seconds" in entry else ""), ""]
    if entry.get("reason"):
        lines += [entry["reason"], ""]
    lines += [f"- {s}" if s and not s.startswith("|") else s for s in result.get("summary", [])]
    if entry.get("stderr"):
        lines += ["", "```", entry["stderr"].rstrip()[-2000:], "```"]
    return "\n".join(lines) + "\n"
