"""bench/ptx_cache_probe.py on this CPU: its port of libstdc++'s ``std::hash`` against
the real one (a C++ program compiled here), the generated kernel text it predicts, and
its refusal without MLX's CUDA backend."""

import os
import shutil
import subprocess
import sys

import mlx.core as mx
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import ptx_cache_probe as probe  # noqa: E402

CXX = shutil.which("g++") or shutil.which("clang++")


def _strings():
    """Lengths 0-17 (every tail length of the 8-byte loop, with and without a full
    word), bytes above 0x7f (the tail's bytes must be read unsigned) and a kernel text
    of a few kilobytes, as the module names hash."""
    out = [bytes(range(65, 65 + n)) for n in range(18)]
    out.append(b"\xff\xfe\x80\x81\x7f\x00\x01\x02\x03\xf0")
    _, text = probe.mlx_source("w8a8_gemm_ws_tma_0123456789ab", '#include "/x/y.cuh"\n',
                               "int r = rows(x_shape, x_ndim);\nout[0] = r;",
                               [("x", "bfloat16", 2), ("w", "uint32", 2)],
                               [("out", "bfloat16")], [("BM", 128), ("PING", True)])
    out.append(text.encode())
    return out


@pytest.mark.skipif(CXX is None, reason="no C++ compiler to build the reference std::hash")
def test_std_hash_matches_libstdcxx(tmp_path):
    src = tmp_path / "h.cc"
    src.write_text(
        "#include <cstdio>\n#include <functional>\n#include <iostream>\n#include <iterator>\n"
        "#include <string>\nint main() { std::string line;\n"
        "  std::string all((std::istreambuf_iterator<char>(std::cin)), {});\n"
        "  size_t start = 0;\n"
        "  while (start < all.size()) { size_t n = std::stoul(all.substr(start, 8), nullptr, 16);\n"
        "    std::string s = all.substr(start + 8, n); start += 8 + n;\n"
        "    std::printf(\"%zx\\n\", std::hash<std::string>{}(s)); } }\n")
    exe = tmp_path / "h"
    subprocess.run([CXX, "-O1", "-o", str(exe), str(src)], check=True)
    strings = _strings()
    data = b"".join(f"{len(s):08x}".encode() + s for s in strings)
    got = subprocess.run([str(exe)], input=data, capture_output=True, check=True).stdout.split()
    assert len(got) == len(strings)
    for s, want in zip(strings, got):
        assert f"{probe.std_hash(s):x}" == want.decode(), s[:20]


def test_generated_text_follows_mlx_build_kernel():
    kernel, text = probe.mlx_source(
        "k", "// header\n", "out[0] = x_shape[0];", [("x", "float32", 1), ("s", "float32", 0)],
        [("out", "int32"), ("o2", "bfloat16")], [("N", 3), ("F", False), ("T", "bfloat16")])
    assert kernel == "custom_kernel_k_3_f_bfloat16_t"
    assert text.startswith(probe.DEFAULT_HEADER + "// header\nnamespace mlx::core::cu {")
    # x is used with _shape only; s is a scalar array (ndim 0): no shape arguments
    assert ("__global__ void custom_kernel_k_3_f_bfloat16_t(\n    const float* x,\n"
            "    const __grid_constant__ Shape x_shape,\n    const float* s,\n"
            "    int32_t* out,\n    __nv_bfloat16* o2) {\n  constexpr int N = 3;\n"
            "  constexpr bool F = false;\n  using T = __nv_bfloat16;\n\nout[0] = x_shape[0];"
            "\n}\n\n} // namespace mlx::core::cu\n") in text
    assert probe.module_name(kernel, text) == f"{kernel}_{probe.std_hash(text.encode()):x}"


def test_the_probe_needs_the_cuda_backend(capsys):
    if mx.cuda.is_available():
        pytest.skip("this machine has MLX's CUDA backend: the probe would run")
    assert probe.main() == 2
    assert "needs MLX's CUDA backend" in capsys.readouterr().err
