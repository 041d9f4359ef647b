"""Colours shared by the graph picture and the timeline: one per op kind, one per stream.

Colours are fixed per kind (not assigned in order of appearance), so the same kind
has the same colour in every picture of every plan. Families share a hue: compute
is blue, collectives warm (orange/red/yellow), views green, opaque model code grey.
"""

from __future__ import annotations

import zlib

__all__ = ["KIND_COLORS", "kind_color", "stream_color", "EVENT_COLOR", "DATA_COLOR", "CARRY_COLOR"]

# kind -> (fill, border)
KIND_COLORS: dict[str, tuple[str, str]] = {
    "gemm": ("#a6cee3", "#1f5f8b"),
    "gemm_chain": ("#7fb0dc", "#16497a"),
    "add": ("#cab2d6", "#6a3d9a"),
    "all_gather": ("#fdbf6f", "#c15d00"),
    "reduce_scatter": ("#fb9a99", "#b2182b"),
    "all_reduce": ("#ffe08a", "#9c7a00"),
    "cat": ("#f4b6d8", "#a1306f"),
    "copy": ("#fddbc7", "#a35a2a"),
    "pad": ("#d9d2f0", "#5e4fa2"),
    "shard": ("#c7eae5", "#35978f"),
    "split": ("#b2df8a", "#33a02c"),
    "slice": ("#d5edc2", "#4d9a3a"),
    "view": ("#e5f5e0", "#5a9a4e"),
    "select": ("#f0f0f0", "#7f7f7f"),
    "extern": ("#d9d9d9", "#525252"),
    # norms and activations (cyan and violet), fp8 quantize, the collectives added with them
    "rmsnorm": ("#9edae5", "#17808f"),
    "add_rmsnorm": ("#61c0cc", "#0b5561"),
    "silu_and_mul": ("#dcc6f5", "#6a3fa0"),
    "gelu_and_mul": ("#b99ae6", "#4b2a80"),
    "mul": ("#f5c1a5", "#9a4a20"),
    "rope": ("#d4e88c", "#667a10"),
    "quantize": ("#a8b6f0", "#2f3f9a"),
    "all_to_all": ("#f7a35c", "#a04a00"),
    "all_reduce_add_rmsnorm": ("#f0c05a", "#8a6300"),
}

# for kinds added later: a stable pick from this list (crc32, not hash(), which is salted)
_SPARE = [("#ccebc5", "#3f8f3f"), ("#ffffb3", "#8c8c00"), ("#bebada", "#55508a"),
          ("#80b1d3", "#2b5d80"), ("#fccde5", "#a0486f"), ("#bc80bd", "#5e2f5f")]

# lane backgrounds (fill, border); main is always the first
_STREAMS = [("#eaf2fb", "#4a78a8"), ("#fdf0e2", "#c0731c"), ("#edf7ea", "#4d8f3f"),
            ("#f4edf8", "#7d4f9a"), ("#fbeaea", "#a33c3c"), ("#eef6f6", "#3d8585")]

EVENT_COLOR = "#d62728"   # record -> wait edges
DATA_COLOR = "#4d4d4d"    # producer -> consumer edges
CARRY_COLOR = "#7f7f7f"   # edges into the next repetition of a collapsed group


def kind_color(kind: str) -> tuple[str, str]:
    """(fill, border) for an op kind; unknown kinds get a stable spare colour."""
    if kind in KIND_COLORS:
        return KIND_COLORS[kind]
    return _SPARE[zlib.crc32(kind.encode()) % len(_SPARE)]


def stream_color(stream: str, streams: list[str]) -> tuple[str, str]:
    """(background, border) of a stream's lane: by position in the plan's stream list."""
    if stream in streams:
        i = streams.index(stream)
    else:
        i = 1 + zlib.crc32(stream.encode()) % (len(_STREAMS) - 1)
    return _STREAMS[i % len(_STREAMS)]
