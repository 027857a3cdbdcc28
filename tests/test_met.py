"""``mlx_w8a8.met``: the bounded set of keys met before, behind a layer's and a weight's
"keep from the second call" rule."""

from mlx_w8a8 import met


def test_a_key_is_met_again_from_its_second_call():
    seen = met.Met()
    assert not seen.again(("a", 1)) and ("a", 1) in seen
    assert seen.again(("a", 1)) and len(seen) == 1
    assert not seen.again(("b", 2)) and len(seen) == 2


def test_past_the_limit_the_keys_start_over(monkeypatch):
    monkeypatch.setattr(met, "LIMIT", 2)
    seen = met.Met()
    seen.again(1), seen.again(2)
    assert not seen.again(3)  # the third key starts the set over: 1 and 2 forgotten
    assert len(seen) == 1 and 3 in seen and 1 not in seen
    assert not seen.again(1)  # met again after the start-over: a first meeting once more
