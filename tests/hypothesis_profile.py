"""Hypothesis runs the same examples every time (CI must not flake). The four test files that
use hypothesis import this first; a conftest.py would import hypothesis (1.4 s) in every pytest
process, the lanes and workers that run none of them included."""

from hypothesis import settings

settings.register_profile("dpcost", derandomize=True, deadline=None, max_examples=200)
settings.load_profile("dpcost")
