"""The simulator's experiments: each runs, writes JSON lines and a plot into bench/results/.

Run one with ``python -m farpool.sim.experiments.<name>`` from the repository root, or through
``farpool-sim <command> --write``. Files are named ``sim_*.jsonl`` and ``sim_*.png``. Each JSON
line carries a ``record`` field saying what it is (``point``, ``summary``, ``run`` ...) and the
plots are drawn only from the rows written next to them.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")


def provenance() -> dict:
    """Git revision and time of a run, for every results file."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        sha = None
    return {"git_sha": sha, "utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, default=float) + "\n")
    return path
