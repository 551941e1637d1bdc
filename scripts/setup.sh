#!/usr/bin/env bash
# Installs everything farpool needs on Debian 12, idempotently: the C++ toolchain and
# libraries, the peers the benchmarks start (Redis, PostgreSQL, SQLite), network tools for
# namespaces, and the Python package (client, harness, simulator) with its PyPI dependencies,
# nanobind included, into .venv (the client's native module is then built by `make build`).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang clang-format clang-tidy
  libclang-rt-14-dev libucx-dev ucx-utils libcli11-dev nlohmann-json3-dev libfmt-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev redis-server postgresql sqlite3
  libsqlite3-dev iproute2 procps python3 python3-dev python3-pip python3-venv faketime
  libfuse3-dev fuse3 fio libssl-dev etcd-server etcd-client libcurl4-openssl-dev
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Redis and PostgreSQL are started by the benchmarks themselves, on private ports; the
# packaged system services are not needed.

# The Python harness and simulator go into a virtual environment in the repository (.venv):
# Debian 12's python3 refuses `pip install` outside one (PEP 668, "externally-managed-
# environment"). It is made from Debian's own interpreter (/usr/bin/python3, the python3-venv
# package above), not whatever `python3` comes first on PATH (a pyenv shim, say), so that the
# same interpreter is used on every machine; PYTHON=/path/to/python3 overrides it. Every Make
# target and script runs .venv/bin/python; `. .venv/bin/activate` puts it first on PATH.
VENV=.venv
BASE_PY=${PYTHON:-/usr/bin/python3}
[ -x "$BASE_PY" ] || BASE_PY=$(command -v python3)
if [ -f python/pyproject.toml ]; then
  if ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
    # Missing, or broken (its interpreter moved away): make it anew.
    echo "setup: creating the Python virtual environment $VENV (from $BASE_PY)"
    rm -rf "$VENV"
    "$BASE_PY" -m venv "$VENV"
  fi
  PY=$VENV/bin/python
  # Reinstall unless `farpool` already imports from this checkout with its dependencies, or
  # python/pyproject.toml changed since the last install.
  here=$(cd python && pwd)
  installed=$($PY -c 'import farpool, simpy, matplotlib, pytest, nanobind, os; print(os.path.dirname(os.path.dirname(farpool.__file__)))' 2>/dev/null || true)
  if [ "$installed" != "$here" ] || [ python/pyproject.toml -nt "$VENV/.farpool-installed" ]; then
    echo "setup: installing the Python package (python/) and its dependencies into $VENV"
    $PY -m pip install -q --disable-pip-version-check -e 'python[test,native]'
    touch "$VENV/.farpool-installed"
  fi
fi
echo "setup: ok"
