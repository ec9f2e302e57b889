"""Results of ``check`` and ``submit``: structured for tests, rendered as a table for people.

A :class:`Report` shows itself as HTML in Jupyter (``_repr_html_``) and as plain text in a
terminal (``str``/``repr``); both hold only deterministic text (no timings), so notebooks that
display a report pass strict nbval.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field


@dataclass
class TestResult:
    """One test: what was called, what was expected, what came back, and why it failed."""

    __test__ = False  # not a pytest test class

    function: str  # the student's function (or schedule) under test
    category: str  # e.g. "worked example", "invalid input"
    call: str  # the call (or setting) tried, e.g. "dp_communication_volume(1.5e+09, 8)"
    expected: str
    got: str
    passed: bool
    reason: str = ""  # why it failed ("" when it passed)
    printed: str = ""  # what the student's code printed during the test


@dataclass
class Report:
    """All results of one ``check`` (worked examples) or ``submit`` (full battery)."""

    title: str
    kind: str  # "check" or "submit"
    results: list[TestResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # lines shown above the table
    footer: list[str] = field(default_factory=list)  # lines shown below it (`code` spans)

    @property
    def passed(self) -> int:
        return sum(result.passed for result in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    @property
    def failures(self) -> list[TestResult]:
        return [result for result in self.results if not result.passed]

    def score_line(self) -> str:
        percent = round(100 * self.passed / self.total) if self.total else 0
        line = f"Score: {self.passed}/{self.total} tests passed ({percent} %)"
        return line + (" - all passed!" if self.all_passed else "")

    def grouped_failures(self) -> list[tuple[TestResult, int]]:
        """Failures as (first one, how many more share its function and reason): a function
        that is not written yet shows one line, not thirty."""
        groups: dict[tuple[str, str], list[TestResult]] = {}
        for result in self.failures:
            groups.setdefault((result.function, result.reason), []).append(result)
        return [(group[0], len(group) - 1) for group in groups.values()]

    def by_function(self) -> dict[str, tuple[int, int]]:
        """{function: (passed, total)} in the order the functions were tested."""
        counts: dict[str, tuple[int, int]] = {}
        for result in self.results:
            passed, total = counts.get(result.function, (0, 0))
            counts[result.function] = (passed + result.passed, total + 1)
        return counts

    # Plain text (terminal, printed notes, nbval's text/plain).
    def __str__(self) -> str:
        lines = [self.title, *self.notes]
        if self.kind == "check":
            rows = [("call", "expected", "got", "result")] + [
                (r.call, r.expected, r.got, "pass" if r.passed else "FAIL") for r in self.results]
            widths = [min(60, max(len(row[i]) for row in rows)) for i in range(4)]
            for k, row in enumerate(rows):
                cells = (_clip(cell, w).ljust(w) for cell, w in zip(row, widths, strict=True))
                lines.append("  ".join(cells).rstrip())
                if k == 0:
                    lines.append("  ".join("-" * w for w in widths))
            lines += [f"  {r.call}: {r.reason}" for r in self.failures if r.reason]
            lines.append(f"{self.passed}/{self.total} worked examples pass.")
        else:
            lines.append(self.score_line())
            for function, (passed, total) in self.by_function().items():
                lines.append(f"  {function}: {passed}/{total}")
            if self.failures:
                lines.append("Failures:")
            for r, more in self.grouped_failures():
                lines.append(f"  [{r.function}] {r.category}: {r.call}")
                lines.append(f"      expected {r.expected}; got {r.got}")
                lines.append(f"      why: {r.reason}")
                if more:
                    lines.append(f"      (and {more} more tests of {r.function} fail for the "
                                 "same reason)")
        printed = [r for r in self.results if r.printed]
        if printed:
            lines.append(f"Note: your code printed during {len(printed)} test(s) (captured, not "
                         f"shown); first: {printed[0].printed.strip()[:80]!r}")
        lines += self.footer
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    # HTML (Jupyter).
    def _repr_html_(self) -> str:
        """The report as HTML that fits a narrow output area (JupyterLab's is about 850-970 px).

        One row per test (or per group of failures) and the reason on a row of its own under
        it, across the whole table; long calls and values wrap. No function column: a report
        on several functions heads each function's rows with its name and count instead.
        """
        esc = html.escape
        parts = [f"<p><b>{esc(self.title)}</b></p>"]
        parts += [f"<p>{esc(note)}</p>" for note in self.notes]
        counts = self.by_function()
        if self.kind == "submit":
            parts.append(f"<p><b>{esc(self.score_line())}</b>" + (" - " + ", ".join(
                f"{esc(fn)}: {p}/{t}" for fn, (p, t) in counts.items())
                if len(counts) > 1 else "") + "</p>")
            rows = [(r, r.reason + (f" (and {more} more tests of {r.function} fail for the same "
                                    "reason)" if more else ""))
                    for r, more in self.grouped_failures()]
            header, widths = ("test", "call", "expected", "got"), (20, 36, 22, 22)
        else:
            rows = [(r, r.reason) for r in self.results]
            header, widths = ("call", "expected", "got", "result"), (40, 25, 25, 10)
        if rows:
            parts.append(_TABLE + "".join(f'<col style="width:{w}%">' for w in widths)
                         + "<tr>" + "".join(f'<th style="{_CELL}">{esc(h)}</th>' for h in header)
                         + "</tr>")
            function = None
            for result, reason in rows:
                if len(counts) > 1 and result.function != function:
                    function = result.function
                    parts.append(f'<tr><th colspan="{len(header)}" style="{_CELL}">'
                                 f"{esc(function)}</th></tr>")
                if self.kind == "submit":
                    cells = (result.category, result.call, result.expected, result.got)
                else:
                    cells = (result.call, result.expected, result.got,
                             "pass" if result.passed else "FAIL")
                color = "#e6f4ea" if result.passed else "#fce8e6"
                parts.append(f'<tr style="background:{color}">' + "".join(
                    f'<td style="{_CELL}"><code>{esc(cell)}</code></td>' for cell in cells)
                    + "</tr>")
                if not result.passed and reason:
                    parts.append(f'<tr style="background:{color}"><td colspan="{len(header)}" '
                                 f'style="{_CELL}padding-left:2em">why: {esc(reason)}</td></tr>')
            parts.append("</table>")
        if self.kind == "check":
            parts.append(f"<p>{self.passed}/{self.total} worked examples pass.</p>")
        parts += [f"<p>{_code_spans(esc(line))}</p>" for line in self.footer]
        return "".join(parts)


# A table as wide as the output area at most: fixed layout, every cell wraps (long calls too).
_TABLE = ('<table style="width:100%;max-width:100%;table-layout:fixed;border-collapse:collapse;'
          'margin-left:0">')
_CELL = ("text-align:left;vertical-align:top;white-space:normal;overflow-wrap:anywhere;"
         "word-break:break-word;padding:0.3em 0.5em;")


def solution_pointer(name: str) -> str:
    """The line under a failed ``check`` or ``submit``: where the hints and the worked solution
    of exercise ``name`` are."""
    return (f"Stuck after trying? The hint button under the task reveals its hints one at a time, "
            f"then the worked solution; in code, `hint(\"{name}\")` prints the next hint and "
            f"`solution(\"{name}\")` the worked solution.")


def _code_spans(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
