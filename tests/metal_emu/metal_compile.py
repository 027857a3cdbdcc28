"""Compile every Metal kernel instantiation the tests use with Apple's Metal compiler.

One command, on a Mac with Xcode for macOS 26 (Metal 4; no GPU needed)::

    python tests/metal_emu/metal_compile.py build/metal-src

1. runs ``tests/test_metal.py`` (the emulated runs, ``-k "not gpu"``) and the emulated
   run of ``python -m mlx_w8a8.check`` in ``tests/test_check.py`` with
   ``METAL_EMU_DUMP=build/metal-src``: the emulator's executor writes the exact
   source MLX generates for every kernel instantiation it runs (``capture_source``: header,
   signature with the address space of every input, body, explicit instantiation), one
   file per MLX kernel name, before it compiles anything itself;
2. compiles each file as MLX compiles a ``metal_kernel`` library (MLX's ``utils.h``
   prepended, fast math off, Metal 4)::

       xcrun -sdk macosx metal -std=metal4.0 -fno-fast-math -I <mlx>/include -c K.metal -o K.air

Exit status 1 when a source fails to compile, none was dumped, or the emulated tests
failed (a failing test stops before its later launches, so the dump may lack kernels;
the sources that were dumped are compiled all the same). ``--no-tests``
compiles what the folder already holds; ``--dry-run`` dumps and prints the commands
without compiling (it runs on any OS: the dump needs only MLX and clang).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DUMP_ENV = "METAL_EMU_DUMP"
# python -m mlx_w8a8.check's run of every Metal candidate, emulated (its shapes add kernels).
CHECK_TEST = "test_check_runs_every_metal_candidate_in_the_emulator"
PREAMBLE = '#include "mlx/backend/metal/kernels/utils.h"  // MLX prepends metal::utils() to every metal_kernel\n'


def mlx_include() -> Path:
    """The headers the MLX wheel ships (``mlx/include``)."""
    import mlx.core as mx

    return Path(mx.__file__).resolve().parent / "include"


def dump(folder: Path) -> int:
    """Run the emulated Metal tests with the dump on; returns pytest's exit status."""
    env = dict(os.environ, **{DUMP_ENV: str(folder)})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    tests = ROOT / "tests"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests / "test_metal.py"),
           str(tests / "test_check.py") + "::" + CHECK_TEST, "-k", "not gpu"]
    print("$", DUMP_ENV + "=" + str(folder), " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, cwd=ROOT).returncode


def compile_command(src: Path, out: Path, include: Path) -> list[str]:
    return ["xcrun", "-sdk", "macosx", "metal", "-std=metal4.0", "-fno-fast-math", "-I", str(include),
            "-c", str(src), "-o", str(out)]


def compile_all(folder: Path, dry_run: bool) -> int:
    """Compile every ``*.metal`` of ``folder``; returns the number of failures."""
    sources = sorted(p for p in folder.glob("*.metal") if not p.name.endswith(".with_preamble.metal"))
    if not sources:
        print(f"no kernel sources in {folder}", file=sys.stderr)
        return 1
    include = mlx_include()
    if not dry_run and shutil.which("xcrun") is None:
        print("xcrun not found: compiling needs Xcode on macOS (use --dry-run elsewhere)", file=sys.stderr)
        return len(sources)
    failures = 0
    for src in sources:
        full = src.with_suffix(".with_preamble.metal")
        full.write_text(PREAMBLE + src.read_text())
        cmd = compile_command(full, src.with_suffix(".air"), include)
        if dry_run:
            print("would run:", " ".join(cmd))
            continue
        proc = subprocess.run(cmd, capture_output=True, text=True)
        status = "ok" if proc.returncode == 0 else "FAIL"
        print(f"  {status:4}  {src.name}")
        if proc.returncode != 0:
            failures += 1
            print(proc.stderr[-4000:])
    print(f"{len(sources)} kernel sources, {failures} failed to compile" + (" (dry run)" if dry_run else ""))
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where the generated sources are written")
    parser.add_argument("--no-tests", action="store_true", help="compile what the folder holds; dump nothing")
    parser.add_argument("--dry-run", action="store_true", help="print the compile commands, run none")
    args = parser.parse_args(argv)
    rc = 0
    if not args.no_tests:
        args.folder.mkdir(parents=True, exist_ok=True)
        rc = dump(args.folder.resolve())
        if rc != 0:
            print(f"the emulated tests exited with status {rc}: the dump may lack the kernels of "
                  f"the launches after a failure (compiling what was dumped)", file=sys.stderr)
    failed = compile_all(args.folder, args.dry_run)
    return 1 if failed or rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
