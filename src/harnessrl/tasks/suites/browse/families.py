"""The families of the `browse` suite: each builds a site around one question whose answer
needs facts from two or three of its pages."""

from __future__ import annotations

import copy
import random
from collections import Counter
from typing import Callable

from harnessrl.tasks.base import Environment, TaskParts, solution_call
from harnessrl.tasks.grading import fmt_number, numbers_in, numeric_check, text_matches
from harnessrl.tasks.suites.browse.pages import PAGE_SIZE
from harnessrl.tasks.suites.browse.site import (
    CATEGORIES,
    DAMAGES,
    STATUSES,
    TOPICS,
    Site,
    filler_people,
    new_site,
)


def _setup(site: Site) -> Callable[[Environment], None]:
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
    if len(empty) == 3:  # the answer would be the page count the instruction states (`harnessrl audit`)
        empty.add(min(set(range(PAGE_SIZE)) - empty))
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
