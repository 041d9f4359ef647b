"""Weights prepared once: each plan weight in the layout its kernel reads, and no other copy.

    pw = prepare_weights(compiled, {"w_packed": w, "w_fb": w_fb}, device="cuda")
    pw.layouts                      # {"w_packed": "mma_a", "w_fb": "row"}
    ex = build_executor(compiled, pw, device="cuda")     # takes prepared weights as they are
    load_weights(ex, {"w_packed": new_w})                # new weights: the same step, in place

Layouts:
  row    the plan's [N, K] row-major layout, kept as given (no copy).
  mma_a  executors.cute.tile_weights(w, 2): 16-row x 32-column tiles in the order the mma A
         fragments load them; what the fused KDA kernel reads with swapped mma roles (the
         weights as the A operand). Same [N, K] shape and bytes; a row slice at a multiple of
         16 rows (w_packed[:qkvg], w_packed[qkvg:]) is the mma_a layout of those rows, so the
         two-branch variant's gemms read slices of the one prepared tensor.

A weight gets mma_a when it is the first weight of a gemm_chain op (fuse-gemm-chains) the fused
kernel runs (CUDA, CuTe available, prepack=True), N % 16 == 0 and K % 32 == 0, and every
consumer is a gemm's weight operand, directly or through row slices on 16-row boundaries.
Every path then reads the prepared tensor: the fused kernel (w_swap is the tensor itself),
the gemms of other variants (CuTe swapped-role stream kernel, or mma_a_matmul: torch on the
8-D view of the tiles, which needs no un-tiled copy to be kept), eager and CPU alike.

Memory: build_executor keeps only the prepared tensors. A row weight is the caller's tensor;
an mma_a weight is a new tensor unless prepare_weights(..., inplace=True) wrote the layout
into the caller's storage (as vLLM's process_weights_after_loading replaces a parameter's
data): then the model and the executor share the one copy. load_weights writes new weights
into the executor's prepared tensors in place, so captured graphs and compiled graphs keep
their addresses and need no re-capture; do not write row-major data into an mma_a tensor.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .dtypes import plan_dtype

__all__ = ["ROW", "MMA_A", "PreparedWeights", "choose_layouts", "prepare_weights", "load_weights", "to_layout",
           "from_layout", "mma_a_matmul", "layout_of_tensor", "layout_gemm"]

ROW, MMA_A = "row", "mma_a"


class PreparedWeights(dict):
    """{weight name: tensor in its layout}; .layouts {name: layout}."""

    def __init__(self, tensors: dict, layouts: dict):
        super().__init__(tensors)
        self.layouts = dict(layouts)


# ------------------------------------------------------------------ the layouts

def to_layout(w, layout: str):
    """A row-major [N, K] weight in `layout` (a new tensor for mma_a; w itself for row)."""
    if layout == ROW:
        return w
    if layout == MMA_A:
        n, k = w.shape
        if n % 16 or k % 32:
            raise ValueError(f"mma_a needs N % 16 == 0 and K % 32 == 0, got {tuple(w.shape)}")
        from . import cute  # the kernel's own layout function (pure torch; no GPU needed)
        return cute.tile_weights(w, 2)
    raise ValueError(f"unknown weight layout '{layout}' ({ROW}, {MMA_A})")


def _tiles(p):
    """The 8-D view [tile, step, kk, g, t, j, h, e] of an mma_a tensor: row tile*16 + h*8 + g,
    column step*32 + t*8 + kk*4 + j*2 + e (executors.cute.tile_weights, wl = 2)."""
    n, k = p.shape
    return p.view(n // 16, k // 32, 2, 8, 4, 2, 2, 2)


def from_layout(p, layout: str):
    """The row-major weight of a prepared tensor (a new tensor; for references and tests)."""
    if layout == ROW:
        return p
    n, k = p.shape
    return _tiles(p).permute(0, 6, 3, 1, 4, 2, 5, 7).reshape(n, k)


def mma_a_matmul(x, p, out=None):
    """x @ W^T with W given in the mma_a layout p, on p's 8-D tile view (no un-tiled copy kept)."""
    m, k = x.shape
    n = p.shape[0]
    xs = x.reshape(m, k // 32, 4, 2, 2, 2)                      # [m, step, t, kk, j, e]
    r = torch.einsum("mstkje,askgtjhe->mahg", xs, _tiles(p)).reshape(m, n)
    if out is None:
        return r
    return out.copy_(r)


# ------------------------------------------------------------------ which weight gets which layout

def _chain_first_weights(cp) -> set:
    """Plan weights read as the first GEMM of a gemm_chain op (planner pass fuse-gemm-chains: the
    fused KDA step) that the CuTe backend may run."""
    g, out = cp.graph, set()
    for v in cp.schedule or g.nodes:
        op = g.nodes[v]["op"]
        if op.op == "gemm_chain" and op.b in cp.plan.weights and op.backend in ("cute", "auto"):
            out.add(op.b)
    return out


def _row_slice_ok(cp, op) -> bool:
    from planner.expr import eval_int, parse
    if op.op != "slice" or op.dim != 0:
        return False
    try:
        start = op.start if isinstance(op.start, int) else int(eval_int(parse(op.start), cp.plan.params))
        n = cp.tensors[op.out[0]].shape[0]
        n = int(eval_int(n, cp.plan.params))
    except Exception:  # noqa: BLE001 - a symbolic bound: not a fixed tile boundary
        return False
    return start % 16 == 0 and n % 16 == 0


def _only_gemm_weight_reads(cp, name: str) -> bool:
    """Every op reading `name` uses it as a gemm weight, directly or through 16-row slices."""
    g = cp.graph
    for v in g.nodes:
        op = g.nodes[v]["op"]
        if name not in op.inputs():
            continue
        if op.op == "gemm" and op.b == name and op.a != name:
            continue
        if op.op == "gemm_chain" and op.b == name and name not in (op.a, op.b2):
            continue
        if _row_slice_ok(cp, op) and _only_gemm_weight_reads(cp, op.out[0]):
            continue
        return False
    return True


def choose_layouts(cp, device, prefs=None, prepack: bool = True) -> dict:
    """{weight: layout} for this plan on this device (see the module docstring)."""
    layouts = {w: ROW for w in cp.plan.weights}
    device = torch.device(device)
    if not prepack or device.type != "cuda" or (prefs is not None and "cute" not in prefs):
        return layouts
    from . import cute
    if not cute.available():
        return layouts
    from planner.expr import eval_int
    for w in _chain_first_weights(cp):
        spec = cp.tensors[w]
        try:
            n, k = (int(eval_int(d, cp.plan.params)) for d in spec.shape)
        except Exception:  # noqa: BLE001
            continue
        if spec.dtype == "bf16" and len(spec.shape) == 2 and n % 16 == 0 and k % 32 == 0 \
                and _only_gemm_weight_reads(cp, w):
            layouts[w] = MMA_A
    return layouts


def prepare_weights(cp, weights: dict, device=None, prefs=None, prepack: bool = True, inplace: bool = False,
                    layouts: dict | None = None) -> PreparedWeights:
    """Each weight in the layout its kernel reads (choose_layouts, or `layouts` to force one).
    inplace: write the layout into the caller's tensor (no second copy even while the caller
    keeps its reference); otherwise an mma_a weight is a new tensor and the caller may drop
    the original."""
    if isinstance(weights, PreparedWeights):
        return weights
    if device is None:
        w0 = next(iter(weights.values()), None)
        device = w0.device if w0 is not None else "cpu"
    lay = {w: ROW for w in cp.plan.weights}
    lay.update(layouts if layouts is not None else choose_layouts(cp, device, prefs, prepack))
    out = {}
    for name, t in weights.items():
        layout = lay.get(name, ROW)
        if layout == ROW:
            out[name] = t
            continue
        if not t.is_contiguous():
            raise ValueError(f"weight '{name}' must be contiguous to take the {layout} layout")
        p = to_layout(t, layout)
        if inplace:
            with torch.no_grad():
                t.copy_(p)
            p = t
        out[name] = p
    return PreparedWeights(out, {n: lay.get(n, ROW) for n in weights})


def load_weights(ex, new: dict) -> None:
    """Write new row-major weights into an executor's prepared tensors, in place (the same
    preparation step; addresses stay, so captured and compiled graphs stay valid). Every entry is
    checked before any is written, so a refused load leaves the executor as it was. A row-layout
    weight is the tensor build_executor was given: executors built from the same tensors share
    it, and a load into one is a load into all of them."""
    if not isinstance(new, Mapping):
        raise ValueError(f"load_weights takes a mapping {{weight name: tensor}}, got {type(new).__name__}")
    for name, w in new.items():
        dst = ex._weights.get(name)
        if dst is None:
            raise KeyError(f"plan '{ex.plan.name}' has no weight '{name}' (weights: {sorted(ex._weights)})")
        if not isinstance(w, torch.Tensor):
            raise ValueError(f"weight '{name}' must be a tensor, got {type(w).__name__}")
        if w.is_meta:
            raise ValueError(f"weight '{name}' is a meta tensor (a shape without data): load real values")
        if tuple(w.shape) != tuple(dst.shape) or w.dtype != dst.dtype:
            raise ValueError(f"weight '{name}' must be {plan_dtype(dst.dtype)}{list(dst.shape)}, got"
                             f" {plan_dtype(w.dtype)}{list(w.shape)}")
    for name, w in new.items():
        dst = ex._weights[name]
        with torch.no_grad():
            dst.copy_(to_layout(w.to(dst.device), ex.weight_layouts.get(name, ROW)))


# ------------------------------------------------------------------ gemms on a prepared weight

def layout_of_tensor(cp, name: str, layouts: dict) -> str:
    """The layout of a weight or of a row slice of one (ROW for anything else)."""
    for _ in range(16):
        if name in layouts:
            return layouts[name]
        spec = cp.tensors.get(name)
        if spec is None or spec.producer is None or spec.producer not in cp.graph:
            return ROW
        op = cp.graph.nodes[spec.producer]["op"]
        if op.op != "slice":
            return ROW
        name = op.x
    return ROW


def layout_gemm(layout: str, device):
    """(runner(ins, b, out), backend label) of a gemm whose weight operand is in `layout`."""
    if layout != MMA_A:
        raise ValueError(f"no gemm runner for weight layout '{layout}'")
    if device.type != "cuda":
        return (lambda ins, b, out: mma_a_matmul(ins[0], ins[1], out)), "torch:mma_a"
    from . import cute

    def run(ins, b, out):
        x, w = ins
        m, k = x.shape
        n = w.shape[0]
        cfg = _swap_stream_config(cute, m)
        if (cfg is not None and x.dtype == torch.bfloat16 and x.stride(1) == 1 and (out is None or out.stride(1) == 1)
                and cfg.check(m, n, k) is None
                and cute.supports(m, n, k, x.dtype, x.stride(0), n if out is None else out.stride(0)) is None):
            return cute.skinny_gemm(x, w, out, cfg)
        return mma_a_matmul(x, w, out)
    return run, "cute:mma_a"


def _swap_stream_config(cute, m: int):
    """The swapped-role stream kernel config on an mma_a weight (tests/test_cute_kernels.py runs it)."""
    if m < 1 or m > 16:
        return None
    return cute.Config("stream", m_tile=8 if m <= 8 else 16, tiles=2, warps_k=8, unroll=4, interleave_k=True,
                       weights_as_a=True, weight_layout=2)
