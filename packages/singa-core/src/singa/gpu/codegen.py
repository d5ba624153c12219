"""Render singa-core's element-wise expression table into OpenCL C (built per device at first use by build.py).

For every (table entry, dtype) it emits two kernels, one work-item per output element:

    sg_ew_<name>_<dtype>_c(n, out, out_off, in, in_off, ...)         every operand contiguous
    sg_ew_<name>_<dtype>_s(n, dims, out, out_off, in, in_off, ...)   any strides (0 = broadcast): `dims` is an sg_dims
                                                                      (singa/gpu/kernels/dtypes.cl) passed by value

Kernels of entries that take parameters (every unary one; binary ones with `params`) take (alpha, beta)
last. The entry's C expression is pasted as it is: its variables `x`, `a`, `b`,
`alpha`, `beta` are locals of the compute type (float for float16 and float32, the integer type for ints, int for
bool), exactly as the CPU backend's codegen declares them. The same file renders the kernels that only move or convert
elements: `cast` between every dtype pair, and `fill`, `copy`, `where` per item size.

This module only makes text; it never touches a device.
"""

from __future__ import annotations

from dataclasses import dataclass

# singa.dtypes codes, kept literal like the CPU backend's codegen
F32, F16, I32, I64, BOOL, F64 = 0, 1, 2, 3, 4, 5


@dataclass(frozen=True)
class CLType:
    suffix: str  # dtype name in kernel names
    storage: str  # OpenCL C type of an element in memory
    compute: str  # type the expression computes in
    macro: str  # SG_LD_<macro> / SG_ST_<macro> of singa/gpu/kernels/dtypes.cl

    def load(self, ptr: str, idx: str) -> str:
        return f"SG_LD_{self.macro}({ptr}, {idx})"

    def store(self, ptr: str, idx: str, value: str) -> str:
        return f"SG_ST_{self.macro}({ptr}, {idx}, {value})"


CLTYPES = {
    F32: CLType("float32", "float", "float", "F32"),
    F16: CLType("float16", "half", "float", "F16"),
    I32: CLType("int32", "int", "int", "I32"),
    I64: CLType("int64", "long", "long", "I64"),
    BOOL: CLType("bool", "uchar", "int", "BOOL"),
    F64: CLType("float64", "double", "double", "F64"),  # only where the device declares float64
}
BITS = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}
ITEMSIZE = {F32: 4, F16: 2, I32: 4, I64: 8, BOOL: 1, F64: 8}


def param_type(dtype: int, fp64: bool) -> str:
    """C type of alpha/beta: float for float data; for integer and bool data, double where the device has it (as on
    the CPU backend), else float."""
    if dtype in (F32, F16):
        return "float"
    return "double" if fp64 or dtype == F64 else "float"


def _result(out: CLType, expr: str) -> tuple[str, str]:
    """(type the op returns, the expression converted to it)."""
    if out.storage == "uchar":
        return "int", f"(int)(({expr}) != 0)"
    if out.storage == "half":
        return "float", f"(float)({expr})"
    return out.storage, f"({out.storage})({expr})"


def _walk(nops: int) -> list[str]:
    """Lines that turn the flat index i into each operand's element index p0.. (offsets start them)."""
    incs = " ".join(f"p{k} += c * d.st[{k}][k];" for k in range(nops))
    return [
        "        long r = i;",
        "        for (int k = (int)d.nd - 1; k >= 0; k--) {",
        "            const long s = d.shape[k], c = r % s;",
        "            r /= s;",
        f"            {incs}",
        "        }",
    ]


def _kernel_pair(symbol: str, out: CLType, ins: list[tuple[str, CLType]], body_expr: str, result: str,
                 params: str | None, raw: bool = False) -> str:
    """The _c and _s kernels computing `body_expr` (over the input names, and alpha/beta when `params` is their C type)
    for every element. `raw`: inputs are stored and loaded as plain item-size bits (copy, where)."""
    args_params = f", const {params} alpha, const {params} beta" if params else ""
    pass_params = ", alpha, beta" if params else ""
    names = [n for n, _ in ins]
    op_args = ", ".join(f"const {(t.storage if raw else t.compute)} {n}" for n, t in ins)
    lines = [f"inline {result} {symbol}_op({op_args}{args_params}) {{ return {body_expr}; }}"]
    ptrs = "".join(f", __global const {t.storage} *{n}_p, const long {n}_o" for n, t in ins)
    head = f"__global {out.storage} *o_p, const long o_o{ptrs}{args_params}"

    def loads(idx):
        return ", ".join((f"{n}_p[{idx(k)}]" if raw else t.load(f"{n}_p", idx(k))) for k, (n, t) in enumerate(ins))

    def store(idx, value):
        return f"o_p[{idx}] = {value}" if raw else out.store("o_p", idx, value)

    call_c = f"{symbol}_op({loads(lambda k: f'{names[k]}_o + i')}{pass_params})"
    lines += [
        f"__kernel void {symbol}_c(const long n, {head}) {{",
        "    const long i = get_global_id(0);",
        f"    if (i < n) {store('o_o + i', call_c)};",
        "}",
    ]
    starts = ", ".join(["p0 = o_o"] + [f"p{k + 1} = {n}_o" for k, n in enumerate(names)])
    call_s = f"{symbol}_op({loads(lambda k: f'p{k + 1}')}{pass_params})"
    lines += [
        f"__kernel void {symbol}_s(const long n, const sg_dims d, {head}) {{",
        "    const long i = get_global_id(0);",
        "    if (i < n) {",
        f"        long {starts};",
        *_walk(len(ins) + 1),
        f"        {store('p0', call_s)};",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def elementwise_source(entry, fp64: bool, dts: tuple | None = None) -> str:
    """Both kernels of `entry` (a singa.expressions.Elementwise) for the dtypes `dts` (default: all it declares)."""
    parts = [f"/* singa.expressions.TABLE[{entry.name!r}]: {entry.expr} */\n"]
    for dt in entry.dtypes if dts is None else dts:
        t = CLTYPES[dt]
        out = CLTYPES[BOOL] if entry.out_bool else t
        names = ["x"] if entry.arity == 1 else ["a", "b"]
        result, body = _result(out, entry.expression(dt))
        params = param_type(dt, fp64) if entry.takes_params else None
        parts.append(_kernel_pair(f"sg_ew_{entry.name}_{t.suffix}", out, [(n, t) for n in names], body, result,
                                  params))
    return "".join(parts)


def cast_source(pairs: tuple | None = None) -> str:
    """cast for (source, destination) dtype pairs (default: all): float -> int truncates, -> bool is != 0, ->
    float16 rounds to nearest even."""
    parts = []
    for s, d in pairs or [(s, d) for s in CLTYPES for d in CLTYPES]:
        st, dt = CLTYPES[s], CLTYPES[d]
        if d == BOOL:
            result, body = "int", "(int)(x != 0)"
        elif d == F16:
            result, body = "float", "(float)x"
        else:
            result, body = dt.storage, f"({dt.storage})x"
        parts.append(_kernel_pair(f"sg_cast_{st.suffix}_{dt.suffix}", dt, [("x", st)], body, result, None))
    return "".join(parts)


def memory_source(op: str, size: int) -> str:
    """copy, where or fill of one item size: bits are moved, never interpreted."""
    bits = BITS[size]
    t = CLType(f"{size * 8}", bits, bits, "")
    if op == "copy":
        return _kernel_pair(f"sg_copy_{size}", t, [("x", t)], "x", bits, None, raw=True)
    if op == "where":  # cond is read raw too: any non-zero byte is true
        return _kernel_pair(f"sg_where_{size}", t, [("c", CLType("bool", "uchar", "uchar", "")), ("a", t), ("b", t)],
                            "(c ? a : b)", bits, None, raw=True)
    if op != "fill":
        raise ValueError(f"unknown memory kernel {op!r}")
    walk = "\n".join(_walk(1))
    return f"""\
__kernel void sg_fill_{size}_c(const long n, __global {bits} *o_p, const long o_o, const {bits} v) {{
    const long i = get_global_id(0);
    if (i < n) o_p[o_o + i] = v;
}}
__kernel void sg_fill_{size}_s(const long n, const sg_dims d, __global {bits} *o_p, const long o_o, const {bits} v) {{
    const long i = get_global_id(0);
    if (i < n) {{
        long p0 = o_o;
{walk}
        o_p[p0] = v;
    }}
}}
"""
