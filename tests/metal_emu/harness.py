"""Run MLX ``metal_kernel`` kernels on the CPU by compiling their Metal source as C++.

How one dispatch runs:

1. ``capture_source`` asks MLX for the exact Metal source it would compile: the call to
   the kernel is traced by ``mx.export_function`` with ``verbose=True``, which makes MLX
   print the generated source (header, signature with ``[[buffer(i)]]`` bindings and
   thread attributes, body, explicit template instantiation) even on a build without
   Metal. The text is read back from file descriptor 1.
2. ``translate`` first rejects C++ that Metal does not have (``double``, ``std::``,
   exceptions, dynamic memory, function-scope statics, ...), then turns the source into
   one C++ translation unit: the emulation header
   (``metal_emu.h``, standing in for the Metal standard library MLX prepends), the source
   with only these rewrites — Metal attributes (``[[kernel]]``, ``[[buffer(i)]]``,
   ``[[thread_position_in_grid]]``, ``[[host_name(..)]]``) removed; ``threadgroup`` arrays
   made function-scope ``static`` (one threadgroup runs at a time, so that is one copy per
   group) — and a launcher that binds buffers to the parameters exactly as MLX's
   ``custom_kernel.cpp`` does (inputs in order, each followed by its ``_shape`` /
   ``_strides`` / ``_ndim`` buffers when the source names them, then the outputs).
   Any other attribute makes clang fail (``-Werror=unknown-attributes``).
3. ``build`` first runs the address-space pass (``check_address_spaces``: clang's AST
   of the translation unit; any cast between address spaces written in the kernel's
   source refuses it, as Metal does), then compiles it once with clang (address spaces
   on, no fast math) into a shared library cached by content hash; ``cffi`` loads it.
4. ``run_source`` copies the inputs into guarded host buffers (poisoned guard bytes on
   both sides, so an out-of-bounds read sees garbage and an out-of-bounds write is
   reported), fills outputs with ``init_value`` or a poison byte and runs the grid twice,
   the fiber scheduler favouring the lowest and then the highest thread index; results
   that differ between the two are a race and an error. Returns mx arrays.

``executor`` plugs this into ``mlx_w8a8.kernels.metal`` so the candidates' own launch
code (shapes, grids, template arguments) runs unchanged, with emulation instead of a GPU.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import cffi
import mlx.core as mx
import numpy as np

HERE = Path(__file__).resolve().parent
HEADER = HERE / "metal_emu.h"
PREAMBLE = HERE / "mlx_preamble.h"
INCLUDE = HERE / "include"
GUARD = 256  # guard bytes on each side of every buffer
POISON = 0xA5  # byte written to guards, fresh outputs and threadgroup memory
SCHEDULES = (0, 1)  # scheduler scan orders every dispatch runs under: lowest / highest thread first

_NP = {
    "float": np.float32, "float16_t": np.float16, "half": np.float16, "bfloat16_t": np.uint16,
    "int8_t": np.int8, "uint8_t": np.uint8, "int16_t": np.int16, "uint16_t": np.uint16,
    "int32_t": np.int32, "uint32_t": np.uint32, "int64_t": np.int64, "uint64_t": np.uint64,
    "int": np.int32, "bool": np.bool_,
}
# Thread attributes MLX's metal_kernel may add (common/metal_kernel.cpp), all emulated.
ATTRIBUTES = {
    "dispatch_quadgroups_per_threadgroup", "dispatch_simdgroups_per_threadgroup",
    "dispatch_threads_per_threadgroup", "grid_origin", "grid_size",
    "quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup",
    "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup", "thread_execution_width",
    "thread_index_in_quadgroup", "thread_index_in_simdgroup", "thread_index_in_threadgroup",
    "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
    "threadgroups_per_grid", "threads_per_grid", "threads_per_simdgroup", "threads_per_threadgroup",
}


class EmulationError(RuntimeError):
    """A kernel failed to translate, compile or run in the emulator."""


def compiler() -> str | None:
    """The clang++ used for emulation (``MLX_W8A8_EMU_CXX`` overrides), or None."""
    return os.environ.get("MLX_W8A8_EMU_CXX") or shutil.which("clang++")


# --------------------------------------------------------------------------------------
# 1. Source capture.
# --------------------------------------------------------------------------------------
_capture_lock = threading.Lock()


@contextlib.contextmanager
def _stdout_to(path: str):
    sys.stdout.flush()
    saved = os.dup(1)
    with open(path, "wb") as sink:
        os.dup2(sink.fileno(), 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def capture_source(kernel, inputs, **call) -> str:
    """The Metal source MLX generates for ``kernel(inputs=inputs, **call)``."""
    call = dict(call, verbose=True)

    def fn(*args):
        return kernel(inputs=list(args), **call)

    with _capture_lock, tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "stdout.txt")
        with _stdout_to(out):
            mx.export_function(os.path.join(tmp, "k.mlxfn"), fn, *inputs)
        text = Path(out).read_text()
    match = re.search(r"Generated source code for `[^`]*`:\n```\n(.*)\n```", text, re.S)
    if not match:
        raise EmulationError(f"MLX printed no kernel source; got: {text[:500]!r}")
    return match.group(1)


# --------------------------------------------------------------------------------------
# 2. Translation.
# --------------------------------------------------------------------------------------
_SIG = re.compile(r"\[\[kernel\]\] void (\w+)\(\n(.*?)\) \{\n", re.S)
_PARAM = re.compile(r"^\s*(.+?)\s*(\w+) \[\[(\w+)(?:\((\d+)\))?\]\]$")
_TG_ARRAY = re.compile(r"(^|[;{}]\s*)(threadgroup\s+[\w:<>, ]+?\s+\w+\s*(?:\[[^\]]+\])+\s*;)", re.M)


def parse_signature(source: str):
    """``(name, template_args, params)``; each param ``(type, name, attr, index)``."""
    sig = _SIG.search(source)
    if not sig:
        raise EmulationError("no [[kernel]] signature in the generated source")
    name, body = sig.group(1), sig.group(2)
    params = []
    for line in body.split(",\n"):
        m = _PARAM.match(line.strip())
        if not m:
            raise EmulationError(f"cannot parse kernel parameter {line!r}")
        ctype, pname, attr, index = m.groups()
        if attr != "buffer" and attr not in ATTRIBUTES:
            raise EmulationError(f"thread attribute [[{attr}]] is not emulated")
        params.append((ctype, pname, attr, None if index is None else int(index)))
    inst = re.search(r"decltype\((" + re.escape(name) + r"<[^()]*>)\)", source)
    return name, (inst.group(1) if inst else name), params


# C++ that clang accepts and the Metal Shading Language does not: no double precision,
# no standard library, no exceptions or dynamic memory, no goto, no function-scope
# statics (the harness adds its own for threadgroup arrays, after this check), no virtual.
_NOT_METAL = re.compile(r"\b(double|std::|throw|try|catch|new|delete|malloc|free|printf|goto|static|virtual|"
                        r"__fp16|_Float16|consteval|constinit|concept|requires|co_await|co_yield|co_return|"
                        r"char8_t)\b|<=>|[{,(]\s*\.[A-Za-z_]\w*\s*=")


def check_metal_language(source: str) -> None:
    """Reject constructs that compile as C++ but not as Metal (comments ignored).

    Raises:
        EmulationError: naming the first such construct and its line.
    """
    code = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), source, flags=re.S)
    code = re.sub(r"//[^\n]*", "", code)
    code = re.sub(r'"[^"\n]*"', '""', code)
    for lineno, line in enumerate(code.splitlines(), 1):
        m = _NOT_METAL.search(line)
        if m:
            what = m.group(1) or m.group(0).strip()
            raise EmulationError(f"line {lineno}: `{what}` is not Metal Shading Language: {line.strip()!r}")


def check_structure(source: str) -> None:
    """Rules about where things are, beyond single lines:

    - ``threadgroup`` arrays are declared in the kernel function only (Metal refuses
      them in helper functions and at namespace scope);
    - a kernel that shares ``threadgroup`` memory must order it with a barrier whose
      flags include ``mem_threadgroup``: ``mem_none`` synchronises execution but is
      not a memory fence (the emulator does not model memory ordering, so it refuses
      the kernel instead of running it as if fenced).

    Raises:
        EmulationError: naming the rule and the line.
    """
    code = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), source, flags=re.S)
    code = re.sub(r"//[^\n]*", "", code)
    sig = _SIG.search(code)
    start = code.rfind("template", 0, sig.start()) if sig else -1
    if sig and (start < 0 or code[start:sig.start()].count(";") or code[start:sig.start()].count("}")):
        start = sig.start()
    outside = code[:start] if sig else code
    m = _TG_ARRAY.search(outside)
    if m:
        line = outside[:m.start(2)].count("\n") + 1
        raise EmulationError(f"line {line}: threadgroup array declared outside the kernel function "
                             f"(Metal allows them only in the kernel): {m.group(2).strip()!r}")
    inside = code[start:] if sig else ""
    if _TG_ARRAY.search(inside) and "mem_flags::mem_none" in inside and "mem_threadgroup" not in inside:
        raise EmulationError("threadgroup memory is shared but every threadgroup_barrier uses mem_flags::mem_none, "
                             "which orders execution, not memory: use mem_flags::mem_threadgroup")


def translate(source: str) -> str:
    """One C++ translation unit: emulation header + rewritten source + launcher."""
    check_metal_language(source)
    check_structure(source)
    _, call_name, params = parse_signature(source)
    body = re.sub(r"\[\[host_name\(\"[^\"]*\"\)\]\]\s*", "", source)
    body = body.replace("[[kernel]] ", "")
    body = re.sub(r" \[\[(\w+)(\(\d+\))?\]\]", lambda m: "" if (m.group(1) == "buffer" or m.group(1) in ATTRIBUTES) else m.group(0), body)
    # The explicit instantiation line: plain C++ spells it `template void f<..>(..);`;
    # the launcher's call instantiates the same specialization, so it is dropped.
    body = re.sub(r"\ntemplate\s+decltype\([^;]*;\n", "\n", body)
    tg_arrays = []

    def make_static(m):
        decl = m.group(2)
        tg_arrays.append(re.search(r"(\w+)\s*\[", decl).group(1))
        return m.group(1) + "static " + decl + f" emu_register_tg_of(&{tg_arrays[-1]}, sizeof({tg_arrays[-1]}));"

    body = _TG_ARRAY.sub(make_static, body)
    args = []
    for ctype, pname, attr, index in params:
        if attr == "buffer":
            if ctype.endswith("&"):
                args.append(f"*({ctype[:-1].strip()}*)bufs[{index}]")
            else:
                args.append(f"({ctype})bufs[{index}]")
        elif attr in ("thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
                      "threads_per_threadgroup", "threadgroups_per_grid", "threads_per_grid", "grid_origin",
                      "grid_size", "dispatch_threads_per_threadgroup"):
            args.append(f"uint3(t.{attr})")
        else:
            args.append(f"t.{attr}")
    launcher = f"""
#line 1 "emu_launcher.cpp"
static void emu_body(const emu::ThreadIds& t, void** bufs) {{
  {call_name}({", ".join(args)});
}}
extern "C" int emu_launch(void** bufs, unsigned gx, unsigned gy, unsigned gz,
                          unsigned tx, unsigned ty, unsigned tz, int policy, char* err, int errlen) {{
  int rc = emu::launch(emu::uvec3{{gx, gy, gz}}, emu::uvec3{{tx, ty, tz}}, emu_body, bufs, emu_reset_tg, policy);
  if (rc) std::snprintf(err, errlen, "%s", emu::rt().error.c_str());
  return rc;
}}
"""
    prologue = """#include "metal_emu.h"
#include "mlx_preamble.h"  // MLX prepends its utils.h to every metal_kernel source
// Threadgroup arrays register themselves on first use; each new group refills them
// with the poison byte so a read before any write sees garbage, not a neighbour's data.
struct EmuTg { void* p; unsigned long n; };
static EmuTg emu_tgs[64];
static int emu_ntg = 0;
static inline int emu_register_tg(void* p, unsigned long n) {
  for (int i = 0; i < emu_ntg; ++i) if (emu_tgs[i].p == p) return 0;
  if (emu_ntg == 64) emu::fail("too many threadgroup arrays");
  emu_tgs[emu_ntg++] = EmuTg{p, n};
  unsigned long total = 0;
  for (int i = 0; i < emu_ntg; ++i) total += emu_tgs[i].n;
  if (total > 32768) emu::fail("threadgroup memory " + std::to_string(total) + " bytes exceeds the 32 KiB of Apple GPUs");
  std::memset(p, %d, n);
  return 0;
}
// The address-space cast lives here, outside kernel.metal, so the address-space pass
// (which refuses every cast between address spaces in kernel.metal) does not see it.
template <class T> static inline int emu_register_tg_of(T* p, unsigned long n) { return emu_register_tg((void*)p, n); }
static void emu_reset_tg() { for (int i = 0; i < emu_ntg; ++i) std::memset(emu_tgs[i].p, %d, emu_tgs[i].n); }
#line 1 "kernel.metal"
""" % (POISON, POISON)
    return prologue + body + launcher


# --------------------------------------------------------------------------------------
# 3. Build.
# --------------------------------------------------------------------------------------
# Metal 3 is C++17-based: -std=c++17 by default. matmul2d is declared with a class-type
# template parameter (the descriptor), which needs C++20 in clang, so a source that
# includes MetalPerformancePrimitives (Metal 4) builds with -std=c++20 and the C++20-only
# constructs Metal does not have are refused by check_metal_language instead.
# Narrowing in braced initialisers is an error, as in Metal.
FLAGS = ["-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
         "-Werror=unknown-attributes", "-Werror=c++11-narrowing", "-Wno-unused-value"]
MPP_INCLUDE = "MetalPerformancePrimitives/MetalPerformancePrimitives.h"


def standard(source: str) -> str:
    """The -std flag a translated source builds with (see FLAGS)."""
    return "-std=c++20" if MPP_INCLUDE in source else "-std=c++17"


def cache_dir() -> Path:
    base = os.environ.get("MLX_W8A8_EMU_CACHE") or os.path.join(tempfile.gettempdir(), "mlx_w8a8_metal_emu")
    Path(base).mkdir(parents=True, exist_ok=True)
    return Path(base)


@functools.lru_cache(maxsize=1)
def _header_stamps() -> tuple[str, ...]:
    """``path:mtime`` of every header a PCH can include (this folder and include/)."""
    files = [HEADER, PREAMBLE, *(p for p in INCLUDE.rglob("*") if p.is_file())]
    return tuple(f"{p.resolve()}:{p.stat().st_mtime_ns}" for p in sorted(files))


def _pch(cxx: str, flags: list[str]) -> Path:
    """A precompiled header of the emulation header and MLX's preamble stand-in for
    ``flags`` (built once per content; it saves about a second of every compile)."""
    text = '#include "metal_emu.h"\n#include "mlx_preamble.h"\n'
    # A PCH records the absolute path and modification time of every header it read,
    # and clang refuses it when either differs: the key holds both, so a PCH built
    # from another checkout, or from an earlier clone at the same path, is not reused.
    key = hashlib.sha256("\0".join([text, HEADER.read_text(), PREAMBLE.read_text(), " ".join(flags), cxx,
                                     *_header_stamps()]).encode()).hexdigest()[:24]
    return _cached(
        cache_dir() / f"emu_{key}.pch", text, ".h", "the emulation header",
        lambda src, out: [cxx, *[f for f in flags if f != "-shared"], "-x", "c++-header",
                          "-I", str(HERE), "-I", str(INCLUDE), str(src), "-o", str(out)],
    )


def _cached(path: Path, text: str, suffix: str, what: str, command) -> Path:
    """``path``, built once from ``text`` (written beside it with ``suffix``) by
    ``command(src, out)``; the result is moved in place atomically, so concurrent test
    processes never load a half-written file. Raises with clang's errors."""
    if path.exists():
        return path
    src = path.with_suffix(suffix)
    src.write_text(text)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run(command(src, tmp), capture_output=True, text=True)
    if proc.returncode != 0:
        raise EmulationError(f"clang rejected {what}:\n{proc.stderr[-6000:]}")
    os.replace(tmp, path)
    return path


def compile_cpp(tu: str) -> Path:
    """Compile ``tu`` to a shared library (cached by content); raises with clang's errors."""
    cxx = compiler()
    if cxx is None:
        raise EmulationError("no clang++ found; the Metal emulation needs clang (apt-get install clang)")
    flags = [standard(tu), *FLAGS]
    key = hashlib.sha256("\0".join([tu, HEADER.read_text(), PREAMBLE.read_text(), " ".join(flags), cxx]).encode()).hexdigest()[:24]
    return _cached(
        cache_dir() / f"k_{key}.so", tu, ".cpp", "the kernel",
        lambda src, out: [cxx, *flags, "-include-pch", str(_pch(cxx, flags)), "-I", str(HERE),
                          "-I", str(INCLUDE), str(src), "-o", str(out)],
    )


_ffi = cffi.FFI()
_ffi.cdef("int emu_launch(void** bufs, unsigned gx, unsigned gy, unsigned gz, unsigned tx, unsigned ty, unsigned tz, int policy, char* err, int errlen);")


@functools.lru_cache(maxsize=None)
def _load(path: str):
    return _ffi.dlopen(path)


# --------------------------------------------------------------------------------------
# 3b. Address spaces as Metal checks them.
# --------------------------------------------------------------------------------------
# Metal refuses every conversion between address spaces (device, constant, threadgroup,
# thread), explicit casts included. Clang's C++ with `address_space(N)` attributes refuses
# the implicit ones (a threadgroup pointer where a device one is expected) but accepts a
# C-style cast between any two, as a reinterpret_cast. C++ for OpenCL refuses those casts
# too, but it is C++17-based in clang 14 (matmul2d's descriptor is a class-type template
# parameter, C++20) and cannot include the emulator's runtime; so this pass asks clang for
# the AST of the very translation unit the emulator builds and refuses every cast whose
# kind is AddressSpaceConversion written in the kernel's own source (kernel.metal: MLX's
# header, the kernel header, the body), where MLX's instantiation has been applied.
_LOC = re.compile(r"(?:\bline:(\d+):\d+|\bcol:\d+|([^\s<>,:()']+):(\d+):\d+)")


def address_space_casts(dump: str, file: str = "kernel.metal") -> list[tuple[int, str]]:
    """``(line, type)`` of every AddressSpaceConversion cast located in ``file``.

    Args:
        dump: clang's text AST dump (``-Xclang -ast-dump``). It prints a location's file
            only when it differs from the last location printed and its line only when
            that differs, so the locations are followed in order to know each node's.

    A dump runs to tens of megabytes (the emulator's runtime and the C++ library) and
    holds a handful of such casts; so only the dump before each cast is read, back to
    the last location that names a file (:func:`_location_of`), never the whole of it.
    """
    found = []
    at = dump.find("<AddressSpaceConversion>")
    while at >= 0:
        start = dump.rfind("\n", 0, at) + 1
        end = dump.find("\n", at)
        text = dump[start:] if end < 0 else dump[start:end]
        where = _location_of(dump, start, text)
        if where is not None and where[0] == file:
            kind = re.search(r"'([^']*)' <AddressSpaceConversion>", text)
            found.append((where[1], kind.group(1) if kind else "?"))
        at = dump.find("<AddressSpaceConversion>", len(dump) if end < 0 else end)
    return found


def _location_of(dump: str, start: int, text: str) -> tuple[str | None, int] | None:
    """``(file, line)`` of the line ``text`` beginning at offset ``start`` of ``dump``:
    where its first location token leaves the locations followed in order from the
    dump's start (``None``: the line has none). Locations are tokens of one line, so
    following them from any line start that precedes a token naming a file gives the
    same state: the window read grows back from ``start`` until it holds one."""
    first = _LOC.search(text)
    if first is None:
        return None
    if first.group(2) is not None:
        return first.group(2), int(first.group(3))
    width = 1 << 14
    while True:
        lo = 0 if width >= start else dump.rfind("\n", 0, start - width) + 1
        cur_file, cur_line, named = None, 0, False
        for m in _LOC.finditer(dump, lo, start):
            if m.group(2) is not None:
                cur_file, cur_line, named = m.group(2), int(m.group(3)), True
            elif m.group(1) is not None:
                cur_line = int(m.group(1))
        if named or lo == 0:
            break
        width *= 4
    if first.group(1) is not None:
        cur_line = int(first.group(1))
    return cur_file, cur_line


def check_address_spaces(tu: str) -> None:
    """Refuse ``tu`` (a translated source) if its kernel code casts between address
    spaces; checked once per content (a stamp file in the cache).

    Raises:
        EmulationError: naming the line of kernel.metal and the cast's target type.
    """
    cxx = compiler()
    if cxx is None:
        raise EmulationError("no clang++ found; the Metal emulation needs clang (apt-get install clang)")
    flags = [standard(tu), "-fsyntax-only", "-fno-color-diagnostics", "-Wno-unused-value"]
    key = hashlib.sha256("\0".join([tu, HEADER.read_text(), PREAMBLE.read_text(), " ".join(flags), cxx,
                                     "address spaces"]).encode()).hexdigest()[:24]
    stamp = cache_dir() / f"as_{key}.ok"
    if stamp.exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "tu.cpp"
        src.write_text(tu)
        proc = subprocess.run([cxx, *flags, "-Xclang", "-ast-dump", "-I", str(HERE), "-I", str(INCLUDE), str(src)],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise EmulationError(f"clang rejected the kernel:\n{proc.stderr[-6000:]}")
    casts = address_space_casts(proc.stdout)
    if casts:
        lines = tu.split('#line 1 "kernel.metal"\n', 1)[-1].splitlines()
        line, kind = casts[0]
        code = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        raise EmulationError(
            f"kernel.metal line {line}: cast between address spaces (to '{kind}'): {code!r}. Metal rejects "
            f"every cast between the device, constant, threadgroup and thread address spaces, even in a "
            f"branch never taken at run time ({len(casts)} such cast(s) in this source)")
    stamp.write_text("ok\n")


# One clang compiles a kernel while another runs the address-space pass on it.
_COMPILER = concurrent.futures.ThreadPoolExecutor(max_workers=1)


def build(source: str):
    """The loaded emulation library for a generated Metal source (compiled once), after
    the address-space pass (:func:`check_address_spaces`).

    The library is compiled while the pass runs; it is loaded only once the pass has
    accepted the source, and the pass's refusal is raised before any compile error (a
    library cached from a refused source is never loaded: every build runs the pass)."""
    tu = translate(source)
    compiled = _COMPILER.submit(compile_cpp, tu)
    try:
        check_address_spaces(tu)
    finally:
        concurrent.futures.wait([compiled])  # no clang left running past the call
    return _load(str(compiled.result()))


# --------------------------------------------------------------------------------------
# 4. Run.
# --------------------------------------------------------------------------------------
def _np_of(arr: mx.array) -> np.ndarray:
    if arr.dtype == mx.bfloat16:
        return np.array(arr.view(mx.uint16))
    return np.array(arr)


def _guarded(data: bytes | None, nbytes: int, fill: int):
    raw = np.full(nbytes + 2 * GUARD, POISON, dtype=np.uint8)
    if data is not None:
        raw[GUARD:GUARD + nbytes] = np.frombuffer(data, dtype=np.uint8)
    else:
        raw[GUARD:GUARD + nbytes] = fill
    return raw


def run_source(source: str, inputs, output_shapes, output_dtypes, grid, threadgroup, init_value=None):
    """Run a generated source on numpy/mx inputs; returns the outputs as mx arrays.

    Buffers bind as MLX's custom_kernel.cpp binds them. ``grid`` counts threads per
    dimension and the threadgroup is clamped to it, as MLX does.
    """
    _, _, params = parse_signature(source)
    lib = build(source)
    by_index = {p[3]: p for p in params if p[2] == "buffer"}
    raws = []
    index = 0
    for arr in inputs:
        a = _np_of(mx.contiguous(arr) if isinstance(arr, mx.array) else mx.array(arr))
        a = np.ascontiguousarray(a)
        raws.append(_guarded(a.tobytes(), a.nbytes, 0))
        index += 1
        if a.ndim > 0:
            for suffix, values, dt in (("_shape", a.shape, np.int32),
                                        ("_strides", [s // a.itemsize for s in a.strides], np.int64),
                                        ("_ndim", [a.ndim], np.int32)):
                if index in by_index and by_index[index][1].endswith(suffix):
                    v = np.array(values, dtype=dt)
                    raws.append(_guarded(v.tobytes(), v.nbytes, 0))
                    index += 1
    out_meta = []
    for shape, dtype in zip(output_shapes, output_dtypes):
        n = int(np.prod(shape)) * dtype.size
        if init_value is None:
            raws.append(_guarded(None, n, POISON))
        else:
            v = np.full(shape, init_value, dtype=np.float32).astype(_NP[_ctype(dtype)])
            raws.append(_guarded(v.tobytes(), n, 0))
        out_meta.append((len(raws) - 1, tuple(shape), dtype, n))
    if len(raws) != len(by_index):
        raise EmulationError(f"bound {len(raws)} buffers, the signature has {len(by_index)}")
    gx, gy, gz = grid
    tx, ty, tz = (min(t, g) for t, g in zip(threadgroup, grid))
    # Run twice, the scheduler scanning threads from the lowest and from the highest
    # index, on fresh copies of every buffer; a race shows as differing results.
    results = []
    for policy in SCHEDULES:
        bufs = [raw.copy() for raw in raws]
        ptrs = _ffi.new("void*[]", len(bufs))
        for i, buf in enumerate(bufs):
            ptrs[i] = _ffi.cast("void*", buf.ctypes.data + GUARD)
        err = _ffi.new("char[]", 4096)
        if lib.emu_launch(ptrs, gx, gy, gz, tx, ty, tz, policy, err, 4096) != 0:
            raise EmulationError(_ffi.string(err).decode())
        for i, buf in enumerate(bufs):
            nbytes = buf.size - 2 * GUARD
            if (buf[:GUARD] != POISON).any() or (buf[GUARD + nbytes:] != POISON).any():
                raise EmulationError(f"out-of-bounds write next to buffer {i} ({by_index[i][1]})")
        results.append([bufs[i][GUARD:GUARD + n] for i, _, _, n in out_meta])
    for j, (first, other) in enumerate(zip(results[0], results[-1])):
        if not np.array_equal(first, other):
            raise EmulationError(
                f"output {j} depends on the order threads are scheduled in (a race: a missing "
                f"barrier or an unsynchronised shared write)")
    outs = []
    for raw, (_, shape, dtype, _) in zip(results[0], out_meta):
        host = raw.view(_NP[_ctype(dtype)]).reshape(shape)
        arr = mx.array(host.copy())
        if dtype == mx.bfloat16:
            arr = arr.view(mx.bfloat16)
        outs.append(arr)
    return outs


def _ctype(dtype) -> str:
    return {mx.float32: "float", mx.float16: "float16_t", mx.bfloat16: "bfloat16_t", mx.int8: "int8_t",
            mx.uint8: "uint8_t", mx.int32: "int32_t", mx.uint32: "uint32_t", mx.int16: "int16_t",
            mx.uint16: "uint16_t", mx.int64: "int64_t", mx.uint64: "uint64_t", mx.bool_: "bool"}[dtype]


# Set to a folder, every source the executor runs is also written there (one file per
# kernel instantiation, named by MLX's kernel name) for Apple's compiler to check:
# tests/metal_emu/metal_compile.py. Not an MLX_W8A8_* name: the test suite's conftest
# removes those from every test's environment.
DUMP_ENV = "METAL_EMU_DUMP"


def dump_source(folder: str, name: str, source: str) -> Path:
    """Write ``source`` to ``folder/name.metal`` (atomically; the same name always holds
    the same source, MLX's kernel names encode template arguments and input spaces)."""
    path = Path(folder) / f"{name}.metal"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(source)
    os.replace(tmp, path)
    return path


def executor(kernel, *, inputs, output_shapes, output_dtypes, grid, threadgroup,
             template=None, init_value=None, **_ignored):
    """Drop-in for calling ``kernel(...)``: captures the source, runs it emulated.

    Also records every source it ran in ``executor.sources`` (name -> source).
    """
    call = dict(output_shapes=output_shapes, output_dtypes=output_dtypes, grid=grid,
                threadgroup=threadgroup, init_value=init_value)
    if template:
        call["template"] = template
    source = capture_source(kernel, inputs, **call)
    name = parse_signature(source)[0]
    executor.sources[name] = source
    dump = os.environ.get(DUMP_ENV)
    if dump:
        dump_source(dump, name, source)
    return run_source(source, inputs, output_shapes, output_dtypes, grid, threadgroup, init_value)


executor.sources = {}
