"""Candidate digests (kernels/sources.code_digest): what a candidate runs, not its module."""
import os

import pytest

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
    mods = (reference.__name__,)
    assert digests["quantize_activation"] == sources.closure_digest((reference.quantize_rows,), mods)
    reached = sources.closure((reference.quantize_rows,), mods)
    assert not any("grouped" in name or "int8_matmul" in name for name in reached), sorted(reached)
    assert any("_grouped_sum" in name for name in sources.closure((reference.w8a8_linear,), mods))


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


# Derived digests (sources.closure / closure_digest) ---------------------------------------
_PKG = {
    "__init__.py": "",
    "launch.py": (
        "TILE = 64\n"
        "TABLE = {'a': (1, 2)}\n\n"
        "def grid_blocks(m):\n"
        "    # a comment\n"
        "    return (m + TILE - 1) // TILE\n\n"
        "def spec(m):\n"
        "    return ('body.cu', grid_blocks(m), TABLE['a'])\n"
    ),
    "kern.py": (
        "from . import launch\n"
        "from .launch import spec\n\n"
        "def run(x):\n"
        "    '''Docstring.'''\n"
        "    return spec(x), launch.TILE\n\n"
        "def unrelated():\n"
        "    return 'other.cu'\n"
    ),
}


def _closure_digest(tmp_path, monkeypatch, edits=None, name="v0"):
    """Write _PKG (with ``edits``: file -> (old, new)) as package ``pkg`` in folder
    ``name``, import it afresh and digest kern.run's closure with the .cu files it names
    (module names are part of the digest, so every version is the package ``pkg``)."""
    import importlib
    import sys

    root = tmp_path / name / "pkg"
    root.mkdir(parents=True)
    for file, text in _PKG.items():
        old, new = (edits or {}).get(file, ("", ""))
        assert not old or old in text
        (root / file).write_text(text.replace(old, new, 1) if old else text)
    for mod in [m for m in sys.modules if m == "pkg" or m.startswith("pkg.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.syspath_prepend(str(root.parent))
    kern = importlib.import_module("pkg.kern")
    mods = ("pkg.kern", "pkg.launch")
    reached = sources.closure([kern.run], mods)
    loaded = []
    digest = sources.closure_digest([kern.run], mods, (".cu",),
                                    lambda f: loaded.append(f) or [f"text of {f}"])
    return reached, digest, loaded


def test_closure_follows_helpers_and_constants_transitively(tmp_path, monkeypatch):
    reached, _, loaded = _closure_digest(tmp_path, monkeypatch)
    names = {k.split(".", 1)[1] for k in reached}
    # run -> spec (imported by name) -> grid_blocks (a helper two calls deep) -> TILE; run ->
    # launch.TILE (module attribute); TABLE (a constant read by spec). Not `unrelated`.
    assert names == {"kern.run", "launch.spec", "launch.grid_blocks", "launch.TILE", "launch.TABLE"}
    assert loaded == ["body.cu"]  # the kernel file named in reached code, not other.cu


def test_a_helper_edit_changes_the_digest_and_a_comment_does_not(tmp_path, monkeypatch):
    _, base, _ = _closure_digest(tmp_path, monkeypatch)
    cases = {  # (file, old, new): whether the digest must change
        "helper two calls deep": (("launch.py", "return (m + TILE - 1) // TILE",
                                   "return (m + TILE) // TILE"), True),
        "a constant a helper reads": (("launch.py", "TILE = 64", "TILE = 128"), True),
        "a constant in a table": (("launch.py", "(1, 2)", "(1, 3)"), True),
        "the kernel file named": (("launch.py", "'body.cu'", "'body2.cu'"), True),
        "a comment in a helper": (("launch.py", "# a comment", "# another comment"), False),
        "a docstring": (("kern.py", "'''Docstring.'''", "'''Other words.'''"), False),
        "code that is not reached": (("kern.py", "return 'other.cu'", "return 'o.cu'"), False),
    }
    for i, (what, (edit, stales)) in enumerate(cases.items()):
        file, old, new = edit
        _, d, _ = _closure_digest(tmp_path, monkeypatch, {file: (old, new)}, name=f"v{i + 1}")
        assert (d != base) == stales, what


def test_closure_refuses_a_constant_without_a_stable_repr(tmp_path, monkeypatch):
    import importlib

    root = tmp_path / "pkg_obj"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "m.py").write_text("class Thing:\n    pass\n\nTHING = Thing()\n\n"
                               "def run():\n    return THING\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    m = importlib.import_module("pkg_obj.m")
    with pytest.raises(ValueError, match="no stable repr"):
        sources.closure([m.run], ("pkg_obj.m",))


def test_closures_read_each_function_once(tmp_path, monkeypatch):
    """Candidates' closures overlap (every CUDA candidate reaches the launch helpers): a
    second closure over the same functions reads no source again and gives the same
    digest (the memo is keyed by the function object: an edited copy of a module, new
    objects under the same names, is read afresh; the helper-edit test above)."""
    import inspect

    _, first, _ = _closure_digest(tmp_path, monkeypatch, name="once")
    kern = __import__("pkg.kern", fromlist=["run"])
    reads = []
    real = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: reads.append(obj) or real(obj))
    again = sources.closure_digest([kern.run], ("pkg.kern", "pkg.launch"), (".cu",),
                                   lambda f: [f"text of {f}"])
    assert again == first and reads == []


def test_candidate_digests_are_the_same_in_every_process():
    """A table written by one process is read by another: a digest that depended on
    hash seeds, addresses or import order would make every shipped entry stale."""
    import os
    import subprocess
    import sys

    code = ("import mlx_w8a8\nfrom mlx_w8a8.kernels import registry\n"
            "print(sorted((c.name, c.digest) for c in registry.all_candidates()))")
    outs = set()
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        outs.add(run.stdout)
    assert len(outs) == 1


_CUDA = {"cuda_quantize", "cuda_int8_gemm", "cuda_int8_gemm_ws", "cuda_int8_gemm_tma",
         "cuda_w8a8_gemm", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm_tma", "cuda_w8a8_gemm_grouped",
         "cuda_w8a8_gemm_grouped_tma", "cuda_int8_gemv"}


@pytest.mark.parametrize("backend, file, helper, reached, unreached", [
    # the grid of the one-tile-per-block and persistent GEMMs (cuda/tiles.py), reached
    # through the per-channel and int32 launch code only
    ("cuda", "cuda/tiles.py", "def grid_blocks(",
     {"cuda_w8a8_gemm", "cuda_w8a8_gemm_ws", "cuda_w8a8_gemm_tma", "cuda_int8_gemm",
      "cuda_int8_gemm_ws", "cuda_int8_gemm_tma"},
     {"cuda_quantize", "cuda_w8a8_gemm_grouped", "cuda_w8a8_gemm_grouped_tma", "cuda_int8_gemv"}),
    # a helper of one kernel family: that kernel's digest alone
    ("cuda", "cuda/gemv.py", "def gemv_rows_per_warp(", {"cuda_int8_gemv"},
     _CUDA - {"cuda_int8_gemv"}),
    # a method of one definition reached by its subclass too, by no other kernel
    ("cuda", "cuda/gemm_grouped.py", "    def activations(",
     {"cuda_w8a8_gemm_grouped", "cuda_w8a8_gemm_grouped_tma"},
     _CUDA - {"cuda_w8a8_gemm_grouped", "cuda_w8a8_gemm_grouped_tma"}),
    ("metal", "metal.py", "def _gemm(",
     {"metal_nax_w8a8_gemm", "metal_simd_int8_gemm", "metal_nax_int8_gemm_64x64"}, set()),
])
def test_digests_follow_a_launch_helper_edit(tmp_path, backend, file, helper, reached,
                                             unreached):
    """On the package itself: a copy whose launch helper or definition method (listed by
    no one) gains a statement gives new digests to the kernels that reach it and leaves
    those of the kernels in ``unreached`` as they were; a comment added to it leaves
    every digest as it was."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    src = Path(sources.__file__).resolve().parents[1]
    code = (f"from mlx_w8a8.kernels import registry, {backend}\n"
            f"print({{c.name: c.digest for c in registry.all_candidates() "
            f"if c.backend == {backend!r}}})")

    def digests(edit):
        dst = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(src, dst / "mlx_w8a8", ignore=shutil.ignore_patterns("__pycache__"))
        path = dst / "mlx_w8a8" / "kernels" / file
        text = path.read_text()
        assert helper in text
        head, tail = text.split(helper, 1)
        body_start = tail.index(":\n") + 2
        indent = " " * (len(helper) - len(helper.lstrip()))  # a method: one level deeper
        path.write_text(head + helper + tail[:body_start]
                        + "".join(indent + line for line in edit.splitlines(True))
                        + tail[body_start:])
        run = subprocess.run([sys.executable, "-c", code], cwd=dst, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(dst)})
        assert run.returncode == 0, run.stderr
        return eval(run.stdout)

    base = digests("")
    edited = digests("    _unused = 0\n")
    commented = digests("    # a remark\n")
    assert commented == base
    changed = {n for n in base if edited[n] != base[n]}
    assert reached <= changed, changed
    assert not unreached & changed, unreached & changed


# A kernel launched in clusters (compile-time cluster_dims, or what only a cluster launch
# needs) must not ship: MLX keys a custom kernel's graph node as "K" whatever its cluster
# shape and updates cached graphs in place across kernels, which ran other kernels wrongly
# after a clustered one (docs/cuda.md, "CUDA graphs and clusters";
# bench/cluster_graph_probe.py). `.shared::cluster` alone is TMA's destination space, fine.
CLUSTER_ONLY = ("cluster_dims", "__cluster_dims__", "%cluster_ctarank", "%cluster_nctarank",
                "multicast::cluster", "barrier.cluster", "mapa.")


def _cluster_uses(text: str) -> list[str]:
    return [c for c in CLUSTER_ONLY if c in text]


def test_no_cuda_kernel_runs_in_clusters():
    folder = os.path.join(os.path.dirname(sources.__file__), "..", "shaders", "cuda")
    files = sorted(f for f in os.listdir(folder) if f.endswith((".cu", ".cuh")))
    assert len(files) > 10  # the folder was found
    found = {f: _cluster_uses(open(os.path.join(folder, f)).read()) for f in files}
    assert {f: u for f, u in found.items() if u} == {}


def test_the_cluster_check_sees_a_clustered_kernel():
    # The form the dequantizing GEMM had: a compile-time cluster and a multicast load.
    text = ("#define __global__ __attribute__((global)) __attribute__((cluster_dims(2, 1, 1)))\n"
            'asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile'
            '.mbarrier::complete_tx::bytes.multicast::cluster ...");')
    assert _cluster_uses(text) == ["cluster_dims", "multicast::cluster"]
    assert _cluster_uses("cp.async.bulk.tensor.2d.shared::cluster.global.tile") == []
