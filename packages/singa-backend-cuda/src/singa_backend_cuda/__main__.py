"""`python -m singa_backend_cuda precompile [--arch 90]`: compile every kernel into the cache ahead of first use.

Programs are otherwise compiled when a model first needs them (about a tenth of a second each); this fills the cache
for the architecture of cuda:0 (or the one given) in parallel, e.g. in a container image or before timing anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor


def precompile(arch: int, workers: int) -> tuple[int, int]:
    """(programs compiled, programs already cached) for sm_<arch>."""
    from singa.gpu import table as gpu
    from singa_backend_cuda import build

    dev = types.SimpleNamespace(fp64=True, int64_atomics=True)  # what the CUDA device tells the shared sources
    names = gpu.program_names()
    before = dict(build.stats)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda n: build.compile_program(n, gpu.source_of(n, dev), arch), names))
    return build.stats["compiled"] - before["compiled"], build.stats["cache_hits"] - before["cache_hits"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m singa_backend_cuda", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("precompile", help="compile every kernel into the cache")
    pre.add_argument("--arch", type=int, default=None, help="e.g. 90 for sm_90 (default: that of cuda:0)")
    pre.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    arch = args.arch
    if arch is None:
        from singa import device

        arch = device.get_device("cuda:0").arch
    t0 = time.perf_counter()
    compiled, cached = precompile(arch, args.workers)
    print(f"sm_{arch}: {compiled} programs compiled, {cached} already cached, in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
