"""Configurations of the fp8 skinny GEMM and its exact fp8 -> f16 word conversion (pure Python).

Shared by the launcher (fp8.py), the lane and warpgroup programs (fp8_lane.py, fp8_wg.py,
fp8_wgr.py), the kernel builder (fp8_kernels.py) and the sweeps (fp8_sweeps.py), so none of them
imports another's module for these names.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from .fp8_defaults import MEASURED, MEASURED_TENSOR
from .fp8_defaults import SMS as MEASURED_SMS

BLOCK = 128  # K block of the scales (and of the kernel's K walk), N block of the weight scales
FP8_MAX_M = 16
SMS = 132  # H200 / H100 SXM streaming multiprocessors (config heuristics only)
SMEM_PER_BLOCK = 227 * 1024  # sm_90: the most shared memory one block may use
SMEM_PER_SM = 228 * 1024  # sm_90: shared memory of one SM, 1 KiB of it reserved per resident block
BULK_PAD = 64  # bytes between the rows of a bulk stage: rows g and g + 1 start 64 bytes apart
# modulo 128, so the 8 lanes of one phase of a 16-byte shared load hit 32 distinct banks
SCALE_A_KINDS = ("tensor", "row", "block")
SCALE_B_KINDS = ("tensor", "col", "block")
_A_CODE = {"tensor": 0, "row": 1, "block": 2}
_B_CODE = {"tensor": 0, "col": 1, "row": 1, "block": 2}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fp8Config:
    """One kernel variant. A warp owns ``tiles`` n8 tiles (8 weight rows each) and a share of K;
    a block is ``warps_n`` x ``warps_k`` warps (shared-memory reduction over warps_k). With
    ``wg`` a warpgroup of 4 warps takes a warp's place: its 8 * tiles rows are the wgmma N,
    ``warps_k`` counts warpgroups and ``bulk`` (2..8) is its ring's stages. With ``wgr`` a
    warpgroup owns 64 rows (the wgmma M) over ``unroll`` K blocks, ``depth`` of them loaded
    before the PDL wait, and ``ks`` blocks of a cluster split K further."""

    m_tile: int = 16  # token rows per mma (8 or 16); runtime M <= m_tile
    tiles: int = 2  # n8 tiles per warp: 1, 2 or 4, with wg also 8 (rows stay inside one 128-row block)
    warps_n: int = 1  # warps side by side along N
    warps_k: int = 4  # warps splitting K (whole 128-wide blocks each)
    unroll: int = 1  # 128-wide K blocks per warp iteration (loaded one iteration ahead)
    ki: int = 1  # 1: iteration it of warp wk reads K blocks (it * warps_k + wk) * unroll + u
    hw: int = 2  # words (of 4 per 16-byte vector) converted by the hardware cvt, the rest by integer ops
    minb: int = 0  # launch bound: minimum resident blocks per SM asked of ptxas (0 = none)
    pdl: bool = True
    depth: int = 1  # iterations of weights in flight: iteration it + depth is loaded before it is used
    bulk: int = 0  # >= 1: weights stream through a per-warp ring of this many stages in shared
    # memory, filled by bulk copies (the TMA unit, one per weight row) completing on mbarriers;
    # 0: loaded straight into registers
    xahead: int = 1  # iterations ahead that x and the activation (ring: and weight) scales are loaded
    l2pre: int = 0  # > 0: before the PDL wait the block also prefetches into L2 the weights of its
    # iterations up to this one (past the depth / S it loads then), so a block that became
    # resident beside the previous kernel's streams its weights during that kernel's tail
    early: bool = False  # PDL: let the next kernel launch at this one's start instead of after
    # its wait (the next one's wait still waits for this grid to complete): its blocks are then
    # resident, loading their weights, during all of this kernel (no effect without pdl)
    wg: bool = False  # warpgroup kernel (fp8_wg.py): wgmma on fp8 operands, no conversion,
    # from registers (x) and shared memory (the weights, through a cp.async ring of `bulk`
    # stages); warps_k counts warpgroups of 128 threads, tiles * 8 weight rows are the wgmma N
    wgr: bool = False  # register-weights warpgroup kernel (fp8_wgr.py): wgmma with 64 weight rows
    # from registers as A and x from shared memory as B (N = m_tile); warps_k warpgroups split K,
    # each over `unroll` K blocks (warps_k * unroll * ks = K / 128), `depth` K blocks of weights
    # in flight
    ks: int = 1  # wgr: blocks of a thread-block cluster splitting K (1, 2, 4 or 8), reduced through
    # distributed shared memory; warps_k * unroll * ks = K / 128
    timeline: bool = False  # diagnostics: each block stamps %globaltimer at its start, when its
    # weights are issued, past the PDL wait and at its end (gemm_fp8's `timeline` buffer)

    def bulk_row_bytes(self) -> int:
        """Shared-memory bytes per weight row of a bulk stage (unroll K blocks and the pad)."""
        return self.unroll * BLOCK + BULK_PAD

    def bulk_stage_bytes(self) -> int:
        return 8 * self.tiles * self.bulk_row_bytes()

    def wg_x_row_bytes(self) -> int:
        """wg: shared-memory bytes per x row of a stage, unroll K blocks and 16 more, so lanes
        (g, t) reading 4 bytes at g * row + 4t hit 32 distinct banks."""
        return self.unroll * BLOCK + 16

    def wg_stage_bytes(self) -> int:
        """wg: a stage, 8 * tiles weight rows x unroll K blocks, then m_tile x rows (padded to
        128 bytes)."""
        return 8 * self.tiles * self.unroll * BLOCK + _cdiv(self.m_tile * self.wg_x_row_bytes(), 128) * 128

    def wgr_x_bytes(self) -> int:
        """wgr: one warpgroup's staged x, m_tile tokens x its unroll K blocks."""
        return self.m_tile * self.unroll * BLOCK

    def smem_bytes(self) -> int:
        """Shared memory per block: the bulk rings with their mbarriers (with wg: the rings of
        its warpgroups, each stage its weights and x rows; with wgr: each warpgroup's x) and
        the warps_k reduction."""
        warps = self.warps_n * self.warps_k
        if self.wgr:
            red = 4 * self.warps_k * 64 * self.m_tile if self.warps_k > 1 or self.ks > 1 else 0
            return self.warps_k * self.wgr_x_bytes() + red + (4 * 64 * self.m_tile if self.ks > 1 else 0)
        if self.wg:
            ring = self.warps_k * self.bulk * self.wg_stage_bytes()
        else:
            ring = warps * self.bulk * (self.bulk_stage_bytes() + 8) if self.bulk else 0
        red = 4 * warps * self.tiles * self.m_tile * 8 if self.warps_k > 1 else 0
        red *= 2 if self.wg else 1  # wg: a second half for the warps without token rows
        return ring + red

    def key(self) -> str:
        wn = f"_wn{self.warps_n}" if self.warps_n != 1 else ""
        mb = f"_mb{self.minb}" if self.minb else ""
        d = f"_d{self.depth}" if self.depth != 1 else ""
        d += f"_b{self.bulk}" if self.bulk else ""
        d += f"_x{self.xahead}" if self.xahead != 1 else ""
        d += f"_p{self.l2pre}" if self.l2pre else ""
        d += "_e" if self.early else ""
        d += "_wg" if self.wg else ""
        d += "_wgr" if self.wgr else ""
        d += f"_ks{self.ks}" if self.ks != 1 else ""
        d += "_tl" if self.timeline else ""
        return (f"fp8_m{self.m_tile}_t{self.tiles}{wn}_wk{self.warps_k}_u{self.unroll}_ki{self.ki}"
                f"_hw{self.hw}{mb}{d}_pdl{int(self.pdl)}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Fp8Config:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown Fp8Config fields {sorted(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def threads(self) -> int:
        return (128 if self.wg or self.wgr else 32) * self.warps_n * self.warps_k

    def rows_per_block(self) -> int:
        return 64 if self.wgr else 8 * self.tiles * self.warps_n

    def grid(self, n: int) -> int:
        return _cdiv(n, self.rows_per_block()) * self.ks

    def iterations(self, k: int) -> int:
        """Loop iterations per warp (K blocks / (warps_k * unroll))."""
        return k // BLOCK // (self.warps_k * self.unroll)

    def loaded_first(self, k: int) -> int:
        """Iterations of weights loaded before the PDL wait (registers: depth; ring: its S stages;
        wgr: K blocks, depth of its unroll)."""
        if self.wgr:
            return min(self.depth, self.unroll)
        return min(self.bulk if self.bulk else self.depth, self.iterations(k))

    def check(self, m: int, n: int, k: int) -> str | None:
        """None if this config runs the shape, else the reason."""
        if self.m_tile not in (8, 16):
            return f"m_tile must be 8 or 16, got {self.m_tile}"
        if not 1 <= m <= self.m_tile:
            return f"M={m} outside 1..m_tile={self.m_tile}"
        if n < 1:
            return f"N={n} must be positive"
        if k < BLOCK or k % BLOCK:
            return f"K={k} must be a positive multiple of {BLOCK} (the kernel walks 128-wide K blocks)"
        if self.tiles not in ((1, 2, 4, 8) if self.wg else (1, 2, 4)):
            return ("tiles must be 1, 2 or 4 (with wg also 8): a warp's or warpgroup's rows then lie "
                    "in one 128-row scale block")
        if self.warps_n < 1 or self.warps_k < 1 or self.unroll < 1:
            return "warps_n, warps_k and unroll must be positive"
        kb = k // BLOCK
        if kb % (self.warps_k * self.unroll):
            return f"K/128={kb} not divisible by warps_k*unroll={self.warps_k * self.unroll}"
        if self.threads() > 1024:
            return f"{self.threads()} threads per block > 1024"
        if self.ki not in (0, 1) or not 0 <= self.hw <= 4:
            return "ki is 0/1, hw is 0..4"
        if self.ks != 1 and not self.wgr:
            return "ks (a cluster along K) needs wgr"
        if self.wgr:
            why = _wgr_fields_ok(self, k)
            if why:
                return why
        elif not 1 <= self.depth <= 4:
            return "depth (iterations of weights in flight) is 1..4"
        if self.minb < 0 or self.minb * self.threads() > 2048:
            return "minb * threads must be <= 2048"
        if not 1 <= self.xahead <= 4:
            return "xahead (iterations of activations in flight) is 1..4"
        if self.wg:
            why = _wg_fields_ok(self)
            if why:
                return why
        if self.bulk and not (1 <= self.bulk <= 8 and self.depth == 1):
            return "bulk is 0 or 1..8 stages (the ring replaces depth, which stays 1)"
        if self.l2pre and not self.loaded_first(k) < self.l2pre <= self.iterations(k):
            return (f"l2pre {self.l2pre} must be 0 or past the {self.loaded_first(k)} iterations loaded "
                    f"before the PDL wait and at most the {self.iterations(k)} iterations per warp")
        smem = self.smem_bytes()
        if smem > SMEM_PER_BLOCK or (smem + 1024) * max(self.minb, 1) > SMEM_PER_SM:
            return (f"{smem} bytes of shared memory per block (+ 1 KiB reserved) x "
                    f"{max(self.minb, 1)} blocks > {SMEM_PER_SM} per SM (or > {SMEM_PER_BLOCK} per block)")
        return None


def _wg_fields_ok(cfg: Fp8Config) -> str | None:
    if cfg.warps_n != 1:
        return "wg: warps_n is 1 (a warpgroup's N is 8 * tiles)"
    if not 2 <= cfg.bulk <= 8 or cfg.depth != 1 or cfg.hw != 4 or cfg.l2pre:
        return "wg: bulk (stages) is 2..8; depth 1, hw 4 and l2pre 0 (unused there)"
    # ptxas allocates registers in units of 8
    regs, cap = wg_registers(cfg), min(255, 65536 // (cfg.threads() * max(cfg.minb, 1)) // 8 * 8)
    if regs > cap:
        return (f"wg: about {regs} registers a thread (partials of two iterations, the "
                f"accumulator, x fragments of two iterations) exceed what {cfg.threads()} threads "
                f"x {max(cfg.minb, 1)} blocks per SM may hold ({cap}); below it ptxas spills and "
                "serializes the wgmma")
    return None


def _wgr_fields_ok(cfg: Fp8Config, k: int) -> str | None:
    if cfg.wg or cfg.warps_n != 1 or cfg.tiles != 1 or cfg.bulk or cfg.l2pre or cfg.xahead != 1:
        return "wgr: not with wg, bulk or l2pre; warps_n, tiles and xahead are 1 (a warpgroup is 64 rows)"
    if cfg.ks not in (1, 2, 4, 8):
        return f"wgr: ks (blocks of a cluster along K) is 1, 2, 4 or 8, got {cfg.ks}"
    if k // BLOCK != cfg.warps_k * cfg.unroll * cfg.ks:
        return (f"wgr: warps_k * unroll * ks = {cfg.warps_k * cfg.unroll * cfg.ks} must be K/128 = "
                f"{k // BLOCK} (one pass)")
    if cfg.unroll > 16:
        # threads over 18 or more K blocks spilled at depth 8 (ptxas, sm_90a, m_tile 16)
        return f"wgr: unroll (K blocks of a warpgroup) is at most 16, got {cfg.unroll}: split K wider"
    if not min(2, cfg.unroll) <= cfg.depth <= min(cfg.unroll, 8):
        # block j's weights are loaded into the registers block j - depth + 1 freed, once its
        # wgmma are waited for after block j's are issued: one block ahead at least
        return (f"wgr: depth (K blocks of weights in flight) is {min(2, cfg.unroll)}.."
                f"{min(cfg.unroll, 8)} (at most unroll and 8: deeper spilled at large unrolls)")
    if cfg.minb and cfg.threads() * cfg.minb > 256:
        # below 255 registers a thread ptxas spilled these (launch bounds of 2 x 256 threads)
        return "wgr: a launch bound (minb) only with minb * threads <= 256"
    regs, cap = wgr_registers(cfg), min(255, 65536 // (cfg.threads() * max(cfg.minb, 1)) // 8 * 8)
    if regs > cap - 8:
        return (f"wgr: about {regs} registers a thread (16 per K block of weights in flight, the "
                f"accumulator and two partials) exceed what {cfg.threads()} threads x "
                f"{max(cfg.minb, 1)} blocks per SM may hold ({cap}) less 8 of margin")
    return None


def wgr_registers(cfg: Fp8Config) -> int:
    """Registers a thread of the register-weights warpgroup kernel needs, about: 16 per K block
    of weights in flight, the accumulator and two partials (m_tile / 2 each), the activation
    scales of three K blocks (m_tile / 4 each), 40 for addresses, one per 2 K blocks of the
    thread's range (the x staging's loads) and 8 more under a launch bound. Calibrated against
    ptxas (sm_90a) over the sweep's candidates: ones above it less 8 spilled (up to 67 stores)."""
    return (16 * min(cfg.depth, cfg.unroll) + 3 * cfg.m_tile // 2 + 3 * cfg.m_tile // 4 + 40
            + cfg.unroll // 2 + (8 if cfg.minb else 0))


def wg_registers(cfg: Fp8Config) -> int:
    """Registers a thread of the warpgroup kernel needs, about: fp32 partials of two iterations
    (4 * tiles per K block), the accumulator, the A fragments of two iterations (16 per K block)
    and 56 for addresses and scales (ptxas spilled at 128 where this said 120 with 40)."""
    return 4 * cfg.tiles * (2 * cfg.unroll + 1) + 32 * cfg.unroll + 56


def scale_kind(scale_shape, rows: int, k: int, operand: str) -> str:
    """Kind of a scale tensor of shape ``scale_shape`` for an operand with ``rows`` rows and K = k
    ("a": x [M, K], "b": w [N, K]). Shapes that fit two kinds (M = 1, or K = 128) mean the same
    scaling either way. Raises ValueError naming the expected shapes."""
    shape = tuple(int(s) for s in scale_shape)
    numel = 1
    for s in shape:
        numel *= s
    kb = _cdiv(k, BLOCK)
    if numel == 1 and len(shape) <= 2:
        return "tensor"
    if operand == "a":
        if shape in ((rows, 1), (rows,)):
            return "row"
        if shape == (rows, kb):
            return "block"
        want = f"() or [1] (tensor), [{rows}, 1] (row) or [{rows}, {kb}] (1x128 blocks)"
    else:
        if shape in ((rows, 1), (rows,)):
            return "col"
        if shape == (_cdiv(rows, BLOCK), kb):
            return "block"
        want = (f"() or [1] (tensor), [{rows}, 1] (per column) or [{_cdiv(rows, BLOCK)}, {kb}] "
                "(128x128 blocks)")
    raise ValueError(f"scale_{operand} shape {list(shape)} fits none of {want}")


def wk_choices(kb: int, unroll: int, limit: int) -> list[int]:
    return [w for w in range(1, min(limit, 32) + 1) if kb % (w * unroll) == 0]


def default_fp8_config(m: int, n: int, k: int, sms: int = SMS, table: dict | None = None,
                       kinds: tuple[str, str] | None = None) -> Fp8Config:
    """The measured best for this shape and M bucket where fp8_defaults lists one (`table`
    overrides that table; {} means none), else heuristic_fp8_config. With per-tensor scales on
    both operands (kinds ("tensor", "tensor")) a row measured with them (MEASURED_TENSOR) comes
    first: the same config can need a few registers more there than with block scales, enough
    for a second wave of blocks at some shapes."""
    mt = 8 if m <= 8 else 16
    if table is None and kinds == ("tensor", "tensor"):
        cfg = _table_hit(MEASURED_TENSOR, m, n, k, mt, sms == MEASURED_SMS)
        if cfg is not None:
            return cfg
    cfg = _table_hit(MEASURED if table is None else table, m, n, k, mt, sms == MEASURED_SMS or table is not None)
    return cfg if cfg is not None else heuristic_fp8_config(m, n, k, sms)


def _table_hit(rows: dict, m: int, n: int, k: int, mt: int, same_device: bool) -> Fp8Config | None:
    hit = rows.get((n, k, mt)) if same_device else None
    if hit is not None:
        cfg = Fp8Config.from_dict(hit)
        if cfg.m_tile == mt and cfg.check(m, n, k) is None:
            return cfg
    return None


def heuristic_fp8_config(m: int, n: int, k: int, sms: int = SMS) -> Fp8Config:
    """Config by shape (H200 heuristics, for shapes the measured table lacks): all conversions by
    the hardware cvt; 16 weight rows per warp where N gives
    every SM two warps' worth of tiles, else 8; warps along K so the grid holds about 16 warps per
    SM (up to 28 per block when there are fewer blocks than SMs); one K block per iteration; no
    launch bound (with one, ptxas raised registers to the cap and spilled at several of the
    DeepSeek-V3 shapes; without, 45-92 registers and every default grid fits on the GPU at once,
    checked in tests/test_cute_fp8.py)."""
    mt = 8 if m <= 8 else 16
    if n < 1 or k < BLOCK or k % BLOCK:
        raise ValueError(f"no fp8 config for N={n} K={k}: K must be a positive multiple of {BLOCK}")
    nt = _cdiv(n, 8)
    tiles = 2 if nt >= 2 * sms else 1
    blocks = _cdiv(nt, tiles)
    kb = k // BLOCK
    target = max(1, (16 * sms) // blocks)  # warps per block for ~16 warps per SM
    cap = 32 if blocks < sms else 16
    wk = max(wk_choices(kb, 1, min(target, cap)) or [1])
    # every conversion by the hardware cvt: the grid sweep's best at 17 of its 20 (shape, bucket)
    # rows (results/data/fp8_gemm/2026-12-01T1416_*), 8-30 % faster than hw 2 at the large shapes
    return Fp8Config(m_tile=mt, tiles=tiles, warps_k=wk, unroll=1, hw=4)


def blocks_per_sm(cfg: Fp8Config, regs: int | None = None) -> int:
    """Blocks of a config one SM holds by shared memory (1 KiB reserved per block), threads and
    the 32-block cap, and by registers when `regs` (per thread, allocated in units of 8) is
    known from the compiled kernel."""
    n = min(SMEM_PER_SM // (cfg.smem_bytes() + 1024), 2048 // cfg.threads(), 32)
    if regs is not None:
        n = min(n, 65536 // (-(-regs // 8) * 8 * cfg.threads()))
    return max(0, n)


def resident_per_sm(cfg: Fp8Config, n: int, sms: int = SMS, regs: int | None = None) -> int:
    """Blocks of this grid on the busiest SM while all that fit are resident: the grid's share
    of an SM, at most what one SM holds (blocks_per_sm)."""
    return min(blocks_per_sm(cfg, regs), _cdiv(cfg.grid(n), sms))


# --------------------------------------------------------------------------------------
# conversion
# --------------------------------------------------------------------------------------
# Integer e4m3 -> f16 conversion of one 32-bit word (bytes b0..b3, b0 lowest), 2^-8 times the
# value, exact for every finite e4m3 input (subnormals included): an e4m3 byte s.eeee.mmm placed
# as f16 bits s.0eeee.mmm0000000 is the same significand with the exponent bias 15 instead of 7.
# Odd bytes (b1, b3) already sit in the high byte of each 16-bit half; even bytes are moved there.
# One program, rendered as the kernel's PTX (bits_ptx) and interpreted by bits_words (tests).
BITS_SIGN = 0x80008000
BITS_MAG = 0x3F803F80
BITS_PROGRAM = (  # (op, dst, src, immediate); q = input word, d0 / d1 = the two f16x2 outputs
    ("shl", "m", "q", 7), ("and", "m", "m", BITS_MAG),
    ("shl", "s", "q", 8), ("and", "s", "s", BITS_SIGN), ("or", "d0", "m", "s"),
    ("shr", "m", "q", 1), ("and", "m", "m", BITS_MAG),
    ("and", "s", "q", BITS_SIGN), ("or", "d1", "m", "s"),
)


def bits_ptx() -> str:
    """BITS_PROGRAM as the body of an inline-asm block ($0, $1 = d0, d1; $2 = q)."""
    reg = {"q": "$2", "d0": "$0", "d1": "$1", "m": "m", "s": "s"}
    lines = ["{", ".reg .b32 m, s;"]
    for op, dst, src, imm in BITS_PROGRAM:
        arg = reg[imm] if isinstance(imm, str) else (f"{imm:#x}" if imm > 31 else str(imm))
        lines.append(f"{op}.b32 {reg[dst]}, {reg[src]}, {arg};")
    return "\n\t".join(lines + ["}"])


def bits_words(q):
    """Interpret BITS_PROGRAM on q (an int or a numpy uint32/int64 array): (d0, d1) =
    (f16x2 of (b0, b2), f16x2 of (b1, b3)), low half first."""
    r = {"q": q & 0xFFFFFFFF}
    for op, dst, src, imm in BITS_PROGRAM:
        a = r[src]
        b = r[imm] if isinstance(imm, str) else imm
        if op == "shl":
            v = a << b
        elif op == "shr":
            v = a >> b
        elif op == "and":
            v = a & b
        else:
            v = a | b
        r[dst] = v & 0xFFFFFFFF
    return r["d0"], r["d1"]


def word_byte_order(method: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """Which bytes of a word land in (register 0 low/high half, register 1 low/high half):
    "hw" per the PTX ISA for cvt.rn.f16x2.e4m3x2 (low byte to the low half), "bits" per
    BITS_PROGRAM. Correctness does not depend on it: x and the weights use the same method for
    the same word, so they see the same permutation."""
    return ((0, 2), (1, 3)) if method == "bits" else ((0, 1), (2, 3))
