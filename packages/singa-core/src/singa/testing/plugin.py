"""pytest plugin of the backend conformance suite: the `--singa-device` option and the `device` fixture.

It is loaded by every pytest run in an environment that has singa-core (entry point `pytest11`), so it must stay
cheap and harmless: plugin discovery only happens once a collected test asks for `device`, and a project that defines
its own `device` fixture keeps it untouched.

    pytest --pyargs singa.testing.conformance                      # every device of every installed backend
    pytest --pyargs singa.testing.conformance --singa-device=mydev  # a third-party author's own device
"""

from __future__ import annotations

import pytest

_SELECTED = pytest.StashKey[list]()


def pytest_addoption(parser):
    group = parser.getgroup("singa", "SINGA backend conformance")
    group.addoption(
        "--singa-device",
        action="append",
        default=None,
        metavar="NAME[,NAME...]",
        help="devices that tests taking the `device` fixture run on (cpu, cuda:1, a plugin's name...); "
        "default: every device of every installed backend",
    )


def _requested(config) -> list[str] | None:
    values = config.getoption("singa_device", default=None)
    if not values:
        return None
    return [s.strip() for v in values for s in v.split(",") if s.strip()]


def pytest_configure(config):
    requested = _requested(config)
    if requested is None:
        return
    # Fail before collection, with the plugin system's own message (which says what to pip install).
    from singa import device as singa_device

    specs = []
    for spec in requested:
        try:
            name, index = singa_device.parse_device_spec(spec)
            singa_device.get_device(f"{name}:{index}")
        except (RuntimeError, ValueError) as exc:
            raise pytest.UsageError(f"--singa-device={spec}: {exc}") from None
        if f"{name}:{index}" not in specs:
            specs.append(f"{name}:{index}")
    config.stash[_SELECTED] = specs


def selected_devices(config) -> list[str]:
    """Device specs ('name:index') the `device` fixture is parametrised over."""
    specs = config.stash.get(_SELECTED, None)
    if specs is None:
        from singa import plugins

        specs = [f"{name}:{i}" for name, backend in sorted(plugins.registry().backends.items())
                 for i in range(backend.device_count())]
        config.stash[_SELECTED] = specs
    return specs


def _uses_our_fixture(metafunc) -> bool:
    # A conftest or module may define its own `device`; then it is theirs to parametrise. `_arg2fixturedefs` is
    # private to pytest, so when it is missing we assume the fixture is ours.
    defs = getattr(metafunc, "_arg2fixturedefs", {}).get("device")
    if not defs:
        return True
    return getattr(defs[-1].func, "__module__", None) == __name__


def _parametrized_directly(metafunc) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if "device" in names:
            return True
    return False


def pytest_generate_tests(metafunc):
    if "device" not in metafunc.fixturenames or not _uses_our_fixture(metafunc) or _parametrized_directly(metafunc):
        return
    specs = selected_devices(metafunc.config)
    metafunc.parametrize("device", specs, indirect=True, ids=specs, scope="session")


@pytest.fixture(scope="session")
def device(request):
    """A singa Device; tests taking it run once per device chosen with --singa-device."""
    from singa import device as singa_device

    spec = getattr(request, "param", None)
    if spec is None:  # requested dynamically (getfixturevalue), outside parametrisation
        specs = selected_devices(request.config)
        if not specs:
            pytest.skip("no SINGA device installed")
        spec = specs[0]
    return singa_device.get_device(spec)


def pytest_report_collectionfinish(config, start_path, items):
    specs = config.stash.get(_SELECTED, None)
    if not specs or not any("device" in getattr(item, "fixturenames", ()) for item in items):
        return []
    from singa import device as singa_device

    lines = []
    for spec in specs:
        dev = singa_device.get_device(spec)
        missing = dev.missing_kernels()
        total = len(dev.table)
        line = f"singa device {dev.name}: {total - len(missing)}/{total} kernels native"
        if missing:
            shown = ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")
            line += f", {len(missing)} through the host fallback ({shown})"
        lines.append(line)
    return lines
