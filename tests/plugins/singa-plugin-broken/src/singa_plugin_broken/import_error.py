"""An entry point whose module cannot be imported."""

raise ImportError("singa_plugin_broken.import_error: libbrokendevice.so not found (deliberate test failure)")
