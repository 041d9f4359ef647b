#!/usr/bin/env python3
"""H200: the DeepSeek-V3 stream plans compiled without pins vs serial vs every hand-pinned schedule.

Plans (bf16, TP8 shapes, no stream pins): plans/dsv3_mla_input_proj.yaml (fused q_a/kv_a GEMM,
q_a norm + q_b beside the kv norm + rope) and plans/dsv3_moe_shared_expert.yaml (shared expert
beside the router GEMM and the routed experts). Model code runs as the torch implementations of
executors/tools/externs.model_externs (rmsnorm, rope, silu_and_mul, a routed-expert stand-in that
reads the weights of every expert the batch activates).

Paths per plan and bucket (every bucket of num_tokens, 1..256):
  compiled   the plan compiled as shipped (the planner chooses streams)
  serial     the plan compiled with --streams 1
  pin:...    every op pinned by hand to main or aux (every assignment of the ops that may move,
             2^k - 1 of them; the all-main one is serial); views follow their input
Correctness first, per path and bucket: fresh random inputs, the executor eagerly and captured
in a CUDA graph whose static outputs are NaN-poisoned before the replay, each against an fp32
reference (cosine > 0.999, rel < 1e-2). Timing: two CUDA graphs of --iters steps per path
(captured in a shuffled order; the faster one's median counts: two captures of the same work
differ by a few percent), 4 weight sets rotated (the MoE weights do not fit the L2 anyway),
2 warm-ups, median of --trials replays in a new random order each trial, all paths of a bucket
in one run. Printed per bucket:
serial/compiled (target >= 1.0) and compiled/best-pinned (target <= 1.03).

    python scripts/bench_stream_plans.py --out results/stream_plans
    python scripts/bench_stream_plans.py --dry-run      # CPU, small shapes, eager timing
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import torch

from executors import build_executor
from executors.tools.bench import close_report, env_info, log, parse_tokens, write_report
from executors.tools.externs import model_externs, rmsnorm, rope, routed_experts, silu_and_mul
from executors.tools.tune import time_graphs
from planner.commands import tuned_config
from planner.lang.loader import load_plan
from planner.ops import COLLECTIVES, VIEW_OPS
from planner.pipeline import compile_plan

PLANS = {"mla": ROOT / "plans" / "dsv3_mla_input_proj.yaml", "moe": ROOT / "plans" / "dsv3_moe_shared_expert.yaml"}
DRY = {"mla": {"hidden": 64, "q_lora_rank": 32, "kv_lora_rank": 16, "rope_dim": 8, "heads": 4, "qk_head_dim": 16,
               "tp_size": 2, "max_positions": 64},
       "moe": {"hidden": 64, "experts": 16, "tp_size": 8}}
NSETS = 4
INSTANCES = 2  # graphs captured per path; the fastest instance counts (executors.tools.timing.time_graphs)
DEVICE = torch.cuda.get_device_name() if torch.cuda.is_available() else "NVIDIA H200"


def movable(plan) -> list[str]:
    return [o.id for o in plan.ops if o.op not in VIEW_OPS and o.op not in COLLECTIVES
            and not (o.op == "extern" and not o.side_stream)]


def pin_sets(plan) -> list[dict]:
    ids = movable(plan)
    out = []
    for combo in itertools.product(("main", "aux"), repeat=len(ids)):
        if "aux" in combo:
            out.append(dict(zip(ids, combo, strict=True)))
    return out


def compile_path(name: str, over: dict, pins: dict | None, serial: bool):
    plan = load_plan(PLANS[name], over)
    for o in plan.ops:
        if pins is not None and o.id in pins:
            o.stream = pins[o.id]
    # as `planner compile`: the shipped tuning for this device's plan, if any, rates the streams
    # (measured GEMM and model-code times per bucket) and may plan ranges of num_tokens apart
    cp = compile_plan(plan, tuned_config(plan, device=DEVICE, num_streams=1 if serial else 2))
    return plan, cp


def make_weights(plan, dev, gen) -> dict:
    from planner.expr import eval_int
    out = {}
    for n in plan.weights:
        shape = tuple(eval_int(d, {}) for d in plan.tensors[n].shape)
        t = torch.randn(shape, generator=gen)
        if len(shape) == 2:
            t = t / shape[1] ** 0.5
        elif n.endswith("norm"):
            t = 1.0 + 0.1 * t
        out[n] = t.to(torch.bfloat16).to(dev)
    if "cos_sin" in out:  # a real rotary table: cos | sin of position * inverse frequency
        pos, d = out["cos_sin"].shape
        inv = 10000 ** (-torch.arange(0, d // 2, dtype=torch.float32) / (d // 2))
        ang = torch.arange(pos, dtype=torch.float32)[:, None] * inv[None]
        out["cos_sin"] = torch.cat([ang.cos(), ang.sin()], dim=-1).to(torch.bfloat16).to(dev)
    return out


def make_inputs(plan, m: int, dev, gen) -> dict:
    ins = {"x": torch.randn(m, plan.params["hidden"], generator=gen).to(torch.bfloat16).to(dev)}
    if "positions" in plan.inputs:
        ins["positions"] = torch.randint(0, plan.params["max_positions"], (m,), generator=gen).to(dev)
    return ins


def reference(name: str, w: dict, ins: dict) -> dict:
    """fp32 math of the plan (the externs compute in the dtype they are given)."""
    f = {k: v.float() for k, v in w.items()}
    x = ins["x"].float()
    if name == "mla":
        p = DIMS["mla"]
        qkv = x @ f["w_qkv_a"].t()
        q_c, kv, kpe = qkv.split([p["q_lora_rank"], p["kv_lora_rank"], p["rope_dim"]], dim=-1)
        return {"q": rmsnorm(q_c, f["q_a_norm"]) @ f["w_q_b"].t(), "kv_c": rmsnorm(kv, f["kv_a_norm"]),
                "k_pe": rope(kpe, ins["positions"], f["cos_sin"])}
    logits = x @ f["w_router"].t()
    routed = routed_experts(x, logits, f["w_experts_gate_up"], f["w_experts_down"])
    shared = silu_and_mul(x @ f["w_shared_gate_up"].t()) @ f["w_shared_down"].t()
    return {"y": routed + shared}


DIMS: dict = {}


def graph_check(ex, ins: dict, want: dict) -> tuple[bool, dict]:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ex(**ins)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        static = ex(**ins)
    for v in static.values():
        v.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return close_report(static, want)


def label(pins: dict) -> str:
    return "pin:" + ",".join(k for k, v in pins.items() if v == "aux")


def bench_plan(name: str, over: dict, tokens: list | None, iters: int, trials: int, dev, cpu: bool) -> list[dict]:
    plan0 = load_plan(PLANS[name], over)
    DIMS[name] = plan0.params
    gen = torch.Generator().manual_seed(0)
    weights = [make_weights(plan0, dev, gen) for _ in range(NSETS)]
    paths = {"compiled": compile_path(name, over, None, False), "serial": compile_path(name, over, None, True)}
    for pins in pin_sets(plan0):
        paths[label(pins)] = compile_path(name, over, pins, False)
    decision = paths["compiled"][1].report.get("assign-streams")
    compiled_aux = sorted(v for v in paths["compiled"][1].graph.nodes
                          if paths["compiled"][1].graph.nodes[v]["stream"] != "main")
    log(f"{name}: {len(paths)} paths; compiled puts on aux: {compiled_aux or 'nothing'}; {decision}")
    movable_ids = movable(plan0)
    ccp = paths["compiled"][1]
    if ccp.bucket_plans:
        log(f"{name}: planned per bucket: " + "; ".join(
            f"{p['dim']} {p['lo']}..{p['hi']}: " + (", ".join(sorted(v for v in movable_ids if p["streams"][v] != "main"))
                                                    if p["streams"] else "as above") for p in ccp.bucket_plans))

    def twin_at(m):
        """The hand-pinned path with the assignment the compiled plan runs at m tokens."""
        streams = {v: ccp.graph.nodes[v]["stream"] for v in ccp.graph.nodes}
        for p in ccp.bucket_plans:
            if p["lo"] <= m <= p["hi"] and p["streams"]:
                streams = p["streams"]
        on_aux = [v for v in movable_ids if streams[v] != "main"]  # in pin_sets' order, so the labels match
        return label({v: "aux" for v in on_aux}) if on_aux else "serial"
    exs = {p: [build_executor(cp, weights[k], device=dev, externs=model_externs()) for k in range(NSETS)]
           for p, (_, cp) in paths.items()}
    rows = []
    for m in tokens or plan0.dims["num_tokens"].buckets:
        ins = make_inputs(plan0, m, dev, gen)
        want = reference(name, weights[0], ins)
        bad = []
        for p, e in exs.items():
            ok, errs = close_report(e[0](**ins), want)
            if ok and not cpu:
                ok, errs = graph_check(e[0], ins, want)
            if not ok:
                bad.append(f"{p}: {errs}")
        if bad:
            log(f"{name} M={m}: WRONG RESULTS: {bad[:3]}")
            rows.append({"plan": name, "tokens": m, "ok": False})
            continue
        # capture (and graph-pool) order shuffled per bucket: no path is always the first captured
        names = list(exs)
        random.Random(m).shuffle(names)
        fns = {p: (lambda i, e=exs[p], ins=ins: e[i % NSETS](**ins)) for p in names}
        t = time_graphs(fns, iters=iters, trials=trials, nsets=NSETS, instances=INSTANCES)
        pinned = {p: v for p, v in t.items() if p.startswith("pin:")}
        best = min(pinned, key=pinned.get)
        twin = twin_at(m)
        row = {"plan": name, "tokens": m, "ok": True, "compiled_us": round(t["compiled"], 3),
               "serial_us": round(t["serial"], 3), "best_pinned_us": round(pinned[best], 3), "best_pinned": best,
               "serial_over_compiled": round(t["serial"] / t["compiled"], 4),
               "compiled_over_best": round(t["compiled"] / pinned[best], 4),
               # the hand-pinned path with the compiled plan's assignment (its issue order may differ)
               "compiled_twin": twin, "twin_us": round(t[twin], 3) if twin in t else None,
               "all_us": {p: round(v, 3) for p, v in sorted(t.items(), key=lambda kv: kv[1])}}
        row["meets"] = row["serial_over_compiled"] >= 1.0 and row["compiled_over_best"] <= 1.03
        log(f"{name} M={m:>3}: compiled {t['compiled']:.2f} us, serial {t['serial']:.2f} us"
            f" (serial/compiled {row['serial_over_compiled']:.3f}), best pinned {pinned[best]:.2f} us {best}"
            f" (compiled/best {row['compiled_over_best']:.3f}); same assignment pinned ({twin}) "
            f"{row['twin_us'] if row['twin_us'] is not None else '-'} us{'' if row['meets'] else '  TARGET MISSED'}")
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plans", default="mla,moe")
    ap.add_argument("--tokens", help="e.g. 1,2,4 or 1..16 (default: every bucket of the plan)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=31)
    ap.add_argument("--out", help="directory for the .json/.md/.csv report")
    ap.add_argument("--dry-run", action="store_true", help="CPU, small shapes, eager timing")
    a = ap.parse_args()
    cpu = a.dry_run
    if not cpu and not torch.cuda.is_available():
        print("bench_stream_plans: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 1
    dev = torch.device("cpu" if cpu else "cuda")
    tokens = parse_tokens(a.tokens, []) or None
    rows = []
    for name in a.plans.split(","):
        rows += bench_plan(name, DRY[name] if cpu else {}, tokens, 3 if cpu else a.iters, 2 if cpu else a.trials,
                           dev, cpu)
    meta = {**env_info(), "what": "dsv3 stream plans: compiled (no pins) vs serial vs every hand-pinned schedule",
            "iters": a.iters, "trials": a.trials, "dry_run": cpu}
    cols = [("plan", "plan", ""), ("tokens", "M", ""), ("ok", "check", ""), ("compiled_us", "compiled us", ".2f"),
            ("serial_us", "serial us", ".2f"), ("best_pinned_us", "best pinned us", ".2f"),
            ("best_pinned", "best pinned (on aux)", ""), ("serial_over_compiled", "serial/compiled", ".3f"),
            ("compiled_over_best", "compiled/best", ".3f"), ("twin_us", "same assignment pinned us", ".2f"),
            ("meets", "target", "")]
    stem = f"{datetime.date.today().isoformat()}_{'cpu_dry' if cpu else 'h200'}_dsv3_stream_plans"
    print(write_report(a.out, stem, meta, rows, cols, "DeepSeek-V3 stream plans: compiled vs serial vs hand-pinned"))
    ok = all(r["ok"] for r in rows)
    print(f"correctness: {'OK' if ok else 'FAILED'}; targets met at {sum(bool(r.get('meets')) for r in rows)}"
          f" of {len(rows)} (plan, bucket) rows")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
