"""The keys of calls met once, per layer or weight: how a shape met once keeps nothing.

A server meets most prompt lengths once. ``mlx_w8a8.Linear`` and ``w8a8_linear`` keep
what they prepare for an input (a layer's plan, a bound call) only from the second call
with its key: the first call's work serves that call and is dropped, and only the key is
remembered here. Every object kept at a new shape is one more for Python's cyclic
collector to promote and later scan in a full collection (NVIDIA H200's host, 2026-12-02: the
collector ran about as long as the builds themselves over 32-layer Llama-3-8B prefills at
new lengths on an NVIDIA H200's host); the keys are tuples of ints, dtypes and ids, which
the collector stops tracking, about 150 bytes each.
"""

from __future__ import annotations

# Keys remembered per owner before starting over (a key met again after that keeps what
# it makes one call later).
LIMIT = 1024


class Met:
    """A bounded set of keys met before."""

    __slots__ = ("_keys",)

    def __init__(self):
        self._keys: set = set()

    def __contains__(self, key) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def again(self, key) -> bool:
        """Whether ``key`` was met before; if not, it is remembered now (past
        :data:`LIMIT` keys the set starts over)."""
        keys = self._keys
        if key in keys:
            return True
        if len(keys) >= LIMIT:
            keys.clear()
        keys.add(key)
        return False
