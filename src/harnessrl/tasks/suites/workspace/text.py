"""The text the `workspace` families fill files with: word pools (package data,
`suites/data/workspace.json`) and sentences drawn from them."""

from __future__ import annotations

import random

from harnessrl.tasks.suites.pools import load_pools

_POOLS = load_pools("workspace")
NAMES: list[str] = _POOLS["names"]
CITIES: list[str] = _POOLS["cities"]
NOUNS: list[str] = _POOLS["nouns"]
GROCERIES: list[str] = _POOLS["groceries"]
FOLDERS: list[str] = _POOLS["folders"]
WEEKDAYS: list[str] = _POOLS["weekdays"]
TEAMS: list[str] = _POOLS["teams"]
REGIONS: list[str] = _POOLS["regions"]
CATEGORIES: list[str] = _POOLS["categories"]
_SENTENCES: list[str] = _POOLS["sentences"]
LOG_MESSAGES: list[str] = _POOLS["log_messages"]


def sentence(rng: random.Random) -> str:
    return rng.choice(_SENTENCES).format(
        name=rng.choice(NAMES),
        city=rng.choice(CITIES),
        day=rng.choice(WEEKDAYS),
        hour=rng.randint(8, 18),
        n=rng.randint(2, 40),
        noun=rng.choice(NOUNS),
        team=rng.choice(TEAMS),
    )


def paragraph(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(sentence(rng) + "\n" for _ in range(rng.randint(lo, hi)))
