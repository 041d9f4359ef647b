"""dce: remove variants whose gate folds to false, and ops nothing reads.

Pre: a built graph. Post: every op reaches a plan output or an extern marked effects=true
(model code that writes state, kept though nothing reads its results); every region keeps its
live variants in order (a variant whose gate folds to true makes the later ones
dead); a region nested in a removed variant is gone with it (no variant of it is live, so
nothing estimates, forces or gates it); select ops list only live variants.
"""

from __future__ import annotations

from ..graph import Compiled

NAME = "dce"


def run(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    g = cp.graph
    notes: list[str] = []
    by_msg: dict[str, list] = {}
    dead_variants: set = set()
    for rid, vs in cp.variants.items():
        live = []
        for v in vs:
            if v.static is False:
                dead_variants.add((rid, v.name))
                by_msg.setdefault(f"variant '{v.name}' removed: its gate is false for these params"
                                  f" ({' '.join(v.when_src.split())})", []).append(rid)
                continue
            live.append(v)
            if v.static is True:
                for w in vs[vs.index(v) + 1:]:
                    dead_variants.add((rid, w.name))
                    by_msg.setdefault(f"variant '{w.name}' removed: '{v.name}' always applies", []).append(rid)
                break
        cp.variants[rid] = live
    # regions inside a removed variant (within: the variants they sit in, outermost first)
    gone_regions = {}
    for rid in list(cp.variants):
        outer = next((w for w in cp.plan.regions[rid].within if w in dead_variants), None)
        if outer is not None:
            dead_variants |= {(rid, v.name) for v in cp.plan.regions[rid].variants}
            del cp.variants[rid]
            gone_regions[rid] = outer
            for msg in list(by_msg):  # its own variants' notes: the whole region is gone
                by_msg[msg] = [r for r in by_msg[msg] if r != rid]
                if not by_msg[msg]:
                    del by_msg[msg]
    for rid, (o, v) in gone_regions.items():
        by_msg.setdefault(f"removed with variant '{v}' of region {o}", []).append(rid)
    cp.report[NAME + ":regions"] = {rid: {"region": o, "variant": v} for rid, (o, v) in gone_regions.items()}
    for msg, rids in by_msg.items():
        where = rids[0] if len(rids) == 1 else f"{len(rids)} regions ({rids[0]}, ...)"
        notes.append(f"{where}: {msg}")
    removed = set()
    if dead_variants:
        for v, d in list(g.nodes(data=True)):
            if any(c in dead_variants for c in d["ctx"]):
                removed.add(v)
        for d in g.nodes.values():
            op = d["op"]
            if op.op == "select" and any((op.region, n) in dead_variants for n in op.variants):
                keep = [i for i, n in enumerate(op.variants) if (op.region, n) not in dead_variants]
                op.choices = [op.choices[i] for i in keep]
                op.variants = [op.variants[i] for i in keep]
    g.remove_nodes_from(removed)
    # unreachable ops: nothing downstream is a plan output or model code run for its effects
    outputs = {cp.tensors[o].producer for o in cp.plan.outputs if cp.tensors[o].producer}
    outputs |= {v for v, d in g.nodes(data=True) if d["op"].op == "extern" and d["op"].effects}
    keep = set(outputs)
    stack = list(outputs)
    while stack:  # one reverse walk from all outputs: linear in the graph
        for u in g.predecessors(stack.pop()):
            if u not in keep:
                keep.add(u)
                stack.append(u)
    unused = [v for v in g.nodes if v not in keep]
    if unused:
        notes.append(f"removed {len(unused)} op(s) whose results are never used: " + ", ".join(sorted(unused)[:5])
                     + (" ..." if len(unused) > 5 else ""))
    # model code removed this way may have been written for its effects: the CLI warns of each
    cp.report[NAME + ":externs"] = [{"id": v, "fn": g.nodes[v]["op"].fn, "loc": str(cp.plan.locs.get(v) or "")}
                                    for v in sorted(unused) if g.nodes[v]["op"].op == "extern"]
    g.remove_nodes_from(unused)
    gone = removed | set(unused)
    for name in [n for n, t in cp.tensors.items() if t.producer in gone]:
        del cp.tensors[name]
    # edges from removed variant ops into selects are gone with their nodes; rebuild to be safe
    from ..graph import rebuild_edges
    rebuild_edges(cp)
    cp.report[NAME] = notes
    return cp, bool(gone)
