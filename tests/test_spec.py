"""Harness specs: built-ins load, round-trip through YAML, and invalid specs give clear errors."""

import json

import pytest
import yaml

from harnessrl.harness.registry import builtin_names, load_harness, resolve_harnesses
from harnessrl.harness.spec import HarnessSpec, SpecError, load_spec, parse_spec, spec_json_schema

BUILTINS = ["code-act", "hermes-tools", "json-tools", "plan-execute", "react", "workspace-agent", "xml-tags"]


def test_seven_builtins_exist():
    assert builtin_names() == BUILTINS


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_round_trips(name, tmp_path):
    spec = load_harness(name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(spec.to_yaml())
    again = load_spec(path)
    assert again == spec
    assert again.to_yaml() == spec.to_yaml()


def test_builtins_differ_on_all_four_axes():
    specs = [load_harness(n) for n in BUILTINS]
    assert len({s.system_prompt for s in specs}) == 7
    assert {s.protocol.format for s in specs} == {"json", "xml", "react", "code", "hermes"}
    assert {s.loop.kind for s in specs} == {"react", "plan-execute"}
    rules = {json.dumps(s.rules.model_dump(mode="json"), sort_keys=True) for s in specs}
    assert len(rules) == 7
    assert len({s.rules.history_window for s in specs}) >= 3
    assert any(s.bootstrap.memory_tool and "AGENTS.md" in s.bootstrap.files for s in specs)


def _base() -> dict:
    return yaml.safe_load(load_harness("react").to_yaml())


@pytest.mark.parametrize(
    "mutate, field, reason",
    [
        (lambda d: d["protocol"].__setitem__("format", "yaml"), "protocol.format", "json"),
        (lambda d: d["rules"].__setitem__("max_steps", 0), "rules.max_steps", "greater than or equal to 1"),
        (lambda d: d["rules"].__setitem__("max_steps", "many"), "rules.max_steps", "integer"),
        (lambda d: d.__setitem__("system_prompt", "hi {nope}"), "system_prompt", "unknown placeholder"),
        (lambda d: d.__setitem__("system_prompt", "hi {tools"), "system_prompt", "bad template"),
        (lambda d: d["rules"].__setitem__("unknown_rule", 1), "rules.unknown_rule", "Extra inputs"),
        (lambda d: d.__setitem__("name", "bad name!"), "name", "pattern"),
        (lambda d: d["loop"].__setitem__("kind", "tree-search"), "loop.kind", "react"),
        (lambda d: d["protocol"].update(format="xml", native_tools=True), "protocol", "native_tools"),
        (
            lambda d: d["rules"]["demonstrations"][0].__setitem__("calls", []),
            "rules.demonstrations.0.calls",
            "at least 1",
        ),
    ],
)
def test_invalid_spec_names_file_field_and_reason(tmp_path, mutate, field, reason):
    data = _base()
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    msg = str(exc.value)
    assert str(path) in msg
    assert field in msg
    assert reason in msg


def test_malformed_yaml_and_wrong_shapes(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nsystem_prompt: [unclosed\n")
    with pytest.raises(SpecError, match=r"broken.yaml: not valid YAML \(line"):
        load_spec(p)
    p.write_text("- a list\n- not a mapping\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(p)
    with pytest.raises(SpecError, match="no such harness spec file"):
        load_spec(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match="system_prompt"):
        parse_spec({"name": "x"})


def test_resolve_harnesses():
    assert [s.name for s in resolve_harnesses(["all"])] == BUILTINS
    assert [s.name for s in resolve_harnesses(["react,json-tools"])] == ["react", "json-tools"]
    with pytest.raises(SpecError, match="unknown harness 'nope'"):
        resolve_harnesses(["nope"])
    with pytest.raises(SpecError, match="given twice"):
        resolve_harnesses(["react", "react"])


def test_spec_file_path_resolves(tmp_path):
    data = _base()
    data["name"] = "my-react"
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(data))
    assert [s.name for s in resolve_harnesses([str(p), "react"])] == ["my-react", "react"]


def test_json_schema_describes_axes():
    """The schema of a spec file: a loop harness (the axes below) or an external agent program."""
    schema = spec_json_schema()
    loop = schema["$defs"]["HarnessSpec"]
    assert {"system_prompt", "protocol", "loop", "rules", "bootstrap"} <= set(loop["properties"])
    assert {"command", "env", "limits", "tool_protocol"} <= set(schema["$defs"]["ExternalHarnessSpec"]["properties"])
    assert len(schema["anyOf"]) == 2
    HarnessSpec.model_validate(_base())


def test_protocol_format_is_a_registered_protocol(monkeypatch):
    """The spec accepts exactly the registry's formats, and its schema and errors list them."""
    from harnessrl.harness.protocols import PROTOCOL_CLASSES, JsonProtocol, get_protocol

    def fmt_schema() -> dict:
        schema = spec_json_schema()
        return schema["$defs"]["ProtocolSpec"]["properties"]["format"]

    assert fmt_schema()["enum"] == ["json", "xml", "react", "code", "hermes"]
    data = _base()
    data["protocol"]["format"] = "json-copy"
    with pytest.raises(SpecError, match=r"unknown format 'json-copy'; known formats: json, xml, react, code, hermes"):
        parse_spec(data)
    data["protocol"]["format"] = ["json"]
    with pytest.raises(SpecError, match=r"protocol.format: expected the name of a format, one of: json, xml"):
        parse_spec(data)

    class JsonCopy(JsonProtocol):
        name = "json-copy"

    monkeypatch.setitem(PROTOCOL_CLASSES, "json-copy", JsonCopy)
    data["protocol"]["format"] = "json-copy"
    assert parse_spec(data).protocol.format == "json-copy"
    assert fmt_schema()["enum"] == ["json", "xml", "react", "code", "hermes", "json-copy"]
    assert isinstance(get_protocol("json-copy"), JsonCopy)


def test_observation_window_is_optional_and_at_least_one(tmp_path):
    assert all(load_harness(n).rules.observation_window is None for n in BUILTINS)  # built-ins keep every page
    data = _base()
    data["rules"]["observation_window"] = 2
    assert parse_spec(data).rules.observation_window == 2
    data["rules"]["observation_window"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=r"rules.observation_window: .*greater than or equal to 1"):
        load_spec(path)


# -- capabilities: ledger, experiences, helper tools; the submit checkpoint -------------------------


def _capability_task():
    from harnessrl.tasks.base import SUBMIT_TOOL, Task, Tool

    def get(env, key: str) -> str:
        if key not in env.state:
            from harnessrl.tasks.base import ToolFailed

            raise ToolFailed(f"no key {key}")
        return env.state[key]

    tool = Tool(
        "get", "Read a value.", {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}, get
    )
    return Task(
        id="cap/dev/00000",
        suite="cap",
        family="cap",
        split="dev",
        seed=0,
        instruction="Submit the value of a plus b.",
        tools=[tool, SUBMIT_TOOL],
        setup=lambda env: env.state.update(a="1", b="2"),
        check=lambda env: {"answer": float(env.answer == "12")},
        needs_workspace=False,
    )


def _run_capabilities(tokenizer, capabilities, replies, **rules):
    from helpers import replies_policy

    from harnessrl.harness.loops import Episode
    from harnessrl.rollout import Runner, make_jobs

    data = _base()
    data.update(name="cap", capabilities=capabilities)
    data["rules"].update(demonstrations=[], max_steps=6, **rules)
    spec = parse_spec(data)
    prompts = []
    policy = replies_policy(replies, tokenizer)
    inner = policy.script

    def script(messages):
        prompts.append(messages[0].content)
        return inner(messages)

    policy.script = script
    (traj,) = Runner(policy, progress=False).run(make_jobs([_capability_task()], [spec], 1))
    return traj, prompts, Episode(_capability_task(), spec, 0)


def _react(name, args):
    return f"Thought: go\nAction: {name}\nAction Input: {json.dumps(args)}"


def test_capabilities_default_off_and_validate():
    assert all(
        load_harness(n).capabilities.model_dump()
        == {"ledger": {"enabled": False, "max_entries": 10}, "experiences": [], "helper_tools": []}
        for n in BUILTINS
    )
    data = _base()
    data["capabilities"] = {
        "helper_tools": [
            {"name": "h", "description": "d", "calls": [{"tool": "get", "arguments": {"key": "{missing}"}}]}
        ]
    }
    with pytest.raises(SpecError, match="unknown parameter '{missing}'"):
        parse_spec(data)
    data["capabilities"] = {"helper_tools": [{"name": "h", "description": "d", "calls": [{"tool": "submit"}]}]}
    with pytest.raises(SpecError, match="submit"):
        parse_spec(data)
    data["capabilities"] = {"experiences": ["x" * 401]}
    with pytest.raises(SpecError, match="at most 400"):
        parse_spec(data)


def test_ledger_and_experiences_are_shown_in_the_system_prompt(tokenizer):
    caps = {"ledger": {"enabled": True, "max_entries": 1}, "experiences": ["Read both values first."]}
    replies = [_react("get", {"key": "a"}), _react("get", {"key": "zz"}), _react("submit", {"answer": "12"})]
    traj, prompts, _ = _run_capabilities(tokenizer, caps, replies)
    assert traj.grade.passed
    assert all("## Lessons from earlier attempts\n- Read both values first." in p for p in prompts)
    assert (
        "## Ledger: what you have done so far\n- (nothing done yet)" in prompts[0] or "(nothing done yet)" in prompts[0]
    )
    assert '- step 1: get(key="a") -> ok: 1' in prompts[1]
    # only the last max_entries are shown, with a count of the others
    assert (
        "(1 earlier entries not shown)" in prompts[2]
        and 'step 2: get(key="zz") -> failed: error: no key zz' in prompts[2]
    )


def test_helper_tool_calls_the_task_tools_in_order(tokenizer):
    helper = {
        "name": "get_two",
        "description": "Read two values at once.",
        "parameters": {"first": "a key", "second": "another key"},
        "calls": [{"tool": "get", "arguments": {"key": "{first}"}}, {"tool": "get", "arguments": {"key": "{second}"}}],
    }
    replies = [
        _react("get_two", {"first": "a", "second": "b"}),
        _react("get_two", {"first": "a", "second": "nope"}),
        _react("submit", {"answer": "12"}),
    ]
    traj, prompts, episode = _run_capabilities(tokenizer, {"helper_tools": [helper]}, replies)
    assert "get_two" in {t.name for t in episode.tools} and "get_two" in prompts[0]
    ok, failed = traj.steps[0].tool_results[0], traj.steps[1].tool_results[0]
    assert ok.ok and ok.output == "[get]\n1\n[get]\n2"
    assert not ok.blocked and not failed.ok and "get: error: no key nope" in failed.output
    # a helper whose tools the task lacks is not offered (harnesses know no suite)
    helper["calls"][1]["tool"] = "read_file"
    _, _, episode = _run_capabilities(tokenizer, {"helper_tools": [helper]}, replies)
    assert "get_two" not in {t.name for t in episode.tools}


def test_submit_checkpoint_holds_back_the_first_submit_once(tokenizer):
    replies = [_react("submit", {"answer": "3"}), _react("get", {"key": "a"}), _react("submit", {"answer": "12"})]
    traj, _, _ = _run_capabilities(tokenizer, {}, replies, submit_checkpoint={"enabled": True})
    assert traj.submitted and traj.answer == "12" and len(traj.steps) == 3
    held = traj.steps[0].tool_results[0]
    assert held.name == "submit" and held.ok and "Checkpoint before submitting" in held.output
    traj, _, _ = _run_capabilities(tokenizer, {}, replies)  # off by default: the first submit ends it
    assert traj.answer == "3" and len(traj.steps) == 1
