"""The site of a `browse` task: its records, and the builder that generates them from a seed."""

from __future__ import annotations

import random
from typing import TypedDict

from harnessrl.tasks.suites.pools import load_pools

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


class Product(TypedDict):
    id: int
    name: str
    category: str
    price: int  # cents
    stock: int
    rating: int  # tenths of a star
    brand: str


class Customer(TypedDict):
    user: str
    name: str


class Order(TypedDict):
    id: int
    customer: str  # the customer's user name
    product: int  # the product's id
    qty: int
    status: str  # one of STATUSES, or "cancelled" once cancelled


class Post(TypedDict):
    id: int
    author: str  # a user name
    text: str


class Thread(TypedDict):
    id: int
    title: str
    posts: list[Post]


class Site(TypedDict):
    """A whole site: plain JSON data, part of a task's fingerprint (`Task.data["site"]`) and
    copied into `env.state["site"]` for an episode (cancelling an order changes the copy)."""

    categories: list[str]
    products: list[Product]
    customers: list[Customer]
    orders: list[Order]
    threads: list[Thread]


class SiteBuilder:
    """Builds a `Site`, drawing every name and number from `rng`."""

    def __init__(self, rng: random.Random, categories: list[str]):
        self.rng = rng
        self.categories = categories
        self.products: list[Product] = []
        self.customers: list[Customer] = []
        self.orders: list[Order] = []
        self.threads: list[Thread] = []
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

    def add_product(self, category: str, name: str, price: int | None = None, stock: int | None = None) -> Product:
        product: Product = {
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

    def add_order(self, customer: str, product: Product, status: str | None = None) -> Order:
        while True:
            order_id = self.rng.randint(1000, 9999)
            if order_id not in self._order_ids:
                self._order_ids.add(order_id)
                break
        order: Order = {
            "id": order_id,
            "customer": customer,
            "product": product["id"],
            "qty": self.rng.randint(1, 3),
            "status": status or self.rng.choice(STATUSES),
        }
        self.orders.append(order)
        return order

    # forum
    def post(self, author: str, text: str) -> Post:
        self._post_id += 1
        return {"id": self._post_id, "author": author, "text": text}

    def chatter(self, author: str) -> Post:
        """An ordinary post: no damage words, about a random product."""
        text = self.rng.choice(POST_TEMPLATES).format(product=self.rng.choice(self.products)["name"])
        return self.post(author, text)

    def add_thread(self, title: str, posts: list[Post]) -> Thread:
        thread: Thread = {"id": len(self.threads) + 1, "title": title, "posts": posts}
        self.threads.append(thread)
        return thread

    def filler_threads(self, n: int, users: list[str]) -> None:
        titles = [t for t in TOPICS if all(t != th["title"] for th in self.threads)]
        for title in self.rng.sample(titles, n):
            self.add_thread(title, [self.chatter(self.rng.choice(users)) for _ in range(self.rng.randint(2, 4))])

    def site(self) -> Site:
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
