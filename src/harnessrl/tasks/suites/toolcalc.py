"""Suite `toolcalc`: micro tasks of one or two tool calls.

Small enough for a 135M model to solve sometimes, which is what gives training any reward signal
at that size: add / subtract / multiply / divide two numbers, look a value up in a small table,
convert a unit, and two-call chains (look up a price then multiply; add then multiply).

There is no workspace: a table lives in `env.state["table"]`. Each family brings only the tools it
needs (plus submit) and its instruction names them. The agent answers with
`submit(answer="...")`; the grader reads it by the rule of `harnessrl.tasks.grading` ("42",
"42.0", "The answer is 42": the last number in the answer counts, within 0.01; a capital by its
words). One sub-score, `answer`, is 1 or 0.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from harnessrl.tasks.base import Environment, Family, Suite, TaskParts, Tool, ToolFailed, solution_call
from harnessrl.tasks.grading import fmt_number, numeric_check, text_matches
from harnessrl.tasks.suites.pools import load_pools

# -- tools --------------------------------------------------------------------------------------

_AB = {
    "type": "object",
    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
    "required": ["a", "b"],
}


def _add(env: Environment, a: float, b: float) -> str:
    return fmt_number(a + b)


def _subtract(env: Environment, a: float, b: float) -> str:
    return fmt_number(a - b)


def _multiply(env: Environment, a: float, b: float) -> str:
    return fmt_number(a * b)


def _divide(env: Environment, a: float, b: float) -> str:
    if b == 0:
        raise ToolFailed("cannot divide by zero")
    return fmt_number(a / b)


ADD = Tool("add", "Add two numbers: returns a + b.", _AB, _add)
SUBTRACT = Tool("subtract", "Subtract two numbers: returns a - b.", _AB, _subtract)
MULTIPLY = Tool("multiply", "Multiply two numbers: returns a * b.", _AB, _multiply)
DIVIDE = Tool("divide", "Divide two numbers: returns a / b.", _AB, _divide)


def _lookup(env: Environment, key: str) -> str:
    table: dict[str, Any] = env.state.get("table", {})
    wanted = key.strip().strip("'\"").lower()
    for k, v in table.items():
        if k.lower() == wanted:
            return fmt_number(v) if isinstance(v, (int, float)) else str(v)
    raise ToolFailed(f"no entry for '{key}'. Keys: {', '.join(table)}")


LOOKUP = Tool(
    "lookup",
    "Look up the value stored for a key in the table.",
    {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    _lookup,
)

# unit -> (dimension, factor to the dimension's base unit); temperatures are handled apart.
UNITS: dict[str, tuple[str, float]] = {
    "km": ("length", 1000.0),
    "m": ("length", 1.0),
    "cm": ("length", 0.01),
    "mm": ("length", 0.001),
    "mi": ("length", 1609.344),
    "ft": ("length", 0.3048),
    "in": ("length", 0.0254),
    "kg": ("mass", 1000.0),
    "g": ("mass", 1.0),
    "lb": ("mass", 453.59237),
    "l": ("volume", 1.0),
    "ml": ("volume", 0.001),
    "h": ("time", 3600.0),
    "min": ("time", 60.0),
    "s": ("time", 1.0),
    "C": ("temperature", 1.0),
    "F": ("temperature", 1.0),
}
_UNIT_ALIASES = {u.lower(): u for u in UNITS}


def convert_value(value: float, from_unit: str, to_unit: str) -> float:
    if from_unit == to_unit:
        return value
    if from_unit == "C" and to_unit == "F":
        return value * 9 / 5 + 32
    if from_unit == "F" and to_unit == "C":
        return (value - 32) * 5 / 9
    return value * UNITS[from_unit][1] / UNITS[to_unit][1]


def _convert(env: Environment, value: float, from_unit: str, to_unit: str) -> str:
    units = []
    for u in (from_unit, to_unit):
        real = _UNIT_ALIASES.get(u.strip().lower())
        if real is None:
            raise ToolFailed(f"unknown unit '{u}'. Units: {', '.join(UNITS)}")
        units.append(real)
    src, dst = units
    if UNITS[src][0] != UNITS[dst][0]:
        raise ToolFailed(f"cannot convert {UNITS[src][0]} ({src}) to {UNITS[dst][0]} ({dst})")
    return f"{fmt_number(convert_value(value, src, dst))} {dst}"


CONVERT = Tool(
    "convert",
    "Convert a value from one unit to another (units: " + ", ".join(UNITS) + ").",
    {
        "type": "object",
        "properties": {"value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}},
        "required": ["value", "from_unit", "to_unit"],
    },
    _convert,
)

# -- families -----------------------------------------------------------------------------------

SUBMIT_HINT = "then submit the result with the submit tool."


def _no_setup(env: Environment) -> None:
    return None


def _binary(op: str, word: str, tool: Tool, a: int, b: int, result: float) -> TaskParts:
    return {
        "instruction": f"What is {a} {word} {b}? Use the {tool.name} tool, {SUBMIT_HINT}",
        "setup": _no_setup,
        "check": numeric_check(result),
        "tools": [tool],
        "solution": [solution_call(tool.name, a=a, b=b), solution_call("submit", answer=fmt_number(result))],
        "data": {"op": op, "a": a, "b": b},
    }


def add(rng: random.Random) -> TaskParts:
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    return _binary("add", "plus", ADD, a, b, a + b)


def subtract(rng: random.Random) -> TaskParts:
    b = rng.randint(1, 90)
    a = b + rng.randint(1, 99)
    if a == 2 * b:  # the result would be b, a number the instruction states (`harnessrl audit`)
        a += 1
    return _binary("subtract", "minus", SUBTRACT, a, b, a - b)


def multiply(rng: random.Random) -> TaskParts:
    a, b = rng.randint(2, 50), rng.randint(2, 25)
    return _binary("multiply", "times", MULTIPLY, a, b, a * b)


def divide(rng: random.Random) -> TaskParts:
    b, q = rng.randint(2, 12), rng.randint(2, 99)
    if q == b:  # the result would be b, a number the instruction states (`harnessrl audit`)
        q += 1
    return _binary("divide", "divided by", DIVIDE, b * q, b, q)


def add_then_multiply(rng: random.Random) -> TaskParts:
    a, b, c = rng.randint(1, 30), rng.randint(1, 30), rng.randint(2, 9)
    result = (a + b) * c
    return {
        "instruction": (f"What is ({a} plus {b}) times {c}? Use the add tool, then the multiply tool, {SUBMIT_HINT}"),
        "setup": _no_setup,
        "check": numeric_check(result),
        "tools": [ADD, MULTIPLY],
        "solution": [
            solution_call("add", a=a, b=b),
            solution_call("multiply", a=a + b, b=c),
            solution_call("submit", answer=str(result)),
        ],
        "data": {"op": "add_then_multiply", "a": a, "b": b, "c": c},
    }


_POOLS = load_pools("toolcalc")  # package data: suites/data/toolcalc.json
ITEMS: list[tuple[str, str]] = [(single, plural) for single, plural in _POOLS["items"]]


def _price_table(rng: random.Random) -> tuple[dict[str, int], list[tuple[str, str]]]:
    items = rng.sample(ITEMS, rng.randint(4, 6))
    return {single: rng.randint(1, 25) for single, _ in items}, items


def _table_setup(table: dict[str, Any]) -> Callable[[Environment], None]:
    def setup(env: Environment) -> None:
        env.state["table"] = dict(table)

    return setup


def lookup_price(rng: random.Random) -> TaskParts:
    table, items = _price_table(rng)
    item = rng.choice(items)[0]
    return {
        "instruction": f'How much does one {item} cost? Use the lookup tool with key "{item}", {SUBMIT_HINT}',
        "setup": _table_setup(table),
        "check": numeric_check(table[item]),
        "tools": [LOOKUP],
        "solution": [solution_call("lookup", key=item), solution_call("submit", answer=fmt_number(table[item]))],
        "data": {"table": table, "key": item},
        "required_observations": ["lookup"],
    }


def price_times_quantity(rng: random.Random) -> TaskParts:
    table, items = _price_table(rng)
    single, plural = rng.choice(items)
    n = rng.randint(2, 9)
    if table[single] == 1:  # the total would be n, the number the instruction states (`harnessrl audit`)
        table[single] = 2
    total = table[single] * n
    return {
        "instruction": (
            f'How much do {n} {plural} cost? Use the lookup tool with key "{single}" to get the price '
            f"of one, then the multiply tool, {SUBMIT_HINT}"
        ),
        "setup": _table_setup(table),
        "check": numeric_check(total),
        "tools": [LOOKUP, MULTIPLY],
        "solution": [
            solution_call("lookup", key=single),
            solution_call("multiply", a=table[single], b=n),
            solution_call("submit", answer=fmt_number(total)),
        ],
        "data": {"table": table, "key": single, "quantity": n},
        "required_observations": ["lookup"],
    }


_SYLLABLES: list[str] = _POOLS["syllables"]


def _made_up_name(rng: random.Random, syllables: int, suffix: str = "") -> str:
    return ("".join(rng.choice(_SYLLABLES) for _ in range(syllables)) + suffix).title()


def lookup_capital(rng: random.Random) -> TaskParts:
    # Made-up countries and cities: the model cannot know the answer without the tool.
    table: dict[str, str] = {}
    used: set[str] = set()
    size = rng.randint(4, 6)
    while len(table) < size:
        country = _made_up_name(rng, 2, rng.choice(["ia", "land", "stan", "ria", "ovo"]))
        city = _made_up_name(rng, rng.randint(2, 3))
        if country in used or city in used:
            continue
        used |= {country, city}
        table[country] = city
    country = rng.choice(sorted(table))
    capital = table[country]
    others = sorted(table.values())

    def check(env: Environment) -> dict[str, float]:
        return {"answer": 1.0 if text_matches(env.answer, capital, others) else 0.0}

    return {
        "instruction": f'What is the capital of {country}? Use the lookup tool with key "{country}", {SUBMIT_HINT}',
        "setup": _table_setup(table),
        "check": check,
        "tools": [LOOKUP],
        "solution": [solution_call("lookup", key=country), solution_call("submit", answer=capital)],
        "data": {"table": table, "key": country},
        "required_observations": ["lookup"],
    }


# (from, to, step, lo, hi): the input value is step * randint(lo, hi), so results stay short
_CONVERSIONS: list[tuple[str, str, float, int, int]] = [
    ("km", "m", 0.5, 1, 40),
    ("m", "cm", 0.5, 1, 40),
    ("m", "mm", 0.25, 1, 40),
    ("cm", "m", 25, 1, 40),
    ("kg", "g", 0.5, 1, 40),
    ("g", "kg", 50, 1, 60),
    ("l", "ml", 0.25, 1, 40),
    ("ml", "l", 50, 1, 60),
    ("h", "min", 0.5, 1, 24),
    ("min", "s", 0.5, 1, 40),
    ("h", "s", 0.5, 1, 10),
    ("mi", "km", 1, 1, 50),
    ("in", "cm", 1, 1, 48),
    ("ft", "m", 1, 1, 60),
    ("lb", "kg", 1, 1, 50),
    ("C", "F", 1, -20, 100),
    ("F", "C", 1, 0, 120),
]


def convert_units(rng: random.Random) -> TaskParts:
    src, dst, step, lo, hi = rng.choice(_CONVERSIONS)
    value: float = step * rng.randint(lo, hi)
    if value == int(value):
        value = int(value)
    result = convert_value(value, src, dst)
    shown = fmt_number(value)
    return {
        "instruction": (
            f'Convert {shown} {src} to {dst}. Use the convert tool (from_unit "{src}", to_unit "{dst}"), {SUBMIT_HINT}'
        ),
        "setup": _no_setup,
        "check": numeric_check(result),
        "tools": [CONVERT],
        "solution": [
            solution_call("convert", value=value, from_unit=src, to_unit=dst),
            solution_call("submit", answer=fmt_number(result)),
        ],
        "data": {"value": value, "from": src, "to": dst},
    }


FAMILIES: dict[str, Family] = {
    "add": add,
    "subtract": subtract,
    "multiply": multiply,
    "divide": divide,
    "add_then_multiply": add_then_multiply,
    "lookup_price": lookup_price,
    "lookup_capital": lookup_capital,
    "price_times_quantity": price_times_quantity,
    "convert_units": convert_units,
}


class ToolcalcSuite(Suite):
    """One- or two-call calculator / lookup / conversion tasks for tiny models."""

    name = "toolcalc"
    description = "Micro tasks of one or two tool calls (arithmetic, lookup, unit conversion)."
    split_sizes = {"train": 2000, "dev": 48, "test": 72}
    pass_threshold = 1.0
    needs_workspace = False

    def families(self) -> dict[str, Family]:
        return dict(FAMILIES)

    def base_tools(self) -> list[Tool]:
        return []  # each family brings the few tools its instruction names
