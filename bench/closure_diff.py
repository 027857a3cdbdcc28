"""Whether the code each shipped-table candidate runs differs between a git commit and
this tree: the check behind re-deriving a measured table's digests (``table_restamp.py``)
when only the digest's derivation or the code around the kernels changed.

For each CUDA and pure-MLX candidate it computes, in this tree and in ``git archive
COMMIT``, :func:`mlx_w8a8.kernels.sources.closure` of the candidate's functions (this
tree's ``sources.py`` in both, so the two walks are the same algorithm) and the kernel
texts of the ``.cu`` files that code names, and prints ``same`` or what differs.

Usage: ``python bench/closure_diff.py COMMIT``; exits 1 if any candidate differs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Candidate -> its functions, by name (the names are the same at the commits compared;
# a missing name is reported, not guessed).
ROWS = {
    "cuda": {
        "cuda_quantize": ["_quantize_run"],
        "cuda_int8_gemm": ["int8_gemm"],
        "cuda_int8_gemm_ws": ["int8_gemm_ws"],
        "cuda_int8_gemm_tma": ["int8_gemm_tma"],
        "cuda_w8a8_gemm": ["_w8a8_gemm_run", "_w8a8_gemm_stages", "_w8a8_gemm_bind"],
        "cuda_w8a8_gemm_ws": ["_w8a8_ws_run", "_w8a8_ws_stages", "_w8a8_ws_bind",
                              "_w8a8_ws_bind_group"],
        "cuda_w8a8_gemm_tma": ["_w8a8_tma_run", "_w8a8_tma_stages", "_w8a8_tma_bind",
                               "_w8a8_tma_bind_group"],
        "cuda_w8a8_gemm_grouped": ["_w8a8_grouped_run", "_w8a8_grouped_stages",
                                   "_w8a8_grouped_bind"],
        "cuda_int8_gemv": ["_gemv_run", "_gemv_stages", "_gemv_bind", "_gemv_bind_group"],
    },
    "reference": {
        "exact (linear)": ["w8a8_linear"],
        "exact (int8_matmul)": ["int8_matmul"],
        "exact (quantize_activation)": ["quantize_rows"],
        "mlx_qmm": ["qmm_linear", "qmm_bind"],
    },
}

_WALK = r'''
import json, re, sys
from mlx_w8a8.kernels import sources, cuda, cuda_launch, reference
rows = json.loads(sys.argv[1])
mods = {"cuda": ("mlx_w8a8.kernels.cuda", "mlx_w8a8.kernels.cuda_launch",
                 "mlx_w8a8.kernels.tensormap"),
        "reference": ("mlx_w8a8.kernels.reference",)}
owner = {"cuda": cuda, "reference": reference}
out = {}
for backend, cands in rows.items():
    for name, fns in cands.items():
        missing = [f for f in fns if not hasattr(owner[backend], f)]
        if missing:
            out[name] = {"missing": " ".join(missing)}
            continue
        reached = sources.closure([getattr(owner[backend], f) for f in fns], mods[backend])
        for f in sorted(set(re.findall(r"""["']([\w.-]+\.cu)["']""", "\n".join(reached.values())))):
            header, bodies = cuda_launch.load(f)
            reached["file " + f] = header + "".join(k + v for k, v in sorted(bodies.items()))
        out[name] = reached
print(json.dumps(out))
'''


def walk(tree: str) -> dict:
    run = subprocess.run([sys.executable, "-c", _WALK, json.dumps(ROWS)], cwd=tree,
                         env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"[closure_diff] walking {tree} failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as old:
        subprocess.run(f"git archive {argv[0]} mlx_w8a8 | tar -x -C {old}", shell=True,
                       cwd=ROOT, check=True)
        src = os.path.join(ROOT, "mlx_w8a8", "kernels", "sources.py")
        with open(src, encoding="utf-8") as f, \
                open(os.path.join(old, "mlx_w8a8", "kernels", "sources.py"), "w") as g:
            g.write(f.read())
        before, now = walk(old), walk(ROOT)
    differ = 0
    for name in now:
        a, b = before.get(name, {}), now[name]
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        differ += bool(changed)
        print(f"{name}: {'same' if not changed else 'differs: ' + ', '.join(changed)}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
