"""The property-test harness: compile a random plan under a random configuration, force every
variant, and compare the compiled run with the unfused reference and with the plain-torch oracle.

check_plan() runs on one rank (collectives need every rank to run the same calls in the same order:
everything here is a function of (text, seed) only). It returns a list of failures, each naming the
seed, the configuration and the forced variants, so a failure can be replayed with
PLANNER_PROPERTY_SEED (see tests/test_property.py).
"""

from __future__ import annotations

import random

import torch

from executors.lowering import build_executor
from executors.tools.check import make_data, reference_compiled
from executors.tools.externs import default_externs
from executors.tools.tune import ForcedGate
from planner.config import CompileConfig
from planner.errors import PlanError
from planner.lang.loader import load_plan
from planner.passes import PASS_NAMES, REQUIRED
from planner.pipeline import compile_plan
from planner.verify import VerifyError
from tests.oracle import evaluate_plan
from tests.random_plans import gen_plan

__all__ = ["random_config", "assignments", "check_plan", "check_seeds"]

TOL = {"fp32": (1e-4, 1e-4), "bf16": (3e-2, 3e-2), "fp16": (5e-3, 5e-3)}


def random_config(rng: random.Random) -> CompileConfig:
    optional = [p for p in PASS_NAMES if p not in REQUIRED]
    off = {p for p in optional if rng.random() < 0.25}
    return CompileConfig(disable_passes=off, num_streams=rng.randint(1, 3), verify_each=True,
                         packing=rng.choice(["auto", "auto", "cat", "inplace"]))


def describe(cfg: CompileConfig) -> str:
    return (f"--streams {cfg.num_streams} --packing {cfg.packing}"
            + "".join(f" --disable-pass {p}" for p in sorted(cfg.disable_passes)))


def assignments(plan) -> list[dict]:
    """Region -> variant maps that, together, force every variant a run can take at least once.

    A variant whose gate folds to false at compile time can never run (its ops may be gone); after
    one that folds to true nothing later can run either.
    """
    reach = {}
    for rid, reg in plan.regions.items():
        names = []
        for v in reg.variants:
            if v.static is False:
                continue
            names.append(v.name)
            if v.static is True:
                break
        reach[rid] = names or [reg.variants[-1].name]
    n = max((len(v) for v in reach.values()), default=1)
    return [{rid: vs[min(k, len(vs) - 1)] for rid, vs in reach.items()} for k in range(n)]


def _force(ex, choice: dict):
    for rid, v in choice.items():
        ex._gates[rid] = ForcedGate(rid, v, [x.name for x in ex.plan.regions[rid].variants])


_ORDER = ["bf16", "fp16", "fp32"]  # least precise first


def coarsest_dtypes(plan) -> dict:
    """tensor -> the least precise float dtype it went through (its own or any ancestor's).

    An fp32 copy of a bf16 all_reduce + add chain carries bf16 rounding: comparing it with an fp32
    tolerance against an evaluation that rounds elsewhere reports bf16 ulps (0.0156 at magnitude 2-4)
    as a mismatch. The tolerance follows the coarsest dtype on the way, not the output's own.
    """
    out = {}
    for n in list(plan.inputs) + list(plan.weights):
        out[n] = plan.tensors[n].dtype
    for op in plan.ops:
        ins = [out.get(n) for n in op.inputs() if out.get(n) in _ORDER]
        for o in op.out:
            own = plan.tensors[o].dtype if o in plan.tensors else None
            cands = ins + ([own] if own in _ORDER else [])
            out[o] = min(cands, key=_ORDER.index) if cands else own
    return out


def _close(a, b, dtype):
    # sums over ranks and gemm accumulations round partial results at the magnitude of the largest
    # term: the absolute tolerance scales with the tensor's magnitude
    rtol, atol = TOL.get(dtype, (1e-2, 1e-2))
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    return torch.allclose(a, b, rtol=rtol, atol=atol * scale)


def check_plan(seed: int, world: int, rank: int, path="tests/random_plan.yaml") -> list[dict]:
    """Every forced variant of the random plan `seed`, compiled vs reference vs oracle, on `rank`."""
    text, meta = gen_plan(seed, world)
    rng = random.Random(seed * 31 + world)
    cfg = random_config(rng)
    fails = []

    def fail(what, **kw):
        fails.append({"seed": seed, "world": world, "rank": rank, "config": describe(cfg), "what": what, **kw})

    def load():
        return load_plan(path, text=text)

    try:
        plan = load()
        cp = compile_plan(load(), cfg)
    except (PlanError, VerifyError) as exc:
        fail("compile", error=f"{type(exc).__name__}: {exc}")
        return fails
    rcp = reference_compiled(load())
    bindings = {"num_tokens": rng.randint(1, plan.dims["num_tokens"].hi)}
    data = [make_data(plan, bindings, seed, r, "cpu") for r in range(world)]
    inputs, weights = data[rank]
    ext = default_externs(plan)
    ex = build_executor(cp, weights, device="cpu", externs=ext)
    ref = build_executor(rcp, weights, device="cpu", externs=ext, backend_prefs=("torch",))
    merged = [{**d[0], **d[1]} for d in data]
    coarse = coarsest_dtypes(plan)
    for choice in assignments(plan):
        _force(ex, choice)
        _force(ref, choice)
        try:
            got = ex(dims=dict(bindings), **inputs)
        except Exception as exc:  # noqa: BLE001 - a failing run is a finding, reported with its seed
            fail("compiled run", choice=choice, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            continue
        try:
            want = ref(dims=dict(bindings), **inputs)
        except Exception as exc:  # noqa: BLE001
            fail("reference run", choice=choice, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            continue
        oracle = evaluate_plan(plan, bindings, merged, choice)
        missing = sorted(set(plan.regions) - set(ex.last_variants))
        if missing:
            fail("last_variants", choice=choice, missing=missing)
        elif ex.last_variants != choice:
            fail("variant", choice=choice, got=dict(ex.last_variants))
        for o in plan.outputs:
            dt = coarse[o]
            a, r, w = got[o], want[o], oracle[o][rank]
            if tuple(a.shape) != tuple(w.shape) or tuple(r.shape) != tuple(w.shape):
                fail("shape", choice=choice, output=o, compiled=tuple(a.shape), reference=tuple(r.shape),
                     oracle=tuple(w.shape))
                continue
            for side, t in (("compiled", a), ("reference", r)):
                if not _close(t.double(), w, dt):
                    err = float((t.double() - w).abs().max()) if t.numel() else 0.0
                    fail(f"{side} != oracle", choice=choice, output=o, dtype=dt, max_abs=err)
            if not _close(a.double(), r.double(), dt):
                fail("compiled != reference", choice=choice, output=o, dtype=dt,
                     max_abs=float((a.double() - r.double()).abs().max()))
    return fails


def check_seeds(rank: int, world: int, seeds: list[int]) -> dict:
    """Rank body for run_ranks: every seed on this rank -> {'fails': [...], 'n': plans, 'variants': runs}."""
    torch.manual_seed(0)
    out = {"fails": [], "n": 0}
    for s in seeds:
        out["fails"] += check_plan(s, world, rank)
        out["n"] += 1
    return out
