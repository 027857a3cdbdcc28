"""``mlx_w8a8.backends``: the package's one probe of which MLX backend a call runs on."""

import mlx.core as mx
import pytest

from mlx_w8a8 import backends
from mlx_w8a8.tuning import table


def test_the_cpu_is_cpu_whatever_gpu_the_build_has():
    assert backends.name(mx.cpu) == "cpu"
    assert backends.name(mx.Device(mx.cpu)) == "cpu"
    with mx.stream(mx.cpu):  # the stream's device is the default device inside it
        assert backends.name() == "cpu" and not backends.on_cuda()
    assert backends.device(None) == mx.default_device()
    assert backends.device(mx.cpu) == mx.Device(mx.cpu)


@pytest.mark.parametrize("metal,cuda,want", [
    (True, False, "metal"),
    (False, True, "cuda"),
    (False, False, "gpu"),         # a GPU of neither kind
    (RuntimeError, True, "cuda"),  # a build whose metal probe raises
    (False, RuntimeError, "gpu"),  # one whose cuda probe raises (a CPU-only build)
])
def test_a_gpu_is_named_by_the_backend_that_reports_itself(monkeypatch, metal, cuda, want):
    def probe(answer):
        def available():
            if answer is RuntimeError:
                raise RuntimeError("no such backend in this build")
            return answer
        return available

    monkeypatch.setattr(mx.metal, "is_available", probe(metal))
    monkeypatch.setattr(mx.cuda, "is_available", probe(cuda))
    assert backends.name(mx.gpu) == want
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    assert backends.name() == want
    assert backends.on_cuda() == (want == "cuda")


def test_tables_are_keyed_by_it():
    # a table measured on this CPU names the backend the probe gives
    assert table.device_key(mx.cpu)["backend"] == backends.name(mx.cpu) == "cpu"
