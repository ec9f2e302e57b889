"""Shared test settings: hypothesis runs the same examples every time (CI must not flake)."""

from hypothesis import settings

settings.register_profile("dpcost", derandomize=True, deadline=None, max_examples=200)
settings.load_profile("dpcost")
