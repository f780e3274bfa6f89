"""Tool-call protocols: how tools are shown to the model and how its replies become ToolCalls.

A protocol is the text format of a tool call. Five are built in:

    json    {"tool": "add", "arguments": {"a": 17, "b": 25}}
    xml     <tool name="add"><a>17</a><b>25</b></tool>
    react   Thought: ...\\nAction: add\\nAction Input: {"a": 17, "b": 25}
    code    ```python\\nadd(a=17, b=25)\\n```          (parsed with `ast`, never executed)
    hermes  <tool_call>\\n{"name": "add", "arguments": {"a": 17, "b": 25}}\\n</tool_call>
            (the Qwen2.5 / Qwen3 and Hermes chat templates' format)

Other packages add formats as plugins through the entry point group `harnessrl.protocols`
(see `registry`).

Every protocol renders the tool block of the system prompt, renders a call (for demonstrations
and feedback), parses a completion and renders a tool result. `parse` never raises and never
hangs: the text is capped at MAX_SCAN_CHARS, scanners are linear and nesting is bounded.

What a parse means (the harness decides what to do with it):
- `empty`: the completion is whitespace only;
- `calls` non-empty, `error` None: the calls, in order;
- `error` set: the reply tried to call a tool and that attempt could not be parsed (malformed);
- neither: prose without any attempt at a call.
`read_reply` reads a model reply the same way: the backend's own tool calls when it returned
them as data (native function calling), else the protocol's parse of its text.

`lenient=True` accepts near-misses a small model produces (alias keys, Python-ish dicts, bare
tool names in backticks, unfenced code, ...); `lenient=False` accepts only the documented shape.
Tool names are not checked against `tools` here (the runner records unknown tools as blocked
calls); `tools` is only used to convert argument types and to map positional/bare arguments.

Layout: `base` (the Protocol interface and ParseResult), `shared` (argument values, rendering and
scanners the formats share), one module per format (`json_format`, `xml_format`, `react_format`,
`code_format`, `hermes_format`) and `registry` (the formats by name, built in or plugins; the
harness spec accepts exactly these).
"""

from harnessrl.harness.protocols.base import (
    MAX_CALLS_PER_REPLY,
    MAX_NESTING,
    MAX_SCAN_CHARS,
    MalformedCall,
    ParseResult,
    Protocol,
    read_reply,
)
from harnessrl.harness.protocols.code_format import CodeProtocol
from harnessrl.harness.protocols.hermes_format import HermesProtocol
from harnessrl.harness.protocols.json_format import JsonProtocol
from harnessrl.harness.protocols.react_format import ReactProtocol
from harnessrl.harness.protocols.registry import (
    ENTRY_POINT_GROUP,
    PROTOCOL_CLASSES,
    PROTOCOLS,
    PluginInfo,
    ProtocolPluginError,
    ProtocolPluginWarning,
    clear_plugin_cache,
    get_protocol,
    protocol_class,
    protocol_names,
    protocol_plugins,
)
from harnessrl.harness.protocols.xml_format import XmlProtocol

__all__ = [
    "ENTRY_POINT_GROUP",
    "MAX_CALLS_PER_REPLY",
    "MAX_NESTING",
    "MAX_SCAN_CHARS",
    "PROTOCOLS",
    "PROTOCOL_CLASSES",
    "CodeProtocol",
    "HermesProtocol",
    "JsonProtocol",
    "MalformedCall",
    "ParseResult",
    "PluginInfo",
    "Protocol",
    "ProtocolPluginError",
    "ProtocolPluginWarning",
    "ReactProtocol",
    "XmlProtocol",
    "clear_plugin_cache",
    "get_protocol",
    "protocol_class",
    "protocol_names",
    "protocol_plugins",
    "read_reply",
]
