"""Kernel configurations for the skinny bf16 GEMMs (pure Python, no GPU imports).

out[M, N] = x[M, K] @ w[N, K]^T, bf16 in, fp32 accumulate, bf16 out, M <= 16.

Three kernel kinds:

* ``split_n``  -- CUDA-core kernel for small N and large K (F_A/beta, N=144, K=7168).
  One block owns ``rows`` output columns (weight rows); its threads split K into
  ``vec``-wide 16-byte slices (448 threads for K=7168 at vec=2), dot products are
  reduced with warp shuffles and then through shared memory. Grid = ceil(N / rows).
* ``split_k``  -- tensor-core (mma.sync m16n8k16) kernel for small K (F_B, K=128):
  a warp owns 8*tiles weight rows and the whole K, the 4 lanes of a quad split each
  32-wide K step. Grid = ceil(N / (8 * tiles * warps_n)).
* ``stream``   -- the same tensor-core kernel with ``warps_k`` warps splitting a large K
  and a shared-memory reduction (QKVG, N=6144, K=7168): streams the weights with
  128-bit non-coherent loads, ``unroll`` K steps in flight per warp.

The tensor-core kernels use x as the mma A operand (rows = tokens, padded to
``m_tile`` = 8 or 16) and 8 weight rows as the B operand; K is permuted identically
for both operands so every weight load is one contiguous 16-byte vector.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

KINDS = ("split_n", "split_k", "stream", "fused")
MAX_M = 16


# Settings of earlier versions of this file, as tuning files written then store them (read by
# Config.from_dict): old key -> new field name.
OLD_NAMES = {
    "minb": "min_blocks_per_sm",
    "carve": "smem_carveout",
    "pf": "l2_prefetch_distance",
    "wl": "weight_layout",
    "swap": "weights_as_a",
    "ki": "interleave_k",
    "ppf": "prefetch_producer_weights",
    "tag": "tagged_handoff",
    "fbpf": "prefetch_fb_l2",
    "gst": "g1_stores",
    "pwu": "prologue_k_steps",
    "dbg": "timeline",
}
# investigation-only settings that were removed; a stored config may carry them at their off value
REMOVED = {"dx": 0}


@dataclass(frozen=True)
class Config:
    """One kernel configuration. Geometry fields first, then the tuned settings (0 / False:
    off). The fused-only settings are refused on the other kinds by check()."""

    kind: str
    m_tile: int = 16
    """rows of x handled at compile time (8 or 16); runtime M <= m_tile"""
    rows: int = 1
    """split_n: weight rows per block"""
    vec: int = 2
    """split_n: 16-byte vectors per thread along K"""
    tiles: int = 1
    """tensor-core kinds: n8 tiles (8 weight rows) per warp"""
    warps_n: int = 1
    """tensor-core kinds: warps side by side along N (they share x slices through L1)"""
    warps_k: int = 1
    """tensor-core kinds: warps splitting K (shared-memory reduction when > 1)"""
    unroll: int = 1
    """tensor-core kinds: 32-wide K steps loaded back to back per warp iteration"""
    pdl: bool = True
    """programmatic dependent launch: weights load before griddepcontrol.wait"""
    fb_tiles: int = 0
    """fused: n8 tiles of the dependent GEMM (F_B) per consumer warp"""
    fb_passes: int = 1
    """fused: passes of fb_tiles n8 tiles per consumer warp (fewer consumer blocks)"""
    min_blocks_per_sm: int = 0
    """tensor-core kinds: resident blocks per SM asked of ptxas (0 = none; caps registers)"""
    smem_carveout: int = -1
    """tensor-core kinds: preferred shared-memory carveout in percent (-1 = driver default)"""
    l2_prefetch_distance: int = 0
    """tensor-core kinds: L2 bulk-prefetch distance in loop iterations (0 = none): the prologue
    prefetches iterations [0, d) of every weight row, iteration it then prefetches it + d"""
    weight_layout: int = 0
    """tensor-core kinds: 0 row-major [N, K]; 1 tiled (tile_weights(w, 1)): each (8-row tile,
    32-wide K step) is one 512-byte block in lane order; 2 A-fragment order (tile_weights(w, 2)),
    read with weights_as_a"""
    weights_as_a: bool = False
    """tensor-core kinds: 16 weight rows are the mma A operand and x the B operand (8 tokens per
    mma) instead of x as A and 8 weight rows as B: no register moves to build the A fragments,
    half the mma at m_tile 8; needs weight_layout 2"""
    interleave_k: bool = False
    """tensor-core kinds: per iteration the block's warps_k warps read one contiguous run of
    warps_k * unroll * 64 bytes of every weight row, instead of each warp owning one contiguous
    K slice (see kernels._k_steps)"""
    prefetch_producer_weights: bool = False
    """fused: the producer blocks (the tiles holding f_a) bulk-prefetch all their weights into L2
    at launch, so they finish early and F_B runs in the middle of the grid, not after it"""
    tagged_handoff: bool = False
    """fused: producers also store f_a as (bf16x2, launch tag) 64-bit pairs in the workspace and
    consumers spin on the data itself (no fence, counter round trip or second load of f_a);
    off: producers fence and bump a counter, consumers spin on the counter, then load f_a"""
    prefetch_fb_l2: int = 0
    """fused: producers bulk-prefetch their share of W_FB into L2 after stream iteration
    NIT - prefetch_fb_l2 (0 never, 1 after the last, > NIT before the loop), for the consumer
    blocks that start as the producers retire"""
    g1_stores: int = 0
    """fused: how consumers store g1: 0 one 16-bit store per value, 1 one 32-bit bf16x2 store per
    column pair, 2 staged through shared memory, one 16-byte store per thread"""
    prologue_k_steps: int = 0
    """fused: K steps of iteration 0 loaded before the PDL wait (0 = all unroll), so less of the
    next launch's traffic competes with this launch's F_B tail"""
    timeline: bool = False
    """fused, the debug switch (never a default): every block writes %globaltimer at its start,
    mid point (producers: f_a computed; consumers: f_a received) and end, and its SM id, into the
    workspace after the counter (32 bytes per block from byte 16; scripts/fused_timeline.py
    reads them)"""

    def _suffix(self) -> str:
        # the compact letters of key(): cache file names and the bench records in results/
        gs = self.g1_stores
        parts = (
            (self.weight_layout, f"_wl{self.weight_layout}"),
            (self.weights_as_a, "_sw"),
            (self.interleave_k, "_ki"),
            (self.min_blocks_per_sm, f"_mb{self.min_blocks_per_sm}"),
            (self.smem_carveout >= 0, f"_cv{self.smem_carveout}"),
            (self.l2_prefetch_distance, f"_pf{self.l2_prefetch_distance}"),
            (self.fb_passes != 1, f"_fp{self.fb_passes}"),
            (self.prefetch_producer_weights, "_ppf"),
            (self.tagged_handoff, "_tag"),
            (self.prefetch_fb_l2, f"_wb{self.prefetch_fb_l2}"),
            (gs, "_gs" if gs == 1 else f"_gs{gs}"),
            (self.prologue_k_steps, f"_pw{self.prologue_k_steps}"),
            (self.timeline, "_timeline"),
        )
        return "".join(text for on, text in parts if on)

    def key(self) -> str:
        """Compact identifier of the config (disk-cache names, bench records)."""
        if self.kind == "split_n":
            body = f"m{self.m_tile}_r{self.rows}_v{self.vec}"
        elif self.kind == "fused":
            wn = f"_wn{self.warps_n}" if self.warps_n != 1 else ""
            body = (f"m{self.m_tile}_t{self.tiles}{wn}_wk{self.warps_k}_u{self.unroll}"
                    f"_fb{self.fb_tiles}")
        else:
            body = f"m{self.m_tile}_t{self.tiles}_wn{self.warps_n}_wk{self.warps_k}_u{self.unroll}"
        return f"{self.kind}_{body}{self._suffix()}_pdl{int(self.pdl)}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        """Config from a dict with the field names or the short keys of OLD_NAMES."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw = {}
        for key, val in d.items():
            if key in REMOVED:
                if val != REMOVED[key]:
                    raise ValueError(f"cute config setting {key!r} was removed (only {REMOVED[key]} is accepted)")
                continue
            name = OLD_NAMES.get(key, key)
            if name not in fields:
                raise ValueError(f"unknown cute config setting {key!r} (known: {', '.join(fields)})")
            if name in kw:
                raise ValueError(f"cute config setting {name!r} given twice (as {key!r})")
            if fields[name].type == "bool" and val in (0, 1):
                val = bool(val)
            kw[name] = val
        return cls(**kw)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    # ---- geometry -----------------------------------------------------------------
    def threads(self, k: int) -> int:
        if self.kind == "split_n":
            return k // (8 * self.vec)
        return 32 * self.warps_n * self.warps_k

    def grid(self, n: int) -> int:
        if self.kind == "split_n":
            return -(-n // self.rows)
        rows_per_block = 8 * self.tiles * self.warps_n
        return -(-n // rows_per_block)

    def check(self, m: int, n: int, k: int) -> str | None:
        """None if this config can run the shape, else the reason."""
        if self.kind not in KINDS:
            return f"unknown kind {self.kind!r}"
        if m < 1 or m > self.m_tile:
            return f"M={m} outside 1..m_tile={self.m_tile}"
        if self.kind == "fused" and (self.fb_tiles < 1 or self.fb_passes < 1):
            return "fused needs fb_tiles >= 1 and fb_passes >= 1"
        allowed = (1, 2, 4, 8, 16) if self.kind == "split_n" else (8, 16)
        if self.m_tile not in allowed:
            return f"m_tile must be one of {allowed} for {self.kind}"
        if n < 1:
            return "N must be positive"
        if self.kind == "split_n":
            if self.rows < 1 or self.vec < 1:
                return "rows and vec must be positive"
            if k % (8 * self.vec):
                return f"K={k} not a multiple of {8 * self.vec}"
            t = k // (8 * self.vec)
            if t % 32 or t > 1024:
                return f"K/(8*vec)={t} threads must be a multiple of 32 and <= 1024"
            if self.m_tile * self.rows > 64:
                return "m_tile*rows > 64 accumulators"
            if self.interleave_k:
                return "interleave_k is a setting of the tensor-core kinds"
            return None
        if k % 32:
            return f"K={k} not a multiple of 32 (tensor-core kinds)"
        steps = k // 32
        if steps % (self.warps_k * self.unroll):
            return f"K/32={steps} not divisible by warps_k*unroll={self.warps_k * self.unroll}"
        if self.threads(k) > 1024:
            return "more than 1024 threads"
        mb = self.min_blocks_per_sm
        if mb < 0 or mb * self.threads(k) > 2048 or not -1 <= self.smem_carveout <= 100:
            return "min_blocks_per_sm * threads must be <= 2048 and smem_carveout in -1..100"
        pf = self.l2_prefetch_distance
        if pf < 0:
            return "l2_prefetch_distance must be >= 0"
        if self.weight_layout not in (0, 1, 2):
            return "weight_layout must be 0 (row-major), 1 (tiled) or 2 (A-fragment order)"
        if (self.weights_as_a or self.weight_layout == 2) and not (
                self.weights_as_a and self.weight_layout == 2 and self.tiles % 2 == 0
                and n % 16 == 0 and pf == 0 and self.kind != "split_k"):
            return ("weights_as_a goes with weight_layout 2: even tiles, N % 16 == 0, "
                    "l2_prefetch_distance 0, stream or fused")
        if self.interleave_k and pf:
            return "interleave_k needs l2_prefetch_distance 0 (it prefetches each warp's own K slice)"
        if self.weight_layout == 1 and (n % 8 or pf or self.prefetch_producer_weights):
            return ("the tiled weight layout needs N % 8 == 0, l2_prefetch_distance 0 and no "
                    "prefetch_producer_weights")
        fused_only = {"prefetch_producer_weights": self.prefetch_producer_weights,
                      "tagged_handoff": self.tagged_handoff, "timeline": self.timeline,
                      "g1_stores": self.g1_stores, "prologue_k_steps": self.prologue_k_steps,
                      "prefetch_fb_l2": self.prefetch_fb_l2}
        if self.kind != "fused":
            on = [name for name, v in fused_only.items() if v]
            if on:
                return f"{', '.join(on)}: settings of the fused kind"
        for f in dataclasses.fields(self):
            if f.type == "bool" and getattr(self, f.name) not in (0, 1):
                return f"{f.name} is a switch (True/False)"
        if self.g1_stores not in (0, 1, 2):
            return "g1_stores must be 0 (per value), 1 (column pairs) or 2 (16-byte chunks)"
        if not 0 <= self.prologue_k_steps <= self.unroll:
            return "prologue_k_steps must be in 0..unroll"
        if self.prefetch_fb_l2 < 0:
            return "prefetch_fb_l2 must be >= 0"
        return None


def _tc(kind, m_tile, tiles, warps_n, warps_k, unroll):
    return Config(kind=kind, m_tile=m_tile, tiles=tiles, warps_n=warps_n, warps_k=warps_k,
                  unroll=unroll)


def kind_for(n: int, k: int) -> str:
    """Kernel kind chosen by shape."""
    if k <= 512 and k % 32 == 0:
        return "split_k"
    if n <= 512 or k % 32:
        return "split_n"
    return "stream"


def m_tile_for(m: int, kind: str = "stream") -> int:
    if kind == "split_n":  # CUDA-core kernel: compute only the rows that exist
        return 1 << (max(m, 1) - 1).bit_length()
    return 8 if m <= 8 else 16  # mma.sync tile rows


def configs_for(m: int, n: int, k: int, kind: str | None = None) -> list[Config]:
    """All eligible configs for this shape (for an autotuner to time)."""
    kinds = [kind] if kind else list(dict.fromkeys([kind_for(n, k), "split_n", "stream", "split_k"]))
    out: list[Config] = []
    mt = m_tile_for(m)
    for kd in kinds:
        cands: list[Config] = []
        if kd == "split_n":
            for rows in (1, 2, 3, 4):
                for vec in (1, 2, 4):
                    cands.append(Config(kind="split_n", m_tile=m_tile_for(m, "split_n"), rows=rows,
                                        vec=vec))
        elif kd == "split_k":
            for tiles in (1, 2):
                for wn in (1, 2, 4):
                    for u in (1, 2, 4):
                        cands.append(_tc("split_k", mt, tiles, wn, 1, u))
        else:
            # warps along N share x slices; listed first so a capped tuner still sees them
            for tiles, wk in ((1, 4), (1, 8), (2, 4)):
                for u in (2, 4):
                    cands.append(_tc("stream", mt, tiles, 2, wk, u))
            for tiles in (1, 2, 4):
                for wk in (4, 8, 16):
                    for u in (2, 4, 7, 8):
                        cands.append(_tc("stream", mt, tiles, 1, wk, u))
        out.extend(c for c in cands if c.check(m, n, k) is None)
    return out


def fused_grid(cfg: Config, n: int, a0: int, kb: int, nb: int) -> tuple[int, int, int, int]:
    """(stream tiles T, first producer tile t0, producer tiles P, consumer blocks C)."""
    rows = 8 * cfg.tiles * cfg.warps_n
    c = -(-nb // (8 * cfg.fb_tiles * cfg.fb_passes * cfg.warps_k * cfg.warps_n))
    t_all = -(-n // rows)
    t0 = a0 // rows
    p = -(-(a0 + kb) // rows) - t0
    return t_all, t0, p, c


def check_fused(cfg: Config, m: int, n: int, k: int, a0: int, nb: int, kb: int) -> str | None:
    """None if the fused step kernel can run: out[M,n] = x @ w[n,k]^T, then
    g1[M,nb] = out[:, a0:a0+kb] @ w_fb[nb,kb]^T inside the same kernel."""
    if cfg.kind != "fused":
        return f"kind {cfg.kind!r} is not 'fused'"
    why = cfg.check(m, n, k)
    if why is not None:
        return why
    if a0 < 0 or a0 % 8 or kb < 32 or kb % 32 or a0 + kb > n:
        return f"dependent columns [{a0}, {a0 + kb}) must be 8-aligned, K_B % 32 == 0, inside N={n}"
    if nb < 1:
        return "N_B must be positive"
    gs = cfg.g1_stores
    if gs and nb % 2 or gs == 2 and (nb % 8 or cfg.fb_passes != 1):
        return ("g1_stores 1 stores column pairs (N_B even), 2 8-column chunks (N_B % 8 == 0, "
                "one pass)")
    if cfg.fb_tiles * (kb // 32) > 16:
        return "fb_tiles * K_B/32 > 16 (over 64 weight registers per lane)"
    return None


EPOCH_SPAN = 1 << 16  # tagged handoff: every launch adds exactly this much to the arrival word


def epoch_shares(total: int) -> tuple[int, int]:
    """(base, rem): arrival i of `total` adds base + (i < rem), so one launch adds EPOCH_SPAN."""
    return divmod(EPOCH_SPAN, int(total))


def fused_tag_offset(cfg: Config, n: int, a0: int, kb: int, nb: int) -> int:
    """Byte offset of the tagged f_a pairs (tagged_handoff) in the fused workspace: after the
    counter (byte 0), the 64-bit arrival word of the tag epoch (byte 8) and the timeline records
    (32 bytes per block from byte 16; room for them is kept in every layout)."""
    t_all, _, _, c = fused_grid(cfg, n, a0, kb, nb)
    return (16 + 32 * (t_all + c) + 255) // 256 * 256


def fused_workspace_words(cfg: Config, n: int, a0: int, kb: int, nb: int) -> int:
    """int32 words of the fused kernel's workspace: word 0 counter, words 2-3 the tag
    epoch's arrival word, timeline records, then (tagged_handoff) m_tile x kb/2 pairs of
    (bf16x2, tag) words."""
    words = fused_tag_offset(cfg, n, a0, kb, nb) // 4
    if cfg.tagged_handoff:
        words += cfg.m_tile * kb
    return words
