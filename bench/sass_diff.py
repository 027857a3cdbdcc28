"""Whether the machine code of every CUDA kernel build differs between a git commit and
this tree: the check behind re-deriving a measured table's digests after a shader edit
that must not change what runs (a move of shared code into a header, say).

For each build of ``tests/test_cuda_compile.kernel_builds()``, in this tree and in
``git archive COMMIT`` (each side with its own sources and its own ``wrap``, so each
compiles the translation unit its launchers would hand to MLX), it compiles with ``nvcc``
for sm_90a to a cubin, disassembles it with ``cuobjdump -sass -res-usage`` and reads the
cubin's initialised data sections, then compares the two sides per build and per
function. Normalized away is only what legitimately differs: the kernel's name (a digest
of its text may end it) and the order in which the cubin lists its functions. Registers,
stack, shared memory, constant banks and every instruction with its encoding must match.

Outputs are cached by the digest of everything that decides them (the wrapped text, the
stand-in header, the flags, the tools' versions) in ``$MLX_W8A8_SASS_CACHE`` (default: the
temporary directory), so a rerun compiles only texts it has not seen. ``cuobjdump`` is
taken from ``$CUOBJDUMP``, else PATH, else beside ``nvcc``, else the
``nvidia-cuda-cuobjdump`` wheel's ``nvidia/cu*/bin``.

With ``--added NAME=VALUE`` (a template argument this tree added, at the value that keeps
the old code: ``--added RT=1``) a build of this tree carrying ``NAME=VALUE`` is compared
with the commit's build of the same label without it; this tree's builds at other values
of ``NAME`` have nothing to compare with and are listed as new, not counted as differing.

Usage: ``python bench/sass_diff.py COMMIT [--jobs N] [--only TEXT] [--added NAME=VALUE]``;
prints ``same`` or what differs for each build; exits 1 if any build differs or exists
on one side only.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("MLX_W8A8_SASS_CACHE") or os.path.join(
    tempfile.gettempdir(), "mlx_w8a8_sass_cache")
# The longest ptxas may need for one build; a hang is reported, not waited on forever.
COMPILE_TIMEOUT_S = 600

# Run in each tree: its builds, wrapped by its own test helpers, as JSON.
_LIST = r'''
import json, sys
import test_cuda_compile as t
labels, builds = {}, []
for b in t.kernel_builds():
    label = t._label(b)
    labels[label] = labels.get(label, 0) + 1
    if labels[label] > 1:
        label += f"#{labels[label]}"
    builds.append([label, t.wrap(b)])
print(json.dumps({"utils": t.STAND_IN_UTILS, "arch": t.ARCH, "builds": builds}))
'''


def list_builds(tree: str) -> dict:
    """``{"utils", "arch", "builds": [[label, wrapped text], ...]}`` of ``tree``."""
    path = os.pathsep.join([tree, os.path.join(tree, "tests")])
    run = subprocess.run([sys.executable, "-c", _LIST], cwd=tree, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": path})
    if run.returncode != 0:
        raise SystemExit(f"[sass_diff] listing the builds of {tree} failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout)


def find_cuobjdump(nvcc: str | None) -> str | None:
    """``cuobjdump``: ``$CUOBJDUMP``, PATH, beside ``nvcc``, or the NVIDIA wheel's."""
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if found:
        return found
    if nvcc:
        beside = os.path.join(os.path.dirname(os.path.realpath(nvcc)), "cuobjdump")
        if os.path.exists(beside):
            return beside
    for site in sys.path:
        for path in sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "bin", "cuobjdump"))):
            return path
    return None


def _version(tool: str) -> str:
    return subprocess.run([tool, "--version"], capture_output=True, text=True).stdout


def data_sections(cubin: bytes) -> list[str]:
    """``NAME: hex`` for each initialised data section of an ELF64 cubin (constant banks
    other than the parameters', global initialisers): values the SASS only addresses."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = heads[shstrndx][4]
    out = []
    for name_off, kind, _flags, _addr, offset, size in heads:
        end = cubin.index(b"\0", names_at + name_off)
        name = cubin[names_at + name_off:end].decode()
        if kind == 8 or not size:  # SHT_NOBITS: no bytes in the file
            continue
        if re.match(r"\.nv\.(constant[1-9]|global\.init)", name):
            out.append(f"Data {name}: {cubin[offset:offset + size].hex()}")
    return out


def compile_dump(text: str, side: dict, nvcc: str, cuobjdump: str, versions: str) -> str:
    """The disassembly, resource usage and data sections of ``text`` compiled for
    ``side["arch"]`` against ``side["utils"]``, from the cache when seen before.

    Raises:
        RuntimeError: if ``nvcc`` or ``cuobjdump`` fails (the log's tail included).
    """
    flags = [side["arch"], "-std=c++17", "-cubin"]
    key = hashlib.sha256("\0".join([text, side["utils"], " ".join(flags), versions])
                         .encode()).hexdigest()[:32]
    done = os.path.join(CACHE, key + ".sass")
    if os.path.exists(done):
        with open(done, encoding="utf-8") as f:
            return f.read()
    with tempfile.TemporaryDirectory() as work:
        inc = os.path.join(work, "mlx", "backend", "cuda", "device")
        os.makedirs(inc)
        with open(os.path.join(inc, "utils.cuh"), "w", encoding="utf-8") as f:
            f.write(side["utils"])
        src, cubin = os.path.join(work, "k.cu"), os.path.join(work, "k.cubin")
        with open(src, "w", encoding="utf-8") as f:
            f.write(text)
        run = subprocess.run([nvcc, *flags, "-I", work, "-o", cubin, src], capture_output=True,
                             text=True, timeout=COMPILE_TIMEOUT_S)
        if run.returncode != 0:
            raise RuntimeError(f"nvcc failed:\n{(run.stdout + run.stderr)[-3000:]}")
        dis = subprocess.run([cuobjdump, "-sass", "-res-usage", cubin], capture_output=True,
                             text=True)
        if dis.returncode != 0:
            raise RuntimeError(f"cuobjdump failed:\n{dis.stderr[-3000:]}")
        with open(cubin, "rb") as f:
            dump = dis.stdout + "\n" + "\n".join(data_sections(f.read())) + "\n"
    os.makedirs(CACHE, exist_ok=True)
    tmp = f"{done}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(dump)
    os.replace(tmp, done)
    return dump


_KERNEL = re.compile(r"__global__\s+void\s+(\w+)\s*\(")
_DIGEST = re.compile(r"_[0-9a-f]{12}$")


def normalize(dump: str, text: str) -> dict[str, str]:
    """``{function: its lines}`` of a dump of ``text``'s cubin, the kernel's name (with
    its ``<length>`` prefix where mangled, and a ``_<12 hex digits>`` digest suffix) read
    as ``<kernel>``; the resource usage and data sections are kept under their function's
    or section's name, so the order the cubin lists them in does not count.

    Raises:
        ValueError: if ``text`` declares no ``__global__`` function.
    """
    found = _KERNEL.search(text)
    if not found:
        raise ValueError("[sass_diff] the wrapped text declares no __global__ function")
    base = _DIGEST.sub("", found.group(1))
    name = re.compile(rf"(?:\d+)?{re.escape(base)}(?:_[0-9a-f]{{12}})?")
    blocks: dict[str, list[str]] = {}
    current = "(common)"
    for line in dump.splitlines():
        line = name.sub("<kernel>", line).strip()
        if not line:
            continue
        if line.startswith("Data "):
            blocks.setdefault("(data)", []).append(line)
            continue
        if line.startswith(("Resource usage", "code for ")):
            current = "(common)"
        head = re.match(r"Function\s*:?\s*(\S+?):?$", line)
        if head:
            current = head.group(1)
        blocks.setdefault(current, []).append(line)
    return {k: "\n".join(v) for k, v in blocks.items()}


def differences(old: dict[str, str], new: dict[str, str], context: int = 4) -> list[str]:
    """A short summary of how two :func:`normalize` results differ; empty when equal."""
    out = []
    for fn in sorted(set(old) | set(new)):
        if fn not in new:
            out.append(f"  {fn}: only at the commit")
        elif fn not in old:
            out.append(f"  {fn}: only in this tree")
        elif old[fn] != new[fn]:
            a, b = old[fn].splitlines(), new[fn].splitlines()
            diff = [ln for ln in difflib.unified_diff(a, b, lineterm="", n=0)
                    if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
            out.append(f"  {fn}: {len(a)} -> {len(b)} lines, {len(diff)} differ; first:")
            out += [f"    {ln[:150]}" for ln in diff[:context]]
    return out


def old_label(label: str, added: str) -> str | None:
    """The commit's label for this tree's build ``label`` when the tree added the template
    argument ``added`` (``NAME=VALUE``; "" when none was): the label without it, or
    ``None`` for a build at another value of NAME (new code, nothing to compare)."""
    if not added:
        return label
    name = added.split("=", 1)[0]
    head, _, args = label.rpartition(":")
    kept = [arg for arg in args.split(",") if arg != added]
    if any(arg.split("=", 1)[0] == name for arg in kept):
        return None
    return f"{head}:{','.join(kept)}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("commit", help="the git commit to compare this tree against")
    p.add_argument("--jobs", type=int, default=2, help="compiles at once (default 2)")
    p.add_argument("--only", default="", help="only the builds whose label contains this")
    p.add_argument("--added", default="", metavar="NAME=VALUE",
                   help="a template argument this tree added, at the value of the old code")
    a = p.parse_args(argv)
    if a.added and "=" not in a.added:
        p.error(f"--added takes NAME=VALUE, got {a.added!r}")
    nvcc = shutil.which("nvcc")
    cuobjdump = find_cuobjdump(nvcc)
    if nvcc is None or cuobjdump is None:
        print(f"[sass_diff] needs nvcc and cuobjdump (found {nvcc}, {cuobjdump}); "
              f"cuobjdump ships in the nvidia-cuda-cuobjdump wheel", file=sys.stderr)
        return 2
    versions = _version(nvcc) + _version(cuobjdump)
    with tempfile.TemporaryDirectory() as old_tree:
        subprocess.run(f"git archive {a.commit} mlx_w8a8 tests | tar -x -C {old_tree}",
                       shell=True, cwd=ROOT, check=True)
        sides = {"commit": list_builds(old_tree), "tree": list_builds(ROOT)}
    texts = {side: {lb: t for lb, t in s["builds"] if a.only in lb} for side, s in sides.items()}
    new_code = [lb for lb in texts["tree"] if old_label(lb, a.added) is None]
    texts["tree"] = {old_label(lb, a.added): t for lb, t in texts["tree"].items()
                     if lb not in new_code}
    # One compile per distinct (stand-in header, flags, text): a build the change left
    # alone is the same text on both sides.
    todo = {}
    for side in texts:
        for t in texts[side].values():
            todo.setdefault((sides[side]["utils"], sides[side]["arch"], t), side)
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        done = dict(zip(todo, pool.map(
            lambda k: _safe_dump(k[2], sides[todo[k]], nvcc, cuobjdump, versions), todo)))
    dumps = {(side, t): done[(sides[side]["utils"], sides[side]["arch"], t)]
             for side in texts for t in texts[side].values()}
    labels = list(texts["tree"]) + [lb for lb in texts["commit"] if lb not in texts["tree"]]
    differ = 0
    for label in labels:
        old, new = texts["commit"].get(label), texts["tree"].get(label)
        if old is None or new is None:
            print(f"{label}: only {'in this tree' if old is None else 'at the commit'}")
            differ += 1
            continue
        got = [dumps[("commit", old)], dumps[("tree", new)]]
        if any(isinstance(g, RuntimeError) for g in got):
            print(f"{label}: does not build: " + " / ".join(str(g)[-500:] for g in got
                                                              if isinstance(g, RuntimeError)))
            differ += 1
            continue
        lines = differences(normalize(got[0], old), normalize(got[1], new))
        print(f"{label}: {'same' if not lines else 'differs'}")
        for ln in lines:
            print(ln)
        differ += bool(lines)
    for label in new_code:
        print(f"{label}: new (--added {a.added} at another value), not compared")
    print(f"{len(labels)} builds: {len(labels) - differ} same, {differ} differ"
          + (f"; {len(new_code)} new" if new_code else ""))
    return 1 if differ else 0


def _safe_dump(text: str, side: dict, nvcc: str, cuobjdump: str, versions: str):
    try:
        return compile_dump(text, side, nvcc, cuobjdump, versions)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return RuntimeError(str(e))


if __name__ == "__main__":
    raise SystemExit(main())
