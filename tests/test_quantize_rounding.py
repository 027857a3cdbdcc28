"""The CUDA quantize kernels' fast rounding path, modelled in float32 numpy.

``shaders/cuda/quantize.cuh``'s ``RowQuantizer`` computes ``rint(x / s)`` without a
division per element: ``y = RN(x * RN(1 / s))``, ``n = rint(y)`` by adding and
subtracting 1.5 * 2^23, and it trusts ``n`` only when ``|y - n|`` is below a margin,
falling back to the IEEE division otherwise. These tests run the same float32 steps
(numpy's float32 multiply, add and divide round to nearest like the kernel's ``__fmul_rn``,
``__fadd_rn`` and ``__fdiv_rn``), with the constants read from the kernel text, against
the division on inputs built to sit on rint's boundaries; ``tests/test_cuda.py`` checks
the kernels themselves on a GPU.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import oracle

SHADER = Path(__file__).resolve().parent.parent / "mlx_w8a8" / "shaders" / "cuda" / "quantize.cuh"


def kernel_constants() -> dict[str, float]:
    """``kRound``, ``kRoundBits``, ``kFastMargin`` and the fast path's smallest scale, as
    written in quantize.cuh."""
    text = SHADER.read_text()
    found = {
        "round": re.search(r"kRound = ([0-9.]+)f;", text),
        "round_bits": re.search(r"kRoundBits = (0x[0-9A-Fa-f]+)u;", text),
        "margin": re.search(r"kFastMargin = ([0-9.]+)f;", text),
        "min_scale_bits": re.search(r"q\.s >= __int_as_float\((0x[0-9A-Fa-f]+)\)", text),
    }
    missing = [k for k, v in found.items() if v is None]
    assert not missing, f"quantize.cuh no longer spells {missing} as this test expects"
    return {
        "round": float(found["round"].group(1)),
        "round_bits": int(found["round_bits"].group(1), 16),
        "margin": float(found["margin"].group(1)),
        "min_scale": float(np.array([int(found["min_scale_bits"].group(1), 16)],
                                    dtype=np.uint32).view(np.float32)[0]),
    }


C = kernel_constants()


def fast_codes(x: np.ndarray, margin: float):
    """The fast path per row of ``x`` (float32 ``[M, K]``, finite, amax > 0): ``(codes,
    taken)`` where ``taken`` marks the elements whose 8-element chunk would keep the fast
    result (every element of a chunk below the margin) on rows whose scale allows it."""
    amax = np.max(np.abs(x), axis=1, keepdims=True)
    s = amax / np.float32(127)
    r = np.float32(1) / s
    y = x * r
    t = y + np.float32(C["round"])
    n = t - np.float32(C["round"])
    d = np.abs(y - n)
    codes = (t.view(np.uint32) - np.uint32(C["round_bits"])).view(np.int32)
    m, k = x.shape
    chunk_ok = (d.reshape(m, k // 8, 8) < np.float32(margin)).all(-1)
    taken = np.repeat(chunk_ok, 8, axis=1) & (s >= np.float32(C["min_scale"]))
    return codes, taken


def boundary_rows(rng) -> np.ndarray:
    return oracle.near_rounding_boundaries(rng, 64, 4096)


def test_fast_path_equals_the_division_where_it_is_taken(rng):
    x = boundary_rows(rng)
    want, _ = oracle.quantize_rows(x)
    got, taken = fast_codes(x, C["margin"])
    assert taken.any()
    wrong = taken & (got != want.astype(np.int32))
    assert not wrong.any(), f"{int(wrong.sum())} fast codes differ from rint(x / s)"
    # |n| <= 127 without a clip (the bound in quantize.cuh).
    assert np.abs(got[taken]).max() <= 127


def test_fast_path_is_taken_on_ordinary_activations(rng):
    """On normal-looking rows nearly every chunk keeps the fast result (else the kernel
    would be no faster), and the codes equal the division's."""
    x = (rng.standard_normal((256, 4096)) * rng.uniform(0.01, 10, (256, 1))).astype(np.float32)
    want, _ = oracle.quantize_rows(x)
    got, taken = fast_codes(x, C["margin"])
    assert taken.mean() > 0.99
    assert (got[taken] == want.astype(np.int32)[taken]).all()


def test_exact_ties_take_the_division():
    """x / s exactly j + 1/2 (s = 0.25): rint's tie must go to the even code, which only
    the division path decides; no chunk holding a tie keeps the fast result."""
    k = 1024
    x = ((np.arange(k) % 9 - 4) * 0.25 + 0.125).astype(np.float32)[None, :]
    x[0, 0] = -127 / 4.0
    _, taken = fast_codes(x, C["margin"])
    ties = np.abs(x * 4 - np.rint(x * 4)) == 0.5
    assert ties[0, 1:].all() and not taken[ties].any()


def test_the_margin_is_what_makes_it_exact(rng):
    """The boundary rows reach the hazard: with no margin (trust n whenever y is not
    exactly on a boundary) some codes differ from the division's, so the test above can
    fail."""
    x = boundary_rows(rng)
    want, _ = oracle.quantize_rows(x)
    got, taken = fast_codes(x, 0.5)
    assert (taken & (got != want.astype(np.int32))).any()


@pytest.mark.parametrize("n", range(-127, 128))
def test_code_bits(n):
    """The bits of n + 1.5 * 2^23 are kRoundBits + n, so their low byte is n's two's
    complement byte (the packed code) and their sum less 8 kRoundBits is the codes' sum."""
    t = np.float32(C["round"]) + np.float32(n)
    bits = int(np.array([t]).view(np.uint32)[0])
    assert bits == C["round_bits"] + n
    assert bits & 0xFF == n & 0xFF
