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


def _load(tmp_path, monkeypatch, name: str, text: str):
    import importlib
    import sys

    (tmp_path / f"{name}.py").write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    importlib.invalidate_caches()
    return importlib.import_module(name)


_PLAIN = '''
class Spec:
    def run(self, x):
        y = x * 2
        return {"#": y, 'k': "a # b"}
'''

# The same code documented: docstrings (one ending in non-ASCII text, whose UTF-8 bytes
# and characters count columns differently), comments, blank lines, trailing spaces.
_DOCUMENTED = '''
class Spec:
    """A spec.

    Hazard: x must be evaluated."""

    def run(self, x):  # the launch
        """Twice ``x`` — the doubled rows ×2."""
        # y is the doubled input

        y = x * 2   
        return {"#": y, 'k': "a # b"}  # a '#' inside a string is code
'''


def test_code_digest_ignores_comments_docstrings_and_blank_lines(tmp_path, monkeypatch):
    # Documenting a hazard where it lives must not stale a tuning table: the digest of
    # the documented function equals the plain one's. A digest of the raw source fails.
    plain = _load(tmp_path, monkeypatch, "spec_plain", _PLAIN).Spec
    documented = _load(tmp_path, monkeypatch, "spec_documented", _DOCUMENTED).Spec
    assert sources.code_digest(plain.run) == sources.code_digest(documented.run)
    assert sources.code_digest(plain) == sources.code_digest(documented)


def test_code_text_keeps_strings_that_look_like_comments_and_non_docstrings():
    # A '#' inside a string literal is code (a regex stripping '#...' to the line's end
    # fails this), and a string that is not a body's first statement stays.
    a = sources.code_text('def f():\n    return "a # b"\n')
    b = sources.code_text('def f():\n    return "a # c"\n')
    assert a != b and '"a # b"' in a
    c = sources.code_text('def f():\n    x = 1\n    "not a docstring"\n    return x\n')
    assert '"not a docstring"' in c
    assert sources.code_text('def f():\n    "doc"\n    return 1  # one\n') == \
        "def f():\n    return 1"
    # The syntax tree counts a docstring's columns in UTF-8 bytes: cut as characters,
    # the end of a non-ASCII docstring would overshoot into the code after it.
    assert sources.code_text('def f():\n    "×—"; return 1\n') == "def f():\n    ; return 1"


def test_code_text_of_text_that_does_not_parse_still_drops_comments():
    # A lambda's source line cut out of a larger expression does not parse alone.
    assert sources.code_text("    key=lambda c: c.name,  # by name\n") == \
        "    key=lambda c: c.name,"
