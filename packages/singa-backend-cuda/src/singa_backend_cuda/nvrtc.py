"""cffi (ABI mode) bindings of NVRTC, CUDA's run-time compiler, from the nvidia-cuda-nvrtc wheel.

Loaded on first use (`get()`), never at import: a machine without the wheel imports the backend fine and only a
kernel build says what to install. NVRTC needs no GPU, so kernels can be compiled (and tested) anywhere.
"""

from __future__ import annotations

from cffi import FFI

from singa_backend_cuda import libs

ffi = FFI()
ffi.cdef("""
typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;
const char *nvrtcGetErrorString(nvrtcResult result);
nvrtcResult nvrtcVersion(int *major, int *minor);
nvrtcResult nvrtcGetNumSupportedArchs(int *num);
nvrtcResult nvrtcGetSupportedArchs(int *archs);
nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int numHeaders,
                               const char * const *headers, const char * const *includeNames);
nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog);
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char * const *options);
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *size);
nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin);
nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *size);
nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx);
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *size);
nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log);
""")

SONAME = "libnvrtc.so.13"
_lib = None


class NvrtcError(RuntimeError):
    """NVRTC failed to compile a program; `log` is the compiler's output."""

    def __init__(self, program: str, arch: str, log: str, code: str):
        self.program = program
        self.arch = arch
        self.log = log
        super().__init__(f"CUDA program {program!r} failed to compile for {arch} ({code}); NVRTC log:\n"
                         f"{log.strip() or '(empty)'}")


def get():
    """The NVRTC library (loaded on first use); raises libs.MissingLibrary naming the wheel when absent."""
    global _lib
    if _lib is None:
        _lib, _ = libs.load(SONAME, ffi)
    return _lib


def version() -> tuple[int, int]:
    lib = get()
    a, b = ffi.new("int *"), ffi.new("int *")
    lib.nvrtcVersion(a, b)
    return a[0], b[0]


def supported_archs() -> list[int]:
    """The compute capabilities (as 75, 80, 90...) this NVRTC can compile for."""
    lib = get()
    n = ffi.new("int *")
    lib.nvrtcGetNumSupportedArchs(n)
    out = ffi.new("int[]", n[0])
    lib.nvrtcGetSupportedArchs(out)
    return list(out)


def _text(fn_size, fn_get, prog) -> bytes:
    size = ffi.new("size_t *")
    if fn_size(prog, size) != 0 or size[0] == 0:
        return b""
    buf = ffi.new("char[]", size[0])
    fn_get(prog, buf)
    return ffi.buffer(buf, size[0])[:]


def compile_program(name: str, source: str, arch: int, options: list[str]) -> tuple[bytes, str]:
    """(the cubin for sm_<arch>, the compiler log) of `source`; raises NvrtcError with the log on failure."""
    lib = get()
    prog = ffi.new("nvrtcProgram *")
    code = lib.nvrtcCreateProgram(prog, source.encode(), name.encode(), 0, ffi.NULL, ffi.NULL)
    if code != 0:
        raise NvrtcError(name, f"sm_{arch}", "", ffi.string(lib.nvrtcGetErrorString(code)).decode())
    try:
        opts = [ffi.new("char[]", o.encode()) for o in [f"--gpu-architecture=sm_{arch}", *options]]
        code = lib.nvrtcCompileProgram(prog[0], len(opts), ffi.new("char *[]", opts))
        log = _text(lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog, prog[0]).rstrip(b"\0").decode(
            errors="replace")
        if code != 0:
            raise NvrtcError(name, f"sm_{arch}", log, ffi.string(lib.nvrtcGetErrorString(code)).decode())
        return _text(lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN, prog[0]), log
    finally:
        lib.nvrtcDestroyProgram(prog)
