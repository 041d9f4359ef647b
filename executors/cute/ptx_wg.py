"""Inline-PTX operations of the warpgroup fp8 GEMMs (Fp8Config.wg / wgr; imports cutlass: load
lazily): 16-byte cp.async copies into shared memory with their commit groups, the async-proxy
fence, a named barrier per warpgroup, 4-byte shared-memory loads and stores, the cluster barrier
and distributed shared-memory loads, shared-memory matrix descriptors and wgmma
(fp8 e4m3 x e4m3, fp32 accumulate, A from registers, B from shared memory) with its fence,
commit and wait."""

from __future__ import annotations

from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .fp8_wg import DESC_START_MASK
from .ptx import _asm, _below


@dsl_user_op
def cp_async16(dst: Int32, src: Int64, idx: Int32, limit: int, *, loc=None, ip=None):
    """If idx < limit: copy 16 bytes global -> shared (L2 only, 256-byte L2 prefetch)."""
    _asm(_below("$2", limit, "cp.async.cg.shared.global.L2::256B [$0], [$1], 16;"), "r,l,r",
         [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip),
          Int32(idx).ir_value(loc=loc, ip=ip)])


@dsl_user_op
def cp_commit(*, loc=None, ip=None):
    _asm("cp.async.commit_group;", "", [])


@dsl_user_op
def cp_wait(n: int, *, loc=None, ip=None):
    """Wait until at most n of this thread's newest cp.async groups are pending."""
    _asm(f"cp.async.wait_group {int(n)};", "", [])


@dsl_user_op
def fence_async(*, loc=None, ip=None):
    """Make this thread's shared-memory writes visible to the async proxy (wgmma's reads)."""
    _asm("fence.proxy.async.shared::cta;", "", [])


@dsl_user_op
def bar_wg(bar_id: Int32, *, loc=None, ip=None):
    """Named barrier `bar_id` over the 128 threads of one warpgroup."""
    _asm("bar.sync $0, 128;", "r", [Int32(bar_id).ir_value(loc=loc, ip=ip)])


@dsl_user_op
def wg_fence(*, loc=None, ip=None):
    _asm("wgmma.fence.sync.aligned;", "", [])


@dsl_user_op
def wg_commit(*, loc=None, ip=None):
    _asm("wgmma.commit_group.sync.aligned;", "", [])


@dsl_user_op
def wg_wait(n: int, *, loc=None, ip=None):
    _asm(f"wgmma.wait_group.sync.aligned {int(n)};", "", [])


@dsl_user_op
def make_desc(addr: Int32, bits: int, *, loc=None, ip=None):
    """Descriptor of the shared-memory matrix at `addr` (16-byte aligned) with the constant
    `bits` of fp8_wg.desc_bits."""
    start = Int64((Int32(addr) >> 4) & Int32(DESC_START_MASK))
    return start | Int64(bits)


@dsl_user_op
def keep_regs(vals, *, loc=None, ip=None):
    """An empty volatile asm reading these 32-bit values: their registers stay allocated (not
    reused for later loads) until this point, past the wgmma wait that ends their reads."""
    _asm("", ",".join(["r"] * len(vals)), [Int32(v).ir_value(loc=loc, ip=ip) for v in vals])


@dsl_user_op
def pass_regs(vals, *, loc=None, ip=None):
    """Copies of the 32-bit values made by a volatile asm (its movs stay where it is in program
    order). After the PDL wait it makes the register copies that gather weight words into a
    wgmma A fragment there, instead of above griddepcontrol.wait, where ptxas put them and
    where they wait for the loads to land."""
    n = len(vals)
    text = "\n\t".join(f"mov.b32 ${i}, ${n + i};" for i in range(n))
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * n),
        [Int32(v).ir_value(loc=loc, ip=ip) for v in vals], text,
        ",".join(["=r"] * n + ["r"] * n), has_side_effects=True,
        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return [Int32(llvm.extractvalue(T.i32(), res, [i])) for i in range(n)]


@dsl_user_op
def fence_regs(vals, *, loc=None, ip=None):
    """The fp32 values through an empty volatile asm: uses of the results stay after the
    wgmma wait before it (the compiler cannot hoist them above it)."""
    n = len(vals)
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * n),
        [Float32(v).ir_value(loc=loc, ip=ip) for v in vals], "",
        ",".join(["=f"] * n + [str(i) for i in range(n)]), has_side_effects=True,
        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return [Float32(llvm.extractvalue(T.f32(), res, [i])) for i in range(n)]


@dsl_user_op
def ld_smem32(addr: Int32, *, loc=None, ip=None):
    """4-byte shared-memory load."""
    return Int32(llvm.inline_asm(T.i32(), [Int32(addr).ir_value(loc=loc, ip=ip)],
                                 "ld.shared.b32 $0, [$1];", "=r,r", has_side_effects=True,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def st_smem32(addr: Int32, val: Int32, *, loc=None, ip=None):
    """4-byte shared-memory store (the register-weights kernel's staging of x)."""
    _asm("st.shared.b32 [$0], $1;", "r,r", [Int32(addr).ir_value(loc=loc, ip=ip), Int32(val).ir_value(loc=loc, ip=ip)])


@dsl_user_op
def cluster_sync(*, loc=None, ip=None):
    """Every thread of the cluster's blocks arrives (release) and waits (acquire): shared-memory
    writes before it are visible to the cluster's reads after it."""
    cluster_arrive(loc=loc, ip=ip)
    cluster_wait(loc=loc, ip=ip)


@dsl_user_op
def cluster_arrive(*, loc=None, ip=None):
    """This thread arrives at the cluster barrier (release: its earlier reads of other blocks'
    shared memory are done); cluster_wait completes the phase."""
    _asm("barrier.cluster.arrive.release.aligned;", "", [])


@dsl_user_op
def cluster_wait(*, loc=None, ip=None):
    _asm("barrier.cluster.wait.acquire.aligned;", "", [])


@dsl_user_op
def ld_cluster_f32(addr: Int32, rank: Int32, *, loc=None, ip=None):
    """The fp32 at shared address `addr` of the cluster's block `rank` (distributed shared memory)."""
    return Float32(llvm.inline_asm(
        T.f32(), [Int32(addr).ir_value(loc=loc, ip=ip), Int32(rank).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 a;\n\tmapa.shared::cluster.u32 a, $1, $2;\n\tld.shared::cluster.f32 $0, [a];\n\t}",
        "=f,r,r", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def wgmma_e4m3(a, desc_b: Int64, d, fresh: bool, *, loc=None, ip=None):
    """D[64, N] (+)= A[64, 32] . B[N, 32]^T, e4m3: A from 4 registers per thread (the m16 x k32
    fragment of each warp's 16 rows), B from shared memory (K-major descriptor); fp32 D in N / 2
    registers per thread (N = 2 * len(d)). fresh: D is only written (scale-d 0), so `d` is not
    an input at all (a zero copied into the accumulators inside the wgmma pipeline makes ptxas
    wait after every wgmma)."""
    nd = len(d)
    n = 2 * nd
    outs = ", ".join(f"${i}" for i in range(nd))
    text = ("{\n\t.reg .pred p;\n\t" f"setp.ne.b32 p, {0 if fresh else 1}, 0;\n\t"
            f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 "
            f"{{{outs}}}, {{${nd}, ${nd + 1}, ${nd + 2}, ${nd + 3}}}, ${nd + 4}, p, 1, 1;\n\t}}")
    ins = [Int32(v).ir_value(loc=loc, ip=ip) for v in a] + [Int64(desc_b).ir_value(loc=loc, ip=ip)]
    cons = ["=f"] * nd + ["r"] * 4 + ["l"]
    if not fresh:
        ins += [Float32(v).ir_value(loc=loc, ip=ip) for v in d]
        cons += [str(i) for i in range(nd)]
    res = llvm.inline_asm(llvm.StructType.get_literal([T.f32()] * nd), ins, text, ",".join(cons),
                          has_side_effects=True, is_align_stack=False,
                          asm_dialect=llvm.AsmDialect.AD_ATT)
    return [Float32(llvm.extractvalue(T.f32(), res, [i])) for i in range(nd)]
