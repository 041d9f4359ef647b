"""x through shared memory by TMA bulk copies (Config.xs, tensor-core kinds with ki = 1).

Why: in the streaming loop every lane loads its x fragment itself, one 128-bit load per x row
group (g, and g + 8 at m_tile 16) and K step; each such warp load touches 8 x rows, i.e. 8 L1
lines, and these requests queue in the SM next to the weight stream. At m_tile 16 forced to
M = 8, dropping the second x row load alone was 0.8 us per step (run50, diagnostic knob dx).
With xs, warp 0 of a block copies the block's x chunk of iteration it (rows 0..M-1, the
WK * U * 64 contiguous bytes per row that the block's warps read in that iteration when ki = 1)
into one of two shared-memory stages with one cp.async.bulk per row, completing on a
transaction-count mbarrier ("full"); the warps read their B (or A) fragments from there and
arrive on the stage's "empty" mbarrier when done, which warp 0 waits for before it refills
the stage two iterations later.

Shared memory: 2 stages x m_tile rows x (WK * U * 64 + 64) bytes; the 64-byte pad puts row
r + 1 16 banks away, so the 8 lanes of each quarter-warp (rows g, g + 1, 4 lanes each) read
without bank conflicts. Helpers here are traced (plain Python control flow); the predicated
parts are inside the PTX.
"""

from __future__ import annotations

from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

_LABELS = [0]  # unique PTX labels per emitted wait loop


def _label(stem: str) -> str:
    _LABELS[0] += 1
    return f"{stem}{_LABELS[0]}"


def _asm(text: str, ops, cons: str, res=None):
    return llvm.inline_asm(res, ops, text, cons, has_side_effects=True, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


def stage_bytes(cfg, rows: int | None = None) -> int:
    """Bytes of one x stage: rows (m_tile) x the block's per-iteration chunk plus the pad."""
    return (rows or cfg.m_tile) * row_bytes(cfg)


def row_bytes(cfg) -> int:
    return cfg.warps_k * cfg.unroll * 64 + 64


def smem_bytes(cfg) -> int:
    """Shared memory of the two x stages (the kernel's reduction buffer aliases them)."""
    return 2 * stage_bytes(cfg)


@dsl_user_op
def mbar_init_all(tid: Int32, bars: Int32, counts: tuple, *, loc=None, ip=None):
    """Thread 0 initialises the 8-byte mbarriers at bars, bars + 8, ... with `counts`
    arrivals, then fences them for the async proxy; the caller syncs the block after."""
    lines = ["{", ".reg .pred p;", "setp.eq.u32 p, $0, 0;"]
    for i, c in enumerate(counts):
        lines.append(f"@p mbarrier.init.shared::cta.b64 [$1+{8 * i}], {int(c)};")
    lines += ["@p fence.mbarrier_init.release.cluster;", "@p fence.proxy.async.shared::cta;", "}"]
    _asm("\n\t".join(lines), [Int32(tid).ir_value(loc=loc, ip=ip), Int32(bars).ir_value(loc=loc, ip=ip)],
         "r,r")


@dsl_user_op
def x_bulk_issue(tid: Int32, m_rows: Int32, xbuf: Int32, x_base: Int64, src_stride: Int64, bars: Int32,
                 dst_off: int, src_off: int, full_off: int, empty_off: int, parity: int, nbytes: int,
                 dst_stride: int, *, loc=None, ip=None):
    """Warp 0 (tid < 32): if parity >= 0, wait until the stage's readers released it (the
    mbarrier at bars + empty_off, phase `parity`); lane 0 arms bars + full_off with M * nbytes
    transaction bytes and arrives; lane r < M copies nbytes of x row r (from x_base + src_off +
    r * src_stride) to xbuf + dst_off + r * dst_stride. Offsets are immediates, so only the
    loop-invariant bases occupy registers."""
    lines = ["{", ".reg .pred w, p, q, e;", ".reg .u32 d, b, f;", ".reg .u64 s, o;",
             "setp.lt.u32 w, $0, 32;"]
    skip = _label("XSKIP")
    lines.append(f"@!w bra {skip};")
    if parity >= 0:
        wait = _label("XEMPTY")
        lines += [f"{wait}:", f"mbarrier.try_wait.parity.shared::cta.b64 e, [$5+{int(empty_off)}], {int(parity)};",
                  f"@!e bra {wait};"]
    lines += ["setp.eq.u32 q, $0, 0;", f"mul.lo.u32 b, $1, {int(nbytes)};",
              f"@q mbarrier.arrive.expect_tx.shared::cta.b64 _, [$5+{int(full_off)}], b;",
              "setp.lt.u32 p, $0, $1;", f"mad.lo.u32 d, $0, {int(dst_stride)}, $2;",
              f"add.u32 d, d, {int(dst_off)};", f"add.u32 f, $5, {int(full_off)};",
              "cvt.u64.u32 o, $0;", "mad.lo.u64 s, o, $4, $3;", f"add.u64 s, s, {int(src_off)};",
              f"@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d], [s], {int(nbytes)}, [f];",
              f"{skip}:", "}"]
    ops = [Int32(tid), Int32(m_rows), Int32(xbuf), Int64(x_base), Int64(src_stride), Int32(bars)]
    _asm("\n\t".join(lines), [v.ir_value(loc=loc, ip=ip) for v in ops], "r,r,r,l,l,r")


@dsl_user_op
def mbar_wait(bars: Int32, off: int, parity: int, *, loc=None, ip=None):
    """Spin until the phase of parity `parity` of the mbarrier at bars + off has completed."""
    lab = _label("XFULL")
    _asm("{\n\t.reg .pred p;\n\t" f"{lab}:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [$0+{int(off)}], "
         f"{int(parity)};\n\t@!p bra {lab};\n\t}}", [Int32(bars).ir_value(loc=loc, ip=ip)], "r")


@dsl_user_op
def mbar_arrive_warp(lane: Int32, bars: Int32, off: int, *, loc=None, ip=None):
    """One arrival per warp (lane 0) on the mbarrier at bars + off after the whole warp's earlier
    shared-memory reads (the warp barrier orders the other lanes' reads before lane 0's
    release-arrive)."""
    _asm("{\n\t.reg .pred q;\n\tbar.warp.sync 0xffffffff;\n\tsetp.eq.u32 q, $0, 0;\n\t"
         f"@q mbarrier.arrive.shared::cta.b64 _, [$1+{int(off)}];\n\t}}",
         [Int32(lane).ir_value(loc=loc, ip=ip), Int32(bars).ir_value(loc=loc, ip=ip)], "r,r")


@dsl_user_op
def ld_shared_v4(addr: Int32, off: int, *, loc=None, ip=None):
    res = _asm(f"ld.shared.v4.u32 {{$0, $1, $2, $3}}, [$4+{int(off)}];", [Int32(addr).ir_value(loc=loc, ip=ip)],
               "=r,=r,=r,=r,r", llvm.StructType.get_literal([T.i32()] * 4))
    return [Int32(llvm.extractvalue(T.i32(), res, [i])) for i in range(4)]


class XStage:
    """The x staging of one block (see the module docstring). Built inside a kernel body after
    the block's shared memory is allocated; `init` must be followed by a block barrier."""

    def __init__(self, cfg, xbuf: Int32, bars: Int32, tid, lane, wk, g, t, x_base, sx, m_rows,
                 imin):
        self.mt, self.u, self.warps = cfg.m_tile, cfg.unroll, cfg.warps_n * cfg.warps_k
        self.xr = row_bytes(cfg)
        self.chunk = cfg.warps_k * cfg.unroll * 64  # x bytes per row and iteration
        self.stage = stage_bytes(cfg)
        self.xbuf, self.bars, self.tid, self.lane = xbuf, bars, tid, lane
        self.x_base, self.sx2, self.m_rows = x_base, Int64(sx) * 2, m_rows
        col = wk * (cfg.unroll * 64) + t * 16  # this lane's bytes within a row's chunk
        # shared addresses of this lane's fragments in stage 0 (rows clamped to M - 1)
        self.addr_g = xbuf + imin(g, m_rows - 1) * self.xr + col
        self.addr_h = xbuf + imin(g + 8, m_rows - 1) * self.xr + col

    @staticmethod
    def full(s: int) -> int:  # byte offsets of the mbarriers from bars
        return 8 * s

    @staticmethod
    def empty(s: int) -> int:
        return 16 + 8 * s

    def init(self):
        mbar_init_all(self.tid, self.bars, (1, 1, self.warps, self.warps))  # full 0, 1, empty 0, 1

    def issue(self, j: int):
        """Warp 0 copies iteration j's chunk into stage j % 2 (after iteration j - 2's readers)."""
        s = j % 2
        par = ((j - 2) // 2) & 1 if j >= 2 else -1
        x_bulk_issue(self.tid, self.m_rows, self.xbuf, self.x_base, self.sx2, self.bars, s * self.stage,
                     j * self.chunk, self.full(s), self.empty(s), par, self.chunk, self.xr)

    def read(self, it: int):
        """Wait for iteration it's stage and return its U (row g, row g + 8) fragment pairs."""
        s = it % 2
        mbar_wait(self.bars, self.full(s), (it // 2) & 1)
        out = []
        for u in range(self.u):
            off = s * self.stage + u * 64
            xg = ld_shared_v4(self.addr_g, off)
            xh = ld_shared_v4(self.addr_h, off) if self.mt == 16 else [Int32(0)] * 4
            out.append((xg, xh))
        return out

    def release(self, it: int):
        mbar_arrive_warp(self.lane, self.bars, self.empty(it % 2))
