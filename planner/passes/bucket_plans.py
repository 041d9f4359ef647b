"""plan-buckets: a stream plan of its own for each range of the dim where one pays.

Pre: derive-events done; assign-streams left cp.bucket_ranges (ranges of one dim whose buckets
another assignment serves better than the scope's single choice, by the same scheduled
estimate). Post: each range with its own assignment carries a verified `cp` of its own (the
same ops, fusion and issue order; its streams, records, waits and exit join), which the
executor runs for calls whose dim falls in the range; ranges served by the single choice run
the plan itself. Nothing here changes which ops run or what they compute: `planner run
--check` runs every range. Disabled, the single choice serves every size (as before).
"""

from __future__ import annotations

import copy

from ..graph import Compiled
from ..ops import VIEW_OPS
from . import events

NAME = "plan-buckets"


def bucket_ranges(cp, decisions, scopes) -> list[dict]:
    """Ranges of one dim whose buckets are better served by another assignment than the scope's
    single choice (its smallest worst-case loss): [{"dim", "lo", "hi", "streams" ({op: stream},
    None = the single choice), "buckets", "scheduled_us", "single_us"}] covering the dim's range;
    [] when one assignment serves every bucket. Only for a plan of one scope (no regions: their
    variants combine, and the whole-variant check rates one assignment per scope) whose buckets
    walk one dim; the plan-buckets pass derives each range's events."""
    alts = {c: info.pop("bucket_alts") for c, info in decisions.items() if "bucket_alts" in info}
    if len(scopes) != 1 or () not in alts or decisions[()]["mode"] not in ("chosen", "serial", "pinned"):
        return []
    info, own = decisions[()], scopes[()]
    bks = info["buckets"]
    walked = [d for d in bks[0] if len({b[d] for b in bks}) > 1]
    if len(walked) != 1:
        return []
    d = walked[0]
    spec = cp.plan.dims[d]
    groups: list[list[int]] = []
    keys = []
    for i in range(len(bks)):
        alt = alts[()].get(i)
        key = None if alt is None else tuple(sorted((v, alt[0][v]) for v in own))
        if groups and keys[-1] == key:
            groups[-1].append(i)
        else:
            groups.append([i])
            keys.append(key)
    if len(groups) < 2:
        return []
    out = []
    for grp, key in zip(groups, keys, strict=True):
        i0, i1 = grp[0], grp[-1]
        lo = spec.lo if i0 == 0 else bks[i0 - 1][d] + 1
        hi = spec.hi if i1 == len(bks) - 1 else bks[i1][d]
        # the candidates' views already follow their producers (assign_streams._views_follow)
        streams = None if key is None else dict(key)
        out.append({"dim": d, "lo": lo, "hi": hi, "streams": streams, "buckets": [bks[i][d] for i in grp],
                    "scheduled_us": [alts[()][i][1] if key is not None else info["scheduled_us"][i] for i in grp],
                    "single_us": [info["scheduled_us"][i] for i in grp]})
    return out


def piece_view(cp: Compiled, streams: dict) -> Compiled:
    """A copy of `cp` with the given op -> stream assignment, its events not yet derived."""
    view = copy.copy(cp)
    view.graph = cp.graph.copy()
    for v, s in streams.items():
        view.graph.nodes[v]["stream"] = s
    view.report = {}
    view.bucket_plans = []
    view.bucket_ranges = []
    view.passes_run = list(cp.passes_run)
    return view


def run(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    plans = [dict(p) for p in cp.bucket_ranges]
    if not cp.schedule or not any(p["streams"] is not None for p in plans):
        cp.bucket_plans = []
        cp.report[NAME] = []
        return cp, False
    cp.bucket_plans = plans
    for p in plans:
        if p["streams"] is None:
            p["cp"] = None
            continue
        view = piece_view(cp, p["streams"])
        events.derive(view, cfg)
        p["cp"] = view
    cp.report[NAME] = [{k: v for k, v in p.items() if k not in ("cp", "streams")}
                       | {"on_side": sorted(v for v, s in (p["streams"] or {}).items()
                                            if s != "main" and not _is_view(cp, v))} for p in plans]
    return cp, True


def _is_view(cp, v) -> bool:
    return cp.graph.nodes[v]["op"].op in VIEW_OPS
