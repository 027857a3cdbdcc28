"""Candidate digests (kernels/sources.code_digest): what a candidate runs, not its module."""

from mlx_w8a8.kernels import reference, registry, sources


def _run_v1(x):
    return x + 1


def _run_v2(x):
    return x + 2


def test_code_digest_follows_functions_texts_and_params():
    base = sources.code_digest(_run_v1, texts=("kernel A",), params="tile=64")
    assert base == sources.code_digest(_run_v1, texts=("kernel A",), params="tile=64")
    assert base != sources.code_digest(_run_v2, texts=("kernel A",), params="tile=64")
    assert base != sources.code_digest(_run_v1, texts=("kernel B",), params="tile=64")
    assert base != sources.code_digest(_run_v1, texts=("kernel A",), params="tile=128")


def test_code_digest_without_source_uses_the_compiled_code(monkeypatch):
    # A byte-compiled-only install has no source text; the digest must still differ
    # between different functions rather than fail at import.
    def no_source(f):
        raise OSError("could not get source code")

    monkeypatch.setattr(sources.inspect, "getsource", no_source)
    assert sources.code_digest(_run_v1) != sources.code_digest(_run_v2)


def test_exact_digests_cover_only_what_each_op_runs():
    # quantize_activation runs quantize_rows alone: its digest must not move when the
    # grouped GEMM path changes, and the three ops' digests differ.
    digests = {op: registry.get(op, registry.EXACT).digest for op in registry.OPS}
    assert len(set(digests.values())) == 3
    assert digests["quantize_activation"] == sources.code_digest(
        reference.quantize_rows, params=reference._EXACT_PARAMS)
