"""Helpers for the multi-process tests: random plan generator and rank bodies (importable by spawn)."""

from __future__ import annotations

import random
from pathlib import Path

PLANS = Path(__file__).resolve().parent.parent / "plans"
SMALL_TP8 = {"num_layers": 8, "hidden": 64, "kda_heads": 8, "head_dim": 4, "fa_rank": 8}


def random_plan(seed: int, world: int, n_ops: int = 10) -> str:
    """A small random DAG plan as YAML text: gemms, adds, splits, cats, slices and collectives.

    Every tensor is [rows, cols] with rows 'num_tokens' or 'num_tokens * W' (after a dim-0
    gather); cols are multiples of 8 (and of the group size where a collective needs it).
    """
    rng = random.Random(seed)
    T, TW = "num_tokens", f"num_tokens * {world}"
    tensors: dict[str, tuple[str, int]] = {}
    weights: dict[str, tuple[int, int]] = {}
    inputs = []
    for i in range(rng.randint(2, 3)):
        cols = rng.choice([8, 16, 24])
        tensors[f"x{i}"] = (T, cols)
        inputs.append(f"x{i}")
    ops: list[str] = []
    consumed: set[str] = set()
    k = 0

    def new():
        nonlocal k
        k += 1
        return f"t{k}"

    def pick(pred=lambda n, s: True):
        c = [n for n, s in tensors.items() if pred(n, s)]
        return rng.choice(c) if c else None

    for _ in range(n_ops):
        kind = rng.choice(["gemm", "gemm", "add", "split", "cat", "slice", "all_gather", "all_gather",
                           "reduce_scatter", "all_reduce"])
        if kind == "gemm":
            a = pick()
            rows, cols = tensors[a]
            n = rng.choice([8, 16, 24])
            w = f"w{len(weights)}"
            weights[w] = (n, cols)
            o = new()
            ops.append(f"{o}: gemm({a}, {w})")
            tensors[o] = (rows, n)
        elif kind == "add":
            a = pick()
            b = pick(lambda n, s, a=a: s == tensors[a])
            o = new()
            ops.append(f"{o}: add({a}, {b})")
            tensors[o] = tensors[a]
        elif kind == "split":
            a = pick(lambda n, s: s[1] >= 16)
            if a is None:
                continue
            rows, cols = tensors[a]
            c1 = 8 * rng.randint(1, cols // 8 - 1)
            o1, o2 = new(), new()
            ops.append(f"{o1}, {o2}: split({a}, [{c1}, {cols - c1}])")
            tensors[o1], tensors[o2] = (rows, c1), (rows, cols - c1)
            consumed.add(a)
        elif kind == "cat":
            a = pick()
            b = pick(lambda n, s, a=a: s[0] == tensors[a][0] and n != a)
            if b is None or tensors[a][1] + tensors[b][1] > 64:
                continue
            o = new()
            ops.append(f"{o}: cat({a}, {b}, dim=-1)")
            tensors[o] = (tensors[a][0], tensors[a][1] + tensors[b][1])
        elif kind == "slice":
            a = pick(lambda n, s: s[1] >= 16)
            if a is None:
                continue
            rows, cols = tensors[a]
            s0 = 8 * rng.randint(0, cols // 8 - 1)
            s1 = 8 * rng.randint(s0 // 8 + 1, cols // 8)
            o = new()
            ops.append(f"{o}: {a}[:, {s0}:{s1}]")
            tensors[o] = (rows, s1 - s0)
        elif kind == "all_gather":
            if rng.random() < 0.7:
                a = pick(lambda n, s: s[0] == T)
                if a is None:
                    continue
                o = new()
                ops.append(f"{o}: all_gather({a}, tp)")
                tensors[o] = (TW, tensors[a][1])
            else:
                a = pick(lambda n, s: s[1] * world <= 64)
                if a is None:
                    continue
                o = new()
                ops.append(f"{o}: all_gather({a}, tp, 1)")
                tensors[o] = (tensors[a][0], tensors[a][1] * world)
        elif kind == "reduce_scatter":
            a = pick(lambda n, s: s[0] == TW)
            if a is not None:
                o = new()
                ops.append(f"{o}: reduce_scatter({a}, tp)")
                tensors[o] = (T, tensors[a][1])
                continue
            a = pick(lambda n, s: s[1] % (8 * world) == 0)
            if a is None:
                continue
            o = new()
            ops.append(f"{o}: reduce_scatter({a}, tp, 1)")
            tensors[o] = (tensors[a][0], tensors[a][1] // world)
        else:
            a = pick()
            o = new()
            ops.append(f"{o}: all_reduce({a}, tp)")
            tensors[o] = tensors[a]
        consumed.update(x for x in tensors if x in ops[-1].split(":", 1)[1])
    # independent gathers of what the DAG made: what fuse-collectives packs
    made = [n for n, s in tensors.items() if n not in inputs and s[0] == T]
    for a in rng.sample(made, min(len(made), rng.randint(2, 3))):
        o = new()
        ops.append(f"{o}: all_gather({a}, tp)[:{T} * {world}]")
        tensors[o] = (TW, tensors[a][1])
    produced = [n for n in tensors if n not in inputs]
    outs = [n for n in produced if not any(f"({n}," in op or f" {n}," in op or f" {n})" in op or f"({n})" in op
                                           or f"({n}[" in op for op in ops)]
    outs = sorted(set(outs + rng.sample(produced, min(2, len(produced)))), key=lambda n: int(n[1:]))
    lines = [f"plan: rand{seed}", "dims:", "  num_tokens: 1..24", "groups:", f"  tp: {world}", "inputs:"]
    lines += [f"  {n}: bf16[num_tokens, {tensors[n][1]}]" for n in inputs]
    if weights:
        lines.append("weights:")
        lines += [f"  {w}: bf16[{n}, {kk}]" for w, (n, kk) in weights.items()]
    lines.append(f"outputs: [{', '.join(outs)}]")
    lines.append("ops:")
    lines += [f"  - {op}" for op in ops]
    return "\n".join(lines) + "\n"


def load_text(text: str, name: str = "random.yaml"):
    from planner.lang.loader import load_plan
    return load_plan(PLANS / name, text=text)


def shipped_and_random(rank, world, random_texts, num_tokens):
    """Rank body: every shipped plan and every random plan, compiled vs reference."""
    from executors.tools.check import make_data, run_check
    from planner.lang.loader import load_plan

    reports = []
    sp = lambda: load_plan(PLANS / "k3_sp_tail.yaml", {"tp_size": world, "hidden": 32})  # noqa: E731
    rep = run_check(sp, rank=rank, num_tokens=num_tokens, seed=11)
    # an independent check of the SP semantics: cat of every rank's shard, sliced to num_tokens
    plan = sp()
    b = rep["dims"]
    shards = [make_data(plan, b, 11, r, "cpu")[0] for r in range(world)]
    rep["independent_ok"] = True
    from executors.lowering import build_executor
    from executors.tools.check import compile_for_run
    ex = build_executor(compile_for_run(sp()), {}, device="cpu")
    outs = ex(dims=b, **shards[rank])
    for name in plan.inputs:
        import torch
        want = torch.cat([s[name] for s in shards], 0)[:num_tokens]
        rep["independent_ok"] &= bool(torch.equal(outs[f"{name}_full"], want))
    rep["fused"] = [v for v in ex.compiled.schedule if ex.compiled.graph.nodes[v]["op"].op == "all_gather"]
    reports.append(rep)
    tp8 = lambda: load_plan(PLANS / "k3_tp8.yaml", {**SMALL_TP8, "tp_size": world})  # noqa: E731
    reports.append(run_check(tp8, rank=rank, num_tokens=num_tokens, seed=12))
    for i, text in enumerate(random_texts):
        rep = run_check(lambda t=text: load_text(t), rank=rank, num_tokens=num_tokens, seed=100 + i)
        rep["text"] = text
        reports.append(rep)
    return reports


def mismatched(rank, world, differ_rank):
    """Rank body: rank `differ_rank` loads the SP plan with another hidden size."""
    from executors.tools.check import run_check
    from planner.lang.loader import load_plan
    hidden = 48 if rank == differ_rank else 32
    return run_check(lambda: load_plan(PLANS / "k3_sp_tail.yaml", {"tp_size": world, "hidden": hidden}),
                     rank=rank, num_tokens=5, seed=1)


def wrong_group_size(rank, world):
    from executors.tools.check import run_check
    from planner.lang.loader import load_plan
    return run_check(lambda: load_plan(PLANS / "k3_sp_tail.yaml", {"tp_size": 2 * world, "hidden": 32}),
                     rank=rank, num_tokens=5, seed=1)


def bad_input_on_one_rank(rank, world, bad_rank):
    """Rank body: rank `bad_rank` raises (a bad input) before the plan's first collective; the others
    enter the all_gather and would wait for it."""
    from executors.tools.check import run_check
    from planner.lang.loader import load_plan
    if rank == bad_rank:
        raise ValueError(f"input 'final' on rank {rank} has shape (3, 31) but the plan needs (3, 32)")
    return run_check(lambda: load_plan(PLANS / "k3_sp_tail.yaml", {"tp_size": world, "hidden": 32}),
                     rank=rank, num_tokens=5, seed=1)


def hang_on_one_rank(rank, world, bad_rank):
    """Rank body: rank `bad_rank` fails; rank 0 (if not bad) sleeps far past any grace instead of a collective."""
    import time
    if rank == bad_rank:
        raise RuntimeError("the bad rank's own failure")
    time.sleep(600)


def dims_differ(rank, world, check_dims):
    """Rank body: rank 1 is called with another num_tokens (its inputs agree with its own dims)."""
    import torch

    from executors.lowering import build_executor
    from executors.tools.check import make_data
    from planner.lang.loader import load_plan
    from planner.pipeline import compile_plan
    plan = load_plan(PLANS / "k3_sp_tail.yaml", {"tp_size": world, "hidden": 32})
    n = 8 if rank == 0 else 12
    inputs, weights = make_data(plan, {"num_tokens": n}, 1, rank, "cpu")
    ex = build_executor(compile_plan(plan), weights, device="cpu", check_dims=check_dims)
    out = ex(dims={"num_tokens": n}, **inputs)
    return {k: tuple(v.shape) for k, v in out.items()} if isinstance(out, dict) else torch.Size()
