"""The pages of a `browse` site, rendered as compact text with numbered and named links."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

from harnessrl.tasks.base import ToolFailed
from harnessrl.tasks.suites.browse.site import Order, Product, Site

PAGE_SIZE = 4  # items per listing page: small pages keep observations short for a 135M model
MAX_SEARCH_RESULTS = 8


def money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


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


Item = TypeVar("Item")
Query = dict[str, list[str]]  # an address's query, as urllib.parse.parse_qs reads it


def _paged(items: list[Item], page: int, url: str) -> tuple[list[Item], int]:
    pages = max(1, -(-len(items) // PAGE_SIZE))
    if not 1 <= page <= pages:
        raise ToolFailed(f"{url}: there is no page {page} (pages 1-{pages})")
    return items[(page - 1) * PAGE_SIZE : page * PAGE_SIZE], pages


def _listing_line(p: Product) -> str:
    return f" - {money(p['price'])} - stock {p['stock']} - rating {p['rating'] / 10:.1f}"


def _order_line(site: Site, o: Order) -> str:
    p = _product_by_id(site, o["product"])
    return f" - {o['qty']} x {p['name']} - {money(o['qty'] * p['price'])} - {o['status']}"


def _product_by_id(site: Site, pid: int) -> Product:
    return next(p for p in site["products"] if p["id"] == pid)


def page_home(site: Site, url: str, q: Query) -> Page:
    b = _PageBuilder(url, "Shop home")
    b.lines.append("Categories: " + " ".join(b.link(c, f"/products?category={c}", c) for c in site["categories"]))
    b.lines.append(f"{b.link('forum', '/forum', 'forum')} forum ({len(site['threads'])} threads)")
    b.lines.append("search(query) finds products, threads, posts and customers.")
    return b.page()


def page_products(site: Site, url: str, q: Query) -> Page:
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


def page_product(site: Site, url: str, pid: str) -> Page:
    p = next((p for p in site["products"] if str(p["id"]) == pid), None)
    if p is None:
        raise ToolFailed(f"no product {pid}")
    b = _PageBuilder(url, f"Product {p['id']}: {p['name']}")
    b.lines.append(f"Category: {b.link(p['category'], '/products?category=' + p['category'], p['category'])}")
    b.lines.append(f"Price: {money(p['price'])} | Stock: {p['stock']} | Rating: {p['rating'] / 10:.1f} / 5")
    b.lines.append(f"Brand: {p['brand']}")
    return b.page()


def page_customer(site: Site, url: str, user: str) -> Page:
    c = next((c for c in site["customers"] if c["user"] == user.lower()), None)
    if c is None:
        raise ToolFailed(f"no customer '{user}'")
    b = _PageBuilder(url, f"Customer {c['user']} ({c['name']})")
    orders = [o for o in site["orders"] if o["customer"] == c["user"]]
    b.lines.append(f"Orders ({len(orders)}):")
    for o in orders:
        b.item(f"/order/{o['id']}", f"Order #{o['id']}", _order_line(site, o))
    return b.page()


def page_order(site: Site, url: str, oid: str) -> Page:
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


def page_forum(site: Site, url: str, q: Query) -> Page:
    b = _PageBuilder(url, f"Forum, {len(site['threads'])} threads")
    for t in site["threads"]:
        b.item(f"/thread/{t['id']}", t["title"], f" ({len(t['posts'])} posts)")
    return b.page()


def page_thread(site: Site, url: str, tid: str, q: Query) -> Page:
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


def page_search(site: Site, url: str, q: Query) -> Page:
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


def _param(q: Query, name: str, url: str) -> str:
    values = q.get(name)
    if not values:
        raise ToolFailed(f"{url}: missing ?{name}=")
    return values[0].strip().lower()


def _page_number(q: Query, url: str) -> int:
    raw = q.get("page", ["1"])[0]
    if not raw.strip().isdigit():
        raise ToolFailed(f"{url}: page must be a number, got '{raw}'")
    return int(raw)


PAGE_HELP = "pages: /, /products?category=NAME, /product/ID, /customer/NAME, /order/ID, /forum, /thread/ID"


def render(site: Site, url: str) -> Page:
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
