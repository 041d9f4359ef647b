"""The "p2p" all_gather backend: pushes over NVLink into symmetric-memory output buffers.

NCCL's ring all-gather moves 117 MB per rank at TP2 in ~550 us on an H200 pair, 1.7x the
time of a plain peer copy (results/sp_gather_tp2.md). Within one host every GPU can map its
peers' memory, so the gather can be done the way a peer copy is: each rank pushes its
shard straight into slot `rank` of every peer's output buffer (cudaMemcpyAsync, i.e. a
copy engine, for large shards; an SM kernel for small ones), copies it into its own slot
at the same time, and a barrier on each side fences the call:

    barrier (channel 0)   every peer has finished with its previous output
    push x -> peer[p][rank] on one side stream per peer; own slot on the caller's stream
    join, barrier (channel 1)   every shard has landed in every output

The output buffer is allocated once per op with torch's symmetric memory (sized for the
largest dims the plan allows) and rendezvoused at build time, in schedule order, on every
rank. Its rows are a view of that persistent buffer, exactly like the static outputs of
a CUDA graph: valid until the next call. That is why the push path is only taken while a
CUDA graph is being captured (the mode the executor is built for); eager calls use NCCL
and return fresh tensors. Every rank captures the same graphs (SPMD), so all ranks take
the same path. Both paths give bit-identical results (pure data movement).

Capability (build time): CUDA, a size > 1 NCCL group whose ranks are GPUs of this host
that can all reach each other peer to peer, a gather along dim 0 with a static byte
size per row, torch symmetric memory importable; PLANNER_P2P=0 turns the backend off.
Placement (build time, with the bound process group): every rank of the group on one
host. Hosts come from the group's global ranks and the ranks per host, LOCAL_WORLD_SIZE
as torchrun sets it (ranks are numbered host by host), else this host's GPU count. A
group that spans hosts is refused with the reason, so `auto` falls back to NCCL and an
explicit `backend=p2p` is a BuildError naming the op and the hosts.
Barriers time out (PLANNER_P2P_TIMEOUT_MS, default 60 s) instead of hanging.
"""

from __future__ import annotations

import os

import torch

from ..dims import shape_fn
from ..dtypes import torch_dtype
from ..errors import BuildError
from .registry import register

__all__ = ["P2PGather", "p2p_supports", "p2p_placement", "hosts_of", "ranks_per_host"]

_TIMEOUT_MS = int(os.environ.get("PLANNER_P2P_TIMEOUT_MS", "60000"))
# Measured on an H200 pair, 2026-11-30 (results/sp_gather_tp2.md, decision log), SP
# tail gather per forward incl. the packing cat, us (NCCL / p2p copy-engine / p2p SM copies):
#   T=8 (0.2 MB/shard) 9.7 / 17.8 / 9.6    T=128 (3.7 MB) 35.9 / 28.9 / 21.2
#   T=1024 (29 MB) 155.2 / 114.9 / 114.0   T=4096 (117 MB) 542.7 / 383.9 / 436.7
# so p2p everywhere (MIN_BYTES: shards below it use NCCL), SM copies below SM_BYTES (the copy
# engines' start-up cost dominates small copies), copy engines above (they reach the link rate).
MIN_BYTES = int(os.environ.get("PLANNER_P2P_MIN_BYTES", "0"))
SM_BYTES = int(os.environ.get("PLANNER_P2P_SM_BYTES", str(16 << 20)))


def _copy(dst: torch.Tensor, src: torch.Tensor, sm: bool) -> None:
    """dst <- src (flat uint8 views). copy_ of contiguous tensors is a cudaMemcpyAsync (copy
    engine); an integer identity (x | 0) is the same bytes written by an SM kernel."""
    if not sm:
        dst.copy_(src)
        return
    w = torch.int32 if dst.numel() % 4 == 0 and dst.data_ptr() % 4 == 0 and src.data_ptr() % 4 == 0 else torch.uint8
    torch.bitwise_or(src.view(w), 0, out=dst.view(w))


def _symm():
    import torch.distributed._symmetric_memory as symm
    return symm


class P2PGather:
    """Dim-0 all-gather of contiguous tensors through a symmetric output buffer."""

    def __init__(self, comm, capacity: int, device: torch.device):
        symm = _symm()
        self.comm, self.capacity, self.device = comm, int(capacity), device
        self.rank, self.world = comm.rank, comm.size
        with torch.cuda.device(device):
            self.buf = symm.empty(self.capacity, dtype=torch.uint8, device=device)
            self.hdl = symm.rendezvous(self.buf, comm.pg)  # collective: every rank, same order
            self.peers = {p: self.hdl.get_buffer(p, (self.capacity,), torch.uint8)
                          for p in range(self.world) if p != self.rank}
            self.side = {p: torch.cuda.Stream(device) for p in self.peers}

    def fits(self, x: torch.Tensor) -> bool:
        n = x.numel() * x.element_size()
        return x.is_contiguous() and x.dim() >= 1 and MIN_BYTES <= n and n * self.world <= self.capacity

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel() * x.element_size()
        r, w = self.rank, self.world
        src = x.reshape(-1).view(torch.uint8)
        cur = torch.cuda.current_stream(self.device)
        sm = n < SM_BYTES
        self.hdl.barrier(channel=0, timeout_ms=_TIMEOUT_MS)
        for p, s in self.side.items():
            s.wait_stream(cur)
            with torch.cuda.stream(s):
                _copy(self.peers[p][r * n:(r + 1) * n], src, sm)
        own = self.buf[r * n:(r + 1) * n]
        if own.data_ptr() != src.data_ptr():
            _copy(own, src, sm)
        for s in self.side.values():
            cur.wait_stream(s)
        self.hdl.barrier(channel=1, timeout_ms=_TIMEOUT_MS)
        return self.buf[:w * n].view(x.dtype).view((w * x.shape[0],) + tuple(x.shape[1:]))


def _peer_reachable(world: int) -> str | None:
    n = torch.cuda.device_count()
    if n < world:
        return f"{world} ranks but {n} GPUs on this host (ranks on other hosts cannot be mapped)"
    for a in range(world):
        for b in range(world):
            if a != b and not torch.cuda.can_device_access_peer(a, b):
                return f"GPU {a} cannot access GPU {b} peer to peer"
    return None


def ranks_per_host() -> int:
    """Ranks on each host: torchrun's LOCAL_WORLD_SIZE, else (one rank per GPU) this host's GPU count."""
    env = os.environ.get("LOCAL_WORLD_SIZE")
    if env:
        return max(1, int(env))
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return max(1, n)


def hosts_of(global_ranks: list[int], per_host: int) -> list[int]:
    """The host index of each global rank (torchrun numbers ranks host by host)."""
    return [r // per_host for r in global_ranks]


def p2p_placement(op, comm):
    """None when every rank of the op's process group is on this host, else why not. Without
    GPUs and without torchrun's LOCAL_WORLD_SIZE the hosts are not known: no reason (the
    device check refuses a CPU run)."""
    if comm.pg is None or comm.size == 1:
        return None
    if not os.environ.get("LOCAL_WORLD_SIZE") and not torch.cuda.is_available():
        return None
    import torch.distributed as dist
    ranks = dist.get_process_group_ranks(comm.pg)
    per_host = ranks_per_host()
    hosts = hosts_of(ranks, per_host)
    if len(set(hosts)) > 1:
        spread = ", ".join(f"host {h}: ranks {[r for r, x in zip(ranks, hosts, strict=True) if x == h]}"
                           for h in sorted(set(hosts)))
        return (f"group '{op.group}' spans {len(set(hosts))} hosts ({spread}; {per_host} ranks per host);"
                " peers on other hosts cannot be mapped, use NCCL")
    return None


def p2p_supports(op, specs, device):
    if os.environ.get("PLANNER_P2P", "1") == "0":
        return "turned off by PLANNER_P2P=0"
    if device != "cuda":
        return "needs CUDA"
    if len(specs) != 1 or not specs[0].shape or op.dim % len(specs[0].shape) != 0:
        return "gathers along dim 0 only"
    if any(not isinstance(d, int) for d in specs[0].shape[1:]):
        return "row size must be static"
    try:
        _symm()
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot"
        return f"torch symmetric memory unavailable ({type(exc).__name__})"
    return None


def _max_shape(spec, bctx):
    """The op input's shape at the largest dims the plan allows (symbolic shapes grow with dims)."""
    return shape_fn(spec.shape, bctx.params)({k: d.hi for k, d in bctx.dims.items()})


@register("all_gather", "p2p", supports=p2p_supports, placement=p2p_placement)
def _p2p_all_gather(op, bctx):
    comm = bctx.comm(op.group)
    why = p2p_placement(op, comm)
    if why is not None:  # lookup asks first; this guards a factory reached any other way
        raise BuildError(f"op '{op.id}': backend p2p cannot run: {why}")
    if comm.size == 1:
        return lambda ins, b, out: ins[0] if out is None else out.copy_(ins[0])
    spec = bctx.specs[op.inputs()[0]]
    nbytes = torch_dtype(spec.dtype).itemsize
    for d in _max_shape(spec, bctx):
        nbytes *= int(d)
    why = _peer_reachable(comm.size)
    if why is not None:  # every rank of one host sees the same topology, so all agree
        raise BuildError(f"op '{op.id}': backend p2p cannot run: {why} (set PLANNER_P2P=0)")
    try:
        g = P2PGather(comm, max(nbytes, 16) * comm.size, bctx.device)
    except Exception as exc:  # noqa: BLE001 - name the op and the way out
        raise BuildError(f"op '{op.id}': symmetric-memory buffer for the p2p all_gather failed: "
                         f"{type(exc).__name__}: {exc} (set PLANNER_P2P=0 to use NCCL)") from exc

    def run(ins, b, out):
        x = ins[0]
        if torch.cuda.is_current_stream_capturing() and g.fits(x):
            y = g(x)
            return y if out is None else out.copy_(y)
        return comm.all_gather(x, 0, out)
    return run
