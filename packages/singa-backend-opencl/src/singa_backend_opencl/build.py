"""Building OpenCL programs per device at first use, with an on-disk cache of program binaries.

A program is built from source (kernels/common.cl + the family's source) with clBuildProgram the first time a kernel
of its family is needed on a device. The binary the driver returns (CL_PROGRAM_BINARIES) is then stored under

    $SINGA_OPENCL_CACHE, else $XDG_CACHE_HOME/singa/opencl, else ~/.cache/singa/opencl

(singa.kernel_cache) in a file named after the program and a SHA-256 key over the source, the build options, the
device name, the driver version, the platform version and the cache's format: a new driver or a changed kernel gives a
new key, so a stale binary is never looked up. The checksum of each entry is checked before the driver sees the bytes,
then clCreateProgramWithBinary and clBuildProgram must both succeed; anything else deletes the entry and rebuilds from
source. SINGA_OPENCL_CACHE=off disables it.

A source that does not compile raises `OpenCLBuildError`, carrying the program's name, the device and the compiler's
build log.
"""

from __future__ import annotations

from pathlib import Path

from singa.kernel_cache import BinaryCache
from singa_backend_opencl import cl
from singa_backend_opencl.cl import ffi

KERNELS = Path(__file__).resolve().parent / "kernels"
CACHE = BinaryCache("opencl", "SINGA_OPENCL_CACHE", b"SGCLBIN1", ".clbin")  # bump the magic to invalidate entries
# What happened to each build request in this process (tests and `python -m singa info` read it).
stats = CACHE.stats
cache_dir = CACHE.directory
_read_entry = CACHE.read
_discard = CACHE.discard
_write_entry = CACHE.write


class OpenCLBuildError(RuntimeError):
    """An OpenCL C program failed to build; `log` is the compiler's output."""

    def __init__(self, program: str, device: str, log: str, code: int):
        self.program = program
        self.device = device
        self.log = log
        self.code = code
        super().__init__(f"OpenCL program {program!r} failed to build for {device} "
                         f"({cl.ERRORS.get(code, code)}); build log:\n{log.strip() or '(empty)'}")


def read_source(*names: str) -> str:
    return "\n".join((KERNELS / n).read_text() for n in names)


def cache_key(source: str, options: str, device_key: str) -> str:
    return CACHE.key(device_key, options, source)


def cache_path(name: str, source: str, options: str, device_key: str) -> Path | None:
    return CACHE.path(name, device_key, options, source)


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
