#!/usr/bin/env bash
# The main job (`make demo`, after `make setup build`): MEMSCALE's social network and a short
# TPC-B on farpool (local RAM and a local cluster of memory servers) and on PostgreSQL, same
# data, same machine, one table of results. Starts and stops everything it uses.
# Options pass through, e.g. `scripts/demo.sh --scale 50 --seconds 2`
# (see python/farpool/harness/demo.py). The old operations comparison is `make bench-ops`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The harness runs from the repository's virtual environment, made by `make setup`.
PY=${PY:-$PWD/.venv/bin/python}
if [ ! -x "$PY" ]; then
  echo "demo: $PY not found: run \`make setup\` first" >&2
  exit 1
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m farpool.harness.demo "$@"
