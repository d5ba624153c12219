"""Test helpers shipped with singa-core: the backend conformance suite (a pytest plugin)."""
