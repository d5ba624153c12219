"""The backend conformance suite: every primitive of `singa.primitives`, called through `device.table` on views and
compared with numpy references written here (float64 where precision matters).

    pytest --pyargs singa.testing.conformance --singa-device=NAME

Each module lists the primitives it checks in `COVERS`; `test_coverage` fails when a primitive has no test.
"""
