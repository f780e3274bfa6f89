"""The edit space: a harness edit is a diff of the spec, and every candidate is a validated spec.

A diff is a list of changes `{"path": "rules.loop_guard.enabled", "from": false, "to": true}`
over the spec's nested mapping; lists (demonstrations, experiences, helper tools) change as a
whole. `spec_diff` computes it, `apply_changes` applies one and re-validates the result, so a
proposal that breaks the schema is a SpecError, never a half-built harness.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

import yaml

from harnessrl.harness.spec import HarnessSpec, SpecError, parse_spec, require_loop_harness

_MISSING = "(absent)"
# the spec's name labels a run, it is not part of the harness's behaviour
_IGNORED = ("name",)


def spec_diff(old: HarnessSpec, new: HarnessSpec) -> list[dict[str, Any]]:
    """Every changed leaf from `old` to `new`, as sorted {path, from, to} records."""
    changes: list[dict[str, Any]] = []
    _walk(old.to_dict(), new.to_dict(), "", changes)
    return [c for c in changes if c["path"] not in _IGNORED]


def _walk(a: Any, b: Any, prefix: str, out: list[dict[str, Any]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            path = f"{prefix}.{key}" if prefix else str(key)
            _walk(a.get(key, _MISSING), b.get(key, _MISSING), path, out)
    elif a != b:
        out.append({"path": prefix, "from": a, "to": b})


def apply_changes(spec: HarnessSpec, changes: dict[str, Any]) -> HarnessSpec:
    """`spec` with each dotted path set to its value, validated (SpecError when invalid)."""
    data = copy.deepcopy(spec.to_dict())
    for path, value in changes.items():
        keys = path.split(".")
        node = data
        for key in keys[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                raise SpecError(f"edit {path}: '{key}' is not a section of the spec")
            node = child
        node[keys[-1]] = copy.deepcopy(value)
    return require_loop_harness(parse_spec(data, "candidate"), "an edit")


def apply_diff(spec: HarnessSpec, diff: list[dict[str, Any]]) -> HarnessSpec:
    """Replay a diff computed by `spec_diff` on `spec`."""
    return apply_changes(spec, {c["path"]: c["to"] for c in diff})


def renamed(spec: HarnessSpec, name: str) -> HarnessSpec:
    return spec.model_copy(update={"name": name})


def spec_fingerprint(spec: HarnessSpec) -> str:
    """Hash of what the harness does (its name left out): equal fingerprints = the same harness."""
    body = {k: v for k, v in spec.to_dict().items() if k not in _IGNORED}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


_FENCE = re.compile(r"```(?:ya?ml)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def spec_from_text(text: str, source: str = "proposal") -> HarnessSpec:
    """A spec from a model's reply: the last ```yaml block, or the whole text. SpecError if invalid."""
    blocks = _FENCE.findall(text)
    body = blocks[-1] if blocks else text
    try:
        data = yaml.safe_load(body)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise SpecError(f"{source}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    return require_loop_harness(parse_spec(data, source), "a proposal")
