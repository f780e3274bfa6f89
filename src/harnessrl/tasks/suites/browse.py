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
"""

from __future__ import annotations

import copy
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import parse_qs, quote, urlsplit

from harnessrl.tasks.base import Environment, Family, Suite, TaskParts, Tool, ToolFailed, solution_call
from harnessrl.tasks.grading import fmt_number, numbers_in, numeric_check, text_matches
from harnessrl.tasks.suites.pools import load_pools

PAGE_SIZE = 4  # items per listing page: small pages keep observations short for a 135M model
MAX_SEARCH_RESULTS = 8

_POOLS = load_pools("browse")  # package data: suites/data/browse.json
CATEGORIES: dict[str, list[str]] = _POOLS["categories"]  # category -> product kinds
MATERIALS: list[str] = _POOLS["materials"]
BRANDS: list[str] = _POOLS["brands"]
FIRST_NAMES: list[str] = _POOLS["first_names"]
SURNAMES: list[str] = _POOLS["surnames"]
STATUSES = ["processing", "shipped", "delivered"]
DAMAGES: list[str] = _POOLS["damages"]
TOPICS: list[str] = _POOLS["topics"]
POST_TEMPLATES: list[str] = _POOLS["post_templates"]


def money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


# -- the site: plain data, generated from a seed ---------------------------------------------------


class SiteBuilder:
    """Builds a site as plain JSON data (it is part of the task's fingerprint).

    products: {id, name, category, price (cents), stock, rating (tenths), brand}
    customers: {user, name}; orders: {id, customer, product, qty, status}
    threads: {id, title, posts: [{id, author, text}]}
    """

    def __init__(self, rng: random.Random, categories: list[str]):
        self.rng = rng
        self.categories = categories
        self.products: list[dict[str, Any]] = []
        self.customers: list[dict[str, str]] = []
        self.orders: list[dict[str, Any]] = []
        self.threads: list[dict[str, Any]] = []
        self._names: set[str] = set()
        self._order_ids: set[int] = set()
        self._post_id = 0

    # products
    def product_names(self, category: str, n: int) -> list[str]:
        """n new product names of a category, sorted as its listing shows them."""
        out: list[str] = []
        while len(out) < n:
            name = f"{self.rng.choice(MATERIALS)} {self.rng.choice(CATEGORIES[category])}"
            if name not in self._names:
                self._names.add(name)
                out.append(name)
        return sorted(out)

    def add_product(self, category: str, name: str, price: int | None = None, stock: int | None = None) -> dict:
        product = {
            "id": len(self.products) + 1,
            "name": name,
            "category": category,
            "price": price if price is not None else self.rng.randrange(250, 9000, 5),
            "stock": stock if stock is not None else self.rng.randint(1, 20),
            "rating": self.rng.randint(20, 50),
            "brand": self.rng.choice(BRANDS),
        }
        self.products.append(product)
        return product

    def fill_category(self, category: str, n: int) -> None:
        for name in self.product_names(category, n):
            self.add_product(category, name)

    # people and orders
    def add_customers(self, n: int) -> list[str]:
        taken = {c["user"] for c in self.customers}
        users: list[str] = []
        while len(users) < n:
            first, last = self.rng.choice(FIRST_NAMES), self.rng.choice(SURNAMES)
            user = (first[0] + last).lower()
            if user not in taken:
                taken.add(user)
                self.customers.append({"user": user, "name": f"{first} {last}"})
                users.append(user)
        return users

    def add_order(self, customer: str, product: dict, status: str | None = None) -> dict:
        while True:
            order_id = self.rng.randint(1000, 9999)
            if order_id not in self._order_ids:
                self._order_ids.add(order_id)
                break
        order = {
            "id": order_id,
            "customer": customer,
            "product": product["id"],
            "qty": self.rng.randint(1, 3),
            "status": status or self.rng.choice(STATUSES),
        }
        self.orders.append(order)
        return order

    # forum
    def post(self, author: str, text: str) -> dict:
        self._post_id += 1
        return {"id": self._post_id, "author": author, "text": text}

    def chatter(self, author: str) -> dict:
        """An ordinary post: no damage words, about a random product."""
        text = self.rng.choice(POST_TEMPLATES).format(product=self.rng.choice(self.products)["name"])
        return self.post(author, text)

    def add_thread(self, title: str, posts: list[dict]) -> dict:
        thread = {"id": len(self.threads) + 1, "title": title, "posts": posts}
        self.threads.append(thread)
        return thread

    def filler_threads(self, n: int, users: list[str]) -> None:
        titles = [t for t in TOPICS if all(t != th["title"] for th in self.threads)]
        for title in self.rng.sample(titles, n):
            self.add_thread(title, [self.chatter(self.rng.choice(users)) for _ in range(self.rng.randint(2, 4))])

    def site(self) -> dict[str, Any]:
        self.orders.sort(key=lambda o: o["id"])
        posts = [p for t in self.threads for p in t["posts"]]
        for i, post in enumerate(posts, 1):  # numbered in reading order, whatever was inserted where
            post["id"] = i
        return {
            "categories": list(self.categories),
            "products": self.products,
            "customers": self.customers,
            "orders": self.orders,
            "threads": self.threads,
        }


def new_site(rng: random.Random, target: str | None = None) -> SiteBuilder:
    """A builder with three categories (the target one first if given), the others filled."""
    others = [c for c in sorted(CATEGORIES) if c != target]
    cats = ([target] if target else []) + rng.sample(others, 3 - (1 if target else 0))
    b = SiteBuilder(rng, cats)
    for c in cats:
        if c != target:
            b.fill_category(c, rng.randint(3, 6))
    return b


def filler_people(b: SiteBuilder, n_customers: int = 4) -> list[str]:
    """Customers with one or two orders each, and two or three forum threads of chatter."""
    users = b.add_customers(n_customers)
    for u in users:
        for _ in range(b.rng.randint(1, 2)):
            b.add_order(u, b.rng.choice(b.products))
    b.filler_threads(b.rng.randint(2, 3), users)
    return users


# -- pages -------------------------------------------------------------------------------------------


@dataclass
class Page:
    """One rendered page: its text, and where each of its links leads.

    A link target is an address, or `cancel:<order id>` for the cancel form of an order.
    """

    url: str
    text: str
    links: dict[str, str] = field(default_factory=dict)  # key ("1", "next", "kmiller") -> target
    labels: dict[str, str] = field(default_factory=dict)  # key -> the text shown for it
    next_url: str | None = None


class _PageBuilder:
    def __init__(self, url: str, title: str):
        self.url = url
        self.lines = [f"Page: {url} | {title}"]
        self.links: dict[str, str] = {}
        self.labels: dict[str, str] = {}
        self.next_url: str | None = None

    def link(self, key: str, target: str, label: str) -> str:
        self.links[key.lower()] = target
        self.labels[key.lower()] = label
        return f"[{key}]"

    def item(self, target: str, label: str, rest: str = "") -> None:
        n = str(sum(k.isdigit() for k in self.links) + 1)
        self.lines.append(f"{self.link(n, target, label)} {label}{rest}")

    def pager(self, base: str, page: int, pages: int) -> None:
        sep = "&" if "?" in base else "?"
        if page > 1:
            self.lines.append(f"{self.link('prev', f'{base}{sep}page={page - 1}', 'previous page')} previous page")
        if page < pages:
            self.next_url = f"{base}{sep}page={page + 1}"
            self.lines.append(f"{self.link('next', self.next_url, 'next page')} next page")

    def page(self) -> Page:
        return Page(self.url, "\n".join(self.lines), self.links, self.labels, self.next_url)


def _paged(items: list[Any], page: int, url: str) -> tuple[list[Any], int]:
    pages = max(1, -(-len(items) // PAGE_SIZE))
    if not 1 <= page <= pages:
        raise ToolFailed(f"{url}: there is no page {page} (pages 1-{pages})")
    return items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE], pages


def _listing_line(p: dict) -> str:
    return f" - {money(p['price'])} - stock {p['stock']} - rating {p['rating'] / 10:.1f}"


def _order_line(site: dict, o: dict) -> str:
    p = _product_by_id(site, o["product"])
    return f" - {o['qty']} x {p['name']} - {money(o['qty'] * p['price'])} - {o['status']}"


def _product_by_id(site: dict, pid: int) -> dict:
    return next(p for p in site["products"] if p["id"] == pid)


def page_home(site: dict, url: str, q: dict) -> Page:
    b = _PageBuilder(url, "Shop home")
    b.lines.append("Categories: " + " ".join(b.link(c, f"/products?category={c}", c) for c in site["categories"]))
    b.lines.append(f"{b.link('forum', '/forum', 'forum')} forum ({len(site['threads'])} threads)")
    b.lines.append("search(query) finds products, threads, posts and customers.")
    return b.page()


def page_products(site: dict, url: str, q: dict) -> Page:
    cat = _param(q, "category", url)
    if cat not in site["categories"]:
        raise ToolFailed(f"no category '{cat}' (categories: {', '.join(site['categories'])})")
    items = sorted((p for p in site["products"] if p["category"] == cat), key=lambda p: p["name"])
    page = _page_number(q, url)
    shown, pages = _paged(items, page, url)
    b = _PageBuilder(url, f"{cat.title()} products, page {page} of {pages} ({len(items)} products, by name)")
    for p in shown:
        b.item(f"/product/{p['id']}", p["name"], _listing_line(p))
    b.pager(f"/products?category={cat}", page, pages)
    return b.page()


def page_product(site: dict, url: str, pid: str) -> Page:
    p = next((p for p in site["products"] if str(p["id"]) == pid), None)
    if p is None:
        raise ToolFailed(f"no product {pid}")
    b = _PageBuilder(url, f"Product {p['id']}: {p['name']}")
    b.lines.append(f"Category: {b.link(p['category'], '/products?category=' + p['category'], p['category'])}")
    b.lines.append(f"Price: {money(p['price'])} | Stock: {p['stock']} | Rating: {p['rating'] / 10:.1f} / 5")
    b.lines.append(f"Brand: {p['brand']}")
    return b.page()


def page_customer(site: dict, url: str, user: str) -> Page:
    c = next((c for c in site["customers"] if c["user"] == user.lower()), None)
    if c is None:
        raise ToolFailed(f"no customer '{user}'")
    b = _PageBuilder(url, f"Customer {c['user']} ({c['name']})")
    orders = [o for o in site["orders"] if o["customer"] == c["user"]]
    b.lines.append(f"Orders ({len(orders)}):")
    for o in orders:
        b.item(f"/order/{o['id']}", f"Order #{o['id']}", _order_line(site, o))
    return b.page()


def page_order(site: dict, url: str, oid: str) -> Page:
    o = next((o for o in site["orders"] if str(o["id"]) == oid.lstrip("#")), None)
    if o is None:
        raise ToolFailed(f"no order {oid}")
    p = _product_by_id(site, o["product"])
    user = o["customer"]
    b = _PageBuilder(url, f"Order #{o['id']}")
    b.lines.append(f"Customer: {b.link(user, '/customer/' + user, user)}")
    b.item(f"/product/{p['id']}", p["name"], f" x {o['qty']} at {money(p['price'])}")
    b.lines.append(f"Total: {money(o['qty'] * p['price'])} | Status: {o['status']}")
    if o["status"] == "processing":
        b.lines.append(b.link("cancel", f"cancel:{o['id']}", "cancel this order") + " cancel this order")
    return b.page()


def page_forum(site: dict, url: str, q: dict) -> Page:
    b = _PageBuilder(url, f"Forum, {len(site['threads'])} threads")
    for t in site["threads"]:
        b.item(f"/thread/{t['id']}", t["title"], f" ({len(t['posts'])} posts)")
    return b.page()


def page_thread(site: dict, url: str, tid: str, q: dict) -> Page:
    t = next((t for t in site["threads"] if str(t["id"]) == tid), None)
    if t is None:
        raise ToolFailed(f"no thread {tid}")
    page = _page_number(q, url)
    shown, pages = _paged(t["posts"], page, url)
    b = _PageBuilder(url, f'Thread {t["id"]} "{t["title"]}", page {page} of {pages}')
    for post in shown:
        b.lines.append(
            f"#{post['id']} {b.link(post['author'], '/customer/' + post['author'], post['author'])}: {post['text']}"
        )
    b.pager(f"/thread/{t['id']}", page, pages)
    return b.page()


def _matches(words: list[str], text: str) -> bool:
    have = set(re.findall(r"[a-z0-9#-]+", text.lower()))
    return all(w in have for w in words)


def page_search(site: dict, url: str, q: dict) -> Page:
    query = " ".join(q.get("q", [""])).strip()
    words = re.findall(r"[a-z0-9#-]+", query.lower())
    if not words:
        raise ToolFailed("the search query is empty")
    b = _PageBuilder(url, f'Search "{query}"')
    found = 0
    for p in site["products"]:
        if _matches(words, p["name"]) and found < MAX_SEARCH_RESULTS:
            found += 1
            b.item(f"/product/{p['id']}", p["name"], f" (product, {money(p['price'])})")
    for t in site["threads"]:
        if _matches(words, t["title"]) and found < MAX_SEARCH_RESULTS:
            found += 1
            b.item(f"/thread/{t['id']}", t["title"], " (thread)")
        for i, post in enumerate(t["posts"]):
            if _matches(words, post["text"]) and found < MAX_SEARCH_RESULTS:
                found += 1
                where = f"/thread/{t['id']}?page={i // PAGE_SIZE + 1}"
                author = b.link(post["author"], "/customer/" + post["author"], post["author"])
                b.item(where, f"post #{post['id']}", f' by {author} in "{t["title"]}": {post["text"]}')
    for c in site["customers"]:
        if _matches(words, f"{c['user']} {c['name']}") and found < MAX_SEARCH_RESULTS:
            found += 1
            b.item(f"/customer/{c['user']}", c["user"], f" (customer {c['name']})")
    b.lines[0] += f": {found} result(s)" if found else ": no results"
    return b.page()


def _param(q: dict, name: str, url: str) -> str:
    values = q.get(name)
    if not values:
        raise ToolFailed(f"{url}: missing ?{name}=")
    return values[0].strip().lower()


def _page_number(q: dict, url: str) -> int:
    raw = q.get("page", ["1"])[0]
    if not raw.strip().isdigit():
        raise ToolFailed(f"{url}: page must be a number, got '{raw}'")
    return int(raw)


PAGE_HELP = "pages: /, /products?category=NAME, /product/ID, /customer/NAME, /order/ID, /forum, /thread/ID"


def render(site: dict, url: str) -> Page:
    """The page at an address (leading `http://host` and a missing leading `/` are forgiven)."""
    raw = str(url).strip().strip("'\"")
    try:
        parts = urlsplit(raw if "://" in raw else "//x/" + raw.lstrip("/"))
    except ValueError as e:  # e.g. an unclosed [ in the host part
        raise ToolFailed(f"not a valid address '{raw}' ({e}); {PAGE_HELP}") from None
    path = "/" + parts.path.strip("/")
    q = parse_qs(parts.query)
    shown = path + ("?" + parts.query if parts.query else "")
    segs = [s for s in path.split("/") if s]
    if not segs:
        return page_home(site, shown, q)
    head, rest = segs[0].lower(), segs[1:]
    if head == "products" and not rest:
        return page_products(site, shown, q)
    if head == "forum" and not rest:
        return page_forum(site, shown, q)
    if head == "search" and not rest:
        return page_search(site, shown, q)
    if len(rest) == 1:
        if head == "product":
            return page_product(site, shown, rest[0])
        if head == "customer":
            return page_customer(site, shown, rest[0])
        if head == "order":
            return page_order(site, shown, rest[0])
        if head == "thread":
            return page_thread(site, shown, rest[0], q)
    raise ToolFailed(f"no page at '{shown}' ({PAGE_HELP})")


# -- tools -------------------------------------------------------------------------------------------


def _show(env: Environment, page: Page) -> str:
    env.state["page"] = page
    return page.text


def _current(env: Environment) -> Page:
    page = env.state.get("page")
    if page is None:
        raise ToolFailed('no page is open yet: open one with open(url), e.g. open(url="/")')
    return page


def _open(env: Environment, url: str) -> str:
    return _show(env, render(env.state["site"], url))


def _next_page(env: Environment) -> str:
    page = _current(env)
    if page.next_url is None:
        raise ToolFailed(f"{page.url} has no next page")
    return _show(env, render(env.state["site"], page.next_url))


def _search(env: Environment, query: str) -> str:
    return _show(env, render(env.state["site"], "/search?q=" + quote(str(query).strip())))


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
    site = env.state["site"]
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

# -- families ----------------------------------------------------------------------------------------


def _setup(site: dict) -> Callable[[Environment], None]:
    def setup(env: Environment) -> None:
        env.state["site"] = copy.deepcopy(site)
        env.state["page"] = None

    return setup


def _listing(category: str) -> str:
    return f"/products?category={category}"


def cheapest_pair(rng: random.Random) -> TaskParts:
    """Two listing pages: the cheapest product is on page 1, the second cheapest on page 2."""
    cat = rng.choice(sorted(CATEGORIES))
    b = new_site(rng, cat)
    names = b.product_names(cat, rng.randint(6, 8))
    prices = sorted(rng.sample(range(250, 9000, 5), len(names)))
    on_page1, on_page2 = rng.randrange(0, PAGE_SIZE), rng.randrange(PAGE_SIZE, len(names))
    cheap = prices[:2]
    rng.shuffle(cheap)
    rest = prices[2:]
    rng.shuffle(rest)
    for i, name in enumerate(names):
        price = cheap[0] if i == on_page1 else cheap[1] if i == on_page2 else rest.pop()
        b.add_product(cat, name, price=price)
    filler_people(b)
    total = (prices[0] + prices[1]) / 100
    site = b.site()
    return {
        "instruction": (
            f"What is the total price of the two cheapest products in the {cat} category? "
            f"Its listing {_listing(cat)} has 2 pages. Submit the total."
        ),
        "setup": _setup(site),
        "check": numeric_check(total),
        "solution": [
            solution_call("open", url=_listing(cat)),
            solution_call("next_page"),
            solution_call("submit", answer=fmt_number(total)),
        ],
        "data": {"site": site, "category": cat},
        "required_observations": ["open", "next_page"],
    }


def out_of_stock_count(rng: random.Random) -> TaskParts:
    """Three listing pages, each with at least one product out of stock."""
    cat = rng.choice(sorted(CATEGORIES))
    b = new_site(rng, cat)
    names = b.product_names(cat, rng.randint(9, 12))
    empty: set[int] = set()
    for start in range(0, len(names), PAGE_SIZE):
        on_page = list(range(start, min(start + PAGE_SIZE, len(names))))
        empty |= set(rng.sample(on_page, rng.randint(1, min(2, len(on_page)))))
    for i, name in enumerate(names):
        b.add_product(cat, name, stock=0 if i in empty else rng.randint(1, 20))
    filler_people(b)
    site = b.site()
    return {
        "instruction": (
            f"How many products in the {cat} category are out of stock (stock 0)? "
            f"Its listing {_listing(cat)} has 3 pages. Submit the number."
        ),
        "setup": _setup(site),
        "check": numeric_check(len(empty)),
        "solution": [
            solution_call("open", url=_listing(cat)),
            solution_call("next_page"),
            solution_call("next_page"),
            solution_call("submit", answer=str(len(empty))),
        ],
        "data": {"site": site, "category": cat},
        "required_observations": ["open", "next_page"],
    }


def _top_poster_authors(rng: random.Random, users: list[str]) -> tuple[list[str], str]:
    """Authors of 6-8 posts: one user wrote the most, but page 2 alone does not show it."""
    while True:
        authors = [rng.choice(users) for _ in range(rng.randint(6, 8))]
        (top, n), *others = Counter(authors).most_common() + [("", 0)]
        if others[0][1] == n:
            continue  # a tie overall
        page2 = Counter(authors[PAGE_SIZE:])
        if any(c >= page2[top] for u, c in page2.items() if u != top):
            return authors, top


def top_poster(rng: random.Random) -> TaskParts:
    b = new_site(rng)
    users = filler_people(b, 5)
    posters = rng.sample(users, 3)
    authors, top = _top_poster_authors(rng, posters)
    title = rng.choice([t for t in TOPICS if all(t != th["title"] for th in b.threads)])
    thread = b.add_thread(title, [b.chatter(a) for a in authors])
    rng.shuffle(b.threads)  # the thread asked about is not always the last one
    for i, t in enumerate(b.threads, 1):
        t["id"] = i
    site = b.site()
    url = f"/thread/{thread['id']}"

    def check(env: Environment) -> dict[str, float]:
        return {"answer": 1.0 if text_matches(env.answer, top, posters) else 0.0}

    return {
        "instruction": (
            f'Who wrote the most posts in the forum thread "{title}" ({url})? The thread has 2 pages. '
            "Submit the user name."
        ),
        "setup": _setup(site),
        "check": check,
        "solution": [solution_call("open", url=url), solution_call("next_page"), solution_call("submit", answer=top)],
        "data": {"site": site, "thread": thread["id"]},
        "required_observations": ["open", "next_page"],
    }


def post_author_order(rng: random.Random) -> TaskParts:
    """Search finds a complaint; its author's customer page has several orders; one has the product."""
    b = new_site(rng)
    users = filler_people(b, 4)
    other = rng.choice(users)
    (author,) = b.add_customers(1)  # a customer with exactly the orders below
    bought = rng.sample(b.products, 3)
    product = bought[0]
    orders = [b.add_order(author, p) for p in bought]
    b.add_order(other, product)  # someone else bought it too: the author matters
    damage = rng.choice(DAMAGES)
    complaint = b.post(author, f"My {product['name']} arrived {damage}.")
    thread = rng.choice(b.threads)
    thread["posts"].insert(rng.randint(0, len(thread["posts"])), complaint)
    site = b.site()
    target = orders[0]["id"]
    others = {o["id"] for o in site["orders"]} - {target}

    def check(env: Environment) -> dict[str, float]:
        named = set(numbers_in(env.answer))
        return {"answer": 1.0 if target in named and not named & others else 0.0}

    return {
        "instruction": (
            f'A forum post says a product arrived {damage}. Search for "{damage}", click the name of '
            "the post's author, and submit the number of that customer's order of the product."
        ),
        "setup": _setup(site),
        "check": check,
        "solution": [
            solution_call("search", query=damage),
            solution_call("click", link=author),
            solution_call("submit", answer=str(target)),
        ],
        "data": {"site": site, "damage": damage},
        "required_observations": ["search", "click"],
    }


def cancel_order(rng: random.Random) -> TaskParts:
    """A forum post names the product; the customer page lists the orders; the order page cancels."""
    b = new_site(rng)
    users = filler_people(b, 4)
    (user,) = b.add_customers(1)  # a customer with exactly the orders below
    bought = rng.sample(b.products, 3)
    statuses = ["processing", "processing", rng.choice(STATUSES)]
    mine = [b.add_order(user, p, s) for p, s in zip(bought, statuses)]
    target = mine[0]
    name = bought[0]["name"]
    posts = [b.chatter(rng.choice(users)) for _ in range(rng.randint(1, 3))]
    posts.insert(rng.randint(0, len(posts)), b.post(user, f"Please cancel my {name} order, I no longer need it."))
    thread = b.add_thread("Change of plans", posts)
    site = b.site()
    before = {o["id"]: o["status"] for o in site["orders"]}
    link = str([o["id"] for o in site["orders"] if o["customer"] == user].index(target["id"]) + 1)

    def check(env: Environment) -> dict[str, float]:
        now = {o["id"]: o["status"] for o in env.state["site"]["orders"]}
        cancelled = now[target["id"]] == "cancelled"
        # Leaving the other orders alone earns credit only with the job done: doing nothing at
        # all must not score.
        kept = cancelled and all(now[i] == s for i, s in before.items() if i != target["id"])
        return {"cancelled": float(cancelled), "others_unchanged": float(kept)}

    url = f"/thread/{thread['id']}"
    return {
        "instruction": (
            f"In the forum thread {url}, {user} says which of their orders to cancel. Open their customer "
            f"page /customer/{user}, open that order, click its cancel link, then submit."
        ),
        "setup": _setup(site),
        "check": check,
        "solution": [
            solution_call("open", url=url),
            solution_call("open", url=f"/customer/{user}"),
            solution_call("click", link=link),
            solution_call("click", link="cancel"),
            solution_call("submit", answer=""),
        ],
        "data": {"site": site, "user": user},
        "required_observations": ["open", "click"],
    }


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
