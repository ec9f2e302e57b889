"""Results of ``check`` and ``submit``: structured for tests, rendered as a table for people.

A :class:`Report` shows itself as HTML in Jupyter (``_repr_html_``) and as plain text in a
terminal (``str``/``repr``); both hold only deterministic text (no timings), so notebooks that
display a report pass strict nbval.

Failures that share a function and a reason are shown once, with a count. A report may split
each function's credit into parts (``weights``, e.g. ex1's formula 80 % and input checks 20 %):
its :meth:`Report.credit` is then the weighted share, and the report says so; without weights
every test counts the same.
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
    part: str = ""  # the share of the credit it counts in (a key of Report.weights), if any


@dataclass
class Report:
    """All results of one ``check`` (worked examples) or ``submit`` (full battery)."""

    title: str
    kind: str  # "check" or "submit"
    results: list[TestResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # lines shown above the table
    footer: list[str] = field(default_factory=list)  # lines shown below it (`code` spans)
    # {part: its share of each function's credit}, in the order shown; empty: tests count alike
    weights: dict[str, float] = field(default_factory=dict)

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
        line = f"Score: {self.passed}/{self.total} tests passed"
        line += f", {self.percent()} % of the credit" if self.weights else f" ({percent} %)"
        return line + (" - all passed!" if self.all_passed else "")

    def percent(self, function: str | None = None) -> int:
        return round(100 * self.credit(function=function))

    def credit(self, exclude=(), function: str | None = None) -> float:
        """The share of the credit earned, from 0 to 1 (of ``function`` alone if given).

        Without weights: tests passed / tests. With weights: each function earns, for each
        part, the part's weight times the share of its tests passed there (a part it has no
        test in gives its weight to the others), and the report the mean over its functions.
        A function in ``exclude`` (one that failed a literal check, say) earns nothing.
        """
        results = [r for r in self.results if function in (None, r.function)]
        if not results:
            return 0.0
        if not self.weights:
            return sum(r.passed and r.function not in exclude for r in results) / len(results)
        functions = list(dict.fromkeys(r.function for r in results))
        earned = 0.0
        for name in functions:
            if name in exclude:
                continue
            mine = [r for r in results if r.function == name]
            parts = {part: [r for r in mine if r.part == part] for part in self.weights}
            weight = sum(self.weights[part] for part, tests in parts.items() if tests)
            earned += sum(self.weights[part] * sum(r.passed for r in tests) / len(tests)
                          for part, tests in parts.items() if tests) / weight
        return earned / len(functions)

    def split_text(self, function: str) -> str:
        """'formula and n <= 1: 14/14, input checks: 0/13' for ``function`` (weighted reports)."""
        mine = [r for r in self.results if r.function == function]
        return ", ".join(f"{part}: {sum(r.passed for r in tests)}/{len(tests)}"
                         for part in self.weights
                         for tests in [[r for r in mine if r.part == part]] if tests)

    def weights_text(self) -> str:
        """"each function's credit: 80 % for the formula ..., 20 % for ..." (weighted reports)."""
        return "each function's credit: " + ", ".join(
            f"{round(100 * weight)} % for the {part}" for part, weight in self.weights.items())

    def grouped_failures(self) -> list[tuple[TestResult, int]]:
        """Failures as (first one, how many more share its function, part and reason): the
        same mistake shows one line with a count, not one line per test. Function by function,
        and within one, part by part in the order of ``weights`` (the formula's failures before
        the input checks')."""
        groups: dict[tuple[str, str, str], list[TestResult]] = {}
        for result in self.failures:
            groups.setdefault((result.function, result.part, result.reason), []).append(result)
        functions, parts = list(self.by_function()), list(self.weights)
        ranked = sorted(groups.values(), key=lambda group: (  # a stable sort: first seen first
            functions.index(group[0].function),
            parts.index(group[0].part) if group[0].part in parts else len(parts)))
        return [(group[0], len(group) - 1) for group in ranked]

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
            if self.weights:
                lines.append(f"  ({self.weights_text()})")
            for function, (passed, total) in self.by_function().items():
                lines.append(f"  {function}: {passed}/{total}" + (
                    f" tests passed, {self.percent(function)} % of its credit "
                    f"({self.split_text(function)})" if self.weights else ""))
            if self.failures and not self.weights:
                lines.append("Failures:")
            part = None
            for r, more in self.grouped_failures():
                if self.weights and r.part != part:
                    part = r.part
                    lines.append(f"Failures, {self._part_heading(part)}:")
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

    def _part_heading(self, part: str) -> str:
        return f"{part} ({round(100 * self.weights.get(part, 0))} % of the credit)"

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
            if self.weights:
                parts.append(f"<p>{esc(self.weights_text().capitalize())}. " + "; ".join(
                    f"{esc(fn)}: {self.percent(fn)} % ({esc(self.split_text(fn))})"
                    for fn in counts) + ".</p>")
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
            function = part = None
            for result, reason in rows:
                if len(counts) > 1 and result.function != function:
                    function, part = result.function, None
                    parts.append(f'<tr><th colspan="{len(header)}" style="{_CELL}">'
                                 f"{esc(function)}</th></tr>")
                if self.kind == "submit" and self.weights and result.part != part:
                    part = result.part
                    parts.append(f'<tr><td colspan="{len(header)}" style="{_CELL}"><i>'
                                 f"{esc(self._part_heading(part))}</i></td></tr>")
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
