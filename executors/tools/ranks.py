"""Run a function on N local ranks (torch.multiprocessing, gloo on CPU, NCCL on GPU).

run_ranks(fn, world_size, *args) starts N spawned processes, initializes a process
group over a free localhost port with a bounded timeout, calls fn(rank, world_size,
*args) on each, and returns the per-rank results in rank order. A rank that raises
is reported with its exception type and message; ranks that do not finish within
`timeout_s` are killed (by pid, only the processes started here) and reported, so a
mismatched collective can never hang the caller.
"""

from __future__ import annotations

import datetime
import os
import queue as _queue
import socket
import time
import traceback

import torch.multiprocessing as mp

__all__ = ["run_ranks", "RankFailure", "free_port"]


class RankFailure(RuntimeError):
    """One or more ranks raised or timed out; .errors maps rank -> (type name, message)."""

    def __init__(self, errors: dict[int, tuple[str, str]], results: dict):
        self.errors, self.results = errors, results
        lines = [f"rank {r}: {t}: {m}" for r, (t, m) in sorted(errors.items())]
        super().__init__("; ".join(lines))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, backend, coll_timeout_s, fn, args, q):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)  # N ranks share a few cores
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=coll_timeout_s))
        try:
            res = fn(rank, world, *args)
            q.put((rank, "ok", res))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, never swallowed
        q.put((rank, "err", (type(exc).__name__, str(exc), traceback.format_exc())))


def run_ranks(fn, world_size: int, *args, backend: str = "gloo", timeout_s: float = 120.0,
              coll_timeout_s: float = 30.0) -> list:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, backend, coll_timeout_s, fn, args, q), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results, errors = {}, {}
    deadline = time.monotonic() + timeout_s
    while len(results) + len(errors) < world_size:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            rank, status, payload = q.get(timeout=min(left, 1.0))
        except _queue.Empty:
            if all(not p.is_alive() for p in procs) and q.empty():
                break
            continue
        if status == "ok":
            results[rank] = payload
        else:
            errors[rank] = (payload[0], payload[1])
            if os.environ.get("PLANNER_DEBUG"):
                print(payload[2])
    for r, p in enumerate(procs):
        p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        if p.is_alive():
            p.kill()
            p.join(5)
        if r not in results and r not in errors:
            errors[r] = ("Timeout" if p.exitcode is None or p.exitcode < 0 else "Exited",
                         f"no result within {timeout_s:.0f}s (exit code {p.exitcode})")
    if errors:
        raise RankFailure(errors, results)
    return [results[r] for r in range(world_size)]
