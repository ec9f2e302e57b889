"""Matplotlib figures for the course, one module per figure family.

Importing this package is cheap; each submodule imports matplotlib itself.
"""
