"""Cost model: per-op time estimates from FLOPs and bytes against a device profile.

Defaults are an H200 as measured in shared/reference/kimi-k3.md (HBM read 4.23 TB/s,
bf16 matmul ~790 TFLOP/s, NCCL all-gather over NVLink ~10 us latency and ~220 GB/s
effective per rank; the p2p all-gather ~7 us and ~350 GB/s). A tuning file's measured times override the model per
(op signature, dim bucket).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .errors import Loc, PlanError, read_json
from .expr import eval_int
from .ops import COLLECTIVES, VIEW_OPS
from .shapes import DTYPES, FP8_DTYPES

__all__ = ["DeviceProfile", "CostModel", "op_signature", "gemm_signatures", "split_signature", "signature_key",
           "TUNABLE_KINDS", "default_strided_write_factor", "gather_takes_p2p"]

# memory-bound ops: (tensor-sized passes over the output relative to reading the inputs once);
# the time is kernel_us + bytes read and written / HBM bandwidth
POINTWISE = {"rmsnorm", "add_rmsnorm", "silu_and_mul", "gelu_and_mul", "mul", "rope", "quantize"}
# op kinds `planner tune` times per signature (besides plain bf16 gemms)
TUNABLE_KINDS = POINTWISE - {"mul"}


# profile fields that may be 0 (a latency, an off switch); the rest are rates and must be > 0
_MAY_BE_ZERO = {"kernel_us", "gemm_fixed_us", "coll_latency_us", "p2p_latency_us", "p2p_gbps", "p2p_min_bytes",
                "event_us"}


@dataclass
class DeviceProfile:
    name: str = "H200 (defaults)"
    bf16_tflops: float = 790.0       # dense bf16 matmul on random data
    fp8_tflops: float = 1580.0       # dense fp8 matmul (twice bf16 on Hopper tensor cores)
    hbm_gbps: float = 4230.0         # streaming read bandwidth
    kernel_us: float = 1.0           # fixed cost of one small kernel in a graph (launch gap)
    gemm_fixed_us: float = 2.5       # extra fixed cost of a GEMM (tail, tiles not filling the GPU)
    coll_latency_us: float = 10.0    # one NCCL collective, small message
    coll_gbps: float = 220.0         # received bytes per second per rank (NVLink, NCCL)
    # all_gather by copy-engine pushes into symmetric memory (executors/p2p.py, taken for
    # shards >= p2p_min_bytes inside CUDA graphs); 0 GB/s = not available
    p2p_latency_us: float = 7.0      # two barriers + the copies' start
    p2p_gbps: float = 350.0          # received bytes per second per rank (H200 pair, 2026-11-30)
    p2p_min_bytes: int = 0
    # one cross-stream record+wait pair: under CUDA-graph replay an edge between streams costs what
    # one on a stream does (-0.007 us, results/data/event_cost/2026-12-01T1837_*); a quarter
    # microsecond keeps near-ties on one stream
    event_us: float = 0.25
    # cost of an elementwise write into a row-strided slot of a packed buffer, relative to a
    # contiguous one: 1.05 with the CuTe strided add (executors/cute/elementwise.py), 1.83 with
    # torch's elementwise kernels (results/zero_copy_packing.md)
    strided_write_factor: float = field(default_factory=lambda: default_strided_write_factor())
    measured: dict = field(default_factory=dict)  # op signature -> {bucket: us}

    @classmethod
    def load(cls, path: str | None, overrides: dict | None = None) -> DeviceProfile:
        data: dict = {}
        loc = Loc(str(path)) if path else None
        if path:
            data = read_json(path, "device profile")
            if not isinstance(data, dict):
                raise PlanError.at(loc, "schema", f"device profile {path} must be a JSON object")
        data.update(overrides or {})
        known = {f.name for f in fields(cls)}
        bad = [k for k in data if k not in known]
        if bad:
            raise PlanError.at(loc, "schema", f"device profile has unknown field '{bad[0]}' (known: {', '.join(sorted(known))})")
        where = f"device profile {path}" if path else "device profile"
        for k, v in data.items():
            if k == "name":
                if not isinstance(v, str):
                    raise PlanError.at(loc, "schema", f"{where}: 'name' must be a string, got {v!r}")
                continue
            if k == "measured":
                raise PlanError.at(loc, "schema", f"{where}: measured times come from a tuning file (--tuning)")
            low = 0 if k in _MAY_BE_ZERO else None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (
                    v < 0 if low == 0 else v <= 0):
                want = "a finite number >= 0" if low == 0 else "a finite number > 0"
                raise PlanError.at(loc, "schema", f"{where}: '{k}' must be {want}, got {v!r}")
        if path and "name" not in data and any(k != "name" for k in data):
            # what the report names: the defaults with this file's fields
            data["name"] = f"H200 defaults with {', '.join(sorted(data))} from {Path(path).name}"
        return cls(**data)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("measured")
        return d


def default_strided_write_factor() -> float:
    """1.05 where the CuTe strided add can run (cutlass installed), else torch's 1.83."""
    import importlib.util
    try:
        has_cutlass = importlib.util.find_spec("cutlass") is not None
    except (ImportError, ValueError):
        has_cutlass = False
    return 1.05 if has_cutlass else 1.83


def gather_takes_p2p(op, x) -> bool:
    """Whether all_gather `op` of input spec `x` can run on the p2p gather (executors/backends/p2p.py):
    not with backend=torch, and only along dim 0 with a static row size, the rows it pushes whole
    (what p2p_supports checks of the op; whether the path exists at all, CUDA on one host, is the
    profile's p2p_gbps, 0 for none). The others run on NCCL."""
    return (op.op == "all_gather" and op.backend != "torch" and x.rank > 0 and op.dim % x.rank == 0
            and all(isinstance(d, int) for d in x.shape[1:]))


def op_signature(op, specs_in, bindings, specs_out=None) -> str:
    """A key that identifies an op's work at given dims, used by tuning files.

    The one format: KIND:DTYPE:M=<rows>,<rest>, where M is the row count of the first input
    (the token dim a tuning file is keyed by) and <rest> names everything else about the work:
      gemm:bf16:M=16,N=2112,K=7168
      gemm:fp8_e4m3:M=16,N=2112,K=7168,sa=block,sb=block,out=bf16      (scaled fp8)
      rmsnorm:bf16:M=16,N=7168                silu_and_mul:bf16:M=16,N=2304 (input width)
      add_rmsnorm:bf16:M=16,N=7168,inplace=1  quantize:bf16:M=16,N=7168,to=fp8_e4m3,g=128
      rope:bf16:M=16,q=16x64,k=1x64,il=1      (heads x rotary dim; il = interleaved)
      extern:rmsnorm:M=16,bf16[16x1536],bf16[1536]->bf16[16x1536]   (model code: its function
                                              name, inputs and results; `planner tune --externs`)
    Other kinds: KIND:dtype[dims],dtype[dims] of their inputs."""
    dims = lambda s: "x".join(str(eval_int(d, bindings)) for d in s.shape)  # noqa: E731
    k = op.op
    first = specs_in[0] if specs_in else None
    m = eval_int(first.shape[0], bindings) if first is not None and first.rank else 0
    width = lambda s: _prod(eval_int(d, bindings) for d in s.shape[1:])  # noqa: E731
    if k == "gemm":
        a, b = specs_in[:2]
        sig = f"gemm:{a.dtype}:M={m},N={eval_int(b.shape[0], bindings)},K={eval_int(b.shape[1], bindings)}"
        if getattr(op, "scaled", False):
            from .ops_fp8 import pair_kinds
            sa, sb = pair_kinds(a.shape, b.shape, specs_in[2].shape, specs_in[3].shape)
            sig += f",sa={sa},sb={sb},out={op.out_dtype or 'bf16'}"
        return sig
    if k in ("rmsnorm", "silu_and_mul", "gelu_and_mul", "mul"):
        extra = ",tanh=1" if getattr(op, "approximate", "none") == "tanh" else ""
        return f"{k}:{first.dtype}:M={m},N={width(first)}{extra}"
    if k == "add_rmsnorm":
        return f"{k}:{first.dtype}:M={m},N={width(first)},inplace={int(op.inplace)}"
    if k == "quantize":
        return f"{k}:{first.dtype}:M={m},N={width(first)},to={op.dtype},g={op.block[1]}"
    if k == "rope":
        q, kk = specs_in[:2]
        hd = lambda s: "x".join(str(eval_int(d, bindings)) for d in (s.shape[1:] if s.rank == 3 else (1, s.shape[1])))  # noqa: E731
        return f"rope:{q.dtype}:M={m},q={hd(q)},k={hd(kk)},il={int(op.interleave)}"
    if k == "extern":
        args = ",".join(f"{s.dtype}[{dims(s)}]" for s in specs_in)
        res = "->" + ",".join(f"{s.dtype}[{dims(s)}]" for s in specs_out) if specs_out else ""
        return f"extern:{op.fn}:M={m},{args}{res}"
    return f"{k}:" + ",".join(f"{s.dtype}[{dims(s)}]" for s in specs_in)


def gemm_signatures(op, specs_in, bindings) -> list[str]:
    """The gemm signatures of an op's GEMMs: one for a gemm, the two of a gemm_chain (what tuning
    measures and the cost model sums for it), none for other ops."""
    if op.op == "gemm":
        return [op_signature(op, specs_in, bindings)]
    if op.op == "gemm_chain":
        a, b, b2 = specs_in
        m = eval_int(a.shape[0], bindings)
        return [f"gemm:{a.dtype}:M={m},N={eval_int(b.shape[0], bindings)},K={eval_int(b.shape[1], bindings)}",
                f"gemm:{a.dtype}:M={m},N={eval_int(b2.shape[0], bindings)},K={op.width}"]
    return []


def split_signature(sig: str):
    """(kind, dtype, M, rest) of a KIND:DTYPE:M=<m>,<rest> signature, else None."""
    parts = sig.split(":", 2)
    if len(parts) != 3 or not parts[2].startswith("M="):
        return None
    m, _, rest = parts[2][2:].partition(",")
    if not m.isdigit():
        return None
    return parts[0], parts[1], int(m), rest


def signature_key(op, specs_in, bindings) -> tuple | None:
    """(kind, dtype, rest): an op's signature without its row count (what tuning entries share)."""
    p = split_signature(op_signature(op, specs_in, bindings))
    return None if p is None else (p[0], p[1], p[3])


def _prod(it) -> int:
    n = 1
    for x in it:
        n *= x
    return n


class CostModel:
    def __init__(self, profile: DeviceProfile, groups: dict[str, int]):
        self.p = profile
        self.groups = groups
        # op kinds with measured times (signatures start with the kind): no signature for the rest
        self._signed_kinds = {k.split(":", 1)[0] for k in profile.measured or ()}
        self._measured_kinds = set(self._signed_kinds)
        self.hits: set[str] = set()  # the measured signatures this model has used
        if "gemm" in self._measured_kinds:
            self._measured_kinds.add("gemm_chain")

    def op_us(self, op, tensors: dict, bindings: dict) -> float:
        """Estimated time of one op at the given dim bindings."""
        p = self.p
        ins = [tensors[n] for n in op.inputs()]
        outs = [tensors[n] for n in op.out if n in tensors]
        if p.measured and op.op in self._measured_kinds:
            # a gemm_chain's own signature is looked up only where some time is measured under it
            sig = op_signature(op, ins, bindings, outs) if op.op in self._signed_kinds else None
            hit = p.measured.get(sig) if sig is not None else None
            if hit is not None:
                self.hits.add(sig)
                return float(hit)
            if op.op == "gemm_chain":  # both GEMMs measured: their sum bounds the fused op
                parts = [p.measured.get(s) for s in gemm_signatures(op, ins, bindings)]
                if all(t is not None for t in parts):
                    return float(sum(parts))
        nbytes = lambda s: _numel(s, bindings) * DTYPES[s.dtype]  # noqa: E731
        k = op.op
        if k in ("split", "slice", "view", "select"):
            return 0.0
        if k == "extern":
            return float(op.cost_us or 0.0)
        if k == "gemm":
            a, b = ins[:2]
            m, n, kk = (eval_int(a.shape[0], bindings), eval_int(b.shape[0], bindings), eval_int(b.shape[1], bindings))
            if m == 0:
                return 0.0
            flops = 2.0 * m * n * kk
            moved = self.op_bytes(op, tensors, bindings)  # scales included
            rate = p.fp8_tflops if a.dtype in FP8_DTYPES else p.bf16_tflops
            return p.kernel_us + p.gemm_fixed_us + max(flops / (rate * 1e6), moved / (p.hbm_gbps * 1e3))
        if k == "gemm_chain":  # both bf16 GEMMs, one launch (the second reads the first's output)
            a, b, b2 = ins
            m = eval_int(a.shape[0], bindings)
            if m == 0:
                return 0.0
            first = self._gemm_us(m, b, bindings, nbytes(a) + nbytes(b) + nbytes(outs[0]))
            return p.kernel_us + first + self._gemm_us(m, b2, bindings, nbytes(b2) + nbytes(outs[1]))
        if k in POINTWISE:  # one pass over op_bytes
            if _numel(ins[0], bindings) == 0:
                return 0.0
            return p.kernel_us + self.op_bytes(op, tensors, bindings) / (p.hbm_gbps * 1e3)
        if k in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "all_reduce_add_rmsnorm"):
            w = self.groups.get(op.group, 1)
            if k == "all_reduce_add_rmsnorm":  # the all-reduce with the norm's one pass folded in
                norm = (3 * nbytes(ins[0]) + sum(nbytes(s) for s in outs)) / (p.hbm_gbps * 1e3)
                return norm + (p.kernel_us if w <= 1 else
                               p.coll_latency_us + 2 * nbytes(ins[0]) * (w - 1) / w / (p.coll_gbps * 1e3))
            if w <= 1:
                return p.kernel_us
            if k == "all_to_all":  # every chunk but our own crosses the fabric
                received = nbytes(ins[0]) * (w - 1) / w
            elif k == "all_gather":
                received = nbytes(outs[0]) * (w - 1) / w
            elif k == "reduce_scatter":
                received = nbytes(ins[0]) * (w - 1) / w
            else:
                received = 2 * nbytes(ins[0]) * (w - 1) / w
            t = p.coll_latency_us + received / (p.coll_gbps * 1e3)
            if (k == "all_gather" and p.p2p_gbps > 0 and gather_takes_p2p(op, ins[0])
                    and nbytes(ins[0]) >= p.p2p_min_bytes):
                t = min(t, p.p2p_latency_us + received / (p.p2p_gbps * 1e3))
            return t
        if k == "cat":
            moved = sum(nbytes(s) for s, name in zip(ins, op.xs, strict=True) if name not in op.inplace)
            return p.kernel_us + 2 * moved / (p.hbm_gbps * 1e3) if moved else 0.0
        if k == "add":
            return p.kernel_us + 3 * nbytes(outs[0]) / (p.hbm_gbps * 1e3)
        if k in ("copy", "pad", "shard"):
            return p.kernel_us + 2 * nbytes(outs[0]) / (p.hbm_gbps * 1e3)
        return p.kernel_us


    def op_demand(self, op, tensors: dict, bindings: dict) -> float:
        """What an op takes of the resource ops running at once share, in HBM bytes: op_bytes, and for
        a GEMM whose math outlasts its memory traffic, the bytes its math time would move at the
        full bandwidth (two compute-bound GEMMs on two streams share the tensor cores as two
        weight-streaming ones share HBM; planner/sharing.py)."""
        moved = self.op_bytes(op, tensors, bindings)
        if op.op not in ("gemm", "gemm_chain"):
            return moved
        ins = [tensors[n] for n in op.inputs()]
        m = eval_int(ins[0].shape[0], bindings)
        flops = 0.0
        for w in (ins[1:2] if op.op == "gemm" else ins[1:3]):
            flops += 2.0 * m * eval_int(w.shape[0], bindings) * eval_int(w.shape[1], bindings)
        rate = self.p.fp8_tflops if ins[0].dtype in FP8_DTYPES else self.p.bf16_tflops
        return max(moved, flops / (rate * 1e6) * self.p.hbm_gbps * 1e3)

    def op_bytes(self, op, tensors: dict, bindings: dict) -> float:
        """HBM bytes one op moves (what ops running at once share; op_us's bandwidth term for
        gemms and one-pass kernels): its inputs read once and its outputs written once (rope
        reads only the cache rows of this call's positions: counted as q/k-sized, not the whole
        cache); 0 for views, collectives (their bytes cross the fabric; their HBM traffic is
        small beside it) and model code (its work is unknown)."""
        k = op.op
        if k in VIEW_OPS or k == "extern" or k in COLLECTIVES:
            return 0.0
        names = op.inputs()
        if k == "rope":
            cache = getattr(op, "cos_sin_cache", None)
            names = [n for n in names if n != cache]
        if k == "cat":
            names = [n for n, x in zip(names, op.xs, strict=True) if x not in op.inplace]
        total = 0  # whole bytes: the sum is exact in any order
        for n in names:
            s = tensors[n]
            total += _numel(s, bindings) * DTYPES[s.dtype]
        for n in op.out:
            if n in tensors:
                s = tensors[n]
                total += _numel(s, bindings) * DTYPES[s.dtype]
        return float(total)

    def _gemm_us(self, m: int, w, bindings, moved: float) -> float:
        """A bf16 GEMM of m rows against weight w ([N, K]) that moves `moved` bytes, without the launch."""
        p = self.p
        flops = 2.0 * m * eval_int(w.shape[0], bindings) * eval_int(w.shape[1], bindings)
        return p.gemm_fixed_us + max(flops / (p.bf16_tflops * 1e6), moved / (p.hbm_gbps * 1e3))


def _numel(spec, bindings) -> int:
    n = 1
    for d in spec.shape:
        n *= d if type(d) is int else eval_int(d, bindings)
    return n
