"""WeightsWatch: tells, cheaply and on every engine step, whether a model's weights changed.

Cached keys and values (the prefix cache, the prepacked and fused weights) belong to the weights
that computed them. The watch keeps a fingerprint of the parameters: their count, the sum of their
identities and the sum of their in-place version counters, which optimizer steps,
`load_state_dict` and in-place edits all bump. Changes that leave the parameters untouched (a peft
adapter switched off, an assignment to `.data`) are not seen, and neither are the steps of a fused
optimizer (`torch.optim.AdamW(fused=True)`, transformers' default `adamw_torch_fused`), whose kernel
writes the parameters without bumping their version counters (seen with torch 2.13): the engine's
`clear_cache()` covers those.

The module tree's parameter and child dicts are kept from the last walk and summed with C-level
loops (`model.parameters()` builds every module's dotted name: a few percent of a one-row decode
step); a child added, removed or replaced anywhere changes the sum of the children's identities,
and then the tree is walked again. Light to import: no torch.
"""

from __future__ import annotations

from functools import partial
from itertools import chain
from operator import attrgetter, is_not
from typing import Any


class WeightsWatch:
    """The fingerprint of `model`'s parameters as last seen (`changed()` compares and updates)."""

    def __init__(self, model: Any):
        self.model = model
        self._module_dicts: list[dict] = []  # the module tree as last walked
        self._param_dicts: list[dict] = []
        self._structure: int | None = None
        self._seen = self.fingerprint()

    def fingerprint(self) -> tuple[int, int, int]:
        """(count, sum of identities, sum of in-place versions) of every parameter now."""
        structure = sum(map(id, chain.from_iterable(map(dict.values, self._module_dicts))))
        if structure != self._structure:
            modules, stack = [], [self.model]
            while stack:
                module = stack.pop()
                modules.append(module)
                stack.extend(m for m in module._modules.values() if m is not None)
            self._module_dicts = [m._modules for m in modules]
            self._param_dicts = [m._parameters for m in modules]
            self._structure = sum(map(id, chain.from_iterable(map(dict.values, self._module_dicts))))
        params = list(filter(partial(is_not, None), chain.from_iterable(map(dict.values, self._param_dicts))))
        return len(params), sum(map(id, params)), sum(map(attrgetter("_version"), params))

    def changed(self) -> bool:
        """Whether the parameters changed since the last call (or since the watch was made)."""
        now = self.fingerprint()
        if now == self._seen:
            return False
        self._seen = now
        return True
