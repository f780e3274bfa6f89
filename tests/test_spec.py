"""Harness specs: built-ins load, round-trip through YAML, and invalid specs give clear errors."""

import json

import pytest
import yaml

from harnessrl.harness.registry import builtin_names, load_harness, resolve_harnesses
from harnessrl.harness.spec import HarnessSpec, SpecError, load_spec, parse_spec, spec_json_schema

BUILTINS = ["code-act", "json-tools", "plan-execute", "react", "workspace-agent", "xml-tags"]


def test_six_builtins_exist():
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
    assert len({s.system_prompt for s in specs}) == 6
    assert {s.protocol.format for s in specs} == {"json", "xml", "react", "code"}
    assert {s.loop.kind for s in specs} == {"react", "plan-execute"}
    rules = {json.dumps(s.rules.model_dump(mode="json"), sort_keys=True) for s in specs}
    assert len(rules) == 6
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
        (lambda d: d["rules"]["demonstrations"][0].__setitem__("calls", []), "rules.demonstrations.0.calls", "at least 1"),
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
    schema = spec_json_schema()
    assert {"system_prompt", "protocol", "loop", "rules", "bootstrap"} <= set(schema["properties"])
    HarnessSpec.model_validate(_base())


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
