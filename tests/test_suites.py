"""The built-in suites: solutions pass, graders are robust and give partial credit, splits are
disjoint and deterministic."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import random
import tomllib
from pathlib import Path

import pytest

from harnessrl.tasks.base import SUBMIT_TOOL, Environment, Task, ToolFailed, generate_from_seed, validate_arguments
from harnessrl.tasks.grading import fmt_number, numbers_in, numbers_match, parse_number, text_matches
from harnessrl.tasks.registry import get_suite
from harnessrl.tasks.suites import toolcalc
from harnessrl.tasks.suites.toolcalc import ToolcalcSuite
from harnessrl.tasks.suites.workspace import WorkspaceSuite

SUITES = {"workspace": WorkspaceSuite, "toolcalc": ToolcalcSuite}
MUTATING = {"write_file", "append_file", "move_file", "delete_file"}


@pytest.fixture(scope="module")
def suites():
    """One instance of each suite with every split generated once (the cache makes reuse cheap)."""
    out = {name: cls() for name, cls in SUITES.items()}
    for suite in out.values():
        for split in ("test", "dev", "train"):
            suite.tasks(split)
    return out


def call(task: Task, env: Environment, name: str, arguments: dict) -> str:
    tool = task.tool(name)
    assert tool is not None, f"{task.id}: no tool {name}"
    args, err = validate_arguments(tool.parameters, arguments)
    assert err is None, f"{task.id}: {name}({arguments}): {err}"
    return tool.fn(env, **args)


def run(task: Task, calls: list[dict]):
    env = task.make_env()
    try:
        for c in calls:
            call(task, env, c["name"], c["arguments"])
        return task.grade(env), env
    finally:
        env.close()


def solved_tasks(suite):
    # every dev and test instance, and a slice of train that still covers every family many times
    return suite.tasks("dev") + suite.tasks("test") + suite.tasks("train")[::5]


def submit_of(task: Task) -> dict:
    return task.solution[-1]


# -- shape of the suites ------------------------------------------------------------------------


def test_registry_knows_both_suites():
    assert isinstance(get_suite("workspace"), WorkspaceSuite)
    assert isinstance(get_suite("toolcalc"), ToolcalcSuite)


@pytest.mark.parametrize("name", SUITES)
def test_split_sizes_and_families(suites, name):
    suite = suites[name]
    assert suite.split_sizes["train"] >= 2000
    assert suite.split_sizes["dev"] >= 48
    assert suite.split_sizes["test"] >= 72
    for split in ("train", "dev", "test"):
        assert len(suite.tasks(split)) == suite.split_sizes[split]
    if name == "workspace":
        assert len(suite.families()) >= 12
    assert {t.family for t in suite.tasks("dev")} == set(suite.families())
    assert suite.pass_threshold == 1.0


def test_workspace_tools_and_toolcalc_has_no_workspace(suites):
    ws_task = suites["workspace"].tasks("dev", 1)[0]
    names = [t.name for t in ws_task.tools]
    assert {"list_dir", "read_file", "write_file", "append_file", "move_file", "delete_file", "search_text"} <= set(
        names
    )
    assert names[-1] == "submit"
    for task in suites["toolcalc"].tasks("dev"):
        env = task.make_env()
        assert env.workspace is None
        env.close()
        for tool in task.tools:
            if tool.name != "submit":
                assert f"{tool.name} tool" in task.instruction, (task.id, tool.name)


@pytest.mark.parametrize("name", SUITES)
def test_solutions_are_well_formed(suites, name):
    for task in suites[name].tasks("dev") + suites[name].tasks("test"):
        assert task.instruction.strip()
        assert task.solution and task.solution[-1]["name"] == "submit", task.id
        for c in task.solution:
            assert task.tool(c["name"]) is not None, (task.id, c["name"])
        json.dumps(task.data)  # JSON-able
        for obs in task.required_observations:
            assert task.tool(obs) is not None
            assert any(c["name"] == obs for c in task.solution), (task.id, obs)


def test_workspace_instances_are_small(suites):
    for task in suites["workspace"].tasks("test"):
        env = task.make_env()
        try:
            files = env.workspace.files()
            assert len(files) <= 10
            for f in files:
                assert len(env.workspace.read(f).encode()) < 2048
        finally:
            env.close()


# -- grading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SUITES)
def test_solutions_score_full_marks(suites, name):
    seen = set()
    for task in solved_tasks(suites[name]):
        grade, _ = run(task, task.solution)
        assert grade.score == 1.0 and grade.passed, (task.id, task.family, grade.subscores)
        assert all(0.0 <= v <= 1.0 for v in grade.subscores.values())
        seen.add(task.family)
    assert seen == set(suites[name].families())


@pytest.mark.parametrize("name", SUITES)
def test_untouched_environment_fails(suites, name):
    for task in suites[name].tasks("dev") + suites[name].tasks("test"):
        grade, _ = run(task, [{"name": "submit", "arguments": {"answer": ""}}])
        assert grade.score < 1.0 and not grade.passed, (task.id, grade.subscores)
        assert grade.subscores and all(0.0 <= v <= 1.0 for v in grade.subscores.values())
        # doing nothing earns nothing: files left alone only count alongside real progress
        assert grade.score == 0.0, (task.id, grade.subscores)


@pytest.mark.parametrize("name", SUITES)
def test_partial_or_wrong_work_is_not_full_credit(suites, name):
    for task in suites[name].tasks("dev") + suites[name].tasks("test"):
        calls = list(task.solution[:-1])
        mutating = [i for i, c in enumerate(calls) if c["name"] in MUTATING]
        if mutating:  # workspace task: leave out the last change
            del calls[mutating[-1]]
            final = submit_of(task)
        else:  # answer task: a wrong answer
            final = {"name": "submit", "arguments": {"answer": "I do not know"}}
        grade, _ = run(task, calls + [final])
        assert grade.score < 1.0, (task.id, grade.subscores)
        # a wrong number never passes either
        if not mutating:
            grade, _ = run(task, task.solution[:-1] + [{"name": "submit", "arguments": {"answer": "123456789"}}])
            assert grade.score == 0.0, task.id


def test_multi_step_families_give_partial_credit(suites):
    """Doing only part of a multi-step task earns strictly between 0 and 1."""
    checked = set()
    for task in suites["workspace"].tasks("dev") + suites["workspace"].tasks("test"):
        mutating = [c for c in task.solution if c["name"] in MUTATING]
        if len(mutating) < 2:
            continue
        grade, _ = run(task, [c for c in task.solution if c["name"] not in MUTATING] + mutating[:1] + [submit_of(task)])
        assert 0.0 < grade.score < 1.0, (task.id, grade.subscores)
        checked.add(task.family)
    assert {"delete_matching", "sort_by_extension", "fix_config", "rename_by_rule", "scaffold_project"} <= checked


def _first(suite, family: str) -> Task:
    return next(t for t in suite.tasks("dev") if t.family == family)


def test_workspace_grader_details(suites):
    ws = suites["workspace"]

    # csv_report: the right file with a wrong number keeps the format credit
    task = _first(ws, "csv_report")
    write = next(c for c in task.solution if c["name"] == "write_file")
    label = task.data["label"]
    grade, _ = run(
        task,
        [
            {"name": "write_file", "arguments": {"path": write["arguments"]["path"], "content": f"{label}: -1\n"}},
            submit_of(task),
        ],
    )
    assert grade.subscores == {"exists": 1.0, "format": 1.0, "value": 0.0}
    # ... and a correct value with trailing spaces and blank lines still passes
    content = write["arguments"]["content"].rstrip("\n") + "   \n\n\n"
    grade, _ = run(
        task,
        [
            {"name": "write_file", "arguments": {"path": write["arguments"]["path"], "content": content}},
            submit_of(task),
        ],
    )
    assert grade.passed

    # merge_lists: right items in the wrong order get half
    task = _first(ws, "merge_lists")
    write = next(c for c in task.solution if c["name"] == "write_file")
    items = write["arguments"]["content"].split()
    grade, _ = run(
        task,
        [
            {
                "name": "write_file",
                "arguments": {"path": write["arguments"]["path"], "content": "\n".join(reversed(items + items[:1]))},
            },
            submit_of(task),
        ],
    )
    assert grade.subscores == {"items": 1.0, "sorted_unique": 0.0}

    # json_update: broken JSON scores 0 without raising
    task = _first(ws, "json_update")
    path = task.data["path"]
    grade, _ = run(task, [{"name": "write_file", "arguments": {"path": path, "content": "{not json"}}, submit_of(task)])
    assert grade.score == 0.0


def test_answer_families_accept_lenient_answers(suites):
    ws = suites["workspace"]
    for task in ws.tasks("dev") + ws.tasks("test"):
        if task.family not in ("answer_from_file", "find_file"):
            continue
        answer = submit_of(task)["arguments"]["answer"]
        for variant in (
            f"The answer is {answer}.",
            f"  '{answer}'\n",
            answer.upper() if task.family == "answer_from_file" else answer,
        ):
            grade, _ = run(task, task.solution[:-1] + [{"name": "submit", "arguments": {"answer": variant}}])
            assert grade.passed, (task.id, variant)
    # naming every candidate file is not an answer
    task = _first(ws, "find_file")
    everything = " ".join(p.split("/")[-1] for p in task.data["files"])
    grade, _ = run(task, [{"name": "submit", "arguments": {"answer": everything}}])
    assert grade.score == 0.0


@pytest.mark.parametrize("name", SUITES)
def test_graders_survive_garbled_workspaces(suites, name):
    """Binary garbage in every file, or a directory where an output file should be: no exception."""
    for task in suites[name].tasks("dev"):
        if not task.needs_workspace:
            env = task.make_env()
            env.answer = None  # never submitted
            grade = task.grade(env)
            assert grade.score == 0.0
            env.close()
            continue
        env = task.make_env()
        try:
            for c in task.solution:
                if c["name"] in ("write_file", "append_file"):
                    target = env.workspace.root / c["arguments"]["path"]
                    if target.is_file():
                        target.unlink()
                    os.makedirs(target, exist_ok=True)
            task.grade(env)
            for f in env.workspace.files():
                (env.workspace.root / f).write_bytes(b"\xff\xfe\x00\x81garbage\xc3")
            grade = task.grade(env)
            assert grade.score < 1.0 and all(0.0 <= v <= 1.0 for v in grade.subscores.values())
        finally:
            env.close()


# -- toolcalc specifics -------------------------------------------------------------------------


def test_toolcalc_lenient_number_parsing():
    assert parse_number("42") == 42
    assert parse_number("42.0") == 42
    assert parse_number("The answer is 42.") == 42
    assert parse_number("17 plus 25 is 42") == 42
    assert parse_number("It costs 1,250.5 dollars") == 1250.5
    assert parse_number("-3.5 C") == -3.5
    assert parse_number("no number") is None
    assert parse_number(None) is None
    assert numbers_match(5.6327, 5.632704)
    assert not numbers_match(41, 42)


def test_toolcalc_answers_graded_leniently(suites):
    tc = suites["toolcalc"]
    for task in tc.tasks("dev"):
        answer = submit_of(task)["arguments"]["answer"]
        variants = [answer, f"The answer is {answer}", f"{answer}\n"]
        if task.family != "lookup_capital":
            variants.append(f"{float(answer):.4f}")
        for v in variants:
            grade, _ = run(task, task.solution[:-1] + [{"name": "submit", "arguments": {"answer": v}}])
            assert grade.passed, (task.id, v)
        wrong = "Zzyzx" if task.family == "lookup_capital" else str(float(answer) + 1)
        grade, _ = run(task, task.solution[:-1] + [{"name": "submit", "arguments": {"answer": wrong}}])
        assert grade.subscores == {"answer": 0.0}


def test_toolcalc_tools():
    env = Environment(state={"table": {"apple": 3, "Velmora": "Kalo"}})
    assert toolcalc.ADD.fn(env, a=17, b=25) == "42"
    assert toolcalc.SUBTRACT.fn(env, a=5, b=7.5) == "-2.5"
    assert toolcalc.MULTIPLY.fn(env, a=1.5, b=4) == "6"
    assert toolcalc.DIVIDE.fn(env, a=1, b=3) == "0.3333"
    with pytest.raises(ToolFailed):
        toolcalc.DIVIDE.fn(env, a=1, b=0)
    assert toolcalc.LOOKUP.fn(env, key=" Apple ") == "3"
    assert toolcalc.LOOKUP.fn(env, key="velmora") == "Kalo"
    with pytest.raises(ToolFailed):
        toolcalc.LOOKUP.fn(env, key="pear")
    assert toolcalc.CONVERT.fn(env, value=2.5, from_unit="km", to_unit="m") == "2500 m"
    assert toolcalc.CONVERT.fn(env, value=100, from_unit="c", to_unit="F") == "212 F"
    with pytest.raises(ToolFailed):
        toolcalc.CONVERT.fn(env, value=1, from_unit="km", to_unit="kg")
    with pytest.raises(ToolFailed):
        toolcalc.CONVERT.fn(env, value=1, from_unit="parsec", to_unit="m")
    # arguments are validated against the schema before the tool runs
    _, err = validate_arguments(toolcalc.ADD.parameters, {"a": "1", "b": 2})
    assert err


# -- the shared answer rule (harnessrl.tasks.grading) -------------------------------------------


@pytest.mark.parametrize(
    "text, numbers",
    [
        ("3,7", [3.7]),  # a decimal comma
        ("2,50 EUR", [2.5]),
        ("1,234", [1234]),  # thousands
        ("12,345,678.5", [12345678.5]),
        ("1234,567", [1234.567]),  # a first group of four digits: not thousands
        ("3.70", [3.7]),
        (".5", [0.5]),
        ("3,7,9", [3, 7, 9]),  # a list
        ("3, 7", [3, 7]),
        ("version 1.2.3", [1, 2, 3]),
        ("It is 42.", [42]),
        ("-3 and (-4)", [-3, -4]),
        ("\u22122.5", [-2.5]),
        ("2024-05-01", [2024, 5, 1]),  # a dash between digits is no sign
        ("x-1", [1]),
        ("50% of $1,250.5", [50, 1250.5]),
        ("1e3", [1, 3]),
        ("no number", []),
        ("", []),
    ],
)
def test_numbers_are_read_by_one_rule(text, numbers):
    assert numbers_in(text) == numbers
    assert parse_number(text) == (numbers[-1] if numbers else None)


def test_minus_zero_is_zero_and_the_last_number_answers():
    assert parse_number("-0") == 0 and numbers_match(parse_number("-0"), 0)
    assert parse_number("17 plus 25 is 42") == 42
    assert parse_number(None) is None


@pytest.mark.parametrize(
    "got, expected, ok",
    [
        (3.7, 3.7, True),
        (12.01, 12, True),  # within 0.01
        (12.02, 12, False),
        (123.45, 123.456, True),  # an average rounded either way, or cut, to 2 decimals
        (123.44, 123.456, False),
        (-0.0, 0, True),
        (1e12 + 500, 1e12, True),  # 1e-9 relative for very large values
        (1e12 + 5000, 1e12, False),
        (float("nan"), 0, False),
        (float("inf"), float("inf"), False),
        (None, 0, False),
    ],
)
def test_numbers_match_within_a_hundredth(got, expected, ok):
    assert numbers_match(got, expected) is ok


def test_names_match_as_whole_words_and_exclude_the_other_candidates():
    cities = ["Oslo", "Lisbon", "Porto Alegre"]
    assert text_matches("She works in OSLO.", "Oslo", cities)
    assert text_matches("porto-alegre", "Porto Alegre", cities)
    assert not text_matches("Osloville", "Oslo", cities)  # a part of a word is not the word
    assert not text_matches("Oslo or Lisbon", "Oslo", cities)
    assert not text_matches("Porto", "Porto Alegre", cities)
    assert not text_matches(None, "Oslo", cities)
    assert not text_matches("anything", "", cities)


def test_every_suite_grades_numbers_alike(suites):
    """The same answer text gets the same verdict in workspace, toolcalc and browse."""
    browse = get_suite("browse")
    answer_tasks = [
        next(t for t in suites["toolcalc"].tasks("dev") if t.family == "add"),
        next(
            t
            for t in suites["workspace"].tasks("train")
            if t.family == "answer_from_file" and "How many" in t.instruction
        ),
        next(t for t in browse.tasks("dev") if t.family == "out_of_stock_count"),
    ]
    for task in answer_tasks:
        expected = float(submit_of(task)["arguments"]["answer"])
        for shown, ok in (
            (fmt_number(expected), True),
            (f"{expected:.2f}", True),
            (f"{fmt_number(expected)},0", True),  # a decimal comma
            (f"1,{fmt_number(expected)}", False),  # 1.<n>, not a list ending in <n>
            (f"{expected + 0.02:.2f}", False),
        ):
            grade, _ = run(task, task.solution[:-1] + [{"name": "submit", "arguments": {"answer": shown}}])
            assert grade.passed is ok, (task.id, shown)


# -- splits, determinism, ids -------------------------------------------------------------------


@pytest.mark.parametrize("name", SUITES)
def test_splits_share_no_instance(suites, name):
    prints = {split: [t.fingerprint for t in suites[name].tasks(split)] for split in ("train", "dev", "test")}
    for split, fps in prints.items():
        assert len(set(fps)) == len(fps), f"duplicate instance inside {split}"
    assert not set(prints["train"]) & set(prints["dev"])
    assert not set(prints["train"]) & set(prints["test"])
    assert not set(prints["dev"]) & set(prints["test"])


@pytest.mark.parametrize("name", SUITES)
def test_generation_is_deterministic(name):
    a, b = SUITES[name](), SUITES[name]()
    for split in ("dev", "test"):
        ta, tb = a.tasks(split), b.tasks(split)
        assert [(t.id, t.family, t.instruction, t.data, t.solution) for t in ta] == [
            (t.id, t.family, t.instruction, t.data, t.solution) for t in tb
        ]
    ta, tb = a.tasks("train", 50), b.tasks("train", 50)
    assert [(t.instruction, t.data) for t in ta] == [(t.instruction, t.data) for t in tb]


@pytest.mark.parametrize("name", SUITES)
def test_task_id_rebuilds_the_task(suites, name):
    fresh = SUITES[name]()
    for split, index in (("dev", 0), ("dev", 47), ("test", 13), ("train", 7)):
        original = suites[name].tasks(split)[index]
        rebuilt = fresh.task(original.id)
        assert rebuilt.id == original.id == f"{name}/{split}/{index:05d}"
        assert (rebuilt.instruction, rebuilt.data, rebuilt.family) == (
            original.instruction,
            original.data,
            original.family,
        )
        assert rebuilt.fingerprint == original.fingerprint


def test_close_removes_workspace(suites):
    for task in suites["workspace"].tasks("dev")[:16]:
        env = task.make_env()
        root = env.workspace.root
        for c in task.solution:
            call(task, env, c["name"], c["arguments"])
        assert root.is_dir()
        env.close()
        assert not root.exists()


@pytest.mark.parametrize("name", SUITES)
def test_invalid_split_or_count(name):
    suite = SUITES[name]()
    with pytest.raises(ValueError):
        suite.tasks("validation")
    for bad in (-1, 49, 1.5, True, "3"):
        with pytest.raises(ValueError):
            suite.tasks("dev", bad)
    with pytest.raises(ValueError):
        suite.task("not-an-id")
    with pytest.raises(ValueError):
        suite.task(f"{name}/dev/zero")
    with pytest.raises(ValueError):
        suite.task(f"{name}/nosplit/0")
    other = "toolcalc" if name == "workspace" else "workspace"
    with pytest.raises(ValueError):
        suite.task(f"{other}/dev/0")


@pytest.mark.parametrize("name", SUITES)
def test_generate_from_seed(name):
    families = SUITES[name]().families()
    for fam_name, family in families.items():
        one, two = generate_from_seed(family, 1234), generate_from_seed(family, 1234)
        assert one["instruction"] == two["instruction"] and one["data"] == two["data"], fam_name
    family = next(iter(families.values()))
    for bad in (-1, 1.5, "7", None, True):
        with pytest.raises(ValueError):
            generate_from_seed(family, bad)


def test_families_draw_only_from_their_rng():
    """Varied instances: 40 seeds of every family give (nearly) 40 different instances."""
    for cls in SUITES.values():
        for fam_name, family in cls().families().items():
            datas = {json.dumps(family(random.Random(seed))["data"], sort_keys=True) for seed in range(40)}
            assert len(datas) >= 35, fam_name


def test_submit_tool_is_the_shared_one(suites):
    for name in SUITES:
        task = suites[name].tasks("dev", 1)[0]
        assert task.tool("submit") is SUBMIT_TOOL


# -- instances stay the same across versions ----------------------------------------------------

DIGESTS = os.path.join(os.path.dirname(__file__), "fixtures", "suite_digests.json")


def _digest(tasks: list[Task]) -> str:
    records = [
        {"id": t.id, "family": t.family, "seed": t.seed, "instruction": t.instruction, "data": t.data}
        | {"solution": t.solution, "fingerprint": t.fingerprint}
        for t in tasks
    ]
    return hashlib.sha256(json.dumps(records, sort_keys=True, default=str).encode()).hexdigest()


@pytest.mark.parametrize("name", ["workspace", "toolcalc", "browse", "planning"])
def test_instances_are_the_recorded_ones(name):
    """A (suite, split, index) rebuilds the instance of earlier versions, so scores of runs made
    with different versions compare. A change that means to alter the instances (a new word in a
    pool, another family) updates tests/fixtures/suite_digests.json and says so."""
    with open(DIGESTS, encoding="utf-8") as f:
        recorded = json.load(f)[name]
    suite = get_suite(name).__class__()
    got = {"test": _digest(suite.tasks("test")), "dev": _digest(suite.tasks("dev"))}
    got["train[:200]"] = _digest(suite.tasks("train", 200))
    assert got == recorded


def test_the_word_pools_ship_in_the_wheel():
    """Every pool file is package data (pyproject.toml), or an installed harnessrl has no suites."""
    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    package = root / "src" / "harnessrl"
    pools = sorted((package / "tasks" / "suites" / "data").glob("*.json"))
    assert {p.stem for p in pools} >= {"workspace", "browse", "toolcalc", "planning"}
    for pool in pools:
        rel = pool.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs["harnessrl"]), rel


def test_a_workspace_grader_without_a_workspace_scores_zero(suites):
    """An environment that lost its workspace is garbled state too: every check scores 0, none raises."""
    for task in suites["workspace"].tasks("dev")[:16]:
        grade = task.grade(Environment())
        assert grade.score == 0.0, (task.id, grade.subscores)
    with pytest.raises(RuntimeError, match="needs an environment with a workspace"):
        Environment().require_workspace()
