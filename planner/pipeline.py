"""compile_plan: run the pass pipeline over a loaded plan.

verify() always runs on the result (a few ms on the 93-layer plan), so nothing that
fails it is ever handed to an executor; cfg.verify_each also runs it between passes.
"""

from __future__ import annotations

import time

from .config import CompileConfig
from .errors import PlanError, did_you_mean
from .graph import Compiled, build_graph
from .ir import Plan
from .passes import PASS_NAMES, PIPELINE, REQUIRED
from .verify import verify

__all__ = ["compile_plan", "CompileConfig", "PASS_NAMES"]


def check_pass_names(names) -> None:
    for n in names:
        if n not in PASS_NAMES:
            raise PlanError.at(None, "param", f"unknown pass '{n}' (passes: {', '.join(PASS_NAMES)})",
                               did_you_mean(n, PASS_NAMES))


def config_summary(cfg: CompileConfig) -> dict:
    """The knobs that decide what the passes make (part of the plan hash ranks agree on)."""
    import dataclasses
    import hashlib
    import json
    prof = json.dumps(dataclasses.asdict(cfg.profile), sort_keys=True, default=str)
    return {"disable_passes": sorted(cfg.disable_passes), "stop_after": cfg.stop_after,
            "num_streams": cfg.num_streams, "bucket_cap_mb": cfg.bucket_cap_mb, "packing": cfg.packing,
            "min_gain_us": cfg.min_gain_us, "share_bandwidth": cfg.share_bandwidth, "tuned": dict(sorted(cfg.tuned.items())),
            "profile": f"{cfg.profile.name} sha256:{hashlib.sha256(prof.encode()).hexdigest()[:16]}"}


def compile_plan(plan: Plan, config: CompileConfig | None = None) -> Compiled:
    from .errors import no_gc
    with no_gc():
        return _compile(plan, config or CompileConfig())


def _compile(plan: Plan, cfg: CompileConfig) -> Compiled:
    check_pass_names(cfg.disable_passes | cfg.dump_after | ({cfg.stop_after} if cfg.stop_after else set()))
    bad = REQUIRED & cfg.disable_passes
    if bad:
        raise PlanError.at(None, "param", f"pass '{sorted(bad)[0]}' cannot be disabled: the executor needs it")
    off = sorted((cfg.dump_after | ({cfg.stop_after} if cfg.stop_after else set())) & cfg.disable_passes)
    if off:
        raise PlanError.at(None, "param", f"pass '{off[0]}' is disabled, so nothing can be shown after it",
                           "drop it from --disable-pass, or name a pass that runs")
    cp = build_graph(plan)
    cp.report["config"] = config_summary(cfg)
    if cfg.verify_each:
        verify(cp)
    timings = {}
    for name, fn in PIPELINE:
        if name in cfg.disable_passes:
            cp.report[name] = "disabled"
            continue
        t0 = time.perf_counter()
        cp, changed = fn(cp, cfg)
        timings[name] = time.perf_counter() - t0
        cp.passes_run.append(name)
        if cfg.verify_each:
            verify(cp)
        if name in cfg.dump_after:
            from .report import to_text
            cfg.dumps.append((name, to_text(cp, cfg)))
        if cfg.stop_after == name:
            break
    if cp.streams and not cp.schedule:
        # stopped before scheduling: still give a usable order for dumps
        from .passes.events import schedule
        schedule(cp, cfg)
    t0 = time.perf_counter()
    verify(cp)
    timings["verify"] = time.perf_counter() - t0
    cp.report["timings_s"] = timings
    return cp
