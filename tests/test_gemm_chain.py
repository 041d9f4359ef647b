"""The KDA gemm -> split -> gemm chain: one gemm_chain op (planner pass fuse-gemm-chains), run by
torch on CPU and by the fused CuTe kernel on GPU (executors/backends/gemm_chain.py)."""

import pytest
import torch

from executors.lowering import build_executor
from executors.tools.check import compile_for_run, make_data
from planner.config import CompileConfig
from planner.lang.loader import load_plan
from tests.planutil import PLANS


def test_chain_lowered_to_one_step_on_cpu():
    plan = load_plan(PLANS / "k3_kda_projection.yaml")
    inputs, w = make_data(plan, {"num_tokens": 2}, seed=0, rank=0, device="cpu")
    ex = build_executor(compile_for_run(plan), w, device="cpu")
    kinds = {s.id: s.kind for s in ex._steps}
    assert kinds["kda_projection.0/packed/proj"] == "gemm_chain" and "kda_projection.0/packed/g1" not in kinds
    assert ex.backends["kda_projection.0/packed/proj"] == "torch" and ex.prepacked_bytes == {}
    two = build_executor(compile_for_run(plan, CompileConfig(disable_passes={"fuse-gemm-chains"})), w, device="cpu")
    a, b = ex(**inputs), two(**inputs)
    for k in a:
        torch.testing.assert_close(a[k], b[k])


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
def test_fused_chain_matches_reference_on_gpu(monkeypatch):
    from executors import cute
    if not cute.available():
        pytest.skip("cutlass DSL not available")
    calls = []
    step = cute.kda_fused_step

    def recorded(x, w, w_fb, out, g1, **kw):
        calls.append((tuple(x.shape), w.data_ptr(), w_fb.data_ptr(), kw["fa_col"], kw["w_swap"] is not None))
        return step(x, w, w_fb, out, g1, **kw)

    monkeypatch.setattr(cute, "kda_fused_step", recorded)
    plan = load_plan(PLANS / "k3_kda_projection.yaml")
    for m in (1, 4, 8, 16):
        inputs, w = make_data(plan, {"num_tokens": m}, seed=m, rank=0, device="cuda")
        ex = build_executor(compile_for_run(load_plan(PLANS / "k3_kda_projection.yaml")), w, device="cuda")
        assert ex.backends["kda_projection.0/packed/proj"] == "cute"  # the fused kernel (gemm_chain)
        # the packed weight is kept once, in the A-fragment layout (executors.weights): no copy
        assert ex.prepacked_bytes == {} and ex.weight_layouts["w_packed"] == "mma_a"
        ref = build_executor(compile_for_run(load_plan(PLANS / "k3_kda_projection.yaml")), w, device="cuda",
                             backend_prefs=("torch",))
        calls.clear()
        out, r = ex(**inputs), ref(**inputs)
        # the KDA speed path: one fused launch on the executor's weights, f_a at column 6144, the
        # prepared mma_a weight passed as the A-fragment operand
        wp = ex._weights["w_packed"]
        assert calls == [((m, 7168), wp.data_ptr(), w["w_fb"].data_ptr(), 6144, True)], calls
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
    assert plain.prepacked_bytes == {} and plain.backends["kda_projection.0/packed/proj"] == "cute"
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
