"""The Metal-emulation harness itself: it must catch what a GPU would get wrong.

A harness that passes everything proves nothing, so each test here plants a bug into a
shipped kernel (through the same launch code the candidates use) or runs a small kernel
that breaks a Metal rule, and checks the harness reports it: a missing barrier and an
off-by-one tail give wrong results or an out-of-bounds write, a pointer passed across
address spaces fails to compile, a barrier some threads never reach is a deadlock error,
and constructs the emulator does not model fail instead of running approximately.
Each planted bug is paired with the unmodified kernel on the same inputs (which passes),
so a failure is the bug's doing.
"""

from __future__ import annotations

import subprocess

import mlx.core as mx
import numpy as np
import pytest

import oracle
from metal_emu import harness
from mlx_w8a8.kernels import metal, sources


@pytest.fixture
def emulated():
    previous = metal.set_executor(harness.executor)
    try:
        with metal.override(metal=True, nax=False):
            yield
    finally:
        metal.set_executor(previous)


def plant(monkeypatch, file: str, old: str, new: str):
    """Make ``metal._kernel`` build ``file`` with ``old`` replaced by ``new`` (once);
    ``file`` ``"common.h"`` plants into the helpers every kernel is built with."""
    text = sources.read("metal", file)
    assert text.count(old) == 1, f"the planted bug's anchor {old!r} must occur once in {file}"
    real = metal._kernel
    common = sources.read("metal", "common.h")
    if file == "common.h":
        common = common.replace(old, new)

    def fake(f, body, inputs, outputs):
        if f != file and file != "common.h":
            return real(f, body, inputs, outputs)
        planted = text.replace(old, new) if f == file else sources.read("metal", f)
        header, bodies = sources.split(planted, "metal")
        return mx.fast.metal_kernel(
            name=f"w8a8_{body}_planted", input_names=list(inputs), output_names=list(outputs),
            source=bodies[body], header=common + header)

    monkeypatch.setattr(metal, "_kernel", fake)


def assert_caught(call, correct):
    """The planted bug is caught: ``call()`` raises an emulation error (a race between
    the two schedules, an out-of-bounds write) or returns a result ``correct`` rejects."""
    try:
        result = call()
    except harness.EmulationError as error:
        return str(error)
    assert not correct(result), "the planted bug went unnoticed"
    return "wrong result"


def kernel(source, inputs=("inp",), outputs=("out",), header=""):
    return mx.fast.metal_kernel(name="probe", input_names=list(inputs), output_names=list(outputs),
                                source=source, header=header)


def run(k, inputs, out_shape, out_dtype, grid, tg, template=None):
    return harness.executor(k, inputs=inputs, output_shapes=[out_shape], output_dtypes=[out_dtype],
                            grid=grid, threadgroup=tg, template=template)[0]


# ---------------------------------------------------------------------------------------
# Planted bugs in the shipped kernels
# ---------------------------------------------------------------------------------------
BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);"


def test_missing_barrier_in_quantize_is_caught(emulated, rng, monkeypatch):
    """Without the barrier, thread 0 reads the other SIMD-groups' partial max before
    they are written (poisoned threadgroup memory), so scales come out wrong."""
    x = rng.standard_normal((9, 300)).astype(np.float32)
    want_q, want_scale = oracle.quantize_rows(x)
    _, scale, _ = metal.quantize(mx.array(x))
    np.testing.assert_array_equal(np.array(scale), want_scale)  # intact kernel: right
    plant(monkeypatch, "quantize.metal", BARRIER, "/* barrier removed */")
    assert_caught(lambda: metal.quantize(mx.array(x))[1],
                  lambda scale: np.array_equal(np.array(scale), want_scale, equal_nan=True))


def test_missing_staging_barrier_in_simd_gemm_is_caught(emulated, rng, monkeypatch):
    """Without the barrier after staging, SIMD-group 0 multiplies tiles the other three
    SIMD-groups have not written yet (read after write)."""
    check_simd_gemm_barrier(rng, monkeypatch, 0)


def test_missing_reuse_barrier_in_simd_gemm_is_caught(emulated, rng, monkeypatch):
    """Without the barrier after the multiplies, a SIMD-group that is done with a tile
    restages the next one while others still read it (write after read)."""
    check_simd_gemm_barrier(rng, monkeypatch, 1)


def check_simd_gemm_barrier(rng, monkeypatch, which):
    a, b = oracle.random_int8(rng, (33, 96)), oracle.random_int8(rng, (40, 96))
    want = oracle.int8_matmul(a, b)
    np.testing.assert_array_equal(np.array(metal.simd_int8_matmul(mx.array(a), mx.array(b))), want)
    text = sources.read("metal", "simd_gemm.metal")
    at = text.index(BARRIER)
    if which == 1:
        at = text.index(BARRIER, at + 1)
    assert text.count(BARRIER) == 2
    anchor = text[at - 80:at + len(BARRIER)]
    plant(monkeypatch, "simd_gemm.metal", anchor, anchor.replace(BARRIER, "/* barrier removed */"))
    assert_caught(lambda: metal.simd_int8_matmul(mx.array(a), mx.array(b)),
                  lambda got: np.array_equal(np.array(got), want))


def test_dropped_k_tail_in_nax_gemm_is_caught(emulated, rng, monkeypatch):
    """A K loop that only runs whole 32-wide steps drops the last K % 32 products.
    (An off-by-one in a load bound alone would be masked here: the other operand's
    bounds check supplies a zero for the same k.)"""
    a, b = oracle.random_int8(rng, (20, 40)), oracle.random_int8(rng, (24, 40))  # K tail: 40 = 32 + 8
    want = oracle.int8_matmul(a, b)
    np.testing.assert_array_equal(np.array(metal.nax_int8_matmul(mx.array(a), mx.array(b))), want)
    plant(monkeypatch, "nax_gemm.metal", "for (int k0 = kb; k0 < kb_end; k0 += SK)",
          "for (int k0 = kb; k0 + SK <= kb_end; k0 += SK)")
    got = np.array(metal.nax_int8_matmul(mx.array(a), mx.array(b)))
    assert not np.array_equal(got, want)


@pytest.mark.parametrize("kernel, shapes, indent", [
    ("nax", ((5, 16), (21, 16)), "        "),
    ("simd", ((8, 32), (33, 32)), "    "),
])
def test_off_by_one_store_tail_in_gemm_is_caught(emulated, rng, monkeypatch, kernel, shapes, indent):
    """Storing up to n <= N writes one element past the last row: a guard-byte hit."""
    run = {"nax": metal.nax_int8_matmul, "simd": metal.simd_int8_matmul}[kernel]
    a, b = oracle.random_int8(rng, shapes[0]), oracle.random_int8(rng, shapes[1])
    np.testing.assert_array_equal(np.array(run(mx.array(a), mx.array(b))), oracle.int8_matmul(a, b))
    plant(monkeypatch, f"{kernel}_gemm.metal", f"if (m < M && n < N) {{\n{indent}const size_t o",
          f"if (m < M && n <= N) {{\n{indent}const size_t o")
    with pytest.raises(harness.EmulationError, match="out-of-bounds write"):
        run(mx.array(a), mx.array(b))


def test_off_by_one_group_in_quantize_sums_is_caught(emulated, rng, monkeypatch):
    """A row-sum chunk one element short drops the last code of every group."""
    x = rng.standard_normal((5, 128)).astype(np.float32)
    want_q, _ = oracle.quantize_rows(x)
    want = want_q.astype(np.int64).reshape(5, 4, 32).sum(-1)
    np.testing.assert_array_equal(np.array(metal.quantize(mx.array(x), 32)[2]), want)
    plant(monkeypatch, "quantize.metal", "for (int j = int(lane); j < CH; j += 32)",
          "for (int j = int(lane); j < CH - 1; j += 32)")
    assert not np.array_equal(np.array(metal.quantize(mx.array(x), 32)[2]), want)


def test_untransposed_right_operand_in_nax_gemm_is_caught(emulated, rng, monkeypatch):
    """The emulated matmul2d honours transpose_right: the kernel loads B as [N, K]
    fragments, so declaring the operand untransposed multiplies the wrong elements."""
    a, b = oracle.random_int8(rng, (32, 32)), oracle.random_int8(rng, (32, 32))
    want = oracle.int8_matmul(a, b)
    np.testing.assert_array_equal(np.array(metal.nax_int8_matmul(mx.array(a), mx.array(b))), want)
    plant(monkeypatch, "nax_gemm.metal", "16, 32, 16, false, true, true,", "16, 32, 16, false, false, true,")
    assert not np.array_equal(np.array(metal.nax_int8_matmul(mx.array(a), mx.array(b))), want)


def test_missing_flush_in_simd_gemm_is_caught(emulated, monkeypatch):
    """Without the int32 flush every 1024 values of K, the float accumulator passes 2^24
    and rounds the odd 127 x 127 products (test_metal's flush case)."""
    m, n, k = 2, 3, 2100
    a = np.full((m, k), 127, np.int8)
    b = np.full((n, k), 127, np.int8)
    b[:, ::8] = 126
    want = oracle.int8_matmul(a, b)
    np.testing.assert_array_equal(np.array(metal.simd_int8_matmul(mx.array(a), mx.array(b))), want)
    plant(monkeypatch, "simd_gemm.metal", "constexpr int EXACT_K = 1024;", "constexpr int EXACT_K = 1 << 20;")
    assert not np.array_equal(np.array(metal.simd_int8_matmul(mx.array(a), mx.array(b))), want)


def test_missing_flush_in_gemv_is_caught(emulated, monkeypatch):
    """Without the flush every 256 steps (1024 products) a lane's float partial rounds."""
    from test_metal import gemv_flush_case

    x, wq = gemv_flush_case()
    good = np.array(metal.int8_gemv(mx.array(x), wq, None))
    plant(monkeypatch, "gemv.metal", "constexpr int FLUSH_STEPS = 256;", "constexpr int FLUSH_STEPS = 1 << 20;")
    assert not np.array_equal(np.array(metal.int8_gemv(mx.array(x), wq, None)), good)


def w4a8_case(rng, m=5, n=40, k=128, group_size=32):
    """Activations and a 4-bit weight whose nibble pairs differ (random codes), with the
    oracle's answer and bound: a swapped nibble order changes the products."""
    from mlx_w8a8.weight import QuantizedWeight

    x = rng.standard_normal((m, k)).astype(np.float32)
    w = QuantizedWeight.from_float(mx.array(rng.standard_normal((n, k)).astype(np.float32)),
                                   group_size=group_size, per_channel=False, bits=4)
    want, bound = oracle.linear4(x, w, None)

    def correct(y):
        try:
            oracle.assert_close(y, want, bound, "float32")
        except AssertionError:
            return False
        return True
    return mx.array(x), w, correct


# The 4-bit kernels read codes through two helpers of common.h: w8a8_nibbles4 (four codes
# of a word: the simd GEMM's staging, the GEMV) and w8a8_nibble (one code: the NAX GEMM
# and the simd GEMM's guarded path). Each mutant takes the high nibble of a byte first.
NIBBLES4 = "return uchar4(uchar(h & 0xFu), uchar((h >> 4) & 0xFu), uchar((h >> 8) & 0xFu), uchar((h >> 12) & 0xFu));"
NIBBLES4_SWAPPED = "return uchar4(uchar((h >> 4) & 0xFu), uchar(h & 0xFu), uchar((h >> 12) & 0xFu), uchar((h >> 8) & 0xFu));"
NIBBLE = "return (word >> (4 * (k & 7))) & 0xFu;"
NIBBLE_SWAPPED = "return (word >> (4 * ((k & 7) ^ 1))) & 0xFu;"


@pytest.mark.parametrize("kind,old,new", [
    ("simd", NIBBLES4, NIBBLES4_SWAPPED),
    ("nax", NIBBLE, NIBBLE_SWAPPED),
    ("gemv", NIBBLES4, NIBBLES4_SWAPPED),
], ids=["simd", "nax", "gemv"])
def test_wrong_nibble_order_in_w4a8_is_caught(emulated, rng, monkeypatch, kind, old, new):
    """MLX's order is code j of a word in bits 4j .. 4j + 3 (the low nibble of a byte
    first); reading the high nibble first gives wrong outputs."""
    x, w, correct = w4a8_case(rng)
    run = metal.w4a8_gemv if kind == "gemv" else metal.w4a8_linear
    with metal.override(metal=True, nax=kind == "nax"):
        assert correct(run(x, w, None))
        plant(monkeypatch, "common.h", old, new)
        assert_caught(lambda: run(x, w, None), correct)


@pytest.mark.parametrize("kind,file,old,new", [
    # the last group's exact sums never folded into float32
    ("simd", "simd_gemm.metal", "if (k_end % FLUSH == 0 || k_end >= K) {",
     "if (k_end % FLUSH == 0 && k_end < K) {"),
    ("nax", "nax_gemm.metal", "if (MODE == 2 && (k0 + SK) % GS == 0) {",
     "if (MODE == 2 && (k0 + SK) % GS == 0 && k0 + SK < K) {"),
    # the last group's offset term (bias times the activation code sum) left out
    ("gemv", "gemv.metal", "for (int g = int(lane); g < G; g += 32) {",
     "for (int g = int(lane); g < G - 1; g += 32) {"),
], ids=["simd", "nax", "gemv"])
def test_dropped_group_in_w4a8_is_caught(emulated, rng, monkeypatch, kind, file, old, new):
    x, w, correct = w4a8_case(rng, k=96)
    run = metal.w4a8_gemv if kind == "gemv" else metal.w4a8_linear
    with metal.override(metal=True, nax=kind == "nax"):
        assert correct(run(x, w, None))
        plant(monkeypatch, file, old, new)
        assert_caught(lambda: run(x, w, None), correct)


def test_misaligned_vector_staging_is_caught(emulated, rng):
    """The simd GEMM's 4-byte staging loads (VEC) need 4-byte aligned rows: with K = 7
    row m starts at byte 7 m, and the emulator refuses the misaligned char4 load, as a
    GPU may misread it. K = 8 (aligned rows) runs and is exact; the raw int8_matmul op
    never sets VEC."""
    for k, ok in ((8, True), (7, False)):
        a, b = oracle.random_int8(rng, (5, k)), oracle.random_int8(rng, (6, k))

        def call():
            return metal._gemm(False, mx.array(a), mx.array(b), flip=False, mode=0, gs=32,
                               out_dtype=mx.int32, vec=True)

        if ok:
            np.testing.assert_array_equal(np.array(call()), oracle.int8_matmul(a, b))
        else:
            with pytest.raises(harness.EmulationError, match="misaligned vector load"):
                call()


# ---------------------------------------------------------------------------------------
# Metal rules the harness enforces
# ---------------------------------------------------------------------------------------
HELPER = """
METAL_FUNC float first(const device float* p) { return p[0]; }
"""


def test_threadgroup_pointer_where_device_expected_fails_to_compile():
    k = kernel("""
threadgroup float buf[32];
buf[thread_position_in_threadgroup.x] = inp[thread_position_in_grid.x];
threadgroup_barrier(mem_flags::mem_threadgroup);
out[thread_position_in_grid.x] = first(buf);
""", header=HELPER)
    with pytest.raises(harness.EmulationError, match="no matching function for call to 'first'"):
        run(k, [mx.zeros((32,))], (32,), mx.float32, (32, 1, 1), (32, 1, 1))


def test_small_input_is_bound_in_constant_space():
    """MLX binds an input of fewer than 8 elements as `const constant T*`: a helper
    written for `const device T*` compiles for 8 elements and fails for 4, as on a Mac."""
    k = kernel("out[thread_position_in_grid.x] = first(inp);", header=HELPER)
    got = run(k, [mx.full((8,), 3.0)], (4,), mx.float32, (4, 1, 1), (4, 1, 1))
    np.testing.assert_array_equal(np.array(got), 3.0)
    with pytest.raises(harness.EmulationError, match="no matching function for call to 'first'"):
        run(k, [mx.full((4,), 3.0)], (4,), mx.float32, (4, 1, 1), (4, 1, 1))


# Casts between named address spaces. Metal refuses each of them, explicit or implicit,
# even in a branch never taken; clang's C++ accepts the explicit ones, so the harness's
# address-space pass must refuse them. `inp` is `constant` below 8 elements.
CAST_PROBES = [
    # constant -> device, explicit, in a branch never taken (issue 51's simd_gemm defect).
    ("constant_to_device", 4, "if (inp[0] > 1e30f) { out[1] = ((const device float*)inp)[0]; }"),
    # threadgroup -> device, explicit.
    ("threadgroup_to_device", 8, "threadgroup float buf[4];\nbuf[0] = inp[0];\n"
     "threadgroup_barrier(mem_flags::mem_threadgroup);\nout[1] = ((device float*)buf)[0];"),
    # device -> thread, explicit (Metal's thread space is not a generic space).
    ("device_to_thread", 8, "out[1] = ((const thread float*)inp)[0];"),
    # constant -> device, implicit.
    ("constant_to_device_implicit", 4, "const device float* p = inp; out[1] = p[0];"),
    # threadgroup -> device, implicit.
    ("threadgroup_to_device_implicit", 8, "threadgroup float buf[4];\nbuf[0] = inp[0];\n"
     "threadgroup_barrier(mem_flags::mem_threadgroup);\ndevice float* p = buf; out[1] = p[0];"),
]


def cast_probe(body: str, size: int):
    k = kernel(f"{body}\nout[0] = inp[0];", header="")
    return run(k, [mx.full((size,), 2.0)], (2,), mx.float32, (1, 1, 1), (1, 1, 1))


@pytest.mark.parametrize("name, size, body", CAST_PROBES, ids=[p[0] for p in CAST_PROBES])
def test_cast_between_address_spaces_fails_to_compile(name, size, body):
    with pytest.raises(harness.EmulationError, match="cast between address spaces|cannot initialize"):
        cast_probe(body, size)


def test_same_space_vector_cast_and_small_input_overloads_compile():
    """What Metal accepts: a `device` 8-bit pointer cast to `device char4*` (same space,
    other type), and w8a8_load4 on a 4-element (`constant`) and an 8-element (`device`)
    input, which resolves to the scalar and the vector load."""
    header = sources.read("metal", "common.h")
    body = """const char4 v = w8a8_load4(inp);
out[0] = float(v.x + v.y + v.z + v.w);
const device int8_t* d = (const device int8_t*)out;  // same space: a plain cast
out[1] = float(d == nullptr);
"""
    for size in (4, 8):
        x = mx.arange(1, size + 1, dtype=mx.int8)
        got = run(kernel(body, header=header), [x], (2,), mx.float32, (1, 1, 1), (1, 1, 1))
        np.testing.assert_array_equal(np.array(got), [10.0, 0.0])


def test_address_space_pass_reads_locations_in_order():
    """clang prints a location's file only when it changes: the pass must follow them."""
    dump = "\n".join([
        "FunctionDecl <kernel.metal:1:1, line:9:1> f",
        "  CStyleCastExpr <line:3:5, col:9> 'device float *' <AddressSpaceConversion>",
        "  ParmVarDecl </x/metal_emu.h:756:16, kernel.metal:4:2> p",
        "  CStyleCastExpr <col:5, col:9> 'void *' <AddressSpaceConversion>",
        "FunctionDecl </x/metal_emu.h:20:1, line:30:1> g",
        "  CStyleCastExpr <line:25:5, col:9> 'void *' <AddressSpaceConversion>",
    ])
    assert harness.address_space_casts(dump) == [(3, "device float *"), (4, "void *")]


def reference_casts(dump: str, file: str = "kernel.metal") -> list[tuple[int, str]]:
    """The pass's oracle: every line's location tokens followed in order from the
    dump's start (what harness.address_space_casts computes reading back from each
    cast only)."""
    import re

    found, cur_file, cur_line = [], None, 0
    for text in dump.splitlines():
        first = None
        for m in harness._LOC.finditer(text):
            if m.group(2) is not None:
                cur_file, cur_line = m.group(2), int(m.group(3))
            elif m.group(1) is not None:
                cur_line = int(m.group(1))
            if first is None:
                first = (cur_file, cur_line)
        if "<AddressSpaceConversion>" in text and first is not None and first[0] == file:
            kind = re.search(r"'([^']*)' <AddressSpaceConversion>", text)
            found.append((first[1], kind.group(1) if kind else "?"))
    return found


def random_dump(rng, lines: int, file_rate: float = 0.04, cast_rate: float = 0.15) -> str:
    """A clang-like AST dump: nodes whose locations name a file only now and then
    (long runs of line:/col: tokens, which the pass must read back across), some
    without locations, some casts between address spaces."""
    files = ["kernel.metal", "/x/metal_emu.h", "/usr/include/c++/v1/cmath"]

    def token():
        r = rng.random()
        if r < file_rate:
            return f"{files[rng.integers(3)]}:{rng.integers(1, 500)}:{rng.integers(1, 80)}"
        if r < 0.5:
            return f"line:{rng.integers(1, 500)}:{rng.integers(1, 80)}"
        return f"col:{rng.integers(1, 80)}"

    out = []
    for _ in range(lines):
        r = rng.random()
        if r < 0.05:
            out.append("  <<<NULL>>>")
            continue
        node = f"{'  ' * int(rng.integers(0, 6))}Expr <{token()}, {token()}>"
        if r < 0.05 + cast_rate:
            node += " 'device float *' <AddressSpaceConversion>"
        out.append(node)
    return "\n".join(out)


def test_address_space_pass_matches_reading_every_location(rng):
    # Dumps of tens of megabytes are read back from each cast only; on any dump the
    # casts found are those of following every location from the start.
    dumps = [random_dump(rng, n) for n in (1, 50, 3000, 8000)]
    # files named about 100 KB apart, few casts (as in clang's dumps of the kernels)
    dumps.append(random_dump(rng, 20000, file_rate=0.0003, cast_rate=0.002))
    dumps.append("\n".join(["Expr <line:7:1, col:2> 'void *' <AddressSpaceConversion>"] * 3))
    for dump in dumps:
        assert harness.address_space_casts(dump) == reference_casts(dump)
    assert any(harness.address_space_casts(d) for d in dumps)  # casts in kernel.metal found
    assert reference_casts(dumps[-1]) == []  # no file named before: not kernel.metal's


@pytest.mark.parametrize("name, size, body", CAST_PROBES[:3] + [
    ("device_vector_cast_ok", 8, "out[1] = float(((const device char4*)inp)[0].x);")],
    ids=[p[0] for p in CAST_PROBES[:3]] + ["device_vector_cast_ok"])
def test_address_space_pass_agrees_with_opencl_cpp(tmp_path, name, size, body):
    """The same probes through clang's C++ for OpenCL (`-cl-std=clc++2021`), whose
    address-space rules are Metal's: it refuses exactly what the harness refuses."""
    cxx = harness.compiler()
    mapped = (body.replace("threadgroup_barrier(mem_flags::mem_threadgroup);", "")
              .replace("threadgroup float buf[4];", "__local float buf[4];"))
    space = "__constant" if size < 8 else "__global"
    src = tmp_path / "probe.clcpp"
    src.write_text(f"""#define device __global
#define constant __constant
#define thread __private
typedef char char4 __attribute__((ext_vector_type(4)));
__kernel void probe(const {space} float* inp, __global float* out) {{
{mapped}
out[0] = inp[0];
}}
""")
    opencl = subprocess.run([cxx, "-x", "clcpp", "-cl-std=clc++2021", "-fsyntax-only", str(src)],
                            capture_output=True, text=True)
    try:
        cast_probe(body, size)
        harness_ok = True
    except harness.EmulationError:
        harness_ok = False
    assert (opencl.returncode == 0) == name.endswith("_ok"), opencl.stderr
    assert harness_ok == name.endswith("_ok")


def test_schedule_dependent_result_is_a_race_error():
    """Every thread of a group writes the same element: the survivor depends on the
    order threads run in, which the two scheduler passes expose."""
    k = kernel("out[threadgroup_position_in_grid.x] = float(thread_position_in_threadgroup.x) + inp[0];")
    with pytest.raises(harness.EmulationError, match="depends on the order threads are scheduled"):
        run(k, [mx.zeros((8,))], (2,), mx.float32, (64, 1, 1), (32, 1, 1))


def test_barrier_in_divergent_code_is_a_deadlock_error():
    k = kernel("""
if (thread_position_in_threadgroup.x < 16) {
  threadgroup_barrier(mem_flags::mem_threadgroup);
}
out[thread_position_in_grid.x] = inp[thread_position_in_grid.x];
""")
    with pytest.raises(harness.EmulationError, match="deadlock"):
        run(k, [mx.zeros((64,))], (64,), mx.float32, (64, 1, 1), (32, 1, 1))


def test_simd_collective_skipped_by_some_lanes_is_a_deadlock_error():
    k = kernel("""
float v = inp[thread_position_in_grid.x];
if (thread_index_in_simdgroup != 3) { v = simd_sum(v); }
out[thread_position_in_grid.x] = v;
""")
    with pytest.raises(harness.EmulationError, match="deadlock"):
        run(k, [mx.zeros((32,))], (32,), mx.float32, (32, 1, 1), (32, 1, 1))


@pytest.mark.parametrize("source", [
    # Not modelled: 16x16 simdgroup matrices.
    "simdgroup_matrix<float, 16, 16> m; out[0] = 0;",
    # Not modelled: atomics (not declared by the emulation header).
    "atomic_fetch_add_explicit((device atomic_int*)out, 1, memory_order_relaxed);",
    # Not modelled: transposed matmul2d operands.
    """constexpr auto d = mpp::tensor_ops::matmul2d_descriptor(16, 32, 16, true, false, true);
mpp::tensor_ops::matmul2d<d, metal::execution_simdgroup> op; out[0] = 0;""",
])
def test_unsupported_constructs_fail_to_compile(source):
    header = "#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>\n"
    with pytest.raises(harness.EmulationError, match="clang rejected"):
        run(kernel(source, header=header), [mx.zeros((32,))], (32,), mx.float32, (32, 1, 1), (32, 1, 1))


MPP = "#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>\n"
NAX_OP = """constexpr auto d = mpp::tensor_ops::matmul2d_descriptor(16, 32, 16, false, true, true,
    mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
mpp::tensor_ops::matmul2d<d, metal::execution_simdgroup> op;
"""


def compile_probe(source, header="", inputs=None, out_dtype=mx.float32):
    """Run a one-SIMD-group probe kernel; returns its 32 outputs."""
    inputs = inputs if inputs is not None else [mx.zeros((32,))]
    return run(kernel(source, header=header), inputs, (32,), out_dtype, (32, 1, 1), (32, 1, 1))


@pytest.mark.parametrize("source, message", [
    # Metal has no integer simdgroup matrices (half, float, bfloat only).
    ("simdgroup_matrix<int, 8, 8> m = make_filled_simdgroup_matrix<int, 8, 8>(1); out[0] = 0;",
     "element type must be half, float or bfloat"),
    ("simdgroup_matrix<int8_t, 8, 8> m; out[0] = 0;", "element type must be half, float or bfloat"),
    # simdgroup_load takes a pointer to the matrix's element type ...
    ("simdgroup_half8x8 m; simdgroup_load(m, (const device int8_t*)inp, 8); out[0] = 0;",
     "no matching function for call to 'simdgroup_load'"),
    # ... in device or threadgroup memory, never thread memory.
    ("half h[64]; for (int i = 0; i < 64; ++i) { h[i] = half(0); }\n"
     "simdgroup_half8x8 m; simdgroup_load(m, h, 8); out[0] = 0;",
     "no matching function for call to 'simdgroup_load'"),
    ("threadgroup float t[64]; simdgroup_float8x8 m; simdgroup_store(m, (thread float*)nullptr, 8);"
     " t[0] = 0; out[0] = t[0];", "no matching function for call to 'simdgroup_store'"),
    # Narrowing in a braced initialiser is an error in Metal (C++).
    ("int k = int(inp[0]); short s{k}; out[0] = float(s);", "narrowing"),
])
def test_metal_compiler_rejections(source, message):
    with pytest.raises(harness.EmulationError, match=message):
        compile_probe(source)


@pytest.mark.parametrize("types, ok", [
    ("int8_t, int8_t, int32_t", True),     # the W8A8 combination
    ("uint8_t, uint8_t, int32_t", True),   # in Apple's table too
    ("int8_t, uint8_t, int32_t", False),   # mixed signedness: not in the table
    ("uint8_t, int8_t, int32_t", False),
    ("int8_t, int8_t, float", False),      # integer x integer only to int32
    ("half, int8_t, float", True),         # mixed precision with a float destination
    ("half, half, int32_t", False),
])
def test_matmul2d_type_table(types, ok):
    """Apple's MPPTensorOpsMatMul2d.h table, as static_asserts in the emulator."""
    src = NAX_OP + f"""auto ct_a = op.get_left_input_cooperative_tensor<{types}>();
auto ct_b = op.get_right_input_cooperative_tensor<{types}>();
auto ct_c = op.get_destination_cooperative_tensor<metal::remove_addrspace_t<decltype(ct_a)>,
    metal::remove_addrspace_t<decltype(ct_b)>, {types.split(", ")[2]}>();
for (short i = 0; i < 8; ++i) {{ ct_a[i] = 2; }}
for (short i = 0; i < 16; ++i) {{ ct_b[i] = 3; ct_c[i] = 1; }}
op.run(ct_a, ct_b, ct_c);
out[thread_index_in_simdgroup] = float(ct_c[0]) + inp[0];
"""
    if ok:
        np.testing.assert_array_equal(np.array(compile_probe(src, MPP)), 97.0)  # 1 + 16 * 2 * 3
    else:
        with pytest.raises(harness.EmulationError, match="not in Apple's matmul2d type table"):
            compile_probe(src, MPP)


@pytest.mark.parametrize("types, ok", [
    ("uint8_t, metal::uint2b_format, int32_t", True),   # unsigned codes x packed 2-bit (public M5 code)
    ("uint8_t, metal::uint4b_format, int32_t", True),
    ("int8_t, metal::int4b_format, int32_t", True),
    ("int8_t, metal::int2b_format, int32_t", True),
    ("half, metal::uint4b_format, float", True),
    ("int8_t, metal::uint2b_format, int32_t", False),  # signedness must match
    ("int8_t, metal::uint4b_format, int32_t", False),  # int8 x MLX's unsigned 4-bit codes: nax_gemm unpacks
    ("uint8_t, metal::int4b_format, int32_t", False),
    ("int8_t, metal::int4b_format, float", False),     # integer x packed integer only to int32
])
def test_matmul2d_type_table_packed_right_operands(types, ok):
    """The packed sub-byte rows of Apple's table are accepted by the type check; the
    emulator does not run them (no cooperative-tensor element semantics for packed types)."""
    src = f"static_assert(mpp::tensor_ops::detail::type_ok<{types}>(), \"not in the table\");\nout[0] = inp[0];"
    if ok:
        compile_probe(src, MPP)
    else:
        with pytest.raises(harness.EmulationError, match="not in the table"):
            compile_probe(src, MPP)


def test_packed_right_operand_is_not_run():
    src = NAX_OP + """auto ct_a = op.get_left_input_cooperative_tensor<uint8_t, metal::uint2b_format, int32_t>();
auto ct_b = op.get_right_input_cooperative_tensor<uint8_t, metal::uint2b_format, int32_t>();
out[0] = inp[0];
"""
    with pytest.raises(harness.EmulationError, match="packed sub-byte right operands are not emulated"):
        compile_probe(src, MPP)


def test_fresh_cooperative_tensor_is_poison_not_zero():
    """multiply_accumulate into a destination that was never written adds garbage."""
    src = NAX_OP + """auto ct_a = op.get_left_input_cooperative_tensor<int8_t, int8_t, int32_t>();
auto ct_b = op.get_right_input_cooperative_tensor<int8_t, int8_t, int32_t>();
auto ct_c = op.get_destination_cooperative_tensor<metal::remove_addrspace_t<decltype(ct_a)>,
    metal::remove_addrspace_t<decltype(ct_b)>, int32_t>();
for (short i = 0; i < 8; ++i) { ct_a[i] = 1; }
for (short i = 0; i < 16; ++i) { ct_b[i] = 1; }
op.run(ct_a, ct_b, ct_c);
out[thread_index_in_simdgroup] = ct_c[0] + int(inp[0]);
"""
    got = np.array(compile_probe(src, MPP, out_dtype=mx.int32))
    assert (got == np.int32(np.uint32(0xA5A5A5A5).view(np.int32)) + 16).all()


def test_fresh_simdgroup_matrix_is_nan_not_zero():
    src = """threadgroup float t[64];
simdgroup_float8x8 m;
simdgroup_store(m, t, 8);
simdgroup_barrier(mem_flags::mem_threadgroup);
out[thread_index_in_simdgroup] = t[thread_index_in_simdgroup] + inp[0];
"""
    assert np.isnan(np.array(compile_probe(src))).all()


@pytest.mark.parametrize("source, message", [
    ("consteval int three() { return 3; }", "consteval"),                           # C++20
    ("struct P { int a, b; }; constexpr P p = {.a = 1, .b = 2};", "not Metal Shading Language"),
])
def test_cpp20_is_refused_even_where_nax_needs_cpp20(source, message):
    with pytest.raises(harness.EmulationError, match=message):
        compile_probe("out[0] = inp[0];", MPP + source + "\n")


def test_threadgroup_array_in_a_helper_is_refused():
    helper = "METAL_FUNC float stage(float v) {\n  threadgroup float buf[32];\n  buf[0] = v;\n  return buf[0];\n}\n"
    with pytest.raises(harness.EmulationError, match="threadgroup array declared outside the kernel"):
        compile_probe("out[0] = stage(inp[0]);", helper)


def test_mem_none_barrier_does_not_fence_threadgroup_memory():
    src = """threadgroup float buf[32];
buf[thread_index_in_simdgroup] = inp[thread_index_in_simdgroup];
threadgroup_barrier(mem_flags::mem_none);
out[thread_index_in_simdgroup] = buf[31 - thread_index_in_simdgroup];
"""
    with pytest.raises(harness.EmulationError, match="mem_none"):
        compile_probe(src)
    fenced = src.replace("mem_none", "mem_threadgroup")
    np.testing.assert_array_equal(np.array(compile_probe(fenced, inputs=[mx.arange(32, dtype=mx.float32)])),
                                  np.arange(32)[::-1])


def test_mlx_preamble_names_collide_as_on_a_mac():
    """MLX prepends its utils.h to every metal_kernel source: a header that defines one
    of its names again (here `Limits`) fails to compile, as it would with MLX on a Mac."""
    with pytest.raises(harness.EmulationError, match="Limits"):
        compile_probe("out[0] = inp[0];", "template <typename T> struct Limits { static constexpr T max = 1; };\n")
    np.testing.assert_array_equal(np.array(compile_probe("out[thread_index_in_simdgroup] = Limits<float>::max;")),
                                  np.inf)


def test_plain_sources_build_as_cpp17_nax_sources_as_cpp20():
    assert harness.standard("out[0] = 1;") == "-std=c++17"
    assert harness.standard(MPP) == "-std=c++20"
    # A C++20 feature clang would accept in C++20 mode fails in a plain (Metal 3) source.
    with pytest.raises(harness.EmulationError, match="clang rejected"):
        compile_probe("using L = decltype([] { return 3; }); out[0] = float(L()());")


@pytest.mark.parametrize("line", [
    "double d = inp[0]; out[0] = float(d);",        # Metal has no double precision
    "static float keep = 0; out[0] = keep;",        # no function-scope statics in Metal
    "out[0] = std::sqrt(inp[0]);",                  # no C++ standard library
])
def test_cpp_that_is_not_metal_is_refused(line):
    """clang would accept these; the Metal compiler would not, so neither does the harness."""
    with pytest.raises(harness.EmulationError, match="is not Metal Shading Language"):
        run(kernel(line), [mx.zeros((32,))], (32,), mx.float32, (32, 1, 1), (32, 1, 1))


def test_comments_may_say_anything():
    k = kernel("// a static double, new: words in comments are not code\nout[0] = inp[0]; /* std::free */")
    np.testing.assert_array_equal(np.array(run(k, [mx.full((8,), 4.0)], (1,), mx.float32, (1, 1, 1), (1, 1, 1))), [4.0])


def test_threadgroup_memory_over_32k_is_refused():
    k = kernel("threadgroup float big[8193]; big[thread_position_in_grid.x] = inp[0]; out[0] = big[0];")
    with pytest.raises(harness.EmulationError, match="exceeds the 32 KiB"):
        run(k, [mx.zeros((8,))], (1,), mx.float32, (32, 1, 1), (32, 1, 1))


def test_non_uniform_threadgroups_are_refused():
    k = kernel("out[thread_position_in_grid.x] = inp[thread_position_in_grid.x];")
    with pytest.raises(harness.EmulationError, match="non-uniform"):
        run(k, [mx.zeros((40,))], (40,), mx.float32, (40, 1, 1), (32, 1, 1))


# ---------------------------------------------------------------------------------------
# The emulated execution model
# ---------------------------------------------------------------------------------------
def test_source_is_what_mlx_generates():
    k = kernel("out[thread_position_in_grid.x] = inp[thread_position_in_grid.x];")
    src = harness.capture_source(k, [mx.zeros((16,))], output_shapes=[(16,)], output_dtypes=[mx.float32],
                                 grid=(16, 1, 1), threadgroup=(16, 1, 1))
    assert "[[kernel]] void custom_kernel_probe" in src
    assert "const device float* inp [[buffer(0)]]" in src
    assert "uint3 thread_position_in_grid [[thread_position_in_grid]]" in src


def test_thread_attributes_in_a_2d_grid():
    k = kernel("""
uint3 g = thread_position_in_grid;
uint i = g.y * threads_per_grid.x + g.x;
out[i] = int(threadgroup_position_in_grid.x * 1000000 + threadgroup_position_in_grid.y * 10000
             + simdgroup_index_in_threadgroup * 100 + thread_index_in_simdgroup) + int(inp[0]) * 0;
""")
    got = np.array(run(k, [mx.zeros((8,))], (6, 128), mx.int32, (128, 6, 1), (64, 2, 1)))
    y, x = np.mgrid[0:6, 0:128]
    linear = (y % 2) * 64 + x % 64  # index within a 64 x 2 threadgroup
    want = (x // 64) * 1000000 + (y // 2) * 10000 + (linear // 32) * 100 + linear % 32
    np.testing.assert_array_equal(got, want)


def test_simd_collectives():
    k = kernel("""
uint l = thread_index_in_simdgroup;
float v = inp[thread_position_in_grid.x];
out[thread_position_in_grid.x * 4 + 0] = simd_sum(v);
out[thread_position_in_grid.x * 4 + 1] = simd_max(v);
out[thread_position_in_grid.x * 4 + 2] = simd_shuffle_xor(v, ushort(5));
out[thread_position_in_grid.x * 4 + 3] = simd_shuffle_down(v, ushort(3));
""")
    x = np.arange(64, dtype=np.float32) * 1.5
    got = np.array(run(k, [mx.array(x)], (256,), mx.float32, (64, 1, 1), (64, 1, 1))).reshape(64, 4)
    lane = np.arange(64) % 32
    base = np.arange(64) - lane
    np.testing.assert_array_equal(got[:, 0], np.repeat([x[:32].sum(), x[32:].sum()], 32))
    np.testing.assert_array_equal(got[:, 1], np.repeat([x[31], x[63]], 32))
    np.testing.assert_array_equal(got[:, 2], x[base + (lane ^ 5)])
    np.testing.assert_array_equal(got[:, 3], np.where(lane + 3 < 32, x[np.minimum(base + lane + 3, 63)], x))


def test_threadgroup_memory_is_per_group_and_poisoned():
    """Thread 0 of each group writes slot 0 only; reading slot 1 shows the poison, not a
    previous group's value (each group starts from poisoned threadgroup memory)."""
    k = kernel("""
threadgroup uint slots[2];
if (thread_position_in_threadgroup.x == 0) { slots[0] = threadgroup_position_in_grid.x; }
if (threadgroup_position_in_grid.x == 0 && thread_position_in_threadgroup.x == 0) { slots[1] = 7; }
threadgroup_barrier(mem_flags::mem_threadgroup);
out[thread_position_in_grid.x * 2] = slots[0];
out[thread_position_in_grid.x * 2 + 1] = slots[1] + uint(inp[0]) * 0;
""")
    got = np.array(run(k, [mx.zeros((8,))], (3 * 32 * 2,), mx.uint32, (96, 1, 1), (32, 1, 1))).reshape(96, 2)
    np.testing.assert_array_equal(got[:, 0], np.arange(96) // 32)
    assert (got[:32, 1] == 7).all() and (got[32:, 1] == 0xA5A5A5A5).all()


def test_outputs_are_poisoned_before_the_run():
    k = kernel("if (thread_position_in_grid.x == 0) { out[0] = inp[0]; }")
    got = np.array(run(k, [mx.full((8,), 2.0)], (4,), mx.uint32, (4, 1, 1), (4, 1, 1)).view(mx.uint32))
    assert got[0] == 2 and (got[1:] == 0xA5A5A5A5).all()


def test_half_conversions_round_to_nearest_even(rng):
    """float -> half in the emulator rounds as numpy does (ties, subnormals, overflow)."""
    x = np.concatenate([rng.standard_normal(4000) * 10.0 ** rng.integers(-8, 6, 4000),
                        [65504, 65519.99, 65520, 6e-8, 2.9e-8, 1.00048828125, -1.00146484375]])
    x = x.astype(np.float32)
    k = kernel("out[thread_position_in_grid.x] = half(inp[thread_position_in_grid.x]);")
    n = 4096
    xin = np.resize(x, n)
    got = np.array(run(k, [mx.array(xin)], (n,), mx.float16, (n, 1, 1), (256, 1, 1)))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got.view(np.uint16), xin.astype(np.float16).view(np.uint16))


def test_dump_writes_the_generated_source_for_apples_compiler(tmp_path, monkeypatch, capsys):
    """With METAL_EMU_DUMP set, every source the executor runs lands in the folder
    under MLX's kernel name (its input spaces encoded: `c` for a constant input), and
    metal_compile.py turns each into the xcrun command that compiles it with MLX's
    utils.h prepended (dry run: no compiler here)."""
    from metal_emu import metal_compile

    monkeypatch.setenv(harness.DUMP_ENV, str(tmp_path))
    k = kernel("out[thread_position_in_grid.x] = inp[0];")
    for size in (4, 8):
        run(k, [mx.zeros((size,))], (1,), mx.float32, (1, 1, 1), (1, 1, 1))
    names = sorted(p.name for p in tmp_path.glob("*.metal"))
    assert set(names) == {"custom_kernel_probe_floatc_float.metal", "custom_kernel_probe_float_float.metal"}
    assert "const constant float* inp" in (tmp_path / "custom_kernel_probe_floatc_float.metal").read_text()
    assert metal_compile.compile_all(tmp_path, dry_run=True) == 0
    out = capsys.readouterr().out
    assert out.count("would run: xcrun -sdk macosx metal -std=metal4.0 -fno-fast-math") == 2
    assert "2 kernel sources, 0 failed to compile (dry run)" in out
    full = (tmp_path / "custom_kernel_probe_float_float.with_preamble.metal").read_text()
    assert full.startswith(metal_compile.PREAMBLE) and "[[kernel]] void custom_kernel_probe_float_float" in full


@pytest.mark.parametrize("tests_status,want", [(0, 0), (1, 1)])
def test_metal_compile_fails_when_the_emulated_tests_fail(tests_status, want, tmp_path, monkeypatch, capsys):
    """A failing emulated test stops before its later launches, so the dump can lack
    kernels: the compile job must then fail even when every dumped source compiles (the
    dry run compiles nothing and fails nothing itself)."""
    from metal_emu import metal_compile

    def dump(folder):
        (folder / "custom_kernel_probe_float_float.metal").write_text("// a dumped source\n")
        return tests_status

    monkeypatch.setattr(metal_compile, "dump", dump)
    assert metal_compile.main([str(tmp_path), "--dry-run"]) == want
    err = capsys.readouterr().err
    assert ("the emulated tests exited with status 1" in err) == bool(tests_status)


def test_metal_compile_dumps_the_checks_emulated_run_too():
    """The check's emulated run (every Metal candidate at the check's shapes) is among
    the tests whose launches are dumped for Apple's compiler."""
    from metal_emu import metal_compile

    source = (metal_compile.ROOT / "tests" / "test_check.py").read_text()
    assert f"def {metal_compile.CHECK_TEST}(" in source
