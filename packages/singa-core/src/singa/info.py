"""`python -m singa info`: what is installed, what each backend implements, and what SINGA_DEVICE selects.

Everything here is diagnostic, so nothing may raise: a backend that fails while being asked about itself is reported
with its error next to its name, and the report goes on.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import warnings
from typing import Any

import numpy as np

import singa
from singa import dtypes, plugins, primitives


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _dist_version(dist: str) -> str | None:
    if sys.version_info >= (3, 10):
        from importlib.metadata import PackageNotFoundError, version
    else:  # pragma: no cover
        from importlib_metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def kernel_coverage(device) -> dict[str, Any]:
    """Implemented, composed (singa.composed) and host-fallback primitive names of a device, grouped by
    `primitives.group`."""
    missing = set(device.missing_kernels())
    built = set(device.composed_kernels())
    groups: dict[str, dict[str, list[str]]] = {}
    for name in primitives.names():
        g = groups.setdefault(primitives.group(name), {"implemented": [], "composed": [], "fallback": []})
        g["fallback" if name in missing else "composed" if name in built else "implemented"].append(name)
    total = len(primitives.names())
    return {"total": total, "implemented": total - len(missing) - len(built), "composed": len(built),
            "fallback": len(missing), "groups": groups}


def _backend_report(name: str, backend, origin: str) -> dict[str, Any]:
    from singa import device as device_mod

    rep: dict[str, Any] = {
        "name": name,
        "distribution": getattr(backend, "distribution", "?"),
        "version": getattr(backend, "version", "?"),
        "entry_point": origin,
        "info": {},
        "devices": [],
        "kernels": None,
        "errors": [],
    }
    try:
        rep["info"] = {str(k): str(v) for k, v in dict(backend.info()).items()}
    except Exception as exc:  # noqa: BLE001 - report, never crash
        rep["errors"].append(f"info(): {_error(exc)}")
    try:
        count = int(backend.device_count())
    except Exception as exc:  # noqa: BLE001
        rep["errors"].append(f"device_count(): {_error(exc)}")
        count = 0
    for i in range(count):
        entry: dict[str, Any] = {"name": f"{name}:{i}"}
        try:
            dev = device_mod.get_device(f"{name}:{i}")
            entry["name"] = dev.name
            entry["description"] = dev.description()
            entry["dtypes"] = [dtypes.name(t) for t in sorted(dev.dtypes)]
            # Every device of a backend shares its kernel table; the first one that comes up tells coverage.
            if rep["kernels"] is None:
                rep["kernels"] = kernel_coverage(dev)
        except Exception as exc:  # noqa: BLE001
            entry["error"] = _error(exc)
        rep["devices"].append(entry)
    return rep


def _communicator_report(name: str, obj, origin: str) -> dict[str, Any]:
    rep: dict[str, Any] = {
        "name": name,
        "distribution": getattr(obj, "distribution", None),
        "version": getattr(obj, "version", None),
        "entry_point": origin,
    }
    for key, method in (("status", "status"), ("info", "info")):
        fn = getattr(obj, method, None)
        if callable(fn):
            try:
                value = fn()
                rep[key] = {str(k): str(v) for k, v in dict(value).items()} if key == "info" else value
            except Exception as exc:  # noqa: BLE001 - report, never crash
                rep[key] = f"error: {_error(exc)}" if key == "status" else {"error": _error(exc)}
    return rep


def _default_device() -> dict[str, Any]:
    from singa import device as device_mod

    spec = os.environ.get("SINGA_DEVICE", "").strip()
    rep: dict[str, Any] = {"SINGA_DEVICE": spec or None, "device": None, "error": None}
    try:
        rep["device"] = device_mod.get_default_device().name
    except Exception as exc:  # noqa: BLE001 - a bad SINGA_DEVICE is exactly what info is for
        rep["error"] = str(exc)
    return rep


def _fallback_mode() -> dict[str, Any]:
    from singa import fallback_policy

    rep: dict[str, Any] = {fallback_policy.VARIABLE: os.environ.get(fallback_policy.VARIABLE) or None,
                           "mode": None, "error": None}
    try:
        rep["mode"] = fallback_policy.get_fallback()
    except ValueError as exc:
        rep["error"] = str(exc)
    return rep


def collect() -> dict[str, Any]:
    """The whole report as plain data (what `--json` prints)."""
    # Discovery warns about broken plugins; the report lists them, so the warnings would only repeat it on stderr.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg = plugins.registry()
        backends = [_backend_report(n, b, reg.origins.get(n, "?")) for n, b in sorted(reg.backends.items())]
        default = _default_device()
    communicators = [_communicator_report(name, obj, reg.origins.get(name, "?"))
                     for name, obj in sorted(reg.communicators.items())]
    return {
        "singa_core": {"version": singa.__version__, "path": os.path.dirname(singa.__file__)},
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "numpy": np.__version__,
        "pluggy": _dist_version("pluggy"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "backends": backends,
        "failures": [{"group": f.group, "name": f.name, "entry_point": f.value, "error": f.error, "detail": f.detail}
                     for f in reg.failures],
        "communicators": communicators,
        "disabled": sorted(set(reg.disabled)),
        "fallback": _fallback_mode(),
        "default_device": default,
    }


def _names(names: list[str], width: int = 100, indent: int = 10) -> list[str]:
    """Wrap a list of names into lines no wider than `width`."""
    lines, cur = [], ""
    for n in names:
        piece = n if not cur else (f" {n}" if cur.endswith(":") else f", {n}")
        if cur and indent + len(cur) + len(piece) > width:
            lines.append(cur + ",")
            cur = n
        else:
            cur += piece
    if cur:
        lines.append(cur)
    return [" " * indent + line for line in lines]


def format_text(rep: dict[str, Any], verbose: bool = False) -> str:
    out = []
    add = out.append
    py = rep["python"]
    add(f"singa-core {rep['singa_core']['version']} ({rep['singa_core']['path']})")
    add(f"Python {py['version']} ({py['implementation']}, {py['executable']}), numpy {rep['numpy']}, "
        f"pluggy {rep['pluggy']}")
    add(f"Platform {rep['platform']}")
    add("")
    add(f"Backends ({len(rep['backends'])}):" if rep["backends"] else
        f"Backends: none installed ({plugins.install_hint('cpu')})")
    for b in rep["backends"]:
        add(f"  {b['name']}: {b['distribution']} {b['version']} (entry point {b['entry_point']})")
        for k, v in b["info"].items():
            add(f"    {k}: {v}")
        for e in b["errors"]:
            add(f"    error: {e}")
        if not b["devices"]:
            add("    devices: none")
        for d in b["devices"]:
            if "error" in d:
                add(f"    device {d['name']}: error: {d['error']}")
            else:
                add(f"    device {d['name']}: {d['description']}")
                add(f"      dtypes: {', '.join(d['dtypes'])}")
        k = b["kernels"]
        if k is None:
            add("    kernels: unknown (no device could be created)")
            continue
        built = f", {k['composed']} composed from its other kernels" if k["composed"] else ""
        add(f"    kernels: {k['implemented']}/{k['total']} implemented{built}, {k['fallback']} through the host "
            "fallback")
        width = max(len(g) for g in k["groups"])
        for g, names in k["groups"].items():
            n_impl, n_fb, n_built = len(names["implemented"]), len(names["fallback"]), len(names["composed"])
            line = f"      {g:<{width}}  {n_impl:>3}/{n_impl + n_fb + n_built:<3}"
            if n_built:
                line += f"  composed: {', '.join(names['composed'])}"
            if n_fb:
                line += f"  fallback: {n_fb}"
            add(line)
            if n_fb:
                # A partial group is easier to read by what it has when that is the shorter list.
                if n_impl and (verbose or n_impl <= n_fb):
                    out.extend(_names(["implemented:"] + names["implemented"]))
                    out.extend(_names(["fallback:"] + names["fallback"]))
                else:
                    out.extend(_names(names["fallback"]))
    add("")
    if rep["failures"]:
        add(f"Failed plugins ({len(rep['failures'])}), skipped:")
        for f in rep["failures"]:
            add(f"  {f['name']} ({f['group']}, {f['entry_point']}): {f['error']}")
            if verbose:
                out.extend("      " + line for line in f["detail"].rstrip().splitlines())
    else:
        add("Failed plugins: none")
    if rep["disabled"]:
        add(f"Disabled plugins ({plugins.DISABLE_VARIABLE}): {', '.join(rep['disabled'])}")
    if rep["communicators"]:
        add(f"Communicators ({len(rep['communicators'])}):")
        for c in rep["communicators"]:
            dist = f" {c['distribution']} {c['version']}" if c["distribution"] else ""
            add(f"  {c['name']}:{dist} (entry point {c['entry_point']})")
            if "status" in c:
                add(f"    status: {'usable' if c['status'] is None else c['status']}")
            for k, v in c.get("info", {}).items():
                if k != "status":
                    add(f"    {k}: {v}")
    else:
        add("Communicators: none")
    fb = rep["fallback"]
    if fb["error"] is None:
        how = f"SINGA_FALLBACK={fb['SINGA_FALLBACK']}" if fb["SINGA_FALLBACK"] else "SINGA_FALLBACK unset"
        add(f"Host fallback: {fb['mode']} ({how}; singa.set_fallback changes it)")
    else:
        add(f"Host fallback: error in the setting: {fb['error']}")
    add("")
    d = rep["default_device"]
    how = (f"SINGA_DEVICE={d['SINGA_DEVICE']}" if d["SINGA_DEVICE"]
           else "SINGA_DEVICE unset, so cpu" + ("" if "cpu" in plugins.registry().backends
                                                 else ", or the first device where cpu is not installed"))
    if d["error"] is None:
        add(f"Default device: {d['device']} ({how})")
    else:
        add(f"Default device: unavailable ({how}): {d['error']}")
    return "\n".join(line.rstrip() for line in out)


def main(as_json: bool = False, verbose: bool = False) -> int:
    rep = collect()
    if as_json:
        print(json.dumps(rep, indent=2))
    else:
        print(format_text(rep, verbose=verbose))
    return 0
