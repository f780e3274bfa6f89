"""`workspace` families that create, move, rename and delete files (graded on which files exist
where, with what text)."""

from __future__ import annotations

import json
import random
from typing import Callable

from harnessrl.tasks.base import Environment, TaskParts, solution_call
from harnessrl.tasks.suites.workspace.checks import (
    fraction,
    gone,
    read_lines,
    read_text,
    run_checks,
    same_text,
    setup_files,
)
from harnessrl.tasks.suites.workspace.text import (
    FOLDERS,
    GROCERIES,
    NAMES,
    NOUNS,
    paragraph,
    sentence,
)


def create_file(rng: random.Random) -> TaskParts:
    path = f"{rng.choice(FOLDERS)}/{rng.choice(NOUNS)}_{rng.choice(NOUNS)}.{rng.choice(['txt', 'md'])}"
    content = sentence(rng)

    def check(env: Environment) -> dict[str, float]:
        return run_checks(
            {"exists": lambda: read_text(env, path) is not None, "content": lambda: same_text(env, path, content)}
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


def append_line(rng: random.Random) -> TaskParts:
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
            return read_lines(env, path) or []

        return run_checks(
            {
                "kept": lambda: lines()[:n] == original,
                "appended": lambda: bool(lines()) and lines()[-1] == new and lines().count(new) == 1,
            }
        )

    return {
        "instruction": f"Add the line '{new}' at the end of {path}. Keep all the existing lines as they are.",
        "setup": setup_files({path: text}),
        "check": check,
        "solution": [solution_call("append_file", path=path, content=new + "\n"), solution_call("submit", answer="")],
        "data": {"path": path, "lines": original, "new": new},
    }


def rename_file(rng: random.Random) -> TaskParts:
    folder = rng.choice(FOLDERS)
    ext = rng.choice(["txt", "md", "csv"])
    stems = rng.sample(NOUNS, rng.randint(2, 4) + 1)
    files = {f"{folder}/{s}.{ext}": paragraph(rng, 1, 3) for s in stems[:-1]}
    src = rng.choice(sorted(files))
    if rng.random() < 0.5:
        dst = f"{folder}/{stems[-1]}.{ext}"
        instruction = f"Rename the file {src} to {dst}."
    else:
        dst = f"{folder}/old/{src.split('/')[-1]}"
        instruction = f"Move the file {src} into the folder {folder}/old/ (keep its name, so it becomes {dst})."
    others = {p: t for p, t in files.items() if p != src}

    def check(env: Environment) -> dict[str, float]:
        return run_checks(
            {
                "renamed": lambda: same_text(env, dst, files[src]),
                "old_gone": lambda: gone(env, src),
                "others_kept": lambda: fraction([same_text(env, p, t) for p, t in others.items()]),
            }
        )

    return {
        "instruction": instruction,
        "setup": setup_files(files),
        "check": check,
        "solution": [solution_call("move_file", source=src, destination=dst), solution_call("submit", answer="")],
        "data": {"files": files, "source": src, "destination": dst},
    }


def delete_matching(rng: random.Random) -> TaskParts:
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
    files = {f"{folder}/{name}": paragraph(rng, 1, 2) for name in names}
    doomed = [f"{folder}/{m}" for m in match]
    kept = {f"{folder}/{k}": files[f"{folder}/{k}"] for k in keep}

    def check(env: Environment) -> dict[str, float]:
        return run_checks(
            {
                "deleted": lambda: fraction([gone(env, p) for p in doomed]),
                "kept": lambda: fraction([same_text(env, p, t) for p, t in kept.items()]),
            }
        )

    return {
        "instruction": f"Delete every file in {folder}/ {rule}. Do not delete or change any other file.",
        "setup": setup_files(files),
        "check": check,
        "solution": [solution_call("list_dir", path=folder)]
        + [solution_call("delete_file", path=p) for p in sorted(doomed)]
        + [solution_call("submit", answer="")],
        "data": {"files": files, "rule": rule, "delete": sorted(doomed)},
    }


_EXT_CONTENT: dict[str, Callable[[random.Random], str]] = {
    "txt": lambda rng: sentence(rng) + "\n",
    "csv": lambda rng: f"name,count\n{rng.choice(NOUNS)},{rng.randint(1, 99)}\n",
    "md": lambda rng: f"# {rng.choice(NOUNS).title()}\n\n{sentence(rng)}\n",
    "json": lambda rng: json.dumps({"id": rng.randint(1, 999), "tag": rng.choice(NOUNS)}) + "\n",
    "log": lambda rng: f"INFO started {rng.choice(NOUNS)} job {rng.randint(1, 99)}\n",
}


def sort_by_extension(rng: random.Random) -> TaskParts:
    folder = rng.choice(["downloads", "inbox", "desk", "incoming", "unsorted"])
    exts = rng.sample(sorted(_EXT_CONTENT), rng.randint(2, 3))
    n = rng.randint(4, 7)
    chosen = exts + [rng.choice(exts) for _ in range(n - len(exts))]  # every extension at least once
    rng.shuffle(chosen)
    stems = rng.sample(NOUNS, n)
    files = {f"{folder}/{s}.{e}": _EXT_CONTENT[e](rng) for s, e in zip(stems, chosen)}
    moves = {src: f"{folder}/{src.rsplit('.', 1)[1]}/{src.split('/')[-1]}" for src in sorted(files)}

    def check(env: Environment) -> dict[str, float]:
        return run_checks(
            {
                "moved": lambda: fraction([same_text(env, dst, files[src]) for src, dst in moves.items()]),
                "no_leftovers": lambda: fraction([gone(env, src) for src in moves]),
            }
        )

    return {
        "instruction": (
            f"Move every file in {folder}/ into a subfolder of {folder}/ named after its extension. "
            f"For example, a file {folder}/example.pdf would go to {folder}/pdf/example.pdf."
        ),
        "setup": setup_files(files),
        "check": check,
        "solution": [solution_call("list_dir", path=folder)]
        + [solution_call("move_file", source=s, destination=d) for s, d in moves.items()]
        + [solution_call("submit", answer="")],
        "data": {"files": files},
    }


def copy_content(rng: random.Random) -> TaskParts:
    f1, f2 = rng.sample(FOLDERS, 2)
    n1, n2 = rng.sample(NOUNS, 2)
    src, dst = f"{f1}/{n1}.txt", f"{f2}/{n2}_copy.txt"
    text = paragraph(rng, 2, 4)

    def check(env: Environment) -> dict[str, float]:
        return run_checks(
            {"copied": lambda: same_text(env, dst, text), "source_kept": lambda: same_text(env, src, text)}
        )

    return {
        "instruction": f"Copy the content of {src} into a new file {dst}. Keep {src} unchanged.",
        "setup": setup_files({src: text}),
        "check": check,
        "solution": [
            solution_call("read_file", path=src),
            solution_call("write_file", path=dst, content=text),
            solution_call("submit", answer=""),
        ],
        "data": {"source": src, "destination": dst, "text": text},
        "required_observations": ["read_file"],
    }


def rename_by_rule(rng: random.Random) -> TaskParts:
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
    files = {f"{folder}/{x}": sentence(rng) + "\n" for x in names}
    moves = {f"{folder}/{a}": f"{folder}/{b}" for a, b in zip(names, new_names)}

    def check(env: Environment) -> dict[str, float]:
        return run_checks(
            {
                "renamed": lambda: fraction([same_text(env, dst, files[src]) for src, dst in moves.items()]),
                "old_gone": lambda: fraction([gone(env, src) for src in moves]),
            }
        )

    return {
        "instruction": instruction,
        "setup": setup_files(files),
        "check": check,
        "solution": [solution_call("list_dir", path=folder)]
        + [solution_call("move_file", source=s, destination=d) for s, d in moves.items()]
        + [solution_call("submit", answer="")],
        "data": {"files": files, "rule": rule, "moves": moves},
    }


def scaffold_project(rng: random.Random) -> TaskParts:
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
        return run_checks(
            {
                "readme": lambda: same_text(env, paths[0], files[paths[0]]),
                "main": lambda: same_text(env, paths[1], files[paths[1]]),
                "config": lambda: same_text(env, paths[2], files[paths[2]]),
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
