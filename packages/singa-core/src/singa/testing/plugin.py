"""pytest plugin of the backend conformance suite (placeholder until the suite lands)."""
