"""mlx_w8a8.converters: a registered converter and its checks."""

import mlx.nn as nn
import pytest

import mlx_w8a8 as w8



class Custom(nn.Linear):
    """A float linear subclass converted its own way (through register_converter)."""


def test_a_registered_converter_comes_before_the_built_in_rules(monkeypatch):
    from mlx_w8a8 import converters

    monkeypatch.setattr(converters, "_CONVERTERS", dict(converters._CONVERTERS))  # undone after
    calls = []

    def to_w8a8(layer, group_size, per_channel):
        calls.append((layer.weight.shape, group_size, per_channel))
        out = w8.Linear.from_linear(layer, group_size=group_size, per_channel=per_channel)
        out.kernel = "exact"
        return out

    converters.register_converter(Custom, lambda layer, gs: layer.weight.shape[-1] % (2 * gs) == 0,
                                  to_w8a8)
    model = nn.Module()
    model.a = Custom(64, 16)  # accepted: converted by to_w8a8, not by the nn.Linear rule
    model.b = Custom(32, 16)  # K = 32: the nn.Linear rule converts it, convertible says no
    model.c = Custom(64, 8)  # a skip pattern keeps it as it is
    model.d = nn.Linear(64, 16)  # unregistered: the built-in rule
    w8.quantize(model, group_size=32, per_channel=False, skip={"c": "float"})
    assert calls == [((16, 64), 32, False)]
    assert isinstance(model.a, w8.Linear) and model.a.kernel == "exact"
    assert type(model.b) is Custom and type(model.c) is Custom
    assert isinstance(model.d, w8.Linear) and model.d.kernel is None
    with pytest.raises(ValueError,
                       match=r"\[mlx_w8a8.register_converter\] layer_type must be a class"):
        converters.register_converter("Linear", to_w8a8, to_w8a8)
    with pytest.raises(ValueError, match=r"convert must be callable, got None"):
        converters.register_converter(Custom, to_w8a8, None)
