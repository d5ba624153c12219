"""Plugin discovery: entry points -> pluggy -> a registry of backends, with failures recorded, never raised."""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from dataclasses import dataclass, field

import pluggy

from singa import hookspecs

if sys.version_info >= (3, 10):
    from importlib.metadata import entry_points
else:  # pragma: no cover
    from importlib_metadata import entry_points

GROUPS = {"backends": "singa.backends", "communicators": "singa.communicators"}

# Where users are told to look when they ask for a backend that is not installed: the distribution on PyPI, which is
# also the folder under packages/ in a checkout of this repository.
KNOWN_DISTRIBUTIONS = {
    "cpu": "singa-backend-cpu",
    "cuda": "singa-backend-cuda",
    "opencl": "singa-backend-opencl",
    "nccl": "singa-comm-nccl",
}
DISABLE_VARIABLE = "SINGA_DISABLE_PLUGINS"


def install_hint(name: str) -> str:
    """How to get the plugin called `name`: both pip forms for SINGA's own packages, the registration rule otherwise."""
    dist = KNOWN_DISTRIBUTIONS.get(name)
    if dist is not None:
        return (f"install it with `pip install {dist}`, or from a checkout of the SINGA repository with "
                f"`pip install ./packages/{dist}`")
    return (f"SINGA's own backends are {', '.join(sorted(n for n in KNOWN_DISTRIBUTIONS if n != 'nccl'))}; "
            "a third-party backend registers itself by declaring an entry point in the `singa.backends` group of "
            "its package's metadata (see the plugin guide), and installing that package makes its name available")


class PluginWarning(RuntimeWarning):
    """A plugin failed to load and was skipped."""


@dataclass
class Failure:
    group: str
    name: str
    value: str
    error: str
    detail: str


@dataclass
class Registry:
    manager: pluggy.PluginManager
    backends: dict = field(default_factory=dict)  # name -> Backend
    communicators: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    origins: dict = field(default_factory=dict)  # name -> entry point value
    disabled: list = field(default_factory=list)  # names skipped because SINGA_DISABLE_PLUGINS lists them


_registry: Registry | None = None


def registry() -> Registry:
    """The plugin registry, built on first use (not at `import singa`, so a broken plugin costs nothing until asked)."""
    global _registry
    if _registry is None:
        _registry = _discover()
    return _registry


def reset() -> None:
    """Forget what was discovered (tests install plugins at run time)."""
    global _registry
    _registry = None


def _fail(reg: Registry, group: str, name: str, value: str, exc: BaseException) -> None:
    f = Failure(group, name, value, f"{type(exc).__name__}: {exc}", traceback.format_exc())
    reg.failures.append(f)
    warnings.warn(f"singa: plugin {name!r} ({value}) in group {group} failed and was skipped: {f.error}",
                  PluginWarning, stacklevel=3)


def disabled_names() -> set[str]:
    """The names in SINGA_DISABLE_PLUGINS, lower-cased."""
    return {s.strip().lower() for s in os.environ.get(DISABLE_VARIABLE, "").split(",") if s.strip()}


def _ep_names(ep) -> set[str]:
    """Every name that may disable an entry point before it is loaded: its own name, its module, its distribution."""
    names = {ep.name, ep.value.split(":")[0]}
    dist = getattr(ep, "dist", None)
    if dist is not None and dist.metadata is not None and dist.metadata["Name"]:
        names.add(dist.metadata["Name"])
    return {n.lower() for n in names}


def _discover() -> Registry:
    pm = pluggy.PluginManager("singa")
    pm.add_hookspecs(hookspecs)
    reg = Registry(pm)
    disabled = disabled_names()
    for kind, group in GROUPS.items():
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            if _ep_names(ep) & disabled:
                reg.disabled.append(ep.name)
                continue
            try:
                module = ep.load()
                pm.register(module, name=f"{group}:{ep.name}")
                hook = "singa_backend" if kind == "backends" else "singa_communicator"
                impls = [i for i in getattr(pm.hook, hook).get_hookimpls() if i.plugin is module]
                if not impls:
                    raise TypeError(f"entry point {ep.value} implements no {hook} hook")
                obj = impls[0].function()
                if kind == "backends":
                    _check_backend(obj, ep.value)
            except Exception as exc:  # noqa: BLE001 - a broken plugin must never break singa
                _fail(reg, group, ep.name, ep.value, exc)
                continue
            table = reg.backends if kind == "backends" else reg.communicators
            # the name `python -m singa info` shows is the object's own, which need not be the entry point's
            if obj.name.lower() in disabled:
                reg.disabled.append(obj.name)
                pm.unregister(module)
                continue
            if obj.name in table:
                _fail(reg, group, ep.name, ep.value,
                      RuntimeError(f"name {obj.name!r} already provided by {reg.origins[obj.name]}"))
                continue
            table[obj.name] = obj
            reg.origins[obj.name] = ep.value
    return reg


def _check_backend(obj, origin: str) -> None:
    from singa.backend import Backend

    if not isinstance(obj, Backend):
        raise TypeError(f"{origin}: singa_backend() returned {type(obj).__name__}, not a singa.backend.Backend")


def get_backend(name: str):
    """The installed backend called `name`; a RuntimeError that says what to do when there is none."""
    reg = registry()
    try:
        return reg.backends[name]
    except KeyError:
        pass
    for f in reg.failures:
        if f.name == name:
            raise RuntimeError(f"backend {name!r} is installed but failed to load: {f.error}. "
                               "Run `python -m singa info` for details.")
    if name in reg.disabled:
        raise RuntimeError(f"backend {name!r} is installed but disabled by "
                           f"{DISABLE_VARIABLE}={os.environ.get(DISABLE_VARIABLE, '')}")
    have = ", ".join(sorted(reg.backends)) or "none"
    raise RuntimeError(f"no SINGA backend named {name!r} is installed (installed backends: {have}); "
                       f"{install_hint(name)}")
