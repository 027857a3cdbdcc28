"""The server benchmark: ``python -m mlx_w8a8.server`` against ``mlx_lm.server`` on the
same weights, each server started, loaded with ``bench/serve_bench.py``'s levels and
stopped in turn, on this machine's loopback interface.

The model is a preset, a ``config.json`` or a model folder (:mod:`mlx_w8a8.models`:
random weights, seeded, where the folder has none), ``--layers`` blocks of it, written
once under ``--folders`` (reused when present) as two mlx-lm folders with the byte
tokenizer of :func:`mlx_w8a8.tokens.write_byte_tokenizer` (prompts are bytes; with
random weights the output is whatever the model picks, and the servers' usage counts
the tokens):

- ``bf16``: the weights in bfloat16;
- ``q8``: mlx-lm's 8-bit checkpoint of them (``mlx_lm.utils.quantize_model``, group size
  64: what ``mlx_lm.convert -q --q-bits 8`` writes);
- ``q4``: the same at 4 bits (only when a 4-bit arm is asked for).

The arms (``--arms``; default the first four):

- ``mlx_lm-bf16``: ``python -m mlx_lm.server --model bf16``;
- ``mlx_lm-8bit``: ``python -m mlx_lm.server --model q8``;
- ``w8a8``: ``python -m mlx_w8a8.server --model bf16 --quantize`` (per-channel W8A8 of
  the float weights, the default table and prior; the server warms up before it opens
  its port);
- ``w8a8-8bit``: ``python -m mlx_w8a8.server --model q8`` (the mlx-lm 8-bit checkpoint
  as ``mlx_w8a8.load`` converts it: group-wise W8A8);
- ``w8a8-8bit-pc``: ``python -m mlx_w8a8.server --model q8 --per-channel`` (that
  checkpoint requantized to per-channel int8 on load);
- ``mlx_lm-4bit`` and ``w4a8``: ``mlx_lm.server`` and ``python -m mlx_w8a8.server`` on
  ``q4`` (W4A16 against W4A8 on the codes as stored).

Every arm gets the same server flags (``--server-args``, e.g. mlx-lm's
``--decode-concurrency``) and the same listen backlog (``--backlog``, default
``mlx_w8a8.serving.DEFAULT_BACKLOG``: ``mlx_lm.server`` is started through a one-line
launcher that sets it on its ``ThreadingHTTPServer``, ``mlx_w8a8.server`` takes
``--backlog``; ``--backlog 0`` runs ``mlx_lm.server`` as it ships, with Python's 5, and
gives ``mlx_w8a8.server`` the same 5), starts on a free port, and is timed from the first level only
once it accepts connections (loading and warm-up are reported, not timed into a level).
Before its measured levels each arm serves one unmeasured pass of every level at
``--warm-tokens`` output tokens (default 16, with another prompt): MLX compiles a kernel
at its first call, on CUDA at run time (a CUTLASS module of ``mx.quantized_matmul`` took
about 40 s on a fresh NVIDIA H100 host, then cached on disk), so without the pass the
levels time whichever arm first meets a kernel on that machine.
Per level the output is serve_bench's row; then, for each ``w8a8*`` arm against each
``mlx_lm-*`` arm, the ratio of aggregate output tokens/s (> 1: the W8A8 server is faster)
and of median time to first token (< 1: it answers sooner). ``--json`` writes all of it.

Usage::

    python bench/serve_compare.py --model llama-3-8b --layers 32 --folders /data/serve \\
        --levels 1,8,32 --max-tokens 128 --json serve.json

``--json`` is rewritten after every arm (``"complete": false`` until the last), so a run
stopped partway keeps the arms it finished. Exit status 0 when every request of every
arm succeeded, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import serve_bench  # noqa: E402  (bench/serve_bench.py, the load generator)
from mlx_w8a8.serving import DEFAULT_BACKLOG  # noqa: E402

PROG = "bench/serve_compare.py"
# The warm-up pass's prompt: another text than the measured levels' default, so that what
# it leaves in mlx-lm's prompt cache is no measured request's prefix beyond its number.
WARM_PROMPT = "Describe a harbour at dawn."
ARMS = {
    "mlx_lm-bf16": ("mlx_lm", "bf16"),
    "mlx_lm-8bit": ("mlx_lm", "q8"),
    "w8a8": ("mlx_w8a8", "bf16"),
    "w8a8-8bit": ("mlx_w8a8", "q8"),
    "w8a8-8bit-pc": ("mlx_w8a8", "q8"),
    "mlx_lm-4bit": ("mlx_lm", "q4"),
    "w4a8": ("mlx_w8a8", "q4"),
}
DEFAULT_ARMS = ("mlx_lm-bf16", "mlx_lm-8bit", "w8a8", "w8a8-8bit")
GROUP_SIZE = 64


def write_folders(spec: str, layers: int | None, folders: Path, seed: int = 0,
                  log=print, names: tuple[str, ...] = ("bf16", "q8")) -> dict[str, Path]:
    """``{name: folder}`` for ``names`` (``bf16``, ``q8``, ``q4``) of ``spec``'s first
    ``layers`` blocks, each written under ``folders`` unless a complete folder
    (``config.json`` and weights) is there; every quantized folder holds the same
    bf16 weights, quantized."""
    import mlx.core as mx
    from mlx_lm.utils import quantize_model, save_config, save_model

    from mlx_w8a8 import models
    from mlx_w8a8.tokens import write_byte_tokenizer

    out = {name: folders / name for name in names}
    missing = [n for n, f in out.items()
               if not ((f / "config.json").exists() and models.has_weights(f))]
    if not missing:
        log(f"[{PROG}] reusing {', '.join(str(f) for f in out.values())}")
        return out
    start = time.perf_counter()
    model, config, label = models.build(spec, layers, mx.bfloat16, seed)
    mx.eval(model.parameters())
    config = dict(config, torch_dtype="bfloat16")
    for name in missing:
        folder = out[name]
        folder.mkdir(parents=True, exist_ok=True)
        made, made_config = model, config
        if name != "bf16":  # a fresh copy of the bf16 weights, quantized as mlx-lm does
            made = models.clone(model, config)
            made, made_config = quantize_model(made, dict(config), GROUP_SIZE, int(name[1:]))
        save_model(folder, made)
        save_config(dict(made_config), folder / "config.json")
        write_byte_tokenizer(folder)
    log(f"[{PROG}] wrote {label} ({config['num_hidden_layers']} layers) as "
        f"{', '.join(str(out[n]) for n in missing)} in {time.perf_counter() - start:.1f} s")
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# mlx_lm.server with its ThreadingHTTPServer's listen backlog set (argv[1]) first.
MLX_LM_WITH_BACKLOG = ("import http.server, runpy, sys; "
                       "http.server.ThreadingHTTPServer.request_queue_size = int(sys.argv.pop(1)); "
                       "sys.argv[0] = 'mlx_lm.server'; "
                       "runpy.run_module('mlx_lm.server', run_name='__main__', alter_sys=True)")
STOCK_BACKLOG = socketserver.TCPServer.request_queue_size  # what mlx_lm.server listens with (5)


def server_command(arm: str, folder: Path, port: int, extra: list[str],
                   backlog: int = DEFAULT_BACKLOG) -> list[str]:
    """The command line of ``arm`` serving ``folder`` on loopback ``port`` with a listen
    backlog of ``backlog`` connections (0: ``mlx_lm.server`` as it ships, and
    :data:`STOCK_BACKLOG` for ``mlx_w8a8.server``)."""
    kind, _ = ARMS[arm]
    if kind == "mlx_lm":
        head = ([sys.executable, "-m", "mlx_lm.server"] if backlog == 0 else
                [sys.executable, "-c", MLX_LM_WITH_BACKLOG, str(backlog)])
    else:
        head = [sys.executable, "-m", "mlx_w8a8.server", "--backlog", str(backlog or STOCK_BACKLOG)]
        if arm == "w8a8":
            head += ["--quantize"]
        elif arm == "w8a8-8bit-pc":
            head += ["--per-channel"]
    return head + ["--model", str(folder), "--host", "127.0.0.1", "--port", str(port), *extra]


def shown(cmd: list[str]) -> str:
    """``cmd`` without the interpreter, the launcher's code named instead of printed."""
    if cmd[1] == "-c":
        return f"-m mlx_lm.server (backlog {cmd[3]}) " + " ".join(cmd[4:])
    return " ".join(cmd[1:])


def start(arm: str, folder: Path, extra: list[str], log_path: Path, startup_s: float,
          backlog: int = DEFAULT_BACKLOG):
    """``(process, url, seconds to accept connections)`` of ``arm``'s server."""
    port = _free_port()
    cmd = server_command(arm, folder, port, extra, backlog)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    with open(log_path, "wb") as err:
        # SIGINT back to its default (a background job starts with it ignored): the
        # servers stop on it as a user's Ctrl-C stops them.
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                cwd=str(ROOT),
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = t0 + startup_s
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"[{PROG}] {arm}: the server exited with status "
                               f"{proc.returncode} before accepting connections; its log: {log_path}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}", time.perf_counter() - t0
        except OSError:
            time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"[{PROG}] {arm}: no connection within {startup_s:.0f} s; its log: {log_path}")


def stop(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    """SIGINT, then SIGKILL after ``timeout`` seconds; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def ratios(results: dict[str, dict]) -> list[dict]:
    """Per level, each W8A8 arm against each mlx-lm arm: output tokens/s (first over
    second) and median time to first token (first over second)."""
    out = []
    w8 = [a for a in results if ARMS[a][0] == "mlx_w8a8"]
    lm = [a for a in results if ARMS[a][0] == "mlx_lm"]
    for a in w8:
        for b in lm:
            for ra, rb in zip(results[a]["levels"], results[b]["levels"]):
                tps = (ra["output_tokens_per_s"] / rb["output_tokens_per_s"]
                       if ra["output_tokens_per_s"] and rb["output_tokens_per_s"] else None)
                ttft = (ra["ttft_median_s"] / rb["ttft_median_s"]
                        if ra["ttft_median_s"] and rb["ttft_median_s"] else None)
                out.append({"arm": a, "against": b, "concurrency": ra["concurrency"],
                            "output_tokens_per_s": tps, "ttft_median": ttft})
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b",
                   help="preset, config.json or model folder (default: llama-3-8b)")
    p.add_argument("--layers", type=int, default=None, help="keep the first L blocks (default: all)")
    p.add_argument("--folders", required=True, help="where the bf16 and q8 folders are (written if absent)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help=f"comma-separated, of {', '.join(ARMS)} (default: {', '.join(DEFAULT_ARMS)})")
    p.add_argument("--levels", default="1,8,32", help="concurrent requests per level (default: 1,8,32)")
    p.add_argument("--requests", type=int, default=None,
                   help="requests per level (default: 2 x concurrency)")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    p.add_argument("--server-args", default="",
                   help="extra flags for every server, one string (e.g. '--decode-concurrency 32')")
    p.add_argument("--backlog", type=int, default=DEFAULT_BACKLOG,
                   help=f"every server's listen backlog (default {DEFAULT_BACKLOG}); 0: "
                        f"mlx_lm.server as it ships (Python's {STOCK_BACKLOG}) and the same for mlx_w8a8.server")
    p.add_argument("--warm-tokens", type=int, default=16,
                   help="before an arm's measured levels, one unmeasured pass of every level "
                        "with this many output tokens per request, so that the kernels MLX "
                        "compiles at their first call (at run time on CUDA) are compiled "
                        "before the clock runs (default: 16; 0: none, the cold server timed)")
    p.add_argument("--startup", type=float, default=900.0,
                   help="seconds a server may take to accept connections (default: 900)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--json", default=None, help="also write everything to this JSON file")
    return p


def main(argv: list[str] | None = None, out=None) -> int:
    out = out if out is not None else sys.stdout
    args = _parser().parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    try:
        bad = [a for a in arms if a not in ARMS]
        if bad or not arms:
            raise ValueError(f"[{PROG}] --arms takes {', '.join(ARMS)}, got {args.arms!r}")
        levels = serve_bench.parse_levels(args.levels, "--levels", PROG)
        if args.requests is not None and not 1 <= args.requests <= serve_bench.MAX_REQUESTS:
            raise ValueError(f"[{PROG}] --requests must be in 1..{serve_bench.MAX_REQUESTS}, "
                             f"got {args.requests}")
        if args.max_tokens < 1:
            raise ValueError(f"[{PROG}] --max-tokens must be >= 1, got {args.max_tokens}")
        if args.layers is not None and args.layers < 1:
            raise ValueError(f"[{PROG}] --layers must be >= 1, got {args.layers}")
        if args.warm_tokens < 0:
            raise ValueError(f"[{PROG}] --warm-tokens must be >= 0, got {args.warm_tokens}")
        if args.backlog < 0:
            raise ValueError(f"[{PROG}] --backlog must be >= 0, got {args.backlog}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    folders = Path(args.folders)
    say = lambda text: print(text, file=out, flush=True)  # noqa: E731
    paths = write_folders(args.model, args.layers, folders, args.seed, say,
                          tuple(dict.fromkeys(ARMS[a][1] for a in arms)))
    extra = args.server_args.split()
    requests_for = lambda level: (  # noqa: E731
        args.requests or min(2 * level, serve_bench.MAX_REQUESTS))
    results: dict[str, dict] = {}
    ok = True
    for arm in arms:
        log_path = folders / f"server_{arm}.log"
        proc, url, ready = start(arm, paths[ARMS[arm][1]], extra, log_path, args.startup,
                                 args.backlog)
        say(f"== {arm}: {shown(server_command(arm, paths[ARMS[arm][1]], 0, extra, args.backlog))} "
            f"(accepting connections after {ready:.1f} s; log {log_path})")
        rows, warm = [], None
        try:
            if args.warm_tokens:
                t0 = time.perf_counter()
                for level in levels:
                    serve_bench.run_level(url, "completions", level, requests_for(level),
                                          WARM_PROMPT, args.warm_tokens, args.timeout)
                warm = time.perf_counter() - t0
                say(f"   warm-up pass (every level, {args.warm_tokens} tokens per request, "
                    f"not measured): {warm:.1f} s")
            for level in levels:
                requests = requests_for(level)
                row = serve_bench.run_level(url, "completions", level, requests, args.prompt,
                                            args.max_tokens, args.timeout)
                rows.append(row)
                ok &= row["ok"] == row["requests"]
                say(f"   conc {level:>3}: {row['ok']}/{requests} ok, TTFT p50 "
                    f"{serve_bench._fmt(row['ttft_median_s'], '.3f')} s, output "
                    f"{serve_bench._fmt(row['output_tokens_per_s'], '.1f')} tok/s"
                    + "".join(f"; error: {e}" for e in row["errors"]))
        finally:
            status = stop(proc)
        results[arm] = {"startup_s": ready, "warm_up_s": warm, "exit_status": status,
                        "levels": rows}
        if args.json:  # after every arm: a run stopped later keeps the arms it finished
            write_json(args, levels, extra, results, ratios(results), complete=False)
    table = ratios(results)
    if table:
        say("ratios (output tok/s: > 1 the W8A8 server is faster; TTFT: < 1 it answers sooner)")
        for r in table:
            say(f"   {r['arm']:>10} / {r['against']:<12} conc {r['concurrency']:>3}: output "
                f"{serve_bench._fmt(r['output_tokens_per_s'], '.2f')}x, TTFT "
                f"{serve_bench._fmt(r['ttft_median'], '.2f')}x")
    if args.json:
        write_json(args, levels, extra, results, table, complete=True)
    return 0 if ok else 1


def write_json(args, levels, extra, results, table, complete: bool) -> None:
    """Write the run's report to ``args.json`` (through a temporary file and a rename,
    so an interrupted write leaves the previous report); ``complete`` is false until
    every arm has run."""
    doc = {"model": args.model, "layers": args.layers, "levels": levels,
           "max_tokens": args.max_tokens, "warm_tokens": args.warm_tokens,
           "server_args": extra, "backlog": args.backlog, "complete": complete,
           "arms": results, "ratios": table}
    tmp = f"{args.json}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
