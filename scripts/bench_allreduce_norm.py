#!/usr/bin/env python3
"""All-reduce fused with residual-add + RMSNorm at TP decode sizes (the step after o_proj and
after the MoE): normed, residual_out = add_rmsnorm(all_reduce(x), residual, w).

Paths per token count T (every rank holds x, residual [T, hidden] bf16; inputs preserved, as
the plan's ops promise):
  fused       FlashInfer's fused kernel (flashinfer.comm.allreduce_fusion, kARResidualRMSNorm,
              TensorRT-LLM workspace, one-shot, fp32 accumulation): one launch
  nccl_fi     NCCL all_reduce (dist.all_reduce on a copy of x) then FlashInfer fused_add_rmsnorm
              (in place on the sum and on a copy of the residual)
  nccl_torch  NCCL all_reduce then the torch add_rmsnorm (fp32 math, one rounding)
  compiled    the plan (all_reduce then add_rmsnorm) compiled: fuse-allreduce-norm makes one
              all_reduce_add_rmsnorm op, built with a tuning file whose "fusion" entry this run
              derived from phase 1 (the largest T up to which fused beat nccl_fi at every T)
Phase 1 times fused / nccl_fi / nccl_torch at every T and derives the limit; phase 2 builds
the compiled executor with it and times compiled, fused and nccl_fi again in one run, so the
ratio compiled / min(fused, nccl_fi) compares measurements of one timing pass.
Correctness first per T: fresh random inputs, each path eagerly and the compiled plan from a
captured CUDA graph with NaN-poisoned outputs, against an fp32 reference (sum of every rank's
x in fp32 + residual, RMS-normalized in fp32): normed within 2^-5 relative + 2^-5 absolute,
residual_out within 2^-6 (NCCL sums bf16 partials: up to world - 1 roundings, then one more).
Timing: one CUDA graph of --iters steps per path, 2 input sets, barrier + device rendezvous
before each replay, CUDA events, median per rank, max over ranks (executors.tools.bench).

    torchrun --nproc-per-node 8 scripts/bench_allreduce_norm.py --out results/allreduce_norm
    torchrun --nproc-per-node 2 scripts/bench_allreduce_norm.py --tokens 1,8,64 --iters 10
    python scripts/bench_allreduce_norm.py --dry-run     # CPU, gloo, 2 ranks, torch paths only
Writes <out>/allreduce_norm_tp<N>.{json,md,csv} and the tuning file
<out>/allreduce_norm_tp<N>_tuning.json (planner.tuning format, "fusion" entry); --merge-into F
adds that entry to a `planner tune` file F (which times single-process ops only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch
import torch.distributed as dist

from executors import build_executor
from executors.backends.torch_pointwise import add_rmsnorm_ref
from executors.tools.bench import env_info, log, parse_tokens, time_graphs_dist, write_report
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan
from planner.tuning import fusion_key, load_tuning, new_tuning, save_tuning

TOKENS = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
EPS = 1e-6
PLAN = """\
plan: allreduce_norm_bench
params:
  hidden: {hidden}
  tp_size: {tp}
dims:
  num_tokens: 1..{tmax}
groups:
  tp: tp_size
inputs:
  x: bf16[num_tokens, hidden]
  res: bf16[num_tokens, hidden]
weights:
  w: bf16[hidden]
outputs: [normed, res_out]
ops:
  - s: all_reduce(x, tp)
  - normed, res_out: add_rmsnorm(s, res, w, eps='{eps}')
"""
TOL = {"normed": (2 ** -5, 2 ** -5), "res_out": (2 ** -6, 2 ** -6)}  # (rtol, atol): bf16 sums rounded up to world - 1 times


def _reference(x, res, w, world):
    """fp32: the sum of every rank's x, plus this rank's residual, RMS-normalized."""
    parts = [torch.empty_like(x, dtype=torch.float32) for _ in range(world)]
    dist.all_gather(parts, x.float().contiguous())
    s = torch.stack(parts).sum(0) + res.float()
    return {"normed": s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * w.float(), "res_out": s}


def _errors(got: dict, want: dict) -> tuple[list, dict]:
    bad, err = [], {}
    for k, ref in want.items():
        g = got[k].float()
        rtol, atol = TOL[k]
        err[k] = float((g - ref).abs().max()) if g.numel() else 0.0
        if g.shape != ref.shape or not torch.isfinite(g).all() or not torch.allclose(g, ref, rtol=rtol, atol=atol):
            bad.append(k)
    return bad, err


def _graph_outputs(fn):
    """Capture fn(0) in a CUDA graph, poison what it returned with NaN, replay: the replay's outputs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(0)
    torch.cuda.synchronize()
    dist.barrier()
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr, stream=s):
        static = fn(0)
    for v in static.values():
        v.fill_(float("nan"))
    torch.cuda.synchronize()
    dist.barrier()
    gr.replay()
    torch.cuda.synchronize()
    return static, gr


class Paths:
    """The baseline paths over per-set inputs xs[i], rs[i] (preserved) and the weight w."""

    def __init__(self, dev, world, hidden, tmax, cpu):
        self.dev, self.world, self.H, self.cpu = dev, world, hidden, cpu
        self.ws = None
        if not cpu:
            from flashinfer.comm import create_allreduce_fusion_workspace
            self.ws = create_allreduce_fusion_workspace(backend="trtllm", world_size=world, rank=dist.get_rank(),
                                                        max_token_num=tmax, hidden_dim=hidden, dtype=torch.bfloat16,
                                                        group=dist.group.WORLD)

    def fused(self, xs, rs, w):
        from flashinfer.comm import AllReduceFusionPattern, allreduce_fusion

        def f(i):
            x, r = xs[i % len(xs)], rs[i % len(rs)]
            normed, res_out = torch.empty_like(x), torch.empty_like(r)
            allreduce_fusion(input=x, workspace=self.ws, pattern=AllReduceFusionPattern.kARResidualRMSNorm,
                             launch_with_pdl=False, residual_out=res_out, norm_out=normed, residual_in=r,
                             rms_gamma=w, rms_eps=EPS, use_oneshot=True, fp32_acc=True)
            return {"normed": normed, "res_out": res_out}
        return f

    def nccl_fi(self, xs, rs, w):
        from flashinfer.norm import fused_add_rmsnorm

        def f(i):
            s, r = xs[i % len(xs)].clone(), rs[i % len(rs)].clone()
            dist.all_reduce(s)
            fused_add_rmsnorm(s, r, w, EPS)
            return {"normed": s, "res_out": r}
        return f

    def nccl_torch(self, xs, rs, w):
        def f(i):
            s = xs[i % len(xs)].clone()
            dist.all_reduce(s)
            normed, res_out = add_rmsnorm_ref(s, rs[i % len(rs)], w, EPS)
            return {"normed": normed, "res_out": res_out}
        return f


def _compiled(ex, xs, rs, T):
    def f(i):
        out = ex(dims={"num_tokens": T}, x=xs[i % len(xs)], res=rs[i % len(rs)])
        return {"normed": out["normed"], "res_out": out["res_out"]}
    return f


def _time(fns, args, cpu):
    if cpu:
        from executors.tools.tune import eager_times
        res = eager_times(fns, args["iters"], args["trials"], sync=dist.barrier)
        med = torch.tensor([res[n] for n in fns], dtype=torch.float64)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        return dict(zip(list(fns), med.tolist(), strict=True))
    return time_graphs_dist(fns, iters=args["iters"], trials=args["trials"], nsets=2)


def _limit(rows) -> int:
    """The largest T up to which fused beat nccl_fi at every measured T (0: never)."""
    best = 0
    for r in sorted(rows, key=lambda r: r["tokens"]):
        if r.get("fused_us") is None or r["fused_us"] >= r["nccl_fi_us"]:
            break
        best = r["tokens"]
    return best


def _inputs(dev, T, H, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    mk = lambda: torch.randn(T, H, generator=g).to(torch.bfloat16).to(dev)  # noqa: E731
    return [mk(), mk()], [mk(), mk()]


def _check(name, fn, want, cpu, bad, keep):
    """fn(0) against the reference; its outputs land in NaN-poisoned memory: the earlier paths'
    results stay alive (`keep`) and a freed NaN block is what the allocator hands out next."""
    n = 4 * want["normed"].numel()
    poison = torch.full((n,), float("nan"), dtype=torch.bfloat16, device=want["normed"].device)
    del poison
    got = fn(0)
    keep.append(got)
    b, err = _errors(got, want)
    bad += [f"{name}:{k}" for k in b]
    if not cpu and name == "compiled":
        static, gr = _graph_outputs(fn)
        b2, _ = _errors(static, want)
        bad += [f"{name}-graph:{k}" for k in b2]
        del gr
    return err


def rank_body(rank: int, world: int, args: dict) -> dict:
    cpu = args["dry_run"]
    dev = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
    H, tokens = args["hidden"], args["tokens"]
    tmax = max(tokens)
    paths = Paths(dev, world, H, tmax, cpu)
    w = (1 + 0.1 * torch.randn(H, generator=torch.Generator().manual_seed(7))).to(torch.bfloat16).to(dev)
    names = ["nccl_torch"] if cpu else ["fused", "nccl_fi", "nccl_torch"]
    rows = []
    for T in tokens:  # ---- phase 1: correctness and the three paths
        xs, rs = _inputs(dev, T, H, 1000 * T + rank)
        want = _reference(xs[0], rs[0], w, world)
        fns = {n: getattr(paths, n)(xs, rs, w) for n in names}
        bad, errs, keep = [], {}, []
        for n, fn in fns.items():
            errs[n] = _check(n, fn, want, cpu, bad, keep)
        keep.clear()
        t = _time(fns, args, cpu)
        rows.append({"tokens": T, "MB": round(T * H * 2 / 1e6, 3), **{f"{n}_us": round(v, 2) for n, v in t.items()},
                     "err": errs, "bad": bad})
        if rank == 0:
            log(f"[arn] phase 1 T={T:4d}: " + "  ".join(f"{n} {v:.1f}" for n, v in t.items()) + " us"
                + (f"  FAILED {bad}" if bad else ""))
    limit = 0 if cpu else _limit(rows)
    tuning = new_tuning(env_info().get("device", "cpu"), torch.__version__)
    tuning["fusion"] = {fusion_key("bf16", H, world): {"max_tokens": limit, "max_bytes": limit * H * 2}}
    plan_text = PLAN.format(hidden=H, tp=world, tmax=tmax, eps=EPS)
    cp = compile_plan(load_plan("allreduce_norm_bench.yaml", text=plan_text))
    fused_ops = cp.report["fuse-allreduce-norm"]["fused"]
    ex = build_executor(cp, {"w": w}, device=dev, tuning=tuning)
    for row in rows:  # ---- phase 2: the compiled choice, timed with the two it chooses between
        T = row["tokens"]
        xs, rs = _inputs(dev, T, H, 2000 * T + rank)
        want = _reference(xs[0], rs[0], w, world)
        fns = {"compiled": _compiled(ex, xs, rs, T)}
        if not cpu:
            fns.update({"fused": paths.fused(xs, rs, w), "nccl_fi": paths.nccl_fi(xs, rs, w)})
        row["err"]["compiled"] = _check("compiled", fns["compiled"], want, cpu, row["bad"], [])
        t = _time(fns, args, cpu)
        row["compiled_us"] = round(t["compiled"], 2)
        row["took"] = "fused" if T <= limit and not cpu else "unfused"
        if not cpu:
            row["fused_p2_us"], row["nccl_fi_p2_us"] = round(t["fused"], 2), round(t["nccl_fi"], 2)
            best = min(t["fused"], t["nccl_fi"])
            row["compiled_over_best"] = round(t["compiled"] / best, 3)
            row["fi_over_fused"] = round(t["nccl_fi"] / t["fused"], 3)
        flag = torch.tensor([len(row["bad"])], dtype=torch.int64, device=dev)
        dist.all_reduce(flag)
        row["ok"] = int(flag.item()) == 0
        if not row["ok"] and args["strict"]:
            raise AssertionError(f"rank {rank} T={T}: mismatching outputs {row['bad']} (errors {row['err']})")
        if rank == 0:
            log(f"[arn] phase 2 T={T:4d}: compiled {t['compiled']:.1f} us ({row['took']})"
                + ("" if cpu else f", fused {t['fused']:.1f}, nccl_fi {t['nccl_fi']:.1f}; compiled/best"
                   f" {row['compiled_over_best']:.3f}"))
        row["err"] = {k: {kk: f"{vv:.3g}" for kk, vv in v.items()} for k, v in row["err"].items()}
    return {"rank": rank, "rows": rows, "limit": limit, "tuning": tuning, "backends": dict(ex.backends),
            "fused_ops": [f["id"] for f in fused_ops]}


COLS = [("tokens", "T", ""), ("MB", "x MB", ".3f"), ("fused_us", "fused", ".1f"), ("nccl_fi_us", "NCCL+FI norm", ".1f"),
        ("nccl_torch_us", "NCCL+torch norm", ".1f"), ("fi_over_fused", "NCCL+FI / fused", ".3f"),
        ("took", "compiled takes", ""), ("compiled_us", "compiled", ".1f"), ("fused_p2_us", "fused (same run)", ".1f"),
        ("nccl_fi_p2_us", "NCCL+FI (same run)", ".1f"), ("compiled_over_best", "compiled / best (<= 1.03)", ".3f"),
        ("ok", "check", "")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default=None, help="token counts (default 1..256)")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--tolerance", type=float, default=0.03, help="compiled may be this much slower than the best")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--merge-into", default=None, help="a `planner tune` file to add the derived fusion entry to")
    ap.add_argument("--dry-run", action="store_true", help="CPU + gloo, 2 spawned ranks, hidden 64, torch paths")
    ap.add_argument("--no-strict", action="store_true", help="report mismatches instead of failing")
    a = ap.parse_args()
    if a.dry_run and a.hidden == 7168:
        a.hidden = 64
    tokens = parse_tokens(a.tokens, TOKENS)
    args = {"tokens": tokens, "hidden": a.hidden, "iters": a.iters, "trials": a.trials, "dry_run": a.dry_run,
            "strict": not a.no_strict}
    under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    if not a.dry_run and not (under_torchrun and torch.cuda.is_available()):
        print("bench_allreduce_norm: launch with torchrun --nproc-per-node N on CUDA GPUs (or --dry-run)",
              file=sys.stderr)
        return 2
    t0 = time.time()
    if under_torchrun:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if not a.dry_run:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("gloo" if a.dry_run else "nccl")
        try:
            res = rank_body(rank, world, args)
            allres = [None] * world
            dist.all_gather_object(allres, res)
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return 0
    else:
        from executors.tools.ranks import run_ranks
        world = 2
        allres = run_ranks(rank_body, world, args, backend="gloo", timeout_s=590, coll_timeout_s=180)
    if world < 2:
        print(f"bench_allreduce_norm: needs at least 2 ranks (world size {world})", file=sys.stderr)
        return 2
    res = allres[0]
    rows = res["rows"]
    for i, r in enumerate(rows):
        r["ok"] = all(x["rows"][i]["ok"] for x in allres)
        r["compiled_ok"] = r.get("compiled_over_best") is None or r["compiled_over_best"] <= 1 + a.tolerance
    info = env_info()
    meta = {**info, "world_size": world, "hidden": a.hidden, "dtype": "bf16", "iters": a.iters, "trials": a.trials,
            "fused_limit_tokens": res["limit"], "compiled_backends": res["backends"], "fused_ops": res["fused_ops"],
            "tolerance": a.tolerance, "seconds": round(time.time() - t0, 1),
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}
    stem = f"allreduce_norm_tp{world}"
    title = (f"All-reduce + residual add + RMSNorm, {info.get('device', 'cpu')} x{world} (TP{world}), bf16,"
             f" hidden {a.hidden}, us per step (CUDA-graph replay, median, max over ranks)")
    notes = [f"compiled: plan all_reduce -> add_rmsnorm, fused by fuse-allreduce-norm, built with the tuning entry"
             f" {json.dumps(res['tuning']['fusion'])} derived from phase 1 (fused kernel up to"
             f" {res['limit']} tokens).",
             f"Target: compiled <= {1 + a.tolerance:g}x min(fused, NCCL+FI) at every T, measured in the same run."]
    table = write_report(a.out, stem, meta, rows, COLS, title, notes)
    if a.out:
        save_tuning(res["tuning"], Path(a.out) / f"{stem}_tuning.json")
    if a.merge_into:  # planner tune runs in one process and times no collectives: the entry comes from here
        data = load_tuning(a.merge_into)
        data.setdefault("fusion", {}).update(res["tuning"]["fusion"])
        save_tuning(data, a.merge_into)
    print(table)
    ok = all(r["ok"] for r in rows)
    fast = all(r["compiled_ok"] for r in rows)
    print(f"correct: {'yes' if ok else 'NO'}; compiled never slower than the best (x{1 + a.tolerance:g}):"
          f" {'yes' if fast else 'NO'}; fused kernel limit {res['limit']} tokens")
    return 0 if ok and fast else 1


if __name__ == "__main__":
    sys.exit(main())
