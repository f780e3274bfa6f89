"""Protocol plugins: a format from an installed package (entry point group `harnessrl.protocols`)
is selected by a spec and runs episodes; a broken plugin gives one clear error and breaks nothing else."""

from __future__ import annotations

import json
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import yaml
from helpers import oracle_policy
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.harness.protocols import (
    PROTOCOLS,
    JsonProtocol,
    ProtocolPluginError,
    ProtocolPluginWarning,
    clear_plugin_cache,
    get_protocol,
    protocol_names,
    protocol_plugins,
)
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import SpecError, load_spec, parse_spec
from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Runner, make_jobs
from harnessrl.tasks import get_suite
from harnessrl.types import Termination


def documented_plugin() -> str:
    """The example plugin of docs/protocols.md ("Writing a protocol plugin"): the tests run it as written."""
    doc = (Path(__file__).parents[1] / "docs" / "protocols.md").read_text(encoding="utf-8")
    section = doc.split("## Writing a protocol plugin", 1)[1]
    return section.split("```python\n", 1)[1].split("```\n", 1)[0]


# A complete third-party format: `CALL NAME {json}` lines.
LINE_PLUGIN = documented_plugin()


def install(site: Path, dist: str, version: str, modules: dict[str, str], entry_points: dict[str, str]) -> None:
    """A real installed distribution in `site`: NAME-VERSION.dist-info with METADATA and
    entry_points.txt, next to its modules."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[harnessrl.protocols]\n{lines}")
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path for test distributions; the plugin cache and the modules imported
    from it are forgotten before and after the test."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    clear_plugin_cache()
    yield folder
    clear_plugin_cache()
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", "") and str(folder) in sys.modules[name].__file__:
            del sys.modules[name]


def spec_data(fmt: str) -> dict:
    data = load_harness("json-tools").to_dict()
    data.update(name=f"{fmt}-tools")
    data["protocol"]["format"] = fmt
    data["rules"]["demonstrations"] = []
    return data


def test_a_plugin_is_selected_by_a_spec_and_runs_an_episode(site, tmp_path, tokenizer):
    install(site, "harnessrl-line", "1.2.0", {"line_protocol": LINE_PLUGIN}, {"line": "line_protocol:LineProtocol"})
    get_protocol("json")
    assert "line_protocol" not in sys.modules  # built-in formats never look at plugins
    path = tmp_path / "line.yaml"
    path.write_text(yaml.safe_dump(spec_data("line")))
    spec = load_spec(path)
    assert spec.protocol.format == "line" and "line_protocol" in sys.modules  # loaded when named
    assert type(get_protocol("line")).__name__ == "LineProtocol"
    assert PROTOCOLS == ("json", "xml", "react", "code", "hermes")  # the built-ins stay the built-ins
    assert protocol_names() == (*PROTOCOLS, "line")

    tasks = get_suite("toolcalc").tasks("dev", 2)
    runner = Runner(oracle_policy(tasks, spec, tokenizer), SamplingParams(temperature=0.0), progress=False)
    trajs = runner.run(make_jobs(tasks, [spec], 1))
    for t in trajs:
        assert t.termination == Termination.submitted and t.grade.passed, (t.termination, t.steps[-1].parse_error)
        first = t.steps[0].model_call
        assert "Call a tool with one line: CALL NAME" in first.messages[0].content  # the plugin's tool block
        assert first.text.startswith("CALL ") and t.steps[0].tool_calls
        assert any(m.content.startswith("RESULT ") for m in t.steps[-1].model_call.messages if m.role == "tool")


BROKEN = {
    "import": ({"broken_import": "import not_a_module_anywhere\n"}, "broken_import:Proto", "could not be imported"),
    "missing": ({"broken_missing": "X = 1\n"}, "broken_missing:Proto", "could not be imported: AttributeError"),
    "function": ({"broken_function": "def Proto():\n    pass\n"}, "broken_function:Proto", "is not a subclass"),
    "class": ({"broken_class": "class Proto:\n    pass\n"}, "broken_class:Proto", "is not a subclass"),
    "abstract": (
        {
            "broken_abstract": "from harnessrl.harness.protocols import Protocol\nclass Proto(Protocol):\n"
            "    name = 'abstract'\n    shape = 'x'\n"
        },
        "broken_abstract:Proto",
        "does not implement _parse, format_reminder, render_call, render_result, render_tools",
    ),
    "clash": (
        {
            "broken_clash": "from harnessrl.harness.protocols import JsonProtocol\nclass Proto(JsonProtocol):\n"
            "    pass\n"
        },
        "broken_clash:Proto",
        "its class is named 'json', which is a built-in format; set name = 'clash' on the class",
    ),
    "init": (
        {
            "broken_init": "from harnessrl.harness.protocols import JsonProtocol\nclass Proto(JsonProtocol):\n"
            "    name = 'init'\n    def __init__(self, lenient=True):\n        raise RuntimeError('no config')\n"
        },
        "broken_init:Proto",
        "could not be created: RuntimeError: no config",
    ),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_plugin_gives_one_clear_error_and_breaks_nothing_else(site, kind):
    modules, target, reason = BROKEN[kind]
    install(site, "harnessrl-broken", "0.3", modules, {kind: target})
    install(site, "harnessrl-line", "1.2.0", {"line_protocol": LINE_PLUGIN}, {"line": "line_protocol:LineProtocol"})
    where = f"protocol plugin '{kind}' ({target}, from harnessrl-broken 0.3)"

    with pytest.raises(SpecError) as exc:  # selected by a spec: one line naming plugin and distribution
        parse_spec(spec_data(kind), "mine.yaml")
    assert str(exc.value).startswith(f"mine.yaml: protocol.format: {where}")
    assert reason in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ProtocolPluginError, match=rf"^{where.replace('(', '[(]').replace(')', '[)]')}"):
        get_protocol(kind)

    # listing skips it with a warning; unrelated specs and the other plugin work
    with pytest.warns(ProtocolPluginWarning, match=f"protocol plugin '{kind}'.*skipped"):
        assert protocol_names() == (*PROTOCOLS, "line")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert parse_spec(spec_data("json")).protocol.format == "json"
        assert parse_spec(spec_data("line")).protocol.format == "line"
    broken = next(p for p in protocol_plugins() if p.name == kind)
    assert broken.distribution == "harnessrl-broken 0.3" and reason in broken.error


def test_a_plugin_cannot_replace_a_built_in_and_a_name_claimed_twice_is_refused(site):
    install(site, "harnessrl-evil", "1.0", {"evil_json": "raise RuntimeError('imported')\n"}, {"json": "evil_json:P"})
    install(site, "harnessrl-one", "1.0", {"one_line": LINE_PLUGIN}, {"line": "one_line:LineProtocol"})
    install(site, "harnessrl-two", "2.0", {"two_line": LINE_PLUGIN}, {"line": "two_line:LineProtocol"})
    assert isinstance(get_protocol("json"), JsonProtocol)
    assert parse_spec(spec_data("json")).protocol.format == "json"
    with pytest.raises(SpecError, match=r"'line' is declared by several distributions \(harnessrl-\w+ \d.0, "):
        parse_spec(spec_data("line"))
    with pytest.warns(ProtocolPluginWarning) as caught:
        assert protocol_names() == PROTOCOLS
    messages = " | ".join(str(w.message) for w in caught)
    assert "'json' is a built-in format and cannot be replaced" in messages and "harnessrl-evil 1.0" in messages
    assert "several distributions" in messages
    assert "evil_json" not in sys.modules  # a clashing plugin is never imported


def test_an_unknown_format_lists_the_plugins_too(site):
    install(site, "harnessrl-line", "1.2.0", {"line_protocol": LINE_PLUGIN}, {"line": "line_protocol:LineProtocol"})
    with pytest.raises(
        SpecError, match=r"unknown format 'lines'; known formats: json, xml, react, code, hermes, line$"
    ):
        parse_spec(spec_data("lines"))
    with pytest.raises(ValueError, match=r"unknown protocol 'lines'; known: json, xml, react, code, hermes, line$"):
        get_protocol("lines")


def test_cli_lists_built_in_formats_and_plugins(site):
    install(site, "harnessrl-line", "1.2.0", {"line_protocol": LINE_PLUGIN}, {"line": "line_protocol:LineProtocol"})
    install(site, "harnessrl-broken", "0.3", {"broken_import": "import nope_nope\n"}, {"nope": "broken_import:P"})
    r = CliRunner().invoke(app, ["harness", "protocols"])
    assert r.exit_code == 0, r.output
    for name in PROTOCOLS:
        assert name in r.output
    assert "<tool_call>" in r.output and "plugin: harnessrl-line 1.2.0" in r.output
    assert 'CALL NAME {"argument": value}' in r.output
    assert "skipped:" in r.output and "protocol plugin 'nope'" in r.output and "harnessrl-broken 0.3" in r.output


def test_a_format_built_from_the_shared_helpers_reads_calls_and_reports_malformed_ones():
    """What docs/protocols.md offers plugin authors: the helpers of `shared` (`__all__`, each in the
    doc's table) and `MalformedCall`, whose message is the parse error the model is shown."""
    from harnessrl.harness.protocols import MalformedCall, ParseResult, Protocol, shared
    from harnessrl.types import ToolSchema

    doc = (Path(__file__).parents[1] / "docs" / "protocols.md").read_text(encoding="utf-8")
    table = doc.split("| helper | what it gives |", 1)[1].split("\n\n", 1)[0]
    assert {name for name in shared.__all__ if name != "Span"} == {
        cell.split("(")[0].strip("` ")
        for row in table.splitlines()[2:]
        for cell in row.split("|")[1].split(",")
        if "(" in cell
    }
    assert all(getattr(shared, name).__doc__ for name in shared.__all__)

    class BraceProtocol(Protocol):
        name = "brace"
        shape = 'NAME {"argument": value}'

        def render_tools(self, tools):
            return shared.tools_block(tools)

        def render_call(self, call, thought=""):
            return f"{thought} {call.name} {json.dumps(call.arguments)}".strip()

        def render_result(self, result):
            return shared.plain_result(result)

        def format_reminder(self, tools):
            return self.render_call(shared.example_call(tools))

        def _parse(self, text, tools):
            spans, unclosed = shared.scan_braces(text)
            if unclosed is not None:
                raise MalformedCall(f"unclosed arguments: {shared.shorten(text[unclosed:], 20)}")
            calls, prose = [], []
            for before, span in zip(shared.text_outside(text, [(s.start, s.end) for s in spans]), spans):
                *words, tool = before.split()
                prose += words
                args = shared.read_json(text[span.start : span.end], self.lenient)
                calls.append(shared.make_call(tool, args, text[span.start : span.end]))
            return ParseResult(calls=calls, thought=" ".join(prose))

    tools = [ToolSchema(name="add", description="adds", parameters={"properties": {"a": {"type": "integer"}}})]
    p = BraceProtocol(lenient=True)
    got = p.parse("first add {'a': 1,} then add {\"a\": 2}", tools)
    assert [(c.name, c.arguments) for c in got.calls] == [("add", {"a": 1}), ("add", {"a": 2})]
    assert got.thought == "first then" and got.error is None
    assert p.parse('add {"a": [1, 2', tools).error == 'unclosed arguments: {"a": [1, 2'
    assert p.parse('add {"a": NaN}', tools).error == "numbers must be finite (no NaN or Infinity)"
    assert BraceProtocol(lenient=False).parse("add {'a': 1}", tools).error is not None
    assert "add(a?: integer): adds" in p.render_tools(tools)
