"""Suite `workspace`: file-system tasks graded on the final state of a sandboxed workspace.

In the style of ClawGym: each task fills a fresh temporary workspace with a few small files,
tells the agent exactly what to do and which paths to use, and a grader inspects the files left
behind when the agent submits. Families range from a single write to multi-step edits; a
multi-step family returns several named sub-scores so that partial work earns partial credit
(the task score is their mean and a task passes only at 1.0).

Every family is a function `rng -> dict` (see `harnessrl.tasks.base.Family`). All names and
values come from the rng, so instances differ and a (suite, split, index) always rebuilds the same
instance. Graders never raise: a missing, garbled or misplaced file scores 0 on the checks that
need it (see `_run_checks`), and trailing whitespace / newlines are ignored.
"""

from __future__ import annotations

import json
import os
import random
import re
from typing import Any, Callable

from harnessrl.tasks.base import Environment, Family, Suite, Tool, solution_call
from harnessrl.tasks.grading import number_answer_ok, text_matches
from harnessrl.tasks.suites.pools import load_pools
from harnessrl.tasks.workspace import WORKSPACE_TOOLS

# -- word pools (package data: suites/data/workspace.json) ----------------------------------------

_POOLS = load_pools("workspace")
NAMES: list[str] = _POOLS["names"]
CITIES: list[str] = _POOLS["cities"]
NOUNS: list[str] = _POOLS["nouns"]
GROCERIES: list[str] = _POOLS["groceries"]
FOLDERS: list[str] = _POOLS["folders"]
WEEKDAYS: list[str] = _POOLS["weekdays"]
TEAMS: list[str] = _POOLS["teams"]
REGIONS: list[str] = _POOLS["regions"]
CATEGORIES: list[str] = _POOLS["categories"]
_SENTENCES: list[str] = _POOLS["sentences"]
_LOG_MESSAGES: list[str] = _POOLS["log_messages"]


def _sentence(rng: random.Random) -> str:
    return rng.choice(_SENTENCES).format(
        name=rng.choice(NAMES),
        city=rng.choice(CITIES),
        day=rng.choice(WEEKDAYS),
        hour=rng.randint(8, 18),
        n=rng.randint(2, 40),
        noun=rng.choice(NOUNS),
        team=rng.choice(TEAMS),
    )


def _paragraph(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(_sentence(rng) + "\n" for _ in range(rng.randint(lo, hi)))


# -- grading helpers ----------------------------------------------------------------------------


def _norm_lines(text: str | None) -> list[str] | None:
    """Lines with trailing whitespace and trailing blank lines removed (None stays None)."""
    if text is None:
        return None
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and lines[-1] == "":
        lines.pop()
    return lines


def _read(env: Environment, rel: str) -> str | None:
    """A workspace file's text, or None when it is missing, a directory or unreadable."""
    try:
        return env.workspace.read(rel)
    except Exception:
        return None


def _lines(env: Environment, rel: str) -> list[str] | None:
    return _norm_lines(_read(env, rel))


def _same(env: Environment, rel: str, expected: str) -> bool:
    got = _lines(env, rel)
    return got is not None and got == _norm_lines(expected)


def _gone(env: Environment, rel: str) -> bool:
    return not os.path.lexists(env.workspace.root / rel)


def _frac(flags: list[bool]) -> float:
    return sum(1.0 for f in flags if f) / len(flags) if flags else 1.0


# Checks that the agent left something alone. They earn credit only alongside progress on the
# task itself: an agent that does nothing keeps every file intact, and must not score for it.
PRESERVATION_CHECKS = frozenset({"kept", "others_kept", "source_kept", "others_unchanged"})


def _run_checks(checks: dict[str, Callable[[], float | bool]]) -> dict[str, float]:
    """Evaluate named checks; one that raises (garbled state) scores 0, values are clamped.
    Preservation checks count only when some other check has credit."""
    out: dict[str, float] = {}
    for name, fn in checks.items():
        try:
            value = float(fn())
        except Exception:
            value = 0.0
        out[name] = min(1.0, max(0.0, value)) if value == value else 0.0
    if not any(v > 0 for k, v in out.items() if k not in PRESERVATION_CHECKS):
        out.update({k: 0.0 for k in out if k in PRESERVATION_CHECKS})
    return out


def _setup_files(files: dict[str, str]) -> Callable[[Environment], None]:
    def setup(env: Environment) -> None:
        for rel, text in files.items():
            env.workspace.write(rel, text)

    return setup


# -- families -----------------------------------------------------------------------------------


def create_file(rng: random.Random) -> dict[str, Any]:
    path = f"{rng.choice(FOLDERS)}/{rng.choice(NOUNS)}_{rng.choice(NOUNS)}.{rng.choice(['txt', 'md'])}"
    content = _sentence(rng)

    def check(env: Environment) -> dict[str, float]:
        return _run_checks(
            {"exists": lambda: _read(env, path) is not None, "content": lambda: _same(env, path, content)}
        )

    return {
        "instruction": f"Create the file {path} containing exactly this one line:\n{content}",
        "setup": lambda env: None,
        "check": check,
        "solution": [
            solution_call("write_file", path=path, content=content + "\n"),
            solution_call("submit", answer=""),
        ],
        "data": {"path": path, "content": content},
    }


def append_line(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["shopping", "guests", "todo"])
    n = rng.randint(3, 6)
    if kind == "shopping":
        items = rng.sample(GROCERIES, n + 1)
    elif kind == "guests":
        items = rng.sample(NAMES, n + 1)
    else:
        items = [
            f"{v} {rng.choice(NAMES)} about the {noun} report"
            for v, noun in zip(rng.choices(["call", "email", "ask", "thank"], k=n + 1), rng.sample(NOUNS, n + 1))
        ]
    original, new = items[:n], items[n]
    path = f"{rng.choice(FOLDERS)}/{kind}.txt"
    text = "".join(x + "\n" for x in original)

    def check(env: Environment) -> dict[str, float]:
        def lines() -> list[str]:
            return _lines(env, path) or []

        return _run_checks(
            {
                "kept": lambda: lines()[:n] == original,
                "appended": lambda: bool(lines()) and lines()[-1] == new and lines().count(new) == 1,
            }
        )

    return {
        "instruction": f"Add the line '{new}' at the end of {path}. Keep all the existing lines as they are.",
        "setup": _setup_files({path: text}),
        "check": check,
        "solution": [solution_call("append_file", path=path, content=new + "\n"), solution_call("submit", answer="")],
        "data": {"path": path, "lines": original, "new": new},
    }


def rename_file(rng: random.Random) -> dict[str, Any]:
    folder = rng.choice(FOLDERS)
    ext = rng.choice(["txt", "md", "csv"])
    stems = rng.sample(NOUNS, rng.randint(2, 4) + 1)
    files = {f"{folder}/{s}.{ext}": _paragraph(rng, 1, 3) for s in stems[:-1]}
    src = rng.choice(sorted(files))
    if rng.random() < 0.5:
        dst = f"{folder}/{stems[-1]}.{ext}"
        instruction = f"Rename the file {src} to {dst}."
    else:
        dst = f"{folder}/old/{src.split('/')[-1]}"
        instruction = f"Move the file {src} into the folder {folder}/old/ (keep its name, so it becomes {dst})."
    others = {p: t for p, t in files.items() if p != src}

    def check(env: Environment) -> dict[str, float]:
        return _run_checks(
            {
                "renamed": lambda: _same(env, dst, files[src]),
                "old_gone": lambda: _gone(env, src),
                "others_kept": lambda: _frac([_same(env, p, t) for p, t in others.items()]),
            }
        )

    return {
        "instruction": instruction,
        "setup": _setup_files(files),
        "check": check,
        "solution": [solution_call("move_file", source=src, destination=dst), solution_call("submit", answer="")],
        "data": {"files": files, "source": src, "destination": dst},
    }


def delete_matching(rng: random.Random) -> dict[str, Any]:
    folder = rng.choice(["cache", "build", "backup", "downloads", "scratch", "exports"])
    stems = rng.sample(NOUNS, 8)
    n_match, n_keep = rng.randint(2, 4), rng.randint(2, 4)
    if rng.random() < 0.5:
        suffix = rng.choice([".tmp", ".bak", ".old"])
        rule = f"whose name ends with '{suffix}'"
        match = [f"{s}{suffix}" for s in stems[:n_match]]
        near = rng.choice([f"{stems[7]}{suffix}.txt", f"{stems[7]}_{suffix[1:]}.txt"])  # looks close, does not match
        keep = [f"{s}.{rng.choice(['txt', 'csv', 'md'])}" for s in stems[n_match : n_match + n_keep - 1]] + [near]
    else:
        prefix = rng.choice(["draft_", "old_", "copy_"])
        rule = f"whose name starts with '{prefix}'"
        match = [f"{prefix}{s}.{rng.choice(['txt', 'md'])}" for s in stems[:n_match]]
        near = f"{stems[7]}_{prefix[:-1]}.txt"
        keep = [f"{s}.{rng.choice(['txt', 'csv', 'md'])}" for s in stems[n_match : n_match + n_keep - 1]] + [near]
    names = match + keep
    rng.shuffle(names)
    files = {f"{folder}/{name}": _paragraph(rng, 1, 2) for name in names}
    doomed = [f"{folder}/{m}" for m in match]
    kept = {f"{folder}/{k}": files[f"{folder}/{k}"] for k in keep}

    def check(env: Environment) -> dict[str, float]:
        return _run_checks(
            {
                "deleted": lambda: _frac([_gone(env, p) for p in doomed]),
                "kept": lambda: _frac([_same(env, p, t) for p, t in kept.items()]),
            }
        )

    return {
        "instruction": f"Delete every file in {folder}/ {rule}. Do not delete or change any other file.",
        "setup": _setup_files(files),
        "check": check,
        "solution": [solution_call("list_dir", path=folder)]
        + [solution_call("delete_file", path=p) for p in sorted(doomed)]
        + [solution_call("submit", answer="")],
        "data": {"files": files, "rule": rule, "delete": sorted(doomed)},
    }


_EXT_CONTENT: dict[str, Callable[[random.Random], str]] = {
    "txt": lambda rng: _sentence(rng) + "\n",
    "csv": lambda rng: f"name,count\n{rng.choice(NOUNS)},{rng.randint(1, 99)}\n",
    "md": lambda rng: f"# {rng.choice(NOUNS).title()}\n\n{_sentence(rng)}\n",
    "json": lambda rng: json.dumps({"id": rng.randint(1, 999), "tag": rng.choice(NOUNS)}) + "\n",
    "log": lambda rng: f"INFO started {rng.choice(NOUNS)} job {rng.randint(1, 99)}\n",
}


def sort_by_extension(rng: random.Random) -> dict[str, Any]:
    folder = rng.choice(["downloads", "inbox", "desk", "incoming", "unsorted"])
    exts = rng.sample(sorted(_EXT_CONTENT), rng.randint(2, 3))
    n = rng.randint(4, 7)
    chosen = exts + [rng.choice(exts) for _ in range(n - len(exts))]  # every extension at least once
    rng.shuffle(chosen)
    stems = rng.sample(NOUNS, n)
    files = {f"{folder}/{s}.{e}": _EXT_CONTENT[e](rng) for s, e in zip(stems, chosen)}
    moves = {src: f"{folder}/{src.rsplit('.', 1)[1]}/{src.split('/')[-1]}" for src in sorted(files)}

    def check(env: Environment) -> dict[str, float]:
        return _run_checks(
            {
                "moved": lambda: _frac([_same(env, dst, files[src]) for src, dst in moves.items()]),
                "no_leftovers": lambda: _frac([_gone(env, src) for src in moves]),
            }
        )

    return {
        "instruction": (
            f"Move every file in {folder}/ into a subfolder of {folder}/ named after its extension. "
            f"For example, a file {folder}/example.pdf would go to {folder}/pdf/example.pdf."
        ),
        "setup": _setup_files(files),
        "check": check,
        "solution": [solution_call("list_dir", path=folder)]
        + [solution_call("move_file", source=s, destination=d) for s, d in moves.items()]
        + [solution_call("submit", answer="")],
        "data": {"files": files},
    }


def copy_content(rng: random.Random) -> dict[str, Any]:
    f1, f2 = rng.sample(FOLDERS, 2)
    n1, n2 = rng.sample(NOUNS, 2)
    src, dst = f"{f1}/{n1}.txt", f"{f2}/{n2}_copy.txt"
    text = _paragraph(rng, 2, 4)

    def check(env: Environment) -> dict[str, float]:
        return _run_checks({"copied": lambda: _same(env, dst, text), "source_kept": lambda: _same(env, src, text)})

    return {
        "instruction": f"Copy the content of {src} into a new file {dst}. Keep {src} unchanged.",
        "setup": _setup_files({src: text}),
        "check": check,
        "solution": [
            solution_call("read_file", path=src),
            solution_call("write_file", path=dst, content=text),
            solution_call("submit", answer=""),
        ],
        "data": {"source": src, "destination": dst, "text": text},
        "required_observations": ["read_file"],
    }


def csv_report(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.5:
        name, header, key_col, keys, value_col = "sales", "date,region,amount", "region", REGIONS, "amount"
    else:
        name, header, key_col, keys, value_col = "expenses", "date,category,cost", "category", CATEGORIES, "cost"
    n = rng.randint(4, 8)
    rows = []
    for _ in range(n):
        rows.append((f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}", rng.choice(keys), rng.randint(10, 500)))
    rows.sort()
    mode = rng.choice(["total", "average", "total_for"])
    values = [v for _, _, v in rows]
    if mode == "total":
        expected = float(sum(values))
        label = f"Total {value_col}"
        what = f"the total of the '{value_col}' column"
        shown = str(sum(values))
    elif mode == "average":
        avg = sum(values) / len(values)
        expected = avg
        label = f"Average {value_col}"
        what = f"the average of the '{value_col}' column, rounded to 2 decimals"
        shown = f"{avg:.2f}"
    else:
        key = rng.choice(sorted({k for _, k, _ in rows}))
        total = sum(v for _, k, v in rows if k == key)
        expected = float(total)
        label = f"Total {value_col} for {key}"
        what = f"the total of the '{value_col}' column over the rows whose {key_col} is {key}"
        shown = str(total)
    csv_path = f"data/{name}_{rng.choice(NOUNS)}.csv"
    out = f"reports/{name}_{mode}.txt"
    text = header + "\n" + "".join(f"{d},{k},{v}\n" for d, k, v in rows)
    line_re = re.compile(r"^" + re.escape(label) + r":\s*-?\d+(?:\.\d+)?$")

    def check(env: Environment) -> dict[str, float]:
        def label_value() -> bool:
            for line in _lines(env, out) or []:
                if line.strip().lower().startswith(label.lower()):
                    return number_answer_ok(line.strip()[len(label) :], expected)
            return False

        def one_line() -> bool:
            lines = [ln.strip() for ln in _lines(env, out) or [] if ln.strip()]
            return len(lines) == 1 and bool(line_re.match(lines[0]))

        return _run_checks(
            {"exists": lambda: bool((_read(env, out) or "").strip()), "format": one_line, "value": label_value}
        )

    return {
        "instruction": (
            f"Read {csv_path}. Compute {what}, and write it to {out} as a single line in the form '{label}: <number>'."
        ),
        "setup": _setup_files({csv_path: text}),
        "check": check,
        "solution": [
            solution_call("read_file", path=csv_path),
            solution_call("write_file", path=out, content=f"{label}: {shown}\n"),
            solution_call("submit", answer=""),
        ],
        "data": {"csv": csv_path, "text": text, "mode": mode, "out": out, "label": label, "expected": expected},
        "required_observations": ["read_file"],
    }


def fix_config(rng: random.Random) -> dict[str, Any]:
    services = rng.sample(
        ["api", "web", "worker", "scheduler", "billing", "search", "mailer", "auth"], rng.randint(3, 5)
    )
    kind = rng.choice(["host", "port", "url", "email"])
    noun = rng.choice(NOUNS)
    if kind == "host":
        key, old, new = "db_host", f"db-{noun}-old.internal", f"db-{noun}.internal"
    elif kind == "port":
        key, (old, new) = (
            "db_port",
            rng.choice([("5433", "5432"), ("3307", "3306"), ("6380", "6379"), ("8081", "8080")]),
        )
    elif kind == "url":
        v = rng.randint(1, 3)
        key, old, new = "api_url", f"http://{noun}.example.com/v{v}", f"http://{noun}.example.com/v{v + 1}"
    else:
        who = rng.choice(NAMES).lower()
        key, old, new = "admin_email", f"{who}@old-{noun}.example", f"{who}@{noun}.example"
    n_bad = rng.randint(2, len(services) - 1)
    bad = rng.sample(services, n_bad)
    files: dict[str, str] = {}
    fixed: dict[str, str] = {}
    for svc in services:
        lines = [
            f"name = {svc}",
            f"log_level = {rng.choice(['info', 'debug', 'warning'])}",
            f"workers = {rng.randint(1, 16)}",
            f"timeout = {rng.randint(10, 120)}",
        ]
        lines = rng.sample(lines, rng.randint(2, 4))
        if svc in bad:
            lines.insert(rng.randint(0, len(lines)), f"{key} = {old}")
        elif rng.random() < 0.5:
            lines.insert(rng.randint(0, len(lines)), f"{key} = {new}")
        text = "".join(ln + "\n" for ln in lines)
        path = f"config/{svc}.ini"
        files[path] = text
        if svc in bad:
            fixed[path] = text.replace(old, new)
    clean = {p: t for p, t in files.items() if p not in fixed}

    def check(env: Environment) -> dict[str, float]:
        def no_old() -> bool:
            under = [p for p in env.workspace.files() if p.startswith("config/")]
            return bool(under) and all(old not in (_read(env, p) or "") for p in under)

        return _run_checks(
            {
                "fixed": lambda: _frac([_same(env, p, t) for p, t in fixed.items()]),
                "others_unchanged": lambda: _frac([_same(env, p, t) for p, t in clean.items()]),
                "no_old_value": no_old,
            }
        )

    solution = [solution_call("search_text", query=old, path="config")]
    for p in sorted(fixed):
        solution += [solution_call("read_file", path=p), solution_call("write_file", path=p, content=fixed[p])]
    return {
        "instruction": (
            f"Some files in config/ use the wrong value '{old}'. Replace it with '{new}' in every file "
            "under config/ and change nothing else."
        ),
        "setup": _setup_files(files),
        "check": check,
        "solution": solution + [solution_call("submit", answer="")],
        "data": {"files": files, "old": old, "new": new},
        "required_observations": ["read_file"],
    }


def rename_by_rule(rng: random.Random) -> dict[str, Any]:
    folder = rng.choice(["photos", "scans", "invoices", "slides", "recordings"])
    n = rng.randint(3, 5)
    rule = rng.choice(["prefix", "lowercase", "spaces"])
    ext = rng.choice(["txt", "md", "csv"])
    if rule == "prefix":
        date = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        names = [f"{s}.{ext}" for s in rng.sample(NOUNS, n)]
        new_names = [f"{date}_{x}" for x in names]
        instruction = (
            f"Rename every file in {folder}/ by adding the prefix '{date}_' to its name. "
            f"For example, {folder}/a.txt would become {folder}/{date}_a.txt."
        )
    elif rule == "lowercase":
        names = []
        for a, b in zip(rng.sample(NOUNS, n), rng.sample(NOUNS, n)):
            parts = [rng.choice([str.upper, str.title])(a), rng.choice([str.upper, str.title, str.lower])(b)]
            names.append(f"{parts[0]}_{parts[1]}.{rng.choice([ext, ext.upper()])}")
        new_names = [x.lower() for x in names]
        instruction = (
            f"Rename every file in {folder}/ so that its name is all lowercase. "
            f"For example, {folder}/My_File.TXT would become {folder}/my_file.txt."
        )
    else:
        names = [" ".join(rng.sample(NOUNS, rng.randint(2, 3))) + f".{ext}" for _ in range(n)]
        names = sorted(set(names))
        new_names = [x.replace(" ", "_") for x in names]
        instruction = (
            f"Rename every file in {folder}/ by replacing each space in its name with an underscore (_). "
            f"For example, '{folder}/my file.txt' would become '{folder}/my_file.txt'."
        )
    files = {f"{folder}/{x}": _sentence(rng) + "\n" for x in names}
    moves = {f"{folder}/{a}": f"{folder}/{b}" for a, b in zip(names, new_names)}

    def check(env: Environment) -> dict[str, float]:
        return _run_checks(
            {
                "renamed": lambda: _frac([_same(env, dst, files[src]) for src, dst in moves.items()]),
                "old_gone": lambda: _frac([_gone(env, src) for src in moves]),
            }
        )

    return {
        "instruction": instruction,
        "setup": _setup_files(files),
        "check": check,
        "solution": [solution_call("list_dir", path=folder)]
        + [solution_call("move_file", source=s, destination=d) for s, d in moves.items()]
        + [solution_call("submit", answer="")],
        "data": {"files": files, "rule": rule, "moves": moves},
    }


def merge_lists(rng: random.Random) -> dict[str, Any]:
    folder = rng.choice(FOLDERS)
    pool = rng.sample(NOUNS, 14)
    n_common = rng.randint(1, 3)
    common = pool[:n_common]
    only_a = pool[n_common : n_common + rng.randint(3, 5)]
    only_b = pool[n_common + 5 : n_common + 5 + rng.randint(3, 5)]
    a, b = common + only_a, common + only_b
    rng.shuffle(a)
    rng.shuffle(b)
    pa, pb = rng.sample(["first", "second", "mine", "yours", "old", "new", "left", "right"], 2)
    path_a, path_b, out = f"{folder}/{pa}.txt", f"{folder}/{pb}.txt", f"{folder}/merged.txt"
    expected = sorted(set(a) | set(b))

    def check(env: Environment) -> dict[str, float]:
        def items() -> list[str]:
            return [ln.strip() for ln in _lines(env, out) or [] if ln.strip()]

        return _run_checks(
            {
                "items": lambda: sorted(set(items())) == expected,
                "sorted_unique": lambda: items() == expected,
            }
        )

    return {
        "instruction": (
            f"Merge the lists in {path_a} and {path_b} into a new file {out}: one item per line, "
            "each item only once, sorted alphabetically."
        ),
        "setup": _setup_files({path_a: "".join(x + "\n" for x in a), path_b: "".join(x + "\n" for x in b)}),
        "check": check,
        "solution": [
            solution_call("read_file", path=path_a),
            solution_call("read_file", path=path_b),
            solution_call("write_file", path=out, content="".join(x + "\n" for x in expected)),
            solution_call("submit", answer=""),
        ],
        "data": {"a": a, "b": b, "out": out, "paths": [path_a, path_b]},
        "required_observations": ["read_file"],
    }


def extract_lines(rng: random.Random) -> dict[str, Any]:
    components = ["api", "db", "cache", "auth", "queue"]
    levels = ["INFO", "DEBUG", "WARN", "ERROR"]
    mode = rng.choice(["ERROR", "WARN", "component"])
    pattern = mode if mode != "component" else f"[{rng.choice(components)}]"
    day = rng.randint(1, 28)
    entries: list[list[str]] = []  # [stamp, level, component, message]
    t = rng.randint(0, 3600 * 20)
    for _ in range(rng.randint(8, 14)):
        t += rng.randint(1, 400)
        msg = rng.choice(_LOG_MESSAGES).format(
            n=rng.randint(1, 999), user=rng.choice(NAMES).lower(), noun=rng.choice(NOUNS)
        )
        stamp = f"2024-05-{day:02d} {t // 3600:02d}:{t % 3600 // 60:02d}:{t % 60:02d}"
        entries.append([stamp, rng.choice(["INFO", "INFO", "DEBUG", "WARN", "ERROR"]), rng.choice(components), msg])
    field = 1 if mode != "component" else 2
    wanted = pattern if mode != "component" else pattern[1:-1]
    # at least two lines to extract and two to leave behind
    chosen = set(rng.sample(range(len(entries)), 2))
    for i in sorted(chosen):
        entries[i][field] = wanted
    others = [i for i in range(len(entries)) if entries[i][field] != wanted]
    while len(others) < 2:
        i = rng.choice([j for j in range(len(entries)) if j not in chosen and j not in others])
        entries[i][field] = rng.choice([x for x in (levels if field == 1 else components) if x != wanted])
        others.append(i)
    lines = [f"{s} {lvl} [{c}] {m}" for s, lvl, c, m in entries]
    matching = [ln for ln in lines if pattern in ln]
    log = f"logs/{rng.choice(['app', 'server', 'worker', 'gateway'])}.log"
    out = f"logs/{rng.choice(NOUNS)}_{'component' if mode == 'component' else mode.lower()}.txt"

    def check(env: Environment) -> dict[str, float]:
        def got() -> list[str]:
            return [ln for ln in _lines(env, out) or [] if ln.strip()]

        return _run_checks(
            {
                "recall": lambda: _frac([m in got() for m in matching]),
                "precision": lambda: bool(got()) and _frac([g in matching for g in got()]),
                "exact": lambda: got() == matching,
            }
        )

    return {
        "instruction": (
            f"Copy every line of {log} that contains '{pattern}' into a new file {out}, keeping their "
            "order. Do not write any other line."
        ),
        "setup": _setup_files({log: "".join(ln + "\n" for ln in lines)}),
        "check": check,
        "solution": [
            solution_call("read_file", path=log),
            solution_call("write_file", path=out, content="".join(m + "\n" for m in matching)),
            solution_call("submit", answer=""),
        ],
        "data": {"log": log, "lines": lines, "pattern": pattern, "out": out},
        "required_observations": ["read_file"],
    }


def count_text(rng: random.Random) -> dict[str, Any]:
    mode = rng.choice(["lines", "words"])
    path = f"{rng.choice(FOLDERS)}/{rng.choice(NOUNS)}.txt"
    text = _paragraph(rng, 3, 12) if mode == "lines" else _paragraph(rng, 1, 3)
    n = len(text.splitlines()) if mode == "lines" else len(text.split())
    out = f"{path.rsplit('.', 1)[0]}_{mode}.txt"
    what = "the lines" if mode == "lines" else "the words (separated by spaces or line breaks)"

    def check(env: Environment) -> dict[str, float]:
        def body() -> str:
            return (_read(env, out) or "").strip()

        return _run_checks(
            {
                "number": lambda: number_answer_ok(body(), n),
                "format": lambda: re.fullmatch(r"\d+", body()) is not None,
            }
        )

    return {
        "instruction": f"Count {what} in {path} and write only that number to {out}.",
        "setup": _setup_files({path: text}),
        "check": check,
        "solution": [
            solution_call("read_file", path=path),
            solution_call("write_file", path=out, content=f"{n}\n"),
            solution_call("submit", answer=""),
        ],
        "data": {"path": path, "text": text, "mode": mode, "out": out},
        "required_observations": ["read_file"],
    }


def answer_from_file(rng: random.Random) -> dict[str, Any]:
    names = rng.sample(NAMES, rng.randint(5, 8))
    teams = rng.sample(TEAMS, 3)
    rows = [(nm, rng.choice(teams), rng.choice(CITIES), rng.randint(2010, 2024)) for nm in names]
    path = f"{rng.choice(['team', 'hr', 'company'])}/staff.csv"
    text = "name,team,city,start_year\n" + "".join(f"{a},{b},{c},{d}\n" for a, b, c, d in rows)
    kind = rng.choice(["city", "year", "count"])
    who = rng.choice(rows)
    if kind == "city":
        question, expected = f"In which city does {who[0]} work?", who[2]
        cities = sorted({r[2] for r in rows})

        def ok(answer: str | None) -> bool:
            return text_matches(answer, who[2], cities)
    elif kind == "year":
        question, expected = f"In which year did {who[0]} start?", str(who[3])

        def ok(answer: str | None) -> bool:
            return number_answer_ok(answer, who[3])
    else:
        team = who[1]
        count = sum(1 for r in rows if r[1] == team)
        question, expected = f"How many people are in the {team} team?", str(count)

        def ok(answer: str | None) -> bool:
            return number_answer_ok(answer, count)

    def check(env: Environment) -> dict[str, float]:
        return _run_checks({"answer": lambda: ok(env.answer)})

    return {
        "instruction": f"Read {path} and answer: {question} Give the answer with the submit tool (answer=...).",
        "setup": _setup_files({path: text}),
        "check": check,
        "solution": [solution_call("read_file", path=path), solution_call("submit", answer=expected)],
        "data": {"path": path, "text": text, "question": question, "expected": expected},
        "required_observations": ["read_file"],
    }


def find_file(rng: random.Random) -> dict[str, Any]:
    folder = rng.choice(["notes", "mail", "tickets", "orders"])
    prefix = rng.choice(["INV", "ORD", "TKT", "REF"])
    n = rng.randint(4, 6)
    stems = rng.sample(NOUNS, n)
    codes = [f"{prefix}-{c}" for c in rng.sample(range(10000, 99999), n)]
    files = {}
    for stem, code in zip(stems, codes):
        lines = [_sentence(rng) for _ in range(rng.randint(1, 3))]
        lines.insert(rng.randint(0, len(lines)), f"Reference: {code}")
        files[f"{folder}/{stem}.txt"] = "".join(ln + "\n" for ln in lines)
    target_i = rng.randrange(n)
    code, target = codes[target_i], f"{stems[target_i]}.txt"
    names = [f"{s}.txt" for s in stems]

    def ok(answer: str | None) -> bool:
        tokens = re.split(r"[\s,;:\"'`()\[\]]+", (answer or "").strip().lower())
        base = {t.rstrip(".").split("/")[-1] for t in tokens if t}
        base |= {b + ".txt" for b in list(base)}  # "maple" for "maple.txt" is fine too
        return target in base and not any(x in base for x in names if x != target)

    def check(env: Environment) -> dict[str, float]:
        return _run_checks({"answer": lambda: ok(env.answer)})

    return {
        "instruction": (
            f"Exactly one file in {folder}/ mentions the reference {code}. Which file is it? Submit its file "
            "name (for example 'note.txt') with the submit tool."
        ),
        "setup": _setup_files(files),
        "check": check,
        "solution": [solution_call("search_text", query=code, path=folder), solution_call("submit", answer=target)],
        "data": {"files": files, "code": code, "target": target},
    }


def json_update(rng: random.Random) -> dict[str, Any]:
    options: dict[str, Callable[[], Any]] = {
        "app_name": lambda: f"{rng.choice(NOUNS)}-{rng.choice(NOUNS)}",
        "version": lambda: f"{rng.randint(0, 3)}.{rng.randint(0, 9)}.{rng.randint(0, 9)}",
        "debug": lambda: rng.random() < 0.5,
        "max_users": lambda: rng.randint(2, 60) * 10,
        "theme": lambda: rng.choice(["dark", "light", "solarized", "contrast"]),
        "language": lambda: rng.choice(["en", "de", "fr", "es", "pt", "ja"]),
        "retries": lambda: rng.randint(0, 9),
        "timeout_s": lambda: rng.randint(5, 120),
    }
    keys = rng.sample(list(options), rng.randint(5, 8))
    settings = {k: options[k]() for k in keys}
    changeable = [k for k in keys if k != "app_name"]
    to_change = rng.sample(changeable, rng.randint(1, 2))
    changes: dict[str, Any] = {}
    for k in to_change:
        value = settings[k]
        while json.dumps(value) == json.dumps(settings[k]):
            value = (not settings[k]) if isinstance(settings[k], bool) else options[k]()
        changes[k] = value
    final = {**settings, **changes}
    path = f"{rng.choice(['app', 'service', 'tool', 'site'])}/settings.json"

    def check(env: Environment) -> dict[str, float]:
        def loaded() -> dict[str, Any]:
            data = json.loads(_read(env, path) or "")
            if not isinstance(data, dict):
                raise ValueError("not an object")
            return data

        def same(a: Any, b: Any) -> bool:
            return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)

        def others() -> bool:
            data = loaded()
            return sorted(data) == sorted(final) and all(
                same(data[k], settings[k]) for k in settings if k not in changes
            )

        return _run_checks(
            {
                "updated": lambda: _frac([k in loaded() and same(loaded()[k], v) for k, v in changes.items()]),
                "others_kept": others,
            }
        )

    wanted = " and ".join(f'"{k}" to {json.dumps(v)}' for k, v in changes.items())
    return {
        "instruction": f"In {path}, set {wanted}. Keep every other setting unchanged and keep the file valid JSON.",
        "setup": _setup_files({path: json.dumps(settings, indent=2) + "\n"}),
        "check": check,
        "solution": [
            solution_call("read_file", path=path),
            solution_call("write_file", path=path, content=json.dumps(final, indent=2) + "\n"),
            solution_call("submit", answer=""),
        ],
        "data": {"path": path, "settings": settings, "changes": changes},
        "required_observations": ["read_file"],
    }


def scaffold_project(rng: random.Random) -> dict[str, Any]:
    a, b = rng.sample(NOUNS, 2)
    name = f"{a}-{b}"
    title = f"{a.title()} {b.title()}"
    greeting = f"{rng.choice(['Hello', 'Hi', 'Welcome', 'Greetings'])} from {title}"
    version = f"{rng.randint(0, 2)}.{rng.randint(0, 9)}.{rng.randint(0, 9)}"
    files = {
        f"{name}/README.md": f"# {title}",
        f"{name}/src/main.py": f'print("{greeting}")',
        f"{name}/config.ini": f"version = {version}",
    }
    paths = list(files)

    def check(env: Environment) -> dict[str, float]:
        return _run_checks(
            {
                "readme": lambda: _same(env, paths[0], files[paths[0]]),
                "main": lambda: _same(env, paths[1], files[paths[1]]),
                "config": lambda: _same(env, paths[2], files[paths[2]]),
            }
        )

    listing = "\n".join(f"- {p} containing the line: {t}" for p, t in files.items())
    return {
        "instruction": f"Create a small project in the folder {name}/ with these three files, "
        f"one line each:\n{listing}",
        "setup": lambda env: None,
        "check": check,
        "solution": [solution_call("write_file", path=p, content=t + "\n") for p, t in files.items()]
        + [solution_call("submit", answer="")],
        "data": {"files": files},
    }


FAMILIES: dict[str, Family] = {
    "create_file": create_file,
    "append_line": append_line,
    "rename_file": rename_file,
    "delete_matching": delete_matching,
    "sort_by_extension": sort_by_extension,
    "copy_content": copy_content,
    "csv_report": csv_report,
    "fix_config": fix_config,
    "rename_by_rule": rename_by_rule,
    "merge_lists": merge_lists,
    "extract_lines": extract_lines,
    "count_text": count_text,
    "answer_from_file": answer_from_file,
    "find_file": find_file,
    "json_update": json_update,
    "scaffold_project": scaffold_project,
}


class WorkspaceSuite(Suite):
    """File-system tasks (ClawGym style), graded on the final workspace state."""

    name = "workspace"
    description = "File-system tasks in a sandboxed workspace, graded on the files left behind."
    split_sizes = {"train": 2000, "dev": 48, "test": 72}
    pass_threshold = 1.0
    needs_workspace = True

    def families(self) -> dict[str, Family]:
        return dict(FAMILIES)

    def base_tools(self) -> list[Tool]:
        return list(WORKSPACE_TOOLS)
