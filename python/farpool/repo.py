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


def read_jsonl(path: Path, fields: tuple[str, ...], what: str, hint: str) -> list[dict]:
    """The objects of a JSON-lines results file, one per non-empty line, each checked to have
    every name in ``fields``. FileNotFoundError (with ``hint``: how to produce the file) if it is
    missing; ValueError naming the file and line for a line that is not a JSON object or lacks a
    field, and for a file without rows. ``what`` names a row in messages ("transaction row")."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such results file ({hint})")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not a JSON object: {e}") from None
        missing = [f for f in fields if f not in row]
        if missing:
            raise ValueError(f"{path}:{n}: {what} lacks {', '.join(missing)}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: contains no {what}s ({hint})")
    return rows


def write_jsonl(path: Path, rows: list[dict], append: bool = False) -> Path:
    """Writes one JSON object per line (numpy scalars as floats), creating the directory;
    appends with ``append``. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w") as f:
        for r in rows:
            f.write(json.dumps(r, default=float) + "\n")
    return path
