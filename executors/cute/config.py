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
import functools
import json
from dataclasses import dataclass

KINDS = ("split_n", "split_k", "stream", "fused")
MAX_M = 16


@dataclass(frozen=True)
class Config:
    kind: str
    m_tile: int = 16  # rows of x handled at compile time (8 or 16); runtime M <= m_tile
    # split_n
    rows: int = 1  # weight rows per block
    vec: int = 2  # 16-byte vectors per thread along K
    # split_k / stream (tensor core)
    tiles: int = 1  # n8 tiles (8 weight rows) per warp
    warps_n: int = 1  # warps side by side along N
    warps_k: int = 1  # warps splitting K (shared-memory reduction when > 1)
    unroll: int = 1  # 32-wide K steps loaded back to back per warp iteration
    pdl: bool = True
    # fused (whole KDA step): n8 tiles of the dependent GEMM (F_B) per consumer warp
    fb_tiles: int = 0
    fb_passes: int = 1  # passes of fb_tiles n8 tiles per consumer warp (fewer consumer blocks)
    # launch attributes (tensor-core kinds): minimum resident blocks per SM asked of
    # ptxas (0 = none; caps registers) and preferred shared-memory carveout in percent
    # (-1 = driver default; 0 = largest L1)
    minb: int = 0
    carve: int = -1
    # tensor-core kinds: L2 bulk-prefetch distance in loop iterations (0 = none): the
    # prologue prefetches iterations [0, pf) of every weight row, iteration it then
    # prefetches it + pf (requests in flight without holding registers)
    pf: int = 0
    # tensor-core kinds: weight layout. 0 = row-major [N, K]; 1 = tiled (tile_weights): each
    # (8-row tile, 32-wide K step) is one 512-byte block in the order the warp's lanes load it,
    # so every warp streams whole contiguous blocks instead of 8 rows x 64 bytes
    wl: int = 0
    # tensor-core kinds: operand roles. 0 = x is the mma A operand (token rows g, g + 8) and 8
    # weight rows are B; 1 = 16 weight rows are A (prepacked fragment order, wl = 2) and x is B
    # (8 tokens per mma): no register moves to build the A quads, half the mma at m_tile 8
    swap: int = 0
    # tensor-core kinds: K order across the warps_k warps. 0 = warp wk owns one contiguous K
    # slice; 1 = interleaved: per iteration the block's warps read one contiguous run of
    # warps_k * unroll * 64 bytes of every weight row (DRAM page locality; see _k_steps)
    ki: int = 0
    # fused: producer blocks (the tiles holding f_a) bulk-prefetch ALL their weights into L2
    # at launch, so they finish early and F_B runs in the middle of the grid, not after it
    ppf: int = 0
    # fused: how f_a reaches the consumers. 0 = producers store it to out, fence and bump a
    # counter; consumers spin on the counter, then load f_a. 1 = producers also store f_a as
    # (bf16x2, launch tag) 64-bit pairs into the workspace and consumers spin on the data
    # itself: no fence, no counter round trip, no second load on the critical path
    tag: int = 0
    # fused: producers bulk-prefetch their share of W_FB into L2 after stream iteration
    # NIT - fbpf (0 = never, 1 = after the last, > NIT = before the loop), for the consumer
    # blocks, which start as the producers retire (run39-41). Tried and removed (code at commit
    # cdbab10): an evict_last policy on it (no faster) and consumers rereading the epoch inside
    # the f_a poll (knob pe: equal at m_tile 8, 0.5-1 us slower at 16)
    fbpf: int = 0
    # fused: the consumers store g1 as bf16x2 pairs (one 32-bit store per two columns) instead of
    # one 16-bit store per value: half the store instructions at the end of the step, where each
    # memory instruction queues behind the whole GPU's weight loads (run60 timeline)
    gst: int = 0  # 2: staged through shared memory, one 16-byte store per thread
    # fused: only the first pwu of iteration 0's `unroll` K steps are loaded before the PDL wait
    # (0 = all), so less of the next launch's traffic competes with this launch's F_B tail
    pwu: int = 0
    # fused, diagnostics only (never a default): m_tile 16 without the second x row load per lane
    # (rows g + 8 reuse row g, so outputs are right only at M <= 8): what does that load cost?
    dx: int = 0
    # fused, diagnostics only: every block records (start, mid, end) %globaltimer stamps and
    # its SM id into the workspace after the counter (see fused.build_fused); never a default.
    # The consumers' mid stamp: 1 f_a seen (thread 0 after the barrier), 2 after their last mma, 3
    # after their g1 stores are issued, 4 the second polling warp done (m_tile 16), 5 after the
    # barrier, read once a shared load issued after it has returned
    dbg: int = 0

    def _suffix(self) -> str:
        s = ""
        if self.wl:
            s += f"_wl{self.wl}"
        if self.swap:
            s += "_sw"
        if self.ki:
            s += "_ki"
        if self.minb:
            s += f"_mb{self.minb}"
        if self.carve >= 0:
            s += f"_cv{self.carve}"
        if self.pf:
            s += f"_pf{self.pf}"
        if self.fb_passes != 1:
            s += f"_fp{self.fb_passes}"
        if self.ppf:
            s += "_ppf"
        if self.tag:
            s += "_tag"
        if self.fbpf:
            s += f"_wb{self.fbpf}"
        if self.gst:
            s += "_gs" if self.gst == 1 else f"_gs{self.gst}"
        if self.pwu:
            s += f"_pw{self.pwu}"
        if self.dx:
            s += "_dx"
        if self.dbg:
            s += "_dbg" if self.dbg == 1 else f"_dbg{self.dbg}"
        return s

    def key(self) -> str:
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
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

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
            if self.ki:
                return "ki is a knob of the tensor-core kinds"
            return None
        if k % 32:
            return f"K={k} not a multiple of 32 (tensor-core kinds)"
        steps = k // 32
        if steps % (self.warps_k * self.unroll):
            return f"K/32={steps} not divisible by warps_k*unroll={self.warps_k * self.unroll}"
        if self.threads(k) > 1024:
            return "more than 1024 threads"
        if self.minb < 0 or self.minb * self.threads(k) > 2048 or not -1 <= self.carve <= 100:
            return "minb * threads must be <= 2048 and carve in -1..100"
        if self.pf < 0:
            return "pf must be >= 0"
        if self.wl not in (0, 1, 2):
            return "wl must be 0 (row-major), 1 (tiled) or 2 (A-fragment order)"
        if (self.swap or self.wl == 2) and not (self.swap == 1 and self.wl == 2 and self.tiles % 2 == 0
                                                and n % 16 == 0 and self.pf == 0 and self.kind != "split_k"):
            return "swap = 1 goes with wl = 2: even tiles, N % 16 == 0, pf == 0, stream or fused"
        if self.ki not in (0, 1) or self.ki and self.pf:
            return "ki is a 0/1 knob and needs pf == 0 (pf prefetches each warp's own K slice)"
        if self.wl == 1 and (n % 8 or self.pf or self.ppf):
            return "the tiled weight layout needs N % 8 == 0 and pf == ppf == 0"
        knobs = (self.ppf, self.dbg, self.tag)
        if any(knobs) and self.kind != "fused" or self.ppf not in (0, 1) or self.tag not in (0, 1):
            return "ppf and tag are 0/1 knobs of the fused kind, dbg (0..5) a diagnostic of it"
        if self.dbg not in (0, 1, 2, 3, 4, 5) or self.dbg > 3 and not self.tag:
            return "dbg is 0..5 (where the consumers' mid stamp is taken, see Config.dbg; 4, 5 need tag)"
        if self.dx and (self.kind != "fused" or self.m_tile != 16 or m > 8):
            return "dx is a diagnostic of the m_tile-16 fused kernel, right only at M <= 8"
        if self.gst not in (0, 1, 2) or self.gst and self.kind != "fused":
            return "gst is a 0/1/2 knob of the fused kind"
        if not 0 <= self.pwu <= self.unroll or self.pwu and self.kind != "fused":
            return "pwu (0..unroll) is a knob of the fused kind"
        if self.fbpf < 0 or self.fbpf and self.kind != "fused":
            return "fbpf (>= 0) is a knob of the fused kind"
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
            # warps along N share x slices (run16); listed first so a capped tuner still sees them
            for tiles, wk in ((1, 4), (1, 8), (2, 4)):
                for u in (2, 4):
                    cands.append(_tc("stream", mt, tiles, 2, wk, u))
            for tiles in (1, 2, 4):
                for wk in (4, 8, 16):
                    for u in (2, 4, 7, 8):
                        cands.append(_tc("stream", mt, tiles, 1, wk, u))
        out.extend(c for c in cands if c.check(m, n, k) is None)
    return out


# Default table (per kind, per M bucket), updated from the H200 sweep in
# results/kda_kernels.md. Values are (m <= bound) -> config parameters.
_DEFAULTS: dict[str, list[tuple[int, dict]]] = {
    # H200 sweeps 2026-11-30 (results/kda_kernels.md, results/data/kda_kernels/)
    "split_n": [  # F_A/beta [M,7168]x[144,7168]^T
        (4, dict(rows=1, vec=2)),
        (16, dict(rows=2, vec=4)),
    ],
    "split_k": [  # F_B [M,128]x[1536,128]^T (run2 sweep best; run3 showed one-warp
        # blocks were no better)
        (8, dict(tiles=2, warps_n=1, warps_k=4, unroll=1)),
        (16, dict(tiles=1, warps_n=2, warps_k=4, unroll=1)),
    ],
    "stream": [  # QKVG / packed [M,7168]x[6144|6288,7168]^T
        # run3: t1/wk8/u7 (run1 best) is 25-30% slower once kernels trigger their
        # dependents early (the next grid's weight prefetch competes); wk4/u4 was best in run2;
        # run16/run17: 2 warps along N x 8 along K (they share x slices) 0.6-0.8 us faster
        (8, dict(tiles=1, warps_n=2, warps_k=8, unroll=4)),
        (16, dict(tiles=2, warps_n=1, warps_k=8, unroll=4)),
    ],
}


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
    if cfg.gst and nb % 2 or cfg.gst == 2 and (nb % 8 or cfg.fb_passes != 1):
        return "gst stores g1 column pairs (N_B even), gst 2 8-column chunks (N_B % 8 == 0, one pass)"
    if cfg.fb_tiles * (kb // 32) > 16:
        return "fb_tiles * K_B/32 > 16 (over 64 weight registers per lane)"
    return None


EPOCH_SPAN = 1 << 16  # tag = 1: every launch adds exactly this much to the arrival word


def epoch_shares(total: int) -> tuple[int, int]:
    """(base, rem): arrival i of `total` adds base + (i < rem), so one launch adds EPOCH_SPAN."""
    return divmod(EPOCH_SPAN, int(total))


def fused_tag_offset(cfg: Config, n: int, a0: int, kb: int, nb: int) -> int:
    """Byte offset of the tagged f_a pairs (tag = 1) in the fused workspace: after the
    counter (byte 0), the 64-bit arrival word of the tag epoch (byte 8) and the dbg records
    (32 bytes per block from byte 16)."""
    t_all, _, _, c = fused_grid(cfg, n, a0, kb, nb)
    return (16 + 32 * (t_all + c) + 255) // 256 * 256


def fused_workspace_words(cfg: Config, n: int, a0: int, kb: int, nb: int) -> int:
    """int32 words of the fused kernel's workspace: word 0 counter, words 2-3 the tag
    epoch's arrival word, dbg records, then (tag = 1) m_tile x kb/2 pairs of (bf16x2, tag) words."""
    words = fused_tag_offset(cfg, n, a0, kb, nb) // 4
    if cfg.tag:
        words += cfg.m_tile * kb
    return words


# Without the tagged handoff (f_a columns not tile-aligned: counter handoff) the single fused
# kernel is used up to this M only: above it (m_tile 16) the H200 runs of 2026-11-30 (run5,
# run8) measured it 2-3 us SLOWER than two launches (packed stream kernel + F_B kernel, PDL
# chained), and kda_fused_step takes those. With the tagged handoff, fire-and-forget arrivals
# and the producer prefetch, the m_tile-16 fused kernel was 0.5-1.1 us faster than two launches
# at M = 9..15 and equal at 16 (run33). Once pdl_wait let the two launches' prologue loads
# overlap (run47/run48, session 6), two launches are 0.5-0.6 us faster at M = 15, 16 (two
# sweeps), equal at 14 and 0.3-0.7 us slower at 9..13: the tagged fused kernel is used up to
# FUSED_TAG_MAX_M. run53 (its default now one consumer pass with minb 3): 0.4-0.6 us faster than
# two launches at M = 14, 0.1 slower at 16. run59: with g1 stored in chunks (gst) the fused kernel
# is 0.8 us faster than two launches at M = 16 too: fused at every M.
FUSED_MAX_M = 8
FUSED_TAG_MAX_M = 16


def fused_is_default(cfg: Config, m: int) -> bool:
    """Whether kda_fused_step runs the default fused config `cfg` at M = m (else two launches).
    With swapped mma roles (a prepacked weight given) the fused kernel wins at every M (run49)."""
    return m <= FUSED_MAX_M or cfg.tag == 1 and (m <= FUSED_TAG_MAX_M or cfg.swap == 1)


@functools.lru_cache(maxsize=512)  # kda_fused_step asks on every eager call; Config is frozen
def default_fused_config(m: int, n: int, k: int, kb: int = 128, a0: int | None = None,
                         swap: bool = False) -> Config:
    """Fused whole-step config. With the f_a column a0 given and tile-aligned, consumers take
    f_a through tagged pairs (tag = 1; H200 run23/run24/run32/run33: 0.4 us faster at M = 8,
    equal at M = 1, 2-3 us faster at m_tile 16) and the producers prefetch their weights into
    L2 (ppf); the warps of a block interleave their K steps (ki, run29). Without tag, M >
    FUSED_MAX_M gets this config only when passed explicitly (see fused_is_default).
    swap: the caller also holds the weight in the A-fragment layout (tile_weights(w, 2)); with
    the tagged handoff the config then swaps the mma roles (run49)."""
    base = default_config(m, n, k)
    if base.kind != "stream":
        raise ValueError(f"no fused config for N={n} K={k} (kind {base.kind})")
    rows_ok = False
    if m <= 8:  # H200 fused sweep 2026-11-30 run5 at M=8: t2/wk8/u4 best (24.40 us/step)
        base = Config(kind="stream", m_tile=8, tiles=2, warps_k=8, unroll=4)
        if base.check(m, n, k) is not None:
            base = default_config(m, n, k)
        else:
            rows_ok = True
    fb = max(1, min(16 // base.warps_k, 4 // max(1, kb // 128)))
    while fb > 1 and fb * (kb // 32) > 16:
        fb //= 2
    cfg = dataclasses.replace(base, kind="fused", warps_n=1, fb_tiles=fb)
    rows = 8 * cfg.tiles
    tag = a0 is not None and a0 % rows == 0 and kb % rows == 0
    # run12/13: producer L2 prefetch 0.2-0.5 us faster at M = 1, 4, 8; run29 (three sweeps): K
    # interleaved across the warps 0.1 / 0.25 / 0.4 us faster at M = 1 / 4 / 8; run33: both
    # with tag at m_tile 16 (ki -0.1..+0.1 there; without ppf the m_tile-16 kernel is 3 us slower)
    if rows_ok or tag and cfg.m_tile == 16:
        cfg = dataclasses.replace(cfg, ppf=1, ki=1)
    if tag:
        cfg = dataclasses.replace(cfg, tag=1)
        nit = k // 32 // (cfg.warps_k * cfg.unroll)  # stream iterations per warp (7 at K = 7168)
        if cfg.m_tile == 8 and nit >= 5:
            # run40/run41 (four sweeps): the producers prefetch W_FB into L2 after stream
            # iteration NIT - 3, so the consumer blocks, which start as the producers retire,
            # find it there: 0.37-0.93 us faster at every M <= 8 than the defaults before (incl.
            # 6 consumer blocks at M <= 4); minb 3 holds it at 80 registers (86 uncapped)
            cfg = dataclasses.replace(cfg, fbpf=3, minb=3)
        if swap and n % 16 == 0 and cfg.tiles % 2 == 0:
            # run49 (two sweeps): weights as the mma A operand (no register moves, half the mma at
            # m_tile 8): m_tile 16 with one consumer pass 22.7-23.6 us at M = 9..16, 1.3-1.5 us
            # faster than the defaults before (two launches at 15, 16); the W_FB prefetch helps at
            # m_tile 8 (0.2-0.3 us at M = 4..8) and at M = 9 only, two passes are slower.
            # run50 (two sweeps): at m_tile 16 the launch bound minb 3 (76 -> 78 registers, same
            # instructions, another schedule) 0.7-1.1 us faster at M = 9, 12, 0.3-0.7 at 16.
            # run58/run59 (four sweeps): g1 stored as bf16x2 pairs (gst 1) 0.8-0.95 us faster at
            # M = 16, 0.3-0.45 at 14, 0-0.25 at 9, 12, 0-0.2 at m_tile 8 (gst 2 equal; out 4 columns per
            # thread (ost) no faster, the producers' pairs before out (tf, run60) slower: code of both
            # at commit 69e9694, removed)
            # run61 (two sweeps): at m_tile 16 only the first 3 of iteration 0's 4 K steps before
            # the PDL wait (pwu 3; 2 equal, 1 slower) 0.0-0.2 us faster at M = 9..16 (0.1-0.2 at 14,
            # 16); at m_tile 8 pwu 2 no faster
            return dataclasses.replace(cfg, swap=1, wl=2, fb_passes=1, minb=3, gst=1,
                                       pwu=3 if cfg.m_tile == 16 and cfg.unroll == 4 else 0)
        if cfg.m_tile == 16:
            # (no prepacked weight) run34/run35 chose 6 consumer blocks with two passes each, but
            # since run49 that kernel measures 26.2-28.5 us at M = 9..14 (23.9-24.7 in run48, same
            # 77 registers: another ptxas schedule). run53 (two sweeps): one pass with the launch
            # bound minb 3 23.6-24.5 us at M = 9..14, 0.3-1.2 faster than two launches (M = 15, 16
            # kept two launches until run59); two passes with minb 3 25.5-28.7.
            # run59 (two sweeps): g1 stored in 16-byte chunks (gst 2) 0.5-1.2 us faster at
            # M = 12..16, and at 15, 16 faster than two launches; gst 1 as with the swapped roles
            cfg = dataclasses.replace(cfg, minb=3, gst=1)
    return cfg


def default_config(m: int, n: int, k: int) -> Config:
    kd = kind_for(n, k)
    for bound, params in _DEFAULTS[kd]:
        if m <= bound:
            cfg = Config(kind=kd, m_tile=m_tile_for(m, kd), **params)
            if cfg.check(m, n, k) is None:
                return cfg
            break
    cands = configs_for(m, n, k, kind=kd) or configs_for(m, n, k)
    if not cands:
        raise ValueError(f"no skinny-GEMM config for M={m} N={n} K={k}")
    return cands[0]
