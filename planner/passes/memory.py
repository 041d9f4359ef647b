"""estimate-memory: lifetime-based peak activation memory (analysis only).

Pre: a schedule. Post: cp.report['estimate-memory'] with, per plan variant (per
combination of differing regions' variants that can run together), the
peak bytes of activations at that variant's largest bucket (the largest size its
gates allow: a variant gated to num_tokens < 16 is reported at 15 tokens, not at
the dims' maximum), where it peaks, and the weight and input bytes. Views share their base's storage, and a region output the storage of the chosen
variant's value (the other variants' values are not made in that call); a packed buffer that
producers write into is allocated at its first writer; outputs live to the end.
"""

from __future__ import annotations

from ..analysis import (
    between_buckets,
    largest_bucket,
    possible_buckets,
    region_groups,
    variant_picks,
)
from ..graph import Compiled, compatible, storage_root
from ..shapes import nbytes_at

NAME = "estimate-memory"


def _read(op, choice: dict | None, via: dict) -> list[str]:
    """What an op reads in a call of this variant choice. A select (a region output) reads only
    the chosen variant's value, the other variants' values do not exist in that call, and hands
    back that very tensor (the executor binds it; no copy), recorded in `via`."""
    if op.op != "select" or not choice or choice.get(op.region) not in op.variants:
        return list(op.inputs())
    chosen = op.choices[op.variants.index(choice[op.region])]
    via[op.out[0]] = chosen
    return [chosen]


def peak(cp: Compiled, choice: dict | None, bindings: dict) -> dict:
    g = cp.graph
    ctx_choice = tuple(sorted((choice or {}).items()))
    ctx_of = {v: g.nodes[v]["ctx"] for v in cp.schedule}
    fits = {c: choice is None or compatible(ctx_choice, c) for c in set(ctx_of.values())}  # repeated layers share a few
    order = [v for v in cp.schedule if fits[ctx_of[v]]]
    idx = {v: i for i, v in enumerate(order)}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    via: dict[str, str] = {}
    for v in order:
        op = g.nodes[v]["op"]
        for name in _read(op, choice, via) + list(op.out):
            if name not in cp.tensors:
                continue
            r = storage_root(cp, name, via)
            if cp.tensors[r].kind in ("input", "weight"):
                continue
            first.setdefault(r, idx[v])
            last[r] = max(last.get(r, 0), idx[v])
    end = len(order)
    for o in cp.plan.outputs:
        if o in cp.tensors:
            r = storage_root(cp, o, via)
            if r in last:
                last[r] = end
    delta = [0] * (end + 2)
    for r, i in first.items():
        b = nbytes_at(cp.tensors[r], bindings)
        delta[i] += b
        delta[last[r] + 1] -= b
    live = best = 0
    at = None
    for i in range(end + 1):
        live += delta[i]
        if live > best:
            best, at = live, (order[i] if i < end else "end")
    return {"peak_bytes": best, "peak_at": at}


def run(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    upper = {k: d.hi for k, d in cp.plan.dims.items()}
    out = {"bindings": upper, "variants": {}}
    tuned = {**cp.plan.tuned, **cfg.tuned}
    alike = len(region_groups(cp)) <= 1
    # the variant combinations the estimate covers (analysis.variant_picks): one name at a time
    # when the regions are alike (layers), else every combination of differing regions that can
    # run together, each at the largest size where it runs
    for label, choice, together in variant_picks(cp):
        ctx = tuple(sorted(choice.items()))
        runs = not choice or bool(possible_buckets(cp, ctx, tuned, together))
        if not runs and not alike:
            continue  # these variants never run together
        at = largest_bucket(cp, ctx, tuned, together)
        sizes = between_buckets(cp, ctx, tuned) if not runs else []
        if sizes:  # reached only by eager calls between the buckets: sized at the largest of those
            at = {**at, cp.plan.token_dim: sizes[-1]}
        out["variants"][label] = {**peak(cp, choice or None, at), "bindings": at}
        if sizes:
            out["variants"][label]["eager_only"] = True
        elif not runs:
            out["variants"][label]["never_runs"] = True  # sized at the dims' top, for the record
    out["weights_bytes"] = sum(nbytes_at(cp.tensors[w], upper) for w in cp.plan.weights)
    out["inputs_bytes"] = sum(nbytes_at(cp.tensors[i], upper) for i in cp.plan.inputs)
    fus = cp.report.get("fuse-collectives")
    fused = fus.get("buckets", []) if isinstance(fus, dict) else []
    # a copied member exists twice (its own storage and its slot); in-place members once
    out["fusion_added_bytes"] = sum(b["copied_bytes_max"] for b in fused)
    cp.report[NAME] = out
    return cp, False
