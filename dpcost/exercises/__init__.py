"""Exercises: the student writes the five functions and one ring step; checks, hints, versions.

Modules (import the one you need; nothing heavy is imported here):
``sandbox`` runs student code in a forked child with a time limit; ``five_functions`` and
``ring_step`` hold the worked examples and the test batteries (``check`` / ``submit``);
``report`` renders results; ``hints`` reveals hints one at a time; ``student`` writes the
student notebooks from the instructor masters.
"""
