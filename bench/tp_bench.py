"""Tensor-parallel W8A8: a correctness check and a prefill/decode benchmark, one rank per
process, against one device in the same run.

Every rank builds the same mlx-lm Llama with random weights (``--model``: ``8b`` is
Llama-3-8B-shaped — hidden 4096, intermediate 14336, 32 heads, 8 KV heads, vocab 128256 —
with ``--layers`` layers; ``tiny`` is a small one for CPUs), quantizes it with
``mlx_w8a8.quantize`` and shards it with ``mlx_w8a8.shard``. Rank 0 also keeps the
unsharded W8A8 model: that is the one-device arm, run while the other ranks wait.

Check (``--check``, before timing): on ``--check-tokens`` tokens, every rank's logits
must be identical; the sharded logits must satisfy the model-level criterion of
``docs/distributed.md`` — RMS(tp - one device) <= 2 RMS(one device W8A8 - same weights
on W8A16) — with the exact W8A8 kernel forced everywhere; and they are compared with a
one-process model doing the same per-shard quantization (printed, for the record).

Benchmark: prefill (``--prefill`` tokens, no cache) and decode (one token after a
``--context`` prefill, ``--decode-steps`` steps per sample), paired, alternating order
(one device, then tensor parallel; then the other way round), medians over ``--pairs``.
Per rank: its wall time around ``mx.eval`` of its forward (waits for the others
included). Communication: the same all_sums alone (2 per layer, ``[1, T, hidden]`` in
the model dtype, chained), timed the same way; its share is comm / tensor-parallel time.

Run (two processes; ``mlx.launch`` sets the rank variables):

- CPU, ring backend: ``mlx.launch -n 2 --backend ring bench/tp_bench.py --model tiny``
- NVIDIA, NCCL, ranks started by hand (one GPU each)::

    for r in 0 1; do MLX_RANK=$r MLX_WORLD_SIZE=2 NCCL_HOST_IP=127.0.0.1 NCCL_PORT=12345 \\
      CUDA_VISIBLE_DEVICES=$r python3 bench/tp_bench.py --backend nccl --check & done; wait

Rank 0 prints the summary and, with ``--out FILE``, writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

import mlx_w8a8 as w8  # noqa: E402

MODELS = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                 num_key_value_heads=4, vocab_size=512, rope_theta=10000.0),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="any",
                   help="mx.distributed backend: ring, nccl, jaccl or any")
    p.add_argument("--model", choices=sorted(MODELS), default="8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="default: bfloat16 on a GPU, float32 on a CPU")
    p.add_argument("--prefill", type=int, default=2048, help="prefill tokens T")
    p.add_argument("--context", type=int, default=512, help="tokens in the cache before decode")
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--kernel", default=None, help="force this kernel on every W8A8 layer")
    p.add_argument("--check", action="store_true", help="run the correctness check first")
    p.add_argument("--check-tokens", type=int, default=64)
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="rank 0 writes the summary JSON here")
    return p.parse_args(argv)


def build(args, dtype, group=None):
    """The W8A8 model (sharded over ``group`` when given); same weights on every rank."""
    from mlx_lm.models import llama

    cfg = dict(MODELS[args.model], model_type="llama", num_hidden_layers=args.layers,
               rms_norm_eps=1e-5, tie_word_embeddings=False)
    mx.random.seed(args.seed)
    model = llama.Model(llama.ModelArgs.from_dict(cfg))
    model.set_dtype(dtype)
    w8.quantize(model)
    if group is not None:
        w8.shard(model, group)
    mx.eval(model.parameters())
    return model


def device_name() -> str:
    try:
        return str(mx.device_info().get("device_name", mx.default_device()))
    except (AttributeError, RuntimeError):
        return str(mx.default_device())


def force(model, kernel):
    for _, m in model.named_modules():
        if isinstance(m, w8.Linear):
            m.kernel = kernel


def barrier(group):
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))


def gather(group, value: float) -> list[float]:
    """Every rank's ``value`` (an all_sum of one-hot vectors: no all_gather needed)."""
    v = np.zeros(group.size(), dtype=np.float32)
    v[group.rank()] = value
    return np.array(mx.distributed.all_sum(mx.array(v), group=group)).tolist()


def timed(fn) -> float:
    t0 = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - t0


def rms(a) -> float:
    return float(np.sqrt(np.mean(np.square(a.astype(np.float64)))))


def split_k_reference(model, tp, kernel):
    """One process doing the sharded-to-all layers' per-shard quantization (o, down)."""
    class SplitK(nn.Module):
        def __init__(self, layer):
            super().__init__()
            qw = layer.quantized_weight
            k, g = qw.k // tp, qw.k // tp // qw.group_size
            self.k = k
            self.parts = [
                w8.QuantizedWeight(
                    qw.q[:, r * k // 4:(r + 1) * k // 4], qw.scales[:, r * g:(r + 1) * g],
                    qw.biases[:, r * g:(r + 1) * g], qw.group_size, qw.per_channel,
                )
                for r in range(tp)
            ]

        def __call__(self, x):
            y = None
            for r, part in enumerate(self.parts):
                p = w8.w8a8_linear(x[..., r * self.k:(r + 1) * self.k], part, kernel=kernel)
                y = p if y is None else y + p
            return y

    for layer in model.layers:
        layer.self_attn.o_proj = SplitK(layer.self_attn.o_proj)
        layer.mlp.down_proj = SplitK(layer.mlp.down_proj)
    return model


def check(args, group, dtype, single, sharded) -> dict:
    exact = "exact" if "exact" in w8.available_kernels() else "reference"
    rng = np.random.default_rng(args.seed)
    tokens = mx.array(rng.integers(0, MODELS[args.model]["vocab_size"], (1, args.check_tokens)))
    force(sharded, exact)
    tp_logits = np.array(sharded(tokens).astype(mx.float32))
    force(sharded, args.kernel)
    same = gather(group, float(np.sum(tp_logits.astype(np.float64) ** 2)))
    out = {"ranks_identical": len(set(same)) == 1}
    if group.rank() == 0:
        force(single, exact)
        one = np.array(single(tokens).astype(mx.float32))
        force(single, "mlx_qmm")
        w8a16 = np.array(single(tokens).astype(mx.float32))
        force(single, args.kernel)
        tp_shift, w8a8_shift = rms(tp_logits - one), rms(one - w8a16)
        out.update(tp_shift_rms=tp_shift, w8a8_shift_rms=w8a8_shift,
                   criterion_met=bool(0 < tp_shift <= 2 * w8a8_shift),
                   logits_rms=rms(one))
        emul = split_k_reference(build(args, dtype), group.size(), exact)
        emul_logits = np.array(emul(tokens).astype(mx.float32))
        out["tp_vs_split_k_max_abs"] = float(np.max(np.abs(tp_logits - emul_logits)))
        del emul
    return out


def chain_all_sums(group, shape, dtype, count):
    x = mx.random.normal(shape).astype(dtype)
    mx.eval(x)

    def run():
        y = x
        for _ in range(count):
            y = mx.distributed.all_sum(y, group=group) * 0.5
        return y
    return run


def main(argv=None) -> int:
    args = parse_args(argv)
    group = mx.distributed.init(backend=args.backend, strict=True)
    rank, size = group.rank(), group.size()
    gpu = mx.default_device() == mx.gpu
    dtype = getattr(mx, args.dtype or ("bfloat16" if gpu else "float32"))
    hidden = MODELS[args.model]["hidden_size"]
    log = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    log(f"[tp_bench] {size} ranks, backend {args.backend}, device {device_name()}, "
        f"MLX {mx.__version__}, model {args.model} x {args.layers} layers, {dtype}")

    sharded = build(args, dtype, group)
    force(sharded, args.kernel)
    single = None
    if rank == 0:
        single = build(args, dtype)
        force(single, args.kernel)
    barrier(group)
    summary = {"ranks": size, "backend": args.backend, "model": args.model, "layers": args.layers,
               "dtype": str(dtype), "kernel": args.kernel, "mlx": mx.__version__}

    if args.check or args.check_only:
        c = check(args, group, dtype, single, sharded)
        summary["check"] = c
        log("[check]", json.dumps(c))
        if args.check_only:
            return 0 if (rank != 0 or (c["ranks_identical"] and c["criterion_met"])) else 1

    vocab = MODELS[args.model]["vocab_size"]
    rng = np.random.default_rng(args.seed + 1)
    prompt = mx.array(rng.integers(0, vocab, (1, args.prefill)))
    context = mx.array(rng.integers(0, vocab, (1, args.context)))
    step_tok = mx.array([[1]])

    # Kernel decisions of rank 0's first layer (what the tuner runs at these M).
    layer = sharded.layers[0]
    for name, m in (("q_proj", layer.self_attn.q_proj), ("o_proj", layer.self_attn.o_proj),
                    ("gate_proj", layer.mlp.gate_proj), ("down_proj", layer.mlp.down_proj)):
        summary.setdefault("decisions", {})[name] = {
            "shape_per_rank": list(m.quantized_weight.shape),
            "prefill": m.decision(args.prefill, dtype), "decode": m.decision(1, dtype)}
    log("[decisions]", json.dumps(summary["decisions"]))

    from mlx_lm.models.cache import make_prompt_cache

    def decode_fn(model):
        cache = make_prompt_cache(model)
        mx.eval(model(context, cache=cache))

        def run():
            y = None
            for _ in range(args.decode_steps):
                y = model(step_tok, cache=cache)
                mx.eval(y)
            # Rewind so every sample decodes from the same context length.
            for c in cache:
                c.trim(args.decode_steps)
            return y
        return run

    results = {}
    for phase in ("prefill", "decode"):
        if phase == "prefill":
            one_fn = (lambda: single(prompt)) if single is not None else None
            tp_fn = lambda: sharded(prompt)  # noqa: E731
            shape, per = (1, args.prefill, hidden), 1
        else:
            one_fn = decode_fn(single) if single is not None else None
            tp_fn = decode_fn(sharded)
            shape, per = (1, 1, hidden), args.decode_steps
        comm_fn = chain_all_sums(group, shape, dtype, 2 * args.layers * per)
        one_t, tp_t, comm_t = [], [], []
        for i in range(args.warmup + args.pairs):
            order = ("one", "tp", "comm") if i % 2 == 0 else ("comm", "tp", "one")
            for arm in order:
                barrier(group)
                if arm == "one":
                    t = timed(one_fn) if one_fn is not None else 0.0
                else:
                    t = timed(tp_fn if arm == "tp" else comm_fn)
                if i >= args.warmup:  # the first rounds warm up
                    {"one": one_t, "tp": tp_t, "comm": comm_t}[arm].append(t / per)
        med = {k: statistics.median(v) for k, v in (("one", one_t), ("tp", tp_t), ("comm", comm_t))}
        tp_ranks = gather(group, med["tp"])
        comm_ranks = gather(group, med["comm"])
        r = {
            "tokens": args.prefill if phase == "prefill" else 1,
            "one_device_ms": med["one"] * 1e3 if rank == 0 else None,
            "tp_ms_per_rank": [t * 1e3 for t in tp_ranks],
            "all_sum_ms_per_rank": [t * 1e3 for t in comm_ranks],
            "comm_share_per_rank": [c / t for c, t in zip(comm_ranks, tp_ranks)],
        }
        if rank == 0:
            r["speedup_vs_one_device"] = med["one"] / max(tp_ranks)
        results[phase] = r
        log(f"[{phase}]", json.dumps(r))
    summary["results"] = results
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)
    barrier(group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
