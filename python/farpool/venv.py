"""Runs the repository's scripts under its virtual environment.

`make setup` installs the harness and its dependencies (numpy, matplotlib, simpy, pytest) into
`.venv` at the repository root, because Debian 12's python3 refuses `pip install` outside a
virtual environment (PEP 668). The launchers in `bench/` start with `#!/usr/bin/env python3`,
which may be the system interpreter without those packages; `use_repo_venv()` re-executes the
launcher under `.venv/bin/python`.
Standard library only: it runs before the dependencies can be imported.
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"


def use_repo_venv() -> None:
    """Re-executes this process under .venv/bin/python unless that is already the environment
    running. Without .venv, says to run `make setup` and returns (the imports that follow then
    fail with their own message)."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"{sys.argv[0]}: no {VENV}: run `make setup` first", file=sys.stderr)
        return
    os.execv(str(python), [str(python), *sys.argv])
