"""plan-buckets: a stream plan of its own for each range of the dim where one pays.

Pre: derive-events done; assign-streams left cp.bucket_plans (ranges of one dim whose buckets
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
from . import events

NAME = "plan-buckets"


def piece_view(cp: Compiled, streams: dict) -> Compiled:
    """A copy of `cp` with the given op -> stream assignment, its events not yet derived."""
    view = copy.copy(cp)
    view.graph = cp.graph.copy()
    for v, s in streams.items():
        view.graph.nodes[v]["stream"] = s
    view.report = {}
    view.bucket_plans = []
    view.passes_run = list(cp.passes_run)
    return view


def run(cp: Compiled, cfg) -> tuple[Compiled, bool]:
    plans = cp.bucket_plans
    if not plans or not cp.schedule:
        cp.bucket_plans = []
        cp.report[NAME] = []
        return cp, False
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
    from ..ops import VIEW_OPS
    return cp.graph.nodes[v]["op"].op in VIEW_OPS
