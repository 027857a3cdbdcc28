"""The tuner: lookup -> claim -> measure -> record (or abandon), and the chooser.

Lifecycle of one key (device section + op, M bucket, N, K, dtype, weight format,
group size), after the affine-projection tuner:

1. **lookup**: the table layers are searched in order (an in-memory layer of this
   process's own measurements, the user-named table, the cache table, the shipped
   tables); the first layer with a usable entry for (op, N, K, dtype, format, group
   size) wins, and within it the measured M bucket nearest to this M.
2. **claim**: one tuner per key at a time, across threads (an in-process set) and
   processes (a non-blocking file lock per key next to the table). A key that is
   claimed elsewhere is not measured again; the caller keeps the fallback.
3. **measure**: the gate (:mod:`.gate`) then paired timing (:mod:`.timing`) of the
   candidates that passed, and :func:`.timing.select_fastest` (within its margin of the
   fastest, a candidate with a multi-weight form is preferred).
4. **record** the entry (merged into the table file under its lock), or **abandon**
   on any failure: the key is released, remembered as failed for this process and
   the fallback stays. Tuning never raises into inference.

The chooser installed in the registry (:meth:`Tuner.choose`) only reads tables (once
per process, then a per-problem cache); it measures on a miss only when online tuning
is on (:func:`mlx_w8a8.tuning.set_online`, or ``MLX_W8A8_TUNE=1``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import os
import threading
from typing import Any, Callable, Sequence

import attrs
import mlx.core as mx

from ..kernels import registry
from ..kernels.registry import Candidate, Problem
from . import gate, locks, prior, shapes, table, timing

log = logging.getLogger("mlx_w8a8.tuning")

MIN_IMPROVEMENT_BPS = 200.0
ENV_ONLINE = "MLX_W8A8_TUNE"
_CACHE_LIMIT = 4096
# A shape no table holds borrows from measured shapes with N and K within this factor.
BORROW_MAX_RATIO = 2.0
# An entry speaks for M within this many octaves of its bucket (4x): a prefill
# measurement at M = 128 says nothing about decode at M = 1, and vice versa. Beyond
# it the borrowed decision or the prior decides. The M = 1 bucket is apart (an entry
# there speaks only for M = 1, and M = 1 only hears it; shapes.decode_apart): the
# decode check decides it in the model's own host-bound decode loop, where it kept
# mx.quantized_matmul, whose GEMV slows with each row; on an NVIDIA H100 at M = 2 it
# took 1.05-2.3x the W8A8 kernels' time on the weights from 4096 x 4096 (part W of
# bench/results/h100_2026-12-05_f.log), so borrowed for M = 2 it ran batched decode
# through the slowest kernel.
MAX_BUCKET_OCTAVES = 2
# Timed launches cycle through copies of the weight until they hold this many bytes:
# several times the largest last-level cache a GPU of this class has (NVIDIA H200 L2:
# 50 MiB; Apple M-series system-level cache: up to 96 MiB), so each launch reads its
# weight from DRAM as a layer of a model does.
COLD_BYTES = 256 << 20
MAX_WEIGHT_COPIES = 64


def cold_copies(nbytes: int, cold_bytes: int = COLD_BYTES) -> int:
    """How many copies of an ``nbytes`` weight the timed launches cycle through: enough
    to hold ``cold_bytes`` together, at least 1, at most :data:`MAX_WEIGHT_COPIES`."""
    if cold_bytes <= 0 or nbytes <= 0:
        return 1
    return int(min(MAX_WEIGHT_COPIES, max(1, math.ceil(cold_bytes / nbytes))))


@attrs.define
class TuneConfig:
    """Knobs of one measurement.

    Args:
        atol, rtol: the gate's tolerance for ``linear`` (bfloat16 terms).
        min_improvement_bps: how much faster than the reference a challenger must be.
        pairs: alternating rounds (>= 30 for a real run; tests use fewer).
        warmup: untimed launches per candidate.
        chain: launches per timed eval (``None``: chosen from a target sample time).
        max_chain: cap on the chosen chain.
        rotate: activation inputs rotated through (the gate uses the first two).
        prune_ratio: a candidate whose first timed round is more than this many times
            slower than the fastest one's is timed in that round only, not ``pairs``
            (:func:`.timing.paired_measure`); ``None`` times all in every round.
        cold_bytes: the timed launches cycle through copies of the weight in distinct
            memory until they hold at least this many bytes (at most
            :data:`MAX_WEIGHT_COPIES`), so the weight comes from DRAM as it does in a
            model, not from a cache that one repeated weight fits in; 0 times one
            weight.
        seed: seed of the synthetic inputs and weights.
        reference_dtype: ``"float32"`` (default) runs the gate's reference on
            float32-upcast activations, so the truth is not limited by the reference's
            own low-precision accumulation; ``None`` runs it as is (see
            :func:`.gate.run_gate`).
        dependent: ``linear`` problems are timed in dependent chains (each launch's
            activation made from the previous launch's output, :func:`.timing.linear_link`),
            as a model's layers run; ``False`` times independent launches, which MLX's
            CUDA graph may run side by side (that flatters kernels leaving SMs idle).
        keep_choices: a problem measured again keeps the choice the tables already
            record for its M bucket (fresh or stale; this process's measurements, then
            the user, cache and shipped tables) unless another candidate is faster by
            ``min_improvement_bps`` (:func:`.timing.select_fastest`'s ``incumbent``);
            ``False``: the fastest by the usual rule.
    """

    atol: float = gate.ATOL
    rtol: float = gate.RTOL
    min_improvement_bps: float = MIN_IMPROVEMENT_BPS
    pairs: int = timing.PAIRS
    warmup: int = timing.WARMUP
    chain: int | None = None
    max_chain: int = timing.MAX_CHAIN
    rotate: int = 4
    cold_bytes: int = COLD_BYTES
    prune_ratio: float | None = timing.PRUNE_RATIO
    seed: int = 0
    reference_dtype: str | None = "float32"
    dependent: bool = True
    keep_choices: bool = True

    def __attrs_post_init__(self):
        if self.atol < 0 or self.rtol < 0:
            raise ValueError(
                f"[mlx_w8a8.tune] atol and rtol must be >= 0, got atol={self.atol}, rtol={self.rtol}"
            )
        if not 0 <= self.min_improvement_bps < 10000:
            raise ValueError(
                f"[mlx_w8a8.tune] min_improvement_bps must be in [0, 10000), "
                f"got {self.min_improvement_bps}"
            )
        if self.cold_bytes < 0:
            raise ValueError(f"[mlx_w8a8.tune] cold_bytes must be >= 0, got {self.cold_bytes}")
        if self.prune_ratio is not None and not self.prune_ratio >= 1:
            raise ValueError(
                f"[mlx_w8a8.tune] prune_ratio must be >= 1 or None, got {self.prune_ratio}"
            )
        if self.pairs < 1 or self.warmup < 0 or self.rotate < 2:
            raise ValueError(
                f"[mlx_w8a8.tune] need pairs >= 1, warmup >= 0, rotate >= 2; got "
                f"pairs={self.pairs}, warmup={self.warmup}, rotate={self.rotate}"
            )


@attrs.frozen
class Hit:
    """A usable table entry: ``entry`` from layer ``layer`` (file ``path``).

    ``pick``: the candidate to run instead of the entry's choice where that cannot run
    here (the entry's fastest measured candidate that can), else ``None``."""

    entry: dict
    layer: str
    path: str | None
    pick: str | None = None

    @property
    def choice(self) -> str:
        return self.pick if self.pick is not None else self.entry["choice"]


@attrs.frozen
class Outcome:
    """What :meth:`Tuner.tune` did for a problem.

    Args:
        source: ``"table"`` (already measured), ``"measured"``, ``"busy"`` (claimed by
            another tuner) or ``"abandoned"`` (failed; the fallback stays).
        choice: the candidate name to run, or ``None`` to use the fallback.
        entry: the table entry, when there is one.
        detail: why, for busy/abandoned.
    """

    source: str
    choice: str | None
    entry: dict | None = None
    detail: str = ""


@attrs.define
class Claim:
    """A held claim on one key; release with :meth:`Tuner.record` or :meth:`Tuner.abandon`."""

    key: str
    problem: Problem
    lock: Any = None


def problem_key(problem: Problem) -> tuple:
    """``(op, n, k, dtype, weight_format, group_size, act_scales)``: what an entry is
    matched on."""
    return (problem.op, problem.n, problem.k, problem.dtype, problem.weight_format,
            problem.group_size, problem.act_scales)


def _entry_problem_key(entry: dict) -> tuple:
    return (entry["op"], entry["n"], entry["k"], entry["dtype"], entry["weight_format"],
            entry["group_size"], table.act_scales(entry))


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


_tls = threading.local()


class Tuner:
    """Table layers, the tuning lifecycle and the registry chooser.

    Args:
        table_path: the user-named table (read first, written by tuning); ``None``
            reads ``$MLX_W8A8_TUNING_TABLE`` if set.
        use_cache: include the user's cache table (read, and written when no table
            is named).
        use_shipped: include the tables shipped in the package.
        online: measure on a chooser miss (default: ``$MLX_W8A8_TUNE == "1"``).
        config: the :class:`TuneConfig` for online tuning and :meth:`tune`.
    """

    def __init__(
        self,
        table_path: str | None = None,
        use_cache: bool = True,
        use_shipped: bool = True,
        online: bool | None = None,
        config: TuneConfig | None = None,
    ):
        if table_path is None:
            table_path = os.environ.get(table.ENV_TABLE) or None
        self.table_path = os.fspath(table_path) if table_path is not None else None
        self.use_cache = use_cache
        self.use_shipped = use_shipped
        self.online = (os.environ.get(ENV_ONLINE, "") == "1") if online is None else bool(online)
        self.config = config or TuneConfig()
        self._lock = threading.RLock()
        self._memory: dict[tuple, dict] = {}  # measured here, also kept if a write failed
        # Per device (``str(mx.default_device())``): tables are keyed by device, and a
        # process may run on the CPU and a GPU.
        self._index: dict[str, list[tuple[str, str | None, dict]]] = {}
        self._cache: dict[tuple[str, Problem], tuple[str | None, str]] = {}
        self._digest_cache: dict[str, tuple[int, dict[str, str]]] = {}
        self._borrow_logged: set[tuple] = set()
        self._claimed: set[str] = set()
        self._abandoned: set[str] = set()
        self._attempted: set[str] = set()  # keys online tuning already tried
        # (section key, entry key) -> why the entry could not be written (TableError
        # text), for callers that account for what reached the table (``tune``).
        self.record_errors: dict[tuple, str] = {}

    # --- layers ---------------------------------------------------------------------------
    @property
    def key(self) -> dict:
        """The section key of the device calls run on now (``mx.default_device()``)."""
        return table.device_key()

    def layers(self) -> list[tuple[str, str]]:
        """``(layer, path)`` of the table files, in lookup order."""
        out = []
        if self.table_path:
            out.append(("user", self.table_path))
        if self.use_cache:
            cache = table.cache_table_path()
            if not self.table_path or os.path.abspath(cache) != os.path.abspath(self.table_path):
                out.append(("cache", cache))
        if self.use_shipped:
            out.extend(("shipped", p) for p in table.shipped_table_paths())
        return out

    def writable_path(self) -> str:
        """Where measurements are recorded: the named table, else the cache table."""
        return self.table_path or table.cache_table_path()

    def reload(self) -> None:
        """Forget loaded tables, cached choices and online attempts; the next lookup
        reads files again."""
        with self._lock:
            self._index = {}
            self._cache.clear()
            self._attempted.clear()
            self._borrow_logged.clear()
        registry.invalidate()

    def _load_index(self) -> list[tuple[str, str | None, dict]]:
        device = str(mx.default_device())
        with self._lock:
            if device not in self._index:
                index = []
                key = self.key
                for layer, path in self.layers():
                    # A table the user named must exist; the cache table need not yet.
                    doc = table.load(path, missing_ok=layer != "user")
                    if doc is None:
                        continue
                    by_problem: dict[tuple, dict[int, dict]] = {}
                    quiet = layer == "shipped"  # tables for other devices are expected there
                    entries = table.matching_entries(doc, key, path, not quiet)
                    self._report_choices(path, entries)
                    for entry in entries:
                        by_problem.setdefault(_entry_problem_key(entry), {})[entry["m_bucket"]] = entry
                    index.append((layer, path, by_problem))
                self._index[device] = index
            return self._index[device]

    @staticmethod
    def _report_choices(path: str, entries: list[dict]) -> None:
        """Warn once per table file (at the entry's line) about entries whose choice is
        not a registered kernel (they are not used) or cannot run here (their fastest
        measured candidate that can run is used instead, :meth:`_runnable_best`)."""
        bad = []
        for entry in entries:
            candidate = registry.find(entry["op"], entry["choice"])
            if candidate is None:
                bad.append((entry, f"is not a kernel registered for {entry['op']} here (a "
                                   f"misspelt name, or a kernel of another mlx_w8a8): the "
                                   f"entry is not used"))
                continue
            why = registry.unavailable_reason(candidate)
            if why is not None:
                bad.append((entry, f"cannot run here ({why}): the fastest candidate the "
                                   f"entry measured that can run is used instead, if any"))
        if not bad:
            return
        entry, why = bad[0]
        more = f" ({len(bad) - 1} more such entr{'y' if len(bad) == 2 else 'ies'})" if len(bad) > 1 else ""
        table.report_once(
            path, "choice",
            f"[mlx_w8a8.tuning] tuning table {path}: {table.describe_entry(entry)} chooses "
            f"{entry['choice']!r}, which {why}{more}",
            table.entry_line(path, entry),
        )

    # --- lookup ---------------------------------------------------------------------------
    @staticmethod
    def _runnable_best(problem: Problem, entry: dict) -> str | None:
        """The candidate ``entry`` timed (``status`` ok, a median) that can run
        ``problem`` here and would have been chosen among those
        (:func:`.timing.select_fastest` against the entry's reference when that can run,
        else the fastest); ``None`` when it timed none that can."""
        medians = {}
        for name, info in (entry.get("candidates") or {}).items():
            if info.get("status") != "ok" or info.get("median_ns") is None:
                continue
            candidate = registry.find(problem.op, name)
            if candidate is not None and candidate.handles(problem):
                medians[name] = float(info["median_ns"])
        if not medians:
            return None
        reference = entry.get("reference")
        if reference in medians:
            bps = entry.get("min_improvement_bps", MIN_IMPROVEMENT_BPS)
            return timing.select_fastest(medians, reference,
                                         bps if isinstance(bps, (int, float)) else MIN_IMPROVEMENT_BPS)
        return min(medians, key=medians.get)

    def _digests(self, op: str) -> dict[str, str]:
        """``{name: digest}`` of the candidates registered for ``op``, made once per
        registry generation (registering a candidate bumps it): every entry looked at
        for a new shape asks for them."""
        generation = registry.generation
        got = self._digest_cache.get(op)
        if got is None or got[0] != generation:
            got = self._digest_cache[op] = (generation, {
                c.name: c.digest for c in registry.all_candidates() if c.op == op})
        return got[1]

    def _fresh(self, entry: dict, path: str | None) -> bool:
        """Whether every kernel the entry measured that is registered here is unchanged
        (same digest). An entry with no candidates, or a candidate without a digest,
        is stale: nothing says what was measured."""
        measured = entry.get("candidates") or {}
        current = self._digests(entry["op"])
        stale = [
            name for name, info in measured.items()
            if name in current and (
                not isinstance(info, dict) or not info.get("digest")
                or info["digest"] != current[name]
            )
        ]
        if not measured:
            stale.append("(no candidates recorded)")
        if entry["choice"] not in current:
            stale.append(entry["choice"])
        if stale and path is not None:
            table.report_once(
                path, "digest",
                f"[mlx_w8a8.tuning] tuning table {path} has entries measured with other "
                f"versions of kernel(s) {sorted(set(stale))} (or kernels not registered here): "
                f"kept but unused (re-run `python -m mlx_w8a8.tune`)",
            )
        return not stale

    def _layers_for(self, pkey: tuple) -> list[tuple[str, str | None, dict]]:
        """``(layer, path, by_problem)`` in precedence order, this process's own
        measurements first."""
        layers: list[tuple[str, str | None, dict]] = []
        mem = self._memory_index()
        if mem:
            layers.append(("memory", None, mem))
        layers.extend(self._load_index())
        return layers

    def _memory_index(self) -> dict[tuple, dict[int, dict]]:
        """This process's own measurements for this device: ``{problem key: {M bucket:
        entry}}``."""
        mem: dict[tuple, dict[int, dict]] = {}
        with self._lock:
            if self._memory:  # most processes measure nothing: no section key to make
                here = table.section_key(self.key)
                for (section, _), e in self._memory.items():
                    if section == here:
                        mem.setdefault(_entry_problem_key(e), {})[e["m_bucket"]] = e
        return mem

    def _best(self, problem: Problem, found: list[tuple[str, str | None, dict]]) -> Hit | None:
        """Among ``(layer, path, entry)`` pick the entry that can run ``problem`` here
        and whose M bucket is nearest (equally far: the larger; at most
        :data:`MAX_BUCKET_OCTAVES` away); then one whose own choice runs; then matching
        ``has_bias``; then the layer order (memory > user > cache > shipped). An entry
        whose choice cannot run here runs its fastest measured candidate that can
        (:meth:`_runnable_best`, the hit's ``pick``); one with none is passed over."""
        target = math.log2(shapes.bucket(problem.m))
        best, best_rank = None, None
        for order, (layer, path, entry) in enumerate(found):
            if abs(math.log2(entry["m_bucket"]) - target) > MAX_BUCKET_OCTAVES:
                continue  # measured too far from this M to say anything about it
            if not shapes.decode_apart(entry["m_bucket"], problem.m):
                continue  # decode at batch 1 and batched rows speak only for themselves
            choice = registry.find(problem.op, entry["choice"])
            if choice is None:
                continue  # reported when the table was read (_report_choices)
            pick = None
            if not choice.handles(problem):
                pick = self._runnable_best(problem, entry)
                if pick is None:
                    continue
            if not self._fresh(entry, path):
                continue
            rank = (
                abs(math.log2(entry["m_bucket"]) - target),
                -entry["m_bucket"],  # equally far: the larger bucket (shapes.nearest_bucket)
                pick is not None,
                bool(entry.get("has_bias", problem.has_bias)) != problem.has_bias,
                order,
            )
            if best_rank is None or rank < best_rank:
                best, best_rank = Hit(entry, layer, path, pick), rank
        return best

    def lookup(self, problem: Problem) -> Hit | None:
        """The usable entry for ``problem``'s (N, K, dtype, format) across all layers.

        Entries whose chosen kernel cannot run this M here are skipped; among the
        rest the nearest M bucket wins (an exact bucket in the shipped table beats a
        far one in the user's), then an entry measured with the same ``has_bias``
        (bias is a per-element epilogue add: it rarely changes the ranking, so entries
        are shared across it), then the layer precedence memory > user > cache >
        shipped.
        """
        pkey = problem_key(problem)
        found = [
            (layer, path, entry)
            for layer, path, by_problem in self._layers_for(pkey)
            for entry in by_problem.get(pkey, {}).values()
        ]
        return self._best(problem, found)

    def recorded_choice(self, problem: Problem) -> str | None:
        """The choice the tables record for ``problem``'s key at its own M bucket, fresh
        or stale (the first in precedence: this process's measurements, then the user,
        cache and shipped tables), or ``None``: what a re-measurement keeps unless
        another candidate is clearly faster (``TuneConfig.keep_choices``)."""
        pkey, bucket = problem_key(problem), shapes.bucket(problem.m)
        entry = self._memory_index().get(pkey, {}).get(bucket)
        if entry is not None:
            return entry["choice"]
        # The files are read here rather than through the lookup index: the table being
        # written need not exist yet (a first tune), and that is no news to report.
        for _, path in self.layers():
            doc = table.load(path, missing_ok=True)
            if doc is None:
                continue
            for entry in table.matching_entries(doc, self.key, path, False):
                if _entry_problem_key(entry) == pkey and entry["m_bucket"] == bucket:
                    return entry["choice"]
        return None

    def borrow(self, problem: Problem, max_ratio: float = BORROW_MAX_RATIO) -> Hit | None:
        """A decision borrowed from the nearest measured shape, for an (N, K) that no
        table holds: same op, dtype and weight format (and group size for grouped
        and 4-bit weights), N and K each within ``max_ratio`` of this one's, nearest in FLOPs
        (``log(N K)``), then in shape; within that shape, :meth:`lookup`'s rule. An op
        without N (``quantize_activation``, N = 0) borrows by K alone."""
        # The sizes compared: N and K, or K alone where the op has no N.
        def dims(n: int, k: int) -> tuple[int, ...]:
            return (k,) if n == 0 else (n, k)

        want = dims(problem.n, problem.k)
        shapes_seen: dict[tuple[int, int], list] = {}
        for layer, path, by_problem in self._layers_for(problem_key(problem)):
            for key, buckets in by_problem.items():
                op, n, k, dtype, fmt, group, acts = key
                if (op, dtype, fmt, acts) != (problem.op, problem.dtype, problem.weight_format,
                                              problem.act_scales):
                    continue
                if fmt != "per_channel" and group != problem.group_size:  # grouped, grouped4
                    continue
                have = dims(n, k)
                if len(have) != len(want) or 0 in have or any(
                    max(a / b, b / a) > max_ratio for a, b in zip(have, want)
                ):
                    continue
                shapes_seen.setdefault((n, k), []).extend(
                    (layer, path, e) for e in buckets.values()
                )
        here = math.log(math.prod(want))
        order = sorted(
            shapes_seen,
            key=lambda nk: (
                abs(math.log(math.prod(dims(*nk))) - here),
                sum(abs(math.log(a / b)) for a, b in zip(dims(*nk), want)),
                nk,
            ),
        )
        for nk in order:
            hit = self._best(problem, shapes_seen[nk])
            if hit is not None:
                return hit
        return None

    def measured(
        self, problem: Problem, path: str | None = None,
        candidates: Sequence[Candidate] | None = None,
    ) -> dict | None:
        """The entry for ``problem``'s exact M bucket in the table at ``path`` (default:
        the writable one) if it is fresh, covers every candidate in ``candidates``
        (default: all that can run it here) and pruned none within reach of the fastest
        (:func:`.table.pruned_within_reach`); ``None`` when it needs (re)measuring."""
        path = path or self.writable_path()
        doc = table.load(path)
        if doc is None:
            return None
        want = problem_key(problem) + (shapes.bucket(problem.m),)
        found = registry.candidates(problem) if candidates is None else candidates
        here = {c.name for c in found}
        for entry in table.matching_entries(doc, self.key, path):
            if _entry_problem_key(entry) + (entry["m_bucket"],) != want:
                continue
            if (self._fresh(entry, path) and here <= set(entry.get("candidates") or {})
                    and not table.pruned_within_reach(entry)):
                return entry
        return None

    # --- claim / record / abandon ---------------------------------------------------------
    def _claim_key(self, problem: Problem) -> str:
        ident = json.dumps(
            [table.section_key(self.key), problem_key(problem), shapes.bucket(problem.m)],
            default=str,
        )
        return hashlib.sha256(ident.encode()).hexdigest()[:24]

    def claim(self, problem: Problem) -> Claim | None:
        """Claim ``problem``'s key for measuring; ``None`` if another tuner holds it.

        Across threads an in-process set decides; across processes a non-blocking
        claim file in the user cache directory (:func:`.locks.claim_lock`), never
        beside the table. Without ``filelock`` (or a writable folder for the claim
        file) the claim holds within this process only.
        """
        key = self._claim_key(problem)
        with self._lock:
            if key in self._claimed:
                return None
            self._claimed.add(key)
        lock = None
        try:
            lock = locks.claim_lock(key)
            lock.acquire()
        except OSError as error:  # filelock.Timeout is an OSError too
            if locks.filelock is not None and isinstance(error, locks.filelock.Timeout):
                with self._lock:
                    self._claimed.discard(key)
                return None
            lock = None
        return Claim(key, problem, lock)

    def _release(self, claim: Claim) -> None:
        if claim.lock is not None:
            try:
                claim.lock.release()
            except Exception:
                pass
        with self._lock:
            self._claimed.discard(claim.key)

    def record(self, claim: Claim, entry: dict) -> None:
        """Store ``entry`` (in memory, and merged into the writable table), release."""
        try:
            with self._lock:
                self._memory[(table.section_key(self.key), table.entry_key(entry))] = entry
                # Bump registry.generation under the lock decide() checks it under: a
                # decide() that looked up before this entry existed cannot cache its
                # stale miss (its generation differs), and one that cached just before
                # is cleared here. Layers re-decide on their next call.
                registry.invalidate()
                self._cache.clear()
            path = self.writable_path()
            where = (table.section_key(self.key), table.entry_key(entry))
            try:
                table.write_entries(path, self.key, [entry])
                self.record_errors.pop(where, None)
            except table.TableError as error:
                self.record_errors[where] = str(error)
                table.report_once(
                    path, "write",
                    f"[mlx_w8a8.tuning] could not record into {error}; the measurement is "
                    f"kept for this process only",
                )
            with self._lock:
                self._index = {}
        finally:
            self._release(claim)

    def ensure_recorded(self, entries: Sequence[dict], attempts: int = 3) -> dict[str, list[dict]]:
        """Write again those of ``entries`` (this tuner's measurements) that the
        writable table lost: another process replaced the file without them (writers
        with different cache directories do not share the table's lock). Entries whose
        write failed (:attr:`record_errors`) are not retried; entries another tuner
        measured too and wrote later are left to it.

        Returns:
            :func:`.table.account` of ``entries`` after the last attempt, plus
            ``"rewritten"``: the entries that were lost and written again.
        """
        path = self.writable_path()
        section = table.section_key(self.key)
        rewritten: dict[tuple, dict] = {}
        for _ in range(attempts):
            found = table.account(path, self.key, entries)
            retry = [e for e in found["lost"]
                     if (section, table.entry_key(e)) not in self.record_errors]
            if not retry:
                break
            try:
                table.write_entries(path, self.key, retry)
            except table.TableError as error:
                for e in retry:
                    self.record_errors[(section, table.entry_key(e))] = str(error)
                break
            rewritten.update((table.entry_key(e), e) for e in retry)
        found = table.account(path, self.key, entries)
        lost = {table.entry_key(e) for e in found["lost"]}
        found["rewritten"] = [e for k, e in rewritten.items() if k not in lost]
        return found

    def abandon(self, claim: Claim, reason: str) -> None:
        """Give up on ``claim``: release it and keep the fallback for this process."""
        log.warning(
            "[mlx_w8a8.tuning] tuning %s abandoned (%s); keeping %r",
            gate.describe(claim.problem), reason, registry.fallback(claim.problem).name,
        )
        with self._lock:
            self._abandoned.add(claim.key)
        self._release(claim)

    # --- measure --------------------------------------------------------------------------
    def measure(
        self,
        problem: Problem,
        candidates: Sequence[Candidate] | None = None,
        weight: Any = None,
        progress: Callable[[int], None] | None = None,
        device_timeout: float | None = None,
    ) -> dict:
        """Gate and time the candidates of ``problem``; the table entry of the result.

        Args:
            problem: the work; measured at its own M (stored under ``bucket(M)``).
            candidates: who competes (default: every candidate that handles it here).
            weight: the weight to measure on (default: a synthetic one of the same
                shape and format).
            progress: called with 1 after each timing round.
            device_timeout: seconds to wait for another process measuring on this
                device (default :data:`.locks.DEVICE_TIMEOUT_S`; online tuning in
                inference may want 0, then the fallback runs).

        Holds the device lock (:func:`.locks.device_lock`) while it gates and times, so
        no other process measures on this device meanwhile.

        Raises:
            RuntimeError: if the reference candidate cannot run or be timed.
            locks.DeviceBusy: if another process keeps the device past the timeout.
        """
        found = list(candidates) if candidates is not None else registry.candidates(problem)
        reference = registry.fallback(problem)
        if all(c.name != reference.name for c in found):
            found.insert(0, reference)
        with locks.device_lock(timeout=device_timeout):  # one process per device
            return self._measure(problem, found, reference, weight, progress)

    def _measure(self, problem, found, reference, weight, progress) -> dict:
        cfg = self.config
        inputs = gate.operands(problem, variants=cfg.rotate, seed=cfg.seed, weight=weight)
        shared = inputs[0][1] if problem.op != "quantize_activation" else None
        copies = 0
        if shared is not None:
            copies = cold_copies(gate.weight_nbytes(shared), cfg.cold_bytes)
            inputs = gate.cycle_weights(inputs, copies)
        verdicts = gate.run_gate(
            problem, reference, found,
            gate.gate_operands(problem, seed=cfg.seed, weight=shared),
            cfg.atol, cfg.rtol, cfg.reference_dtype,
        )
        passing = [c for c in found if verdicts[c.name].passed]
        link = timing.linear_link if cfg.dependent and problem.op == "linear" else None
        # Every input (each weight copy) runs untimed first: a layer's launches and the
        # arrays its kernel derives from the weight are made on its first call per weight
        # (registry.layer_run), which a timed round would otherwise charge. With many
        # copies that made a candidate with costly derived arrays (the subnormal GEMM's
        # terms) look slow enough in its first round to be pruned.
        result = timing.paired_measure(
            [(c.name, registry.layer_run(c, problem)) for c in passing], inputs, pairs=cfg.pairs,
            warmup=max(cfg.warmup, len(inputs)), chain=cfg.chain, max_chain=cfg.max_chain,
            progress=progress,
            prune_ratio=cfg.prune_ratio, keep=(reference.name,), link=link,
        )
        times = result.timings
        ref_t = times[reference.name]
        if not (ref_t.ok or ref_t.status == "implausible"):
            raise RuntimeError(
                f"reference {reference.name!r} failed while timed: {ref_t.detail}"
            )
        medians = {n: t.median_ns for n, t in times.items() if t.ok}
        if not ref_t.ok:
            # Implausible linked samples (timing.py): the reference is scored by its
            # unlinked launches instead, which can only be as fast as it really is or
            # faster (overlapped), so no challenger wins on the reference's bad samples.
            medians[reference.name] = ref_t.unlinked_ns
        previous = self.recorded_choice(problem) if cfg.keep_choices else None
        choice = timing.select_fastest(
            medians, reference.name, cfg.min_improvement_bps,
            prefer={c.name for c in passing if c.bind_group is not None},
            incumbent=previous,
        )
        info = {}
        for cand in found:
            v = verdicts[cand.name]
            t = times.get(cand.name)
            status = v.status if not v.passed else (t.status if t is not None else "unavailable")
            row = {
                "backend": cand.backend,
                "digest": cand.digest,
                "status": status,
                "gate_error": _finite(v.worst_error),
            }
            if v.sqnr_db is not None:
                row["sqnr_db"] = round(v.sqnr_db, 2) if math.isfinite(v.sqnr_db) else None
            if t is not None and t.ok:
                ratios = result.ratios(reference.name, cand.name)
                row.update(
                    median_ns=round(t.median_ns, 1),
                    p25_ns=round(t.p25_ns, 1),
                    p75_ns=round(t.p75_ns, 1),
                    spread_ns=round(t.spread_ns, 1),
                    ratio_to_reference=round(float(sorted(ratios)[len(ratios) // 2]), 4) if ratios else None,
                )
                if not ref_t.ok:  # the paired ratios rest on the reference's bad samples
                    row["ratio_to_reference"] = round(t.median_ns / medians[reference.name], 4)
                if cand.name in result.pruned:
                    row["rounds"] = 1  # slower than the fastest by > prune_ratio: one round
            elif cand.name == reference.name:  # implausible: scored by its unlinked launches
                row.update(status="ok", median_ns=round(ref_t.unlinked_ns, 1),
                           ratio_to_reference=1.0)
            if t is not None and t.unlinked_ns is not None:
                row["unlinked_ns"] = round(t.unlinked_ns, 1)
            detail = v.detail or (t.detail if t is not None else "")
            if cand.name == reference.name and not ref_t.ok:
                detail += "; the reference is scored by those unlinked launches"
            if detail:
                row["detail"] = detail
            info[cand.name] = row
        worst = max(
            (v.worst_error for v in verdicts.values() if v.passed and v.name != reference.name),
            default=0.0,
        )
        return {
            "op": problem.op,
            "m_bucket": shapes.bucket(problem.m),
            "n": problem.n,
            "k": problem.k,
            "dtype": problem.dtype,
            "weight_format": problem.weight_format,
            "group_size": problem.group_size,
            **({"act_scales": problem.act_scales} if problem.act_scales != "token" else {}),
            "choice": choice,
            "reference": reference.name,
            "m": problem.m,
            "has_bias": problem.has_bias,
            "speedup": round(medians[reference.name] / medians[choice], 4),
            "candidates": info,
            "gate": {
                "atol": cfg.atol, "rtol": cfg.rtol, "worst_error": _finite(worst),
                "reference_dtype": cfg.reference_dtype or "native",
                "exact": registry.exact_name(problem), "min_sqnr_db": gate.MIN_SQNR_DB,
            },
            "min_improvement_bps": cfg.min_improvement_bps,
            "previous_choice": previous,
            "samples": result.rounds,
            "chain": result.chain,
            "chain_link": "dependent" if link is not None else "independent",
            "weight_copies": copies,
            "measured_at": _now(),
        }

    def tune(
        self,
        problem: Problem,
        candidates: Sequence[Candidate] | None = None,
        force: bool = False,
        weight: Any = None,
        progress: Callable[[int], None] | None = None,
        device_timeout: float | None = None,
    ) -> Outcome:
        """Run the lifecycle for ``problem``: never raises for a tuning failure.

        Args:
            force: measure even when the writable table already has a fresh entry.
            device_timeout: seconds to wait for another process measuring on this
                device (``None``: the lock's default); past it the outcome is
                ``"busy"`` and the key can be tried again later.
            (others): as :meth:`measure`.
        """
        if not force:
            entry = self.measured(problem, candidates=candidates)
            if entry is not None:
                return Outcome("table", entry["choice"], entry)
        claim = self.claim(problem)
        if claim is None:
            return Outcome("busy", None, None, "another tuner is measuring this key")
        busy = getattr(_tls, "busy", False)
        _tls.busy = True
        try:
            entry = self.measure(problem, candidates, weight, progress,
                                 device_timeout=device_timeout)
        except locks.DeviceBusy as error:  # not a failure of this key: release it
            self._release(claim)
            return Outcome("busy", None, None, str(error))
        except Exception as error:
            self.abandon(claim, f"{type(error).__name__}: {error}")
            return Outcome("abandoned", None, None, f"{type(error).__name__}: {error}")
        except BaseException:  # Ctrl-C: release the key so this process can measure it later
            self._release(claim)
            raise
        finally:
            _tls.busy = busy
        self.record(claim, entry)
        return Outcome("measured", entry["choice"], entry)

    # --- the chooser ----------------------------------------------------------------------
    def decide(self, problem: Problem) -> tuple[str | None, str]:
        """``(candidate name or None, source)`` for ``problem`` from the tables: an
        entry (``"table"``), a nearby shape's decision (``"borrowed"``), else
        ``(None, "none")``. Cached per problem until the next invalidation."""
        generation = registry.generation
        ckey = (str(mx.default_device()), problem)
        with self._lock:
            if ckey in self._cache:
                return self._cache[ckey]
        hit = self.lookup(problem)
        source = "table"
        if hit is None:
            hit = self.borrow(problem)
            source = "borrowed"
            if hit is not None:
                self._log_borrow(problem, hit)
        decision = (hit.choice, source) if hit is not None else (None, "none")
        with self._lock:
            # A record() or reload() that ran meanwhile bumped the generation: this
            # decision may be stale, so it is returned but not cached.
            if registry.generation == generation:
                if len(self._cache) >= _CACHE_LIMIT:
                    self._cache.clear()
                self._cache[ckey] = decision
        return decision

    def _log_borrow(self, problem: Problem, hit: Hit) -> None:
        key = (problem.op, problem.n, problem.k, problem.dtype, problem.weight_format)
        with self._lock:
            if key in self._borrow_logged:
                return
            self._borrow_logged.add(key)
        e = hit.entry
        log.info(
            "[mlx_w8a8.tuning] no table entry for %s N=%d K=%d %s %s: using the decision "
            "measured for N=%d K=%d (M bucket %d: %s, %s table); `python -m "
            "mlx_w8a8.tune --model ...` would measure this shape",
            problem.op, problem.n, problem.k, problem.dtype, problem.weight_format,
            e["n"], e["k"], e["m_bucket"], e["choice"], hit.layer,
        )

    def choose(self, problem: Problem, candidates: list[Candidate]):
        """The registry hook: ``(candidate, source)`` from a table, a borrowed shape,
        online tuning (if enabled) or the built-in prior; ``None`` for the fallback."""
        if getattr(_tls, "busy", False):
            return None  # a candidate calling ops while being tuned gets the fallback
        try:
            name, source = self.decide(problem)
            if name is None and self.online:
                key = self._claim_key(problem)
                with self._lock:
                    first = key not in self._attempted and key not in self._abandoned
                    self._attempted.add(key)
                if first:  # one attempt per key and process: a busy key is not retried
                    # Inference never waits for another process's measurements.
                    outcome = self.tune(problem, device_timeout=0)
                    name, source = outcome.choice, "measured"
            if name is not None:
                for cand in candidates:
                    if cand.name == name:
                        return cand, source
            picked = prior.choose(self.key["backend"], problem, candidates)
            return (picked, "prior") if picked is not None else None
        except Exception as error:  # tuning never breaks inference
            log.warning("[mlx_w8a8.tuning] chooser failed for %s: %s", gate.describe(problem), error)
            return None
