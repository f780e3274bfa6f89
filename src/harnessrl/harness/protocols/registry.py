"""The protocol registry: every tool-call format by name, in one place.

A format is a `Protocol` subclass registered under its `name`. The built-in formats are in
`PROTOCOL_CLASSES`; other packages add theirs as plugins through the entry point group
`harnessrl.protocols` (the entry point's name is the format's name, its value the class).
Plugins are found lazily: only when a name is not built in, or when every format is listed.

`protocol.format` in a harness spec accepts the built-in names and the names of plugins that
load; `get_protocol` builds a protocol from any of them. A plugin that cannot be used (it fails to
import, is not a Protocol subclass, declares another name, or two distributions claim its name)
raises `ProtocolPluginError` naming the plugin and its distribution when a spec selects it, and is
skipped with a `ProtocolPluginWarning` when formats are listed, so it never breaks a run that
does not use it. A plugin cannot replace a built-in format: an entry point with a built-in name
is never loaded (listing warns about it).
"""

from __future__ import annotations

import inspect
import threading
import warnings
from dataclasses import dataclass
from importlib import metadata

from harnessrl.harness.protocols.base import Protocol
from harnessrl.harness.protocols.code_format import CodeProtocol
from harnessrl.harness.protocols.hermes_format import HermesProtocol
from harnessrl.harness.protocols.json_format import JsonProtocol
from harnessrl.harness.protocols.react_format import ReactProtocol
from harnessrl.harness.protocols.xml_format import XmlProtocol

ENTRY_POINT_GROUP = "harnessrl.protocols"

PROTOCOL_CLASSES: dict[str, type[Protocol]] = {
    cls.name: cls for cls in (JsonProtocol, XmlProtocol, ReactProtocol, CodeProtocol, HermesProtocol)
}
PROTOCOLS = tuple(PROTOCOL_CLASSES)  # the built-in formats


class ProtocolPluginError(ValueError):
    """A protocol plugin that cannot be used; the message names the plugin and its distribution."""


class ProtocolPluginWarning(UserWarning):
    """A protocol plugin skipped while listing the formats."""


@dataclass(frozen=True)
class PluginInfo:
    """One protocol plugin found through the entry point group, and whether it can be used."""

    name: str
    distribution: str  # "NAME VERSION" of the installed package that declares it
    target: str  # the entry point's value, "module:Class"
    error: str | None = None  # why it cannot be used; None when it loads


_lock = threading.RLock()
_entry_points: dict[str, list[metadata.EntryPoint]] | None = None
_loaded: dict[str, type[Protocol] | ProtocolPluginError] = {}


def clear_plugin_cache() -> None:
    """Forget the plugins found and loaded so far (after installing or removing a package)."""
    global _entry_points
    with _lock:
        _entry_points = None
        _loaded.clear()


def _distribution(ep: metadata.EntryPoint) -> str:
    """ "NAME VERSION" of the distribution that declares `ep`, for messages."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "an unknown distribution"
    try:
        return f"{dist.metadata['Name'] or 'unnamed'} {dist.version}"
    except Exception:  # no distribution, or metadata without a name or version
        return "an unknown distribution"


def _plugin_entry_points() -> dict[str, list[metadata.EntryPoint]]:
    """The group's entry points by name (one per distribution; a path listed twice is one)."""
    global _entry_points
    with _lock:
        if _entry_points is None:
            found: dict[str, list[metadata.EntryPoint]] = {}
            try:
                eps = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
            except Exception as exc:  # broken package metadata must not break the built-in formats
                warnings.warn(
                    f"could not read the {ENTRY_POINT_GROUP} entry points: {type(exc).__name__}: {exc}",
                    ProtocolPluginWarning,
                    stacklevel=3,
                )
                eps = []
            for ep in eps:
                same = found.setdefault(ep.name, [])
                if all(_distribution(o) != _distribution(ep) or o.value != ep.value for o in same):
                    same.append(ep)
            _entry_points = found
        return _entry_points


def _where(name: str, ep: metadata.EntryPoint) -> str:
    return f"protocol plugin '{name}' ({ep.value}, from {_distribution(ep)})"


def _load(name: str, eps: list[metadata.EntryPoint]) -> type[Protocol] | ProtocolPluginError:
    if len(eps) > 1:
        dists = ", ".join(_distribution(ep) for ep in eps)
        return ProtocolPluginError(
            f"protocol plugin '{name}' is declared by several distributions ({dists}); uninstall all but one"
        )
    ep = eps[0]
    where = _where(name, ep)
    try:
        obj = ep.load()
    except Exception as exc:
        return ProtocolPluginError(f"{where} could not be imported: {type(exc).__name__}: {exc}")
    if not (inspect.isclass(obj) and issubclass(obj, Protocol)):
        got = f"class {obj.__qualname__}" if inspect.isclass(obj) else type(obj).__name__
        return ProtocolPluginError(f"{where} is not a subclass of harnessrl.harness.protocols.Protocol (got {got})")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        return ProtocolPluginError(f"{where} does not implement {missing}")
    declared = getattr(obj, "name", None)
    if declared != name:
        if declared in PROTOCOL_CLASSES:
            reason = f"its class is named {declared!r}, which is a built-in format"
        else:
            reason = f"its class is named {declared!r}, not the entry point's name"
        return ProtocolPluginError(f"{where}: {reason}; set name = {name!r} on the class")
    if not isinstance(getattr(obj, "shape", None), str) or not obj.shape.strip():
        return ProtocolPluginError(f"{where}: the class needs a shape: the call format in one line")
    try:
        obj(lenient=True), obj(lenient=False)
    except Exception as exc:
        return ProtocolPluginError(f"{where} could not be created: {type(exc).__name__}: {exc}")
    return obj


def _plugin_class(name: str) -> type[Protocol] | None:
    """The plugin class registered as `name`; None when no plugin has that name. Raises
    ProtocolPluginError when it cannot be used. Built-in names are never looked up here."""
    with _lock:
        if name not in _loaded:
            eps = _plugin_entry_points().get(name)
            if not eps:
                return None
            _loaded[name] = _load(name, eps)
        found = _loaded[name]
    if isinstance(found, ProtocolPluginError):
        raise found
    return found


def protocol_plugins() -> list[PluginInfo]:
    """Every plugin of the entry point group, sorted by name, loaded to say whether it can be used."""
    out = []
    for name, eps in sorted(_plugin_entry_points().items()):
        ep = eps[0]
        error = None
        if name in PROTOCOL_CLASSES:
            error = f"{_where(name, ep)} is ignored: '{name}' is a built-in format and cannot be replaced"
        else:
            try:
                _plugin_class(name)
            except ProtocolPluginError as exc:
                error = str(exc)
        dist = ", ".join(_distribution(e) for e in eps)
        out.append(PluginInfo(name=name, distribution=dist, target=ep.value, error=error))
    return out


def protocol_names() -> tuple[str, ...]:
    """Every usable format: the built-in ones in order, then the plugins by name. A plugin that
    cannot be used is left out with a ProtocolPluginWarning."""
    plugins = []
    for info in protocol_plugins():
        if info.error is None:
            plugins.append(info.name)
        else:
            warnings.warn(f"{info.error}; skipped", ProtocolPluginWarning, stacklevel=2)
    return (*PROTOCOL_CLASSES, *plugins)


def protocol_class(name: str) -> type[Protocol]:
    """The class of the format called exactly `name`: built in, or a plugin (loaded on first use).

    Raises ProtocolPluginError for a plugin that cannot be used, ValueError for an unknown name."""
    if isinstance(name, str):
        if name in PROTOCOL_CLASSES:
            return PROTOCOL_CLASSES[name]
        found = _plugin_class(name)
        if found is not None:
            return found
    raise ValueError(f"unknown protocol {name!r}; known: {', '.join(protocol_names())}")


def get_protocol(name: str, lenient: bool = True) -> Protocol:
    """The protocol called `name` (one of `protocol_names()`; built-in names in any case)."""
    key = name.strip() if isinstance(name, str) else name
    if isinstance(key, str) and key not in PROTOCOL_CLASSES and key.lower() in PROTOCOL_CLASSES:
        key = key.lower()
    return protocol_class(key)(lenient=lenient)
