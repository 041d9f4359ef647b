"""Numbers the cost model reads from files and flags are checked where they enter: a device
profile's fields, a tuning's measured times, --min-gain-us and a dim's buckets. A NaN there used
to make the stream search loop forever."""

from __future__ import annotations

import json

import pytest

from planner.cli import main
from tests.planutil import PLANS, error

MLA = str(PLANS / "dsv3_mla_input_proj.yaml")


@pytest.mark.parametrize("field,value,want", [
    ("event_us", float("nan"), "'event_us' must be a finite number >= 0"),
    ("event_us", "fast", "'event_us' must be a finite number >= 0"),
    ("hbm_gbps", 0, "'hbm_gbps' must be a finite number > 0"),
    ("kernel_us", -5, "'kernel_us' must be a finite number >= 0"),
    ("bf16_tflops", float("inf"), "'bf16_tflops' must be a finite number > 0"),
    ("name", 3, "'name' must be a string"),
])
def test_device_profile_values(tmp_path, capsys, field, value, want):
    p = tmp_path / "prof.json"
    p.write_text(json.dumps({field: value}))  # json writes NaN / Infinity, as a hand-edited file may
    assert main(["compile", MLA, "--device-profile", str(p)]) == 2
    err = capsys.readouterr().err
    assert want in err and str(p) in err and "Traceback" not in err


@pytest.mark.parametrize("text, code, want", [
    (b"\xff\xfe", "io", "cannot read the device profile: not UTF-8 text"),
    (b"[" * 100000, "io", "cannot read the device profile: maximum recursion depth"),
    (b'{"name": "a", "name": "b"}', "dup", "duplicate key 'name' in the device profile"),
    (b'{"hbm": 1}', "schema", "device profile has unknown field 'hbm'"),
    (b'{"hbm_gbps": ', "io", "cannot read the device profile: Expecting value"),
    (b'{"hbm_gbps": 1' + b"1" * 5000 + b"}", "io", "cannot read the device profile: Exceeds the limit (4300 digits)"),
])
def test_device_profile_files_read_like_tuning_files(tmp_path, capsys, text, code, want):
    """A device profile that is not UTF-8 or nests too deep was a traceback, a repeated key kept
    the last silently, and the errors named no file: now each is located at the file, as a
    tuning file's and timeline records' are."""
    p = tmp_path / "prof.json"
    p.write_bytes(text)
    assert main(["compile", MLA, "--device-profile", str(p), "--emit", "json"]) == 2
    e = json.loads(capsys.readouterr().out)["errors"][0]
    assert e["code"] == code and want in e["message"] and e["file"] == str(p)


@pytest.mark.parametrize("text,want", [(b"[" * 100000, "maximum recursion depth"),
                                       (b'[{"end_us": 1' + b"0" * 5000 + b"}]", "Exceeds the limit (4300 digits)")])
def test_timeline_records_files_that_cannot_be_decoded(tmp_path, capsys, text, want):
    p = tmp_path / "rec.json"
    p.write_bytes(text)
    assert main(["timeline", str(p), "-o", str(tmp_path / "t.svg")]) == 2
    err = capsys.readouterr().err
    assert f"cannot read the timeline records: {want}" in err and "Traceback" not in err


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_tuning_measured_times_must_be_finite(tmp_path, capsys, value):
    data = json.loads((PLANS.parent / "planner/tuned/2026-12-01_h200_dsv3_mla_input_proj.json").read_text())
    key = next(k for k in data["measured"] if k.startswith("extern:rope:"))
    data["measured"][key] = value
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data))
    assert main(["compile", MLA, "--tuning", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"measured['{key}'] must be a finite non-negative number" in err


def test_tuning_measured_keys_must_be_signatures(tmp_path, capsys):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"device": "x", "date": "", "torch": "", "limits": {}, "backends": {},
                             "measured": {"garbage": 1.0}, "variants": {}}))
    assert main(["compile", MLA, "--tuning", str(p)]) == 2
    assert "measured key 'garbage' is not an op signature" in capsys.readouterr().err


@pytest.mark.parametrize("v", ["nan", "inf", "-5"])
def test_min_gain_must_be_finite_and_non_negative(capsys, v):
    assert main(["compile", MLA, f"--min-gain-us={v}"]) == 2
    assert "--min-gain-us must be a finite number >= 0" in capsys.readouterr().err


def test_buckets_must_end_at_the_dims_maximum(tmp_path):
    e = error(tmp_path, """
outputs: [y]
ops:
  - y: gemm(x, w)
""", header="""
plan: b
params: {hidden: 64}
dims:
  num_tokens: {range: 1..256, buckets: [1, 8, 64]}
inputs:
  x: bf16[num_tokens, hidden]
weights:
  w: bf16[hidden, hidden]
""")
    d = e.diagnostics[0]
    assert "must include its maximum 256" in d.message and "sizes 65..256 would have no bucket" in d.message
    assert d.loc is not None and d.loc.line == 4


def test_a_profile_file_without_a_name_is_named_by_what_it_changes(tmp_path):
    from planner.cost import DeviceProfile
    f = tmp_path / "prof.json"
    f.write_text('{"p2p_gbps": 0, "coll_gbps": 100}')
    assert DeviceProfile.load(str(f)).name == "H200 defaults with coll_gbps, p2p_gbps from prof.json"
    f.write_text('{"name": "my box", "p2p_gbps": 0}')
    assert DeviceProfile.load(str(f)).name == "my box"
