"""Grading: what keeps a solution cell from forging its grade or harming the machine.

The exercises' checkers (``dpcost.exercises``) never run student code in the notebook's kernel.
``sandbox`` runs each call in a child process forked from the kernel, with a time limit per
call: before the student's code runs, every function of the dpcost package is disabled there,
the expected values are emptied and ``import dpcost`` is refused, and only plain data (one line
of JSON: numbers, strings, short lists) comes back; the verdict is made in the kernel.
``confine`` confines that child: a keeper process that never runs student code, and a worker
in new PID, mount and network namespaces where the system allows them, under an unprivileged
uid of its own (no groups) when the kernel runs as root, ``no_new_privs``, with every inherited
file descriptor on /dev/null, the package's folder hidden if asked, resource limits (address
space, tasks, CPU time, file size, no core dumps), the memory of all its processes bounded
together (a cgroup, or the keeper's sum), private /tmp, /var/tmp, /dev/shm and /run (or a sweep
of what its uid left there), none of the kernel's environment beyond PATH, the locale and
Python's, no socket but its own, and every process it started killed when it ends.
``grade`` is the out-of-kernel grader that nbgrader's grade cells (the hidden tests) call,
``python -I -m dpcost.grading.grade NOTEBOOK FUNCTION``: a new interpreter that grades the
notebook's saved file, so nothing a cell redefines or patches in the kernel takes part.
``student`` builds the student notebooks from the instructor masters (nbgrader's markers:
solutions stubbed, hidden tests removed, cells locked; ``make student``). What each of these
protects, and what it cannot: docs/exercises.md and docs/teaching.md.
"""
