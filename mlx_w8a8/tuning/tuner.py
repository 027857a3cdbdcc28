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
   candidates that passed, and :func:`.timing.select_fastest`.
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
import tempfile
import threading
from typing import Any, Callable, Sequence

import attrs

try:  # a declared dependency; without it claims are per process only
    import filelock
except ImportError:  # pragma: no cover
    filelock = None

from ..kernels import registry
from ..kernels.registry import Candidate, Problem
from . import gate, shapes, table, timing

log = logging.getLogger("mlx_w8a8.tuning")

MIN_IMPROVEMENT_BPS = 200.0
ENV_ONLINE = "MLX_W8A8_TUNE"
_CACHE_LIMIT = 4096


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
        seed: seed of the synthetic inputs and weights.
        reference_dtype: ``"float32"`` (default) runs the gate's reference on
            float32-upcast activations, so the truth is not limited by the reference's
            own low-precision accumulation; ``None`` runs it as is (see
            :func:`.gate.run_gate`).
    """

    atol: float = gate.ATOL
    rtol: float = gate.RTOL
    min_improvement_bps: float = MIN_IMPROVEMENT_BPS
    pairs: int = timing.PAIRS
    warmup: int = timing.WARMUP
    chain: int | None = None
    max_chain: int = timing.MAX_CHAIN
    rotate: int = 4
    seed: int = 0
    reference_dtype: str | None = "float32"

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
        if self.pairs < 1 or self.warmup < 0 or self.rotate < 2:
            raise ValueError(
                f"[mlx_w8a8.tune] need pairs >= 1, warmup >= 0, rotate >= 2; got "
                f"pairs={self.pairs}, warmup={self.warmup}, rotate={self.rotate}"
            )


@attrs.frozen
class Hit:
    """A usable table entry: ``entry`` from layer ``layer`` (file ``path``)."""

    entry: dict
    layer: str
    path: str | None

    @property
    def choice(self) -> str:
        return self.entry["choice"]


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
    """``(op, n, k, dtype, weight_format, group_size)``: what an entry is matched on."""
    return (problem.op, problem.n, problem.k, problem.dtype, problem.weight_format, problem.group_size)


def _entry_problem_key(entry: dict) -> tuple:
    return (entry["op"], entry["n"], entry["k"], entry["dtype"], entry["weight_format"], entry["group_size"])


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
        self._index: list[tuple[str, str | None, dict]] | None = None
        self._cache: dict[Problem, str | None] = {}
        self._claimed: set[str] = set()
        self._abandoned: set[str] = set()
        self._attempted: set[str] = set()  # keys online tuning already tried
        self._key: dict | None = None

    # --- layers ---------------------------------------------------------------------------
    @property
    def key(self) -> dict:
        """This machine's section key (computed once)."""
        if self._key is None:
            self._key = table.device_key()
        return self._key

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
            self._index = None
            self._cache.clear()
            self._attempted.clear()

    def _load_index(self) -> list[tuple[str, str | None, dict]]:
        with self._lock:
            if self._index is None:
                index = []
                for layer, path in self.layers():
                    doc = table.load(path)
                    if doc is None:
                        continue
                    by_problem: dict[tuple, dict[int, dict]] = {}
                    quiet = layer == "shipped"  # tables for other devices are expected there
                    entries = table.matching_entries(doc, self.key, path, not quiet)
                    for entry in entries:
                        by_problem.setdefault(_entry_problem_key(entry), {})[entry["m_bucket"]] = entry
                    index.append((layer, path, by_problem))
                self._index = index
            return self._index

    # --- lookup ---------------------------------------------------------------------------
    def _fresh(self, entry: dict, path: str | None) -> bool:
        """Whether every kernel the entry measured is unchanged here (same digest)."""
        measured = entry.get("candidates") or {}
        current = {c.name: c.digest for c in registry.all_candidates() if c.op == entry["op"]}
        stale = [
            name for name, info in measured.items()
            if name in current and isinstance(info, dict) and info.get("digest", current[name]) != current[name]
        ]
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

    def lookup(self, problem: Problem) -> Hit | None:
        """The usable entry for ``problem``, first layer wins, nearest M bucket within it."""
        pkey = problem_key(problem)
        layers: list[tuple[str, str | None, dict]] = []
        with self._lock:
            mem = {e["m_bucket"]: e for k, e in self._memory.items() if _entry_problem_key(e) == pkey}
        if mem:
            layers.append(("memory", None, {pkey: mem}))
        layers.extend(self._load_index())
        for layer, path, by_problem in layers:
            buckets = {b: e for b, e in by_problem.get(pkey, {}).items() if self._fresh(e, path)}
            if not buckets:
                continue
            best = shapes.nearest_bucket(problem.m, buckets)
            return Hit(buckets[best], layer, path)
        return None

    def measured(
        self, problem: Problem, path: str | None = None,
        candidates: Sequence[Candidate] | None = None,
    ) -> dict | None:
        """The entry for ``problem``'s exact M bucket in the table at ``path`` (default:
        the writable one) if it is fresh and covers every candidate in ``candidates``
        (default: all that can run it here); ``None`` when it needs (re)measuring."""
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
            if self._fresh(entry, path) and here <= set(entry.get("candidates") or {}):
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
        """Claim ``problem``'s key for measuring; ``None`` if another tuner holds it."""
        key = self._claim_key(problem)
        with self._lock:
            if key in self._claimed:
                return None
            self._claimed.add(key)
        lock = None
        folders = () if filelock is None else (self.writable_path() + ".claims",
                                               os.path.join(tempfile.gettempdir(), "mlx_w8a8-claims"))
        for folder in folders:
            try:
                os.makedirs(folder, exist_ok=True)
                lock = filelock.FileLock(os.path.join(folder, key + ".lock"), timeout=0)
                lock.acquire()
                break
            except filelock.Timeout:
                with self._lock:
                    self._claimed.discard(key)
                return None
            except OSError:
                lock = None
                continue
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
                self._memory[table.entry_key(entry)] = entry
                self._cache.clear()
            path = self.writable_path()
            try:
                table.write_entries(path, self.key, [entry])
            except table.TableError as error:
                table.report_once(
                    path, "write",
                    f"[mlx_w8a8.tuning] could not record into {error}; the measurement is "
                    f"kept for this process only",
                )
            with self._lock:
                self._index = None
        finally:
            self._release(claim)

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
    ) -> dict:
        """Gate and time the candidates of ``problem``; the table entry of the result.

        Args:
            problem: the work; measured at its own M (stored under ``bucket(M)``).
            candidates: who competes (default: every candidate that handles it here).
            weight: the weight to measure on (default: a synthetic one of the same
                shape and format).
            progress: called with 1 after each timing round.

        Raises:
            RuntimeError: if the reference candidate cannot run or be timed.
        """
        cfg = self.config
        found = list(candidates) if candidates is not None else registry.candidates(problem)
        reference = registry.fallback(problem)
        if all(c.name != reference.name for c in found):
            found.insert(0, reference)
        inputs = gate.operands(problem, variants=cfg.rotate, seed=cfg.seed, weight=weight)
        verdicts = gate.run_gate(
            problem, reference, found, inputs[:2], cfg.atol, cfg.rtol, cfg.reference_dtype
        )
        passing = [c for c in found if verdicts[c.name].passed]
        result = timing.paired_measure(
            [(c.name, c.run) for c in passing], inputs, pairs=cfg.pairs, warmup=cfg.warmup,
            chain=cfg.chain, max_chain=cfg.max_chain, progress=progress,
        )
        times = result.timings
        if not times[reference.name].ok:
            raise RuntimeError(
                f"reference {reference.name!r} failed while timed: {times[reference.name].detail}"
            )
        medians = {n: t.median_ns for n, t in times.items() if t.ok}
        choice = timing.select_fastest(medians, reference.name, cfg.min_improvement_bps)
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
            if t is not None and t.ok:
                ratios = result.ratios(reference.name, cand.name)
                row.update(
                    median_ns=round(t.median_ns, 1),
                    p25_ns=round(t.p25_ns, 1),
                    p75_ns=round(t.p75_ns, 1),
                    spread_ns=round(t.spread_ns, 1),
                    ratio_to_reference=round(float(sorted(ratios)[len(ratios) // 2]), 4) if ratios else None,
                )
            detail = v.detail or (t.detail if t is not None else "")
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
            "choice": choice,
            "reference": reference.name,
            "m": problem.m,
            "has_bias": problem.has_bias,
            "speedup": round(medians[reference.name] / medians[choice], 4),
            "candidates": info,
            "gate": {
                "atol": cfg.atol, "rtol": cfg.rtol, "worst_error": _finite(worst),
                "reference_dtype": cfg.reference_dtype or "native",
            },
            "min_improvement_bps": cfg.min_improvement_bps,
            "samples": result.rounds,
            "chain": result.chain,
            "measured_at": _now(),
        }

    def tune(
        self,
        problem: Problem,
        candidates: Sequence[Candidate] | None = None,
        force: bool = False,
        weight: Any = None,
        progress: Callable[[int], None] | None = None,
    ) -> Outcome:
        """Run the lifecycle for ``problem``: never raises for a tuning failure.

        Args:
            force: measure even when the writable table already has a fresh entry.
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
            entry = self.measure(problem, candidates, weight, progress)
        except Exception as error:
            self.abandon(claim, f"{type(error).__name__}: {error}")
            return Outcome("abandoned", None, None, f"{type(error).__name__}: {error}")
        finally:
            _tls.busy = busy
        self.record(claim, entry)
        return Outcome("measured", entry["choice"], entry)

    # --- the chooser ----------------------------------------------------------------------
    def decide(self, problem: Problem) -> str | None:
        """The candidate name for ``problem`` from the tables (cached), or ``None``."""
        with self._lock:
            if problem in self._cache:
                return self._cache[problem]
        hit = self.lookup(problem)
        name = hit.choice if hit is not None else None
        with self._lock:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[problem] = name
        return name

    def choose(self, problem: Problem, candidates: list[Candidate]) -> Candidate | None:
        """The registry hook: a table's choice, online tuning if enabled, else ``None``."""
        if getattr(_tls, "busy", False):
            return None  # a candidate calling ops while being tuned gets the fallback
        try:
            name = self.decide(problem)
            if name is None and self.online:
                key = self._claim_key(problem)
                with self._lock:
                    first = key not in self._attempted and key not in self._abandoned
                    self._attempted.add(key)
                if first:  # one attempt per key and process: a busy key is not retried
                    outcome = self.tune(problem)
                    name = outcome.choice
                    with self._lock:
                        if outcome.source == "measured":
                            self._cache.clear()
                        self._cache[problem] = name
            if name is None:
                return None
            for cand in candidates:
                if cand.name == name:
                    return cand
            return None
        except Exception as error:  # tuning never breaks inference
            log.warning("[mlx_w8a8.tuning] chooser failed for %s: %s", gate.describe(problem), error)
            return None
