"""The browsing tools of the `browse` suite: open, next_page, search and click, acting on the
site and the open page kept in `env.state`."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from harnessrl.tasks.base import Environment, Tool, ToolFailed
from harnessrl.tasks.suites.browse.pages import Page, render
from harnessrl.tasks.suites.browse.site import Site


def _site(env: Environment) -> Site:
    site: Site = env.state["site"]  # put there by the task's setup
    return site


def _show(env: Environment, page: Page) -> str:
    env.state["page"] = page
    return page.text


def _current(env: Environment) -> Page:
    page = env.state.get("page")
    if page is None:
        raise ToolFailed('no page is open yet: open one with open(url), e.g. open(url="/")')
    return page


def _open(env: Environment, url: str) -> str:
    return _show(env, render(_site(env), url))


def _next_page(env: Environment) -> str:
    page = _current(env)
    if page.next_url is None:
        raise ToolFailed(f"{page.url} has no next page")
    return _show(env, render(_site(env), page.next_url))


def _search(env: Environment, query: str) -> str:
    return _show(env, render(_site(env), "/search?q=" + quote(str(query).strip())))


def _resolve_link(page: Page, link: Any) -> str:
    """A link of the page by key ("3", "[3]", "next"), else by its exact text, else by a unique part
    of its text (three characters or more, not a bare number: "7" must not open "Order #4721")."""
    key = str(link).strip().strip("[]").strip().lower()
    if key in page.links:
        return page.links[key]
    exact = [k for k, label in page.labels.items() if label.lower() == key]
    partial = []
    if len(key) >= 3 and not key.isdigit():
        partial = [k for k, label in page.labels.items() if key in label.lower()]
    for found in (exact, partial):
        if len(found) == 1:
            return page.links[found[0]]
    keys = ", ".join(page.links) or "none"
    raise ToolFailed(f"no link '{link}' on {page.url} (links: {keys})")


def _click(env: Environment, link: Any) -> str:
    page = _current(env)
    target = _resolve_link(page, link)
    site = _site(env)
    if target.startswith("cancel:"):
        oid = int(target.split(":", 1)[1])
        order = next(o for o in site["orders"] if o["id"] == oid)
        order["status"] = "cancelled"
        return f"Order #{oid} is now cancelled.\n" + _show(env, render(site, f"/order/{oid}"))
    return _show(env, render(site, target))


OPEN = Tool(
    "open",
    "Open a page of the shop by its address, e.g. / (home), /products?category=garden, /forum.",
    {"type": "object", "properties": {"url": {"type": "string", "examples": ["/"]}}, "required": ["url"]},
    _open,
)
NEXT_PAGE = Tool(
    "next_page", "Open the next page of the listing that is open.", {"type": "object", "properties": {}}, _next_page
)
SEARCH = Tool(
    "search",
    "Search the shop: products, forum threads, forum posts and customers with every word of the query.",
    {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    _search,
)
CLICK = Tool(
    "click",
    "Follow a link of the open page: its number (like 2) or its name (like next).",
    # no type: small models send link numbers as numbers and as strings alike
    {
        "type": "object",
        "properties": {"link": {"description": "link number or name", "examples": ["1"]}},
        "required": ["link"],
    },
    _click,
)
