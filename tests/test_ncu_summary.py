"""``bench/ncu_summary.py``: warp-stall samples by reason, shared-memory wavefronts and
instructions by opcode, and the most-sampled instructions, from the CSV Nsight Compute's
source page writes (one block per kernel)."""

import gzip
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import ncu_summary  # noqa: E402

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
          '"L1 Wavefronts Shared","stall_barrier","stall_wait","stall_short_sb",'
          '"stall_barrier (Not Issued)"')


def block(name: str, rows: list[str]) -> str:
    return "\n".join([f'"Kernel Name","{name}",', HEADER, *rows])


# Two kernels: the first with a predicated LDS.128 (its opcode is LDS), the second small.
CSV = "\n".join([
    block("k_grouped", [
        '"0x10","      WARPGROUP.DEPBAR.LE gsb0, 0x0","7","100","0","6","1","0","99"',
        '"0x20","      @!P0 LDS.128 R4, [R1+0x10]","3","400","1,600","0","1","2","0"',
        '"0x30","      IGMMA.64x128x32.S8.U8 R24, gdesc[UR20], RZ","1","100","800","0","1","0","0"',
        '"0x40","      LDS.128 R8, [R1+0x20]","2","400","1600","0","0","2","0"',
    ]),
    block("k_channel", ['"0x10","      FFMA R1, R2, R3, R1","4","10","0","0","4","0","0"']),
])


def test_sums_reasons_and_wavefronts_per_kernel():
    (name, rows), (name2, rows2) = ncu_summary.kernels(CSV)
    assert (name, name2) == ("k_grouped", "k_channel") and len(rows) == 4 and len(rows2) == 1
    text = ncu_summary.summary(name, rows, top=2)
    assert "warp-stall samples 13" in text
    assert "barrier" in text and " 6  46.2%" in text  # 6 of 13 samples
    assert "Not Issued" not in text  # the not-issued breakdown repeats samples: left out
    assert "short_sb" in text and " 4  30.8%" in text
    # "1,600" read as 1600; the predicate does not hide the opcode.
    assert "shared-memory wavefronts 4000: LDS 3200 (80%), IGMMA 800 (20%)" in text
    assert "LDS 800" in text  # executed, both LDS rows
    top = text.split("most samples")[1]
    assert top.index("WARPGROUP.DEPBAR") < top.index("@!P0 LDS.128") and "IGMMA" not in top
    assert "barrier 6, wait 1" in top


def test_reads_gzip_and_refuses_a_file_without_kernels(tmp_path, capsys):
    path = tmp_path / "s.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(CSV)
    assert ncu_summary.main([str(path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("kernel k_") == 2
    empty = tmp_path / "e.csv"
    empty.write_text("not a source page\n")
    with pytest.raises(SystemExit, match="no kernel blocks"):
        ncu_summary.main([str(empty)])
