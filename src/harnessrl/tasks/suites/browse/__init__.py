"""Suite `browse`: questions about a small generated web shop, answered by browsing text pages.

In the style of WebArena-Lite, scaled down for small models. Every task gets its own site: a
product catalogue (three categories of products with price, stock, rating and brand), customers
and their orders, and a forum of threads. Pages are compact text; links on a page are shown as
`[1]`, `[2]`, ... (the items of the page) or `[name]` (`[next]`, `[prev]`, `[forum]`, a category,
a user name, `[cancel]`). The agent browses with five tools:

- `open(url)`: open a page by its address (`/`, `/products?category=garden`, `/product/7`, ...);
- `next_page()`: the next page of the listing that is open;
- `search(query)`: products, threads, posts and customers whose text has every word of the query;
- `click(link)`: follow a link of the open page by its number or name (or its exact text);
- `submit(answer)`: finish.

A bad address, a missing link or a page past the end is an ordinary tool failure the agent sees.
Orders still `processing` have a `[cancel]` link: clicking it cancels the order in the site
state, which the `cancel_order` family grades.

The answers need facts from two or more pages (two listing pages, three listing pages, a search
result and a customer page, a forum post and a customer page), so an agent that can only see its
last page of history answers wrong even when it visited every page: this is what the harness rule
`observation_window` changes.

The site's records and their generator are in `site.py`, the text pages in `pages.py`, the tools
in `tools.py` and the families in `families.py`.
"""

from __future__ import annotations

from harnessrl.tasks.base import Family, Suite, Tool
from harnessrl.tasks.suites.browse.families import (
    cancel_order,
    cheapest_pair,
    out_of_stock_count,
    post_author_order,
    top_poster,
)
from harnessrl.tasks.suites.browse.tools import CLICK, NEXT_PAGE, OPEN, SEARCH

FAMILIES: dict[str, Family] = {
    "cheapest_pair": cheapest_pair,
    "top_poster": top_poster,
    "out_of_stock_count": out_of_stock_count,
    "post_author_order": post_author_order,
    "cancel_order": cancel_order,
}


class BrowseSuite(Suite):
    """Questions about a generated web shop, answered by browsing its text pages."""

    name = "browse"
    description = "Browse a generated shop and forum (text pages); answers need facts from 2-3 pages."
    needs_workspace = False  # splits 2000 / 48 / 72 and pass threshold 1.0: the Suite defaults

    def families(self) -> dict[str, Family]:
        return dict(FAMILIES)

    def base_tools(self) -> list[Tool]:
        return [OPEN, NEXT_PAGE, SEARCH, CLICK]
