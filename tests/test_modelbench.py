"""``python -m mlx_w8a8.bench --model``: the whole-model benchmark (structure, not speed)."""

import io
import json
import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_w8a8
from mlx_w8a8 import backends, bench, modelbench

# A tiny Llama (two blocks, untied lm_head 256x64): the real architecture at a size
# where every measurement takes milliseconds.
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


@pytest.fixture
def tiny(tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    return str(folder)


def run(argv, tmp_path):
    out = io.StringIO()
    path = tmp_path / "model.jsonl"
    code = bench.main(argv + ["--json", str(path)], out=out)
    lines = [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []
    return code, out.getvalue(), lines


def test_every_length_is_reported_with_finite_ratios_and_sqnr(tiny, tmp_path):
    pytest.importorskip("mlx_lm")
    code, text, lines = run(["--model", tiny, "--tokens", "1,8", "--decode", "3", "--prompt", "4",
                             "--rounds", "3"], tmp_path)
    assert code == 0, text
    setup = lines[0]
    assert setup["kind"] == "setup" and setup["variants"] == list(modelbench.VARIANTS)
    assert setup["layers"] == 2 and setup["tokens"] == [1, 8] and setup["rounds"] == 3
    # the 8-bit variants are smaller than bf16
    assert setup["bytes"]["mlx-lm-8bit"] < setup["bytes"]["bf16"]
    assert setup["bytes"]["mlx_w8a8"] < setup["bytes"]["bf16"]
    summaries = [l for l in lines if l["kind"] == "summary"]
    assert [(s["measure"], s["tokens"]) for s in summaries] == [
        ("prefill", 1), ("prefill", 8), ("decode", 3)]
    for s in summaries:
        for name in modelbench.VARIANTS:
            assert s["tokens_per_s"][name]["median"] > 0
        for key, r in s["ratio"].items():
            assert len(r["rounds"]) == 3 and all(math.isfinite(x) and x > 0 for x in r["rounds"])
            assert r["p25"] <= r["median"] <= r["p75"]
    for s in summaries[:2]:
        # quantized logits are close to bf16's but not identical to them
        assert set(s["sqnr_db"]) == {"mlx-lm-8bit", "mlx_w8a8"}
        assert all(v is not None and 15 < v < 80 for v in s["sqnr_db"].values()), s["sqnr_db"]
        # every variant's prefill allocates something beyond its parameters (logits at least)
        assert set(s["working_bytes"]) == set(modelbench.VARIANTS)
        assert all(b > 0 for b in s["working_bytes"].values()), s["working_bytes"]
    rounds = [l for l in lines if l["kind"] == "round"]
    assert len(rounds) == 3 * 3
    # alternating order: A B C, C B A, A B C
    assert [r["order"] for r in rounds[:3]] == [
        list(modelbench.VARIANTS), list(modelbench.VARIANTS)[::-1], list(modelbench.VARIANTS)]
    (dec,) = [l for l in lines if l["kind"] == "decisions"]
    assert len(dec["layers"]) == 2 * 7 + 1 and "model.layers.1.mlp.down_proj" in dec["layers"]
    for row in ("prefill T=1", "prefill T=8", "decode N=3 (prompt 4)", "w8a8 / 8-bit", "SQNR w8a8",
                "prefill T=8, working memory (peak above the memory in use before its first call): bf16 "):
        assert row in text


def test_layers_truncates_and_bad_options_are_refused(tiny, tmp_path):
    pytest.importorskip("mlx_lm")
    code, text, lines = run(["--model", tiny, "--layers", "1", "--tokens", "2", "--decode", "0",
                             "--rounds", "2"], tmp_path)
    assert code == 0, text
    assert lines[0]["layers"] == 1
    assert [l["measure"] for l in lines if l["kind"] == "summary"] == ["prefill"]
    assert run(["--model", tiny, "--rounds", "1"], tmp_path)[0] == 2
    assert run(["--model", tiny, "--tokens", "0"], tmp_path)[0] == 2
    assert run(["--model", "no-such-model"], tmp_path)[0] == 2


def test_variants_come_from_the_same_weights(tiny):
    pytest.importorskip("mlx_lm")
    variants, config, _ = modelbench.make_variants(tiny, seed=3)
    base, q8, w8 = (variants[n] for n in modelbench.VARIANTS)
    up = base.model.layers[1].mlp.up_proj
    assert isinstance(up, nn.Linear) and up.weight.dtype == mx.bfloat16
    # mlx-lm 8-bit: exactly nn.quantize of the bf16 weight (group 64), embedding too
    q_up = q8.model.layers[1].mlp.up_proj
    assert isinstance(q_up, nn.QuantizedLinear) and (q_up.bits, q_up.group_size) == (8, 64)
    wq, scales, biases = mx.quantize(up.weight, group_size=64, bits=8)
    assert mx.array_equal(q_up.weight, wq) and mx.array_equal(q_up.scales, scales)
    assert isinstance(q8.model.embed_tokens, nn.QuantizedEmbedding)
    # mlx_w8a8: every linear layer converted, and it dequantizes to the bf16 weight
    w_up = w8.model.layers[1].mlp.up_proj
    assert isinstance(w_up, mlx_w8a8.Linear) and isinstance(w8.lm_head, mlx_w8a8.Linear)
    deq = mx.dequantize(w_up.weight, w_up.scales, w_up.biases, group_size=w_up.group_size, bits=8)
    err = np.abs(np.array(deq.astype(mx.float32)) - np.array(up.weight.astype(mx.float32)))
    step = np.array(w_up.scales.astype(mx.float32)).max()
    assert err.max() <= step  # within one quantization step of the same weights
    # the norms and embeddings are shared, not re-drawn
    assert mx.array_equal(w8.model.norm.weight, base.model.norm.weight)
    assert mx.array_equal(w8.model.embed_tokens.weight, base.model.embed_tokens.weight)


def test_sqnr_matches_its_definition(rng):
    ref = rng.standard_normal((3, 50)).astype(np.float32)
    noise = 0.01 * rng.standard_normal((3, 50)).astype(np.float32)
    want = 10 * np.log10((ref.astype(np.float64) ** 2).sum() / (noise.astype(np.float64) ** 2).sum())
    got = modelbench.sqnr_db(mx.array(ref), mx.array(ref + noise))
    assert abs(got - want) < 0.05
    assert modelbench.sqnr_db(mx.array(ref), mx.array(ref)) == math.inf


def test_summary_ratios_are_per_round_speed_ratios():
    times = {"bf16": [1.0, 2.0, 4.0], "mlx-lm-8bit": [2.0, 2.0, 2.0], "mlx_w8a8": [1.0, 1.0, 1.0]}
    s = modelbench.summarize(times, tokens=10)
    assert s["tokens_per_s"]["mlx_w8a8"]["median"] == 10.0
    assert s["tokens_per_s"]["bf16"]["median"] == 5.0
    # w8a8 is 2x the 8-bit variant in every round; vs bf16 1x, 2x, 4x
    assert s["ratio"]["mlx_w8a8/mlx-lm-8bit"]["rounds"] == [2.0, 2.0, 2.0]
    assert s["ratio"]["mlx_w8a8/bf16"]["rounds"] == [1.0, 2.0, 4.0]
    assert s["ratio"]["mlx_w8a8/bf16"]["median"] == 2.0
    assert s["ratio"]["mlx-lm-8bit/bf16"]["rounds"] == [0.5, 1.0, 2.0]


def test_alternate_reverses_the_order_every_other_round():
    seen = []
    times = modelbench.alternate(["a", "b", "c"], 4, lambda n: seen.append(n) or 1.0)
    assert "".join(seen) == "abccbaabccba"
    assert all(len(v) == 4 for v in times.values())


def test_the_replica_loop_generates_what_mlx_lm_generates(tiny):
    # the loop used where mlx_lm.generate cannot be imported must be mlx-lm's own:
    # same tokens and log-probabilities from the same model and prompt
    generate = pytest.importorskip("mlx_lm.generate")
    variants, _, _ = modelbench.make_variants(tiny, seed=1)
    model = variants["bf16"]
    prompt = mx.array([3, 17, 200, 5, 9], dtype=mx.int32)
    want = list(generate.generate_step(prompt, model, max_tokens=6))
    got = list(modelbench.generate_steps(prompt, model, max_tokens=6))
    assert [t for t, _ in got] == [t for t, _ in want] and len(got) == 6
    for (_, a), (_, b) in zip(got, want):
        assert mx.array_equal(a, b)
    assert modelbench.decode(model, prompt, 3, modelbench.generate_steps) > 0


BLOCKED = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformers", "huggingface_hub"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, Block())
from mlx_w8a8 import bench, models
code = bench.main(sys.argv[1:])
assert models.mlx_lm_mode() == "models-only", models.mlx_lm_mode()
sys.exit(code)
"""


def test_runs_where_mlx_lm_package_does_not_import(tiny, tmp_path):
    # mlx-lm's package imports transformers and huggingface_hub; its model files do not.
    # Without them the benchmark still builds the model and decodes with the replica
    # loops (one sequence, and a batch).
    pytest.importorskip("mlx_lm")
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    path = tmp_path / "out.jsonl"
    r = subprocess.run([sys.executable, "-c", BLOCKED, "--model", tiny, "--tokens", "2",
                        "--decode", "2", "--prompt", "3", "--rounds", "2", "--batch", "2",
                        "--json", str(path)],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [json.loads(l) for l in path.read_text().splitlines()]
    assert lines[0]["mlx_lm"] == "models-only"
    assert lines[0]["decode_loop"] == "mlx_w8a8.modelbench.generate_steps"
    assert lines[0]["batch_decode_loop"] == "mlx_w8a8.modelbench.batch_generate_steps"
    assert [l["measure"] for l in lines if l["kind"] == "summary"] == [
        "prefill", "decode", "decode-batch"]


def test_unshared_arm_measures_the_sharing_and_changes_no_result(tiny, tmp_path):
    pytest.importorskip("mlx_lm")
    code, text, lines = run(["--model", tiny, "--tokens", "4", "--decode", "2", "--prompt", "3",
                             "--rounds", "2", "--unshared"], tmp_path)
    assert code == 0, text
    assert lines[0]["variants"] == list(modelbench.VARIANTS) + [modelbench.UNSHARED]
    prefill, decode = [l for l in lines if l["kind"] == "summary"]
    for s in (prefill, decode):
        r = s["ratio"][f"mlx_w8a8/{modelbench.UNSHARED}"]
        assert len(r["rounds"]) == 2 and all(x > 0 and math.isfinite(x) for x in r["rounds"])
    # quantizing each layer's input itself gives the same logits as sharing it
    assert prefill["sqnr_db"][modelbench.UNSHARED] == prefill["sqnr_db"]["mlx_w8a8"]
    assert "shared / unshared" in text
    rounds = [l for l in lines if l["kind"] == "round"]
    assert rounds[1]["order"] == (list(modelbench.VARIANTS) + [modelbench.UNSHARED])[::-1]


def test_unlinked_arm_runs_siblings_alone_and_changes_no_result(tiny, tmp_path, monkeypatch):
    pytest.importorskip("mlx_lm")
    from mlx_w8a8 import siblings

    seen = []
    real = siblings.launch_together
    monkeypatch.setattr(siblings, "launch_together", lambda on=True: seen.append(on) or real(on))
    code, text, lines = run(["--model", tiny, "--tokens", "4", "--decode", "0", "--rounds", "2",
                             "--unshared", "--unlinked"], tmp_path)
    assert code == 0, text
    arms = list(modelbench.VARIANTS) + [modelbench.UNSHARED, modelbench.UNLINKED]
    assert lines[0]["variants"] == arms
    (prefill,) = [l for l in lines if l["kind"] == "summary"]
    r = prefill["ratio"][f"mlx_w8a8/{modelbench.UNLINKED}"]
    assert len(r["rounds"]) == 2 and all(x > 0 and math.isfinite(x) for x in r["rounds"])
    assert prefill["sqnr_db"][modelbench.UNLINKED] == prefill["sqnr_db"]["mlx_w8a8"]
    assert "linked / unlinked" in text
    # switched off for each unlinked measurement and back on after it
    assert seen and seen[0::2] == [False] * (len(seen) // 2) and seen[1::2] == [True] * (len(seen) // 2)
    assert siblings.together()


def test_skip_keeps_matching_layers_on_w8a16_in_the_w8a8_variant(tiny, tmp_path):
    # The speed of a mixed W8A8/W8A16 model (the accuracy work's policy) is measured by
    # --skip; the skipped layers are mlx-lm 8-bit layers, the others W8A8.
    pytest.importorskip("mlx_lm")
    variants, _, _ = modelbench.make_variants(tiny, seed=3, skip=["lm_head", "down_proj"])
    w8 = variants["mlx_w8a8"]
    assert isinstance(w8.lm_head, nn.QuantizedLinear)
    assert isinstance(w8.model.layers[0].mlp.down_proj, nn.QuantizedLinear)
    assert isinstance(w8.model.layers[0].mlp.up_proj, mlx_w8a8.Linear)
    code, _, lines = run(["--model", tiny, "--tokens", "4", "--decode", "0", "--rounds", "2",
                          "--skip", "lm_head"], tmp_path)
    assert code == 0
    setup = next(l for l in lines if l["kind"] == "setup")
    assert setup["quantization"]["mlx_w8a8"]["skip"] == ["lm_head"]


def test_outliers_add_an_arm_with_spaced_channels(tiny, tmp_path, capsys):
    # --outliers N: the speed of the recipe's split (channels evenly spaced, at most K / 16)
    # as a fourth arm in the same rounds, beside the plain mlx_w8a8 model of the same weights
    pytest.importorskip("mlx_lm")
    assert modelbench.spaced_outliers(256, 4) == (0, 64, 128, 192)
    assert modelbench.spaced_outliers(64, 32) == (0, 16, 32, 48)  # at most 64 // 16 = 4
    assert modelbench.spaced_outliers(15, 3) is None
    variants, _, _ = modelbench.make_variants(tiny, seed=3, outliers=4)
    arm = modelbench.OUTLIERS
    assert list(variants) == [*modelbench.VARIANTS, arm]

    def w8a8(name):
        return [m for _, m in variants[name].named_modules() if isinstance(m, mlx_w8a8.Linear)]

    layers = w8a8(arm)
    assert layers and all(m.outliers == modelbench.spaced_outliers(m.input_dims, 4) for m in layers)
    assert all(m.outliers is None for m in w8a8("mlx_w8a8"))
    for plain, split in zip(w8a8("mlx_w8a8"), layers):  # the same weights
        assert mx.array_equal(plain.weight, split.weight)
    code, text, lines = run(["--model", tiny, "--tokens", "4", "--decode", "0", "--rounds", "2",
                             "--outliers", "4"], tmp_path)
    assert code == 0
    setup = next(l for l in lines if l["kind"] == "setup")
    assert setup["variants"][-1] == arm
    assert setup["quantization"][arm]["outliers"] == len(layers)
    assert setup["quantization"]["mlx_w8a8"]["outliers"] == 0
    summary = next(l for l in lines if l["kind"] == "summary")
    r = summary["ratio"][f"{arm}/mlx_w8a8"]["rounds"]
    t = next(l for l in lines if l["kind"] == "round")["seconds"]  # round 0's, to 1 us
    assert r[0] == pytest.approx(t["mlx_w8a8"] / t[arm], rel=1e-3)
    assert "outliers / w8a8" in text and "SQNR outliers" in text
    row = next(line for line in text.splitlines() if line.startswith("prefill T=4"))
    assert row.rstrip().endswith(f"{summary['sqnr_db'][arm]:.1f} dB")
    assert {d["variant"] for d in lines if d["kind"] == "decisions"} == {"mlx_w8a8", arm}
    capsys.readouterr()
    code, text, _ = run(["--model", tiny, "--outliers", "-1"], tmp_path)
    assert code != 0 and "--outliers must be >= 0, got -1" in text + capsys.readouterr().err


@pytest.mark.parametrize("module, tail", [("modelbench", "--model PATH|PRESET"),
                                          ("tpbench", "--model PATH|PRESET --tp N")])
def test_running_the_library_modules_points_to_the_bench(module, tail):
    # They are the bench's model arms, not commands: run alone they say so and fail,
    # rather than exit 0 having done nothing.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", f"mlx_w8a8.{module}"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert f"python -m mlx_w8a8.bench {tail}" in done.stderr


def test_new_lengths_times_each_call_at_a_length_not_run_before(tiny, tmp_path, monkeypatch):
    # Every timed call of --new-lengths meets a length nothing in the process ran (a
    # server's prompts), after the same warm-up at T as the steady-state rows.
    pytest.importorskip("mlx_lm")
    seen = []
    real = modelbench.prefill

    def spy(model, tokens):
        seen.append(tokens.shape[1])
        return real(model, tokens)

    monkeypatch.setattr(modelbench, "prefill", spy)
    code, text, lines = run(["--model", tiny, "--tokens", "6", "--decode", "0", "--rounds", "2",
                             "--new-lengths"], tmp_path)
    assert code == 0, text
    names = list(modelbench.VARIANTS)
    summaries = [l for l in lines if l["kind"] == "summary"]
    assert [s["measure"] for s in summaries] == ["prefill", "prefill-new"]
    steady = len(names) * (modelbench.WARMUP + 2)  # warm-up, then 2 rounds, all at T
    assert seen[:steady] == [6] * steady
    fresh = seen[steady:]
    assert sorted(fresh) == list(range(7, 7 + 2 * len(names)))  # each length once
    new = summaries[1]
    assert sorted(x for n in names for x in new["lengths"][n]) == fresh
    for r in new["ratio"].values():
        assert len(r["rounds"]) == 2 and all(math.isfinite(x) and x > 0 for x in r["rounds"])
    assert "prefill T=6+, new lengths" in text



def test_warm_up_runs_before_any_measurement_up_to_the_longest_prefill(tiny, tmp_path,
                                                                        monkeypatch):
    # --warm-up compiles what the mlx_w8a8 model will launch before the first timed
    # call, up to the longest prefill of the run (T plus the new lengths), and reports it.
    pytest.importorskip("mlx_lm")
    events = []
    real_warm_up, real_prefill = mlx_w8a8.warm_up, modelbench.prefill

    def warm_up(model, max_tokens, **kw):
        events.append(("warm_up", max_tokens))
        return real_warm_up(model, max_tokens=max_tokens, **kw)

    def prefill(model, tokens):
        events.append(("prefill", tokens.shape[1]))
        return real_prefill(model, tokens)

    monkeypatch.setattr(mlx_w8a8, "warm_up", warm_up)
    monkeypatch.setattr(modelbench, "prefill", prefill)
    code, text, lines = run(["--model", tiny, "--tokens", "4,6", "--decode", "0", "--rounds", "2",
                             "--new-lengths", "--warm-up"], tmp_path)
    assert code == 0, text
    longest = 6 + 2 * len(modelbench.VARIANTS)  # the last new length of T = 6
    assert events[0] == ("warm_up", longest)
    assert max(n for kind, n in events if kind == "prefill") == longest
    (record,) = [l for l in lines if l["kind"] == "warm_up"]
    assert record["max_tokens"] == longest and record["calls"] >= 1 and record["seconds"] >= 0
    assert "mlx_w8a8.warm_up before the rounds" in text


def test_warm_up_is_refused_with_tp(tiny, capsys):
    code = bench.main(["--model", tiny, "--tp", "2", "--warm-up"], out=io.StringIO())
    assert code == 2 and "--warm-up is measured on one device" in capsys.readouterr().err


def test_layers_and_kernel_are_checked_before_the_model_is_built(tiny, tmp_path, capsys, monkeypatch):
    built = []
    monkeypatch.setattr(modelbench, "make_variants", lambda *a, **k: built.append(a) or 1 / 0)
    for flags, want in ((["--layers", "0"], "--layers must be >= 1, got 0"),
                        (["--kernel", "nope"], "--kernel 'nope'")):
        code, _, _ = run(["--model", tiny, *flags], tmp_path)
        assert code == 2
        assert capsys.readouterr().err.startswith(f"[mlx_w8a8.bench] {want}")
    assert built == []


# --- --weights, --batch, parameter bytes ------------------------------------------------

# TINY with K = 128 and 256 everywhere, so every group size (32, 64, 128) divides every
# layer's K and each format quantizes every linear layer and the embedding.
TINY128 = dict(TINY, hidden_size=128, intermediate_size=256)


@pytest.fixture
def tiny128(tmp_path):
    path = tmp_path / "tiny128.json"
    path.write_text(json.dumps(dict(TINY128, model_type="llama")))
    return str(path)


def _linear_shapes(cfg):
    """``{path: (N, K)}`` of the linear layers of a Llama of ``cfg``, from its config."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {"lm_head": (v, h)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        out.update({f"{p}.self_attn.q_proj": (q, h), f"{p}.self_attn.k_proj": (kv, h),
                    f"{p}.self_attn.v_proj": (kv, h), f"{p}.self_attn.o_proj": (h, q),
                    f"{p}.mlp.gate_proj": (i, h), f"{p}.mlp.up_proj": (i, h),
                    f"{p}.mlp.down_proj": (h, i)})
    return out


def oracle_bytes(cfg, linears, embedding) -> int:
    """Parameter bytes of a Llama of ``cfg`` counted from its shapes in int64: float
    layers in bfloat16 (2 bytes a weight); ``(bits, group_size)`` layers as MLX's affine
    format stores them (``bits`` per weight, a bfloat16 scale and bias per group).
    ``linears`` / ``embedding``: ``None`` (float) or ``(bits, group_size)``."""
    def layer(n, k, fmt):
        if fmt is None:
            return np.int64(n) * k * 2
        bits, g = fmt
        return np.int64(n) * k * bits // 8 + 2 * (np.int64(n) * (k // g)) * 2

    h = cfg["hidden_size"]
    total = sum(layer(n, k, linears) for n, k in _linear_shapes(cfg).values())
    total += layer(cfg["vocab_size"], h, embedding)
    total += np.int64(h) * (2 * cfg["num_hidden_layers"] + 1) * 2  # the RMS norms
    return int(total)


def _linears(model):
    shapes = _linear_shapes(TINY128)
    found = {p: m for p, m in model.named_modules() if p in shapes}
    assert set(found) == set(shapes)
    return found


@pytest.mark.parametrize("fmt", modelbench.WEIGHT_FORMATS)
def test_each_weights_format_builds_the_variants_it_says(tiny128, fmt):
    pytest.importorskip("mlx_lm")
    w = modelbench.parse_weights(fmt)
    variants, _, _ = modelbench.make_variants(tiny128, seed=4, weights=fmt)
    names = modelbench.variant_names(w.bits)
    assert tuple(variants) == names and names[1] == f"mlx-lm-{w.bits}bit"
    base, lm, w8 = (variants[n] for n in names)
    bits, g = (8, 64) if fmt == "bf16" else (int(fmt[0]), int(fmt.split("-gs")[1].split("-")[0]))
    assert (w.bits, w.group_size) == (bits, g)
    # the mlx-lm baseline: nn.quantize of the bf16 weights with the format's bits and
    # group size, the embedding included
    float_layers = _linears(base)
    for path, layer in _linears(lm).items():
        assert isinstance(layer, nn.QuantizedLinear) and (layer.bits, layer.group_size) == (bits, g)
        wq, scales, _ = mx.quantize(float_layers[path].weight, group_size=g, bits=bits)
        assert mx.array_equal(layer.weight, wq) and mx.array_equal(layer.scales, scales), path
    emb = lm.model.embed_tokens
    assert isinstance(emb, nn.QuantizedEmbedding) and (emb.bits, emb.group_size) == (bits, g)
    # mlx_w8a8: what each format says
    said = modelbench.notes(variants, w)
    converted = {p: m for p, m in _linears(w8).items() if isinstance(m, mlx_w8a8.Linear)}
    if fmt == "bf16":
        assert len(converted) == len(_linear_shapes(TINY128))
        assert {(m.format, m.group_size) for m in converted.values()} == {("per_channel", 64)}
        assert isinstance(w8.model.embed_tokens, nn.Embedding)
        want_w8 = oracle_bytes(TINY128, (8, 64), None)
    elif bits == 8:
        want = "per_channel" if fmt.endswith("per-channel") else "grouped"
        assert len(converted) == len(_linear_shapes(TINY128)) and said == []
        assert {(m.format, m.group_size, m.bits) for m in converted.values()} == {(want, g, 8)}
        if want == "grouped":  # the checkpoint's own codes, scales and biases: no copy made
            lm_layers = _linears(lm)
            for path, m in converted.items():
                for key in ("weight", "scales", "biases"):
                    assert mx.array_equal(m[key], lm_layers[path][key]), (path, key)
        want_w8 = oracle_bytes(TINY128, (8, g), (8, g))
    elif fmt.endswith("per-channel"):  # the 4-bit layers requantized: 8-bit codes
        assert said == [] and len(converted) == len(_linear_shapes(TINY128))
        assert {(m.format, m.group_size, m.bits) for m in converted.values()} == {
            ("per_channel", g, 8)}
        want_w8 = oracle_bytes(TINY128, (8, g), (4, g))  # the embedding stays 4-bit
    elif converted:  # a version whose quantize converts 4-bit layers
        assert said == [] and {m.bits for m in converted.values()} == {4}
        want_w8 = oracle_bytes(TINY128, (4, g), (4, g))
    else:  # 4-bit layers stay mlx-lm's: the model itself, and the output says so
        assert said == ["4-bit layers not converted by this version: the mlx_w8a8 row runs "
                        "the mlx-lm 4-bit model as it is, not W4A8"]
        lm_layers = _linears(lm)
        for path, m in _linears(w8).items():
            assert isinstance(m, nn.QuantizedLinear) and (m.bits, m.group_size) == (4, g)
            assert mx.array_equal(m.weight, lm_layers[path].weight)
        want_w8 = oracle_bytes(TINY128, (4, g), (4, g))
    assert modelbench.nbytes(base) == oracle_bytes(TINY128, None, None)
    assert modelbench.nbytes(lm) == oracle_bytes(TINY128, (bits, g), (bits, g))
    assert modelbench.nbytes(w8) == want_w8


def _checkpoint(folder, bits, group_size):
    """An mlx-lm quantized checkpoint of TINY128 written by mlx-lm's own functions;
    returns the model as quantized before saving."""
    from mlx_lm.utils import quantize_model, save_config, save_model
    from mlx_w8a8 import models

    model, config, _ = models.build(dict(TINY128), dtype=mx.bfloat16, seed=9)
    model, config = quantize_model(model, config, group_size, bits)
    mx.eval(model.parameters())
    save_model(folder, model)
    save_config(config, folder / "config.json")
    return model


def test_a_checkpoint_folder_is_the_model_and_its_weights(tmp_path):
    pytest.importorskip("mlx_lm.utils")
    folder = tmp_path / "ckpt-8bit-gs32"
    saved = _checkpoint(folder, 8, 32)
    w = modelbench.parse_weights(str(folder))
    assert (w.source, w.bits, w.group_size, w.per_channel) == ("checkpoint", 8, 32, False)
    variants, _, _ = modelbench.make_variants(None, weights=w)
    base, lm, w8 = (variants[n] for n in modelbench.variant_names(8))
    saved_layers, lm_layers = _linears(saved), _linears(lm)
    for path, layer in _linears(base).items():
        q = saved_layers[path]
        # mlx-lm's model is the checkpoint as stored; bf16 is it dequantized
        assert mx.array_equal(lm_layers[path].weight, q.weight)
        assert isinstance(layer, nn.Linear) and layer.weight.dtype == mx.bfloat16
        deq = mx.dequantize(q.weight, q.scales, q.biases, group_size=32, bits=8)
        assert mx.array_equal(layer.weight, deq.astype(mx.bfloat16)), path
    converted = _linears(w8)
    assert all(isinstance(m, mlx_w8a8.Linear) and m.format == "grouped" and m.group_size == 32
               for m in converted.values())
    assert modelbench.nbytes(w8) == modelbench.nbytes(lm) == oracle_bytes(TINY128, (8, 32), (8, 32))
    assert modelbench.nbytes(base) == oracle_bytes(TINY128, None, None)


def test_weights_folder_composes_with_model(tmp_path, tiny128, capsys):
    pytest.importorskip("mlx_lm.utils")
    folder = tmp_path / "ckpt-4bit-gs64"
    _checkpoint(folder, 4, 64)
    common = ["--tokens", "2", "--decode", "0", "--rounds", "2"]
    # --weights FOLDER alone, and --model FOLDER alone: the same run
    for flags in (["--weights", str(folder)], ["--model", str(folder)],
                  ["--model", str(folder), "--weights", str(folder)]):
        code, text, lines = run(flags + common, tmp_path)
        assert code == 0, (flags, text, capsys.readouterr().err)
        setup = lines[0]
        assert setup["weights"]["source"] == "checkpoint" and setup["weights"]["bits"] == 4
        assert setup["variants"] == ["bf16", "mlx-lm-4bit", "mlx_w8a8"]
        assert "mlx-lm-4bit tok/s" in text and f"the mlx-lm checkpoint {folder}" in text
    capsys.readouterr()  # what those runs said on stderr (their progress lines)
    # another model with the folder's weights, and a float-only format of the folder
    for flags, want in ((["--model", tiny128, "--weights", str(folder)],
                         f"--weights {str(folder)!r} is a checkpoint folder"),
                        (["--model", str(folder), "--weights", "8bit-gs64"],
                         "--weights 8bit-gs64: ckpt-4bit-gs64 is a quantized checkpoint")):
        code, _, _ = run(flags + common, tmp_path)
        assert code == 2
        assert capsys.readouterr().err.startswith(f"[mlx_w8a8.bench] {want}")


def test_batch_rows_are_timed_per_b_with_ratios_and_bytes_in_the_header(tiny, tmp_path):
    pytest.importorskip("mlx_lm")
    code, text, lines = run(["--model", tiny, "--tokens", "2", "--decode", "2", "--prompt", "3",
                             "--rounds", "2", "--batch", "3,2", "--weights", "8bit-gs32"], tmp_path)
    assert code == 0, text
    setup = lines[0]
    assert setup["batch"] == [2, 3] and setup["weights"]["format"] == "8bit-gs32"
    assert setup["batch_decode_loop"] in ("mlx_lm.generate.BatchGenerator",
                                          "mlx_w8a8.modelbench.batch_generate_steps")
    # no int8 copy: mlx_w8a8 loaded from the 8-bit checkpoint holds what it holds
    assert setup["bytes"]["mlx_w8a8"] == setup["bytes"]["mlx-lm-8bit"] < setup["bytes"]["bf16"]
    assert setup["quantization"]["mlx_w8a8"]["formats"] == {"grouped": 15}
    batched = [l for l in lines if l["kind"] == "summary" and l["measure"] == "decode-batch"]
    assert [(s["batch"], s["steps"], s["tokens"]) for s in batched] == [(2, 2, 4), (3, 2, 6)]
    for s in batched:
        assert set(s["ratio"]) == {"mlx_w8a8/mlx-lm-8bit", "mlx_w8a8/bf16", "mlx-lm-8bit/bf16"}
        for r in s["ratio"].values():
            assert len(r["rounds"]) == 2 and all(math.isfinite(x) and x > 0 for x in r["rounds"])
        assert all(s["step_s"][n] > 0 for n in modelbench.VARIANTS)
    rounds = [l for l in lines if l["kind"] == "round" and l["measure"] == "decode-batch"]
    assert [r["batch"] for r in rounds] == [2, 2, 3, 3]
    assert "decode B=2 N=2 (prompt 3)" in text and "decode B=3 N=2 (prompt 3)" in text
    assert "parameters: bf16 " in text and "mlx-lm-8bit " in text


def test_batched_decode_generates_what_single_decodes_generate(tiny128):
    # B sequences decoded together (mlx-lm's BatchGenerator, and the replica used where
    # mlx_lm.generate does not import) give each sequence the tokens it gets alone
    # (greedy, float32), for every variant
    generate = pytest.importorskip("mlx_lm.generate")
    from mlx_w8a8.tuning import model_timing

    variants, _, _ = modelbench.make_variants(tiny128, seed=2, weights="8bit-gs64",
                                              dtype=mx.float32)
    prompts = mx.random.randint(0, 256, (3, 5), key=mx.random.key(11)).astype(mx.int32)
    for name, model in variants.items():
        alone = [[t for t, _ in generate.generate_step(p, model, max_tokens=6)] for p in prompts]
        assert len({tuple(a) for a in alone}) > 1  # the sequences differ: a real batch
        for loop in (model_timing.batch_generator_steps, modelbench.batch_generate_steps):
            steps = list(loop(prompts, model, max_tokens=6))
            assert len(steps) == 6 and all(len(s) == 3 for s in steps)
            assert [list(seq) for seq in zip(*steps)] == alone, (name, loop.__name__)
    assert modelbench.batch_decode(variants["mlx_w8a8"], prompts, 2) > 0


def test_weights_and_batch_are_checked_before_the_model_is_built(tiny, tmp_path, capsys,
                                                                  monkeypatch):
    built = []
    monkeypatch.setattr(modelbench, "make_variants", lambda *a, **k: built.append(a) or 1 / 0)
    for flags, want in (
        (["--weights", "8bit-gs48"], "--weights takes one of bf16, 8bit-gs32"),
        (["--weights", str(tmp_path)], f"--weights {str(tmp_path)!r}: "),
        (["--weights", tiny], f"--weights {tiny!r}: its config.json has no 'quantization'"),
        (["--batch", "4,x"], "--batch takes positive batch sizes"),
        (["--batch", "-2"], "--batch takes positive batch sizes"),
        (["--batch", "2", "--decode", "0"], "--batch 2 times decode steps: --decode must be >= 1"),
    ):
        code, _, _ = run(["--model", tiny, *flags], tmp_path)
        assert code == 2, flags
        assert capsys.readouterr().err.startswith(f"[mlx_w8a8.bench] {want}"), flags
    # a format without a model to quantize
    assert bench.main(["--weights", "8bit-gs64"], out=io.StringIO()) == 2
    assert capsys.readouterr().err.startswith(
        "[mlx_w8a8.bench] --weights 8bit-gs64 quantizes a model's float weights: give --model")
    assert built == []


def test_weights_and_batch_are_refused_with_tp(tiny, capsys):
    for flags in (["--weights", "8bit-gs64"], ["--batch", "4"]):
        code = bench.main(["--model", tiny, "--tp", "2", *flags], out=io.StringIO())
        assert code == 2
        assert f"{flags[0]} is measured on one device" in capsys.readouterr().err


def test_help_lists_weights_and_batch(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens on narrow terminals
    with pytest.raises(SystemExit) as done:
        bench.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for word in ("--weights FORMAT|FOLDER", "8bit-gs32/64/128-per-channel", "4bit-gs32/64/128",
                 "--batch B1,B2,...", "BatchGenerator"):
        assert word in text, word


def test_batched_rows_by_default_on_a_gpu_only(monkeypatch):
    # the CPU's default run stays short; a GPU's has the B = 16 row of a server's load
    args = bench.build_parser().parse_args(["--model", "x"])
    monkeypatch.setattr(backends, "name", lambda: "cpu")
    assert modelbench.batch_sizes(args, decode=4) == []
    monkeypatch.setattr(backends, "name", lambda: "cuda")
    assert modelbench.batch_sizes(args, decode=64) == [16]
    assert modelbench.batch_sizes(args, decode=0) == []  # no decode steps, no batched rows
    args.batch = "0"
    assert modelbench.batch_sizes(args, decode=64) == []


def test_a_mlx_w8a8_checkpoint_converts_the_layers_it_lists(tmp_path):
    # A mixed checkpoint written by mlx_w8a8.save keeps its W8A16 layers W8A16 when
    # mlx_w8a8.load reads it; the bench's mlx_w8a8 variant of it must too.
    pytest.importorskip("mlx_lm.utils")
    import warnings

    from mlx_w8a8 import models

    model, config, _ = models.build(dict(TINY128), dtype=mx.bfloat16, seed=6)
    mlx_w8a8.quantize(model, skip=["lm_head", "down_proj"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no tokenizer beside a test checkpoint
        mlx_w8a8.save(model, tmp_path / "mixed", config=config)
    variants, _, _ = modelbench.make_variants(None, weights=str(tmp_path / "mixed"))
    w8 = variants["mlx_w8a8"]
    loaded, _ = mlx_w8a8.load(tmp_path / "mixed")
    for path, layer in _linears(loaded).items():
        assert type(_linears(w8)[path]) is type(layer), path
    assert isinstance(w8.lm_head, nn.QuantizedLinear)
    assert isinstance(w8.model.layers[1].mlp.down_proj, nn.QuantizedLinear)
    assert isinstance(w8.model.layers[1].mlp.up_proj, mlx_w8a8.Linear)
    assert w8.model.layers[1].mlp.up_proj.format == "per_channel"


def test_the_act_groups_variant_has_activation_groups(tiny):
    # --act-groups: the mlx_w8a8 variant's layers scale activations per group, from
    # float weights (group-wise, then) and from an mlx-lm checkpoint format alike.
    pytest.importorskip("mlx_lm")
    for weights in ("bf16", "8bit-gs64", "4bit-gs32"):
        variants, _, _ = modelbench.make_variants(tiny, seed=3, weights=weights, act_scales="group")
        layers = [m for _, m in variants["mlx_w8a8"].named_modules() if isinstance(m, mlx_w8a8.Linear)]
        assert layers and {m.act_scales for m in layers} == {"group"}, weights
        assert all(m.format != "per_channel" for m in layers)
    with pytest.raises(ValueError, match="--act-groups needs group-wise layers"):
        modelbench.make_variants(tiny, weights="8bit-gs64-per-channel", act_scales="group")


def test_working_memory_is_the_peak_above_what_was_in_use():
    """A call that holds a 4 MiB temporary above 1 MiB of result reports at least the
    temporary; one that allocates nothing new reports (near) nothing."""
    keep = mx.ones((256, 1024))  # resident before: not counted
    mx.eval(keep)
    work = {}
    out = modelbench.working_memory(lambda: (mx.ones((1024, 1024)) * 2.0).sum(axis=0), work, "a")
    assert out.shape == (1024,)
    assert work["a"] >= 4 * (1 << 20), work
    modelbench.working_memory(lambda: keep, work, "b")
    assert work["b"] < (1 << 20), work


def test_each_finished_row_is_said_on_stderr_as_it_finishes(tiny, tmp_path, capsys):
    """A line per row on stderr, in the table's order, with the row's medians (what a run
    cut short keeps); --no-progress prints none and leaves the table as it is."""
    pytest.importorskip("mlx_lm")
    argv = ["--model", tiny, "--tokens", "1,4", "--decode", "2", "--prompt", "3", "--rounds", "2",
            "--batch", "2"]
    code, text, lines = run(argv, tmp_path)
    assert code == 0, text
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[mlx_w8a8.bench] ")]
    summaries = [l for l in lines if l["kind"] == "summary"]
    labels = ["prefill T=1", "prefill T=4", "decode N=2 (prompt 3)", "decode B=2 N=2 (prompt 3)"]
    assert [ln.split("] ", 1)[1].split(":")[0] for ln in said] == labels
    for line, s in zip(said, summaries):
        ours = s["ratio"]["mlx_w8a8/bf16"]["median"]
        lm = s["ratio"]["mlx_w8a8/mlx-lm-8bit"]["median"]
        assert f"w8a8 / bf16 {ours:.2f}x, w8a8 / mlx-lm-8bit {lm:.2f}x (" in line
        assert line.endswith(" s)")
    code, quiet_text, _ = run(argv + ["--no-progress"], tmp_path)
    assert code == 0 and "[mlx_w8a8.bench]" not in capsys.readouterr().err
    assert quiet_text.count("decode B=2 N=2 (prompt 3)") == text.count("decode B=2 N=2 (prompt 3)")


def test_a_progress_line_without_a_ratio_says_so():
    summary = {"ratio": {"mlx_w8a8/bf16": {"median": 1.234}, "mlx_w8a8/mlx-lm-4bit": {"median": None}}}
    assert (modelbench.progress_line("prefill T=8", summary, "mlx-lm-4bit", 12.4)
            == "prefill T=8: w8a8 / bf16 1.23x, w8a8 / mlx-lm-4bit - (12 s)")
