"""Files written whole or not at all: a temporary file in the same folder, then a rename, so a reader (another
process, a rerun after a crash) sees the old file or the new one, never half of one."""
import json
import os
import tempfile
from pathlib import Path


def write_text_atomic(path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path, obj, **dump) -> Path:
    return write_text_atomic(path, json.dumps(obj, **dump) + "\n")
