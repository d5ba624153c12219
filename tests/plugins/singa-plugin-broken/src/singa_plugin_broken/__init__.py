"""Device plugins that fail on purpose, to prove that a broken plugin is reported and skipped, never fatal.

`import_error` fails when its entry point is loaded (a missing native library, say); `hook_error` loads but its
`singa_backend` hook raises (a driver that is installed but finds no device, say).
"""
