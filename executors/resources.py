"""Memory a run needs vs what the device has: refuse up front instead of dying in the allocator.

need_bytes(cp, bindings) adds the plan's inputs, weights and peak activations (planner.passes.memory:
lifetime-based, the worst variant) at the given dims; free_bytes(device) is what the device can still
give (CUDA: torch.cuda.mem_get_info; CPU: MemAvailable of /proc/meminfo or the free pages of sysconf,
and the address-space rlimit when one is set). fits() compares them with a margin.
"""

from __future__ import annotations

import os
import resource

__all__ = ["need_bytes", "free_bytes", "fits", "fmt_bytes", "MARGIN"]

MARGIN = 0.9  # use at most this share of what is free: allocators round up and fragment


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1024 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PB"


def need_bytes(cp, bindings: dict, *, inputs: bool = True, weights: bool = True) -> dict:
    """{'inputs', 'weights', 'activations', 'total'} in bytes at `bindings` (the worst variant)."""
    from planner.analysis import variant_choice
    from planner.passes.memory import peak
    from planner.shapes import nbytes_at
    plan = cp.plan
    out = {"inputs": sum(nbytes_at(plan.tensors[n], bindings) for n in plan.inputs) if inputs else 0,
           "weights": sum(nbytes_at(plan.tensors[n], bindings) for n in plan.weights) if weights else 0}
    names = sorted({v.name for vs in (getattr(cp, "variants", None) or {}).values() for v in vs})
    choices = [variant_choice(cp, n) for n in names] or [None]
    out["activations"] = max(peak(cp, c, bindings)["peak_bytes"] for c in choices)
    out["total"] = out["inputs"] + out["weights"] + out["activations"]
    return out


def _cpu_free() -> int:
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if free is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = 0
        try:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
        free = min(free, max(0, soft - used))
    return free


def free_bytes(device) -> int:
    import torch
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free)
    return _cpu_free()


def fits(need: int, device, share: int = 1) -> tuple[bool, int]:
    """(need * share <= MARGIN * free, free): `share` processes each needing `need` on this device."""
    free = free_bytes(device)
    return need * share <= MARGIN * free, free


def largest(cp, bindings: dict, names) -> tuple[str, int] | None:
    from planner.shapes import nbytes_at
    sized = [(nbytes_at(cp.plan.tensors[n], bindings), n) for n in names]
    if not sized:
        return None
    b, n = max(sized)
    return n, b


def check_run(cp, bindings: dict, device: str, world: int, check: bool):
    """Raise a located PlanError (error[limit], budget device-memory) when `planner run` cannot fit on `device`.

    Per rank: inputs + weights + the compiled plan's peak activations, the reference's again with
    --check (it runs the unfused plan on the same inputs), and the fp32 staging of the largest random
    tensor. CPU ranks share one RAM; CUDA rank r uses cuda:r.
    """
    from planner.errors import PlanError
    from planner.shapes import fmt_shape
    need = need_bytes(cp, bindings)
    plan = cp.plan
    big = largest(cp, bindings, list(plan.inputs) + list(plan.weights))
    staging = 0
    if big is not None:
        from planner.shapes import DTYPES
        staging = big[1] // DTYPES[plan.tensors[big[0]].dtype] * 4
    per_rank = need["total"] + (need["activations"] if check else 0) + staging
    if device == "cuda":
        targets = [(f"cuda:{r}", 1) for r in range(world)]
    else:
        targets = [("cpu", world)]
    for dev, share in targets:
        ok, free = fits(per_rank, dev, share)
        if ok:
            continue
        dims = ", ".join(f"{k}={v}" for k, v in bindings.items())
        parts = ", ".join(f"{k} {fmt_bytes(need[k])}" for k in ("inputs", "weights", "activations"))
        msg = (f"this run needs {fmt_bytes(per_rank)} per rank" + (f" x {share} ranks" if share > 1 else "")
               + f" on {dev} ({parts}" + (", the reference's activations again for --check" if check else "")
               + f"; at {dims or 'static shapes'}) but {dev} has {fmt_bytes(free)} free")
        hint = None
        loc = None
        if big is not None:
            spec = plan.tensors[big[0]]
            loc = plan.locs.get(big[0])
            hint = (f"the largest is {spec.kind} '{big[0]}' {spec.dtype}{fmt_shape(spec.shape)} = {fmt_bytes(big[1])};"
                    " lower its params (--set) or --num-tokens")
        raise PlanError.at(loc, "limit", msg + " (budget 'device-memory')", hint)
    # build_executor sizes the activations at the dims' upper bounds: refuse here what it would refuse
    upper, at_upper = _at_upper(cp)
    act = at_upper["activations"]
    for dev, share in targets:
        ok, free = fits(act, dev, share)
        if not ok:
            at = ", ".join(f"{k}={v}" for k, v in upper.items())
            raise PlanError.at(None, "limit", f"the executor allocates {fmt_bytes(act)} of activations per rank"
                               f" at the dims' largest values ({at}) but {dev} has {fmt_bytes(free)} free"
                               " (budget 'device-memory')", "narrow the dims' ranges in the plan")
    return need


def _at_upper(cp) -> tuple[dict, dict]:
    """(the dims at their upper bounds, need_bytes of the activations there): what build_executor
    allocates."""
    upper = {k: d.hi for k, d in cp.plan.dims.items()}
    return upper, need_bytes(cp, upper, inputs=False, weights=False)


def check_build(cp, device) -> dict:
    """build_executor's check: the activations it will allocate at the dims' upper bounds (the weights
    are already the caller's) must fit what `device` has free; raises BuildError with both numbers."""
    from .errors import BuildError
    upper, need = _at_upper(cp)
    ok, free = fits(need["activations"], device)
    if not ok:
        dims = ", ".join(f"{k}={v}" for k, v in upper.items())
        raise BuildError(f"plan '{cp.plan.name}' needs {fmt_bytes(need['activations'])} of activations at the"
                         f" largest dims ({dims}) but {device} has {fmt_bytes(free)} free; narrow the dims'"
                         " ranges in the plan or pass check_memory=False to build anyway")
    return need
