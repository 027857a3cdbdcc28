"""``bench/grouped_probes.py``: each probe of the group-wise TMA GEMM removes exactly the
work it names from the shipped kernel file and nothing else; a kernel file the edits no
longer fit stops it with an error, not a probe that measures something else."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import grouped_probes  # noqa: E402

from mlx_w8a8.kernels import sources  # noqa: E402


def promotion(text: str) -> str:
    """grouped_promote's column loop (grouped_probes.LOOP, once in the file)."""
    assert text.count(grouped_probes.LOOP) == 1
    start = text.index(grouped_probes.LOOP)
    return text[start:text.index("\n}\n", start)]


def changed_lines(a: str, b: str) -> tuple[list[str], list[str]]:
    """(lines only in a, lines only in b)."""
    la, lb = a.splitlines(), b.splitlines()
    return [ln for ln in la if ln not in lb], [ln for ln in lb if ln not in la]


def test_each_probe_removes_only_its_part():
    shipped = sources.read("cuda", grouped_probes.FILE)
    probes = grouped_probes.probes(shipped)
    assert set(probes) == {"nopromo", "noterm", "nomma", "sonly", "denorm", "denorm2",
                           "sub_s8", "sub_nopromo"}
    loop = promotion(shipped)
    before, after = shipped.split(loop)
    # nopromo: the promotion's loop replaced by one add per accumulator, the rest as shipped
    nop = probes["nopromo"]
    assert nop.startswith(before) and nop.endswith(after) and grouped_probes.LOOP not in nop
    assert "f[i] += __int_as_float(d[i]);" in nop[len(before):len(nop) - len(after)]
    # noterm: the same loop with constant terms, its arithmetic kept
    nt = promotion(probes["noterm"])
    assert "lds_f4" not in nt and "make_float4(1.f + c" in nt
    assert nt.count("__fmaf_rn") == loop.count("__fmaf_rn") and nt.count("__fsub_rn") == 4
    assert probes["noterm"] == before + nt + after
    # nomma: no wgmma in the plain path (the pipelined path keeps its own), the promotion
    # as shipped
    assert shipped.count("wgmma_step<true, BN>(d, sa, sb") == 1
    assert probes["nomma"].count("wgmma_step<true, BN>(d, sa, sb") == 0
    assert promotion(probes["nomma"]) == loop
    # sonly: per accumulator the exact conversion without the R shift and one FMA by s,
    # s loaded alone (8 bytes per column pair); no offset term, the rest as shipped
    sp = probes["sonly"]
    assert sp.startswith(before) and sp.endswith(after) and grouped_probes.LOOP not in sp
    so = sp[len(before):len(sp) - len(after)]
    assert "lds_f4" not in so and so.count("ld.volatile.shared.v2.f32") == 1
    assert so.count("__fsub_rn") == 4 and so.count("+ 0x4B400000)") == 4
    for i, sc in enumerate("xyxy"):  # accumulator i: its own p_i, its column's s
        acc = "f[4 * c]" if i == 0 else f"f[4 * c + {i}]"
        assert f"{acc} = __fmaf_rn(s.{sc}, p{i}, {acc});" in so
    assert so.count("__fmaf_rn") == 4 and "rlo" not in so.split("(void)")[0]
    assert "(j * BN + 8 * c + 2 * tq) * 4" in so  # s alone: 4 bytes per column


def test_a_kernel_file_the_edits_no_longer_fit_stops_it():
    shipped = sources.read("cuda", grouped_probes.FILE)
    changed = shipped.replace("wgmma_step<true, BN>(d, sa, sb, j * kSteps + ks, ks != 0);",
                              "wgmma_step<true, BN>(d, sa, sb, j * kSteps + ks, ks > 0);")
    with pytest.raises(SystemExit, match="no longer has exactly one"):
        grouped_probes.probes(changed)


def test_promotion_probes_change_their_part_only():
    """denorm / denorm2: the promotion as one / two non-.ftz FMAs (the subnormal read of
    the int32 set); the sub_* probes: the subnormal body without its offset wgmma, with
    s8 x u8 types, with one add per accumulator; every other line as shipped."""
    shipped = sources.read("cuda", grouped_probes.FILE)
    probes = grouped_probes.probes(shipped)
    loop = promotion(shipped)
    before, after = shipped.split(loop)
    for name, fmas in (("denorm", 4), ("denorm2", 8)):
        text = probes[name]
        assert text.endswith(after) and "probe_fma(float a" in text
        body = text[text.index("#pragma unroll\n  for (int c = 0; c < BN / 8; ++c) {"):-len(after)]
        assert body.count("probe_fma(") == fmas and "__int_as_float(d[4 * c" in body
        assert ("lds_f4" in body) == (name == "denorm2")
    assert "fma.rn.f32 %0" in probes["denorm"]  # no .ftz: the subnormal is kept

    def changed(a, b):  # the lines of b not in a
        return [ln for ln in b.splitlines() if ln not in a.splitlines()]
    s8 = changed(shipped, probes["sub_s8"])
    assert len(s8) == 3 and all('"s8.u8"' in ln for ln in s8) and '"u8.u8"' not in probes["sub_s8"]
    nop = changed(shipped, probes["sub_nopromo"])
    assert any("f[i] += __int_as_float(d[i]);" in ln for ln in nop)
    assert "fma_keep_subnormal(__int_as_float" not in probes["sub_nopromo"]


def test_mainloop_probes_change_their_part_only():
    """sub_acc: sub_nopromo's promotion file and each group's first wgmma accumulating
    (scale-d 1); sub_nowait: the subnormal mainloop without its per-group wait and
    promotion, the group-wise file as shipped (not written)."""
    grouped = sources.read("cuda", grouped_probes.FILE)
    sub = sources.read("cuda", grouped_probes.SUB_FILE)
    probes = grouped_probes.mainloop_probes(grouped, sub)
    assert set(probes) == {"sub_acc", "sub_nowait"}

    acc = probes["sub_acc"]
    assert acc[grouped_probes.FILE] == grouped_probes.probes(grouped)["sub_nopromo"]
    gone, new = changed_lines(sub, acc[grouped_probes.SUB_FILE])
    assert [ln.strip() for ln in gone] == [grouped_probes.SUB_FIRST]
    assert len(new) == 1 and "j * kSteps, 1);" in new[0]
    nowait = probes["sub_nowait"]
    assert set(nowait) == {grouped_probes.SUB_FILE}
    gone, new = changed_lines(sub, nowait[grouped_probes.SUB_FILE])
    assert sorted(ln.strip() for ln in gone) == sorted(
        [grouped_probes.SUB_WAIT, *(ln.strip() for ln in grouped_probes.SUB_PROMOTE.split("\n"))])
    assert "subnormal_promote<BN>" not in nowait[grouped_probes.SUB_FILE]
    assert nowait[grouped_probes.SUB_FILE].count("wgmma_wait<0>();") == sub.count("wgmma_wait<0>();")
    with pytest.raises(SystemExit, match="gemm_subnormal.cu no longer has exactly one"):
        grouped_probes.mainloop_probes(grouped, sub.replace(grouped_probes.SUB_WAIT, ""))


def test_dequant_probes_change_the_4bit_fragment_build_only():
    """dq_nodq: the 4-bit fragments are the loaded words (their loads kept, the
    dequantization gone); dq_noload: constants, the loads gone too. The 8-bit build and
    everything outside the fragment build as shipped."""
    dq = sources.read("cuda", grouped_probes.DQ_FILE)
    probes = grouped_probes.dequant_probes(dq)
    assert set(probes) == {"dq_nodq", "dq_noload"}

    build = [ln.strip() for ln in grouped_probes.DQ_BUILD.split("\n")]
    nodq = probes["dq_nodq"][grouped_probes.DQ_FILE]
    gone, new = changed_lines(dq, nodq)
    assert [ln.strip() for ln in gone] == build
    assert [ln.split("//")[0].strip() for ln in new] == [
        "a[ks][0] = x0.x;", "a[ks][1] = x1.x;", "a[ks][2] = x0.y;", "a[ks][3] = x1.y;"]
    assert grouped_probes.DQ_LOADS in nodq and "DqType<T>::codes8" in nodq  # 8-bit as shipped
    noload = probes["dq_noload"][grouped_probes.DQ_FILE]
    gone, new = changed_lines(dq, noload)
    assert [ln.strip() for ln in gone] == [grouped_probes.DQ_LOADS.strip(), *build]
    assert dq.count("dq_lds2(w") == 2 and noload.count("dq_lds2(w") == 0  # the 4-bit loads gone
    assert len(new) == 5 and all("0x3f803f80u" in ln for ln in new[:4])
    with pytest.raises(SystemExit, match="gemm_dequant.cu no longer has exactly one"):
        grouped_probes.dequant_probes(dq.replace(grouped_probes.DQ_BUILD, ""))


def test_writes_one_folder_per_probe(tmp_path, capsys):
    assert grouped_probes.main([str(tmp_path)]) == 0
    names = ("nopromo", "noterm", "nomma", "sonly", "denorm", "denorm2", "sub_s8", "sub_nopromo",
             "sub_acc")
    for name in names:
        assert (tmp_path / name / grouped_probes.FILE).is_file()
    for name in ("sub_acc", "sub_nowait"):
        assert (tmp_path / name / grouped_probes.SUB_FILE).is_file()
    assert not (tmp_path / "sub_nowait" / grouped_probes.FILE).exists()
    for name in ("dq_nodq", "dq_noload"):
        assert [f.name for f in (tmp_path / name).iterdir()] == [grouped_probes.DQ_FILE]
    out = capsys.readouterr().out
    assert out.count(grouped_probes.FILE) == len(names) and out.count(grouped_probes.SUB_FILE) == 2
    assert out.count(grouped_probes.DQ_FILE) == 2
