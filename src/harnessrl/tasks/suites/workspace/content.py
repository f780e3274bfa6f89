"""`workspace` families that read files and write what they compute (reports, fixed configs,
merged lists, extracted lines, counts, JSON edits) or answer a question about them."""

from __future__ import annotations

import json
import random
import re
from typing import Any, Callable

from harnessrl.tasks.base import Environment, TaskParts, solution_call
from harnessrl.tasks.grading import number_answer_ok, text_matches
from harnessrl.tasks.suites.workspace.checks import (
    fraction,
    read_lines,
    read_text,
    run_checks,
    same_text,
    setup_files,
)
from harnessrl.tasks.suites.workspace.text import (
    CATEGORIES,
    CITIES,
    FOLDERS,
    LOG_MESSAGES,
    NAMES,
    NOUNS,
    REGIONS,
    TEAMS,
    paragraph,
    sentence,
)


def csv_report(rng: random.Random) -> TaskParts:
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
            for line in read_lines(env, out) or []:
                if line.strip().lower().startswith(label.lower()):
                    return number_answer_ok(line.strip()[len(label) :], expected)
            return False

        def one_line() -> bool:
            lines = [ln.strip() for ln in read_lines(env, out) or [] if ln.strip()]
            return len(lines) == 1 and bool(line_re.match(lines[0]))

        return run_checks(
            {"exists": lambda: bool((read_text(env, out) or "").strip()), "format": one_line, "value": label_value}
        )

    return {
        "instruction": (
            f"Read {csv_path}. Compute {what}, and write it to {out} as a single line in the form '{label}: <number>'."
        ),
        "setup": setup_files({csv_path: text}),
        "check": check,
        "solution": [
            solution_call("read_file", path=csv_path),
            solution_call("write_file", path=out, content=f"{label}: {shown}\n"),
            solution_call("submit", answer=""),
        ],
        "data": {"csv": csv_path, "text": text, "mode": mode, "out": out, "label": label, "expected": expected},
        "required_observations": ["read_file"],
    }


def fix_config(rng: random.Random) -> TaskParts:
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
            under = [p for p in env.require_workspace().files() if p.startswith("config/")]
            return bool(under) and all(old not in (read_text(env, p) or "") for p in under)

        return run_checks(
            {
                "fixed": lambda: fraction([same_text(env, p, t) for p, t in fixed.items()]),
                "others_unchanged": lambda: fraction([same_text(env, p, t) for p, t in clean.items()]),
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
        "setup": setup_files(files),
        "check": check,
        "solution": solution + [solution_call("submit", answer="")],
        "data": {"files": files, "old": old, "new": new},
        "required_observations": ["read_file"],
    }


def merge_lists(rng: random.Random) -> TaskParts:
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
            return [ln.strip() for ln in read_lines(env, out) or [] if ln.strip()]

        return run_checks(
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
        "setup": setup_files({path_a: "".join(x + "\n" for x in a), path_b: "".join(x + "\n" for x in b)}),
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


def extract_lines(rng: random.Random) -> TaskParts:
    components = ["api", "db", "cache", "auth", "queue"]
    levels = ["INFO", "DEBUG", "WARN", "ERROR"]
    mode = rng.choice(["ERROR", "WARN", "component"])
    pattern = mode if mode != "component" else f"[{rng.choice(components)}]"
    day = rng.randint(1, 28)
    entries: list[list[str]] = []  # [stamp, level, component, message]
    t = rng.randint(0, 3600 * 20)
    for _ in range(rng.randint(8, 14)):
        t += rng.randint(1, 400)
        msg = rng.choice(LOG_MESSAGES).format(
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
            return [ln for ln in read_lines(env, out) or [] if ln.strip()]

        return run_checks(
            {
                "recall": lambda: fraction([m in got() for m in matching]),
                "precision": lambda: bool(got()) and fraction([g in matching for g in got()]),
                "exact": lambda: got() == matching,
            }
        )

    return {
        "instruction": (
            f"Copy every line of {log} that contains '{pattern}' into a new file {out}, keeping their "
            "order. Do not write any other line."
        ),
        "setup": setup_files({log: "".join(ln + "\n" for ln in lines)}),
        "check": check,
        "solution": [
            solution_call("read_file", path=log),
            solution_call("write_file", path=out, content="".join(m + "\n" for m in matching)),
            solution_call("submit", answer=""),
        ],
        "data": {"log": log, "lines": lines, "pattern": pattern, "out": out},
        "required_observations": ["read_file"],
    }


def count_text(rng: random.Random) -> TaskParts:
    mode = rng.choice(["lines", "words"])
    path = f"{rng.choice(FOLDERS)}/{rng.choice(NOUNS)}.txt"
    text = paragraph(rng, 3, 12) if mode == "lines" else paragraph(rng, 1, 3)
    n = len(text.splitlines()) if mode == "lines" else len(text.split())
    out = f"{path.rsplit('.', 1)[0]}_{mode}.txt"
    what = "the lines" if mode == "lines" else "the words (separated by spaces or line breaks)"

    def check(env: Environment) -> dict[str, float]:
        def body() -> str:
            return (read_text(env, out) or "").strip()

        return run_checks(
            {
                "number": lambda: number_answer_ok(body(), n),
                "format": lambda: re.fullmatch(r"\d+", body()) is not None,
            }
        )

    return {
        "instruction": f"Count {what} in {path} and write only that number to {out}.",
        "setup": setup_files({path: text}),
        "check": check,
        "solution": [
            solution_call("read_file", path=path),
            solution_call("write_file", path=out, content=f"{n}\n"),
            solution_call("submit", answer=""),
        ],
        "data": {"path": path, "text": text, "mode": mode, "out": out},
        "required_observations": ["read_file"],
    }


def answer_from_file(rng: random.Random) -> TaskParts:
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
        return run_checks({"answer": lambda: ok(env.answer)})

    return {
        "instruction": f"Read {path} and answer: {question} Give the answer with the submit tool (answer=...).",
        "setup": setup_files({path: text}),
        "check": check,
        "solution": [solution_call("read_file", path=path), solution_call("submit", answer=expected)],
        "data": {"path": path, "text": text, "question": question, "expected": expected},
        "required_observations": ["read_file"],
    }


def find_file(rng: random.Random) -> TaskParts:
    folder = rng.choice(["notes", "mail", "tickets", "orders"])
    prefix = rng.choice(["INV", "ORD", "TKT", "REF"])
    n = rng.randint(4, 6)
    stems = rng.sample(NOUNS, n)
    codes = [f"{prefix}-{c}" for c in rng.sample(range(10000, 99999), n)]
    files = {}
    for stem, code in zip(stems, codes):
        lines = [sentence(rng) for _ in range(rng.randint(1, 3))]
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
        return run_checks({"answer": lambda: ok(env.answer)})

    return {
        "instruction": (
            f"Exactly one file in {folder}/ mentions the reference {code}. Which file is it? Submit its file "
            "name (for example 'note.txt') with the submit tool."
        ),
        "setup": setup_files(files),
        "check": check,
        "solution": [solution_call("search_text", query=code, path=folder), solution_call("submit", answer=target)],
        "data": {"files": files, "code": code, "target": target},
    }


def json_update(rng: random.Random) -> TaskParts:
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
            data = json.loads(read_text(env, path) or "")
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

        return run_checks(
            {
                "updated": lambda: fraction([k in loaded() and same(loaded()[k], v) for k, v in changes.items()]),
                "others_kept": others,
            }
        )

    wanted = " and ".join(f'"{k}" to {json.dumps(v)}' for k, v in changes.items())
    return {
        "instruction": f"In {path}, set {wanted}. Keep every other setting unchanged and keep the file valid JSON.",
        "setup": setup_files({path: json.dumps(settings, indent=2) + "\n"}),
        "check": check,
        "solution": [
            solution_call("read_file", path=path),
            solution_call("write_file", path=path, content=json.dumps(final, indent=2) + "\n"),
            solution_call("submit", answer=""),
        ],
        "data": {"path": path, "settings": settings, "changes": changes},
        "required_observations": ["read_file"],
    }
