"""Hook specifications: the whole plugin contract of singa-core, one hook per capability.

A plugin is a module named by an entry point in the `singa.backends` (devices) or `singa.communicators` group; it
implements hooks with the `singa.hookimpl` decorator and nothing else:

    # my_plugin/__init__.py          pyproject: [project.entry-points."singa.backends"] mydev = "my_plugin"
    from singa import hookimpl

    @hookimpl
    def singa_backend():
        return MyBackend()
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("singa")
hookimpl = pluggy.HookimplMarker("singa")


@hookspec
def singa_backend():
    """Return the plugin's `singa.backend.Backend`.

    Called once, lazily, the first time a device of any backend is needed. The Backend's `name` is what users pass in
    SINGA_DEVICE; two plugins with the same name: the first found wins and the other is reported. Raising here marks the
    plugin as broken (reported by `python -m singa info`), never breaks `import singa`.
    """


@hookspec
def singa_communicator():
    """Return a `singa.communicator.CommunicatorFactory` for distributed training (mpi, nccl, ...).

    Same rules as `singa_backend`: the factory's `name` selects it, errors are reported and the plugin skipped.
    """
