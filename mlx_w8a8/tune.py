"""``python -m mlx_w8a8.tune``: measure kernels on this machine and record a table.

Examples::

    python -m mlx_w8a8.tune --model llama-3-8b           # every linear shape of a model
    python -m mlx_w8a8.tune --model path/to/mlx-model --m 1,16,128 --tp 2
    python -m mlx_w8a8.tune --shapes mlp,attn --m 1,16,128,512 --table app/tuning.json
    python -m mlx_w8a8.tune --shapes 1x4096x4096 8x4096x14336
    python -m mlx_w8a8.tune --op int8_matmul --shapes mlp --m 16,2048
    python -m mlx_w8a8.tune --table app/tuning.json --export dist/tuning.json
    python -m mlx_w8a8.tune --show dist/tuning.json

``--model`` takes an mlx-lm model folder, its ``config.json``, or a preset
(``llama-3-8b``, ``mistral-7b``, ``qwen2.5-7b``, ``llama-3.2-1b``, ``phi-3-mini``:
:mod:`mlx_w8a8.models`) and measures exactly the distinct linear shapes of that model
(``lm_head`` included unless tied to the embeddings); it needs mlx-lm. Shape presets
(:mod:`mlx_w8a8.tuning.shapes`): ``mlp`` and ``attn`` are the MLP and attention
projections of Llama-3-8B, Mistral-7B and Qwen2.5-7B; ``all`` is both. Shapes already
measured in the target table (same device, versions and kernels) are skipped;
``--force`` measures them again. Ctrl-C stops after
saying how many entries were saved (exit 130); the exit status is 1 when nothing
measured could be recorded.

``--op`` picks what ``--shapes`` measures: ``linear`` (the default, the W8A8 linears that
``mlx_w8a8.Linear`` and ``w8a8_linear`` run), ``int8_matmul`` (the raw int8 GEMM,
``[M, K] x [N, K]^T`` to int32, as ``mlx_w8a8.int8_matmul`` runs it) or
``quantize_activation`` (per-token int8 codes of ``[M, K]`` activations in ``--dtype``; N
is not used). The two exact ops are gated by equality with the exact kernel.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from . import backends
from .kernels import capabilities
from .kernels.registry import Problem
from .tuning import decode_check as decode_check_mod
from .tuning import gate, linears, render, shapes, table, timing
from .tuning.batch import Batch
from .tuning.tuner import MIN_IMPROVEMENT_BPS, TuneConfig, Tuner, _now
from .weight import GROUPED4

PROG = "mlx_w8a8.tune"
PREFILL_ROUNDS = decode_check_mod.PREFILL_ROUNDS  # the sibling and prefill checks' ROUNDS
DTYPES = ("bfloat16", "float16", "float32")
OPS = ("linear", "int8_matmul", "quantize_activation")


def _m_help() -> str:
    gpu = ", ".join(map(str, shapes.GPU_M[:3])) + f", ..., {shapes.GPU_M[-1]}"
    cpu = ", ".join(map(str, shapes.CPU_M))
    return (f"token counts M to measure, comma-separated (default: {gpu} on a GPU, covering "
            f"decode and prefill; {cpu} on a CPU, where one bfloat16 quantized_matmul of "
            f"4096x4096 takes about 0.9 s at M = 4 on 2 cores)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mlx_w8a8.tune",
        description="Gate and time every W8A8 linear kernel per (M, N, K) on this "
        "machine and record the fastest acceptable one in a tuning table.",
    )
    p.add_argument("--model", metavar="PATH|PRESET",
                   help="tune every distinct linear shape of a model: an mlx-lm model folder, "
                   "its config.json, or llama-3-8b, mistral-7b, qwen2.5-7b, llama-3.2-1b, "
                   "phi-3-mini (needs mlx-lm)")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="with --model: shapes of one of N tensor-parallel ranks "
                   "(q/k/v/gate/up at N/tp outputs, o/down at K/tp inputs)")
    p.add_argument("--shapes", nargs="+", metavar="SPEC",
                   help="presets (mlp, attn, all: Llama-3-8B, Mistral-7B, Qwen2.5-7B "
                   "projections) and/or MxNxK (M tokens, N out, K in) shapes")
    p.add_argument("--op", default="linear", choices=OPS,
                   help="--shapes: the op to measure: linear (default), int8_matmul (the raw "
                   "int8 GEMM to int32) or quantize_activation (per-token int8 codes of "
                   "[M, K] activations in --dtype; N is not used)")
    p.add_argument("--m", default=None, help=_m_help())
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="activation dtype")
    p.add_argument("--format", dest="weight_format", default="per_channel",
                   choices=("per_channel", "grouped", "grouped4"),
                   help="weight format: per_channel or grouped (8-bit), grouped4 (MLX's 4-bit "
                   "affine, as mlx-lm 4-bit models hold it); with --model: of the layers "
                   "mlx_w8a8.quantize converts from float")
    p.add_argument("--group-size", type=int, default=64, choices=(32, 64, 128),
                   help="weights per scale of the measured weights (with --model: of the "
                   "layers mlx_w8a8.quantize converts from float; default: 64)")
    p.add_argument("--act-scales", default="token", choices=("token", "group"),
                   help="activation scaling of the W8A8 (W4A8) kernels: one int8 scale per "
                   "token, or per token and weight group (--format grouped or grouped4 "
                   "only; mlx_w8a8.Linear.act_scales) (default: token)")
    p.add_argument("--bias", action="store_true", help="--shapes: measure with a bias vector")
    p.add_argument("--table", help="table to read and write (default: the user cache table)")
    p.add_argument("--export", metavar="PATH",
                   help="write this machine's entries of the table to PATH (for shipping)")
    p.add_argument("--show", metavar="PATH", help="print the table at PATH and exit")
    p.add_argument("--from-report", metavar="FILE", help="write the entries of a python -m mlx_w8a8.check "
                   "--report FILE into --table (default: the user cache table) and exit")
    p.add_argument("--atol", type=float, default=gate.ATOL, help="gate absolute tolerance")
    p.add_argument("--rtol", type=float, default=gate.RTOL, help="gate relative tolerance")
    p.add_argument("--gate-reference-dtype", default="float32",
                   choices=("native", "float32"),
                   help="run the gate's reference in the problem's dtype (native) or on "
                   "float32-upcast activations (default: %(default)s)")
    p.add_argument("--min-improvement", type=float, default=MIN_IMPROVEMENT_BPS,
                   metavar="BPS", help="basis points a challenger must beat the reference by")
    p.add_argument("--pairs", type=int, default=timing.PAIRS,
                   help="alternating timing rounds (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=timing.WARMUP,
                   help="untimed launches of each candidate before timing (default: %(default)s)")
    p.add_argument("--independent", action="store_true",
                   help="time each candidate in chains of independent launches instead of "
                   "dependent ones (each launch fed by the one before, as a model's layers "
                   "are; MLX's CUDA graph may overlap independent launches)")
    p.add_argument("--force", action="store_true", help="re-measure shapes already in the table")
    p.add_argument("--no-keep-choices", action="store_true",
                   help="a shape measured again takes the fastest candidate even where the "
                   "choice the tables already record for it is within --min-improvement of "
                   "it (by default that choice stays: races within the margin do not "
                   "predict the model, docs/tuning.md)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the problems (and which are already in the table), measure nothing")
    p.add_argument("--decode-check", default="auto", choices=("auto", "on", "off"),
                   help="with --model and M = 1: run the model's own decode loop (its first "
                   "--check-layers blocks) and keep the tuned M = 1 kernels only where they "
                   "make decode faster than mx.quantized_matmul, as a whole, else each "
                   "alone; then, for each measured M = 2 .. 64 whose choice is not the "
                   "reference, the same in the model's batched decode of B = M sequences "
                   "(mlx-lm's BatchGenerator, the server's batching). Per-shape timing adds "
                   "host and device time, a decode step overlaps them (docs/tuning.md). "
                   "auto: the B = 1 pass alone, on a GPU (the batched pass's per-group "
                   "verdicts did not repeat on a 32-layer model); on: both passes, also on a "
                   "CPU, where one bfloat16 decode step of a 7B-class block takes seconds")
    p.add_argument("--sibling-check", default="auto", choices=("auto", "on", "off"),
                   help="with --model: prefill the model (its first --check-layers blocks) "
                   "at each measured M >= 16 with its sibling groups (q/k/v, gate/up) as "
                   "one launch and with the members alone, and keep the group launches "
                   "only where they make prefill faster (docs/tuning.md). auto: on a GPU, "
                   "where a kernel runs groups as one launch")
    p.add_argument("--prefill-check", default="auto", choices=("auto", "on", "off"),
                   help="with --model: prefill the model (its first --check-layers blocks) "
                   "at each measured M >= 16 with each layer group on its table choice and "
                   "on a challenger (mx.quantized_matmul for a W8A8 choice, else the "
                   "fastest other kernel timed), and switch where the challenger makes "
                   "prefill faster; a per-shape race is not a model's prefill "
                   "(docs/tuning.md). auto: on a GPU")
    p.add_argument("--check-layers", default="auto", metavar="L|auto",
                   help="transformer blocks of the decode, sibling and prefill checks' model. "
                   f"auto (the default): all of the model's where building it (about "
                   f"{CHECK_PEAK_FACTOR}x its float weights at the peak) fits in "
                   f"{CHECK_MEMORY_SHARE * 100:.0f}%% of the device's memory, else the first "
                   f"{CHECK_LAYERS_FALLBACK}")
    p.add_argument("--check-rounds", type=int, default=decode_check_mod.ROUNDS, metavar="R",
                   help="paired rounds of the decode check, at B = 1 and at each batch "
                   "size it checks (default: %(default)s)")
    p.add_argument("--prefill-rounds", type=int, default=PREFILL_ROUNDS, metavar="R",
                   help="paired rounds per prefill length of the sibling and prefill checks "
                   "(default: %(default)s; more where their verdicts move between runs)")
    p.add_argument("--extra-rounds", type=int, default=None, metavar="R",
                   help="paired rounds each check adds where its first rounds leave a verdict "
                   "unsettled (the median faster by the margin, the lower quartile not), "
                   "judged again over all rounds (default: as many as the check's first "
                   "rounds; 0: none)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress output (a bar on a terminal, else a line per problem; "
                   "the checks' line per round)")
    p.add_argument("-v", "--verbose", action="store_true", help="log gate rejections")
    return p


# --check-layers auto. The checks build their model in memory: its float weights, then
# the 8-bit copies mlx_w8a8.quantize makes of its linears (about 1.5x the float bytes at
# the peak). Full depth where that fits in half the device's memory: on Llama-3-8B a
# 4-block decode check kept a GEMV that the 32-block check and the full model's decode
# rejected (docs/tuning.md). Elsewhere (or where MLX reports no memory size, as on a CPU)
# the first 4 blocks.
CHECK_LAYERS_FALLBACK = 4
CHECK_MEMORY_SHARE = 0.5
CHECK_PEAK_FACTOR = 1.5


def device_memory() -> int | None:
    """The default device's memory in bytes as ``mx.device_info()`` reports it
    (``memory_size`` on Metal, ``total_memory`` on CUDA), or ``None``."""
    import mlx.core as mx

    info = mx.device_info()
    for key in ("memory_size", "total_memory"):
        if info.get(key):
            return int(info[key])
    return None


def auto_check_layers(config: dict, dtype: str) -> tuple[int, str]:
    """``(blocks, why)`` for ``--check-layers auto`` on a model of ``config`` (the whole
    model's, ``models.resolve``) built in ``dtype``: its depth where its build fits the
    memory share, else ``CHECK_LAYERS_FALLBACK``; ``why`` says which and why."""
    import mlx.core as mx

    from . import models

    depth = int(config.get("num_hidden_layers", CHECK_LAYERS_FALLBACK))
    short = min(depth, CHECK_LAYERS_FALLBACK)
    memory = device_memory()
    if memory is None:
        return short, "the device reports no memory size"
    need = CHECK_PEAK_FACTOR * models.parameter_bytes(config, getattr(mx, dtype))
    sizes = f"about {need / 1e9:.1f} GB to build, {memory / 1e9:.1f} GB on the device"
    if need <= CHECK_MEMORY_SHARE * memory:
        return depth, (f"the whole model fits in {CHECK_MEMORY_SHARE:.0%} of the device's "
                       f"memory ({sizes})")
    return short, (f"the whole model does not fit in {CHECK_MEMORY_SHARE:.0%} of the "
                   f"device's memory ({sizes})")


def fail(message, status: int = 1) -> int:
    """Print ``message`` on stderr with one ``[mlx_w8a8.tune]`` prefix; return ``status``."""
    print(render.error_line(PROG, message), file=sys.stderr)
    return status


def unsaved(tuner: Tuner, entries: list[dict], target: str, out) -> int:
    """Account for measured ``entries`` that are not in the table ``target`` as
    measured: those another process dropped are written again
    (:meth:`.tuning.tuner.Tuner.ensure_recorded`); 1, saying why, if some are still
    missing (a failed write, or the table replaced again without them), else 0 (another
    tuner measuring the same keys and writing later is no failure)."""
    found = tuner.ensure_recorded(entries)
    if found["rewritten"]:
        n = len(found["rewritten"])
        print(f"{n} measured entr{'y' if n == 1 else 'ies'} dropped from {target} by another "
              f"process writing it (a tuner with another cache directory) written again",
              file=out)
    if found["superseded"]:
        n = len(found["superseded"])
        print(f"{n} measured entr{'y was' if n == 1 else 'ies were'} also measured by another "
              f"tuner writing {target}, which wrote after this one; the table keeps its "
              f"measurement", file=out)
    lost = found["lost"]
    if not lost:
        return 0
    section = table.section_key(tuner.key)
    errors = sorted({tuner.record_errors[(section, table.entry_key(e))] for e in lost
                     if (section, table.entry_key(e)) in tuner.record_errors})
    why = ("; ".join(errors) if errors else
           f"another process kept replacing {target} without them (writers with different "
           f"cache directories, MLX_W8A8_CACHE_DIR, do not share its lock); run the same "
           f"command again to measure them")
    return fail(f"{len(lost)} of {len(entries)} measured entries are not in {target}: {why}")


def model_problems(args, m_values, out) -> list[Problem]:
    """The problems of ``--model``: its distinct linear shapes at each M."""
    from . import models

    model, config, label = models.build(args.model, dtype=None)
    found, skipped = linears.model_shapes(model, args.dtype, args.weight_format,
                                          args.group_size, args.tp,
                                          sibling_sums=linears.group_launch_available(),
                                          act_scales=args.act_scales)
    if not found:
        raise ValueError(f"[{PROG}] {label} has no linear layers to tune")
    tp = f", tp={args.tp} (one rank)" if args.tp > 1 else ""
    print(f"{label} ({config.get('model_type')}, {config.get('num_hidden_layers')} layers{tp}): "
          f"{len(found)} distinct linear shape(s) x {len(m_values)} M = "
          f"{len(found) * len(m_values)} problem(s)", file=out)
    for s in found:
        names = sorted({p.rsplit('.', 1)[-1] for p in s.paths})
        bias = ", bias" if s.has_bias else ""
        print(f"  {s.n}x{s.k} {s.weight_format} g{s.group_size}{bias}: {', '.join(names)} "
              f"({len(s.paths)} layer(s))", file=out)
    for path, why in skipped:
        print(f"  skipped {path}: {why}", file=out)
    return linears.problems(found, m_values)


def show(path: str, out) -> int:
    """Print every section of the table at ``path``; 1 if it cannot be read or holds
    invalid entries (each named with its line in the file and what is wrong with it;
    inference skips them)."""
    try:
        doc = table.read(path)
    except table.TableError as error:
        return fail(error)
    if doc is None:
        return fail(f"no table at {path}")
    here = table.section_key(table.device_key())
    invalid = table.invalid_entries(doc)
    bad = {(i, j) for i, j, _ in invalid}
    print(f"{path}: schema {doc['schema']}, {len(doc['sections'])} section(s)", file=out)
    for i, s in enumerate(doc["sections"]):
        mark = "this machine" if table.section_key(s) == here else "not this machine/versions: unused here"
        dev = s["device"].get("device_name", s["device"])
        print(f"\n[{s['backend']} {dev}, MLX {s['mlx_version']}, mlx_w8a8 {s['package_version']}] "
              f"({mark}), {len(s['entries'])} entries", file=out)
        by_op: dict[str, list] = {}
        for j, e in enumerate(s["entries"]):
            if (i, j) not in bad:
                by_op.setdefault(e["op"], []).append(e)
        for op, entries in by_op.items():
            print(f"op {op}:", file=out)
            print(render.entries([(e.get("measured_at", ""), e) for e in entries]), file=out)
    if not invalid:
        return 0
    try:
        with open(path, encoding="utf-8") as f:
            lines = table.entry_lines(f.read())
    except OSError:
        lines = {}
    print(f"\n{len(invalid)} invalid entr{'y' if len(invalid) == 1 else 'ies'} "
          f"(skipped where the table is used):", file=out)
    for i, j, problems in invalid:
        at = f"{path}:{lines[(i, j)]}: " if (i, j) in lines else ""
        entry = doc["sections"][i]["entries"][j]
        print(f"  {at}{table.describe_entry(entry, i, j)}: {'; '.join(problems)}", file=out)
    return fail(f"{path} holds {len(invalid)} invalid entr{'y' if len(invalid) == 1 else 'ies'}")


def export(source: str, dest: str, out) -> int:
    """Write this machine's section of ``source`` into ``dest`` (merged, atomic)."""
    doc = table.load(source)
    if doc is None:
        return fail(f"nothing to export from {source}")
    key = table.device_key()
    entries = table.matching_entries(doc, key, source)
    if not entries:
        return fail(f"{source} has no entries for this machine")
    try:
        table.write_entries(dest, key, entries)
    except table.TableError as error:
        return fail(error)
    print(f"exported {len(entries)} entries for this machine to {dest}", file=out)
    return 0


def unwritable_advice(named: str | None) -> str:
    """How to record elsewhere when the target table cannot be written: it is the table
    ``--table`` named, or else ``$MLX_W8A8_TUNING_TABLE``, or else the cache table."""
    from .cachedir import ENV_CACHE_DIR

    if named is None and not os.environ.get(table.ENV_TABLE):
        return (f"record into a writable table with --table PATH (or {table.ENV_TABLE}=PATH), "
                f"or move the cache folder with {ENV_CACHE_DIR}=DIR")
    return (f"name a writable table with --table PATH (or {table.ENV_TABLE}=PATH); without "
            f"either, the table is tuning.json in the cache folder ({ENV_CACHE_DIR}=DIR)")


def shape_problem(args, m: int, n: int, k: int) -> Problem:
    """The problem ``--shapes`` gives for ``M x N x K`` under ``--op``."""
    if args.op == "int8_matmul":
        return Problem("int8_matmul", m, n, k, "int8", "int8")
    if args.op == "quantize_activation":
        return Problem("quantize_activation", m, 0, k, args.dtype, "int8")
    return Problem("linear", m, n, k, args.dtype, args.weight_format, args.group_size, args.bias,
                   args.act_scales)


def main(argv: list[str] | None = None, out=None) -> int:
    """Run the CLI; returns the exit status (130 after Ctrl-C)."""
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.ERROR,
                        format="%(message)s")
    if args.show and not (args.shapes or args.model):
        return show(args.show, out)
    if args.from_report:
        from .tuning import report
        try:
            written = report.table_from_report(args.from_report, args.table or table.cache_table_path(),
                                               args.min_improvement)
        except (ValueError, table.TableError) as error:
            return fail(str(error))
        print(f"{written} entries from {args.from_report} written to {args.table or table.cache_table_path()}", file=out)
        return 0
    if not (args.shapes or args.model or args.export):
        build_parser().print_usage(sys.stderr)
        return fail("give --model, --shapes, --export or --show", 2)
    if args.op != "linear" and args.model:
        return fail(f"--model tunes a model's linears; --op {args.op} takes --shapes", 2)
    if args.tp != 1 and not args.model:
        return fail(f"--tp applies to --model only, got --tp {args.tp} without --model", 2)
    if args.act_scales == "group" and (args.weight_format == "per_channel" or args.op != "linear"):
        return fail("--act-scales group takes --format grouped or grouped4 (the linear op)", 2)
    if args.check_layers != "auto":
        try:
            args.check_layers = int(args.check_layers)
        except ValueError:
            return fail(f"--check-layers takes a number of blocks or auto, got "
                        f"{args.check_layers!r}", 2)
    if ((args.check_layers != "auto" and args.check_layers < 1) or args.check_rounds < 2
            or args.prefill_rounds < 2
            or (args.extra_rounds is not None and args.extra_rounds < 0)):
        return fail(f"need --check-layers >= 1 (or auto), --check-rounds >= 2, "
                    f"--prefill-rounds >= 2 and --extra-rounds >= 0, got {args.check_layers}, "
                    f"{args.check_rounds}, {args.prefill_rounds} and {args.extra_rounds}", 2)
    try:
        config = TuneConfig(atol=args.atol, rtol=args.rtol, min_improvement_bps=args.min_improvement,
                            pairs=args.pairs, warmup=args.warmup, dependent=not args.independent,
                            keep_choices=not args.no_keep_choices,
                            reference_dtype=None if args.gate_reference_dtype == "native"
                            else args.gate_reference_dtype)
        m_values = shapes.parse_m_list(args.m) if args.m is not None else list(shapes.default_m())
        work: list[Problem] = []
        if args.model:
            work += model_problems(args, m_values, out)
        if args.shapes:
            work += [shape_problem(args, m, n, k) for m, n, k in shapes.expand(args.shapes, m_values)]
    except ValueError as error:
        return fail(error, 2)
    except KeyboardInterrupt:
        return fail("interrupted, 0 entries saved", 130)
    tuner = Tuner(table_path=args.table, use_cache=args.table is None, use_shipped=False,
                  online=False, config=config)
    target = tuner.writable_path()
    failures = 0
    runnable = []
    for problem in work:
        if problem.group_size and problem.k % problem.group_size:
            print(f"  {problem.m}x{problem.n}x{problem.k}: skipped, group size "
                  f"{problem.group_size} does not divide K", file=out)
            failures += 1
        elif problem not in runnable:
            runnable.append(problem)
    batch = Batch(tuner, runnable, force=args.force, progress=not args.no_progress)
    if args.dry_run:
        pending = set(batch.pending())
        for p in runnable:
            state = "to measure" if p in pending else "in the table"
            print(f"  {p.m}x{p.n}x{p.k} {p.dtype} {p.weight_format} g{p.group_size}"
                  f"{' bias' if p.has_bias else ''}: {state}", file=out)
        print(f"{len(pending)} of {len(runnable)} problem(s) to measure into {target}", file=out)
        return 0
    if runnable:
        todo = len(batch.pending())
        if todo:
            try:  # before minutes of measuring, not after
                table.check_writable(target)
            except table.TableError as error:
                return fail(f"cannot record into the table: {error}; "
                            f"{unwritable_advice(args.table)}", 1)
        backend = backends.name()
        print(f"tuning {len(runnable)} problem(s), {todo} to measure, into {target} "
              f"({backend}, {tuner.key['device'].get('device_name', '?')})", file=out)
        # A capability that is off here leaves its kernels out of every race below.
        for cap, (on, why) in capabilities(backend).items():
            if not on:
                print(f"  {cap} is off here ({why}): its kernels are not measured", file=out)
    started = time.perf_counter()
    try:
        batch.run()
    except KeyboardInterrupt:
        return fail(f"interrupted, {batch.saved()} entries saved in {target}", 130)
    rows = []
    for problem, outcome in batch.results:
        if outcome.entry is not None:
            rows.append(("cached" if outcome.source == "table" else "measured", outcome.entry))
        else:
            failures += 1
            print(f"  {problem.m}x{problem.n}x{problem.k}: {outcome.source} ({outcome.detail}); "
                  f"the reference stays", file=out)
    status = 0
    if rows:
        print(render.entries(rows), file=out)
        print(f"{len(rows)} problem(s) in {time.perf_counter() - started:.1f} s; table: {target}",
              file=out)
    measured, saved = len(batch.measured()), batch.saved()
    if saved < measured:
        status = unsaved(tuner, batch.measured(), target, out)
    elif failures and not rows:
        status = 1
    stage, since = "decode check", _now()
    try:
        if args.model and wants_decode_check(args, m_values):
            if saved < measured or failures:
                print("decode check skipped: not every problem was measured", file=out)
            else:
                status = decode_check(args, tuner, out) or status
        # The prefill-length checks, in order (the prefill check leaves sibling launches
        # to the sibling check's verdicts).
        for stage, flag, check, needs_groups in (
                ("sibling check", args.sibling_check, "check_siblings", True),
                ("prefill check", args.prefill_check, "check_prefill", False)):
            prefill = check_tokens(flag, args, m_values, needs_groups)
            if not (args.model and prefill):
                continue
            if saved < measured or failures:
                print(f"{stage} skipped: not every problem was measured", file=out)
            else:
                since = _now()
                status = prefill_check(stage, check, args, tuner, out, prefill) or status
    except KeyboardInterrupt:
        # The measured entries were written before any check began: say so, or a user
        # told "0 entries saved" measures them all again. The decode check records each
        # batch size's verdicts as it finishes them, so some of its verdicts may be saved.
        what = (f"the {saved} measured entries are saved in {target}" if saved
                else f"nothing was measured in this run (its entries were in {target})")
        kept = verdicts_since(target, stage, since)
        if kept:
            return fail(f"interrupted in the {stage}: {what}, with the {kept} verdict(s) the "
                        f"{stage} recorded before it; the rest of it and the checks after it "
                        f"did not run (the same command without --force runs the checks "
                        f"again where a choice is not the reference, and measures nothing "
                        f"again)", 130)
        return fail(f"interrupted in the {stage}: {what}, without the verdicts of the "
                    f"{stage} and the checks after it (the same command without --force "
                    f"runs the checks and measures nothing again)", 130)
    if args.export:
        status = export(target, args.export, out) or status
    if args.show:
        status = show(args.show, out) or status
    return status


def verdicts_since(path: str, stage: str, since: str) -> int:
    """How many entries of the table at ``path`` hold a verdict of ``stage`` (``"decode
    check"`` -> ``decode_check``) recorded at or after ``since`` (``_now()``'s ISO form,
    whole seconds, UTC); 0 when the table cannot be read."""
    key = stage.replace(" ", "_")
    try:
        doc = table.read(path)
    except table.TableError:
        return 0
    return sum(1 for section in (doc or {}).get("sections", ())
               for entry in section.get("entries", ())
               if str((entry.get(key) or {}).get("checked_at", "")) >= since)


def wants_decode_check(args, m_values) -> bool:
    """Whether ``--decode-check`` applies: M = 1 tuned, one rank, and on (auto: a GPU)."""
    if args.decode_check == "off" or 1 not in m_values or args.tp != 1:
        return False
    return args.decode_check == "on" or backends.name() != "cpu"


# Prefill lengths the sibling and prefill checks measure: the M values tuned from here up.
CHECK_MIN_M = 16


def check_tokens(flag: str, args, m_values, needs_groups: bool = False) -> list[int]:
    """The prefill lengths a prefill-length check (``--sibling-check``,
    ``--prefill-check``: ``flag``) runs at (empty: it does not run): the measured
    M >= 16, on one rank, where it is on (auto: a GPU, with a kernel that runs sibling
    groups as one launch where ``needs_groups``)."""
    if flag == "off" or args.tp != 1:
        return []
    if flag == "auto" and (backends.name() == "cpu"
                           or (needs_groups and not linears.group_launch_available())):
        return []
    return [m for m in m_values if m >= CHECK_MIN_M]


def _run_check(name: str, args, tuner: Tuner, out, check, suffix: str = "") -> int:
    """Build the checks' model (``--model``'s first ``--check-layers`` blocks, converted as
    ``mlx_w8a8.quantize`` would), run ``check(model, tuner, progress)`` with ``tuner``
    deciding, and print its report and how many entries it rewrote."""
    import mlx.core as mx

    from . import models, tuning
    from .quantizer import quantize

    try:
        whole = models.resolve(args.model)[0]  # the model's own config, all its blocks
        why = None
        if args.check_layers == "auto":  # decided once, for every check of the run
            args.check_layers, why = auto_check_layers(whole, args.dtype)
        model, config, label = models.build(args.model, layers=args.check_layers,
                                            dtype=getattr(mx, args.dtype))
        if args.weight_format == GROUPED4:  # float layers to MLX's 4-bit ones first
            import mlx.nn as nn

            nn.quantize(model, group_size=args.group_size, bits=4,
                        class_predicate=lambda _, m: type(m) is nn.Linear
                        and m.weight.shape[-1] % args.group_size == 0)
        quantize(model, group_size=args.group_size,
                 per_channel=args.weight_format == "per_channel", act_scales=args.act_scales)
        mx.eval(model.parameters())
    except ValueError as error:
        return fail(f"{name}: {error}")
    built = config["num_hidden_layers"]
    depth = whole.get("num_hidden_layers", built)
    print(f"{name} on {label}'s first {built} of {depth} block(s){suffix}", file=out)
    if why is not None:
        print(f"  (--check-layers auto: {why})", file=out)
    if name == "decode check" and built < depth:
        # Measured: 4 of Llama-3-8B's 32 blocks kept a GEMV that the 32-block check and
        # the 32-block model's decode rejected (docs/tuning.md).
        print(f"  (a kernel kept on fewer blocks than the model's can still slow its full "
              f"decode: --check-layers {depth} checks them all; docs/tuning.md)", file=out)
    progress = None if args.no_progress else (lambda msg: print("  " + msg, file=out))
    previous = tuning.use_tuner(tuner)
    try:
        report = check(model, tuner, progress)
    finally:
        tuning.use_tuner(previous)
    print(report.describe(), file=out)
    if report.groups:
        print(f"{report.recorded} entr{'y' if report.recorded == 1 else 'ies'} updated in "
              f"{tuner.writable_path()}", file=out)
    return 0


def prefill_check(name: str, check: str, args, tuner: Tuner, out, tokens: list[int]) -> int:
    """Run the prefill-length check ``mlx_w8a8.tuning.<check>`` (``check_siblings``,
    ``check_prefill``) at prefill lengths ``tokens``."""
    from . import tuning

    return _run_check(
        name, args, tuner, out,
        lambda model, t, progress: getattr(tuning, check)(
            model, t, tokens=tokens, rounds=args.prefill_rounds,
            extra_rounds=args.extra_rounds, min_improvement_bps=args.min_improvement,
            progress=progress),
        f", T = {', '.join(map(str, tokens))}")


def decode_check(args, tuner: Tuner, out) -> int:
    """Run :func:`mlx_w8a8.tuning.check_decode`."""
    from . import tuning

    return _run_check(
        "decode check", args, tuner, out,
        lambda model, t, progress: tuning.check_decode(
            model, t, min_improvement_bps=args.min_improvement, rounds=args.check_rounds,
            extra_rounds=args.extra_rounds, progress=progress, batches=batched_checks(args)))


def batched_checks(args) -> tuple[int, ...]:
    """The batch sizes B >= 2 the decode check judges: all of them with ``--decode-check
    on``, none with ``auto``.

    Hazard: in the batched decode of 32 Llama-3-8B layers on an NVIDIA H100, one
    group's share of a step lies below the noise of steps on W8A8 kernels: over seven
    runs per-group verdicts at B = 4 fell either way (0.67-1.21x) while the race's
    choices as a whole decoded 1.25-2.13x faster than ``mx.quantized_matmul`` in six
    (bench/batched_decode_probe.py, docs/tuning.md). The check now judges the whole
    first, but its batched pass has not been run on a GPU in that form, so ``auto``
    leaves it out."""
    return decode_check_mod.BATCHES if args.decode_check == "on" else ()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before tuning started (while importing, parsing)
        sys.exit(fail("interrupted, 0 entries saved", 130))
