"""all_reduce_add_rmsnorm: the all-reduce fused with the residual add and RMSNorm.

  torch       the group's all_reduce (NCCL on GPU, gloo on CPU) then the torch add_rmsnorm
              (torch_pointwise): exactly the two ops the planner fused, so CPU runs everything
  flashinfer  FlashInfer's TensorRT-LLM fused kernel (flashinfer.comm.allreduce_fusion, pattern
              kARResidualRMSNorm, one-shot Lamport form over a symmetric-memory workspace) for calls
              within the size limits; larger calls run NCCL's all_reduce then FlashInfer's
              fused_add_rmsnorm. The limit is the tuning file's "fusion" entry for the op
              (planner.tuning: the largest token count and byte size where the fused kernel was
              measured faster), capped by what the workspace holds.

Capability of the fused kernel (build time): CUDA, sm_90+, flashinfer importable, bf16/fp16,
a static hidden size that the kernel's one-shot launch covers (hidden % 8 == 0, at most 1024
threads per block), a group of 2, 4, 8 or 16 ranks all on this host (the workspace is
CUDA IPC / symmetric memory). The one-shot form is always used: every rank reduces every
token and adds its own residual, as the unfused ops do; the two-shot form normalizes each
token on one rank and would need the residual identical on every rank, which a plan cannot
promise. The workspace is made once per (group, dtype, hidden, tokens) at build time on
every rank in the same op order (its creation is a collective) and shared by all the ops.
"""

from __future__ import annotations

import os

import torch

from planner.expr import eval_int
from planner.tuning import fusion_key

from ..dtypes import torch_dtype
from .flashinfer_ops import flashinfer_reason
from .registry import register
from .torch_pointwise import add_rmsnorm_ref

__all__ = ["ar_add_rmsnorm_ref", "fused_kernel_reason", "workspace_tokens", "tuned_allreduce_norm",
           "WORKSPACE_COMM_BYTES", "WORLD_SIZES"]

WORLD_SIZES = (2, 4, 8, 16)            # the kernel's NRanks instantiations
WORKSPACE_COMM_BYTES = 64 << 20       # rows * hidden * elem * world the workspace is sized for, at most
_WORKSPACES: dict = {}


def ar_add_rmsnorm_ref(comm, x, residual, w, eps, inplace):
    """all_reduce(x) over comm, then the torch add_rmsnorm: the unfused semantics. With inplace the
    new residual is written over `residual`; x is never written."""
    s = comm.all_reduce(x, "sum", None)
    normed, new_res = add_rmsnorm_ref(s, residual, w, eps)
    if inplace:
        return [normed, residual.copy_(new_res)]
    return [normed, new_res]


@register("all_reduce_add_rmsnorm", "torch")
def _torch(op, bctx):
    comm, eps, inplace = bctx.comm(op.group), op.eps, op.inplace
    return lambda ins, b, out: ar_add_rmsnorm_ref(comm, ins[0], ins[1], ins[2], eps, inplace)


# ---------------------------------------------------------------- FlashInfer

def _threads_per_block(hidden: int, elem: int) -> int | None:
    """The fused kernel's block size for one token (its launcher's rule), None when it cannot cover one."""
    vec = 16 // elem
    if hidden % vec:
        return None
    tpt = hidden // vec
    cs = 8
    while tpt % cs and cs > 1:
        cs //= 2
    tpb = tpt // cs
    while tpb < 128 and cs >= 2:
        tpb, cs = tpb * 2, cs // 2
    return tpb if tpb <= 1024 else None


def fused_kernel_reason(dtype: str, hidden, world: int, device: str) -> str | None:
    """None when FlashInfer's fused all-reduce + norm kernel can run this op here, else why not."""
    if dtype not in ("bf16", "fp16"):
        return f"needs bf16 or fp16, got {dtype}"
    if not isinstance(hidden, int):
        return f"needs a static hidden size, got {hidden}"
    if _threads_per_block(hidden, 2) is None:
        return f"hidden {hidden} is not a multiple of 8 or too wide for one-shot blocks"
    if world not in WORLD_SIZES:
        return f"group size {world} is not one of {WORLD_SIZES}"
    return flashinfer_reason(device, 90)


def _single_node_reason(comm) -> str | None:
    """None when every rank of the group is on this host (torchrun's LOCAL_WORLD_SIZE blocks)."""
    import torch.distributed as dist
    local = int(os.environ.get("LOCAL_WORLD_SIZE", torch.cuda.device_count()))
    if comm.size > torch.cuda.device_count():
        return f"group of {comm.size} ranks but this host has {torch.cuda.device_count()} GPUs"
    ranks = dist.get_process_group_ranks(comm.pg)
    me = dist.get_rank() // max(local, 1)
    if any(r // max(local, 1) != me for r in ranks):
        return f"group spans hosts (ranks {ranks}, {local} per host)"
    return None


def workspace_tokens(hidden: int, world: int, elem: int, dim_max: int) -> int:
    """Rows the workspace is made for: the plan's largest row count, capped by WORKSPACE_COMM_BYTES."""
    return max(1, min(dim_max, WORKSPACE_COMM_BYTES // (hidden * elem * world)))


def _workspace(comm, tokens: int, hidden: int, dt):
    key = (id(comm.pg), comm.size, comm.rank, tokens, hidden, dt)
    ws = _WORKSPACES.get(key)
    if ws is None:
        from flashinfer.comm import create_allreduce_fusion_workspace
        ws = create_allreduce_fusion_workspace(backend="trtllm", world_size=comm.size, rank=comm.rank,
                                               max_token_num=tokens, hidden_dim=hidden, dtype=dt,
                                               group=comm.pg)
        _WORKSPACES[key] = ws
    return ws


def _rows_bound(spec, bctx) -> int:
    upper = {**bctx.params, **{k: d.hi for k, d in bctx.dims.items()}}
    n = 1
    for d in spec.shape[:-1]:
        n *= int(eval_int(d, upper))
    return n


def make_flashinfer(op, bctx, max_tokens: int | None = None, max_bytes: int | None = None):
    """The flashinfer runner: the fused kernel for calls of at most max_tokens rows and max_bytes of x
    (None: up to the workspace), NCCL + FlashInfer fused_add_rmsnorm above. run.fused_reason says
    why the fused kernel is never taken (None when it is, within the limits)."""
    from flashinfer.norm import fused_add_rmsnorm
    comm, eps, inplace = bctx.comm(op.group), op.eps, op.inplace
    spec = bctx.specs[op.x]
    hidden, dt = spec.shape[-1], torch_dtype(spec.dtype)
    reason = fused_kernel_reason(spec.dtype, hidden, comm.size, "cuda") or _single_node_reason(comm)
    explicit = op.backend == "flashinfer"
    if reason and explicit and max_tokens is None:
        raise RuntimeError(f"op '{op.id}': backend flashinfer cannot run the fused all-reduce kernel: {reason}")
    limit_t = limit_b = 0
    ws = None
    if reason is None:
        elem = dt.itemsize
        ws_tokens = workspace_tokens(hidden, comm.size, elem, _rows_bound(spec, bctx))
        limit_t = ws_tokens if max_tokens is None else min(max_tokens, ws_tokens)
        limit_b = limit_t * hidden * elem if max_bytes is None else min(max_bytes, limit_t * hidden * elem)
        if limit_t > 0:
            ws = _workspace(comm, ws_tokens, hidden, dt)
        else:
            reason = "the tuned limit is 0 tokens (the fused kernel never won)"

    def unfused(x, res, w):  # NCCL, then FlashInfer's in-place fused_add_rmsnorm on the sum
        if not (x.is_contiguous() and res.is_contiguous()):
            return ar_add_rmsnorm_ref(comm, x, res, w, eps, inplace)
        s = comm.all_reduce(x, "sum", None)
        s = s.clone() if s is x else s
        r = res if inplace else res.clone()
        fused_add_rmsnorm(s.view(-1, hidden), r.view(-1, hidden), w, eps)
        return [s, r]

    def run(ins, b, out):
        x, res, w = ins
        rows = x.numel() // hidden if x.dim() else 0
        if (ws is None or rows == 0 or rows > limit_t or x.numel() * x.element_size() > limit_b
                or not (x.is_contiguous() and res.is_contiguous())):
            return unfused(x, res, w)
        from flashinfer.comm import AllReduceFusionPattern, allreduce_fusion
        x2 = x.view(rows, hidden)
        res_out = res if inplace else torch.empty_like(res)
        normed = torch.empty_like(x)
        allreduce_fusion(input=x2, workspace=ws, pattern=AllReduceFusionPattern.kARResidualRMSNorm,
                         launch_with_pdl=False, residual_out=res_out.view(rows, hidden),
                         norm_out=normed.view(rows, hidden), residual_in=res.view(rows, hidden), rms_gamma=w,
                         rms_eps=eps, use_oneshot=True, fp32_acc=True)
        return [normed, res_out]
    run.fused_reason = reason
    run.limits = (limit_t, limit_b)
    return run


def _fi_supports(op, specs, device):
    x = specs[0]
    if x.dtype not in ("bf16", "fp16"):
        return f"needs bf16 or fp16, got {x.dtype}"
    return flashinfer_reason(device, 90)


register("all_reduce_add_rmsnorm", "flashinfer", supports=_fi_supports)(make_flashinfer)


def tuned_allreduce_norm(op, bctx, tuning: dict):
    """(runner, backend label) for an all_reduce_add_rmsnorm (backend auto) whose dtype, hidden and
    group size have an entry in the tuning's "fusion" (planner.tuning.fusion_key): the flashinfer
    runner with those limits; None without an entry or where flashinfer cannot run. Every rank
    lowers with the same tuning: the first such op makes the workspace, a collective."""
    fusion = tuning.get("fusion") or {}
    if not fusion or op.backend != "auto" or bctx.device.type != "cuda":
        return None  # an explicitly named backend wins over tuning
    spec = bctx.specs[op.x]
    entry = fusion.get(fusion_key(spec.dtype, spec.shape[-1], bctx.comm(op.group).size))
    if entry is None or _fi_supports(op, [spec], "cuda") is not None:
        return None
    run = make_flashinfer(op, bctx, entry["max_tokens"], entry.get("max_bytes"))
    return run, ("flashinfer" if run.fused_reason is None else "flashinfer:unfused")
