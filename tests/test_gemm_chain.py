"""The gemm -> split -> gemm chain peephole: detection on CPU, the fused kernel on GPU."""

import pytest
import torch

from executors.gemm_chain import _chain_of
from executors.lowering import build_executor
from executors.tools.check import compile_for_run, make_data
from planner.lang.loader import load_plan
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


def test_graphs_dropped_when_a_prepacked_weight_is_written():
    """GraphedExecutor replays the prepacked copy it captured: an in-place write to a weight
    the executor keeps a derived copy of (version counter) drops the captured graphs."""
    from executors.cudagraph import GraphedExecutor

    g = object.__new__(GraphedExecutor)  # the CUDA parts of __init__ are not needed here
    w = torch.zeros(4)
    g._watch, g.graphs, g.pool = {"w_packed": w}, {("num_tokens", 8): "graph"}, "pool"
    g._versions = g._weight_versions()
    assert not g._drop_if_weights_changed() and g.graphs
    w.add_(1)
    assert g._drop_if_weights_changed() and not g.graphs
    assert g.pool is None  # the next capture takes a fresh pool (torch released the old one)
    g.graphs[("num_tokens", 8)] = "graph again"
    assert not g._drop_if_weights_changed() and g.graphs
    g._watch = {}
    w.add_(1)
    assert not g._drop_if_weights_changed()


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
        # the packed weight is kept once, in the A-fragment layout (executors.weights): no copy
        assert ex.prepacked_bytes == {} and ex.weight_layouts["w_packed"] == "mma_a"
        ref = build_executor(compile_for_run(load_plan(PLANS / "k3_kda_projection.yaml")), w, device="cuda",
                             backend_prefs=("torch",))
        out, r = ex(**inputs), ref(**inputs)
        for k in out:
            cos = torch.nn.functional.cosine_similarity(out[k].float().flatten(), r[k].float().flatten(), dim=0)
            assert cos > 0.999, (m, k, float(cos))
    # new weights go through load_weights (in place, same addresses): a captured graph replays
    # the new weights without a re-capture
    from executors.cudagraph import GraphedExecutor
    from executors.weights import load_weights
    ge = GraphedExecutor(ex, buckets=[16])
    before = ge(**inputs)["g1"].clone()
    w["w_packed"].copy_(torch.randn_like(w["w_packed"]) / 64)
    load_weights(ex, {"w_packed": w["w_packed"]})
    after, r = ge(**inputs), ref(**inputs)
    assert not torch.equal(before, after["g1"])
    for k in after:
        cos = torch.nn.functional.cosine_similarity(after[k].float().flatten(), r[k].float().flatten(), dim=0)
        assert cos > 0.999, ("graph after load_weights", k, float(cos))
    plain = build_executor(compile_for_run(load_plan(PLANS / "k3_kda_projection.yaml")), w, device="cuda",
                           prepack=False)
    assert plain.prepacked_bytes == {} and plain.backends["kda_projection.0/packed/proj"] == "cute:fused-chain"
    out, r = plain(**inputs), ref(**inputs)
    for k in out:
        cos = torch.nn.functional.cosine_similarity(out[k].float().flatten(), r[k].float().flatten(), dim=0)
        assert cos > 0.999, ("prepack=False", k, float(cos))
    w["w_packed"].copy_(torch.randn_like(w["w_packed"]) / 64)
    load_weights(ex, {"w_packed": w["w_packed"]})
    out, r = ex(**inputs), ref(**inputs)
    for k in out:
        cos = torch.nn.functional.cosine_similarity(out[k].float().flatten(), r[k].float().flatten(), dim=0)
        assert cos > 0.999, ("after load_weights", k, float(cos))
