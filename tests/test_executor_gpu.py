"""GPU-only: streams pool, CUDA-graph capture per bucket and inside a caller's capture (skipped on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PLANS = Path(__file__).resolve().parent.parent / "plans"
KDA = PLANS / "k3_kda_projection.yaml"


@pytest.fixture(scope="module")
def kda():
    from executors import build_executor
    from executors.tools.check import compile_for_run, make_data, reference_compiled
    from planner.lang.loader import load_plan
    _, w = make_data(load_plan(KDA), {"num_tokens": 1}, seed=0, rank=0, device="cuda")
    ex = build_executor(compile_for_run(load_plan(KDA)), w, device="cuda", backend_prefs=("torch",),
                        tuning={"kda_two_branch_max": 14})
    ref = build_executor(reference_compiled(load_plan(KDA)), w, device="cuda", backend_prefs=("torch",))
    return ex, ref, w


def _close(a, b):
    return all(torch.allclose(a[k].float(), b[k].float(), rtol=2e-2, atol=2e-2) for k in b)


def test_side_streams_are_shared_not_per_executor(kda):
    from executors import build_executor
    from executors.streams import pool_size
    from executors.tools.check import compile_for_run
    from planner.lang.loader import load_plan
    ex, _, w = kda
    x = torch.randn(2, 7168, device="cuda").bfloat16()
    ex(x=x, _facts=ex.facts({"x": x}, capturing=True))
    n = pool_size()
    for _ in range(3):
        other = build_executor(compile_for_run(load_plan(KDA)), w, device="cuda", backend_prefs=("torch",))
        other(x=x, _facts=other.facts({"x": x}, capturing=True))
    assert pool_size() == n


@pytest.mark.parametrize("m", [1, 3, 14, 16])
def test_graphed_executor_per_bucket(kda, m):
    from executors.cudagraph import GraphedExecutor
    ex, ref, _ = kda
    g = GraphedExecutor(ex)
    x = torch.randn(m, 7168, device="cuda").bfloat16()
    out = g(x=x)
    assert out["g1"].shape == (m, 1536)
    assert g.last_variants["kda_projection.0"] == ("two_branch" if g.last_bucket <= 14 else "packed")
    assert _close(out, ref(x=x))


def test_graphed_executor_checks_its_inputs_as_the_eager_call_does(kda):
    """Positional inputs, a wrong dtype or a missing input are the eager call's InputError, before
    any capture (the graphed call read a positional x as dims= and failed in the dims solver)."""
    from executors.cudagraph import GraphedExecutor
    from executors.errors import InputError
    ex, _, _ = kda
    g = GraphedExecutor(ex)
    x = torch.randn(2, 7168, device="cuda").bfloat16()
    with pytest.raises(InputError, match=r"takes its inputs by name, ex\(x=\.\.\.\); got 1 positional"):
        g(x)
    with pytest.raises(InputError, match="input 'x' must be"):
        g(x=x.float())
    with pytest.raises(InputError, match=r"missing \['x'\]"):
        g()
    assert not g.graphs


def test_inside_a_callers_capture_selects_two_branch(kda):
    ex, ref, _ = kda
    x = torch.randn(4, 7168, device="cuda").bfloat16()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ex(x=x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ex(x=x)
    assert ex.last_variants["kda_projection.0"] == "two_branch"
    x.copy_(torch.randn_like(x, dtype=torch.float32).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    assert _close(out, ref(x=x))


def test_graphed_executor_refuses_a_padded_call_whose_result_depends_on_padded_rows(tmp_path):
    """cat along the token dim lays the bucket's rows twice: sliced back at 3 of bucket 4 it
    would return x[0:3] then padded row 3 and x[0:1]. A call at the bucket's size is right."""
    from executors import build_executor
    from executors.cudagraph import GraphedExecutor
    from planner.lang.loader import load_plan
    from planner.pipeline import compile_plan
    p = tmp_path / "cat.yaml"
    p.write_text("plan: cat\ndims:\n  num_tokens: 1..8\ninputs:\n  x: bf16[num_tokens, 64]\noutputs: [y, z]\n"
                 "ops:\n  - y: cat(x, x, dim=0)\n  - z: copy(x)\n")
    g = GraphedExecutor(build_executor(compile_plan(load_plan(p)), {}, device="cuda"), buckets=[4, 8])
    x = torch.randn(3, 64, device="cuda").bfloat16()
    with pytest.raises(ValueError, match=r"num_tokens = 3 would replay the graph of bucket 4 .* cat y"):
        g(x=x)
    x4 = torch.randn(4, 64, device="cuda").bfloat16()
    out = g(x=x4)
    assert torch.equal(out["y"], torch.cat([x4, x4])) and torch.equal(out["z"], x4)
    # a plan of row-wise work replays padded sizes
    q = tmp_path / "rows.yaml"
    q.write_text("plan: rows\ndims:\n  num_tokens: 1..8\ninputs:\n  x: bf16[num_tokens, 64]\noutputs: [z]\n"
                 "ops:\n  - z: copy(x)\n")
    g2 = GraphedExecutor(build_executor(compile_plan(load_plan(q)), {}, device="cuda"), buckets=[4, 8])
    assert torch.equal(g2(x=x)["z"], x)
