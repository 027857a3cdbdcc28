"""``bench/sass_diff.py``: what its comparison of two kernel builds' machine code leaves
out (the kernel's name and digest, the order of functions) and what it must catch (an
instruction, a resource count, a constant bank's bytes). No compiler needed: the dumps
are written here in ``cuobjdump -sass -res-usage``'s format."""

import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import sass_diff  # noqa: E402


def _text(name: str) -> str:
    return f"namespace mlx::core::cu {{\n__global__ void {name}(\n    const float* x) {{\n}}\n}}\n"


def _dump(name: str, helper_first: bool = False, insn: str = "IADD3 R1, R2, 0x8, RZ",
          regs: int = 32, data: str = "00ff") -> str:
    mangled = f"_ZN3mlx4core2cu{len(name)}{name}EPKf"
    res = [f" Function {mangled}:", f"  REG:{regs} STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:544",
           " Function _Z6helperv:", "  REG:8 STACK:0 SHARED:0 LOCAL:0"]
    kernel = [f"\t\tFunction : {mangled}", "\t.headerflags\t@\"EF_CUDA_SM90\"",
              f"        /*0000*/                   {insn} ;   /* 0x0000000802017810 */",
              "        /*0010*/                   EXIT ;          /* 0x000000000000794d */"]
    helper = ["\t\tFunction : _Z6helperv", "        /*0000*/  RET.ABS.NODEC R20 0x0 ;"]
    sass = helper + kernel if helper_first else kernel + helper
    return "\n".join(["", "Resource usage:", " Common:", "  GLOBAL:0", *res, "",
                      "\tcode for sm_90a", "\t.target\tsm_90a", "", *sass, "",
                      f"Data .nv.constant3: {data}"]) + "\n"


def _same(a: str, text_a: str, b: str, text_b: str) -> list[str]:
    return sass_diff.differences(sass_diff.normalize(a, text_a), sass_diff.normalize(b, text_b))


def test_the_kernel_name_its_digest_and_the_function_order_do_not_count():
    old, new = "w8a8_gemm_ws_int32_0123456789ab", "w8a8_gemm_ws_int32_ba9876543210"
    assert _same(_dump(old), _text(old), _dump(new, helper_first=True), _text(new)) == []


def test_an_instruction_a_register_count_or_a_constant_differs():
    name = "custom_kernel_w8a8_quantize_plain"
    base = _dump(name)
    for changed in (_dump(name, insn="IADD3 R1, R2, 0x9, RZ"), _dump(name, regs=40),
                    _dump(name, data="01ff")):
        lines = _same(base, _text(name), changed, _text(name))
        assert lines and "differ" in lines[0], changed
    # a function only one side has
    only = _same(base, _text(name), base.replace("_Z6helperv", "_Z7helper2v"), _text(name))
    assert any("only at the commit" in ln for ln in only)
    assert any("only in this tree" in ln for ln in only)


def test_data_sections_read_the_constant_banks_of_an_elf64_file():
    names = b"\0.shstrtab\0.nv.constant3\0.nv.constant0.k\0.text.k\0"
    bank3, bank0 = bytes(range(8)), b"\x11" * 4
    body = names + bank3 + bank0
    shoff = 64 + len(body)
    heads = [(0, 0, 0, 0, 0, 0),  # the null section
             (1, 3, 0, 0, 64, len(names)),  # .shstrtab
             (11, 1, 0, 0, 64 + len(names), len(bank3)),  # .nv.constant3, PROGBITS
             (25, 1, 0, 0, 64 + len(names) + len(bank3), len(bank0)),  # parameters: left out
             (41, 8, 0, 0, 0, 16)]  # NOBITS: no bytes
    header = bytearray(64)
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, len(heads), 1)
    table = b"".join(struct.pack("<IIQQQQ", *h) + bytes(24) for h in heads)
    assert sass_diff.data_sections(bytes(header) + body + table) == [
        "Data .nv.constant3: 0001020304050607"]


def test_an_added_template_argument_maps_builds_to_the_commits_labels():
    """--added RT=1: this tree's RT=1 builds compare with the commit's labels without RT;
    builds at another RT are new code; with nothing added the label is kept."""
    label = "gemv_mma.cu:grouped:T=bfloat16,ST=float16,GS=64,NT=2,W=8,D=2"
    assert sass_diff.old_label(label + ",RT=1", "RT=1") == label
    assert sass_diff.old_label(label + ",RT=2", "RT=1") is None
    assert sass_diff.old_label(label, "RT=1") == label
    assert sass_diff.old_label(label + ",RT=1", "") == label + ",RT=1"
    assert sass_diff.old_label("gemv_mma.cu:channel:RT=1,T=float32", "RT=1") == "gemv_mma.cu:channel:T=float32"
