"""The simulator's experiments: each runs, writes JSON lines and a plot into bench/results/.

Run one with ``python -m farpool.sim.experiments.<name>`` from the repository root, or through
``farpool-sim <command> --write``. Files are named ``sim_*.jsonl`` and ``sim_*.png``. Each JSON
line carries a ``record`` field saying what it is (``point``, ``summary``, ``run`` ...) and the
plots are drawn only from the rows written next to them.
"""

from __future__ import annotations

from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")


from farpool.repo import git_sha, write_jsonl  # noqa: F401 (the experiments' writer)


def provenance() -> dict:
    """Git revision and time of a run, for every results file."""
    return {"git_sha": git_sha(), "utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
