"""Default kernel configurations (pure Python, no GPU imports): plain tables, one reason a row.

The measurements behind each row are in the results ledger (results/kda_kernels.md, raw records
under results/data/kda_kernels/); the reasons here say what the row does and what it won, in one line.
"""

from __future__ import annotations

import dataclasses
import functools

from .config import Config, configs_for, kind_for, m_tile_for

__all__ = [
    "FUSED_MAX_M",
    "FUSED_TAG_MAX_M",
    "GEMM_DEFAULTS",
    "FUSED_STREAM_M8",
    "FUSED_SETTINGS",
    "default_config",
    "default_fused_config",
    "fused_is_default",
]

# kind -> [(largest M of the bucket, settings, reason)]; a row that cannot run the shape falls back
# to the first eligible configs_for candidate
GEMM_DEFAULTS: dict[str, list[tuple[int, dict, str]]] = {
    "split_n": [  # F_A/beta [M,7168] x [144,7168]^T
        (4, dict(rows=1, vec=2), "H200 sweep best at M <= 4"),
        (16, dict(rows=2, vec=4), "H200 sweep best at M = 5..16"),
    ],
    "split_k": [  # F_B [M,128] x [1536,128]^T
        (8, dict(tiles=2, warps_n=1, warps_k=4, unroll=1), "sweep best; one-warp blocks no better"),
        (16, dict(tiles=1, warps_n=2, warps_k=4, unroll=1), "sweep best at m_tile 16"),
    ],
    "stream": [  # QKVG / packed [M,7168] x [6144|6288,7168]^T
        (8, dict(tiles=1, warps_n=2, warps_k=8, unroll=4),
         "2 warps along N share x slices: 0.6-0.8 us faster than 1 x 8 warps"),
        (16, dict(tiles=2, warps_n=1, warps_k=8, unroll=4),
         "wk8/u4: fewer K steps in flight than u7, which lost 25-30% once PDL overlapped launches"),
    ],
}

# Without the tagged handoff the fused kernel is the default up to this M: above it (m_tile 16)
# the counter-handoff kernel was 2-3 us slower than two PDL-chained launches.
FUSED_MAX_M = 8
# With the tagged handoff it is the default at every M up to this one (g1 pair stores made it
# faster than two launches at M = 16 too).
FUSED_TAG_MAX_M = 16

# the fused kernel's streaming part at M <= 8 (its own sweep best at M = 8, not the stream row)
FUSED_STREAM_M8 = dict(kind="stream", m_tile=8, tiles=2, warps_k=8, unroll=4)


@dataclasses.dataclass(frozen=True)
class FusedCase:
    """What the fused defaults depend on, besides the geometry already chosen."""

    m8_geometry: bool  # the FUSED_STREAM_M8 geometry runs the shape
    m_tile: int
    unroll: int
    tagged: bool  # f_a's column and width are multiples of the producer tile (tagged handoff)
    prepacked: bool  # the caller holds the weight in A-fragment order and the tiles allow it
    stream_iterations: int  # K iterations per warp of the streaming part


# (applies when, settings, reason), applied top to bottom on the geometry's config
FUSED_SETTINGS: list[tuple[object, dict, str]] = [
    (lambda c: c.m8_geometry or c.tagged and c.m_tile == 16,
     dict(prefetch_producer_weights=True, interleave_k=True),
     "producers finish early (0.2-0.5 us at M <= 8); interleaved K 0.1-0.4 us; m_tile 16 needs it"),
    (lambda c: c.tagged, dict(tagged_handoff=True),
     "consumers spin on tagged f_a: no fence or counter round trip (0.4 us at M = 8)"),
    (lambda c: c.tagged and c.m_tile == 8 and c.stream_iterations >= 5,
     dict(prefetch_fb_l2=3, min_blocks_per_sm=3),
     "W_FB in L2 before the consumers start: 0.37-0.93 us at M <= 8; 3 blocks/SM keeps 80 regs"),
    (lambda c: c.tagged and c.prepacked,
     dict(weights_as_a=True, weight_layout=2, fb_passes=1, min_blocks_per_sm=3, g1_stores=1),
     "weights as mma A: no register moves, 1.3-1.5 us at M = 9..16; g1 pairs 0.3-0.95 us"),
    (lambda c: c.tagged and c.prepacked and c.m_tile == 16 and c.unroll == 4,
     dict(prologue_k_steps=3),
     "3 of 4 K steps before the PDL wait: 0.0-0.2 us at M = 9..16"),
    (lambda c: c.tagged and not c.prepacked and c.m_tile == 16,
     dict(min_blocks_per_sm=3, g1_stores=1),
     "one consumer pass at 3 blocks/SM and g1 pairs: faster than two launches at M = 9..16"),
]


def default_config(m: int, n: int, k: int) -> Config:
    """The GEMM default for this shape (GEMM_DEFAULTS, else the first eligible candidate)."""
    kd = kind_for(n, k)
    for bound, params, _reason in GEMM_DEFAULTS[kd]:
        if m <= bound:
            cfg = Config(kind=kd, m_tile=m_tile_for(m, kd), **params)
            if cfg.check(m, n, k) is None:
                return cfg
            break
    cands = configs_for(m, n, k, kind=kd) or configs_for(m, n, k)
    if not cands:
        raise ValueError(f"no skinny-GEMM config for M={m} N={n} K={k}")
    return cands[0]


def _fb_tiles(warps_k: int, kb: int) -> int:
    # 16 n8 tiles of F_B per consumer block, at most 64 weight registers per lane
    fb = max(1, min(16 // warps_k, 4 // max(1, kb // 128)))
    while fb > 1 and fb * (kb // 32) > 16:
        fb //= 2
    return fb


@functools.lru_cache(maxsize=512)  # kda_fused_step asks on every eager call; Config is frozen
def default_fused_config(m: int, n: int, k: int, kb: int = 128, a0: int | None = None,
                         prepacked: bool = False) -> Config:
    """The fused whole-step default: the streaming geometry (FUSED_STREAM_M8 at M <= 8, else the
    stream default), then the FUSED_SETTINGS rows that apply. a0: f_a's first column (None:
    unknown, counter handoff). prepacked: the caller also holds the weight as tile_weights(w, 2).
    Without the tagged handoff, M > FUSED_MAX_M gets this config only when passed explicitly
    (see fused_is_default)."""
    base = default_config(m, n, k)
    if base.kind != "stream":
        raise ValueError(f"no fused config for N={n} K={k} (kind {base.kind})")
    m8 = False
    if m <= 8:
        cand = Config(**FUSED_STREAM_M8)
        if cand.check(m, n, k) is None:
            base, m8 = cand, True
    cfg = dataclasses.replace(base, kind="fused", warps_n=1, fb_tiles=_fb_tiles(base.warps_k, kb))
    rows = 8 * cfg.tiles
    tagged = a0 is not None and a0 % rows == 0 and kb % rows == 0
    case = FusedCase(m8_geometry=m8, m_tile=cfg.m_tile, unroll=cfg.unroll, tagged=tagged,
                     prepacked=prepacked and n % 16 == 0 and cfg.tiles % 2 == 0,
                     stream_iterations=k // 32 // (cfg.warps_k * cfg.unroll))
    for applies, settings, _reason in FUSED_SETTINGS:
        if applies(case):
            cfg = dataclasses.replace(cfg, **settings)
    return cfg


def fused_is_default(cfg: Config, m: int) -> bool:
    """Whether kda_fused_step runs the default fused config `cfg` at M = m (else two launches).
    With the weights as the mma A operand the fused kernel wins at every M."""
    return m <= FUSED_MAX_M or cfg.tagged_handoff and (m <= FUSED_TAG_MAX_M or cfg.weights_as_a)
