"""``python -m mlx_w8a8.bench``: paired qualification of two kernels on this machine,
and whole-model comparisons.

Three modes.

**Qualification** (the default; after the paired qualification bench): a *baseline*
and a *candidate* — two kernel names (``--baseline mlx_qmm --candidate exact``) or
two tuning tables (``--baseline-table A.json --candidate-table B.json``: each case runs
the kernel that table chooses) — on a fixed case list, with weights in ``--format``
(8-bit per-channel or group-wise, or MLX's 4-bit ``grouped4``, whose default arms are
``mlx_qmm4`` and the exact W4A8 kernel ``exact_w4a8``). Each arm runs its kernel as an
``mlx_w8a8.Linear`` does (``registry.layer_run``: the launches bound once per weight, as
the tuner times them), so the host cost per call is a layer's. For each case, both arms are
checked against an independent oracle (numpy float64 from the raw stored codes) before
and after timing; then at least 30 pairs are timed in alternating order (A B, B A, ...),
each sample being ``chain`` launches in one ``mx.eval`` divided by ``chain``; each launch's
activation is made from the previous launch's output (``timing.linear_link``: one
broadcast add, the same for both arms), as a model's layers depend on each other, so
MLX's CUDA graph cannot run the chain's launches side by side (``--independent``: the
launches without that link). Output is
a summary of median ratios (candidate / baseline) with their interquartile spread on
stdout, and with ``--json PATH`` JSON lines (case, arm identities and source digests,
oracle errors, per-pair nanoseconds) in PATH (``--json`` alone: the JSON lines on stdout,
the summary on stderr). When one arm misses the oracle
the summary says which and why (e.g. on a CPU, MLX's bfloat16 ``quantized_matmul`` —
the ``mlx_qmm`` baseline — misses it while being within tolerance on float32-upcast
activations: the baseline's arithmetic is the inaccurate side, the exit status stays 0);
a candidate that misses it fails the run (exit status 1).

**Cider-style comparison** (``--cider``): per shape, the W8A8 full pipeline
(``w8a8_linear`` with a W8A8 kernel: quantize activations, int8 GEMM, dequant), the raw
int8 GEMM (``int8_matmul``, no quantize/dequant), ``mx.quantized_matmul`` (8-bit
weights, W8A16) and ``mx.matmul`` in bfloat16, timed in alternating rounds, over the
shape list of the Cider int8 GEMM benchmark (M x K x N: 16..2048 x 4096 x 4096, and
128/512 x 3584 x 18944, 128/512 x 18944 x 3584), as chains of independent launches (its
arms' outputs differ in type and shape, so no link makes them one dependent chain alike).
Those shapes take minutes per shape on a small CPU; pass ``--shapes`` there.

**Model benchmark** (``--model PATH|PRESET``): bf16 vs mlx-lm N-bit vs mlx_w8a8 on a
whole mlx-lm model (prefill, decode and batched decode tokens/s, ratios with spread,
logits SQNR, parameter bytes), the quantized variants built from the checkpoint format
``--weights`` names (an mlx-lm 8-bit or 4-bit checkpoint of the same weights, or a
checkpoint folder); see :mod:`mlx_w8a8.modelbench`. With ``--tp N``, under a
distributed launch of N ranks, the W8A8 model split over them against one device
(per-rank times, the ``all_sum`` share, an optional ``--check``); see
:mod:`mlx_w8a8.tpbench`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import mlx.core as mx
import numpy as np

from . import modelbench, ops, tpbench
from .kernels import registry
from .kernels.registry import Problem
from .tuning import gate, render, shapes, table, timing
from .tuning.tuner import Tuner

PROG = "mlx_w8a8.bench"
MIN_PAIRS = 30
# The exact W8A8 math in MLX ops (named "reference" by older versions of the registry).
EXACT = registry.EXACT
# Qualification cases (M, N, K): decode and short prefill on Llama-3-8B projections.
CASES = [(1, 4096, 4096), (16, 4096, 4096), (1, 14336, 4096), (1, 4096, 14336), (64, 1024, 4096)]
# The Cider benchmark's list, given there as (M, K, N); stored here as (M, N, K).
CIDER_SHAPES = [
    (16, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096), (256, 4096, 4096),
    (512, 4096, 4096), (1024, 4096, 4096), (2048, 4096, 4096),
    (128, 18944, 3584), (512, 18944, 3584), (128, 3584, 18944), (512, 3584, 18944),
]


def stored_codes(weight) -> np.ndarray:
    """``[N, K]`` float64 codes of ``weight`` unpacked with numpy from its stored words:
    four 8-bit codes per uint32 in element order, or (``bits=4``) eight 4-bit codes, code
    ``j`` of a word in bits ``4j .. 4j + 3``."""
    words = np.array(weight.q)
    if weight.bits == 8:
        return words.view(np.uint8).reshape(weight.n, weight.k).astype(np.float64)
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    codes = (words.astype(np.uint32)[:, :, None] >> shifts) & np.uint32(0xF)
    return codes.reshape(weight.n, weight.k).astype(np.float64)


def oracle(x: mx.array, weight, bias) -> np.ndarray:
    """``x @ W.T (+ bias)`` in float64 from the stored codes, scales and biases.

    Independent of every kernel: the codes (8-bit, or MLX's 4-bit) are unpacked with
    numpy (:func:`stored_codes`) and dequantized in float64 (``w = scale * q + bias_g``).
    """
    codes = stored_codes(weight)
    g = weight.group_size
    s = np.repeat(np.array(weight.scales.astype(mx.float32)).astype(np.float64), g, axis=1)
    b = np.repeat(np.array(weight.biases.astype(mx.float32)).astype(np.float64), g, axis=1)
    w = s * codes + b
    y = np.array(x.astype(mx.float32)).astype(np.float64) @ w.T
    if bias is not None:
        y = y + np.array(bias.astype(mx.float32)).astype(np.float64)
    return y


def check(y: mx.array, expected: np.ndarray, atol: float, rtol: float) -> tuple[bool, float, str]:
    """Compare ``y`` with the oracle in bfloat16 terms: ``|y - o| <= max(atol, rtol |o|)``."""
    got = np.array(y.astype(mx.bfloat16).astype(mx.float32)).astype(np.float64)
    ref = np.array(mx.array(expected.astype(np.float32)).astype(mx.bfloat16).astype(mx.float32)).astype(np.float64)
    err = np.where(np.isfinite(got), np.abs(got - ref), np.inf)
    limit = np.maximum(atol, rtol * np.abs(ref))
    worst = float(err.max()) if err.size else 0.0
    if (err > limit).any():
        i = np.unravel_index(int(np.argmax(err / limit)), err.shape)
        return False, worst, f"element {tuple(int(v) for v in i)}: {got[i]:.6g} vs oracle {ref[i]:.6g}"
    return True, worst, ""


def _arm_for(label: str, kernel: str | None, table_path: str | None, problem: Problem):
    """``(name, identity, run)`` of one arm: a kernel, or a table's choice."""
    origin = {"kernel": kernel} if kernel else {"table": table_path}
    if table_path:
        tuner = Tuner(table_path=table_path, use_cache=False, use_shipped=False, online=False)
        hit = tuner.lookup(problem)
        kernel = hit.choice if hit is not None else registry.fallback(problem).name
        origin["choice"] = kernel
        origin["table_hit"] = hit is not None
    cand = registry.choose(problem, kernel)
    identity = dict(origin, name=cand.name, backend=cand.backend, digest=cand.digest)
    return cand.name, identity, registry.layer_run(cand, problem)  # as a Linear runs it


def emit(record: dict, stream) -> None:
    stream.write(json.dumps(record, allow_nan=False, default=str) + "\n")
    stream.flush()


def qualify(args, stream, out) -> int:
    """The paired qualification run; returns the exit status."""
    cases = shapes.expand(args.cases, prog=PROG, flag="--cases") if args.cases else list(CASES)
    summary = []
    status = 0
    device = table.device_key()
    for m, n, k in cases:
        problem = Problem("linear", m, n, k, args.dtype, args.format, args.group_size, False,
                          args.act_scales)
        name = f"linear-{m}x{n}x{k}-{args.dtype}-{args.format}" + (
            "-act-groups" if args.act_scales == "group" else "")
        try:
            arms = [
                _arm_for("baseline", args.baseline, args.baseline_table, problem),
                _arm_for("candidate", args.candidate, args.candidate_table, problem),
            ]
        except ValueError as error:
            emit({"case": name, "error": str(error)}, stream)
            summary.append((name, None, None, [], "unavailable", [str(error)]))
            status = 1
            continue
        inputs = gate.operands(problem, variants=4, seed=args.seed)
        expected = [oracle(*args_) for args_ in inputs]

        def verify() -> list[tuple[float, str]]:
            """Per arm: (worst error, first failure or "")."""
            return [_verify(run, identity["name"], inputs, expected, args) for _, identity, run in arms]

        before = verify()
        link = None if args.independent else timing.linear_link
        result = timing.paired_measure(
            [("baseline", arms[0][2]), ("candidate", arms[1][2])], inputs,
            pairs=args.pairs, warmup=args.warmup, chain=args.chain, link=link,
        )
        emit({
            "case": name, "m": m, "n": n, "k": k, "device": device,
            "baseline": arms[0][1], "candidate": arms[1][1],
            "max_abs_error": [_json_float(e) for e, _ in before], "tolerance": [args.atol, args.rtol],
            "oracle": "numpy float64 from stored codes", "failures": [w for _, w in before if w],
            "chain": result.chain, "chain_link": "dependent" if link is not None else "independent",
        }, stream)
        base, cand = result.timings["baseline"], result.timings["candidate"]
        for i, (a, b) in enumerate(zip(base.samples_ns, cand.samples_ns)):
            emit({"case": name, "pair": i, "baseline_ns": round(a, 1), "candidate_ns": round(b, 1)}, stream)
        after = verify()
        failing = [side for side, b4, af in zip(SIDES, before, after) if b4[1] or af[1]]
        why = {side: b4[1] or af[1] for side, b4, af in zip(SIDES, before, after)}
        worst = {side: max(b4[0], af[0]) for side, b4, af in zip(SIDES, before, after)}
        explain = []
        for side, (_, identity, run) in zip(SIDES, arms):
            if side in failing:
                explain.append(_explain(side, identity["name"], worst[side], why[side], run,
                                        inputs, expected, args))
        timed = base.ok and cand.ok
        if "candidate" in failing or not timed:
            verdict = "FAIL"
        elif failing:
            verdict = "baseline_off_oracle"
        else:
            verdict = "ok"
        if not timed:
            explain += [f"{side} {identity['name']} could not be timed: {t.detail}"
                        for side, (_, identity, _r), t in zip(SIDES, arms, (base, cand)) if not t.ok]
        emit({"case": name, "after": True, "max_abs_error": [_json_float(e) for e, _ in after],
              "failures": [w for _, w in after if w], "failing": failing, "verdict": verdict,
              "explanation": explain,
              "unavailable": {k_: t.detail for k_, t in result.timings.items() if not t.ok}}, stream)
        status = status or (1 if verdict == "FAIL" else 0)
        ratios = result.ratios("baseline", "candidate") if timed else []
        check_cell = {"ok": "ok", "baseline_off_oracle": "ok, baseline off"}.get(
            verdict, "FAIL: " + "+".join(failing or ["timing"]))
        summary.append((name, base.median_ns if base.ok else None, cand.median_ns if cand.ok else None,
                        ratios, check_cell, explain))
    _print_summary(summary, arms_label(args), out)
    return status


SIDES = ("baseline", "candidate")


def _verify(run, label: str, inputs, expected, args) -> tuple[float, str]:
    """``(worst error, first failure or "")`` of ``run`` over ``inputs`` vs the oracle."""
    worst, why = 0.0, ""
    for args_, exp in zip(inputs, expected):
        try:
            ok, err, detail = check(run(*args_), exp, args.atol, args.rtol)
        except Exception as error:
            ok, err, detail = False, math.inf, f"{type(error).__name__}: {error}"
        worst = max(worst, err)
        if not ok and not why:
            why = f"{label}: {detail}"
    return worst, why


def _explain(side: str, label: str, worst: float, why: str, run, inputs, expected, args) -> str:
    """Why ``side`` misses the oracle: its worst error, and whether the same kernel is
    within tolerance on float32-upcast activations (then its low-precision arithmetic
    in ``args.dtype`` is the cause, not the weights or the other arm)."""
    text = (f"{side} {label} fails the oracle: worst |error| {worst:.4g} > max(atol {args.atol}, "
            f"rtol {args.rtol} x |oracle|) ({why.split(': ', 1)[-1]})")
    if args.dtype == "float32":
        return text
    upcast = [(x.astype(mx.float32), w, b) for x, w, b in inputs]
    worst32, why32 = _verify(run, label, upcast, expected, args)
    if not why32:
        return (text + f"; on float32-upcast activations the same kernel is within tolerance "
                f"(worst {worst32:.4g}): its {args.dtype} arithmetic on this device is the "
                f"inaccurate side")
    return text + f"; also on float32-upcast activations (worst {worst32:.4g})"


def _json_float(x: float):
    return x if math.isfinite(x) else None


def arms_label(args) -> str:
    b = args.baseline or f"table {args.baseline_table}"
    c = args.candidate or f"table {args.candidate_table}"
    return f"candidate ({c}) / baseline ({b})"


def _print_summary(rows, label: str, out) -> None:
    print(f"\nmedian ratio {label}; spread = p25..p75 of the per-pair ratios", file=out)
    head = ["case", "baseline", "candidate", "ratio", "spread", "pairs", "check"]
    body = []
    notes = []
    for name, b, c, ratios, verdict, explain in rows:
        stats = render.spread(ratios)
        cells = [f"{stats[0]:.3f}", f"{stats[1]:.3f}..{stats[2]:.3f}"] if stats else ["-", "-"]
        body.append([name, render.fmt_ns(b), render.fmt_ns(c)] + cells + [str(len(ratios)), verdict])
        notes += [f"{name}: {line}" for line in explain]
    print(render.columns(head, body), file=out)
    for line in notes:
        print(line, file=out)


def _device_kernel(problem: Problem, exclude=("mlx_qmm",)) -> str:
    """A kernel for ``problem``: the one the op runs with no ``kernel=`` (a table's
    choice, a borrowed one, the built-in prior) where that is a device kernel not in
    ``exclude``, else the first device (non-``any``) candidate that runs it, else the
    exact W8A8 kernel."""
    chosen = registry.choose(problem)
    if chosen.backend != "any" and chosen.name not in exclude:
        return chosen.name
    device = [c.name for c in registry.candidates(problem)
              if c.backend != "any" and c.name not in exclude]
    return device[0] if device else EXACT


def cider(args, stream, out) -> int:
    """The Cider-style four-way comparison; returns the exit status."""
    work = shapes.expand(args.shapes, prog=PROG) if args.shapes else list(CIDER_SHAPES)
    head = ["M", "K", "N", "w8a8-full", "int8-raw", "qmm-w8a16", "bf16-matmul",
            "full/raw", "qmm/full", "matmul/full", "kernels (full, raw)"]
    body = []
    device = table.device_key()
    for m, n, k in work:
        problem = Problem("linear", m, n, k, "bfloat16", "per_channel", args.group_size, False)
        kernel = args.w8a8_kernel or _device_kernel(problem)
        int8_kernel = _device_kernel(Problem("int8_matmul", m, n, k, "int8", "int8"))
        xs = gate.activations(problem, 4, args.seed)
        w = gate.make_weight(problem, args.seed)
        w_f = w.dequantize().astype(mx.bfloat16)
        b_i8 = w.int8()
        a_i8 = [mx.random.randint(-127, 128, (m, k), key=mx.random.key(args.seed + i)).astype(mx.int8)
                for i in range(4)]
        mx.eval(w_f, b_i8, a_i8)
        inputs = list(zip(xs, a_i8))
        arms = [
            ("w8a8-full", lambda x, a: ops.w8a8_linear(x, w, kernel=kernel)),
            ("int8-raw", lambda x, a: ops.int8_matmul(a, b_i8, kernel=int8_kernel)),
            ("qmm-w8a16", lambda x, a: mx.quantized_matmul(
                x, w.q, w.scales, w.biases, transpose=True, group_size=w.group_size, bits=8)),
            ("bf16-matmul", lambda x, a: mx.matmul(x, w_f.T)),
        ]
        result = timing.paired_measure(arms, inputs, pairs=args.pairs, warmup=args.warmup, chain=args.chain)
        med = {name: t.median_ns for name, t in result.timings.items()}
        emit({"cider": True, "m": m, "k": k, "n": n, "device": device, "w8a8_kernel": kernel, "int8_kernel": int8_kernel,
              "chain": result.chain, "pairs": result.rounds,
              "median_ns": {k_: _json_float(v) for k_, v in med.items()},
              "samples_ns": {k_: [round(s, 1) for s in t.samples_ns] for k_, t in result.timings.items()},
              "unavailable": {k_: t.detail for k_, t in result.timings.items() if not t.ok}}, stream)

        def ratio(a, b):
            return f"{med[a] / med[b]:.2f}x" if math.isfinite(med[a]) and math.isfinite(med[b]) else "-"

        body.append([str(m), str(k), str(n)] + [render.fmt_ns(med[a]) for a, _ in arms]
                    + [ratio("w8a8-full", "int8-raw"), ratio("qmm-w8a16", "w8a8-full"),
                       ratio("bf16-matmul", "w8a8-full"), f"{kernel}, {int8_kernel}"])
    print("\nmedian per launch; x/y = time(x) / time(y) (> 1: the W8A8 pipeline is faster "
          "than x for qmm/full and matmul/full)", file=out)
    print(render.columns(head, body, right=range(len(head))), file=out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mlx_w8a8.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", help="baseline kernel name (default: the format's reference, "
                   "mlx_qmm; mlx_qmm4 for --format grouped4)")
    p.add_argument("--candidate", help=f"candidate kernel name (default: the format's exact "
                   f"kernel, {EXACT}; {registry.EXACT_W4A8} for --format grouped4)")
    p.add_argument("--baseline-table", help="baseline: the kernel this tuning table chooses")
    p.add_argument("--candidate-table", help="candidate: the kernel this tuning table chooses")
    p.add_argument("--cases", nargs="+", metavar="MxNxK", help="override the qualification cases")
    p.add_argument("--cider", action="store_true", help="run the Cider-style four-way comparison")
    p.add_argument("--shapes", nargs="+", metavar="MxNxK", help="shapes for --cider (default: Cider's list)")
    p.add_argument("--w8a8-kernel", help=f"W8A8 kernel for --cider (default: a device kernel, else {EXACT})")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                   help="activation dtype (--model: the model's dtype; default: bfloat16)")
    p.add_argument("--format", default="per_channel", choices=("per_channel", "grouped", "grouped4"),
                   help="weight format of the qualification cases: symmetric per-channel int8, "
                   "group-wise affine 8-bit, or MLX's affine 4-bit (grouped4: the default arms "
                   "are then mlx_qmm4 and exact_w4a8, the W4A8 math) (default: per_channel)")
    p.add_argument("--group-size", type=int, default=64, choices=(32, 64, 128),
                   help="weights per scale of the cases' weights (default: 64)")
    p.add_argument("--act-scales", default="token", choices=("token", "group"),
                   help="activation scaling of the cases (group: per token and weight "
                   "group, --format grouped or grouped4; the default candidate is then "
                   "exact_act_groups) (default: token)")
    p.add_argument("--pairs", type=int, default=MIN_PAIRS, help="timed pairs per case (>= 30)")
    p.add_argument("--warmup", type=int, default=timing.WARMUP,
                   help="untimed launches of each arm before timing (default: %(default)s)")
    p.add_argument("--chain", type=int, default=None, help="launches per eval (default: adaptive)")
    p.add_argument("--independent", action="store_true",
                   help="qualification: chains of independent launches (MLX's CUDA graph may "
                   "run them side by side) instead of dependent ones, each launch's activation "
                   "made from the previous output as in a model")
    p.add_argument("--atol", type=float, default=gate.ATOL, help="oracle check absolute tolerance")
    p.add_argument("--rtol", type=float, default=gate.RTOL, help="oracle check relative tolerance")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random weights and activations (default: 0)")
    p.add_argument("--json", "--jsonl", dest="jsonl", nargs="?", const="-", default=None,
                   metavar="FILE",
                   help="also write the records as JSON lines to FILE; --json alone writes "
                   "them to stdout, the table then goes to stderr (default: no JSON, the "
                   "table on stdout)")
    modelbench.add_arguments(p)
    tpbench.add_arguments(p)
    return p


def main(argv: list[str] | None = None, out=None) -> int:
    """Run the bench; returns the exit status (1 when a correctness check failed)."""
    args = build_parser().parse_args(argv)
    if args.tp is not None and not args.model:
        print(render.error_line(PROG, f"--tp {args.tp} splits a model: give --model"), file=sys.stderr)
        return 2
    if args.model or args.weights is not None:  # --weights FOLDER names the model too
        return _model_main(args, out)
    if args.pairs < MIN_PAIRS:
        print(render.error_line(PROG, f"at least {MIN_PAIRS} pairs are required, got {args.pairs}"),
              file=sys.stderr)
        return 2
    if args.baseline and args.baseline_table or args.candidate and args.candidate_table:
        print(render.error_line(PROG, "give a kernel or a table for each arm, not both"), file=sys.stderr)
        return 2
    # The format's reference and exact kernels (registry.fallback_name / exact_name).
    if args.act_scales == "group" and args.format == "per_channel":
        print(render.error_line(PROG, "--act-scales group needs --format grouped or grouped4"),
              file=sys.stderr)
        return 2
    fmt = Problem("linear", 1, args.group_size, args.group_size, args.dtype, args.format,
                  args.group_size, False, args.act_scales)
    if not args.baseline and not args.baseline_table:
        args.baseline = registry.fallback_name(fmt)
    if not args.candidate and not args.candidate_table:
        args.candidate = registry.exact_name(fmt)
    return _run_with_output(
        args, out, lambda stream, out: cider(args, stream, out) if args.cider
        else qualify(args, stream, out))


def _model_main(args, out) -> int:
    """``--model``: the model benchmark (:mod:`mlx_w8a8.modelbench`); with ``--tp N``,
    split over the N ranks of a distributed launch (:mod:`mlx_w8a8.tpbench`)."""
    if args.tp is None:
        if args.check:
            print(render.error_line(PROG, "--check checks a --tp run; give --tp N"), file=sys.stderr)
            return 2
        return _run_with_output(args, out, lambda stream, out: modelbench.run(args, stream, out, emit))
    for flag, given in (("--new-lengths", args.new_lengths), ("--warm-up", args.warm_up),
                        ("--weights", args.weights is not None),
                        ("--batch", args.batch is not None)):
        if given:
            print(render.error_line(PROG, f"{flag} is measured on one device; run it "
                                    "without --tp"), file=sys.stderr)
            return 2
    try:
        deadline = tpbench.Deadline(args.tp_timeout)
    except ValueError as error:
        print(render.error_line(PROG, error), file=sys.stderr)
        return 2
    with deadline:  # every wait from here on is bounded
        try:
            group = tpbench.join(args)
        except ValueError as error:
            print(render.error_line(PROG, error), file=sys.stderr)
            return 2
        if group.rank() != 0:
            args.jsonl = os.devnull  # rank 0 reports
        return _run_with_output(
            args, out, lambda stream, out: tpbench.run(args, group, stream, out, emit))


def _run_with_output(args, out, body) -> int:
    """``body(stream, out)`` with the JSON lines stream of ``--json`` open (a stream that
    keeps nothing without ``--json``); a ``ValueError`` is one error line and exit code 2."""
    if args.jsonl is None:
        stream = open(os.devnull, "w", encoding="utf-8")
    else:
        stream = sys.stdout if args.jsonl == "-" else open(args.jsonl, "w", encoding="utf-8")
    out = out or (sys.stderr if args.jsonl == "-" else sys.stdout)
    try:
        return body(stream, out)
    except ValueError as error:
        print(render.error_line(PROG, error), file=sys.stderr)
        return 2
    finally:
        if stream is not sys.stdout:
            stream.close()


if __name__ == "__main__":
    sys.exit(main())
