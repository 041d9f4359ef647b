"""The gemm -> split -> gemm chain peephole: detection on CPU, the fused kernel on GPU."""

import pytest
import torch

from executors.check import compile_for_run, make_data
from executors.gemm_chain import _chain_of
from executors.lowering import build_executor
from planner.loader import load_plan
from tests.planutil import PLANS


def _steps(device="cpu"):
    plan = load_plan(PLANS / "k3_kda_projection.yaml")
    cp = compile_for_run(plan)
    _, w = make_data(plan, {"num_tokens": 2}, seed=0, rank=0, device=device)
    ex = build_executor(cp, w, device=device)
    return cp, ex


def test_chain_found_in_packed_variant_only():
    cp, ex = _steps()
    by_id = {s.id: s for s in ex._steps if s.kind == "gemm"}
    got = {b.id: _chain_of(cp, by_id, b) for b in by_id.values()}
    a, fa_col = got["kda_projection.0/packed/g1"]
    assert a.id == "kda_projection.0/packed/proj" and fa_col == 6144
    # two_branch: the first gemm reads a slice of the packed weight, not a whole weight: no chain
    assert got["kda_projection.0/two_branch/g1"] is None
    assert got["kda_projection.0/packed/proj"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_chain_matches_reference_on_gpu():
    from executors import cute
    if not cute.available():
        pytest.skip("cutlass DSL not available")
    plan = load_plan(PLANS / "k3_kda_projection.yaml")
    for m in (1, 4, 8, 16):
        inputs, w = make_data(plan, {"num_tokens": m}, seed=m, rank=0, device="cuda")
        ex = build_executor(compile_for_run(load_plan(PLANS / "k3_kda_projection.yaml")), w, device="cuda")
        assert ex.backends["kda_projection.0/packed/proj"] == "cute:fused-chain"
        assert ex.prepacked_bytes == {"w_packed": w["w_packed"].numel() * 2}
        ref = build_executor(compile_for_run(load_plan(PLANS / "k3_kda_projection.yaml")), w, device="cuda",
                             backend_prefs=("torch",))
        out, r = ex(**inputs), ref(**inputs)
        for k in out:
            cos = torch.nn.functional.cosine_similarity(out[k].float().flatten(), r[k].float().flatten(), dim=0)
            assert cos > 0.999, (m, k, float(cos))
    # the chain keeps the packed weight a second time in the A-fragment layout (swapped mma
    # roles); writing the plan weight in place must not leave that copy stale; prepack=False
    # keeps no copy and gives the same results
    plain = build_executor(compile_for_run(load_plan(PLANS / "k3_kda_projection.yaml")), w, device="cuda",
                           prepack=False)
    assert plain.prepacked_bytes == {} and plain.backends["kda_projection.0/packed/proj"] == "cute:fused-chain"
    out, r = plain(**inputs), ref(**inputs)
    for k in out:
        cos = torch.nn.functional.cosine_similarity(out[k].float().flatten(), r[k].float().flatten(), dim=0)
        assert cos > 0.999, ("prepack=False", k, float(cos))
    w["w_packed"].copy_(torch.randn_like(w["w_packed"]) / 64)
    out, r = ex(**inputs), ref(**inputs)
    for k in out:
        cos = torch.nn.functional.cosine_similarity(out[k].float().flatten(), r[k].float().flatten(), dim=0)
        assert cos > 0.999, ("after an in-place weight update", k, float(cos))
