"""PrefixCache: the keys and values of token prefixes already computed, kept for later prompts.

A radix tree over token ids. Each node holds a run of tokens (its edge) and their key/value
tensors, shaped (layers, 2, kv_heads, tokens, head_dim): the layout of one row of the engine's
batch cache, so handing a prefix to a request is one copy per node. A path from the root spells
a token sequence whose KV the tree knows; two prompts that share a system prompt share the nodes
of that prefix, and an episode's next turn (previous prompt + previous completion + new
observation) finds its whole previous turn as a path.

Memory is bounded by `budget_tokens`, counted over the tokens held by all nodes (each token is
stored once, however many paths share it). Inserting past the budget evicts least recently used
leaves first; a node locked by a running request (`lock`/`unlock`, counted) and the nodes above
it are never evicted. When even that cannot make room, the insert keeps only the part that
fits, so the budget holds at all times.

Nodes own their tensors (a split copies both halves), so evicting a node frees its memory and
the token count is the memory count: `budget_tokens * bytes_per_token` bytes at most.

Not thread-safe: the engine calls it from its step only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class PrefixNode:
    """A run of tokens and their KV, below its parent's tokens."""

    __slots__ = ("children", "kv", "last_used", "parent", "refs", "tokens")

    def __init__(self, tokens: tuple[int, ...], kv: torch.Tensor | None, parent: PrefixNode | None):
        self.tokens = tokens
        self.kv = kv  # (layers, 2, kv_heads, len(tokens), head_dim); None for the root
        self.parent = parent
        self.children: dict[int, PrefixNode] = {}
        self.refs = 0  # running requests that read this node or a node below it
        self.last_used = 0


class PrefixMatch:
    """The longest cached prefix of a prompt: `length` tokens, read from `pieces` in order,
    each (node, how many of its tokens). `node` is the deepest node touched (lock it)."""

    __slots__ = ("length", "node", "pieces")

    def __init__(self, length: int, pieces: list[tuple[PrefixNode, int]], node: PrefixNode):
        self.length = length
        self.pieces = pieces
        self.node = node


def _common_length(a: Sequence[int], b: Sequence[int], start: int) -> int:
    """How many leading tokens of `a` equal b[start:]."""
    n = min(len(a), len(b) - start)
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


class PrefixCache:
    def __init__(self, budget_tokens: int):
        if budget_tokens < 0:
            raise ValueError("budget_tokens must be >= 0")
        self.budget_tokens = budget_tokens
        self.root = PrefixNode((), None, None)
        self.tokens = 0  # tokens held, all nodes
        self.nodes = 0
        self.evictions = 0  # nodes evicted
        self.evicted_tokens = 0
        self._clock = 0

    def _touch(self, node: PrefixNode) -> None:
        self._clock += 1
        node.last_used = self._clock

    # ------------------------------------------------------------------------------ lookup

    def match(self, tokens: Sequence[int], limit: int | None = None) -> PrefixMatch:
        """The longest prefix of tokens[:limit] in the tree (marks its nodes as used)."""
        limit = len(tokens) if limit is None else min(limit, len(tokens))
        node, i, pieces = self.root, 0, []
        while i < limit:
            child = node.children.get(tokens[i])
            if child is None:
                break
            m = _common_length(child.tokens, tokens[:limit], i)
            self._touch(child)
            pieces.append((child, m))
            node, i = child, i + m
            if m < len(child.tokens):
                break
        return PrefixMatch(i, pieces, node)

    def lock(self, node: PrefixNode | None) -> None:
        """Keep `node` and everything above it until the matching `unlock`."""
        while node is not None:
            node.refs += 1
            node = node.parent

    def unlock(self, node: PrefixNode | None) -> None:
        while node is not None:
            node.refs -= 1
            node = node.parent

    # ------------------------------------------------------------------------------ insert

    def insert(self, tokens: Sequence[int], kv: torch.Tensor) -> PrefixNode:
        """Remember tokens whose KV is kv[:, :, :, :len(tokens)] (layers, 2, heads, tokens, dim).

        Only the part not already in the tree is copied. Returns the deepest node holding
        the (possibly shortened, see the module docstring) sequence.
        """
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            m = _common_length(child.tokens, tokens, i)
            self._touch(child)
            if m < len(child.tokens):
                child = self._split(child, m)
            node, i = child, i + m
        rest = len(tokens) - i
        if rest > 0 and self.budget_tokens > 0:
            self.lock(node)  # the attachment point must survive the evictions below
            try:
                self._make_room(rest)
            finally:
                self.unlock(node)
            take = min(rest, self.budget_tokens - self.tokens)
            if take > 0:
                leaf = PrefixNode(tuple(tokens[i : i + take]), kv[:, :, :, i : i + take].clone(), node)
                node.children[leaf.tokens[0]] = leaf
                self.tokens += take
                self.nodes += 1
                self._touch(leaf)
                node = leaf
        return node

    def _split(self, node: PrefixNode, at: int) -> PrefixNode:
        """Cut `node` after `at` tokens; returns the new upper part (node keeps the lower part,
        its children and its identity, so a lock held through it still unlocks its path)."""
        parent, kv = node.parent, node.kv
        assert parent is not None and kv is not None, "the root is never split"
        head = PrefixNode(node.tokens[:at], kv[:, :, :, :at].clone(), parent)
        head.refs = node.refs
        head.last_used = node.last_used
        node.tokens = node.tokens[at:]
        node.kv = kv[:, :, :, at:].clone()
        node.parent = head
        head.children[node.tokens[0]] = node
        parent.children[head.tokens[0]] = head
        self.nodes += 1
        return head

    # ---------------------------------------------------------------------------- eviction

    def _leaves(self) -> list[PrefixNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out

    def _make_room(self, wanted: int) -> None:
        """Evict least recently used unlocked leaves until `wanted` more tokens fit (or none is left)."""
        while self.tokens + wanted > self.budget_tokens:
            candidates = [leaf for leaf in self._leaves() if leaf.refs == 0]
            if not candidates:
                return
            self._remove(min(candidates, key=lambda leaf: leaf.last_used))

    def _remove(self, leaf: PrefixNode) -> None:
        assert leaf.parent is not None, "the root is never removed"
        del leaf.parent.children[leaf.tokens[0]]
        self.tokens -= len(leaf.tokens)
        self.nodes -= 1
        self.evictions += 1
        self.evicted_tokens += len(leaf.tokens)
        leaf.kv = None
        leaf.parent = None

    def clear(self) -> None:
        """Forget everything (locks included: a request still holding one unlocks detached nodes)."""
        self.root = PrefixNode((), None, None)
        self.tokens = 0
        self.nodes = 0
