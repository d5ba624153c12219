"""The process that loads and runs the mutated models of tests/test_fuzz_onnx.py, one per request.

Protocol: one JSON request per stdin line, {"model": path, "as": "path" | "bytes", "feeds": path of an .npz or null};
one JSON answer per stdout line: {"outcome": "ok" | "error", "type", "message", "outside": [paths], "leaked": bool}.
An error is reported with its type; the test decides which types are allowed (singa_onnx's errors). A crash or a hang
shows as a dead or silent worker.

An audit hook records every file this process opens while a request runs; `outside` lists those outside the model's
folder that are not Python modules being imported. `leaked` says whether an output holds the secret values planted
outside the folder. Address space is limited (RLIMIT_AS), so a model asking for a huge tensor fails with MemoryError
instead of taking the machine's memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback

import numpy as np

SANDBOX = os.path.realpath(sys.argv[1])
MODEL_DIR = os.path.join(SANDBOX, "model")
SECRET = np.frombuffer(bytes.fromhex(sys.argv[2]), np.float32)

from singa import device  # noqa: E402
from singa_onnx import prepare  # noqa: E402

DEV = device.get_default_device()


def _limit_memory(extra: int) -> None:
    """Let the process map at most `extra` bytes more than it maps now (what the imports and backends reserved)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, resource.RLIM_INFINITY))
    except (ImportError, ValueError, OSError):  # not on this platform: the test runs without the memory guard
        pass


_limit_memory(int(sys.argv[3]))
_opened: list[str] | None = None
_ALLOWED_ROOTS = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *sys.path) if p})


def _audit(event: str, args: tuple) -> None:
    if event != "open" or _opened is None or not args:
        return
    path = args[0]
    if isinstance(path, int):
        return  # an fd, already open
    with contextlib.suppress(TypeError):
        _opened.append(os.fspath(path) if not isinstance(path, bytes) else os.fsdecode(path))


sys.addaudithook(_audit)


def _outside(paths: list[str]) -> list[str]:
    out = []
    for p in paths:
        real = os.path.realpath(p)
        inside = os.path.commonpath([MODEL_DIR, real]) == MODEL_DIR if os.path.isabs(real) else False
        if inside:
            continue
        if real.endswith((".py", ".pyc", ".so")) and real.startswith(_ALLOWED_ROOTS):
            continue  # a lazily imported module
        out.append(real)
    return out


def _leaked(values) -> bool:
    for v in values:
        if isinstance(v, list):
            if _leaked(v):
                return True
            continue
        arr = np.asarray(v) if not hasattr(v, "to_numpy") else v.to_numpy()
        if arr.dtype == np.float32 and arr.size >= SECRET.size:
            flat = arr.reshape(-1)
            for i in range(flat.size - SECRET.size + 1):
                if np.array_equal(flat[i:i + SECRET.size], SECRET):
                    return True
    return False


def handle(req: dict) -> dict:
    global _opened
    feeds = None
    if req.get("feeds"):
        with np.load(req["feeds"], allow_pickle=False) as z:
            feeds = {k: z[k] for k in z.files}
    model = req["model"]
    if req["as"] == "bytes":
        with open(model, "rb") as f:
            model = f.read()
    _opened = []
    try:
        rep = prepare(model, DEV)
        outs = rep.run(feeds if feeds is not None else [])
        answer = {"outcome": "ok", "leaked": _leaked(outs)}
    except Exception as exc:  # noqa: BLE001 - reported to the test, which judges the type
        answer = {"outcome": "error", "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                  "message": str(exc)[:2000], "traceback": traceback.format_exc()[-4000:], "leaked": False}
    finally:
        opened, _opened = _opened, None
    answer["outside"] = _outside(opened)
    return answer


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        print(json.dumps(handle(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
