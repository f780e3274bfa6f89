"""Preflight: each harness's first request measured against the model's context before a run.
A loop harness's request fits and is counted as the policy counts it; an agent program whose
first request is far past the context is reported too big with what to trim, and `eval` refuses
to run it (exit 2) unless --no-preflight; the dialect of the agent's route; an agent that makes
no request; the JSON output of `harnessrl preflight`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import shrunk_file
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.harness.loops import Episode
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import ExternalHarnessSpec, parse_spec
from harnessrl.models.prompt_model import prompt_model
from harnessrl.preflight import (
    PreflightRefused,
    check_before_run,
    first_agent_request,
    first_loop_request,
    no_request_fix,
    preflight,
    refusal,
)
from harnessrl.tasks import get_suite

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / "tests" / "fixtures" / "agents"


def agent(script: str, mode: str, name: str | None = None, env: dict | None = None) -> ExternalHarnessSpec:
    spec = parse_spec(
        {
            "name": name or mode,
            "kind": "external",
            "command": ["{python}", str(AGENTS / script), mode],
            "env": env or {},
            "limits": {"wall_s": 60, "max_model_calls": 4, "max_new_tokens": 300},
        }
    )
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def first_task():
    return get_suite("workspace").tasks("dev", 1)[0]


def test_a_loop_harness_first_request_fits_and_is_counted_as_the_policy_counts_it(tiny_policy):
    spec = load_harness("json-tools")
    task = first_task()
    model = prompt_model("tiny-random")
    assert model.context == tiny_policy.model.config.max_position_embeddings
    [report] = preflight([spec], task, model)
    episode = Episode(task, spec, 0)
    request = episode.request()
    episode.env.close()
    assert report.kind == "loop" and report.harness == "json-tools" and report.task == task.id
    assert report.prompt == len(tiny_policy.prompt_ids(request))  # the engine's own count of that prompt
    assert report.tools == len(episode.schemas) and report.tool_format == "json" and report.dialect == "-"
    assert report.max_new_tokens == spec.rules.max_new_tokens
    assert report.left == report.context - report.prompt and report.verdict == "fits" and report.advice == ""
    assert report.tool_definitions and report.system and report.tool_definitions > report.system
    assert report.parts[0].part == "tool definitions (8 tools)"  # the largest part first
    assert sum(p.size for p in report.parts) == report.prompt
    assert len(report.largest_tools) == 3 and report.largest_tools[0].size >= report.largest_tools[-1].size


def test_an_agent_whose_first_request_is_too_big_is_reported_with_what_to_trim(tiny_policy):
    """behave.py huge: an 80 kB system prompt and 30 tools, far past tiny-random's 8,192 tokens.
    The request is captured (not refused by the context check), counted as the engine would
    count it, and the program stopped at once."""
    spec = agent("behave.py", "huge")
    model = prompt_model("tiny-random")
    t0 = time.monotonic()
    captured = first_agent_request(spec, first_task(), model)
    took = time.monotonic() - t0
    assert not isinstance(captured, str), captured
    assert took < 30, took
    assert captured.dialect == "chat" and len(captured.tools) == 30 and captured.tool_format == "hermes"
    [report] = preflight([spec], first_task(), model)
    assert report.prompt == len(tiny_policy.prompt_ids(captured.request)) > report.context == 8192
    assert report.verdict == "too big" and report.left is not None and report.left < 0
    assert report.max_new_tokens == 16  # the agent's max_tokens, under limits.max_new_tokens
    assert report.tools == 30 and report.system is not None and report.system > 15_000
    assert report.parts[0].part == "system prompt"
    assert "it does not fit at all" in report.advice
    assert "shorten the agent's system prompt" in report.advice and "limit the tools" in report.advice
    assert "tool_" in report.advice  # the largest tools by name


def test_the_dialect_is_the_route_of_the_agents_first_model_call():
    spec = agent("responses_agent.py", "create", name="responses")
    [report] = preflight([spec], first_task(), prompt_model("tiny-random"))
    assert report.dialect == "responses" and report.tools == 2 and report.verdict == "fits"


def test_an_agent_that_makes_no_model_call_is_reported_without_a_request_and_refused_before_a_run():
    """behave.py lie: it writes its answer and exits without calling the model. The report says
    so with a fix; the check before a run (eval, train grpo, TRL: a spec or a loaded model's
    PromptModel) refuses it beside a loop harness that fits, naming the harness and the reason."""
    spec = agent("behave.py", "lie", env={"LIE_PATH": "x.txt", "LIE_CONTENT": "x"})
    model = prompt_model("tiny-random")
    [report] = preflight([spec], first_task(), model)
    assert report.verdict == "no request" and report.prompt is None
    assert "made no model call (exit code 0)" in report.note and "run the program by hand" in report.advice
    said: list[str] = []
    with pytest.raises(PreflightRefused) as refused:
        check_before_run(model, [load_harness("json-tools"), spec], first_task(), said.append)
    assert refused.value.exit_code == 2
    message = str(refused.value)
    assert "harness lie: no first request measured on workspace/dev/00000: the agent did not run: " in message
    assert "every episode of it would be an infrastructure error" in message and "Fix: " in message
    assert "json-tools" not in message  # the loop harness fits: only what could not be measured is refused
    assert said[0].startswith("preflight: json-tools: ") and said[1].startswith("preflight: lie: no first request")
    assert refusal([report.model_copy(update={"verdict": "fits", "note": ""})]) is None
    assert check_before_run("openai:m@http://127.0.0.1:9/v1", [spec], first_task(), said.append) == []  # not checked


def test_the_fix_for_an_agent_without_a_first_request_follows_its_reason():
    assert "raise the limit" in no_request_fix("...; the sandbox's limit limits.file_size_mb (64 MB) stopped it")
    assert "was not found" in no_request_fix("the program 'x' was not found in the sandbox; ... (exit code 127)")
    assert "refused the agent's first request" in no_request_fix("the agent's POST /v1/chat/completions got 400 (x)")
    bwrap = "cannot start the agent program: bubblewrap refused to start the command: bwrap: Can't find source "
    assert "bubblewrap's refusal" in no_request_fix(bwrap + "path /x: No such file or directory")
    assert "in time" in no_request_fix("the agent made no model call within 120 s")


def _huge_yaml(folder: Path) -> Path:
    path = folder / "huge.yaml"
    path.write_text(
        "name: huge\nkind: external\n"
        f'command: ["{{python}}", "{AGENTS / "behave.py"}", "huge"]\n'
        "limits: {wall_s: 60, max_model_calls: 4}\n"
    )
    return path


def test_eval_refuses_a_harness_whose_first_request_cannot_fit_unless_told_not_to_check(tmp_path):
    huge = _huge_yaml(tmp_path)
    out = tmp_path / "run"
    short = shrunk_file(tmp_path, "json-tools", max_steps=2, max_new_tokens=32)  # json-tools, a short episode
    args = ["eval", "-H", str(short), "-H", str(huge), "--suite", "workspace", "--tasks", "1"]
    args += ["--model", "tiny-random", "--retries", "0", "--no-progress", "--out", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "preflight: json-tools:" in r.output and ": fits" in r.output
    assert "harness huge: its first request (" in r.output and "does not fit tiny-random's context of 8,192" in r.output
    assert "limit the tools" in r.output and "--no-preflight" in r.output
    assert not (out / "run.db").exists()  # nothing ran
    r = CliRunner().invoke(app, [*args, "--no-preflight"])
    assert r.exit_code == 0, r.output
    assert "preflight" not in r.output


def test_train_grpo_refuses_a_harness_whose_first_request_cannot_fit(tmp_path):
    """The same check in `train grpo` (its entry, before the model loads), on a train task."""
    huge = _huge_yaml(tmp_path)
    out = tmp_path / "train"
    args = ["train", "grpo", "--harnesses", f"json-tools,{huge}", "--suite", "workspace", "--model", "tiny-random"]
    r = CliRunner().invoke(app, [*args, "--steps", "1", "--no-progress", "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "preflight: json-tools:" in r.output
    assert "harness huge: its first request (" in r.output and "does not fit tiny-random's context" in r.output
    assert not (out / "checkpoint").exists()  # nothing trained


def test_preflight_command_json_output_and_exit_status(tmp_path):
    huge = _huge_yaml(tmp_path)
    args = ["preflight", "-H", "json-tools", "-H", str(huge), "--model", "tiny-random", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1, r.output  # a request too big
    reports = json.loads(r.stdout)
    assert [(x["harness"], x["kind"], x["verdict"]) for x in reports] == [
        ("json-tools", "loop", "fits"),
        ("huge", "external", "too big"),
    ]
    for x in reports:
        assert x["context"] == 8192 and x["unit"] == "tokens" and x["task"] == first_task().id
        assert x["left"] == x["context"] - x["prompt"] and {"part", "size"} == set(x["parts"][0])
    assert reports[1]["dialect"] == "chat" and reports[1]["tools"] == 30 and reports[1]["advice"]
    r = CliRunner().invoke(app, ["preflight", "-H", "json-tools", "--model", "tiny-random"])
    assert r.exit_code == 0, r.output
    assert "json-tools" in r.stdout and "fits" in r.stdout


def test_a_model_served_elsewhere_is_sized_in_characters_with_its_tokens_unknown():
    loop = first_loop_request(load_harness("json-tools"), first_task())
    [report] = preflight([load_harness("json-tools")], first_task(), prompt_model("openai:m@http://127.0.0.1:9/v1"))
    assert report.unit == "characters" and report.verdict == "unknown" and report.context is None
    assert report.prompt == sum(len(m.content) for m in loop.request.messages)
    assert report.tool_definitions == len(loop.tool_block) > 0
    assert "renders its prompts on its own server" in report.note


def test_an_agent_that_hangs_before_its_first_call_is_refused_with_what_to_check():
    """A program that never calls within the preflight's wait (here 2 s; `--wait`, 120 s by
    default) is stopped and refused: its episodes would end at limits.wall_s with no call."""
    spec = parse_spec({"name": "sleeper", "kind": "external", "command": ["sleep", "60"], "limits": {"wall_s": 60}})
    model = prompt_model("tiny-random")
    t0 = time.monotonic()
    [report] = preflight([spec], first_task(), model, wait_s=2)
    assert time.monotonic() - t0 < 20  # stopped at the wait, not at its wall clock
    assert report.verdict == "no request" and report.note == "the agent made no model call within 2 s"
    assert "calls OPENAI_BASE_URL at once" in report.advice
    with pytest.raises(PreflightRefused, match="harness sleeper: no first request measured .* within 2 s"):
        check_before_run(model, [spec], first_task(), lambda line: None, wait_s=2)
