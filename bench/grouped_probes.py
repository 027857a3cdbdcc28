"""Probe kernels of the group-wise TMA GEMM: copies of ``gemm_grouped_ws.cu`` with one part
of the work removed, for ``bench/tile_gpu_time.py --grouped 64 --kernel-dir DIR/<probe>``,
which times each beside the shipped kernel in one process (their outputs differ by
design: they measure where the time goes, not a result).

- ``nopromo``: the promotion reduced to one float add per accumulator (the MMAs, the
  loads and the epilogue stay);
- ``noterm``: the promotion's arithmetic with its ``(s, o)`` terms constants instead of
  shared-memory loads;
- ``nomma``: no wgmma (the int32 set keeps made-up values), the promotion and everything
  else as shipped;
- ``sonly``: the promotion that would remain if the offset term ``o R`` left the
  mainloop (for instance as bfloat16 wgmmas before it): per accumulator the integer
  add and float subtract of the exact conversion and one FMA by ``s``, the terms loaded
  as ``s`` alone (8 bytes per column pair instead of 16). The rows' ``R`` are loaded as
  shipped and not used.
- ``denorm``: one FMA per accumulator and group, the int32 partial read as a float32
  subnormal (``P * 2^-149`` for ``0 <= P < 2^23``) and multiplied by ``s`` (scaled by a
  power of two in a real kernel), ``s`` loaded alone as in ``sonly``: the promotion of
  a design with unsigned activation codes (``P >= 0``) and the offset term out of the
  mainloop. FMAs by inline PTX without ``.ftz``, so subnormals are not flushed.
- ``denorm2``: ``denorm`` with the offset term kept in the mainloop (a second FMA by
  ``o`` and the row's ``R``, the ``(s, o)`` terms loaded as shipped): two FMAs per
  accumulator and group.
- ``sub_s8``: the subnormal promotion with its u8 x u8 wgmmas issued as s8 x u8 (the
  per-channel and epilogue-form kernels' types);
- ``sub_nopromo``: the subnormal promotion reduced to one float add per accumulator and
  group (no terms loads): the floor of its mainloop.

Two more take the subnormal mainloop itself apart (``gemm_subnormal.cu``, with
``sub_nopromo``'s ``gemm_grouped_ws.cu``), to tell what that floor is made of:

- ``sub_acc``: ``sub_nopromo`` with each group's first wgmma accumulating into its set
  instead of restarting it (scale-d 1): the sets never restart, the waits stay;
- ``sub_nowait``: no promotion and no wait between a block's groups (one at its end):
  a block's wgmmas issued back to back, each group still restarting its set. A stage is
  then released while wgmmas reading it may still run, so this is a bound on the
  mainloop's speed, not a kernel.

And two of the dequantizing GEMM (``gemm_dequant.cu``: MLX's affine weights dequantized
on chip into wgmma's register operand), to tell its fragment building from the rest:

- ``dq_nodq``: each 4-bit fragment is the code words as loaded from shared memory (the
  loads stay; the byte permutes, the packed fmas with the group's scale and bias and the
  terms' global loads go);
- ``dq_noload``: each 4-bit fragment a constant (no fragment loads either): the bound of
  its MMAs, TMA loads, ring and epilogue. Both change the 4-bit path only.

Usage: ``python bench/grouped_probes.py DIR`` writes ``DIR/<probe>/gemm_grouped_ws.cu``
(``gemm_subnormal.cu`` too for the mainloop probes, ``gemm_dequant.cu`` alone for the
dequantizing GEMM's).
Each edit is checked to apply exactly once, so a changed kernel file stops it with an
error instead of a probe that measures something else. Needs no GPU.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mlx_w8a8.kernels import sources  # noqa: E402

FILE = "gemm_grouped_ws.cu"
SUB_FILE = "gemm_subnormal.cu"
# The subnormal mainloop's parts the mainloop probes change (gemm_subnormal.cu).
SUB_FIRST = "wgmma_uu_step<BN>(d, sa, sb, j * kSteps, 0);"
SUB_WAIT = "wgmma_wait<1>();  // group u complete, u + 1 in flight"
SUB_PROMOTE = "pin_set<BN>(d);\n    subnormal_promote<BN>(f, d, sp);"
DQ_FILE = "gemm_dequant.cu"
# The dequantizing GEMM's 4-bit fragment build (gemm_dequant.cu's kstep).
DQ_LOADS = "const uint2 x0 = dq_lds2(wa + off), x1 = dq_lds2(wb + off);\n"
DQ_BUILD = """          a[ks][0] = DqType<T>::fma2(dq_codes4<T>(x0.x, sel4), ta.s[h], ta.b[h]);
          a[ks][1] = DqType<T>::fma2(dq_codes4<T>(x1.x, sel4), tb.s[h], tb.b[h]);
          a[ks][2] = DqType<T>::fma2(dq_codes4<T>(x0.y, sel4), ta.s[h], ta.b[h]);
          a[ks][3] = DqType<T>::fma2(dq_codes4<T>(x1.y, sel4), tb.s[h], tb.b[h]);"""
# grouped_promote's column loop: the one whose terms are a float4 t (shipped: loaded by
# lds_f4; the noterm probe: constants).
LOOP = "#pragma unroll\n  for (int c = 0; c < BN / 8; ++c) {\n    const float4 t = "
TERMS = "const float4 t = lds_f4(ts + (j * BN + 8 * c + 2 * tq) * 8);  // s0, o0, s1, o1"
MMAS = """#pragma unroll
          for (int ks = 0; ks < kSteps; ++ks)
            wgmma_step<true, BN>(d, sa, sb, j * kSteps + ks, ks != 0);
          wgmma_commit();"""
SETS = """  int d[BN / 2];
  float f[BN / 2];"""


def once(text: str, old: str, new: str, file: str = FILE) -> str:
    if text.count(old) != 1:
        raise SystemExit(f"[grouped_probes] {file} no longer has exactly one {old[:60]!r}")
    return text.replace(old, new)


def probes(text: str) -> dict[str, str]:
    """``{probe: kernel file text}`` (the module docstring says what each removes)."""
    if text.count(LOOP) != 1:
        raise SystemExit(f"[grouped_probes] {FILE} no longer has exactly one {LOOP[:60]!r}")
    start = text.index(LOOP)
    end = text.index("\n}\n", start)  # the promotion loop closes grouped_promote
    nop = ("#pragma unroll\n  for (int i = 0; i < BN / 2; ++i) f[i] += __int_as_float(d[i]);\n"
           "  (void)ts; (void)j; (void)tq; (void)clo; (void)chi; (void)rlo; (void)rhi;"
           " (void)t_lo; (void)t_hi;")
    noterm = once(text[start:end], TERMS,
                  "const float4 t = make_float4(1.f + c, 0.5f, 2.f + c, 0.25f);"
                  "  // probe: no terms loads")
    nomma = once(text, MMAS, "          (void)sa; (void)sb;  // probe: no MMAs, the set keeps its values\n"
                             "          wgmma_commit();")
    nomma = once(nomma, SETS, SETS + "\n#pragma unroll\n"
                 "  for (int i = 0; i < BN / 2; ++i) d[i] = i * (tid + 1);"
                 "  // probe: the set never written by MMAs")
    p = [f"    const float p{i} = __fsub_rn(__int_as_float(d[4 * c + {i}] + 0x4B400000), kRound);\n"
         for i in range(4)]
    sonly = ("#pragma unroll\n  for (int c = 0; c < BN / 8; ++c) {\n"
             "    float2 s;  // probe: s0, s1 alone\n"
             "    asm volatile(\"ld.volatile.shared.v2.f32 {%0, %1}, [%2];\\n\"\n"
             "                 : \"=f\"(s.x), \"=f\"(s.y) : \"r\"(ts + (j * BN + 8 * c + 2 * tq) * 4));\n"
             + "".join(p) +
             "    f[4 * c] = __fmaf_rn(s.x, p0, f[4 * c]);\n"
             "    f[4 * c + 1] = __fmaf_rn(s.y, p1, f[4 * c + 1]);\n"
             "    f[4 * c + 2] = __fmaf_rn(s.x, p2, f[4 * c + 2]);\n"
             "    f[4 * c + 3] = __fmaf_rn(s.y, p3, f[4 * c + 3]);\n"
             "  }\n"
             "  (void)clo; (void)chi; (void)rlo; (void)rhi; (void)t_lo; (void)t_hi;")
    fma = ("__device__ __forceinline__ float probe_fma(float a, float b, float c) {\n"
           "  float r;  // fma.rn.f32 without .ftz: subnormal a is kept\n"
           "  asm(\"fma.rn.f32 %0, %1, %2, %3;\" : \"=f\"(r) : \"f\"(a), \"f\"(b), \"f\"(c));\n"
           "  return r;\n}\n\n")
    head = text[:start]
    fn = head.rindex("template <int BN")  # grouped_promote's template line
    head = head[:fn] + fma + head[fn:]
    denorm = ("#pragma unroll\n  for (int c = 0; c < BN / 8; ++c) {\n"
              "    float2 s;  // probe: s0, s1 alone\n"
              "    asm volatile(\"ld.volatile.shared.v2.f32 {%0, %1}, [%2];\\n\"\n"
              "                 : \"=f\"(s.x), \"=f\"(s.y) : \"r\"(ts + (j * BN + 8 * c + 2 * tq) * 4));\n"
              + "".join(f"    f[4 * c + {i}] = probe_fma(__int_as_float(d[4 * c + {i}]), s.{'xy'[i % 2]}, f[4 * c + {i}]);\n"
                        for i in range(4)) +
              "  }\n"
              "  (void)clo; (void)chi; (void)rlo; (void)rhi; (void)t_lo; (void)t_hi;")
    denorm2 = ("#pragma unroll\n  for (int c = 0; c < BN / 8; ++c) {\n"
               "    const float4 t = lds_f4(ts + (j * BN + 8 * c + 2 * tq) * 8);  // s0, o0, s1, o1\n"
               + "".join(f"    f[4 * c + {i}] = probe_fma({'t.y' if i % 2 == 0 else 't.w'}, {'rlo' if i < 2 else 'rhi'}, "
                         f"probe_fma(__int_as_float(d[4 * c + {i}]), {'t.x' if i % 2 == 0 else 't.z'}, f[4 * c + {i}]));\n"
                         for i in range(4)) +
               "  }\n"
               "  (void)clo; (void)chi; (void)t_lo; (void)t_hi;")
    sub_start = text.index("__device__ __forceinline__ void subnormal_promote(")
    sub_body = text.index("#pragma unroll", sub_start)
    sub_end = text.index("\n}\n", sub_body)
    sub_nopromo = (text[:sub_body] + "#pragma unroll\n  for (int i = 0; i < BN / 2; ++i) "
                   "f[i] += __int_as_float(d[i]);  // probe: no promotion\n  (void)p;"
                   + text[sub_end:])
    sub_s8 = text
    for n in ("128", "64", "32"):
        sub_s8 = once(sub_s8, f'W8A8_WGMMA("{n}", "u8.u8"', f'W8A8_WGMMA("{n}", "s8.u8"')
    return {"nopromo": text[:start] + nop + text[end:],
            "sub_s8": sub_s8, "sub_nopromo": sub_nopromo,
            "denorm": head + denorm + text[end:],
            "denorm2": head + denorm2 + text[end:],
            "noterm": text[:start] + noterm + text[end:],
            "nomma": nomma,
            "sonly": text[:start] + sonly + text[end:]}


def mainloop_probes(grouped: str, sub: str) -> dict[str, dict[str, str]]:
    """``{probe: {file: text}}``: the probes of the subnormal mainloop (``sub_acc``,
    ``sub_nowait``; the module docstring says what each removes), from the kernel files'
    texts ``grouped`` (gemm_grouped_ws.cu) and ``sub`` (gemm_subnormal.cu)."""
    nopromo = probes(grouped)["sub_nopromo"]
    acc = once(sub, SUB_FIRST, SUB_FIRST.replace(", 0);", ", 1);  // probe: the set never restarts"),
               SUB_FILE)
    nowait = once(sub, SUB_WAIT, "// probe: no wait between groups", SUB_FILE)
    nowait = once(nowait, SUB_PROMOTE, "(void)d;  // probe: no promotion", SUB_FILE)
    return {"sub_acc": {FILE: nopromo, SUB_FILE: acc},
            "sub_nowait": {SUB_FILE: nowait}}


def dequant_probes(text: str) -> dict[str, dict[str, str]]:
    """``{probe: {gemm_dequant.cu: text}}``: the dequantizing GEMM's probes (``dq_nodq``,
    ``dq_noload``; the module docstring says what each removes) from that file's text."""
    nodq = once(text, DQ_BUILD, "\n".join(
        f"          a[ks][{i}] = {w};  // probe: the loaded words, not dequantized"
        for i, w in enumerate(("x0.x", "x1.x", "x0.y", "x1.y"))), DQ_FILE)
    noload = once(text, DQ_LOADS + DQ_BUILD, "\n".join(
        f"          a[ks][{i}] = 0x3f803f80u ^ (ks + {i});  // probe: no loads, a constant"
        for i in range(4)).lstrip() + "\n          (void)wa; (void)wb; (void)off; (void)h;", DQ_FILE)
    return {"dq_nodq": {DQ_FILE: nodq}, "dq_noload": {DQ_FILE: noload}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="where to write <probe>/gemm_grouped_ws.cu (and gemm_subnormal.cu)")
    args = p.parse_args(argv)
    grouped, sub = sources.read("cuda", FILE), sources.read("cuda", SUB_FILE)
    written = {name: {FILE: text} for name, text in probes(grouped).items()}
    written.update(mainloop_probes(grouped, sub))
    written.update(dequant_probes(sources.read("cuda", DQ_FILE)))
    for name, files in written.items():
        os.makedirs(os.path.join(args.dir, name), exist_ok=True)
        for file, text in files.items():
            with open(os.path.join(args.dir, name, file), "w", encoding="utf-8") as f:
                f.write(text)
            print(f"{args.dir}/{name}/{file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
