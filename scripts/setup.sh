#!/usr/bin/env bash
# Installs everything farpool needs on Debian 12, idempotently: the C++ toolchain and
# libraries, the peers the benchmarks start (Redis, PostgreSQL, SQLite), network tools for
# namespaces, and the Python harness/simulator with its PyPI dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang clang-format clang-tidy
  libclang-rt-14-dev libucx-dev ucx-utils libcli11-dev nlohmann-json3-dev libfmt-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev redis-server postgresql sqlite3
  libsqlite3-dev iproute2 procps python3 python3-pip python3-venv faketime
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

PY=${PYTHON:-python3}
if [ -f python/pyproject.toml ]; then
  # Reinstall unless `farpool` already imports from this checkout (another clone's editable
  # install would otherwise shadow this one's code).
  here=$(cd python && pwd)
  installed=$($PY -c 'import farpool, simpy, matplotlib, os; print(os.path.dirname(os.path.dirname(farpool.__file__)))' 2>/dev/null || true)
  if [ "$installed" != "$here" ] || [ python/pyproject.toml -nt .setup-python-stamp ]; then
    echo "setup: installing the Python harness (python/) and its dependencies"
    $PY -m pip install -q -e 'python[test]'
    touch .setup-python-stamp
  fi
fi
echo "setup: ok"
