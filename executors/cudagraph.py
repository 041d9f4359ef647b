"""CUDA graphs over an Executor: one captured graph per dim bucket.

    g = GraphedExecutor(executor)                  # buckets from the plan's dim spec
    outs = g(x=hidden_states)                      # pad to the bucket, replay, slice back

A separate wrapper over an already-lowered callable (as Thunder's CUDAGraphTransform):
static input buffers per bucket, two warm-up calls on a side stream, capture into a
memory pool shared by all buckets, then per call: copy the inputs into the static
buffers, replay, return the outputs sliced back to this call's dims. The capture
runs the executor with `capturing` true, so gates such as the KDA two-branch one
select the multi-stream variant inside the graph.

Padding: an input dim that is exactly the bucketed dim (x: [num_tokens, hidden]) is
padded up to the bucket; rows past the real ones are left from earlier calls, which
is harmless for row-independent plans. An input dim derived from it
(ceil_div(num_tokens, tp)) cannot be padded without changing which rows each rank
holds, so such inputs must already come at the bucket's shape (pass dims= with the
padded token count, as vLLM pads num_tokens before sp_shard); otherwise an error.

An op whose result depends on the padded rows (planner.hazards.padding_sensitive: a gather or
cat along the bucketed dim, a gemm that sums over it, a shard that cuts it) makes a padded
replay wrong: a call that would pad is refused, naming the op.

Returned tensors are views of the graph's static outputs: the next replay of the
same bucket overwrites them (clone_outputs=True copies). Outputs that come from a `p2p`
all_gather (executors/p2p.py) live in that op's one symmetric buffer, so the next replay
of any bucket overwrites those.
"""

from __future__ import annotations

import torch

from planner.expr import eval_int, free_names
from planner.graph import compatible
from planner.hazards import padding_sensitive

from .dtypes import torch_dtype
from .executor import refuse_positional

__all__ = ["GraphedExecutor"]


def _padding_hazards(cp, variants: dict, dim: str) -> dict[str, str]:
    """padding_sensitive's ops among those the captured variants run."""
    chosen = tuple(sorted(variants.items()))
    g = cp.graph
    return {n: why for n, why in padding_sensitive(cp, dim).items() if compatible(chosen, g.nodes[n]["ctx"])}


class GraphedExecutor:
    def __init__(self, executor, buckets: list[int] | None = None, dim: str = "num_tokens",
                 warmup: int = 2, clone_outputs: bool = False):
        if not executor._cuda:
            raise RuntimeError("GraphedExecutor needs an executor built for a CUDA device")
        plan = executor.plan
        if dim not in plan.dims:
            raise ValueError(f"plan '{plan.name}' has no dim '{dim}' (dims: {sorted(plan.dims)})")
        self.ex, self.dim, self.warmup, self.clone = executor, dim, warmup, clone_outputs
        self.buckets = sorted(buckets or plan.dims[dim].buckets)
        self.pool = None  # the graph memory pool, taken at the first capture (see capture)
        self.graphs: dict[tuple, tuple] = {}  # key -> (graph, static inputs, static outputs, variants)
        self._padding: dict[tuple, dict] = {}  # key -> {op: why} of its ops that read padded rows
        self.last_variants: dict[str, str] = {}
        self.last_bucket: int | None = None
        # plan weights the executor keeps a derived copy of (a fused gemm chain's prepacked
        # weight): a graph replays the copy it captured, so an in-place write to such a weight
        # (its version counter moves) drops the graphs and the next call captures them again
        self._watch = {n: executor._weights[n] for n in getattr(executor, "prepacked_bytes", {})}
        self._versions = self._weight_versions()

    def _weight_versions(self) -> dict:
        return {n: w._version for n, w in self._watch.items()}

    def _drop_if_weights_changed(self) -> bool:
        """True (and every captured graph dropped) if a watched weight was written in place."""
        if not self._watch:
            return False
        now = self._weight_versions()
        if now == self._versions:
            return False
        self.graphs.clear()
        # a fresh pool at the next capture: torch releases a private pool once no graph holds
        # it, and capturing into the released handle trips an allocator assert (H200 run50)
        self.pool = None
        self._versions = now
        return True

    def bucket_for(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"{self.dim} = {n} is above the largest captured bucket {self.buckets[-1]}")

    def _shape(self, name: str, b: dict) -> tuple:
        return tuple(eval_int(d, b) for d in self.ex._specs[name].shape)

    def capture(self, bindings: dict):
        """Capture the graph for these (bucket) bindings; returns its cache entry."""
        key = tuple(sorted(bindings.items()))
        if key in self.graphs:
            return self.graphs[key]
        ex, dev = self.ex, self.ex.device
        static_in = {n: torch.zeros(self._shape(n, bindings), dtype=torch_dtype(ex._specs[n].dtype), device=dev)
                     for n in ex.plan.inputs}
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            # warm up the variants the capture will take (gates see capturing=True there): the
            # first use of a library (cuBLAS handle, workspaces) on a stream must not be inside a capture
            facts = ex.facts(static_in, dict(bindings), capturing=True)
            for _ in range(self.warmup):
                ex(dims=dict(bindings), _facts=facts, **static_in)
                ex(dims=dict(bindings), **static_in)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = ex(dims=dict(bindings), **static_in)
        entry = (graph, static_in, static_out, dict(ex.last_variants))
        self.graphs[key] = entry
        self._padding[key] = _padding_hazards(ex.compiled, entry[3], self.dim)
        return entry

    def capture_all(self, other_dims: dict | None = None):
        """Capture every bucket, largest first (so smaller ones reuse the pool's blocks)."""
        for bk in reversed(self.buckets):
            self.capture({**(other_dims or {}), self.dim: bk})

    def __call__(self, *args, dims: dict | None = None, **inputs):
        ex = self.ex
        refuse_positional(ex.plan, args)
        self._drop_if_weights_changed()
        b = ex.check_inputs(inputs, dims)  # what the eager call checks, before any replay
        n = b[self.dim]
        bk = self.bucket_for(n)
        padded = {**b, self.dim: bk}
        graph, static_in, static_out, variants = self.capture(padded)
        hazards = self._padding.get(tuple(sorted(padded.items())))
        if n != bk and hazards:
            op, why = next(iter(hazards.items()))
            raise ValueError(f"plan '{ex.plan.name}': {self.dim} = {n} would replay the graph of bucket {bk} on rows"
                             f" padded past the real ones, but {why} (op '{op}'), so its result depends on the"
                             f" padded rows; pad the inputs to the bucket yourself and pass dims={{'{self.dim}': {bk}}},"
                             f" or capture a bucket for every size (buckets=[...])")
        for name, t in inputs.items():
            dst = static_in[name]
            if dst.shape == t.shape:
                dst.copy_(t)
                continue
            spec = ex._specs[name]
            view = dst
            for ax, d in enumerate(spec.shape):
                if isinstance(d, int) or t.shape[ax] == dst.shape[ax]:
                    continue
                if type(d).__name__ != "Name" or d.id != self.dim:
                    raise ValueError(f"input '{name}' dim {ax} ({t.shape[ax]}) is derived from {self.dim} and cannot"
                                     f" be padded to bucket {bk}; pass it at the bucket's shape {tuple(dst.shape)}"
                                     f" with dims={{'{self.dim}': {bk}}}")
                view = view.narrow(ax, 0, t.shape[ax])
            view.copy_(t)
        graph.replay()
        self.last_variants, self.last_bucket = variants, bk
        out = {}
        for name, t in static_out.items():
            v = t
            for ax, d in enumerate(ex._specs[name].shape):
                if not isinstance(d, int) and self.dim in free_names(d):
                    v = v.narrow(ax, 0, eval_int(d, b))
            out[name] = v.clone() if self.clone else v
        return out
