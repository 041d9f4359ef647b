"""plans/dsv3_decode_tp8.yaml: structure of the full plan, a small 2-rank --check run, the picture."""

from __future__ import annotations

from collections import Counter

from planner.cli import main
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan
from tests.planutil import PLANS

PLAN = PLANS / "dsv3_decode_tp8.yaml"
SMALL = {"tp_size": 2, "hidden": 256, "num_heads": 8, "q_lora_rank": 128, "kv_lora_rank": 128, "qk_nope_dim": 32,
         "qk_rope_dim": 32, "v_head_dim": 32, "n_routed": 16, "max_pos": 64, "num_layers": 4, "dense_layers": 1}


def test_full_plan_structure():
    plan = load_plan(PLAN)
    kinds = Counter(o.op for o in plan.ops)
    assert kinds["all_reduce"] == 2 * 61                   # o_proj and MLP/MoE per layer
    assert kinds["rope"] == 61 and kinds["add_rmsnorm"] == 2 * 61 and kinds["rmsnorm"] == 1 + 2 * 61
    assert kinds["silu_and_mul"] == 61                      # dense MLP (3) + shared expert (58)
    fp8 = [o for o in plan.ops if o.op == "gemm" and o.scaled]
    bf16 = [o for o in plan.ops if o.op == "gemm" and not o.scaled]
    assert len(fp8) == 61 * 4 + 3 * 2 + 58 * 2 and len(bf16) == 58  # MLA x4, MLP x2, shared x2; routers
    t = plan.tensors
    assert t["mla0/qkv"].shape[1] == 1536 + 512 + 64 and t["mla0/q"].shape[1] == 16 * 192
    assert t["mla0/kv"].shape[1] == 16 * 256 and t["o0"].shape[1] == 7168
    assert t["dense0/act"].shape[1] == 18432 // 8 and t["moe3/logits"].dtype == "fp32"
    assert t["s_qkv_a0"].shape == (17, 56) and t["s_o0"].shape == (56, 16)
    assert [o.op for o in plan.ops if o.id.startswith("moe3/")].count("extern") == 2
    sel = next(o for o in plan.ops if o.id == "moe3/topk_w")
    assert sel.out == ["moe3/topk_w", "moe3/topk_ids"] and t["moe3/topk_ids"].dtype == "int32"
    # in-place residual norms between layers (x1 ... x60 and m0 ... m60)
    assert sum(1 for o in plan.ops if o.op == "add_rmsnorm" and o.inplace) == 60 + 61
    cp = compile_plan(load_plan(PLAN))
    side = {cp.graph.nodes[v]["op"].op for v in cp.graph.nodes if cp.graph.nodes[v]["stream"] != "main"}
    assert "rmsnorm" in side and "silu_and_mul" in side    # placed like GEMMs: kv_a norm, shared expert


def test_small_plan_runs_check_on_two_ranks(capsys):
    args = [a for k, v in SMALL.items() for a in ("--set", f"{k}={v}")]
    assert main(["run", str(PLAN), *args, "--world-size", "2", "--check", "--num-tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert "result: OK (2 outputs x 2 rank(s))" in out


def test_draws(tmp_path, capsys):
    dot = tmp_path / "dsv3.dot"
    assert main(["viz", str(PLAN), "-o", str(dot)]) == 0
    text = dot.read_text()
    assert "add_rmsnorm" in text and "rope" in text and "overwrites" in text and "x58" in text


def test_ep_moe_plan_dispatch_and_combine_on_two_ranks(capsys):
    ep = PLANS / "dsv3_moe_ep8.yaml"
    plan = load_plan(ep)
    assert Counter(o.op for o in plan.ops)["all_to_all"] == 3
    assert plan.tensors["recv"].dtype == "fp8_e4m3" and plan.tensors["recv_counts"].shape == (8,)
    cp = compile_plan(load_plan(ep))
    assert cp.report["fuse-collectives"]["after"] == 3     # never fused
    args = ["--set", "ep_size=2", "--set", "hidden=256", "--set", "n_routed=16", "--set", "topk=2",
            "--set", "max_tokens=16", "--set", "cap=8"]
    assert main(["run", str(ep), *args, "--world-size", "2", "--check", "--num-tokens", "6"]) == 0
    assert "result: OK (1 outputs x 2 rank(s))" in capsys.readouterr().out
