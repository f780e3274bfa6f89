"""How the built-in suites read an answer: one rule for numbers, one for names.

Numbers (`numbers_in`, `parse_number`, `numbers_match`):

- A number is a run of digits with `,` or `.` between them, read as follows: commas between a
  first group of one to three digits and further groups of exactly three separate thousands
  (`1,234` is 1234, `12,345.5` is 12345.5); a single comma between digits otherwise is a
  decimal comma (`3,7` is 3.7, `2,50` is 2.5); a dot is a decimal point (`3.70` is 3.7, `.5` is
  0.5). Any other run is a list and gives each of its
  parts (`3,7,9` is 3, 7 and 9; `1.2.3` is 1, 2 and 3). A separator at the end of a run is
  punctuation (`42.` is 42).
- `-` (or the minus sign U+2212) right before a number is its sign when nothing alphanumeric
  comes just before it: `-3` and `(-3)` are negative, `2024-05-01` is 2024, 5 and 1. `-0` is 0.
- Everything else around numbers is ignored: currency signs, units, `%` (`50%` is 50, not 0.5),
  words. There is no exponent notation (`1e3` is 1 and 3).
- An answer's number is the *last* one it writes ("17 plus 25 is 42" answers 42).
- Two numbers match when they differ by at most 0.01, or by 1e-9 of the expected value when
  that is larger: an answer copied from a tool's 4-decimal output, or rounded to 2 decimals,
  counts; 12.02 for 12 does not.

Names (`text_matches`): the answer and the expected value are compared as sequences of words
(runs of ASCII letters and digits, any case, everything else a separator); the answer must
contain the expected words in a row and none of the other candidates' words in a row (naming
every candidate is not an answer).
"""

from __future__ import annotations

import math
import re
from typing import Callable

from harnessrl.tasks.base import Environment

TOLERANCE = 0.01  # absolute
RELATIVE_TOLERANCE = 1e-9

_RUN = re.compile(r"(?P<sign>[-\u2212]?)(?P<body>\d(?:[\d,.]*\d)?|\.\d+)")
_PLAIN = re.compile(r"\d+(?:\.\d+)?|\.\d+")
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL_COMMA = re.compile(r"\d+,\d+")
_WORD = re.compile(r"[a-z0-9]+")


def _read_run(body: str) -> list[float]:
    if _PLAIN.fullmatch(body):
        return [float(body)]
    if _THOUSANDS.fullmatch(body):
        return [float(body.replace(",", ""))]
    if _DECIMAL_COMMA.fullmatch(body):
        return [float(body.replace(",", "."))]
    out: list[float] = []
    for part in body.split(","):
        if _PLAIN.fullmatch(part):
            out.append(float(part))
        else:
            out.extend(float(p) for p in part.split(".") if p)
    return out


def numbers_in(text: str | None) -> list[float]:
    """Every number written in `text`, in order, by the rule of this module."""
    out: list[float] = []
    for m in _RUN.finditer(text or ""):
        values = _read_run(m.group("body"))
        before = text[m.start() - 1] if m.start() > 0 and text else ""
        if m.group("sign") and values and not before.isalnum():
            values[0] = -values[0]
        out.extend(values)
    return out


def parse_number(answer: str | None) -> float | None:
    """The last number written in the answer, or None ("The answer is 1,250.5" -> 1250.5)."""
    found = numbers_in(answer)
    return found[-1] if found else None


def numbers_match(got: float | None, expected: float) -> bool:
    """`got` is within 0.01 of `expected` (or 1e-9 of it, for very large values)."""
    if got is None or not math.isfinite(got):
        return False
    return abs(got - expected) <= max(TOLERANCE, RELATIVE_TOLERANCE * abs(expected))


def number_answer_ok(answer: str | None, expected: float) -> bool:
    """The last number of the answer matches `expected`."""
    return numbers_match(parse_number(answer), expected)


def numeric_check(expected: float) -> Callable[[Environment], dict[str, float]]:
    """A grader of one sub-score, `answer`: 1 when the submitted answer's number matches."""

    def check(env: Environment) -> dict[str, float]:
        return {"answer": 1.0 if number_answer_ok(env.answer, expected) else 0.0}

    return check


def fmt_number(x: float) -> str:
    """Short form of a number, which `parse_number` reads back: 42 rather than 42.0, at most 4
    decimals, no thousands separators."""
    x = round(float(x), 4)
    if not math.isfinite(x):
        return str(x)
    if x == int(x):
        return str(int(x))
    return f"{x:.4f}".rstrip("0").rstrip(".")


def words(text: str | None) -> list[str]:
    """The words of `text` as names are compared: lower-case runs of ASCII letters and digits."""
    return _WORD.findall((text or "").lower())


def text_matches(answer: str | None, expected: str, others: list[str]) -> bool:
    """The answer names `expected` (whole words, any case) and none of the `others`."""
    said = words(answer)

    def mentions(value: str) -> bool:
        target = words(value)
        n = len(target)
        return n > 0 and any(said[i : i + n] == target for i in range(len(said) - n + 1))

    return mentions(expected) and not any(mentions(o) for o in others if o.lower() != expected.lower())
