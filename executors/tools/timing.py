"""Timing, in one place: CUDA-event timing of CUDA-graph replays with rotated weight sets, eager
wall clock (the CPU dry runs), and the bandwidth floors (HBM read/copy, a peer copy).

tune, bench and the scripts in scripts/ time through these functions:
  capture_steps    one graph of `iters` steps f(i), step i using weight set i % nsets (L2 does not flatter)
  replay_times     median us per step of captured graphs, trials in shuffled or alternating order
  time_graphs      capture + replay_times for {name: f(i)}; eager wall clock without a GPU
  time_graphs_dist the same for paths with collectives: barriers, a device-side rendezvous, max over ranks
  eager_times      median wall-clock us per step of eager calls (eager_times_dist: max over ranks)
  call_times       median us of single calls fn(): CUDA events behind a spin kernel, or wall clock
  host_times       median us the host spends issuing single calls fn()
  median_event_us  median CUDA-event time of one call
  hbm_bandwidth, peer_bandwidth   the floors the benches compare against
"""

from __future__ import annotations

import random
import statistics
import time

__all__ = ["capture_steps", "replay_times", "time_graphs", "time_graphs_dist", "eager_times", "eager_times_dist",
           "call_times", "host_times", "median_event_us", "hbm_bandwidth", "peer_bandwidth"]


def eager_times(fns: dict, iters: int, trials: int, sync=None) -> dict:
    """Median wall-clock us per step of eager calls f(i), one warm-up call each; `sync`
    (e.g. a barrier) runs before every trial."""
    res = {}
    for name, f in fns.items():
        f(0)
        ts = []
        for _ in range(trials):
            if sync is not None:
                sync()
            t0 = time.perf_counter()
            for i in range(iters):
                f(i)
            ts.append((time.perf_counter() - t0) / iters * 1e6)
        res[name] = statistics.median(ts)
    return res


def _max_over_ranks(names, values, device=None) -> dict:
    import torch
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(list(names), t.tolist(), strict=True))


def eager_times_dist(fns: dict, iters: int, trials: int) -> dict:
    """eager_times with a barrier before each trial, max over ranks."""
    import torch.distributed as dist
    res = eager_times(fns, iters, trials, sync=dist.barrier)
    return _max_over_ranks(fns, [res[n] for n in fns])


def capture_steps(f, iters: int, warmup: int, nsets: int, sync=None):
    """One CUDA graph of `iters` steps f(i) (step i uses weight set i % nsets), captured on a side
    stream after `warmup` rounds over every set; `sync` (e.g. a barrier) runs just before capture."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            for i in range(nsets):
                f(i)
    torch.cuda.synchronize()
    if sync is not None:
        sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(iters):
            f(i)
    torch.cuda.synchronize()
    return g


def replay_times(graphs: dict, trials: int, steps: int = 1, replays: int = 1, warm: int = 0,
                 order: str = "shuffle", before=None) -> dict:
    """Median us per step of each captured graph ({name: graph} of `steps` steps each): every
    trial times `replays` back-to-back replays of each graph between two CUDA events, after `warm`
    untimed replays. order: "shuffle" (a new seeded random order per trial, so no graph always
    follows the same neighbour) or "alternate" (forward, then reversed). before(): runs just
    before each start event (e.g. a rendezvous of the ranks)."""
    import torch
    times = {n: [] for n in graphs}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    names, rng = list(graphs), random.Random(0)
    for t in range(trials):
        if order == "shuffle":
            rng.shuffle(names)
        else:
            names = list(graphs) if t % 2 == 0 else list(reversed(graphs))
        for n in names:
            for _ in range(warm):
                graphs[n].replay()
            if before is not None:
                before()
            e0.record()
            for _ in range(replays):
                graphs[n].replay()
            e1.record()
            e1.synchronize()
            times[n].append(e0.elapsed_time(e1) * 1000.0 / (steps * replays))
    return {n: statistics.median(v) for n, v in times.items()}


def time_graphs(fns: dict, iters: int = 20, trials: int = 5, warmup: int = 2, nsets: int = 4,
                order: str = "shuffle", instances: int = 1) -> dict:
    """fns: {name: f(i)} where step i uses weight set i % nsets. One graph of `iters` steps per
    name (capture_steps), two untimed replays, then replay_times: median us/step. instances > 1
    captures each name that many times (all instances timed in the one shuffled loop) and takes
    the fastest instance's median: two captures of the same work can differ by a few percent (where
    their memory lands), which would otherwise decide close comparisons. Without a GPU: eager wall
    clock (eager_times), same interface."""
    import torch
    if instances < 1:
        raise ValueError(f"time_graphs: instances must be >= 1, got {instances}")
    if not torch.cuda.is_available():
        return eager_times(fns, iters, trials)
    graphs = {}
    for j in range(instances):
        for name, f in fns.items():
            g = capture_steps(f, iters, warmup, nsets)
            g.replay()
            g.replay()
            graphs[(name, j)] = g
    torch.cuda.synchronize()
    res = replay_times(graphs, trials, steps=iters, order=order)
    del graphs
    return {n: min(res[(n, j)] for j in range(instances)) for n in fns}


def time_graphs_dist(fns: dict, iters=20, trials=5, warmup=2, nsets=2) -> dict:
    """As time_graphs, for paths with collectives: every rank captures the same graphs in the
    same order, a barrier precedes every trial, and the result is the max over ranks of each
    rank's median (all ranks get the same numbers). The start event is queued right behind a
    one-element NCCL all_reduce, so every rank's timed replay starts when the slowest rank's
    GPU arrives: host-side launch skew between ranks (tens of us, which over a 20-step graph
    of a 10-20 us collective is 5-10% noise) stays out of the measurement."""
    import torch
    import torch.distributed as dist
    graphs = {}
    for name, f in fns.items():
        g = capture_steps(f, iters, warmup, nsets, sync=dist.barrier)
        g.replay()
        torch.cuda.synchronize()
        graphs[name] = g
    token = torch.zeros(1, device="cuda")

    def rendezvous():
        dist.barrier()
        torch.cuda.synchronize()
        dist.all_reduce(token)  # device-side rendezvous just before the start event

    res = replay_times(graphs, trials, steps=iters, order="alternate", before=rendezvous)
    del graphs
    out = _max_over_ranks(fns, [res[n] for n in fns], device="cuda")
    torch.cuda.synchronize()
    return out


def call_times(fns: dict, trials: int, cuda: bool, spin_cycles: int = 200_000) -> dict:
    """{name: median us of one call fn()}, the names in a new seeded random order per trial. On
    the GPU: CUDA events around the call with a spin kernel of `spin_cycles` queued ahead of it,
    so the host's launch cost shows only where it exceeds the spin (about 0.1 ms at the default;
    a spin longer than any path's host cost times the GPU's work alone); else wall clock."""
    import torch
    times = {n: [] for n in fns}
    for n in _rounds(fns, trials, 0):
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(spin_cycles)
            e0.record()
            fns[n]()
            e1.record()
            e1.synchronize()
            times[n].append(e0.elapsed_time(e1) * 1000.0)
        else:
            t0 = time.perf_counter()
            fns[n]()
            times[n].append((time.perf_counter() - t0) * 1e6)
    return {n: statistics.median(v) for n, v in times.items()}


def _rounds(fns: dict, trials: int, seed: int):
    """The names of fns, `trials` times over, in a new seeded random order each round."""
    order, rng = list(fns), random.Random(seed)
    for _ in range(trials):
        rng.shuffle(order)
        yield from order


def host_times(fns: dict, trials: int, cuda: bool) -> dict:
    """{name: median us the host spends issuing one call fn()} (from an idle device: synchronized
    before, the clock stopped when fn returns, before the device finishes)."""
    import torch
    times = {n: [] for n in fns}
    for n in _rounds(fns, trials, 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fns[n]()
        times[n].append((time.perf_counter() - t0) * 1e6)
        if cuda:
            torch.cuda.synchronize()
    return {n: statistics.median(v) for n, v in times.items()}


def median_event_us(fn, reps: int = 7) -> float:
    """Median CUDA-event us of fn() over `reps` calls, after one warm-up call."""
    import torch
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(ts)


def hbm_bandwidth(nbytes: int = 2 << 30, rounds: int = 3) -> dict:
    """Read bandwidth (TB/s) by a 2 GiB sum, and copy bandwidth (read+write) by a 2 GiB copy:
    the best of `rounds` medians of 7, after a warm-up (one median alone can read 5-7 % low,
    which makes the floor too lenient)."""
    import torch
    big = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16).uniform_()
    for _ in range(3):
        torch.sum(big, dtype=torch.float32)
    t = min(median_event_us(lambda: torch.sum(big, dtype=torch.float32)) for _ in range(rounds))
    res = {"sum_read_TBps": nbytes / t / 1e6}
    dst = torch.empty_like(big)
    t = min(median_event_us(lambda: dst.copy_(big)) for _ in range(rounds))
    res["copy_rw_TBps"] = 2 * nbytes / t / 1e6
    big = dst = None
    torch.cuda.empty_cache()
    return res


def peer_bandwidth(src: int = 0, dst: int = 1, nbytes: int = 117 << 20) -> dict:
    """GB/s of a plain device-to-device copy GPU src -> GPU dst (the NVLink floor's rate)."""
    import torch
    a = torch.empty(nbytes // 2, device=f"cuda:{src}", dtype=torch.bfloat16).uniform_()
    b = torch.empty(nbytes // 2, device=f"cuda:{dst}", dtype=torch.bfloat16)
    with torch.cuda.device(src):
        t = median_event_us(lambda: b.copy_(a, non_blocking=True))
    res = {"bytes": nbytes, "us": t, "GBps": nbytes / t / 1e3,
           "peer_access": bool(torch.cuda.can_device_access_peer(src, dst))}
    a = b = None
    torch.cuda.empty_cache()
    return res
