"""Whether this tree launches exactly what another commit launches, for every CUDA kernel.

A change to the CUDA candidates' Python (launch code, tile policy, registration) that
leaves every launch as it was keeps the measurements of a tuning table valid: the table
measured kernels, and MLX is handed the same kernels. This checks that claim without a
GPU: in this tree and in ``git archive COMMIT`` (each in its own process) it replaces
``mx.fast.cuda_kernel`` with a recorder (``mx.compile`` an identity, tensor maps encoded
by a stand-in as in ``tests/kernel_recorder.py``), then drives every registered CUDA
candidate through its run path (``Candidate.run``), its per-layer bind path
(``Candidate.bind_stages``, with and without a leading shape) and its sibling-group path
(``Candidate.bind_group``) on a sweep of problems, and compares, per launch, the kernel
name MLX is given, its source, header (an ``#include``d header file read back), template
arguments, grid, threadgroup, shared memory, input names, input shapes and dtypes (and
the bytes of small uint8 inputs: the tensor-map arrays), output names, shapes and
dtypes; and, per (candidate, problem), the ``supports`` verdict and the ``variant`` key.
Both on a Hopper GPU with tensor maps, on a Hopper GPU without them and on another GPU.

The sweep: every (N, K) of ``mlx_w8a8/tables/nvidia-h200.json`` and of the Llama-3-8B,
Qwen2.5-7B (``mlx_w8a8.tuning.shapes``) and Phi-3-mini projections, a few small and odd
shapes and K past the unsigned-code bound; M in 1, 2, 3, 8, 16, 17, 64, 100, 128, 512,
1000, 2048; float16, bfloat16 and float32; per-channel, group-wise 8-bit and MLX 4-bit
weights (group 32, 64, 128; a tree without the 4-bit format records none); with and
without bias; the models' q/k/v and gate/up as sibling groups.

Usage: ``python bench/launch_diff.py COMMIT`` prints ``same`` (exit 0) or the
differences (exit 1). ``--quick`` sweeps fewer M and shapes. After the differences it prints how they fall by
candidate and M, and by candidate and what differs (launch fields, or the variant key).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

M_LIST = (1, 2, 3, 8, 16, 17, 64, 100, 128, 512, 1000, 2048)
M_QUICK = (1, 3, 16, 128, 2048)
DTYPES = ("float16", "bfloat16", "float32")
FORMATS = (("per_channel", None), ("grouped", 32), ("grouped", 64), ("grouped", 128),
           ("grouped4", 32), ("grouped4", 64), ("grouped4", 128))
# Phi-3-mini (hidden 3072, intermediate 8192, 32 heads of 96, no GQA): its fused qkv and
# gate_up projections, o and down, and its unfused q/k/v as siblings.
PHI3 = [(9216, 3072), (3072, 3072), (16384, 3072), (3072, 8192)]
# Small and odd shapes (K a multiple of 32, as MLX's weight format needs; 96, 160 and
# 224 not of 128), and K past the unsigned-code bound of the per-channel GEMM (66311).
EXTRA = [(40, 96), (264, 160), (128, 224), (256, 69632), (48, 131040)]
QUANTIZE_K = (8, 24, 96, 3072, 4096, 14336, 69632)


def shapes(quick: bool) -> list[tuple[int, int]]:
    """The (N, K) pairs of the sweep (see the module docstring)."""
    from mlx_w8a8.tuning.shapes import FAMILIES

    found = set()
    with open(os.path.join(ROOT, "mlx_w8a8", "tables", "nvidia-h200.json"), encoding="utf-8") as f:
        for section in json.load(f)["sections"]:
            for entry in section["entries"]:
                found.add((entry["n"], entry["k"]))
    for family in ("llama-3-8b", "qwen2.5-7b"):
        for pairs in FAMILIES[family].values():
            found.update(pairs)
    found.update(PHI3)
    found.update(EXTRA)
    out = sorted(found)
    return out[::3] + [s for s in EXTRA if s not in out[::3]] if quick else out


def sibling_groups() -> list[list[tuple[int, int]]]:
    """The models' sibling projections fed the same x: q/k/v and gate/up."""
    return [
        [(4096, 4096), (1024, 4096), (1024, 4096)], [(14336, 4096)] * 2,
        [(3584, 3584), (512, 3584), (512, 3584)], [(18944, 3584)] * 2,
        [(3072, 3072)] * 3, [(40, 96), (264, 96)],
    ]


# Recording (runs inside the process of one tree) ----------------------------------------
class Recorder:
    """Stands in for ``mx.fast.cuda_kernel``: each launch is appended to ``launches``
    as a dict of what MLX would be given; the outputs are lazy zeros."""

    def __init__(self):
        self.launches = []
        self.texts = {}  # sha -> text, for a readable difference

    def text(self, text: str) -> str:
        sha = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        self.texts[sha] = text
        return sha

    def __call__(self, *, name, input_names, output_names, source, header,
                 ensure_row_contiguous, shared_memory):
        import mlx.core as mx
        import numpy as np

        included = re.match(r'#include "([^"]+)"\n$', header)
        if included:  # a header file written under the cache folder: its text
            with open(included.group(1), encoding="utf-8") as f:
                header = f.read()
        fixed = dict(name=name, source=self.text(source), header=self.text(header),
                     inputs=list(input_names), outputs=list(output_names),
                     shared_memory=shared_memory, row_contiguous=ensure_row_contiguous)

        def launch(*, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
                   init_value=None, verbose=False):
            arrays = []
            for a in inputs:
                item = [list(a.shape), str(a.dtype)]
                if a.dtype == mx.uint8 and a.size <= 4096:
                    item.append(hashlib.sha256(np.array(a).tobytes()).hexdigest()[:16])
                arrays.append(item)
            self.launches.append(dict(
                fixed, arrays=arrays, template=[[k, str(v)] for k, v in (template or [])],
                grid=list(grid), threadgroup=list(threadgroup),
                output_shapes=[list(s) for s in output_shapes],
                output_dtypes=[str(d) for d in output_dtypes], init_value=init_value))
            return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]

        return launch


def _fake_prototype(rows: int, k: int, box_rows: int, box_k: int = 128, swizzle: bool = True) -> bytes:
    import numpy as np

    from mlx_w8a8.kernels import tensormap

    sizes = [rows, k, box_rows] + ([] if (box_k, swizzle) == (128, True) else [box_k, int(swizzle)])
    raw = np.array(sizes, dtype=np.uint64).tobytes()
    return raw.ljust(tensormap.MAP_BYTES, b"\0")


def _kernel_modules():
    return [m for name, m in sorted(sys.modules.items())
            if name.startswith("mlx_w8a8.kernels") and m is not None]


def _set_device(sm90: bool, tma: bool) -> None:
    """The CUDA probes answering as on a GPU (Hopper or not, tensor maps or not); every
    cache of the kernel modules emptied (frames, prototypes, probes)."""
    from mlx_w8a8.kernels import registry, tensormap

    for module in _kernel_modules():
        for attr in ("is_sm90", "cuda_available"):
            if callable(getattr(module, attr, None)):
                setattr(module, attr, (lambda v: lambda: v)(sm90 if attr == "is_sm90" else True))
    tensormap.available = lambda: tma
    tensormap.prototype = _fake_prototype
    for module in _kernel_modules():
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)) and getattr(
                    value, "__module__", "").startswith("mlx_w8a8.kernels"):
                value.cache_clear()
    registry.invalidate()


def _weight(n: int, k: int, fmt: str, gs: int | None, dtype, cache: dict):
    """A ``QuantizedWeight`` ``[N, K]`` of ``fmt`` whose arrays are broadcasts of zeros
    (no memory), the scales in ``dtype``; kept in ``cache`` for the next problem."""
    import mlx.core as mx

    from mlx_w8a8.weight import QuantizedWeight

    key = (n, k, fmt, gs, dtype)
    if key not in cache:
        if len(cache) > 64:
            cache.clear()
        g = gs or (128 if k % 128 == 0 else 64 if k % 64 == 0 else 32)
        scales = mx.broadcast_to(mx.ones((1, 1), dtype=dtype), (n, k // g))
        bits = 4 if fmt == "grouped4" else 8
        codes = mx.broadcast_to(mx.zeros((1, 1), dtype=mx.uint32), (n, k * bits // 32))
        offsets = -128 * scales if fmt == "per_channel" else scales
        if bits == 4:  # a tree before the 4-bit format has no such weight: None, not driven
            try:
                cache[key] = QuantizedWeight(codes, scales, offsets, g, per_channel=False, bits=4)
            except TypeError:
                cache[key] = None
        else:
            cache[key] = QuantizedWeight(codes, scales, offsets, g,
                                         per_channel=fmt == "per_channel")
    return cache[key]


def record(quick: bool, out: str) -> None:
    """Drive every CUDA candidate of the tree on ``sys.path`` and write what it launched
    to ``out`` (JSON: ``{"records": {key: value}, "texts": {sha: text}}``)."""
    import mlx.core as mx

    from mlx_w8a8.kernels import registry  # (importing the package registers the backends)

    rec = Recorder()
    mx.fast.cuda_kernel = rec
    mx.compile = lambda fun, *a, **kw: fun
    cands = [c for c in registry.all_candidates() if c.backend == "cuda"]
    records: dict[str, object] = {}
    weights: dict = {}
    ms = M_QUICK if quick else M_LIST
    pairs = shapes(quick)

    def drive(key: str, thunk) -> None:
        start = len(rec.launches)
        try:
            thunk()
            value = rec.launches[start:]
        except Exception as error:  # noqa: BLE001  (the message is compared too)
            value = f"{type(error).__name__}: {error}"
        del rec.launches[start:]
        records[key] = value

    def verdict(cand, problem) -> bool:
        try:
            ok = bool(cand.supports(problem))
        except Exception as error:  # noqa: BLE001
            ok = False
            records[f"{cand.name}|supports-error|{problem}"] = f"{type(error).__name__}: {error}"
        records[f"{cand.name}|supports|{problem}"] = ok
        if ok and cand.variant is not None:
            records[f"{cand.name}|variant|{problem}"] = repr(cand.variant(problem))
        return ok

    for device, (sm90, tma) in (("sm90+tma", (True, True)), ("sm90", (True, False)),
                                ("other", (False, False))):
        _set_device(sm90, tma)
        for cand in cands:
            tag = f"{device}|{cand.name}"
            if cand.op == "quantize_activation":
                for m in ms:
                    for k in QUANTIZE_K:
                        for dt in DTYPES:
                            for gs in (None, 32, 64, 128):
                                p = registry.Problem("quantize_activation", m, 0, k, dt, "int8", gs)
                                if verdict(cand, p):
                                    x = mx.zeros((m, k), dtype=getattr(mx, dt))
                                    drive(f"{tag}|run|{p}", lambda: cand.run(x, gs))
                continue
            if cand.op == "int8_matmul":
                for m in ms:
                    for n, k in pairs:
                        p = registry.Problem("int8_matmul", m, n, k, "int8", "int8")
                        if verdict(cand, p):
                            a = mx.zeros((m, k), dtype=mx.int8)
                            b = mx.broadcast_to(mx.zeros((1, 1), dtype=mx.int8), (n, k))
                            drive(f"{tag}|run|{p}", lambda: cand.run(a, b))
                continue
            for n, k in pairs:
                for fmt, gs in FORMATS:
                    if gs is not None and k % gs:
                        continue
                    for dt in DTYPES:
                        dtype = getattr(mx, dt)
                        w = _weight(n, k, fmt, gs, dtype, weights)
                        if w is None:
                            continue
                        for has_bias in (False, True):
                            b = mx.zeros((n,), dtype=dtype) if has_bias else None
                            for m in ms:
                                p = registry.Problem("linear", m, n, k, dt, fmt, w.group_size,
                                                     has_bias)
                                if not verdict(cand, p):
                                    continue
                                x = mx.zeros((m, k), dtype=dtype)
                                drive(f"{tag}|run|{p}", lambda: cand.run(x, w, b))
                                if cand.bind_stages is None:
                                    continue
                                for lead in (None, (1, m)):
                                    def bound():
                                        args = () if lead is None else (lead,)
                                        key, quantize, apply = cand.bind_stages(p, w, b, *args)
                                        xi = x if lead is None else x.reshape(*lead, k)
                                        for _ in range(2):  # the first call and a replay
                                            apply(xi if quantize is None else quantize(xi))
                                        records[f"{tag}|act_key|{p}|{lead}"] = repr(key)
                                    drive(f"{tag}|bind|{p}|{lead}", bound)
            if cand.bind_group is None:
                continue
            for members in sibling_groups():
                k = members[0][1]
                for fmt, gs in FORMATS:
                    if gs is not None and k % gs:
                        continue
                    for dt in DTYPES:
                        dtype = getattr(mx, dt)
                        ws = [_weight(n, k, fmt, gs, dtype, weights) for n, _ in members]
                        if None in ws:
                            continue
                        for has_bias in (False, True):
                            pairs_wb = [(w, mx.zeros((w.n,), dtype=dtype) if has_bias else None)
                                        for w in ws]
                            for m in ms:
                                p = registry.Problem("linear", m, sum(w.n for w in ws), k, dt, fmt,
                                                     ws[0].group_size, has_bias)
                                if not verdict(cand, p):
                                    continue
                                x = mx.zeros((m, k), dtype=dtype)
                                for lead in (None, (1, m)):
                                    def grouped():
                                        key, quantize, apply = cand.bind_group(p, pairs_wb, lead)
                                        xi = x if lead is None else x.reshape(*lead, k)
                                        for _ in range(2):
                                            apply(xi if quantize is None else quantize(xi))
                                        records[f"{tag}|group_act_key|{p}|{lead}"] = repr(key)
                                    drive(f"{tag}|group|{len(ws)}|{p}|{lead}", grouped)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"records": records, "texts": rec.texts}, f)


# Comparing ----------------------------------------------------------------------------
def _run_tree(root: str, quick: bool, out: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=root)
    args = [sys.executable, os.path.abspath(__file__), "--record", out, "--root", root]
    return subprocess.Popen(args + (["--quick"] if quick else []), env=env, cwd=root)


def _describe(value, texts) -> str:
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return "; ".join(f"{d['name']} grid={d['grid']} tg={d['threadgroup']}" for d in value)
    return str(value)[:300]


def _launch_diff(a, b, texts_a, texts_b) -> list[str]:
    """What differs between two recorded launch lists."""
    if not (isinstance(a, list) and isinstance(b, list)):
        return [f"{_describe(a, texts_a)}  ->  {_describe(b, texts_b)}"]
    if len(a) != len(b):
        return [f"{len(a)} launches -> {len(b)}: {_describe(a, texts_a)}  ->  "
                f"{_describe(b, texts_b)}"]
    out = []
    for i, (la, lb) in enumerate(zip(a, b)):
        for field in sorted(set(la) | set(lb)):
            if la.get(field) != lb.get(field):
                va, vb = la.get(field), lb.get(field)
                if field in ("source", "header"):
                    va, vb = texts_a.get(va, va), texts_b.get(vb, vb)
                    import difflib
                    delta = [line for line in difflib.unified_diff(
                        va.splitlines(), vb.splitlines(), lineterm="", n=0)][2:8]
                    out.append(f"launch {i} {field}: " + " | ".join(delta))
                else:
                    out.append(f"launch {i} {field}: {str(va)[:200]} -> {str(vb)[:200]}")
    return out


def compare(old: dict, new: dict, limit: int = 40) -> list[str]:
    """The differences between two recordings, one line per key (at most ``limit``
    keys shown, then a count)."""
    ra, rb = old["records"], new["records"]
    lines, count = [], 0
    for key in sorted(set(ra) | set(rb)):
        if key not in rb:
            found = [f"only in the first tree: {_describe(ra[key], old['texts'])}"]
        elif key not in ra:
            found = [f"only in this tree: {_describe(rb[key], new['texts'])}"]
        elif ra[key] == rb[key]:
            continue
        else:
            found = _launch_diff(ra[key], rb[key], old["texts"], new["texts"])
        count += 1
        if count <= limit:
            lines.append(f"{key}:")
            lines.extend(f"    {f}" for f in found)
    if count > limit:
        lines.append(f"... and {count - limit} more differing keys")
    if count:
        lines.append(f"{count} of {len(set(ra) | set(rb))} keys differ")
    return lines


def tally(old: dict, new: dict) -> str:
    """How the differing keys fall by candidate and M (``cand M=17: 12``): whether a
    change reached only the problems it meant to (a tile policy for some M)."""
    ra, rb = old["records"], new["records"]
    counts: dict[tuple[str, int], int] = {}
    for key in set(ra) | set(rb):
        if ra.get(key) == rb.get(key):
            continue
        cand = next((p for p in key.split("|") if p.startswith("cuda_")), "?")  # CUDA only
        m = re.search(r"\bm=(\d+)", key)
        slot = (cand, int(m.group(1)) if m else -1)
        counts[slot] = counts.get(slot, 0) + 1
    return "; ".join(f"{c} M={m if m >= 0 else '?'}: {n}" for (c, m), n in sorted(counts.items()))


def field_tally(old: dict, new: dict) -> str:
    """What differs in the differing keys, by candidate: the launch fields (``header``,
    ``name``, ``template`` ...) of launch lists of equal length, ``launches`` where the
    count differs, else the record's kind (``variant``, ``supports``), each with its
    number of keys (``cand: header+name 40; variant 12``): whether a change reached a
    candidate's launches or only the texts its kernels' names derive from."""
    ra, rb = old["records"], new["records"]
    counts: dict[tuple[str, str], int] = {}
    for key in set(ra) | set(rb):
        a, b = ra.get(key), rb.get(key)
        if a == b:
            continue
        parts = key.split("|")
        at = next((i for i, p in enumerate(parts) if p.startswith("cuda_")), None)
        cand = parts[at] if at is not None else "?"
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                what = "launches"
            else:
                what = "+".join(sorted({f for la, lb in zip(a, b) for f in set(la) | set(lb)
                                        if la.get(f) != lb.get(f)}))
        else:
            what = parts[at + 1] if at is not None and at + 1 < len(parts) else "record"
        counts[(cand, what)] = counts.get((cand, what), 0) + 1
    return "; ".join(f"{c}: {w} {n}" for (c, w), n in sorted(counts.items()))


def summary(doc: dict) -> str:
    records = doc["records"]
    launches = sum(len(v) for v in records.values() if isinstance(v, list))
    paths = {}
    for key, value in records.items():
        parts = key.split("|")
        if parts[2] in ("run", "bind", "group") and isinstance(value, list):
            paths[parts[1]] = paths.get(parts[1], 0) + 1
    per = ", ".join(f"{name} {n}" for name, n in sorted(paths.items()))
    return f"{len(records)} records, {launches} launches; driven paths per candidate: {per}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("commit", nargs="?", help="the commit to compare this tree against")
    ap.add_argument("--quick", action="store_true", help="fewer M and shapes")
    ap.add_argument("--record", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.record:
        sys.path.insert(0, a.root)
        import mlx_w8a8

        here = os.path.dirname(os.path.abspath(mlx_w8a8.__file__))
        if os.path.dirname(here) != os.path.abspath(a.root):
            raise SystemExit(f"mlx_w8a8 imported from {here}, not from {a.root}")
        record(a.quick, a.record)
        return 0
    if not a.commit:
        ap.error("COMMIT is required")
    with tempfile.TemporaryDirectory() as tmp:
        old_root = os.path.join(tmp, "old")
        os.makedirs(old_root)
        archive = subprocess.run(["git", "-C", ROOT, "archive", a.commit], check=True,
                                 capture_output=True).stdout
        tar_path = os.path.join(tmp, "old.tar")
        with open(tar_path, "wb") as f:
            f.write(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(old_root)
        outs = [os.path.join(tmp, "old.json"), os.path.join(tmp, "new.json")]
        procs = [_run_tree(old_root, a.quick, outs[0]), _run_tree(ROOT, a.quick, outs[1])]
        if any(p.wait() != 0 for p in procs):
            print("a recording process failed", file=sys.stderr)
            return 2
        docs = []
        for out in outs:
            with open(out, encoding="utf-8") as f:
                docs.append(json.load(f))
    lines = compare(*docs)
    print(f"{a.commit}: {summary(docs[0])}")
    print(f"this tree: {summary(docs[1])}")
    if lines:
        print("\n".join(lines))
        print("differing keys by candidate and M: " + tally(*docs))
        print("what differs, by candidate: " + field_tally(*docs))
        return 1
    print("same")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
