"""Compile configuration: which passes run and the knobs they read."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cost import DeviceProfile

__all__ = ["CompileConfig", "MAX_STREAMS"]

MAX_STREAMS = 64  # CUDA streams a plan may spread over (a GPU runs 128 queues at most)


@dataclass
class CompileConfig:
    disable_passes: set = field(default_factory=set)
    stop_after: str | None = None        # stop the pipeline after this pass (for --after / --dump-after)
    dump_after: set = field(default_factory=set)
    verify_each: bool = False
    num_streams: int | None = None       # None: the plan's (its streams: list, or main + aux and any aux<N> it pins)
    bucket_cap_mb: float = 512.0         # max bytes of one fused collective at the dims' maximum
    packing: str = "auto"                # auto | cat | inplace
    min_gain_us: float = 1.0             # a fork/join must save at least this much
    share_bandwidth: bool = True         # ops overlapped on streams share HBM bandwidth (planner/sharing.py)
    profile: DeviceProfile = field(default_factory=DeviceProfile)
    tuned: dict = field(default_factory=dict)  # tuned limits (override plan defaults)
    tuning_source: str = ""              # which tuning applied (planner.commands.resolve_compile_tuning)
    dumps: list = field(default_factory=list)  # (pass name, text) filled by --dump-after
