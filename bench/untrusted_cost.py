"""What the host's link-free reads and writes under a workspace cost (tasks/untrusted.py): this
tree against a base commit, alternated in one run, on the same jobs.

- `eval`: `harnessrl eval --suite workspace --split dev --harness json-tools --model oracle` over
  `--tasks` tasks (the known solutions: every file tool call and grader read, no model time), wall
  time of the whole command;
- `file tool call`: one call of the workspace file tools (write_file, read_file, list_dir,
  search_text in turn) in a workspace of 60 files in 3 folders, median over 2,000 calls, in
  process (what every built-in episode and every MCP call pays);
- `grade clawgym` / `grade harbor`: one episode's grading (`Task.grade`, the task's own grader in
  the sandbox, with the workspace laid out and read back by the host) on the repository's ClawGym
  and Harbor fixtures, median over `--repeats` per task.

    .venv/bin/python bench/untrusted_cost.py [--base 282e75c] [--tasks 40] [--rounds 3] [--repeats 5] [--record]

The base is checked out with `git worktree` into a temporary folder and imported from there
(PYTHONPATH), with this tree's virtual environment; the two alternate round by round, so that the
machine's load falls on both. Needs bubblewrap for the graders.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import add_record_argument, record_run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "importers"

GRADE = """
import json, statistics, sys, time
from pathlib import Path
from harnessrl.tasks.importers import ClawGymSuite, HarborSuite
fixtures, repeats = Path(sys.argv[1]), int(sys.argv[2])
out = {}
for name, suite in (("clawgym", ClawGymSuite(fixtures / "clawgym")), ("harbor", HarborSuite(fixtures / "harbor"))):
    times = []
    for task in suite.tasks("dev"):
        if task.data.get("native_id") == "needs-build":
            continue
        for _ in range(repeats):
            env = task.make_env()
            try:
                env.submitted, env.answer = True, "blue"
                t0 = time.perf_counter()
                task.grade(env)
                times.append(time.perf_counter() - t0)
            finally:
                env.close()
    out[name] = 1e3 * statistics.median(times)
print(json.dumps(out))
"""


TOOLS = """
import json, statistics, time
from harnessrl.tasks.base import Environment, Workspace
from harnessrl.tasks.workspace import append_file, list_dir, read_file, search_text, write_file
env = Environment(workspace=Workspace())
for d in range(3):
    for i in range(20):
        write_file(env, f"d{d}/f{i}.txt", "line of text\\n" * 20)
calls = [
    lambda i: write_file(env, f"d{i % 3}/f{i % 20}.txt", "new text\\n" * 10),
    lambda i: read_file(env, f"d{i % 3}/f{i % 20}.txt"),
    lambda i: list_dir(env, f"d{i % 3}"),
    lambda i: search_text(env, "new", f"d{i % 3}"),
]
times = []
for i in range(2000):
    t0 = time.perf_counter()
    calls[i % 4](i)
    times.append(time.perf_counter() - t0)
env.close()
print(json.dumps({"tool_ms": 1e3 * statistics.median(times)}))
"""


def run(tree: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    return subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=False)


def eval_s(tree: Path, tasks: int) -> float:
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-") as out:
        argv = [sys.executable, "-m", "harnessrl.cli", "eval", "--suite", "workspace", "--split", "dev"]
        argv += ["--harness", "json-tools", "--model", "oracle", "--tasks", str(tasks), "--out", f"{out}/run"]
        t0 = time.perf_counter()
        done = run(tree, argv)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"eval failed in {tree}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        summary = json.loads(Path(out, "run", "summary.json").read_text())
        score = summary["harnesses"]["json-tools"]["mean_score"]
        if score < 0.99:
            raise SystemExit(f"the oracle scored {score} in {tree}: not the same job")
    return wall


def grade_ms(tree: Path, repeats: int) -> dict[str, float]:
    out = {}
    for script, args in ((GRADE, [str(FIXTURES), str(repeats)]), (TOOLS, [])):
        done = run(tree, [sys.executable, "-c", script, *args])
        if done.returncode != 0:
            raise SystemExit(f"measuring failed in {tree}:\n{done.stderr[-2000:]}")
        out.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="282e75c", help="the commit to compare with")
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    add_record_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="harnessrl-base-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.base], check=True)
        try:
            trees = {"base": base, "this": REPO}
            evals: dict[str, list[float]] = {k: [] for k in trees}
            grades: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
            for r in range(args.rounds):
                for name in ("base", "this") if r % 2 == 0 else ("this", "base"):
                    evals[name].append(eval_s(trees[name], args.tasks))
                    grades[name].append(grade_ms(trees[name], args.repeats))
                    print(f"round {r + 1} {name}: eval {evals[name][-1]:.1f} s, grade {grades[name][-1]}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    rows = []
    measures = (
        (f"eval, workspace dev, {args.tasks} tasks, oracle (s)", None),
        ("file tool call (ms)", "tool_ms"),
        ("grade clawgym (ms)", "clawgym"),
        ("grade harbor (ms)", "harbor"),
    )
    for what, key in measures:
        if key is None:
            b, t = statistics.median(evals["base"]), statistics.median(evals["this"])
        else:
            b = statistics.median(g[key] for g in grades["base"])
            t = statistics.median(g[key] for g in grades["this"])
        rows.append(
            {
                "measure": what,
                f"base {args.base}": round(b, 2),
                f"this {commit.stdout.strip()}": round(t, 2),
                "this / base": round(t / b, 3),
            }
        )
    for row in rows:
        print(json.dumps(row))
    if args.record:
        record_run("untrusted_cost", rows, results={"evals": evals, "grades": grades, "tasks": args.tasks})


if __name__ == "__main__":
    main()
