"""The measured fp8 config table (executors/cute/fp8_defaults.py): which row a shape takes, and
scripts/fp8_defaults_from_sweep.py, which writes it from a sweep record."""

from __future__ import annotations

from pathlib import Path

from executors.cute import fp8
from executors.cute.fp8 import Fp8Config


def test_measured_table_wins_where_it_runs_else_heuristic():
    """default_fp8_config takes the measured row of its (N, K, m_tile), if that row runs the M;
    other shapes, and an unfit row, get the heuristic; every shipped row runs its whole bucket."""
    row = Fp8Config(m_tile=8, tiles=1, warps_k=7, unroll=2, hw=4).to_dict()
    table = {(2112, 7168, 8): row}
    assert fp8.default_fp8_config(5, 2112, 7168, table=table) == Fp8Config.from_dict(row)
    assert fp8.default_fp8_config(12, 2112, 7168, table=table) == fp8.heuristic_fp8_config(12, 2112, 7168)
    assert fp8.default_fp8_config(5, 4096, 512, table=table) == fp8.heuristic_fp8_config(5, 4096, 512)
    unfit = {(2112, 7168, 8): {**row, "warps_k": 5}}  # 56 K blocks do not split 5 x 2 ways
    assert fp8.default_fp8_config(5, 2112, 7168, table=unfit) == fp8.heuristic_fp8_config(5, 2112, 7168)
    assert fp8.default_fp8_config(5, 2112, 7168, table={}) == fp8.heuristic_fp8_config(5, 2112, 7168)
    from executors.cute.fp8_defaults import MEASURED
    for (n, k, mt), d in MEASURED.items():
        cfg = Fp8Config.from_dict(d)
        assert cfg.m_tile == mt
        for m in range(1 if mt == 8 else 9, mt + 1):
            assert cfg.check(m, n, k) is None, ((n, k, mt), m)
            assert fp8.default_fp8_config(m, n, k) == cfg


ROOT = Path(__file__).resolve().parent.parent


def _write_table(tmp_path, record: dict):
    """Run scripts/fp8_defaults_from_sweep.py --fresh on `record`; (its result, the generated
    module's namespace)."""
    import json
    import subprocess
    import sys

    src, out = tmp_path / "rec.json", tmp_path / "table.py"
    src.write_text(json.dumps(record))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "fp8_defaults_from_sweep.py"), str(src),
                        "--out", str(out), "--fresh"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    ns: dict = {}
    exec(compile(out.read_text(), str(out), "exec"), ns)  # the generated module, read back
    return r, ns


def test_defaults_from_sweep_keeps_clear_wins_only(tmp_path):
    import subprocess
    import sys
    heur8 = fp8.heuristic_fp8_config(8, 2112, 7168)
    heur16 = fp8.heuristic_fp8_config(16, 2112, 7168)
    win = Fp8Config(m_tile=8, tiles=1, warps_k=7, unroll=2, hw=4)
    close = Fp8Config(m_tile=16, tiles=1, warps_k=14, unroll=1, hw=4)
    rec = {"rows": [{"shape": "qkv_a", "N": 2112, "K": 7168}],
           "sweep": {"qkv_a": {"8": {"best": win.to_dict(), "best_us": 5.0,
                                     "all_us": {win.key(): 5.0, heur8.key(): 6.0}},
                               "16": {"best": close.to_dict(), "best_us": 6.95,
                                      "all_us": {close.key(): 6.95, heur16.key(): 7.0}}}}}
    r, ns = _write_table(tmp_path, rec)
    assert ns["MEASURED"] == {(2112, 7168, 8): win.to_dict()}
    assert "heuristic kept" in r.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "fp8_defaults_from_sweep.py"),
                          str(tmp_path / "missing.json")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "cannot read" in bad.stderr


def test_defaults_from_sweep_keeps_provenance_of_carried_rows():
    """A row the record does not improve keeps the comment saying where it was measured; a row
    it replaces names the row it replaced with that row's time in the record."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fp8_from_sweep", ROOT / "scripts" / "fp8_defaults_from_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    old8 = Fp8Config(m_tile=8, tiles=2, warps_k=7, hw=4)
    old16 = Fp8Config(m_tile=16, tiles=2, warps_k=7, hw=4)
    text = ("MEASURED = {\n    # qkv_a: 5.10 us on an earlier record\n    (2112, 7168, 8): {},\n"
            "    # qkv_a: 7.00 us there\n    (2112, 7168, 16): {},\n    # other: 1.00 us\n    (64, 128, 8): {},\n}\n")
    comments = mod.row_comments(text)
    assert comments[(2112, 7168, 8)] == "qkv_a: 5.10 us on an earlier record"
    ring = Fp8Config(m_tile=16, tiles=2, warps_k=4, unroll=2, hw=4, bulk=2)
    rec = {"rows": [{"shape": "qkv_a", "N": 2112, "K": 7168}],
           "sweep": {"qkv_a": {"8": {"best": old8.to_dict(), "best_us": 5.0, "all_us": {old8.key(): 5.0}},
                               "16": {"best": ring.to_dict(), "best_us": 6.0,
                                      "all_us": {ring.key(): 6.0, old16.key(): 7.0}}}}}
    current = {(2112, 7168, 8): old8.to_dict(), (2112, 7168, 16): old16.to_dict(), (64, 128, 8): old8.to_dict()}
    table, _ = mod.rows_from(rec, 0.02, current, comments=comments)
    assert table[(2112, 7168, 8)][1] == "qkv_a: 5.10 us on an earlier record"
    assert table[(64, 128, 8)][1] == "other: 1.00 us"
    assert table[(2112, 7168, 16)][0] == ring.to_dict()
    assert f"replaces {old16.key()}, 7.00 us in this record" in table[(2112, 7168, 16)][1]
    assert mod._source("b.json", "a.json (rows it did not improve: z.json)", False) == \
        "b.json (rows it did not improve: a.json, z.json)"
    assert mod._source("b.json", "b.json", False) == "b.json" and mod._source("b.json", "x", False) == "b.json"
    # a current row the record measured slower than a config within 2 % of the heuristic goes
    heur = fp8.heuristic_fp8_config(16, 2112, 7168)
    rec["sweep"]["qkv_a"]["16"]["all_us"] = {ring.key(): 5.0, old16.key(): 7.0, heur.key(): 5.05}
    rec["sweep"]["qkv_a"]["16"]["best_us"] = 5.0
    table, notes = mod.rows_from(rec, 0.02, current, comments=comments)
    assert (2112, 7168, 16) not in table and any("heuristic kept" in n for n in notes)
    assert (64, 128, 8) in table


def test_per_tensor_scales_take_their_own_measured_row(monkeypatch):
    """kinds ("tensor", "tensor") look in MEASURED_TENSOR first (a config measured with per-tensor
    scales), then the block-scale row, then the heuristic; other kinds never see that table."""
    from executors.cute import fp8_config

    n, k = 4608, 7168
    own = Fp8Config(m_tile=16, tiles=2, warps_k=7, unroll=1, hw=2)
    monkeypatch.setattr(fp8_config, "MEASURED_TENSOR", {(n, k, 16): own.to_dict()})
    assert fp8.default_fp8_config(12, n, k, kinds=("tensor", "tensor")) == own
    block = fp8.default_fp8_config(12, n, k)
    assert block != own
    assert fp8.default_fp8_config(12, n, k, kinds=("row", "col")) == block
    assert fp8.default_fp8_config(12, n, k, kinds=("block", "tensor")) == block
    assert fp8.default_fp8_config(5, n, k, kinds=("tensor", "tensor")) == fp8.default_fp8_config(5, n, k)


def test_defaults_from_a_per_tensor_sweep_fill_their_table(tmp_path):
    """A `--sweep-kinds tensor` record writes MEASURED_TENSOR rows where they beat what per-tensor
    scales ran before (the block-scale default), and leaves MEASURED as it was."""

    from executors.cute import fp8_defaults

    n, k = 4608, 7168
    before16 = fp8.default_fp8_config(16, n, k)
    before8 = fp8.default_fp8_config(8, n, k)
    win = Fp8Config(m_tile=16, tiles=2, warps_k=7, unroll=1, hw=2)
    rec = {"rows": [{"shape": "gate_up", "N": n, "K": k}], "sweep_kinds": "tensor",
           "sweep": {"gate_up": {"16": {"best": win.to_dict(), "best_us": 12.0,
                                        "all_us": {win.key(): 12.0, before16.key(): 17.0}},
                                 "8": {"best": before8.to_dict(), "best_us": 11.0,
                                       "all_us": {before8.key(): 11.0}}}}}
    _r, ns = _write_table(tmp_path, rec)
    assert ns["MEASURED_TENSOR"] == {(n, k, 16): win.to_dict()}  # M <= 8: the default was the best
    assert ns["MEASURED"] == fp8_defaults.MEASURED and ns["SOURCE"] == fp8_defaults.SOURCE
