"""An entry point that imports but whose `singa_backend` hook raises."""

from singa import hookimpl


@hookimpl
def singa_backend():
    raise RuntimeError("singa_plugin_broken.hook_error: no broken device found (deliberate test failure)")
