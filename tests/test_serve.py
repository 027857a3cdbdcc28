"""Serving with mlx-lm's own generator and server (``mlx_w8a8.serving``,
``python -m mlx_w8a8.generate`` / ``.server``) and ``bench/serve_bench.py``, on a tiny
llama saved with ``mlx_w8a8.save`` and a byte tokenizer (nothing downloaded).

The server runs as a subprocess on loopback (an ephemeral port), started once for the
module; its greedy completions are compared with the same model loaded in this process
by ``mlx_w8a8.load`` and run by ``mlx_lm``'s ``generate``.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is part of the test extra")
pytest.importorskip("tokenizers", reason="installed with mlx-lm")

import mlx_w8a8 as w8  # noqa: E402
from mlx_w8a8 import generate as w8_generate  # noqa: E402
from mlx_w8a8 import backends, serving  # noqa: E402

import oracle  # noqa: E402
import tiny_lm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import serve_bench  # noqa: E402

STARTUP_S = 90  # the server's start (imports, load, conversion) on a loaded 2-core CI host


def _tiny(dtype=mx.float32, seed=0):
    mx.random.seed(seed)
    return tiny_lm.model("llama", dtype=dtype, hidden=64, inter=128)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{"w8a8": ..., "float": ..., "mixed": ...}``: a W8A8 folder (``mlx_w8a8.save``),
    the float folder it came from, and a mixed folder whose ``lm_head`` stays W8A16."""
    from mlx_w8a8.tokens import write_byte_tokenizer

    root = tmp_path_factory.mktemp("serve")
    model, config = _tiny()
    out = {"float": tiny_lm.folder(root / "float", model, config)}
    w8.quantize(model)
    out["w8a8"] = w8.save(model, root / "w8a8", config, source=out["float"])
    mixed, _ = _tiny(seed=1)
    w8.quantize(mixed, skip={"lm_head": "w8a16"})
    out["mixed"] = w8.save(mixed, root / "mixed", config)
    write_byte_tokenizer(out["mixed"])
    return out


def _greedy_reference(folder: Path, prompt: str, max_tokens: int) -> str:
    """The text mlx-lm's ``generate`` makes greedily with the model ``mlx_w8a8.load``
    builds from ``folder``."""
    from mlx_lm.generate import generate
    from mlx_lm.utils import load_tokenizer

    model, _ = w8.load(folder)
    tokenizer = load_tokenizer(folder)
    return generate(model, tokenizer, prompt, max_tokens=max_tokens)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(folder: Path, log: Path, cache: Path, *flags: str):
    """``(process, url)``: ``python -m mlx_w8a8.server`` on a free loopback port,
    stderr to ``log``, once it accepts connections."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_W8A8_")}
    from mlx_w8a8.tuning import table

    env[table.ENV_CACHE_DIR] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    port = _free_port()
    with open(log, "wb") as err:
        # SIGINT back to its default: a shell's background job starts with it ignored,
        # and Python only turns SIGINT into KeyboardInterrupt when it is not ignored.
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlx_w8a8.server", "--model", str(folder), "--host",
             "127.0.0.1", "--port", str(port), *flags],
            stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=str(ROOT),
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"server did not open its port in {STARTUP_S} s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def server(folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    log = root / "server.log"
    # --warm-up-tokens 8: the warm-up runs (on the CPU it is off by default).
    proc, url = _start_server(folders["w8a8"], log, root / "cache", "--warm-up-tokens", "8")
    yield types.SimpleNamespace(proc=proc, url=url, log=log)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def _post(url: str, body, raw: bool = False):
    data = body if raw else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _events(text: str) -> list:
    """The JSON payloads of a server-sent event stream, up to ``[DONE]`` (checked)."""
    data = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert data and data[-1] == "[DONE]", text[-500:]
    return [json.loads(d) for d in data[:-1]]


# --- the server ---------------------------------------------------------------------------


def test_server_logs_its_layers_and_warms_up_before_opening_the_port(server):
    log = server.log.read_text()
    lines = log.splitlines()
    summary = next(i for i, ln in enumerate(lines) if "mlx_w8a8: 15 layers (15 per_channel)" in ln)
    converted = next(i for i, ln in enumerate(lines) if "15 linear layers converted to W8A8" in ln)
    warm = next(i for i, ln in enumerate(lines) if "warm-up for 1..8 rows" in ln)
    passed = next(i for i, ln in enumerate(lines)
                  if "model pass (a prefill and a decode step, then two sequences batched) in" in ln)
    opened = next(i for i, ln in enumerate(lines) if "Starting httpd" in ln)
    # The summary names the kernel at decode (M=1) and prefill (M=512).
    assert "M=1: " in lines[summary] and "M=512: " in lines[summary]
    assert converted < warm < passed < summary < opened
    assert "model pass failed" not in log
    # every token's log-probability read aside (mlx_w8a8.token_reads), said before serving
    aside = next(i for i, ln in enumerate(lines) if "is read on a stream of its own" in ln)
    assert aside < opened


def test_completions_are_the_greedy_tokens_of_the_w8a8_model(server, folders):
    status, text = _post(server.url + "/v1/completions",
                         {"prompt": "hi", "max_tokens": 6, "temperature": 0.0})
    assert status == 200, text
    body = json.loads(text)
    assert body["usage"]["completion_tokens"] == 6
    assert body["choices"][0]["text"] == _greedy_reference(folders["w8a8"], "hi", 6)


def test_streaming_completions_and_chat(server, folders):
    status, text = _post(server.url + "/v1/completions",
                         {"prompt": "hi", "max_tokens": 6, "temperature": 0.0, "stream": True})
    assert status == 200
    streamed = "".join(e["choices"][0].get("text") or "" for e in _events(text))
    assert streamed == _greedy_reference(folders["w8a8"], "hi", 6)

    status, text = _post(server.url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5,
        "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    events = _events(text)
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[-1]["usage"]["completion_tokens"] == 5
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_malformed_request_gets_mlx_lm_error(server):
    status, text = _post(server.url + "/v1/completions", b"{not json", raw=True)
    assert status == 400
    assert json.loads(text)["error"].startswith("Invalid JSON in request body")
    status, text = _post(server.url + "/v1/chat/completions", [1, 2])
    assert status == 400 and json.loads(text) == {"error": "Request should be a JSON dictionary"}


def test_serve_bench_smoke(server, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = serve_bench.main(["--url", server.url, "--concurrency", "1,2", "--requests", "2",
                           "--max-tokens", "3", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    assert [row["concurrency"] for row in report["levels"]] == [1, 2]
    for row in report["levels"]:
        assert row["ok"] == 2 and row["errors"] == []
        assert row["output_tokens"] == 2 * 3  # the server's usage counts, per request
        assert 0 < row["ttft_median_s"] <= row["wall_s"]
    chat = serve_bench.one_request(server.url, "chat", "hello", 3, timeout=60)
    assert chat.error is None and chat.tokens == 3 and 0 < chat.ttft <= chat.seconds


def test_server_exits_cleanly_on_sigint(server):
    # Last test of the server: it stops the module's process. SIGINT right after
    # concurrent streams: then the interpreter's finalization raced MLX in the HTTP
    # server's exiting threads and aborted (status -6) in most runs.
    level = serve_bench.run_level(server.url, "completions", 4, 4, "hi", 3, timeout=60)
    assert level["ok"] == 4
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(timeout=60) == 0, server.log.read_text()[-2000:]


def test_server_refuses_a_float_folder_without_quantize(folders, capsys):
    # Before the port opens: main returns 2 with the error, nothing is served.
    from mlx_w8a8 import server as w8_server

    assert w8_server.main(["--model", str(folders["float"]), "--port", str(_free_port())]) == 2
    err = capsys.readouterr().err
    assert "holds no 8-bit or 4-bit affine or W8A8 linear layer" in err and "--quantize" in err


# --- python -m mlx_w8a8.generate (in process) -------------------------------------------


def test_generate_command_runs_the_w8a8_model(folders, capsys):
    assert w8_generate.main(["--model", str(folders["w8a8"]), "--prompt", "hi",
                             "--max-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    assert "mlx_w8a8: 15 layers (15 per_channel)" in err
    assert _greedy_reference(folders["w8a8"], "hi", 4) in out


def test_generate_quantizes_a_float_folder_only_when_asked(folders, capsys):
    assert w8_generate.main(["--model", str(folders["float"]), "--prompt", "hi",
                             "--max-tokens", "2"]) == 2
    assert "pass --quantize" in capsys.readouterr().err
    assert w8_generate.main(["--quantize", "--model", str(folders["float"]), "--prompt", "hi",
                             "--max-tokens", "2"]) == 0
    assert "15 linear layers converted to W8A8" in capsys.readouterr().err


# --- mlx_w8a8.serving ---------------------------------------------------------------------


def _linear_kinds(model):
    return {p: type(m).__name__ for p, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.QuantizedLinear, w8.Linear))}


def test_loader_converts_what_mlx_w8a8_load_converts(folders):
    # A mixed folder: lm_head stays an 8-bit nn.QuantizedLinear (listed as W8A16), the
    # other 14 layers become mlx_w8a8.Linear; the logits equal mlx_w8a8.load's.
    from mlx_lm.utils import load

    lines = []
    loader = serving.W8A8Loader(load, serving.ServeOptions(), "prog", lines.append)
    model, tokenizer = loader(str(folders["mixed"]))
    reference, _ = w8.load(folders["mixed"])
    assert _linear_kinds(model) == _linear_kinds(reference)
    assert _linear_kinds(model)["lm_head"] == "QuantizedLinear"
    assert list(_linear_kinds(model).values()).count("Linear") == 14
    tokens = mx.array([tokenizer.encode("a tiny prompt")])
    np.testing.assert_array_equal(np.array(model(tokens)), np.array(reference(tokens)))
    assert any("mlx_w8a8: 14 layers" in ln for ln in lines)
    # return_config=True: the config comes back, as from mlx-lm's load.
    assert len(loader(str(folders["mixed"]), return_config=True)) == 3


@pytest.mark.parametrize("bits, fmt", [(8, "grouped"), (4, "grouped4")])
def test_loader_converts_a_stock_mlx_lm_folder_as_stored(tmp_path, bits, fmt):
    # What mlx_lm.convert -q writes (--q-bits 8, or the default 4): affine QuantizedLinear
    # everywhere. The server's loader makes each an mlx_w8a8.Linear on the arrays as
    # stored (no int8 copy: the packed uint32 codes, scales and biases themselves) whose
    # logits track stock mlx-lm's W8A16 / W4A16 model (per-token int8 activations).
    from mlx_lm.utils import load

    model, config = _tiny(seed=bits)
    nn.quantize(model, group_size=64, bits=bits)
    config = dict(config, quantization={"group_size": 64, "bits": bits, "mode": "affine"})
    folder = tiny_lm.folder(tmp_path / f"q{bits}", model, config)
    loader = serving.W8A8Loader(load, serving.ServeOptions(), "prog", lambda line: None)
    converted, tokenizer = loader(str(folder))
    stock, _ = load(str(folder))
    kinds = _linear_kinds(converted)
    assert set(kinds.values()) == {"Linear"} and len(kinds) == 15
    stock_layers = dict(stock.named_modules())
    for p, m in converted.named_modules():
        if p in kinds:
            assert isinstance(m, w8.Linear) and m.bits == bits and m.format == fmt, p
            ref = stock_layers[p]
            assert m.weight.dtype == mx.uint32 and m.weight.shape == ref.weight.shape, p
            assert np.array_equal(np.array(m.weight), np.array(ref.weight)), p
    tokens = mx.array([tokenizer.encode("a tiny prompt")])
    got, want = np.array(converted(tokens), np.float64), np.array(stock(tokens), np.float64)
    assert np.isfinite(got).all() and oracle.sqnr_db(want, got) > 20


def test_loader_keeps_saved_activation_groups_and_sets_them_on_request(tmp_path):
    # An mlx_w8a8 checkpoint saved with act_scales="group" is served with them (as
    # mlx_w8a8.load brings them back); --act-groups sets them on a stock 8-bit folder.
    from mlx_lm.utils import load

    model, config = _tiny(seed=3)
    nn.quantize(model, group_size=64, bits=8)
    stock = tiny_lm.folder(tmp_path / "q8", model,
                           dict(config, quantization={"group_size": 64, "bits": 8, "mode": "affine"}))
    ours, cfg = w8.load(stock, act_scales="group")
    w8.save(ours, tmp_path / "ag", cfg, source=stock)
    scales = lambda m: {layer.act_scales for _, layer in m.named_modules()  # noqa: E731
                        if isinstance(layer, w8.Linear)}
    quiet = lambda line: None  # noqa: E731
    served, _ = serving.W8A8Loader(load, serving.ServeOptions(), "prog", quiet)(str(tmp_path / "ag"))
    assert scales(served) == {"group"}
    plain, _ = serving.W8A8Loader(load, serving.ServeOptions(), "prog", quiet)(str(stock))
    assert scales(plain) == {"token"}
    asked, _ = serving.W8A8Loader(load, serving.ServeOptions(act_scales="group"), "prog", quiet)(str(stock))
    assert scales(asked) == {"group"}
    options, rest, _ = serving.split_argv("prog", ["--act-groups", "--model", "x"])
    assert options.act_scales == "group" and rest == ["--model", "x"]


def test_loader_requantizes_an_8bit_folder_per_channel_on_request(tmp_path, capsys, monkeypatch):
    # --per-channel: the stock 8-bit folder's group-wise layers become per-channel int8
    # (the fastest W8A8 kernels) and the log says what the second rounding cost; the
    # model stays close to the group-wise one. With --act-groups it is a usage error.
    from mlx_lm.utils import load

    model, config = _tiny(seed=4)
    nn.quantize(model, group_size=64, bits=8)
    stock = tiny_lm.folder(tmp_path / "q8", model,
                           dict(config, quantization={"group_size": 64, "bits": 8, "mode": "affine"}))
    lines = []
    quiet = lambda line: None  # noqa: E731
    grouped, _ = serving.W8A8Loader(load, serving.ServeOptions(), "prog", quiet)(str(stock))
    served, _ = serving.W8A8Loader(load, serving.ServeOptions(per_channel=True), "prog",
                                   lines.append)(str(stock))
    formats = {layer.format for _, layer in served.named_modules() if isinstance(layer, w8.Linear)}
    assert formats == {"per_channel"}
    assert any("15 group-wise layers requantized to per-channel int8" in ln for ln in lines), lines
    tokens = mx.array([[1, 5, 9, 200, 17, 3]])
    want = np.array(grouped(tokens).astype(mx.float32)).astype(np.float64)
    got = np.array(served(tokens).astype(mx.float32)).astype(np.float64)
    assert 20 < oracle.sqnr_db(want, got) < float("inf")  # close, but requantized
    # Without --per-channel, on CUDA (where the group-wise GEMM is the slower one), the log
    # names the flag; on another backend it says nothing of it.
    for cuda, want in ((False, 0), (True, 1)):
        hints = []
        monkeypatch.setattr(backends, "on_cuda", lambda cuda=cuda: cuda)
        serving.W8A8Loader(load, serving.ServeOptions(), "prog", hints.append)(str(stock))
        hints = [ln for ln in hints if "--per-channel" in ln]
        assert len(hints) == want, hints
        if want:
            assert "15 group-wise 8-bit layers run as stored" in hints[0], hints
    options, rest, _ = serving.split_argv("prog", ["--per-channel", "--model", "x"])
    assert options.per_channel and rest == ["--model", "x"]
    with pytest.raises(SystemExit):
        serving.split_argv("prog", ["--per-channel", "--act-groups"])
    assert "exclude each other" in capsys.readouterr().err


def test_loader_names_per_channel_for_a_4bit_folder_and_requantizes_it(tmp_path, monkeypatch):
    # A 4-bit folder's layers ("grouped4") get the same hint on CUDA, with their memory
    # cost, and --per-channel requantizes them (the log gives the bytes: they double).
    from mlx_lm.utils import load

    model, config = _tiny(seed=5)
    nn.quantize(model, group_size=64, bits=4)
    stock = tiny_lm.folder(tmp_path / "q4", model,
                           dict(config, quantization={"group_size": 64, "bits": 4, "mode": "affine"}))
    hints = []
    monkeypatch.setattr(backends, "on_cuda", lambda: True)
    serving.W8A8Loader(load, serving.ServeOptions(), "prog", hints.append)(str(stock))
    hints = [ln for ln in hints if "--per-channel" in ln]
    assert len(hints) == 1 and "15 group-wise 4-bit layers run as stored" in hints[0], hints
    assert "twice their memory" in hints[0]
    lines = []
    served, _ = serving.W8A8Loader(load, serving.ServeOptions(per_channel=True), "prog",
                                   lines.append)(str(stock))
    formats = {layer.format for _, layer in served.named_modules() if isinstance(layer, w8.Linear)}
    assert formats == {"per_channel"}
    line = next(ln for ln in lines if "requantized to per-channel int8" in ln)
    assert "15 group-wise layers" in line and "their weights" in line, line


def test_loader_refuses_adapters(folders):
    from mlx_lm.utils import load

    loader = serving.W8A8Loader(load, serving.ServeOptions(), "prog", lambda line: None)
    with pytest.raises(ValueError, match=r"\[prog\] adapters .*mlx_lm.fuse"):
        loader(str(folders["w8a8"]), adapter_path="adapters")


def test_a_missing_hook_names_the_mlx_lm_version():
    fake = types.ModuleType("mlx_lm.fake")
    with pytest.raises(RuntimeError, match=rf"mlx-lm {serving.mlx_lm_version()} has no "
                                           r"mlx_lm.fake.load"):
        with serving.patched(fake, serving.ServeOptions(), "prog", print):
            pass
    fake.load = lambda path: None  # a load without mlx-lm's parameters
    with pytest.raises(RuntimeError, match="missing: path_or_hf_repo, adapter_path, return_config"):
        with serving.patched(fake, serving.ServeOptions(), "prog", print):
            pass


def test_patched_restores_the_module_load_and_names_the_tuning_table(tmp_path):
    from mlx_w8a8 import tuning

    fake = types.ModuleType("fake")

    def load(path_or_hf_repo, adapter_path=None, return_config=False):
        return None

    fake.load = load
    table = str(tmp_path / "deploy.json")
    with serving.patched(fake, serving.ServeOptions(tuning_table=table), "prog", print) as loader:
        assert fake.load is loader and loader.load is load
        assert tuning.get_tuner().table_path == table  # read before cache and shipped
    assert fake.load is load


def test_model_pass_prefills_and_decodes_through_every_linear():
    """The server's model pass calls each W8A8 linear at [1, 4] (its prefill) and [1, 1]
    (the decode step on the argmax token), then as mlx-lm's BatchGenerator batches two
    prompts of 4 and 3 tokens: [2, 3] (their padded prefill but the last tokens) and
    [2, 1] (the decode steps; [1, 1] once the shorter budget is spent)."""
    model = tiny_lm.converted()
    linears = [m for _, m in model.named_modules() if isinstance(m, w8.Linear)]
    serving.model_pass(model, "prog")
    for layer in linears:
        assert {key[0][:2] for key in layer._decisions} == {(1, 4), (1, 1), (2, 3), (2, 1)}, layer


def test_a_failing_model_pass_is_logged_and_the_model_still_served():
    lines = []

    class Odd(nn.Module):  # no KV cache of mlx-lm's kind: the pass fails
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 8)

        def __call__(self, x):
            return self.proj(x)

    def load(path_or_hf_repo, adapter_path=None, return_config=False):
        return Odd(), object(), {}

    loader = serving.W8A8Loader(load, serving.ServeOptions(quantize=True, warm_up_tokens=2),
                                "prog", lines.append)
    model, _ = loader("somewhere")
    assert isinstance(model.proj, w8.Linear)
    failed = [ln for ln in lines if "model pass failed" in ln]
    assert len(failed) == 1 and "the first requests compile" in failed[0], lines


def test_a_model_pass_that_fails_still_forgets_its_memos(monkeypatch):
    """Memoised activations and sibling outputs of the pass's inputs are dropped even when
    the pass fails half-way, so the first request cannot take them."""
    from mlx_w8a8 import warmup

    forgot = []
    monkeypatch.setattr(warmup, "forget_memos", lambda: forgot.append(1))

    class Half(nn.Module):  # its prefill runs, the decode step fails
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 8)
            self.calls = 0

        def make_cache(self):  # mlx-lm's make_prompt_cache asks the model first
            return []

        def __call__(self, x, cache=None):
            self.calls += 1
            if self.calls > 1:
                raise RuntimeError("decode step failed")
            return self.proj(mx.zeros((1, x.shape[1], 64)))

    model = Half()
    with pytest.raises(RuntimeError, match="decode step failed"):
        serving.model_pass(model, "prog")
    assert model.calls == 2 and forgot == [1]


def test_provider_loads_at_construction_with_the_server_warm_up_default():
    import argparse

    from mlx_w8a8 import server as w8_server

    class Base:  # the parts of mlx_lm.server.ModelProvider the subclass uses
        def __init__(self, cli_args):
            self.cli_args, self.is_distributed, self.loaded = cli_args, False, 0

        def load_default(self):
            self.loaded += 1

    args = argparse.Namespace(prefill_step_size=2048, prompt_concurrency=8, decode_concurrency=32)
    loader = serving.W8A8Loader(lambda path_or_hf_repo, adapter_path=None, return_config=False: None,
                                serving.ServeOptions(), "prog", print)
    provider = w8_server.provider_class(Base, loader)(args)
    assert provider.loaded == 1
    expected = serving.default_warm_up_tokens(2048, 8, 32)  # 0 on the CPU, 8192 on a GPU
    assert loader.options.warm_up_tokens == expected
    loader.options = serving.ServeOptions(warm_up_tokens=5)  # a given value is kept
    w8_server.provider_class(Base, loader)(args)
    assert loader.options.warm_up_tokens == 5

    class Distributed(Base):
        def __init__(self, cli_args):
            super().__init__(cli_args)
            self.is_distributed = True

    with pytest.raises(ValueError, match=r"distributed serving is not supported"):
        w8_server.provider_class(Distributed, loader)(args)


def test_server_listens_with_its_backlog_and_restores_the_class(monkeypatch, capsys):
    # mlx-lm's server listens through its ThreadingHTTPServer class, whose backlog is
    # Python's 5 (connections dropped or reset in a burst of clients): mlx_w8a8.server
    # sets --backlog (default DEFAULT_BACKLOG) on that class while mlx-lm's main runs and
    # puts the old value back after. A stand-in mlx_lm.server records what main saw.
    import http.server

    from mlx_w8a8 import server as w8_server

    seen = []

    class Provider:  # what server.main checks for
        def load_default(self):
            pass

    def load(path_or_hf_repo, adapter_path=None, return_config=False):
        raise AssertionError("not called: main is a stand-in")

    class Threading(http.server.ThreadingHTTPServer):
        pass

    fake = types.SimpleNamespace(ModelProvider=Provider, load=load, ThreadingHTTPServer=Threading,
                                 __name__="mlx_lm.server",
                                 main=lambda: seen.append(Threading.request_queue_size))
    monkeypatch.setattr(serving, "mlx_lm_module", lambda prog, name: fake)
    assert Threading.request_queue_size == 5
    assert w8_server.main(["--model", "x"]) == 0
    assert w8_server.main(["--backlog", "64", "--model", "x"]) == 0
    assert seen == [serving.DEFAULT_BACKLOG, 64] and Threading.request_queue_size == 5
    with pytest.raises(SystemExit):
        w8_server.main(["--backlog", "0"])
    assert "--backlog must be >= 1" in capsys.readouterr().err
    options, rest, _ = serving.split_argv("prog", ["--backlog", "9"])  # not a generate flag
    assert options.backlog is None and rest == ["--backlog", "9"]


def test_default_warm_up_tokens():
    gpu, cpu = mx.Device(mx.DeviceType.gpu), mx.Device(mx.DeviceType.cpu)
    # mlx-lm's defaults: 8 prompts x 2048-token chunks, capped at the largest M bucket.
    assert serving.default_warm_up_tokens(2048, 8, 32, gpu) == 8192
    assert serving.default_warm_up_tokens(64, 2, 32, gpu) == 128
    # Decode batches above the prefill chunk: the decode batch is the largest M.
    assert serving.default_warm_up_tokens(16, 1, 32, gpu) == 32
    # The CPU's kernels compile nothing: no warm-up.
    assert serving.default_warm_up_tokens(2048, 8, 32, cpu) == 0


def test_split_argv_keeps_mlx_lm_flags_in_order(tmp_path):
    table = tmp_path / "t.json"
    table.write_text("{}")
    options, rest, wants_help = serving.split_argv("prog", [
        "--model", "m", "--quantize", "--port", "1", "--tuning-table", str(table),
        "--warm-up-tokens", "16", "--q-group-size", "32"])
    assert rest == ["--model", "m", "--port", "1"] and not wants_help
    assert options == serving.ServeOptions(quantize=True, group_size=32, tuning_table=str(table),
                                           warm_up_tokens=16)
    with pytest.raises(SystemExit):
        serving.split_argv("prog", ["--warm-up-tokens", "-1"])
    with pytest.raises(SystemExit):
        serving.split_argv("prog", ["--kernel", "no_such_kernel"])
    with pytest.raises(SystemExit):  # a deployment table that is not there
        serving.split_argv("prog", ["--tuning-table", "no/such/table.json"])
    # A shortened flag is mlx-lm's to resolve (its parser accepts abbreviations).
    options, rest, _ = serving.split_argv("prog", ["--q", "--warm", "8"])
    assert rest == ["--q", "--warm", "8"] and options == serving.ServeOptions()
    # the server reads each token's log-probability aside unless told to read as mlx-lm
    assert serving.split_argv("prog", [], server=True)[0].aside_reads is True
    options, rest, _ = serving.split_argv("prog", ["--mlx-lm-reads", "--port", "1"], server=True)
    assert options.aside_reads is False and rest == ["--port", "1"]
    # a server flag: mlx_w8a8.generate leaves it to mlx-lm's parser (which refuses it)
    options, rest, _ = serving.split_argv("prog", ["--mlx-lm-reads"])
    assert rest == ["--mlx-lm-reads"] and options.aside_reads is False


# --- bench/serve_bench.py -----------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://192.0.2.1:8080", "https://127.0.0.1:8080", "127.0.0.1"])
def test_serve_bench_refuses_non_loopback_urls(url, capsys):
    assert serve_bench.main(["--url", url, "--requests", "1"]) == 2
    assert "--url" in capsys.readouterr().err


def test_serve_bench_levels():
    assert serve_bench.parse_levels("1, 8,32") == [1, 8, 32]
    for bad in ("", "0", "a"):
        with pytest.raises(ValueError, match="--concurrency"):
            serve_bench.parse_levels(bad)


def test_serve_compare_names_its_own_levels_flag(tmp_path, capsys):
    """serve_compare's option is --levels (serve_bench's is --concurrency): a bad value
    is refused before any folder is written, and the error names the flag given."""
    import serve_compare

    assert serve_compare.main(["--model", "llama-3-8b", "--folders", str(tmp_path / "f"),
                               "--levels", "8,0"]) == 2
    assert "[bench/serve_compare.py] --levels must be positive" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


def test_serve_compare_runs_every_arm_after_its_warm_up_pass(tmp_path, capsys):
    """bench/serve_compare.py on a tiny config: it writes the bf16 and mlx-lm 8-bit
    folders once (a second run reuses them; the 4-bit one is written because a 4-bit arm
    is asked for), serves each arm in turn on loopback, each after an unmeasured pass of
    its levels, and reports ratios. The W8A8 servers run without their own warm-up (the
    CPU default): a model converted on the main thread
    and served from mlx-lm's generation thread (a float folder with --quantize, an mlx-lm
    8-bit folder) once failed every request there
    ("There is no Stream(cpu, 0) in current thread": conversion left lazy arrays)."""
    import serve_compare

    config = dict(tiny_lm.args_for("llama", hidden=64, inter=128)[1].__dict__)
    config = {k: v for k, v in config.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = tmp_path / "serve.json"
    argv = ["--model", str(tmp_path / "config.json"), "--folders", str(tmp_path / "f"),
            "--arms", "mlx_lm-8bit,w8a8,w8a8-8bit,w8a8-8bit-pc,w4a8", "--levels", "1,2", "--requests", "2",
            "--max-tokens", "3", "--startup", str(STARTUP_S), "--json", str(out)]
    rc = serve_compare.main(argv)
    text = capsys.readouterr().out
    assert rc == 0, text
    report = json.loads(out.read_text())
    assert report["complete"] is True
    assert set(report["arms"]) == {"mlx_lm-8bit", "w8a8", "w8a8-8bit", "w8a8-8bit-pc", "w4a8"}
    assert {p.name for p in (tmp_path / "f").iterdir() if p.is_dir()} == {"bf16", "q8", "q4"}
    for arm in report["arms"].values():
        assert [row["concurrency"] for row in arm["levels"]] == [1, 2]
        assert all(row["ok"] == 2 and row["output_tokens"] == 6 for row in arm["levels"])
    pairs = {(r["arm"], r["against"], r["concurrency"]) for r in report["ratios"]}
    assert pairs == {(a, "mlx_lm-8bit", c) for a in ("w8a8", "w8a8-8bit", "w8a8-8bit-pc", "w4a8")
                     for c in (1, 2)}
    log = (tmp_path / "f" / "server_w8a8-8bit-pc.log").read_text()
    assert "requantized to per-channel int8" in log
    assert all(r["output_tokens_per_s"] > 0 for r in report["ratios"])
    assert "wrote" in text
    # Each arm served the unmeasured warm-up pass (2 levels of 2 requests) before its
    # measured levels: 8 requests in its log, 4 of them with 16 tokens.
    assert text.count("warm-up pass (every level, 16 tokens per request, not measured)") == 5
    assert all(arm["warm_up_s"] > 0 for arm in report["arms"].values())
    posts = lambda arm: (tmp_path / "f" / f"server_{arm}.log").read_text().count(  # noqa: E731
        '"POST /v1/completions HTTP/1.1" 200')
    assert posts("mlx_lm-8bit") == 8
    assert serve_compare.main(argv[:4] + ["--arms", "w8a8", "--levels", "1", "--requests", "1",
                                          "--max-tokens", "2", "--warm-tokens", "0",
                                          "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "reusing" in text and "warm-up pass" not in text
    assert json.loads(out.read_text())["arms"]["w8a8"]["warm_up_s"] is None
    assert posts("w8a8") == 1


def test_serve_compare_keeps_the_arms_it_finished_when_stopped(tmp_path, monkeypatch, capsys):
    """A run stopped while starting its second arm (a time limit, a failed start) leaves
    a JSON report of the first arm, marked incomplete."""
    import serve_compare

    config = dict(tiny_lm.args_for("llama", hidden=64, inter=128)[1].__dict__)
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items()
                                                      if v is not None}))
    real_start = serve_compare.start

    def start(arm, *args, **kwargs):
        if arm == "w8a8-8bit":
            raise KeyboardInterrupt  # what `timeout -s INT` delivers
        return real_start(arm, *args, **kwargs)

    monkeypatch.setattr(serve_compare, "start", start)
    out = tmp_path / "serve.json"
    with pytest.raises(KeyboardInterrupt):
        serve_compare.main(["--model", str(tmp_path / "config.json"), "--folders",
                            str(tmp_path / "f"), "--arms", "w8a8,w8a8-8bit", "--levels", "1",
                            "--requests", "1", "--max-tokens", "2", "--warm-tokens", "0",
                            "--startup", str(STARTUP_S), "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["complete"] is False and list(report["arms"]) == ["w8a8"]
    assert report["arms"]["w8a8"]["levels"][0]["ok"] == 1
    assert not (tmp_path / "serve.json.tmp").exists()


def test_serve_compare_refuses_bad_arguments(tmp_path, capsys):
    import serve_compare

    for extra in (["--arms", "vllm"], ["--levels", "0"], ["--max-tokens", "0"], ["--layers", "0"],
                  ["--warm-tokens", "-1"]):
        assert serve_compare.main(["--folders", str(tmp_path)] + extra) == 2
        assert "error:" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


def test_exit_status_maps_only_this_packages_errors_to_2(capsys):
    """The commands' error mapping: ours end the command with status 2 and the message
    on stderr; mlx-lm's and MLX's errors keep their tracebacks."""
    assert serving.exit_status("prog", lambda: None) == 0

    def ours():
        raise ValueError("[prog] --group-size must be 32, 64 or 128, got 48")

    assert serving.exit_status("prog", ours) == 2
    assert "error: [prog] --group-size must be" in capsys.readouterr().err

    def package():
        raise RuntimeError("[mlx_w8a8.load] no weights in folder")

    assert serving.exit_status("prog", package) == 2

    def foreign():
        raise ValueError("[load_model] Missing parameters")

    with pytest.raises(ValueError, match="Missing parameters"):
        serving.exit_status("prog", foreign)
