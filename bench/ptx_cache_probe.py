"""Can a process hand MLX a compiled custom kernel through MLX's own PTX cache?

MLX (0.32, CUDA) compiles every ``mx.fast.cuda_kernel`` with NVRTC the first time a
process evaluates it, and never writes the result to its on-disk PTX cache (its
``custom_kernel.cpp`` builds the module with ``use_disk_cache=false``), so every new
process compiles this package's kernels again (45-128 s of ``warm_up`` on a fresh NVIDIA
H100 for 4 layers of Qwen2.5-7B or Phi-3-mini shapes, docs/cuda.md). Its ``JitModule``
still *reads* the cache for custom kernels: ``<MLX_PTX_CACHE_DIR>/<module>.ptx`` (the
binary) and ``<module>.txt`` (``name<TAB>lowered name`` lines), the module named
``custom_kernel_<name><template hash>_<hex of std::hash of the generated source>``.

This probe checks that reading path on a GPU before anything relies on it:

1. it predicts the module name of a one-line kernel (``out[0] = 7``) from the source
   MLX generates for it (:func:`mlx_source`, after MLX's ``build_kernel``) and
   libstdc++'s ``std::hash`` (:func:`std_hash`);
2. it compiles a *different* body (``out[0] = 42``) with NVRTC and MLX's compiler
   arguments and writes it under that name into an empty cache folder;
3. it runs the kernel: 42 means MLX loaded the file (name, format and arguments all
   match), 7 that it compiled the kernel itself (the prediction missed).

Not run on a GPU yet. Nothing in the package uses this mechanism.

Usage (a CUDA machine): ``python bench/ptx_cache_probe.py``.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile

PROG = "bench/ptx_cache_probe.py"
_MASK = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995  # libstdc++ hash_bytes.cc, 64-bit size_t
_SEED = 0xC70F6907  # std::hash<std::string>'s seed (functional_hash.h)

# MLX's dtype_to_cuda_type (mlx/backend/cuda/utils.cpp) and get_type_string
# (mlx/backend/common/compiled.cpp, the template hash), by MLX dtype name.
CUDA_TYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
    "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
    "uint64": "uint64_t", "float16": "__half", "bfloat16": "__nv_bfloat16",
    "float32": "float", "float64": "double",
}
TYPE_STRINGS = {
    "float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t",
    "float64": "double", "bool": "bool", "int8": "int8_t", "int16": "int16_t",
    "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t",
    "uint32": "uint32_t", "uint64": "uint64_t",
}
DEFAULT_HEADER = (
    '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
)


def std_hash(data: bytes) -> int:
    """libstdc++'s ``std::hash<std::string>`` of ``data`` on a 64-bit platform
    (``_Hash_bytes(data, len, 0xc70f6907)``)."""

    def shift_mix(v: int) -> int:
        return v ^ (v >> 47)

    n = len(data)
    aligned = n & ~7
    h = (_SEED ^ ((n * _MUL) & _MASK)) & _MASK
    for i in range(0, aligned, 8):
        word = int.from_bytes(data[i:i + 8], "little")
        h ^= (shift_mix((word * _MUL) & _MASK) * _MUL) & _MASK
        h = (h * _MUL) & _MASK
    if n & 7:
        h ^= int.from_bytes(data[aligned:], "little")
        h = (h * _MUL) & _MASK
    h = (shift_mix(h) * _MUL) & _MASK
    return shift_mix(h)


def _template_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def mlx_source(name: str, header: str, source: str, inputs, outputs, template=()):
    """``(kernel name, generated source)`` as MLX's ``cuda_kernel`` builds them.

    Args:
        name: the ``name=`` given to ``mx.fast.cuda_kernel``.
        header, source: its ``header=`` and ``source=``.
        inputs: ``[(input name, dtype name, ndim)]`` of the call.
        outputs: ``[(output name, dtype name)]``.
        template: ``[(name, int | bool | dtype name)]`` in call order; a dtype is
            passed as its name in :data:`CUDA_TYPES` (a ``str``).
    """
    suffix = ""
    for _, value in template:
        if isinstance(value, bool):
            suffix += "_t" if value else "_f"
        elif isinstance(value, int):
            suffix += f"_{value}"
        else:
            suffix += "_" + TYPE_STRINGS[value]
    kernel = "custom_kernel_" + name + suffix
    text = DEFAULT_HEADER + header
    text += "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
    text += f"__global__ void {kernel}(\n"
    for arg, dtype, ndim in inputs:
        text += f"    const {CUDA_TYPES[dtype]}* {arg},\n"
        if ndim > 0:
            for part, kind in (("_shape", "Shape"), ("_strides", "Strides"), ("_ndim", "int")):
                if arg + part in source:
                    text += f"    const __grid_constant__ {kind} {arg}{part},\n"
    for i, (arg, dtype) in enumerate(outputs):
        text += f"    {CUDA_TYPES[dtype]}* {arg}"
        text += ",\n" if i < len(outputs) - 1 else ") {\n"
    if template:
        for tname, value in template:
            if isinstance(value, str):
                text += f"  using {tname} = {CUDA_TYPES[value]};\n"
            else:
                kind = "bool" if isinstance(value, bool) else "int"
                text += f"  constexpr {kind} {tname} = {_template_text(value)};\n"
        text += "\n"
    text += source + "\n}\n\n} // namespace mlx::core::cu\n"
    return kernel, text


def module_name(kernel: str, text: str) -> str:
    """The module (and cache file) name MLX gives the kernel built from ``text``."""
    return f"{kernel}_{std_hash(text.encode()):x}"


def _site() -> str:
    import mlx.core as mx
    return os.path.dirname(os.path.dirname(os.path.abspath(mx.__file__)))


def compile_cubin(text: str, kernel: str, cc: tuple[int, int]) -> tuple[bytes, str]:
    """NVRTC-compile ``text`` as MLX does; returns (cubin, lowered name of ``kernel``)."""
    import cffi

    site = _site()
    libs = sorted(glob.glob(os.path.join(site, "nvidia", "**", "libnvrtc.so*"), recursive=True))
    libs = [p for p in libs if "builtins" not in p]
    if not libs:
        raise RuntimeError(f"[{PROG}] no libnvrtc under {site}/nvidia")
    ffi = cffi.FFI()
    ffi.cdef("""
        typedef struct _nvrtcProgram *nvrtcProgram;
        int nvrtcCreateProgram(nvrtcProgram *, const char *, const char *, int,
                               const char * const *, const char * const *);
        int nvrtcAddNameExpression(nvrtcProgram, const char *);
        int nvrtcCompileProgram(nvrtcProgram, int, const char * const *);
        int nvrtcGetProgramLogSize(nvrtcProgram, size_t *);
        int nvrtcGetProgramLog(nvrtcProgram, char *);
        int nvrtcGetLoweredName(nvrtcProgram, const char *, const char **);
        int nvrtcGetCUBINSize(nvrtcProgram, size_t *);
        int nvrtcGetCUBIN(nvrtcProgram, char *);
    """)
    lib = ffi.dlopen(libs[-1])
    includes = [os.path.join(site, "mlx", "include"), os.path.join(site, "mlx", "include", "cccl")]
    includes += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    args = ["--device-as-default-execution-space", f"--gpu-architecture=sm_{cc[0]}{cc[1]}"
            + ("a" if cc[0] >= 9 else "")]
    args += [f"--include-path={p}" for p in includes if os.path.isdir(p)]
    prog = ffi.new("nvrtcProgram *")
    full = "mlx::core::cu::" + kernel
    assert lib.nvrtcCreateProgram(prog, text.encode(), b"probe.cu", 0, ffi.NULL, ffi.NULL) == 0
    assert lib.nvrtcAddNameExpression(prog[0], full.encode()) == 0
    keep = [ffi.new("char[]", a.encode()) for a in args]
    result = lib.nvrtcCompileProgram(prog[0], len(keep), ffi.new("char *[]", keep))
    if result != 0:
        size = ffi.new("size_t *")
        lib.nvrtcGetProgramLogSize(prog[0], size)
        log = ffi.new(f"char[{size[0]}]")
        lib.nvrtcGetProgramLog(prog[0], log)
        raise RuntimeError(f"[{PROG}] NVRTC failed ({result}): {ffi.string(log).decode()}")
    lowered = ffi.new("const char **")
    assert lib.nvrtcGetLoweredName(prog[0], full.encode(), lowered) == 0
    size = ffi.new("size_t *")
    assert lib.nvrtcGetCUBINSize(prog[0], size) == 0
    buf = ffi.new(f"char[{size[0]}]")
    assert lib.nvrtcGetCUBIN(prog[0], buf) == 0
    return bytes(ffi.buffer(buf, size[0])), ffi.string(lowered[0]).decode()


def main() -> int:
    import mlx.core as mx

    if not mx.cuda.is_available():
        print(f"{PROG}: needs MLX's CUDA backend with a GPU", file=sys.stderr)
        return 2
    # Hazard: MLX reads MLX_PTX_CACHE_DIR once, at its first compile in the process.
    cache = tempfile.mkdtemp(prefix="ptx_probe_")
    os.environ["MLX_PTX_CACHE_DIR"] = cache
    name, body, header = "ptx_probe", "out[0] = 7;", ""
    kernel, text = mlx_source(name, header, body, [("x", "float32", 1)], [("out", "int32")])
    module = module_name(kernel, text)
    _, planted = mlx_source(name, header, "out[0] = 42;", [("x", "float32", 1)],
                            [("out", "int32")])
    info = mx.device_info()
    cc = (int(info["compute_capability_major"]), int(info["compute_capability_minor"]))
    cubin, lowered = compile_cubin(planted, kernel, cc)
    with open(os.path.join(cache, module + ".ptx"), "wb") as f:
        f.write(cubin)
    with open(os.path.join(cache, module + ".txt"), "w") as f:
        f.write(f"mlx::core::cu::{kernel}\t{lowered}\n")
    k = mx.fast.cuda_kernel(name=name, input_names=["x"], output_names=["out"], source=body,
                            header=header)
    (out,) = k(inputs=[mx.zeros((1,))], output_shapes=[(1,)], output_dtypes=[mx.int32],
               grid=(1, 1, 1), threadgroup=(1, 1, 1))
    value = int(out.item())
    verdict = {42: "loaded from the planted cache file: the prediction holds",
               7: "compiled by MLX: the predicted module name or file format missed"}
    print(f"{PROG}: MLX {mx.__version__}, module {module}: out = {value}, "
          f"{verdict.get(value, 'unexpected')}")
    return 0 if value == 42 else 1


if __name__ == "__main__":
    sys.exit(main())
