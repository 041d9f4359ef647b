"""Helpers for the gated-event tests: an independent model of what the GPU orders, and a
generator of small random plans with gated regions whose outputs leave on other streams.

simulate() does not use planner.ordering: it walks the schedule for one choice of
variants the way the executor issues it (skipped ops record nothing, a wait on an event
not recorded in the call is a no-op, a side stream's first op waits on the call's entry
when none of its waits was recorded), tracks for every stream the set of ops known
complete, and reports every read that is not ordered after its producer and every
side-stream op that is not joined back into main at exit.
"""

from __future__ import annotations

import itertools
import random

from planner.ops import VIEW_OPS


def choices(cp) -> list[dict]:
    """Every combination of variants of the plan's regions (nested ones included)."""
    regions = sorted(cp.plan.regions)
    names = [[v.name for v in cp.plan.regions[r].variants] for r in regions]
    return [dict(zip(regions, combo, strict=True)) for combo in itertools.product(*names)]


def _runs(ctx, choice) -> bool:
    return all(choice.get(r) == v for r, v in ctx)


def _producers(cp, name, choice) -> set:
    """The ops with GPU work whose result `name` is in this call (through views and selects)."""
    g = cp.graph
    p = cp.tensors[name].producer
    if p is None:
        return {"entry"}
    op = g.nodes[p]["op"]
    if op.op == "select":
        variants = list(op.variants) or [v.name for v in cp.plan.regions[op.region].variants]
        return _producers(cp, op.choices[variants.index(choice[op.region])], choice)
    if op.op in VIEW_OPS:
        out = set()
        for n in op.inputs():
            out |= _producers(cp, n, choice)
        return out
    return {p}


def simulate(cp, choice: dict) -> list[str]:
    """Problems of the compiled schedule for one variant choice ([] when it is race-free)."""
    g = cp.graph
    known: dict[str, set] = {"main": {"entry"}}
    recorded: dict[str, frozenset] = {"entry": frozenset({"entry"})}
    started: set = set()
    problems = []
    ran = []
    for v in cp.schedule:
        d = g.nodes[v]
        if d["op"].op in VIEW_OPS or not _runs(d["ctx"], choice):
            continue
        s = d["stream"]
        cur = set(known.get(s, set()))
        hit = [e for e in d["waits"] if e in recorded]
        if s != "main" and s not in started and not hit:
            cur |= recorded["entry"]
        for e in d["waits"]:
            if e in recorded:
                cur |= recorded[e]
            elif e != "entry" and _runs(g.nodes[cp.events[e]["op"]]["ctx"], choice):
                problems.append(f"{v} waits on {e}, whose recorder ran later or never")
        started.add(s)
        for n in d["op"].inputs():
            for p in _producers(cp, n, choice):
                if p not in cur:
                    problems.append(f"{v} on {s} reads {n} before {p} is known complete")
        cur.add(v)
        known[s] = cur
        for e in d["records"]:
            recorded[e] = frozenset(cur)
        ran.append(v)
    final = set(known["main"])
    for e in cp.exit_waits:
        if e in recorded:
            final |= recorded[e]
    for v in ran:
        if g.nodes[v]["stream"] != "main" and v not in final:
            problems.append(f"{v} on {g.nodes[v]['stream']} is not joined before the call returns")
    return problems


def races(cp) -> dict:
    """{variant choice as text: problems} over every combination."""
    out = {}
    for ch in choices(cp):
        p = simulate(cp, ch)
        if p:
            out[", ".join(f"{r}={v}" for r, v in ch.items())] = p
    return out


def gated_plan(seed: int, world: int = 1) -> str:
    """A random plan: 1-2 gated regions (one possibly nested) whose ops are pinned to random
    streams, outputs read by side-stream ops, gathered (fused into a bucket) and returned."""
    rng = random.Random(seed)
    streams = ["main", "aux"]
    lines = [f"plan: gated{seed}", "dims:", "  num_tokens: 1..32", "groups:", f"  tp: {world}", "tuned:",
             "  lim0: 8", "  lim1: 4", "  lim2: 20", "inputs:", "  x: bf16[num_tokens, 16]",
             "  y: bf16[num_tokens, 16]", "weights:", "  w: bf16[16, 16]", "  v: bf16[16, 16]"]
    ops: list[str] = []
    made = ["x", "y"]

    def pin():
        s = rng.choice(streams)
        return "" if s == "main" and rng.random() < 0.5 else f", stream={s}"

    def body(ind: str, src: str, out: str, depth: int, tag: str) -> list[str]:
        kind = rng.choice(["gemm_copy", "gemm_add", "two", "reduced", "nested"] if depth == 0
                          else ["gemm_copy", "gemm_add", "reduced"])
        if kind == "gemm_copy":
            return [f"{ind}- {tag}a: gemm({src}, w{pin()})", f"{ind}- {out}: copy({tag}a{pin()})"]
        if kind == "gemm_add":
            return [f"{ind}- {tag}b: gemm({src}, v{pin()})", f"{ind}- {out}: add({tag}b, {src}{pin()})"]
        if kind == "two":
            return [f"{ind}- {tag}p: gemm({src}, w{pin()})", f"{ind}- {tag}q: gemm({src}, v{pin()})",
                    f"{ind}- {out}: add({tag}p, {tag}q{pin()})"]
        if kind == "reduced":  # two all_reduces inside the variant: fused, gemms writing into the bucket
            return [f"{ind}- {tag}p: gemm({src}, w{pin()})", f"{ind}- {tag}q: gemm({src}, v{pin()})",
                    f"{ind}- {tag}rp: all_reduce({tag}p, tp)", f"{ind}- {tag}rq: all_reduce({tag}q, tp)",
                    f"{ind}- {out}: add({tag}rp, {tag}rq{pin()})"]
        inner = [f"{ind}- region: n{tag}", f"{ind}  outputs: [{tag}h]", f"{ind}  variants:"]
        for k, gate in enumerate([f"num_tokens <= tuned.lim{rng.randrange(3)}", None]):
            inner.append(f"{ind}    - name: i{k}")
            if gate:
                inner.append(f"{ind}      when: {gate}")
            inner.append(f"{ind}      ops:")
            inner += body(ind + "        ", src, f"{tag}h", depth + 1, f"{tag}i{k}")
        return inner + [f"{ind}- {out}: copy({tag}h{pin()})"]

    for r in range(rng.randint(1, 2)):
        src = rng.choice(made)
        ops += [f"  - region: r{r}", f"    outputs: [g{r}]", "    variants:"]
        n_var = rng.randint(2, 3)
        for k in range(n_var):
            ops.append(f"      - name: v{k}")
            if k < n_var - 1:
                ops.append(f"        when: num_tokens <= tuned.lim{rng.randrange(3)}")
            ops.append("        ops:")
            ops += body("          ", src, f"g{r}", 0, f"r{r}v{k}")
        made.append(f"g{r}")
    outs = []
    for r in range(len([m for m in made if m.startswith("g")])):
        ops.append(f"  - c{r}: gemm(g{r}, w{pin()})")
        ops.append(f"  - s{r}: shard(g{r}, tp, stream={rng.choice(streams)})")
        outs += [f"c{r}", f"s{r}"]
    # independent gathers of the region outputs: fuse-collectives packs them into one bucket
    for r in range(len(outs) // 2):
        ops.append(f"  - ag{r}: all_gather(g{r}, tp)")
        outs.append(f"ag{r}")
    ops.append("  - ar: all_reduce(y, tp)")
    outs.append("ar")
    lines.append(f"outputs: [{', '.join(outs)}]")
    lines.append("ops:")
    return "\n".join(lines + ops) + "\n"


def gated_rank(rank, world, seeds, tokens):
    """Rank body: the random gated plans at this world size, compiled vs reference at each token count."""
    from executors.tools.check import run_check
    from tests.dist_plans import load_text
    reps = []
    for seed in seeds:
        text = gated_plan(seed, world)
        for nt in tokens:
            # the variants of these plans compute different things by design (a race shows as a wrong
            # value), so each is compared with the reference taking the same gate, not forced
            rep = run_check(lambda t=text: load_text(t), rank=rank, num_tokens=nt, seed=seed, every_variant=False)
            rep["seed"] = seed
            reps.append(rep)
    return reps
