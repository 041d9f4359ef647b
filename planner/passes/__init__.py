"""Planner passes. Each is fn(compiled, config) -> (compiled, changed), in its own module."""

from . import (
    assign_streams,
    bucket_plans,
    dce,
    events,
    fuse_allreduce_norm,
    fuse_collectives,
    fuse_gemm_chains,
    memory,
)

__all__ = ["PIPELINE", "PASS_NAMES"]

# the one explicit, ordered pipeline
PIPELINE = [
    (dce.NAME, dce.run),
    (fuse_gemm_chains.NAME, fuse_gemm_chains.run),
    (fuse_allreduce_norm.NAME, fuse_allreduce_norm.run),
    (fuse_collectives.NAME, fuse_collectives.run),
    (assign_streams.NAME, assign_streams.run),
    (events.SCHEDULE, events.schedule),
    (events.NAME, events.derive),
    (bucket_plans.NAME, bucket_plans.run),
    (memory.NAME, memory.run),
]
PASS_NAMES = [n for n, _ in PIPELINE]
# passes the later ones need; disabling them disables what depends on them
REQUIRED = {events.SCHEDULE, events.NAME}
