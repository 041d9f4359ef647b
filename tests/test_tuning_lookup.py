"""Shipped tunings (planner/tuned/), their lookup by device and plan, strict file validation, and
the tuning choice made once in lowering (ex.tuning_source, ex.backends)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from executors import BuildError, build_executor
from executors.tools.check import compile_for_run
from planner.cli import main
from planner.config import CompileConfig
from planner.lang.loader import load_plan
from planner.tuning import (
    TUNED_DIR,
    gemm_shapes,
    load_tuning,
    match_tuning,
    packaged,
    validate_tuning,
)

ROOT = Path(__file__).resolve().parent.parent
KDA = ROOT / "plans" / "k3_kda_projection.yaml"
SMALL = {"hidden": 256, "kda_heads": 64, "head_dim": 16, "fa_rank": 32}
H200 = ("NVIDIA H200", 90, {"torch": "2.11.0+cu130"})


SHIPPED_FROM = {  # each shipped tuning and the measured file it was copied from
    "2026-11-30_h200_k3_kda_projection.json": "results/tuning/2026-11-30_h200_k3_kda_projection_s8.json",
    "2026-12-01_h200_dsv3_mla_input_proj.json":
        "results/data/tuning/2026-12-01T1807_h200-217627c9_dsv3_mla_input_proj.json",
    "2026-12-01_h200_dsv3_moe_shared_expert.json":
        "results/data/tuning/2026-12-01T1822_h200-458e45bf_dsv3_moe_shared_expert.json",
}


def test_shipped_tuning_is_package_data_and_matches_the_measured_file():
    files = packaged()
    assert sorted(p.name for p, _ in files) == sorted(SHIPPED_FROM)
    for path, data in files:
        assert path.parent == TUNED_DIR and data["device"] == "NVIDIA H200" and data["cc"] == 90
        measured = json.loads((ROOT / SHIPPED_FROM[path.name]).read_text())
        for k in ("limits", "backends", "measured", "variants"):
            assert data[k] == measured[k], (path.name, k)
    assert 'planner = ["tuned/*.json"]' in (ROOT / "pyproject.toml").read_text()


def test_match_by_device_cc_versions_and_plan():
    plan = load_plan(KDA)
    shapes = gemm_shapes(plan)
    assert ("bf16", 6288, 7168) in shapes and ("bf16", 1536, 128) in shapes
    data, src = match_tuning(*H200[:1], plan.tuned, shapes, H200[1], H200[2])
    assert data is not None and data["limits"] == {"kda_two_branch_max": 0}
    assert src == "planner/tuned/2026-11-30_h200_k3_kda_projection.json (NVIDIA H200, sm_90, torch 2.11)"
    none, note = match_tuning("NVIDIA H100 80GB HBM3", plan.tuned, shapes, 90, H200[2])
    assert none is None and note.startswith("no shipped tuning for NVIDIA H100 80GB HBM3") and "is for NVIDIA H200" in note
    assert "is for torch 2.11 (here 2.13.0)" in match_tuning("NVIDIA H200", plan.tuned, shapes, 90, {"torch": "2.13.0"})[1]
    assert "is for sm_90" in match_tuning("NVIDIA H200", plan.tuned, shapes, 100, H200[2])[1]
    small = load_plan(KDA, SMALL)  # other gemm shapes: the H200 table does not apply
    assert "tunes other ops" in match_tuning(*H200[:1], small.tuned, gemm_shapes(small), 90, H200[2])[1]
    tp8 = load_plan(ROOT / "plans" / "k3_tp8.yaml")  # 69 KDA layers with the same shapes: it applies
    assert match_tuning(*H200[:1], tp8.tuned, gemm_shapes(tp8), 90, H200[2])[0] is not None


def test_validation_is_strict_and_names_file_and_key(tmp_path):
    flat = tmp_path / "flat.json"
    flat.write_text('{"kda_two_branch_max": 3}')
    with pytest.raises(ValueError, match=r"flat.json: unknown key 'kda_two_branch_max' \(tuned limits go under"):
        load_tuning(flat)
    with pytest.raises(ValueError, match=r"backends\['gemm:bf16:M=1,N=2,K=3'\] has unknown key 'cfg'"):
        validate_tuning({"backends": {"gemm:bf16:M=1,N=2,K=3": {"backend": "torch", "cfg": None}}})
    with pytest.raises(ValueError, match="not an op signature"):
        validate_tuning({"backends": {"all_gather:x": {"backend": "torch"}}})
    with pytest.raises(ValueError, match="'cc' must be an integer"):
        validate_tuning({"cc": "sm_90"})
    typo = tmp_path / "typo.json"
    typo.write_text('{"limits": {"kda_two_branchmax": 0}}')
    plan = load_plan(KDA, SMALL)
    w = {n: torch.zeros(plan.tensors[n].shape, dtype=torch.bfloat16) for n in plan.weights}
    for bad, msg in ((flat, "unknown key 'kda_two_branch_max'"),
                     (typo, "limits.kda_two_branchmax: plan 'k3_kda_projection' declares no tuned limit")):
        with pytest.raises(BuildError, match=msg):
            build_executor(compile_for_run(plan), w, device="cpu", tuning=str(bad))
        for cmd in (["compile", str(KDA)], ["run", str(KDA), "--set", "hidden=256"]):
            assert main([*cmd, "--tuning", str(bad)]) == 2


def test_tuning_chosen_once_in_lowering_and_reported(tmp_path, capsys):
    plan = load_plan(KDA, SMALL)
    w = {n: torch.randn(plan.tensors[n].shape).bfloat16() for n in plan.weights}
    ex = build_executor(compile_for_run(plan), w, device="cpu")
    assert ex.tuning_source.startswith("no shipped tuning for cpu") and ex.tuned == {"kda_two_branch_max": 2}
    assert all(not str(b).startswith("tuned:") for b in ex.backends.values())
    t = {"device": "cpu", "limits": {"kda_two_branch_max": 5},
         "backends": {f"gemm:bf16:M={m},N=556,K=256": {"backend": "torch", "config": None} for m in (1, 8, 16)}}
    f = tmp_path / "t.json"
    f.write_text(json.dumps(t))
    tuned = build_executor(compile_for_run(plan), w, device="cpu", tuning=str(f))
    assert tuned.tuning_source == str(f) and tuned.tuned == {"kda_two_branch_max": 5}
    assert tuned.backends["kda_projection.0/packed/proj"] == "torch"  # a gemm_chain keeps its own backend
    unfused = build_executor(compile_for_run(plan, CompileConfig(disable_passes={"fuse-gemm-chains"})), w,
                             device="cpu", tuning=str(f))
    assert unfused.backends["kda_projection.0/packed/proj"] == "tuned:torch"   # built with its tuned runner
    x = torch.randn(3, 256).bfloat16()
    assert all(torch.equal(a, b) for a, b in zip(ex(x=x).values(), tuned(x=x).values(), strict=True))
    assert build_executor(compile_for_run(plan), w, device="cpu", tuning={}).tuning_source.startswith("none")
    assert main(["compile", str(KDA)]) == 0
    assert ("tuning: planner/tuned/2026-11-30_h200_k3_kda_projection.json (NVIDIA H200, sm_90, torch 2.11);"
            " limits kda_two_branch_max=0") in capsys.readouterr().out
    assert main(["compile", str(KDA), "--set", "hidden=256", "--emit", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)["tuning"]
    assert rep["source"].startswith("no shipped tuning for NVIDIA H200") and rep["limits"] == {"kda_two_branch_max": 2}
