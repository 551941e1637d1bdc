"""farpool-sim: outputs of each command and clear errors with non-zero exit status."""

import json

import pytest

from farpool.sim.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sci_json_has_the_required_fields(capsys):
    code, out, _ = run(capsys, "sci", "--json", "--events", "2000", "--seed", "4")
    assert code == 0
    r = json.loads(out)
    for k in ("knee_read_mb_s", "knee_latency_ns", "total_mb_s_at_knee", "fig8"):
        assert k in r
    assert r["fig8"] == [[1070, 1600, 3200], [267, 400, 800], [118, 178, 355]]


def test_sci_point_reports_events_per_second(capsys):
    code, out, _ = run(capsys, "sci", "--point", "100", "--events", "4000", "--json")
    r = json.loads(out)
    assert code == 0 and r["send_packets"] == 4000 and r["events_per_s"] > 0


def test_memscale_json(capsys):
    code, out, _ = run(capsys, "memscale", "--json", "--events", "1000")
    r = json.loads(out)
    assert code == 0 and {"mesh2d_16x16_pct", "mesh3d_6x6x6_pct"} <= set(r)


def test_calibrate_missing_ops_file(capsys, tmp_path):
    code, _, err = run(capsys, "calibrate", "--ops", str(tmp_path / "ops.jsonl"))
    assert code == 1
    assert "ops.jsonl" in err and "farpool bench ops --json" in err


def test_predict_small(capsys):
    code, out, _ = run(capsys, "predict", "--nodes", "8", "--threads", "2", "--events", "800",
                       "--design", "pool", "--json")
    r = json.loads(out)
    assert code == 0 and r["runs"][0]["nodes"] == 8 and r["runs"][0]["tps"] > 0


@pytest.mark.parametrize("argv", [["sci", "--mix", "9"], ["predict"], ["sci", "--events", "-1"],
                                  ["sci", "--events", "10", "--seconds", "1"]])
def test_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_runtime_errors_exit_1(capsys):
    code, _, err = run(capsys, "memscale", "--seconds", "1")
    assert code == 1 and err.startswith("farpool-sim: error:")
