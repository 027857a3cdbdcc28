"""``python -m mlx_w8a8.server``: mlx-lm's HTTP server with W8A8 layers.

The server is ``mlx_lm.server`` itself: its flags (``--model``, ``--host``,
``--port``, ``--decode-concurrency``, ``--prompt-concurrency``, ``--prefill-step-size``...),
its OpenAI-compatible API (``/v1/completions``, ``/v1/chat/completions``, streaming),
its batching and its errors. What changes: each model it loads is converted to
``mlx_w8a8.Linear`` layers (:mod:`mlx_w8a8.serving`), the ``--model`` one is loaded,
converted and warmed up before the port opens, a log line says which kernels run, and
the listening socket queues ``--backlog`` connections (default 128; mlx-lm's server class
queues Python's default 5, too few for a burst of concurrent clients:
:data:`mlx_w8a8.serving.DEFAULT_BACKLOG`), and each generated token's log-probability
is read on a stream of its own (:mod:`mlx_w8a8.token_reads`: mlx-lm's read waits for
the next step's GPU work, so host and GPU take turns; the responses are the same;
``--mlx-lm-reads`` reads as mlx-lm does).
Examples::

    python -m mlx_w8a8.server --model path/to/w8a8-folder --port 8080
    python -m mlx_w8a8.server --model path/to/mlx-lm-8bit-folder --tuning-table app/tuning.json
    python -m mlx_w8a8.server --model path/to/float-folder --quantize --warm-up-tokens 0

Warm-up (``mlx_w8a8.warm_up``) defaults to the largest M a server step runs on a GPU
(``--prompt-concurrency`` x ``--prefill-step-size``, at most 8192) and is skipped on the
CPU; ``--warm-up-tokens N`` sets it (0 skips). Distributed serving (``mlx.launch``) is
not supported: mlx-lm loads sharded models through another function.
"""

from __future__ import annotations

import http.server
import logging
import os
import sys
from contextlib import nullcontext

PROG = "python -m mlx_w8a8.server"


def provider_class(base, loader, prog: str = PROG, notes: tuple[str, ...] = (),
                   log=logging.info):
    """A subclass of mlx-lm's ``ModelProvider`` (``base``) that loads the ``--model``
    model when constructed: ``mlx_lm.server.main`` builds the provider before it opens
    the port, so conversion and warm-up finish before the first request is accepted.

    It also sets ``loader.options.warm_up_tokens`` from the server's flags when the
    command line left it unset (:func:`mlx_w8a8.serving.default_warm_up_tokens`), and
    passes each of ``notes`` to ``log`` first: by then ``mlx_lm.server.main`` has set up
    logging (a line logged before it would set up Python's default, which drops the
    server's INFO lines).
    """
    from .serving import default_warm_up_tokens

    class W8A8ModelProvider(base):
        def __init__(self, cli_args):
            for note in notes:
                log(note)
            super().__init__(cli_args)
            if self.is_distributed:
                raise ValueError(
                    f"[{prog}] distributed serving is not supported: mlx-lm loads sharded "
                    f"models with sharded_load, which mlx_w8a8 does not convert; serve on "
                    f"one process, or shard with mlx_w8a8.shard in your own code"
                )
            if loader.options.warm_up_tokens is None:
                loader.options = loader.options._replace(warm_up_tokens=default_warm_up_tokens(
                    cli_args.prefill_step_size, cli_args.prompt_concurrency,
                    cli_args.decode_concurrency))
            self.load_default()

    return W8A8ModelProvider


def main(argv: list[str] | None = None) -> int:
    from . import serving, token_reads

    argv = list(sys.argv[1:] if argv is None else argv)
    options, rest, wants_help = serving.split_argv(PROG, argv, server=True)
    if wants_help:
        serving.print_help(PROG, server=True)
    try:
        module = serving.mlx_lm_module(PROG, "mlx_lm.server")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    base = getattr(module, "ModelProvider", None)
    if base is None or not hasattr(base, "load_default"):
        print(f"error: [{PROG}] mlx-lm {serving.mlx_lm_version()} has no "
              f"mlx_lm.server.ModelProvider with load_default(); mlx_w8a8 needs it to load "
              f"the model before the port opens", file=sys.stderr)
        return 2

    def log(line: str) -> None:
        logging.info(line)

    # mlx-lm's server class, whose listen backlog (a class attribute read when the
    # socket starts listening) this process sets for the block.
    server_class = getattr(module, "ThreadingHTTPServer", http.server.ThreadingHTTPServer)

    def serve() -> None:
        reads = token_reads.reads_aside() if options.aside_reads else nullcontext(False)
        with serving.patched(module, options, PROG, log) as loader, reads as aside:
            notes = (f"[{PROG}] each token's log-probability is read on a stream of its own "
                     f"(mlx_w8a8.token_reads), not behind the step launched ahead; "
                     f"--mlx-lm-reads reads as mlx_lm.server does",) if aside else ()
            module.ModelProvider = provider_class(base, loader, notes=notes, log=log)
            saved_backlog = server_class.request_queue_size
            server_class.request_queue_size = options.backlog
            try:
                saved, sys.argv = sys.argv, [PROG, *rest]
                module.main()
            finally:
                sys.argv = saved
                module.ModelProvider = base
                server_class.request_queue_size = saved_backlog

    return serving.exit_status(PROG, serve)


def _exit_now(status: int) -> None:
    """End the process without the interpreter's finalization, output flushed.

    Once ``mlx_lm.server.main`` returns, the server is shut down and its generation
    thread joined; what is left is the interpreter's finalization, which aborted the
    process in most runs after a SIGINT right after requests ("terminate called
    without an active exception", status -6, with a thread garbage-collecting and no
    Python frame; seen with ``mlx_lm.server`` 0.32.2 itself, MLX 0.32.4). Nothing is
    left to save, so it is skipped.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def cli(argv: list[str] | None = None) -> None:
    """The command line's entry point: :func:`main` on ``argv`` (default ``sys.argv``),
    then the process ends with its status (``_exit_now``)."""
    try:
        status = main(argv)
    except SystemExit as done:  # argparse's --help and usage errors
        status = done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
    _exit_now(status)


if __name__ == "__main__":
    cli()
