"""Building OpenCL programs per device at first use, with an on-disk cache of program binaries.

A program is built from source (kernels/common.cl + the family's source) with clBuildProgram the first time a kernel
of its family is needed on a device. The binary the driver returns (CL_PROGRAM_BINARIES) is then stored under

    $SINGA_OPENCL_CACHE, else $XDG_CACHE_HOME/singa/opencl, else ~/.cache/singa/opencl

in a file named after the program and a SHA-256 key over the source, the build options, the device name, the driver
version, the platform version and this file's format version: a new driver or a changed kernel gives a new key, so a
stale binary is never looked up. Each file carries the SHA-256 of the binary it holds. Loading checks the checksum
*before* the driver sees the bytes (some drivers abort the process on a malformed binary), then
clCreateProgramWithBinary and clBuildProgram must both succeed; anything else deletes the entry and rebuilds from
source. Writing is atomic (a temporary file renamed over the entry), and a cache that cannot be written only costs
the rebuild next time. SINGA_OPENCL_CACHE=off disables it.

A source that does not compile raises `OpenCLBuildError`, carrying the program's name, the device and the compiler's
build log.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import tempfile
import warnings
from pathlib import Path

from singa_backend_opencl import cl
from singa_backend_opencl.cl import ffi

KERNELS = Path(__file__).resolve().parent / "kernels"
FORMAT = b"SGCLBIN1"  # file magic; bump it to invalidate every cached binary
_HEADER = struct.Struct("<8s32sQ")  # magic, sha256 of the binary, its length

# What happened to each build request in this process (tests and `python -m singa info` read it).
stats = {"cache_hits": 0, "compiled": 0, "rejected": 0, "write_errors": 0}


class OpenCLBuildError(RuntimeError):
    """An OpenCL C program failed to build; `log` is the compiler's output."""

    def __init__(self, program: str, device: str, log: str, code: int):
        self.program = program
        self.device = device
        self.log = log
        self.code = code
        super().__init__(f"OpenCL program {program!r} failed to build for {device} "
                         f"({cl.ERRORS.get(code, code)}); build log:\n{log.strip() or '(empty)'}")


def cache_dir() -> Path | None:
    """Where binaries are kept, or None when caching is off."""
    env = os.environ.get("SINGA_OPENCL_CACHE")
    if env is not None and env.strip().lower() in ("", "0", "off", "none"):
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "singa" / "opencl"


def read_source(*names: str) -> str:
    return "\n".join((KERNELS / n).read_text() for n in names)


def cache_key(source: str, options: str, device_key: str) -> str:
    h = hashlib.sha256()
    for part in (FORMAT.decode(), device_key, options, source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def cache_path(name: str, source: str, options: str, device_key: str) -> Path | None:
    d = cache_dir()
    if d is None:
        return None
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)
    return d / f"{safe}-{cache_key(source, options, device_key)[:40]}.clbin"


def _build_log(program, device_id) -> str:
    size = ffi.new("size_t *")
    if cl.lib.clGetProgramBuildInfo(program, device_id, cl.CL_PROGRAM_BUILD_LOG, 0, ffi.NULL, size):
        return "(no build log available)"
    buf = ffi.new("char[]", size[0] + 1)
    cl.lib.clGetProgramBuildInfo(program, device_id, cl.CL_PROGRAM_BUILD_LOG, size[0], buf, ffi.NULL)
    return ffi.string(buf).decode(errors="replace")


def _binary(program) -> bytes:
    sizes = ffi.new("size_t[1]")
    cl.check(cl.lib.clGetProgramInfo(program, cl.CL_PROGRAM_BINARY_SIZES, ffi.sizeof("size_t"), sizes, ffi.NULL),
             "clGetProgramInfo(CL_PROGRAM_BINARY_SIZES)")
    if sizes[0] == 0:
        return b""
    data = ffi.new("unsigned char[]", sizes[0])
    ptrs = ffi.new("unsigned char *[1]", [data])
    cl.check(cl.lib.clGetProgramInfo(program, cl.CL_PROGRAM_BINARIES, ffi.sizeof(ptrs), ptrs, ffi.NULL),
             "clGetProgramInfo(CL_PROGRAM_BINARIES)")
    return bytes(ffi.buffer(data, sizes[0]))


def _from_source(context, device_id, device_name: str, name: str, source: str, options: str):
    err = ffi.new("cl_int *")
    text = ffi.new("char[]", source.encode())
    program = cl.lib.clCreateProgramWithSource(context, 1, ffi.new("char *[1]", [text]), ffi.NULL, err)
    cl.check(err[0], f"clCreateProgramWithSource({name})")
    code = cl.lib.clBuildProgram(program, 1, ffi.new("cl_device_id[1]", [device_id]), options.encode(), ffi.NULL,
                                 ffi.NULL)
    if code != cl.CL_SUCCESS:
        log = _build_log(program, device_id)
        cl.lib.clReleaseProgram(program)
        raise OpenCLBuildError(name, device_name, log, code)
    stats["compiled"] += 1
    return program


def _from_binary(context, device_id, blob: bytes, options: str):
    """The program, or None when the driver refuses the binary."""
    err = ffi.new("cl_int *")
    status = ffi.new("cl_int[1]")
    ptr = ffi.new("unsigned char *[1]", [ffi.cast("unsigned char *", ffi.from_buffer(blob))])
    program = cl.lib.clCreateProgramWithBinary(context, 1, ffi.new("cl_device_id[1]", [device_id]),
                                               ffi.new("size_t[1]", [len(blob)]), ptr, status, err)
    if err[0] != cl.CL_SUCCESS or status[0] != cl.CL_SUCCESS:
        if program != ffi.NULL:
            cl.lib.clReleaseProgram(program)
        return None
    if cl.lib.clBuildProgram(program, 1, ffi.new("cl_device_id[1]", [device_id]), options.encode(), ffi.NULL,
                             ffi.NULL) != cl.CL_SUCCESS:
        cl.lib.clReleaseProgram(program)
        return None
    return program


def _read_entry(path: Path) -> bytes | None:
    """The binary of a cache file, or None (and the file removed) when it is not exactly what was written."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        return None
    ok = len(raw) >= _HEADER.size
    if ok:
        magic, digest, length = _HEADER.unpack_from(raw)
        blob = raw[_HEADER.size:]
        ok = magic == FORMAT and length == len(blob) and length > 0 and hashlib.sha256(blob).digest() == digest
    if not ok:
        _discard(path)
        return None
    return blob


def _discard(path: Path) -> None:
    stats["rejected"] += 1
    with contextlib.suppress(OSError):
        path.unlink()


_warned_write = False


def _write_entry(path: Path, blob: bytes) -> None:
    global _warned_write
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_HEADER.pack(FORMAT, hashlib.sha256(blob).digest(), len(blob)))
                f.write(blob)
            os.replace(tmp, path)  # atomic: a reader sees the old entry or the whole new one
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        stats["write_errors"] += 1
        if not _warned_write:
            _warned_write = True
            warnings.warn(f"singa opencl: cannot write the kernel cache at {path.parent} ({exc}); programs will be "
                          "rebuilt in every process (set SINGA_OPENCL_CACHE to a writable folder)", RuntimeWarning,
                          stacklevel=4)


def build_program(context, device_id, device_name: str, device_key: str, name: str, source: str, options: str):
    """A built cl_program for one device, from the binary cache when a valid entry exists."""
    path = cache_path(name, source, options, device_key)
    if path is not None:
        blob = _read_entry(path)
        if blob is not None:
            program = _from_binary(context, device_id, blob, options)
            if program is not None:
                stats["cache_hits"] += 1
                return program
            _discard(path)  # the driver refused it: rebuilt and replaced below
    program = _from_source(context, device_id, device_name, name, source, options)
    if path is not None:
        try:
            blob = _binary(program)
        except cl.CLError:
            blob = b""
        if blob:
            _write_entry(path, blob)
    return program


class Program:
    """A built program and its kernels, created on first use."""

    def __init__(self, name: str, handle):
        self.name = name
        self.handle = handle
        self._kernels: dict[str, object] = {}

    def kernel(self, kernel_name: str):
        k = self._kernels.get(kernel_name)
        if k is None:
            err = ffi.new("cl_int *")
            k = cl.lib.clCreateKernel(self.handle, kernel_name.encode(), err)
            if err[0] != cl.CL_SUCCESS:
                raise cl.CLError(err[0], f"clCreateKernel({kernel_name!r}) in program {self.name!r}")
            self._kernels[kernel_name] = k
        return k
