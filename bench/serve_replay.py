"""mlx-lm's server loop replayed in one process: where a served step's time goes.

``mlx_lm.server`` serves concurrent requests with ``mlx_lm.generate.BatchGenerator``: it
calls ``next()`` for about ``--budget`` seconds (its ``TimeBudget``), then inserts the
requests that arrived meanwhile, one by one, and goes on; per generated token it reads
the token's log-probability with ``.item()``. That read evaluates a new array on the
generation stream, behind the step ``next()`` has just launched ahead, so each step
waits for the next one's GPU work before the host builds the step after: the host's
graph building and the GPU's work no longer overlap, unlike the model benchmark's
batched decode (``mlx_w8a8.bench --batch``, which reads no log-probabilities).

This replays that schedule without HTTP, threads or a tokenizer: ``--levels C`` client
slots, each sending ``--per-slot`` requests one after another (the prompt
``"<number>: <--prompt>"`` as bytes, ``--max-tokens`` greedy tokens, no stop tokens: a
slot's next request is inserted at the next budget boundary after its last one
finished, as the server inserts it). Arms (``--arms``): the bf16 model and the
``mlx_w8a8`` model built by the model benchmark (:func:`mlx_w8a8.modelbench.make_variants`,
``--weights``), each with the server's reads (``+item``), with the same reads on a
stream of their own (``+aside``: :func:`mlx_w8a8.token_reads.reads_aside`, what
``mlx_w8a8.server`` does) and without reads (``+none``), alternating order per round;
the ``mlx_w8a8`` model is warmed up first (:func:`mlx_w8a8.warm_up`), and every arm
runs each level once untimed.

Per ``next()`` call it records the wall seconds, the decode rows ``B`` (the generation
batch before the call), the prompt tokens prefilled and the seconds inside the model's
forward calls (graph building: MLX is lazy, so that is host time). Reported per level and
arm (medians over rounds): output tokens/s, against ``bf16`` with the same reads and
against ``bf16+item`` (what ``mlx_lm.server`` does), the median decode-only step (calls
that prefilled nothing) at the level's full batch and its forward-building part, prefill
calls and their seconds, and the median time to first token.

    python bench/serve_replay.py --model llama-3-8b --layers 32 --weights 8bit-gs64 \\
        --levels 8,16 --rounds 2 [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402

import serve_bench  # noqa: E402  (this folder: the script's own)

PROG = "bench/serve_replay.py"
MODELS = ("bf16", "mlx_w8a8")
READS = ("item", "aside", "none")


class Forward:
    """Wraps a model so that the seconds spent in its calls (graph building) add up."""

    def __init__(self, model):
        self.model = model
        self.seconds = 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.model(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def __getattr__(self, name):  # layers, make_cache, ... as the model has them
        return getattr(self.model, name)


def prompt_tokens(number: int, prompt: str) -> list[int]:
    """The request's prompt as byte ids (what the byte tokenizer of
    ``mlx_w8a8.tokens.write_byte_tokenizer`` gives for ``"<number>: <prompt>"``)."""
    return list(f"{number}: {prompt}".encode())


def replay(model, slots: int, per_slot: int, max_tokens: int, prompt: str, budget: float,
           reads: str) -> dict:
    """One level: ``slots`` x ``per_slot`` requests through a ``BatchGenerator`` as the
    server drives it. Returns the level's record (see the module docstring)."""
    import contextlib

    from mlx_lm.generate import BatchGenerator

    from mlx_w8a8 import token_reads

    forward = Forward(model)
    gen = BatchGenerator(forward, max_tokens=max_tokens)
    scope = token_reads.reads_aside() if reads == "aside" else contextlib.nullcontext()
    waiting = list(range(slots))  # requests arrived and not inserted yet
    sent = slots
    started, first = {}, {}
    steps, tokens, done = [], 0, 0
    t0 = time.perf_counter()
    try:
        with scope:
            while done < slots * per_slot:
                for number in waiting:  # between budgets, as the server's loop inserts them
                    (uid,) = gen.insert([prompt_tokens(number, prompt)], [max_tokens])
                    started[uid] = time.perf_counter()
                waiting = []
                chunk = time.perf_counter()
                while True:  # at least one call a budget, as the server's first check passes
                    rows = len(gen._generation_batch)
                    prompt_before = gen._counters.prompt_tokens
                    built = forward.seconds
                    start = time.perf_counter()
                    prompt_responses, responses = gen.next()
                    for r in responses:
                        if reads != "none":  # the server's read of each token
                            r.logprobs[r.token].item()
                        first.setdefault(r.uid, time.perf_counter())
                        tokens += 1
                        if r.finish_reason is not None:
                            done += 1
                            if sent < slots * per_slot:
                                waiting.append(sent)
                                sent += 1
                    prefilled = gen._counters.prompt_tokens - prompt_before
                    steps.append((time.perf_counter() - start, rows, prefilled,
                                  forward.seconds - built))
                    if (not prompt_responses and not responses) \
                            or time.perf_counter() - chunk > budget:
                        break
                if not waiting and done < slots * per_slot and not len(gen._generation_batch) \
                        and not gen._unprocessed_sequences and not len(gen._prompt_batch):
                    raise RuntimeError(f"[{PROG}] the generator stopped with requests left")
    finally:
        mx.synchronize(gen.stream)
        gen.close()
    seconds = time.perf_counter() - t0
    full = [s for s in steps if s[2] == 0 and s[1] == slots]
    prefill = [s for s in steps if s[2] > 0]
    ttft = [first[u] - started[u] for u in first]
    return {
        "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
        "calls": len(steps),
        "decode_full_calls": len(full),
        "decode_full_ms": 1e3 * statistics.median(s[0] for s in full) if full else None,
        "decode_full_build_ms": 1e3 * statistics.median(s[3] for s in full) if full else None,
        "decode_rows_seen": sorted({s[1] for s in steps if s[2] == 0}),
        "prefill_calls": len(prefill), "prefill_s": sum(s[0] for s in prefill),
        "prefill_tokens": sum(s[2] for s in prefill),
        "ttft_median_s": statistics.median(ttft) if ttft else None,
    }


def parse_names(text: str, what: str, allowed) -> list[str]:
    """``"item,aside"`` -> ``["item", "aside"]``, each among ``allowed``.

    Raises:
        ValueError: for an empty list or a name not allowed.
    """
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names or any(v not in allowed for v in names):
        raise ValueError(f"[{PROG}] {what} takes a comma list of {allowed}, got {text!r}")
    return names


def main(argv=None) -> int:
    from mlx_w8a8 import modelbench
    from mlx_w8a8.tuning.model_timing import alternate

    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b", help="a preset, folder or config.json")
    p.add_argument("--layers", type=int, help="keep the first N transformer blocks")
    p.add_argument("--weights", default="8bit-gs64", help="as mlx_w8a8.bench --weights")
    p.add_argument("--levels", default="8,16", help="concurrent client slots per level")
    p.add_argument("--per-slot", type=int, default=2, help="requests each slot sends in turn")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    p.add_argument("--budget", type=float, default=0.5,
                   help="seconds of next() calls between insertions (mlx_lm.server's 0.5)")
    p.add_argument("--arms", default="bf16,mlx_w8a8", help=f"models among {MODELS}")
    p.add_argument("--reads", default="item,aside,none",
                   help="item: read each token's log-probability as mlx_lm.server does; "
                   "aside: the same reads on a stream of their own (mlx_w8a8.token_reads, "
                   "as mlx_w8a8.server reads them); none: no reads")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="append one JSON line per level and arm to this file")
    args = p.parse_args(argv)
    try:
        levels = serve_bench.parse_levels(args.levels, "--levels", PROG)
        arms = parse_names(args.arms, "--arms", MODELS)
        reads = parse_names(args.reads, "--reads", READS)
    except ValueError as error:
        p.error(str(error))
    if args.per_slot < 1 or args.max_tokens < 2 or args.rounds < 1 or args.budget <= 0:
        p.error(f"--per-slot and --rounds must be >= 1, --max-tokens >= 2 and --budget > 0, "
                f"got {args.per_slot}, {args.rounds}, {args.max_tokens}, {args.budget}")
    import mlx_w8a8

    variants, config, label = modelbench.make_variants(args.model, args.layers, args.seed,
                                                       weights=args.weights)
    if "mlx_w8a8" in arms:
        tokens = max(levels) * len(prompt_tokens(max(levels) * args.per_slot, args.prompt))
        mlx_w8a8.warm_up(variants["mlx_w8a8"], max_tokens=min(8192, tokens))
    names = [f"{a}+{r}" for a in arms for r in reads]
    print(f"{PROG}: {label}, {config.get('num_hidden_layers')} layers, weights "
          f"{args.weights}, device {mx.default_device()}, levels {levels}, {args.per_slot} "
          f"requests a slot, {args.max_tokens} tokens, budget {args.budget} s", flush=True)

    def run(name: str, level: int) -> dict:
        model, read = name.split("+")
        return replay(variants[model], level, args.per_slot, args.max_tokens, args.prompt,
                      args.budget, read)

    for level in levels:
        for name in names:  # untimed: compiles, MLX's graphs of each batch size
            run(name, level)
        # the model benchmark's alternation (order reversed every other round)
        records = alternate(names, args.rounds, lambda name: run(name, level))
        for name in names:
            rs = records[name]
            med = {k: statistics.median(x[k] for x in rs) for k in
                   ("tokens_per_s", "prefill_s", "ttft_median_s")}
            full = [x["decode_full_ms"] for x in rs if x["decode_full_ms"] is not None]
            build = [x["decode_full_build_ms"] for x in rs
                     if x["decode_full_build_ms"] is not None]
            read = name.split("+")[1]
            ratios = {base: statistics.median(a["tokens_per_s"] / b["tokens_per_s"]
                                              for a, b in zip(rs, records[base]))
                      for base in dict.fromkeys([f"bf16+{read}", "bf16+item"])
                      if base in records}
            print(f"level {level:3d} {name:15s} {med['tokens_per_s']:8.1f} tok/s"
                  + "".join(f" ({r:.2f}x {base})" for base, r in ratios.items())
                  + (f", decode step at B = {level} {statistics.median(full):6.2f} ms"
                     f" (forward built in {statistics.median(build):5.2f})" if full else
                     ", no decode-only step at the full batch")
                  + f", prefill {rs[0]['prefill_calls']} calls {med['prefill_s'] * 1e3:6.1f} ms"
                  f", TTFT {med['ttft_median_s'] * 1e3:6.1f} ms", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"bench": "serve_replay", "model": label,
                                        "layers": config.get("num_hidden_layers"),
                                        "weights": args.weights, "level": level, "arm": name,
                                        "ratios": ratios, "rounds": rs}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
