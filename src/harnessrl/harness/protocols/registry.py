"""The protocol registry: every tool-call format by name, in one place.

`protocol.format` in a harness spec accepts exactly the names registered here, and `get_protocol`
builds a protocol from one. A format is a `Protocol` subclass registered under its `name`.
"""

from __future__ import annotations

from harnessrl.harness.protocols.base import Protocol
from harnessrl.harness.protocols.code_format import CodeProtocol
from harnessrl.harness.protocols.json_format import JsonProtocol
from harnessrl.harness.protocols.react_format import ReactProtocol
from harnessrl.harness.protocols.xml_format import XmlProtocol

PROTOCOL_CLASSES: dict[str, type[Protocol]] = {
    cls.name: cls for cls in (JsonProtocol, XmlProtocol, ReactProtocol, CodeProtocol)
}
PROTOCOLS = tuple(PROTOCOL_CLASSES)  # the built-in formats


def protocol_names() -> tuple[str, ...]:
    """Every registered format, in the order it was registered."""
    return tuple(PROTOCOL_CLASSES)


def get_protocol(name: str, lenient: bool = True) -> Protocol:
    """The protocol called `name` (one of `protocol_names()`)."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in PROTOCOL_CLASSES:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(protocol_names())}")
    return PROTOCOL_CLASSES[key](lenient=lenient)
