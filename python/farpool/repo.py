"""The repository this package runs from, and the run context of results written into it.

One place for what every harness module, the simulator and the client need: the repository's
root (``ROOT``; the package is installed editable from ``python/`` by ``make setup``), where
results go (``RESULTS``), the facts a result row carries (``run_context``: the same fields as
the C++ benches' ``RunContext()``, src/bench/run_context.h) and how rows are written (JSON
lines). Standard library only: it is imported before the dependencies are known to be there.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def git_sha() -> str:
    """The short git revision of the checkout; "unknown" outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return sha or "unknown"


def run_context() -> dict:
    """git_sha, host, cores and UTC time of a run, for every result row."""
    return {"git_sha": git_sha(), "host": platform.node(), "cores": os.cpu_count(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def stamp(rows: list[dict]) -> None:
    """Adds the run context to every row that lacks it (fields already set are kept)."""
    ctx = run_context()
    for r in rows:
        r.update({k: v for k, v in ctx.items() if k not in r})


def write_jsonl(path: Path, rows: list[dict], append: bool = False) -> Path:
    """Writes one JSON object per line (numpy scalars as floats), creating the directory;
    appends with ``append``. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w") as f:
        for r in rows:
            f.write(json.dumps(r, default=float) + "\n")
    return path
