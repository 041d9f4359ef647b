"""The torch backend: every op kind, on CPU and GPU. The fallback of the registry.

Each factory folds the op's symbolic attributes against params once and returns a
runner that only evaluates what depends on this call's dims. Views stay views
(split/slice/view alias their input, as the plan's TensorSpecs say).
"""

from __future__ import annotations

import torch

from ..dims import dim_fn, shape_fn
from ..dtypes import torch_dtype
from .registry import register

__all__ = ["gemm_torch"]

def _into(out, t):
    """Copy t into the preallocated slot `out` when there is one."""
    if out is None:
        return t
    out.copy_(t)
    return out


# ---------------------------------------------------------------- collectives (through the bound Comm)

@register("all_gather", "torch")
def _all_gather(op, bctx):
    comm, dim = bctx.comm(op.group), op.dim
    return lambda ins, b, out: comm.all_gather(ins[0], dim, out)


def _native_avg(comm) -> bool:
    """NCCL has ReduceOp.AVG; gloo does not (there avg is sum / size, one rounding more)."""
    if comm.pg is None:
        return True
    import torch.distributed as dist
    return str(dist.get_backend(comm.pg)) == "nccl"


def _reducing(comm, red, call):
    """call(reduce) with avg emulated as sum / size where the backend has no AVG (gloo)."""
    if red != "avg" or comm.size == 1 or _native_avg(comm):
        return call(red)
    return call("sum").div_(comm.size)


@register("reduce_scatter", "torch")
def _reduce_scatter(op, bctx):
    comm, dim, red = bctx.comm(op.group), op.dim, op.reduce
    return lambda ins, b, out: _reducing(comm, red, lambda r: comm.reduce_scatter(ins[0], dim, r, out))


@register("all_reduce", "torch")
def _all_reduce(op, bctx):
    comm, red = bctx.comm(op.group), op.reduce
    return lambda ins, b, out: _reducing(comm, red, lambda r: comm.all_reduce(ins[0], r, out))


@register("all_to_all", "torch")
def _all_to_all(op, bctx):
    # equal chunks of `splits` rows per peer: one all_to_all_single, graph-capturable (no host
    # sync on the counts); the counts travel in a second, tiny exchange
    comm = bctx.comm(op.group)

    def exchange(x):
        if comm.size == 1:
            return x.clone()
        import torch.distributed as dist
        x = x.contiguous()
        if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # moved, not added: bytes will do
            return exchange(x.view(torch.uint8)).view(x.dtype)
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x, group=comm.pg)  # gloo and NCCL both have the flat form
        return y

    def run(ins, b, out):
        y = exchange(ins[0])
        if op.counts:
            return [y, exchange(ins[1])]
        return _into(out, y)
    return run


# ---------------------------------------------------------------- compute

def gemm_torch(a, w, out_dtype, out=None):
    """a @ w.T; accumulate in the wider dtype when out_dtype differs from the inputs'."""
    if out_dtype == a.dtype:
        if out is not None and out.is_contiguous():
            return torch.mm(a, w.t(), out=out)
        return _into(out, torch.mm(a, w.t()))
    wide = out_dtype if out_dtype.itemsize > a.dtype.itemsize else a.dtype
    r = torch.mm(a.to(wide), w.to(wide).t()).to(out_dtype)
    return _into(out, r)


@register("gemm", "torch")
def _gemm(op, bctx):
    if op.scaled:
        from .torch_fp8 import make_gemm_fp8
        return make_gemm_fp8(op, [bctx.specs[n] for n in op.inputs()])
    dt = torch_dtype(op.out_dtype or bctx.specs[op.a].dtype)
    return lambda ins, b, out: gemm_torch(ins[0], ins[1], dt, out)


def binary(fn):
    """run(ins, b, out) of a torch elementwise fn(a, b[, out=]) (writes into out when given)."""
    def run(ins, b, out):
        if out is not None:
            return fn(ins[0], ins[1], out=out)
        return fn(ins[0], ins[1])
    return run


@register("add", "torch")
def _add(op, bctx):
    return binary(torch.add)


def _check_result(op, r, want, dt, device, what=""):
    if not isinstance(r, torch.Tensor) or tuple(r.shape) != want or r.dtype != dt:
        got = f"{tuple(r.shape)} {r.dtype}" if isinstance(r, torch.Tensor) else type(r).__name__
        raise RuntimeError(f"extern '{op.fn}' (op '{op.id}') returned {got}{what}; the plan declares {want} {dt}")
    if r.device.type != device.type or (device.index is not None and r.device.index != device.index):
        raise RuntimeError(f"extern '{op.fn}' (op '{op.id}') returned a tensor on {r.device}{what}; the executor"
                           f" runs on {device}")


def _call(op, fn, ins, **kw):
    """The model code's call; what it raises passes through unchanged, with a note naming the op."""
    try:
        return fn(*ins, **kw)
    except Exception as exc:
        if hasattr(exc, "add_note"):  # Python >= 3.11
            exc.add_note(f"raised by extern '{op.fn}' (op '{op.id}')")
        raise


@register("extern", "torch")
def _extern(op, bctx):
    fn = bctx.extern(op.fn)
    results = op.result_specs()
    shapes = [shape_fn(s, bctx.params) for s, _ in results]
    dts = [torch_dtype(d) for _, d in results]
    wants_shape = getattr(fn, "wants_shape", False)
    device = torch.device(bctx.device)
    if op.shapes is None:
        shape, dt = shapes[0], dts[0]

        def run(ins, b, out):
            want = shape(b)
            r = _call(op, fn, ins, out_shape=want, dtype=dt) if wants_shape else _call(op, fn, ins)
            _check_result(op, r, want, dt, device)
            return _into(out, r)
        return run
    n = len(results)

    def run_many(ins, b, out):
        wants = [s(b) for s in shapes]
        r = _call(op, fn, ins, out_shapes=wants, dtypes=dts) if wants_shape else _call(op, fn, ins)
        if not isinstance(r, (tuple, list)) or len(r) != n:
            got = f"{len(r)} results" if isinstance(r, (tuple, list)) else type(r).__name__
            raise RuntimeError(f"extern '{op.fn}' (op '{op.id}') returned {got}; the plan declares {n} results")
        for i, (t, want, dt) in enumerate(zip(r, wants, dts, strict=True)):
            _check_result(op, t, want, dt, device, f" as result {i}")
        return list(r)
    return run_many


# ---------------------------------------------------------------- data movement

@register("split", "torch")
def _split(op, bctx):
    dim = op.dim
    if isinstance(op.sizes, list):
        fns = [dim_fn(s, bctx.params) for s in op.sizes]
        return lambda ins, b, out: list(torch.split(ins[0], [f(b) for f in fns], dim))
    chunk = dim_fn(op.sizes, bctx.params)
    return lambda ins, b, out: list(torch.split(ins[0], chunk(b), dim))


@register("cat", "torch")
def _cat(op, bctx):
    dim = op.dim
    inplace = [x in set(op.inplace) for x in op.xs]
    if not any(inplace):
        def run(ins, b, out):
            if out is not None and out.is_contiguous():
                return torch.cat(ins, dim, out=out)
            return _into(out, torch.cat(ins, dim))
        return run

    def run_packed(ins, b, out):
        # members marked inplace were written straight into their slot of `out` already
        if out is None:
            raise RuntimeError(f"cat '{op.id}' has in-place members but no packed buffer was allocated")
        d = dim % out.dim()
        off = 0
        for t, done in zip(ins, inplace, strict=True):
            n = t.shape[d]
            if not done:
                out.narrow(d, off, n).copy_(t)
            off += n
        if off != out.shape[d]:
            raise RuntimeError(f"cat '{op.id}': members fill {off} of {out.shape[d]} on dim {d}")
        return out
    return run_packed


@register("slice", "torch")
def _slice(op, bctx):
    dim = op.dim
    start = dim_fn(op.start, bctx.params)
    stop = None if op.stop is None else dim_fn(op.stop, bctx.params)

    def run(ins, b, out):
        x = ins[0]
        s = start(b)
        e = x.shape[dim] if stop is None else stop(b)
        return x.narrow(dim, s, e - s)
    return run


@register("pad", "torch")
def _pad(op, bctx):
    dim = op.dim
    mult = dim_fn(op.multiple, bctx.params)

    def run(ins, b, out):
        x = ins[0]
        d = dim % x.dim()
        n, m = x.shape[d], mult(b)
        full = -(-n // m) * m
        shape = list(x.shape)
        shape[d] = full
        y = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
        y.narrow(d, 0, n).copy_(x)
        if full > n:
            y.narrow(d, n, full - n).zero_()
        return y
    return run


@register("shard", "torch")
def _shard(op, bctx):
    # vLLM sp_shard: pad `dim` to a multiple of the group size, keep this rank's chunk
    comm, dim = bctx.comm(op.group), op.dim

    def run(ins, b, out):
        x = ins[0]
        d = dim % x.dim()
        size, rank = comm.size, comm.rank
        n = x.shape[d]
        pad = (-n) % size
        if pad:
            shape = list(x.shape)
            shape[d] = n + pad
            y = x.new_zeros(shape)
            y.narrow(d, 0, n).copy_(x)
            x = y
        chunk = x.shape[d] // size
        r = x.narrow(d, rank * chunk, chunk)
        # the plan declares a shard contiguous (views and contiguous() gates read it so): a chunk of
        # a strided input (a packed collective's piece) or along a later dim is copied
        return _into(out, r if r.is_contiguous() else r.contiguous())
    return run


@register("copy", "torch")
def _copy(op, bctx):
    dt = torch_dtype(op.dtype) if op.dtype else None

    def run(ins, b, out):
        x = ins[0]
        if out is not None:
            return out.copy_(x)
        y = torch.empty(x.shape, dtype=dt or x.dtype, device=x.device)
        return y.copy_(x)
    return run


@register("view", "torch")
def _view(op, bctx):
    shape = shape_fn(op.shape, bctx.params)
    return lambda ins, b, out: ins[0].view(shape(b))
