"""Kernel source files under ``mlx_w8a8/shaders/{metal,cuda}/``, read once and digested.

Kernel bodies live in files (not Python strings) so they can be compiled by tests
outside MLX (``nvcc`` for CUDA, the host C++ compiler for Metal) exactly as shipped.
Both backends use one file format: a header, then ``// @@ body NAME`` sections
(:func:`split`); a CUDA header may start with ``// @@ requires OTHER.cu`` lines
(:data:`REQUIRES`) to put another file's header first.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import io
import re
import sys
import textwrap
import tokenize
from importlib import resources
from typing import Callable, Iterable


@functools.lru_cache(maxsize=None)
def read(backend: str, filename: str) -> str:
    """The text of ``shaders/<backend>/<filename>``.

    Raises:
        ValueError: if the file is not shipped with the package.
    """
    path = resources.files("mlx_w8a8").joinpath("shaders", backend, filename)
    if not path.is_file():
        raise ValueError(f"[mlx_w8a8] no kernel source shaders/{backend}/{filename}")
    return path.read_text(encoding="utf-8")


def digest(*parts: str) -> str:
    """A short, stable digest of ``parts`` (kernel sources and launch parameters)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def code_digest(*functions: Callable, texts: tuple[str, ...] = (), params: str = "") -> str:
    """The digest of one candidate: the code of the Python functions it runs, the
    kernel texts it compiles and its launch parameters.

    Only what the candidate executes is hashed (not whole modules), so editing a
    comment elsewhere in a backend module does not make tuning tables stale, while
    editing a function the candidate calls does. A function's comments, docstrings and
    blank lines are left out (:func:`code_text`): documenting a hazard where it lives
    must not cost a re-measured table.

    Args:
        functions: the candidate's ``run`` and the package functions it calls.
        texts: kernel source texts (e.g. from :func:`read`).
        params: launch parameters and constants, as text.
    """
    return digest(*(_source(f, _source_text(f)) for f in functions), *texts, params)


def closure(entries: Iterable[Callable], modules: Iterable[str]) -> dict[str, str]:
    """The code a candidate runs: ``entries`` and every function, class and module-level
    constant of ``modules`` that they reach, transitively, by name.

    Names are read from each function's source (``ast``: a bare name, or ``mod.attr``
    where ``mod`` is one of ``modules``) and resolved in its module's globals, as
    Triton's ``JITFunction.cache_key`` follows the globals a kernel uses. Objects of
    other modules (MLX, numpy, the registry) are not followed: their versions are keyed
    separately or do not change what a kernel computes. The walk over-approximates (a
    name in a branch not taken still counts), which can only make tables stale sooner.

    Returns:
        ``{"module.qualname": text}``: :func:`code_text` for functions and classes,
        ``repr`` for constants, in a deterministic order.

    Raises:
        ValueError: if a reached constant has no stable ``repr`` (one naming a memory
            address), since a digest built from it would differ between processes.
    """
    modules = frozenset(modules)
    out: dict[str, str] = {}
    stack = [e for e in entries if e is not None]
    while stack:
        obj = inspect.unwrap(stack.pop())
        key = f"{obj.__module__}.{obj.__qualname__}"
        if key in out:
            continue
        out[key], names = _read(obj)
        scope = sys.modules[obj.__module__].__dict__
        for name, attr in names:
            value = scope.get(name, _MISSING)
            if attr is not None and inspect.ismodule(value) and value.__name__ in modules:
                owner, name, value = value.__name__, attr, getattr(value, attr, _MISSING)
            else:
                owner = obj.__module__
            if value is _MISSING or inspect.ismodule(value):
                continue
            if _is_code(value):
                if getattr(value, "__module__", None) in modules:
                    stack.append(value)
            elif owner in modules and not callable(value):
                out.setdefault(f"{owner}.{name}", _constant(value, modules, stack, f"{owner}.{name}"))
    return dict(sorted(out.items()))


def closure_digest(entries: Iterable[Callable], modules: Iterable[str],
                   extensions: tuple[str, ...] = (),
                   load: Callable[[str], Iterable[str]] | None = None, params: str = "") -> str:
    """A candidate's digest, derived from what it runs, never listed by hand: the
    :func:`closure` of ``entries`` within ``modules`` and the kernel files it compiles.

    The files are found, not listed: every string literal of the reached code that is a
    file name ending in one of ``extensions`` (e.g. ``(".cu",)``) names one, and
    ``load(file)`` gives the texts it compiles (the header with what it requires or
    includes, and its bodies), so editing a shared header, a launcher or a constant a
    launcher reads changes the digest, and a comment does not. ``params``: what tells
    apart candidates that run the same code (a ``functools.partial``'s keywords).
    """
    reached = closure(entries, modules)
    parts = [f"{k}\n{v}" for k, v in reached.items()]
    if extensions and load is not None:
        ends = "|".join(re.escape(e) for e in extensions)
        pattern = rf"""["']([\w.-]+(?:{ends}))["']"""
        files = sorted(set(re.findall(pattern, "\n".join(reached.values()))))
        for f in files:
            parts.append(f)
            parts.extend(load(f))
    return digest(*parts, params) if params else digest(*parts)


_MISSING = object()

# What closure reads of each function or class (its code text and the names in it),
# from one read of its source, once per object and process. The candidates' closures
# overlap (every CUDA candidate reaches the launch helpers), and reading and parsing the
# same source again for each was most of what `import mlx_w8a8` cost. Keyed by the object
# itself, so a function put in another's place (a test's monkeypatch) is read afresh.
_READ: dict = {}


def _read(obj) -> tuple[str, list[tuple[str, str | None]]]:
    """``(_source, _names)`` of ``obj`` from one read of its source, remembered for
    ``obj``."""
    got = _READ.get(obj)
    if got is None:
        text = _source_text(obj)
        got = _READ[obj] = (_source(obj, text), _names(obj, text))
    return got


def _source_text(obj) -> str | None:
    """``obj``'s source, dedented; ``None`` where no source ships (a frozen or
    byte-compiled-only install)."""
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return None


def _is_code(value) -> bool:
    return inspect.isfunction(value) or inspect.isclass(value) or hasattr(value, "__wrapped__")


def _constant(value, modules: frozenset, stack: list, where: str) -> str:
    """A stable text of a module-level constant; functions and classes of ``modules``
    inside containers (dispatch tables) are pushed onto ``stack`` and named."""
    if _is_code(value):
        if getattr(value, "__module__", None) in modules:
            stack.append(value)
        return f"<{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}>"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_constant(k, modules, stack, where)}: "
                               f"{_constant(v, modules, stack, where)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, (tuple, list, set, frozenset)):
        items = [_constant(v, modules, stack, where) for v in value]
        if isinstance(value, (set, frozenset)):
            items.sort()
        return f"{type(value).__name__}({', '.join(items)})"
    text = repr(value)
    if re.search(r" at 0x[0-9a-fA-F]+", text):
        raise ValueError(f"[mlx_w8a8.sources] {where} has no stable repr for a kernel "
                         f"digest: {text[:80]}")
    return text


def _names(obj, text: str | None) -> list[tuple[str, str | None]]:
    """``(name, attr)`` for each bare name (``attr`` None) and each ``name.attr`` read in
    ``obj``'s source ``text`` (:func:`_source_text`), sorted; where no source ships (or it
    does not parse on its own), the global names its compiled code reads (attributes
    included, unqualified)."""
    try:
        tree = ast.parse(text) if text is not None else None
    except SyntaxError:
        tree = None
    if tree is None:
        code = getattr(obj, "__code__", None)
        return sorted((n, None) for n in (code.co_names if code else ()))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            found.add((node.value.id, node.attr))
        elif isinstance(node, ast.Name):
            found.add((node.id, None))
    return sorted(found, key=lambda t: (t[0], t[1] or ""))


def _source(function: Callable, text: str | None) -> str:
    """:func:`code_text` of ``function``'s source ``text`` (:func:`_source_text`); its
    compiled code where no source ships, so the digest still follows changes."""
    if text is None:
        code = function.__code__
        return f"{code.co_code.hex()} {code.co_consts!r} {code.co_names!r}"
    return code_text(text)


def code_text(text: str) -> str:
    """Python source ``text`` as written, less its comments, its docstrings (the first
    statement of a module, class or function body when it is a string), trailing spaces
    and blank lines.

    The parts are cut out of the text itself, not re-printed from a syntax tree, so the
    result does not depend on the Python version's ``ast.dump`` or ``ast.unparse``. Text
    that does not parse on its own (a lambda's lines cut out of a larger expression)
    keeps its docstring-like strings; its comments still go where it tokenizes.
    """
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(row: int, col: int, in_bytes: bool) -> int:
        line = lines[row - 1] if row <= len(lines) else ""
        if in_bytes:  # ast columns count UTF-8 bytes, tokenize's count characters
            col = len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))
        return starts[row - 1] + col

    cuts = []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            doc = body[0]
            cuts.append((offset(doc.lineno, doc.col_offset, True),
                         offset(doc.end_lineno, doc.end_col_offset, True)))
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                cuts.append((offset(*token.start, False), offset(*token.end, False)))
    except (tokenize.TokenError, SyntaxError):
        pass
    kept, at = [], 0
    for start, end in sorted(cuts):
        if start >= at:
            kept.append(text[at:start])
            at = end
    kept.append(text[at:])
    return "\n".join(line.rstrip() for line in "".join(kept).splitlines() if line.strip())


_BODY = re.compile(r"^// @@ body (\w+)\s*$", re.MULTILINE)
REQUIRES = re.compile(r"^// @@ requires (\S+)\s*$", re.MULTILINE)


def split(text: str, backend: str = "cuda") -> tuple[str, dict[str, str]]:
    """Split a kernel file into its header and named bodies.

    The header is everything before the first ``// @@ body NAME`` line; each such line
    starts the body ``NAME``, which runs to the next marker or the end of the file.

    Args:
        text: the file's text.
        backend: ``"cuda"`` or ``"metal"``, named in the error message.

    Returns:
        ``(header, {name: body})``.

    Raises:
        ValueError: if the file has no body marker.
    """
    marks = list(_BODY.finditer(text))
    if not marks:
        raise ValueError(f"[mlx_w8a8.{backend}] kernel file has no '// @@ body NAME' section")
    bodies = {}
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        bodies[mark.group(1)] = text[mark.end():end].strip() + "\n"
    return text[: marks[0].start()], bodies


def strip_comments(code: str) -> str:
    """Drop ``//`` comments and blank lines (the kernels have no string literals except
    inline assembly, whose lines are kept whole).

    MLX hashes the full kernel source on every launch to find the compiled module, so
    shorter text is cheaper per launch; the files keep their comments.
    """
    out = []
    for line in code.splitlines():
        if '"' not in line:
            line = line.split("//", 1)[0]
        line = line.rstrip()
        if line.strip():
            out.append(line)
    return "\n".join(out) + "\n"
