"""Process-wide stream pool and per-site events.

One torch.cuda.Stream per (device, name), shared by every executor in the process:
a stream per layer is what cut vLLM-Ascend's throughput from 4.11 to 1.2 (see
reference/peers.md). "main" is never pooled: it is the caller's current stream at
call time, so the executor runs on whatever stream (or graph capture) the caller
is on. Side streams created here are plain (non-default) streams; under graph
capture they join the capture through the fork event the executor records.
On CPU there are no streams: ordering is program order and everything is a no-op.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["side_stream", "pool_size", "MAIN"]

MAIN = "main"
_lock = threading.Lock()
_pool: dict[tuple[int, str], torch.cuda.Stream] = {}


def side_stream(name: str, device: torch.device | str | int | None = None) -> torch.cuda.Stream:
    """The one shared stream called `name` on `device` (created on first use)."""
    if name == MAIN:
        raise ValueError("'main' is the caller's current stream, not a pooled side stream")
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    key = (idx, name)
    s = _pool.get(key)
    if s is None:
        with _lock:
            s = _pool.get(key)
            if s is None:
                s = torch.cuda.Stream(device=idx)
                _pool[key] = s
    return s


def pool_size() -> int:
    """How many side streams exist in this process (tests assert it does not grow per executor)."""
    return len(_pool)
