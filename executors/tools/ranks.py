"""Run a function on N local ranks (torch.multiprocessing, gloo on CPU, NCCL on GPU).

run_ranks(fn, world_size, *args) starts N spawned processes, initializes a process
group over a free localhost port with a bounded timeout, calls fn(rank, world_size,
*args) on each, and returns the per-rank results in rank order. A rank that raises
is reported with its exception type and message; the rank that failed first (by the
time it raised) is named, and its peers, which would otherwise wait in a collective until
the transport gives up, are stopped after a short grace and reported as stopped because of
it. Ranks that do not finish within `timeout_s` are killed (by pid, only the processes
started here) and reported, so a mismatched collective can never hang the caller.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue as _queue
import re
import signal
import socket
import time
import traceback

import torch.multiprocessing as mp

__all__ = ["run_ranks", "RankFailure", "free_port", "run_groups"]

# what a peer's collective says when another rank went away: a consequence, not a cause
_TRANSPORT = re.compile(r"DistBackendError|DistNetworkError|gloo|nccl|NCCL|[Cc]onnection|closed|reset by peer|"
                        r"[Bb]roken pipe|timed out|[Tt]imeout|doesn't match expected size|Socket|socket")


class RankFailure(RuntimeError):
    """One or more ranks raised or timed out.

    .errors maps rank -> (type name, message); .first is (rank, type name, message) of the rank that
    failed first (by the time it raised); the other ranks' entries say they were stopped because of it.
    """

    def __init__(self, errors: dict[int, tuple[str, str]], results: dict, first: tuple | None = None):
        self.errors, self.results = errors, results
        self.first = first
        lines = [f"rank {r}: {t}: {m}" for r, (t, m) in sorted(errors.items())]
        head = f"rank {first[0]} failed first: {first[1]}: {first[2]}; " if first else ""
        super().__init__(head + "; ".join(lines))


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
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, never swallowed
        q.put((rank, "err", (type(exc).__name__, str(exc), traceback.format_exc(), time.time())))
        return
    try:
        res = fn(rank, world, *args)
        q.put((rank, "ok", res))
    except BaseException as exc:  # noqa: BLE001
        # report before tearing the group down: the peers' transport errors that the teardown causes
        # must arrive later (and carry a later time) than this, the cause
        q.put((rank, "err", (type(exc).__name__, str(exc), traceback.format_exc(), time.time())))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def run_ranks(fn, world_size: int, *args, backend: str = "gloo", timeout_s: float = 120.0,
              coll_timeout_s: float = 30.0, grace_s: float = 3.0) -> list:
    """fn(rank, world, *args) on every rank -> results in rank order, or RankFailure.

    When a rank raises, the others get `grace_s` to finish on their own; then they are killed and
    reported as stopped because of the first failure (not with the transport error it caused).
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, backend, coll_timeout_s, fn, args, q), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results, errors, stamps = {}, {}, {}
    deadline = time.monotonic() + timeout_s
    while len(results) + len(errors) < world_size:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            rank, status, payload = q.get(timeout=min(left, 0.5))
        except _queue.Empty:
            if all(not p.is_alive() for p in procs) and q.empty():
                break
            continue
        if status == "ok":
            results[rank] = payload
        else:
            errors[rank] = (payload[0], payload[1])
            stamps[rank] = payload[3]
            if os.environ.get("PLANNER_DEBUG"):
                print(payload[2])
            deadline = min(deadline, time.monotonic() + grace_s)  # the peers get a grace, not the full timeout
    for r, p in enumerate(procs):
        p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
        killed = p.is_alive()
        if killed:
            p.kill()  # only the processes started here, by their pid
            p.join(5)
        if r not in results and r not in errors:
            if p.exitcode is not None and p.exitcode < 0 and not killed:  # died of a signal by itself
                try:
                    sig = signal.Signals(-p.exitcode).name
                except ValueError:
                    sig = f"signal {-p.exitcode}"
                errors[r] = ("Crashed", f"the process died of {sig} before reporting a result (a native library"
                             " such as gloo, NCCL or CUDA aborted it; its stderr above says why)")
            elif p.exitcode is None or p.exitcode < 0:
                errors[r] = ("Timeout", f"no result within {timeout_s:.0f}s (killed, exit code {p.exitcode})")
            else:
                errors[r] = ("Exited", f"the process exited with code {p.exitcode} before reporting a result")
    if errors:
        first = None
        if stamps:
            fr = min(stamps, key=lambda r: (stamps[r], r))
            first = (fr, *errors[fr])
            for r in range(world_size):
                if r == fr or r in results:
                    continue
                own = errors.get(r)
                if r in stamps and not _TRANSPORT.search(f"{own[0]}: {own[1]}"):
                    continue  # a clear error of its own (e.g. every rank refusing a plan mismatch)
                why = f"stopped because rank {fr} failed first: {first[1]}: {first[2]}"
                if r in stamps:
                    why += f" (its own error, later: {own[0]}: {own[1][:160]})"
                errors[r] = ("Stopped", why)
        raise RankFailure(errors, results, first)
    return [results[r] for r in range(world_size)]


def run_groups(plan_groups: dict[str, int], world: int) -> dict | None:
    """A process group of its own for each plan group over `world` ranks, as an engine binds
    them: size == world, all ranks; a smaller size, rank-contiguous blocks of that size (this
    rank's block); size 1, none. Every rank creates them in the plan's order. None: one rank."""
    if world == 1:
        return None
    import torch.distributed as dist
    out = {}
    for name, size in plan_groups.items():
        if size == world:
            out[name] = dist.new_group(list(range(world)))
        elif size > 1:
            out[name], _ = dist.new_subgroups(group_size=size)
    return out
