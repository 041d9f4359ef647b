"""Engine-side misuse of a built executor, each a clear error or a documented behaviour: out=
tensors that share memory, outputs of the op that alias its inputs, dims= of the wrong type,
autograd under torch.compile, build arguments of the wrong kind, model code that raises, rope
positions outside the cache, and a rank killed by a native library."""

from __future__ import annotations

import pytest
import torch

from executors import build_executor
from executors.errors import BuildError, InputError
from executors.overlap import overlaps
from executors.tools.check import compile_for_run
from planner.lang.loader import load_plan
from tests.planutil import write

ALIAS = """
plan: alias
params:
  hidden: 64
dims:
  num_tokens: 1..32
inputs:
  x: bf16[num_tokens, hidden]
  r: bf16[num_tokens, hidden]
weights:
  wn: bf16[hidden]
outputs: [n1, v1, s1, xs]
ops:
  - n1: rmsnorm(x, wn, eps='1e-6')
  - v1: view(x, [num_tokens, 4, 16])
  - s1: add(x, r)
  - xs: x[:, 0:32]
"""


def _rms(t, w):
    t = t.float()
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()


@pytest.fixture
def alias(tmp_path):
    wn = torch.randn(64).bfloat16()
    ex = build_executor(compile_for_run(load_plan(write(tmp_path, ALIAS))), {"wn": wn}, device="cpu")
    return ex, wn


def _outs(t):
    return {"n1": torch.empty(t, 64).bfloat16(), "v1": torch.empty(t, 4, 16).bfloat16(),
            "s1": torch.empty(t, 64).bfloat16(), "xs": torch.empty(t, 32).bfloat16()}


# ------------------------------------------------------------------ memory overlap

def test_overlap_is_exact_for_boxes_of_one_buffer():
    buf = torch.empty(8, 96)
    assert not overlaps(buf[:, :64], buf[:, 64:])  # column slices of a packed buffer
    assert overlaps(buf[:, :65], buf[:, 64:])
    assert not overlaps(buf[:4], buf[4:])
    assert overlaps(buf[3:5, 10:20], buf[4:6, 15:30])
    assert not overlaps(buf[3:5, 10:20], buf[5:6, 15:30])
    assert not overlaps(buf[:, 0::2], torch.empty(8, 96))  # another storage
    assert overlaps(buf.view(-1)[95:97], buf[1:2, :1])
    assert not overlaps(buf[:0], buf)  # nothing to share


@pytest.mark.parametrize("target,what", [("x", "input 'x'"), ("n1", "out['s1']"), ("wn", "weight 'wn'")])
def test_out_sharing_memory_is_refused(alias, target, what):
    ex, wn = alias
    x, r = torch.randn(3, 64).bfloat16(), torch.randn(3, 64).bfloat16()
    out = _outs(3)
    if target == "x":
        out["n1"] = x
    elif target == "n1":
        out["s1"] = out["n1"]
    else:
        out = {**out, "xs": ex._weights["wn"][:32].expand(3, 32)}
    w_before = ex._weights["wn"].clone()
    with pytest.raises(InputError, match="shares memory with " + what.replace("[", r"\[").replace("]", r"\]")):
        ex(x=x, r=r, out=out)
    assert torch.equal(ex._weights["wn"], w_before)  # refused before anything was written


def test_out_as_disjoint_views_of_one_buffer_is_correct(alias):
    ex, wn = alias
    x, r = torch.randn(3, 64).bfloat16(), torch.randn(3, 64).bfloat16()
    packed = torch.full((3, 128), float("nan")).bfloat16()
    out = {**_outs(3), "n1": packed[:, :64], "s1": packed[:, 64:]}
    ex(x=x, r=r, out=out)
    assert (packed[:, :64].float() - _rms(x, wn)).abs().max() < 0.05
    assert torch.equal(packed[:, 64:], (x.float() + r.float()).bfloat16())


def test_op_never_returns_input_memory(alias):
    ex, _ = alias
    x, r = torch.randn(3, 64).bfloat16(), torch.randn(3, 64).bfloat16()
    roots = ex._op(x, r, 3)
    held = x.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() != held for t in roots)
    eager = ex(x=x, r=r)  # documented: eager views of an input stay views
    assert eager["v1"].untyped_storage().data_ptr() == held


def test_compiled_call_checks_names_and_grad(alias):
    ex, _ = alias
    x, r = torch.randn(3, 64).bfloat16(), torch.randn(3, 64).bfloat16()
    for fn in (lambda x, r: ex(x=x, r=r, dims={"tokens": 3}),
               lambda x, r: ex(x=x, r=r, out={**_outs(3), "extra": torch.empty(1)}),
               lambda x, r: ex(x=x, r=r, out={"n1": torch.empty(3, 64).bfloat16()})):
        torch._dynamo.reset()
        with pytest.raises(Exception, match="dims= names|out= must be a dict naming"):
            torch.compile(fn, fullgraph=True)(x, r)
    torch._dynamo.reset()
    xg = x.float().requires_grad_().bfloat16()  # a non-leaf that requires grad
    with pytest.raises(Exception, match="require grad"):
        torch.compile(lambda x, r: ex(x=x, r=r), fullgraph=True)(xg, r)
    torch._dynamo.reset()
    with torch.inference_mode():
        got = torch.compile(lambda x, r: ex(x=x, r=r), fullgraph=True)(x, r)
    assert torch.equal(got["s1"], (x.float() + r.float()).bfloat16())


@pytest.mark.parametrize("dims,msg", [({"num_tokens": "3"}, "must be an int, got str"),
                                      ({"num_tokens": 3.0}, "must be an int, got float"),
                                      ({"num_tokens": True}, "must be an int, got bool"),
                                      ([3], "dims= must be a dict")])
def test_dims_of_the_wrong_type(alias, dims, msg):
    ex, _ = alias
    with pytest.raises(InputError, match=msg):
        ex(x=torch.randn(3, 64).bfloat16(), r=torch.randn(3, 64).bfloat16(), dims=dims)


def test_dims_none_value_and_index_types_are_accepted(alias):
    ex, _ = alias
    x, r = torch.randn(3, 64).bfloat16(), torch.randn(3, 64).bfloat16()
    for dims in ({"num_tokens": None}, {"num_tokens": torch.tensor(3)}):
        assert ex(x=x, r=r, dims=dims)["s1"].shape == (3, 64)


# ------------------------------------------------------------------ build arguments

def test_build_arguments_of_the_wrong_kind(tmp_path):
    cp = compile_for_run(load_plan(write(tmp_path, ALIAS)))
    wn = torch.randn(64).bfloat16()
    cases = [
        (dict(weights={"wn": [1.0] * 64}), "weight 'wn' must be a tensor, got list"),
        (dict(weights=[wn]), "weights= must be a dict"),
        (dict(weights={"wn": wn}, device="meta"), "executors run on cpu or cuda"),
        (dict(weights={"wn": wn}, backend_prefs=["nonsense"]), "backend_prefs= names \\['nonsense'\\]"),
        (dict(weights={"wn": wn}, backend_prefs="torch"), "must be a list of backend names"),
        (dict(weights={"wn": wn}, externs=[torch.neg]), "externs= must be a dict \\{fn name: callable\\}, got list"),
    ]
    if not torch.cuda.is_available():
        cases.append((dict(weights={"wn": wn}, device="cuda"), "CUDA is not available here"))
    for kw, msg in cases:
        w = kw.pop("weights")
        with pytest.raises(BuildError, match=msg):
            build_executor(cp, w, **kw)


EXTERN = """
plan: ext
dims:
  num_tokens: 1..8
inputs:
  x: fp32[num_tokens, 16]
outputs: [y]
ops:
  - y: extern(model_fn, x, shape=[num_tokens, 16])
"""


def test_extern_bindings_and_errors(tmp_path):
    cp = compile_for_run(load_plan(write(tmp_path, EXTERN)))
    with pytest.raises(BuildError, match="must be callable"):
        build_executor(cp, {}, externs={"model_fn": 3})
    assert build_executor(cp, {}, externs={"model_fn": torch.neg, "other": torch.neg})  # a registry of model code

    def boom(x):
        raise ZeroDivisionError("model code blew up")
    ex = build_executor(cp, None, externs={"model_fn": boom})  # weights=None: a plan without weights
    with pytest.raises(ZeroDivisionError) as ei:
        ex(x=torch.randn(2, 16))
    notes = getattr(ei.value, "__notes__", None)
    if notes is not None:  # Python >= 3.11
        assert "raised by extern 'model_fn' (op 'y')" in notes


def test_extern_result_on_another_device_is_named(tmp_path):
    cp = compile_for_run(load_plan(write(tmp_path, EXTERN)))
    ex = build_executor(cp, None, externs={"model_fn": lambda x: torch.neg(x).bfloat16().to("meta")})
    with pytest.raises(RuntimeError, match=r"extern 'model_fn' \(op 'y'\) returned a tensor on meta; the executor"
                                           r" runs on cpu"):
        ex(x=torch.randn(2, 16))


def test_tuning_shorthand_value_must_be_int(tmp_path):
    text = ALIAS.replace("dims:", "tuned:\n  lim: 4\ndims:", 1)
    cp = compile_for_run(load_plan(write(tmp_path, text)))
    w = {"wn": torch.randn(64).bfloat16()}
    for bad in ("x", -5):  # a file refuses a negative limit; the shorthand does too
        with pytest.raises(BuildError, match="tuning\\['lim'\\] must be a non-negative integer limit"):
            build_executor(cp, w, tuning={"lim": bad})
    # a path is a file path, str or not; an empty file is named as the source
    f = tmp_path / "t.json"
    f.write_text('{"limits": {"lim": 2}}')
    assert build_executor(cp, w, tuning=f).tuned == {"lim": 2}
    f.write_text("{}")
    assert build_executor(cp, w, tuning=f).tuning_source == f"{f} (empty): plan defaults"


def test_group_of_the_wrong_kind_is_named(tmp_path):
    from executors.collectives import GroupError
    text = EXTERN.replace("inputs:", "groups:\n  tp: 2\ninputs:").replace(
        "  - y: extern(model_fn, x, shape=[num_tokens, 16])", "  - y: all_reduce(x, tp)")
    cp = compile_for_run(load_plan(write(tmp_path, text)))
    with pytest.raises(GroupError, match="group= must be a torch.distributed ProcessGroup .* got str 'tp'"):
        build_executor(cp, {}, group="tp")
    with pytest.raises(GroupError, match="group\\['tp'\\] must be a torch.distributed ProcessGroup .* got int 2"):
        build_executor(cp, {}, group={"tp": 2})


ROPE = """
plan: rope_t
dims:
  num_tokens: 1..8
inputs:
  q: bf16[num_tokens, 2, 16]
  k: bf16[num_tokens, 1, 16]
  pos: int32[num_tokens]
weights:
  cache: fp32[32, 16]
outputs: [q2, k2]
ops:
  - q2, k2: rope(q, k, pos, cache)
"""


@pytest.mark.parametrize("bad", [32, -1])
def test_rope_positions_outside_the_cache_on_cpu(tmp_path, bad):
    cp = compile_for_run(load_plan(write(tmp_path, ROPE)))
    ex = build_executor(cp, {"cache": torch.randn(32, 16)})
    q, k = torch.randn(3, 2, 16).bfloat16(), torch.randn(3, 1, 16).bfloat16()
    ok = ex(q=q, k=k, pos=torch.tensor([0, 5, 31], dtype=torch.int32))
    assert ok["q2"].shape == (3, 2, 16)
    with pytest.raises(IndexError, match=f"rope 'q2': positions 'pos' hold .*{bad}.*rows 0..31"):
        ex(q=q, k=k, pos=torch.tensor([0, bad, 3], dtype=torch.int32))


# ------------------------------------------------------------------ ranks

def _abort(rank, world):
    import os
    if rank == 1:
        os.abort()
    return rank


def test_a_rank_killed_by_a_signal_is_reported_as_crashed():
    from executors.tools.ranks import RankFailure, run_ranks
    with pytest.raises(RankFailure, match="Crashed: the process died of SIGABRT"):
        run_ranks(_abort, 2, timeout_s=60)


def test_an_executor_is_not_copied_or_pickled_silently(alias):
    """A copy would share the executor's torch op: torch.compile of the copy ran the original's
    weights. Copies and pickles are refused, saying how to make a second executor."""
    import copy
    import pickle
    ex, wn = alias
    for f in (copy.deepcopy, copy.copy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be (copied|pickled).*build_executor"):
            f(ex)
    ex2 = build_executor(ex.compiled, {"wn": wn * 3}, device="cpu")  # the way to a second one
    x = torch.randn(3, 64).bfloat16()
    assert torch.allclose(ex2(x=x, r=x)["n1"].float(), 3 * ex(x=x, r=x)["n1"].float(), rtol=0.02, atol=0.02)


def test_load_weights_says_what_is_wrong_with_a_weight(alias):
    from executors.weights import load_weights
    ex, _ = alias
    for bad, msg in ((torch.empty(64, device="meta", dtype=torch.bfloat16), "meta tensor"),
                     ([1.0] * 64, "must be a tensor, got list"), (torch.zeros(32).bfloat16(), "must be bf16")):
        with pytest.raises(ValueError, match=msg):
            load_weights(ex, {"wn": bad})


def test_load_weights_writes_nothing_when_one_entry_is_refused(tmp_path):
    from executors.weights import load_weights
    text = ALIAS.replace("  wn: bf16[hidden]", "  wn: bf16[hidden]\n  wm: bf16[hidden]").replace(
        "outputs: [n1, v1, s1, xs]", "outputs: [n1, n2]").replace("  - v1: view(x, [num_tokens, 4, 16])\n", "").replace(
        "  - s1: add(x, r)\n  - xs: x[:, 0:32]\n", "  - n2: rmsnorm(r, wm)\n")
    w = {"wn": torch.ones(64).bfloat16(), "wm": torch.ones(64).bfloat16()}
    ex = build_executor(compile_for_run(load_plan(write(tmp_path, text))), {k: v.clone() for k, v in w.items()})
    with pytest.raises(ValueError, match="weight 'wm' must be bf16\\[64\\]"):
        load_weights(ex, {"wn": torch.full((64,), 2.0).bfloat16(), "wm": torch.ones(64)})
    assert torch.equal(ex._weights["wn"], w["wn"])  # the good entry was not written either


def test_weights_that_are_not_the_plans_are_named_as_such(alias):
    ex, wn = alias
    with pytest.raises(BuildError, match=r"\['zz'\] is not a weight of the plan \(its weights: \['wn'\]\)"):
        build_executor(ex.compiled, {"wn": wn, "zz": wn}, device="cpu")
    with pytest.raises(BuildError, match=r"weights \['wn'\] are missing$"):
        build_executor(ex.compiled, {}, device="cpu")


def test_inputs_are_taken_by_name_only(alias):
    ex, _ = alias
    x = torch.randn(3, 64).bfloat16()
    with pytest.raises(InputError, match=r"takes its inputs by name, ex\(x=\.\.\., r=\.\.\.\); got 2 positional"):
        ex(x, x)
    from executors.weights import load_weights
    with pytest.raises(ValueError, match="load_weights takes a mapping"):
        load_weights(ex, [torch.zeros(64).bfloat16()])
    import types  # any mapping is taken, as it was before the type check
    w = ex.compiled.plan.tensors["wn"]
    load_weights(ex, types.MappingProxyType({"wn": torch.ones(w.shape).bfloat16()}))


@pytest.mark.parametrize("name", ["dims", "out", "self", "_facts"])
def test_an_input_named_like_an_argument_of_the_call_is_refused_where_declared(tmp_path, name):
    from tests.planutil import diagnostic
    d = diagnostic(tmp_path, f"""
plan: t
dims:
  num_tokens: 1..16
inputs:
  x: bf16[num_tokens, 8]
  {name}: bf16[num_tokens, 8]
outputs: [y]
ops:
  - y: add(x, {name})
""", header="")
    assert d.code == "schema" and (d.loc.line, d.loc.col) == (6, 3)
    assert f"input '{name}' cannot be passed by name" in d.message
