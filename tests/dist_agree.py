"""Rank bodies for the plan-agreement tests (importable by spawn): ranks that differ in one thing."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RACE = ROOT / "tests" / "plans" / "gated_race.yaml"
SP = ROOT / "plans" / "k3_sp_tail.yaml"


def _check(text, rank, path, tuning=None, num_tokens=8):
    from executors.tools.check import run_check
    from planner.lang.loader import load_plan
    # gated_race's variants compute different things by design: each against its own gate's reference
    return run_check(lambda: load_plan(path, text=text), rank=rank, num_tokens=num_tokens, seed=3, tuning=tuning,
                     every_variant=False)


def _race_text(hidden=64):
    return RACE.read_text().replace("hidden: 2048", f"hidden: {hidden}")


def dtype_differs(rank, world, differ_rank):
    """The SP plan; on `differ_rank` the `final` input is fp16 instead of bf16."""
    text = SP.read_text().replace("hidden: 7168", "hidden: 32").replace("value: 8, choices", f"value: {world}, choices")
    if rank == differ_rank:
        text = text.replace("  final: bf16[", "  final: fp16[")
    return _check(text, rank, SP)


def width_differs(rank, world, differ_rank):
    """The race plan; on `differ_rank` the input y has a literal width of 48 instead of `hidden` (64)."""
    text = _race_text()
    if rank == differ_rank:
        text = text.replace("y: bf16[num_tokens, hidden]", "y: bf16[num_tokens, 48]")
    return _check(text, rank, RACE)


def tuning_differs(rank, world, differ_rank):
    """The race plan at 8 tokens; `differ_rank` is built with tuned.lim = 4 (so it would take var1)."""
    return _check(_race_text(), rank, RACE, tuning={"lim": 4} if rank == differ_rank else None)


def weight_differs(rank, world, differ_rank):
    """The race plan built directly; `differ_rank` passes a weight of the wrong shape."""
    import torch

    from executors import build_executor
    from planner.lang.loader import load_plan
    from planner.pipeline import compile_plan
    plan = load_plan(RACE, text=_race_text())
    weights = {n: torch.zeros(plan.tensors[n].shape).bfloat16() for n in plan.weights}
    if rank == differ_rank:
        weights["w"] = torch.zeros(3, 3).bfloat16()
    build_executor(compile_plan(plan), weights, device="cpu")
    return "built"


EXTERN_PLAN = """
plan: ext
params:
  tp_size: 2
dims:
  num_tokens: 1..16
groups:
  tp: tp_size
inputs:
  x: bf16[num_tokens, 16]
outputs: [z]
ops:
  - y: extern(act, x, shape=[num_tokens, 16])
  - z: all_reduce(y, tp)
"""


def extern_missing(rank, world, differ_rank):
    """A plan with model code; `differ_rank` is built without the function it calls."""
    from executors import build_executor
    from planner.lang.loader import load_plan
    from planner.pipeline import compile_plan
    plan = load_plan(Path("ext.yaml"), text=EXTERN_PLAN)
    externs = {} if rank == differ_rank else {"act": lambda x: x * 2}
    build_executor(compile_plan(plan), {}, device="cpu", externs=externs)
    return "built"


class _Exhausted(dict):
    """Weights whose reading fails with an exception that has no message (as a MemoryError may)."""

    def items(self):
        raise MemoryError()


def weight_read_fails(rank, world, differ_rank):
    """The race plan built directly; reading the weights fails on `differ_rank` with MemoryError()."""
    import torch

    from executors import build_executor
    from planner.lang.loader import load_plan
    from planner.pipeline import compile_plan
    plan = load_plan(RACE, text=_race_text())
    weights = {n: torch.zeros(plan.tensors[n].shape).bfloat16() for n in plan.weights}
    build_executor(compile_plan(plan), _Exhausted(weights) if rank == differ_rank else weights, device="cpu")
    return "built"


def same(rank, world, variant_lim):
    """The race plan with the same tuning on every rank: runs and matches the reference."""
    return _check(_race_text(), rank, RACE, tuning={"lim": variant_lim})


def every_case(rank, world, differ_rank):
    """Each disagreement in turn on one set of processes (agreement leaves the group usable):
    -> {case: ("refused", message) | ("ran", report)}."""
    from executors.collectives import PlanMismatch
    out = {}
    cases = {"dtype": dtype_differs, "width": width_differs, "tuning": tuning_differs, "weight": weight_differs,
             "extern": extern_missing, "silent": weight_read_fails}
    for name, fn in cases.items():
        try:
            out[name] = ("ran", fn(rank, world, differ_rank))
        except PlanMismatch as exc:
            out[name] = ("refused", str(exc))
    for lim in (16, 4):
        out[f"same{lim}"] = ("ran", same(rank, world, lim))
    return out
