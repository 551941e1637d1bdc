#!/usr/bin/env python3
"""Runs the C++ suite (ctest) for `make test`, and runs a failed test once more only when its
output shows one of the known UCX 1.13 aborts (docs/pool.md, "Known UCX aborts").

Every other failure fails at once, and so does a known abort that happens again on the rerun:
the rerun forgives an abort inside UCX's own connection handling, never an assertion, a crash
or a wrong result of ours.

Usage: scripts/ctest.py BUILD_DIR [extra ctest arguments]
"""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# UCX 1.13's assertions seen on the 2-core VM (docs/pool.md): a missed event of a descriptor
# that another worker reused (async.c), and its async thread during connection set-up
# (tcp_sockcm_ep.c). Only these are forgiven; a new UCX abort fails the run until understood.
KNOWN_UCX_ABORTS = re.compile(r"async\.c:643 .*handler->async == async|tcp_sockcm_ep\.c:416")


def failed_tests(junit: Path) -> list[tuple[str, str]]:
    """(name, output) of every test that failed, from ctest's JUnit report."""
    failed = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.get("status") == "fail" or case.find("failure") is not None:
            out = case.findtext("system-out") or ""
            failure = case.find("failure")
            if failure is not None:
                out += (failure.get("message") or "") + (failure.text or "")
            failed.append((case.get("name", ""), out))
    return failed


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    build, extra = Path(argv[0]), argv[1:]
    junit = build / "Testing" / "ctest-junit.xml"
    junit.unlink(missing_ok=True)
    ctest = ["ctest", "--output-on-failure", "-j", "1", *extra]
    first = subprocess.run([*ctest, "--output-junit", str(junit.resolve())], cwd=build)
    if first.returncode == 0:
        return 0
    if not junit.exists():
        print("ctest.py: ctest failed without a JUnit report", file=sys.stderr)
        return first.returncode
    failed = failed_tests(junit)
    known = [name for name, out in failed if KNOWN_UCX_ABORTS.search(out)]
    others = [name for name, out in failed if name not in known]
    if others or not failed:
        print(f"ctest.py: {len(failed)} test(s) failed; not a known UCX abort: "
              + (", ".join(others) or "(no failed test in the report)"), file=sys.stderr)
        return 1
    for name in known:
        print(f"ctest.py: {name} aborted inside UCX (a known UCX 1.13 abort, docs/pool.md); "
              "running it once more", file=sys.stderr)
        again = subprocess.run([*ctest, "-R", "^" + re.escape(name) + "$"], cwd=build)
        if again.returncode != 0:
            print(f"ctest.py: {name} failed again", file=sys.stderr)
            return 1
    print(f"ctest.py: passed; {len(known)} test(s) needed a rerun after a known UCX abort: "
          + ", ".join(known), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
