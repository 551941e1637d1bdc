"""scripts/ctest.py, the retry policy of `make test`: a failed test runs once more only when its
output shows a known UCX 1.13 abort. A fake `ctest` on PATH plays the suite."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from farpool.repo import ROOT

SCRIPT = ROOT / "scripts" / "ctest.py"

# The fake ctest: the first run fails the tests of FAILS (JSON: name -> output) in a JUnit report
# like ctest's; a rerun (-R) fails again only if RERUN_FAILS is set. Every call is logged.
FAKE_CTEST = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys
    from xml.sax.saxutils import escape
    args = sys.argv[1:]
    with open(os.environ["CALLS"], "a") as f:
        f.write(" ".join(args) + "\\n")
    if "-R" in args:
        sys.exit(1 if os.environ.get("RERUN_FAILS") else 0)
    junit = args[args.index("--output-junit") + 1]
    fails = json.loads(os.environ["FAILS"])
    cases = "".join(
        f'<testcase name="{n}" status="fail"><system-out>{escape(out)}</system-out>'
        f'<failure message="Failed"/></testcase>' for n, out in fails.items())
    cases += '<testcase name="Passing.Test" status="run"><system-out>ok</system-out></testcase>'
    open(junit, "w").write(f'<testsuite tests="{len(fails) + 1}">{cases}</testsuite>')
    sys.exit(8 if fails else 0)
""")

UCX_ABORT = ("[vm:1234:0:1235] async.c:643 Assertion `handler->async == async' failed: "
             "handler=0x55 async=0x66")


def run(tmp_path: Path, fails: dict[str, str], rerun_fails: bool = False):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "ctest"
    fake.write_text(FAKE_CTEST)
    fake.chmod(0o755)
    build = tmp_path / "build"
    (build / "Testing").mkdir(parents=True, exist_ok=True)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(calls),
               FAILS=json.dumps(fails))
    if rerun_fails:
        env["RERUN_FAILS"] = "1"
    p = subprocess.run([sys.executable, str(SCRIPT), str(build)], env=env, capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stderr, calls.read_text().splitlines()


def test_a_clean_run_passes_with_one_ctest_call(tmp_path):
    rc, _, calls = run(tmp_path, {})
    assert rc == 0 and len(calls) == 1


def test_a_known_ucx_abort_is_rerun_once_and_passes(tmp_path):
    rc, err, calls = run(tmp_path, {"Engines/GcTest.Churn/pool": UCX_ABORT})
    assert rc == 0, err
    assert len(calls) == 2 and "-R ^Engines/GcTest\\.Churn/pool$" in calls[1]
    assert "needed a rerun" in err


def test_a_known_ucx_abort_that_happens_again_fails(tmp_path):
    rc, err, calls = run(tmp_path, {"Engines/GcTest.Churn/pool": UCX_ABORT}, rerun_fails=True)
    assert rc == 1 and len(calls) == 2 and "failed again" in err


def test_any_other_failure_fails_without_a_rerun(tmp_path):
    rc, err, calls = run(tmp_path, {"TxnTest.NoLostUpdate": "txn_test.cc:120: Failure"})
    assert rc == 1 and len(calls) == 1 and "not a known UCX abort: TxnTest.NoLostUpdate" in err


def test_a_known_abort_beside_a_real_failure_fails_without_a_rerun(tmp_path):
    rc, err, calls = run(tmp_path, {"A.Aborted": UCX_ABORT, "B.Wrong": "b.cc:9: Failure"})
    assert rc == 1 and len(calls) == 1 and "not a known UCX abort: B.Wrong" in err


def test_an_assertion_of_ours_is_not_forgiven(tmp_path):
    rc, err, calls = run(tmp_path, {"PoolTest.X": "pool.cc:88: Assertion `ok' failed"})
    assert rc == 1 and len(calls) == 1
