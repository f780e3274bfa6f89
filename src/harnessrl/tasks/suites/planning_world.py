"""The generated world of a `planning` task: a trip request and the services it can be built from.

A world holds, for a few cities, dated flights and trains between them, hotels, restaurants and
attractions with prices, ratings, opening hours and closing days. It is built *around a plan*:
`build_trip` first fixes a schedule that meets every requirement of the request (the known-good
plan), then creates the items that plan uses, then adds distractors: cheaper options that break
one requirement (an earlier departure, the other transport mode, a lower rating, a non-vegetarian
dinner), restaurants open at the wrong hours, dearer alternatives. So a feasible plan always
exists, and the cheapest-looking choice is often not allowed.

Times are minutes after midnight; prices are whole currency units; one traveller.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, Sequence

from harnessrl.tasks.suites.pools import load_pools

_POOLS = load_pools("planning")  # package data: suites/data/planning.json
CITIES: list[str] = _POOLS["cities"]
CUISINES: list[str] = _POOLS["cuisines"]
WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
ADJECTIVES: list[str] = _POOLS["adjectives"]
SIGHTS: list[str] = _POOLS["sights"]


MEAL_MINUTES = 60  # every meal takes one hour
VISIT_MINUTES = (60, 90, 120)  # what an attraction's visit can last
MAX_ROWS = 8  # a search shows at most this many rows; worlds are generated to fit it

# When the known-good plan puts each activity (start times, minutes after midnight).
MORNING_VISIT = 10 * 60
LUNCH = 13 * 60
AFTERNOON_VISIT = 15 * 60
DINNER = 19 * 60
DINNER_WINDOW = (17 * 60, 21 * 60 + 30)  # a meal starting in here is a dinner


def hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


# -- world records ----------------------------------------------------------------------------------


@dataclass
class Service:
    """A flight or a train on one date."""

    id: str
    mode: str  # "flight" or "train"
    origin: str
    destination: str
    date: str  # ISO date
    depart: int
    arrive: int
    price: int


@dataclass
class Hotel:
    id: str
    city: str
    rating: float
    price: int  # per night


@dataclass
class Restaurant:
    id: str
    city: str
    cuisine: str
    vegetarian: bool
    rating: float
    price: int  # per meal
    opens: int
    closes: int


@dataclass
class Attraction:
    id: str
    name: str
    city: str
    price: int  # ticket
    opens: int
    closes: int
    closed_on: str | None  # weekday abbreviation, e.g. "Mon"
    duration: int  # minutes a visit lasts


@dataclass
class Constraint:
    """One personal requirement of the request (see `planning.CONSTRAINT_CHECKS`)."""

    kind: str
    value: Any = None


@dataclass
class TripRequest:
    """The trip a planning task asks for: where from, when, the stops, the budget, the constraints."""

    home: str
    start: str  # ISO date of day 1
    days: int
    stops: list[tuple[str, int]]  # (city, nights) in order; a day trip has one stop with 0 nights
    budget: int
    constraints: list[Constraint]

    def date_of(self, day: int) -> date | None:
        """Calendar date of a 1-based trip day; None outside the trip."""
        if not 1 <= day <= self.days:
            return None
        return date.fromisoformat(self.start) + timedelta(days=day - 1)

    def night_cities(self) -> list[str]:
        """Where the traveller sleeps after day 1, 2, ..., D-1."""
        return [city for city, nights in self.stops for _ in range(nights)]

    def constraint(self, kind: str) -> Constraint | None:
        return next((c for c in self.constraints if c.kind == kind), None)


Record = Service | Hotel | Restaurant | Attraction  # an item of a world, found by its id


@dataclass
class World:
    cities: list[str]
    services: list[Service] = field(default_factory=list)
    hotels: list[Hotel] = field(default_factory=list)
    restaurants: list[Restaurant] = field(default_factory=list)
    attractions: list[Attraction] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_id: dict[str, Record] = {}
        items: list[Record] = [*self.services, *self.hotels, *self.restaurants, *self.attractions]
        for item in items:
            self.by_id[item.id] = item

    def digest(self) -> str:
        """A short hash of every item (records hold only plain values, so their repr is exact)."""
        blob = repr((self.cities, self.services, self.hotels, self.restaurants, self.attractions))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# -- the known-good plan ----------------------------------------------------------------------------


@dataclass
class PlannedDay:
    """One day of the plan built alongside the world (objects, not ids: ids come last)."""

    travel: list[Service] = field(default_factory=list)
    hotel: Hotel | None = None
    meals: list[tuple[Restaurant, int]] = field(default_factory=list)
    visits: list[tuple[Attraction, int]] = field(default_factory=list)


def plan_cost(days: list[PlannedDay]) -> int:
    return sum(
        sum(s.price for s in d.travel)
        + (d.hotel.price if d.hotel else 0)
        + sum(r.price for r, _ in d.meals)
        + sum(a.price for a, _ in d.visits)
        for d in days
    )


def plan_to_itinerary(days: list[PlannedDay]) -> dict[str, Any]:
    """The plan in the submit format (see `planning.ITINERARY_FORMAT`)."""
    return {
        "days": [
            {
                "day": i,
                "travel": [s.id for s in d.travel],
                "hotel": d.hotel.id if d.hotel else None,
                "meals": [{"id": r.id, "time": hhmm(t)} for r, t in d.meals],
                "visits": [{"id": a.id, "time": hhmm(t)} for a, t in d.visits],
            }
            for i, d in enumerate(days, start=1)
        ],
        "total_cost": plan_cost(days),
    }


# -- building a trip --------------------------------------------------------------------------------

# Optional personal requirements; `stops` (sleep in the requested cities) is always part of a request.
OPTIONAL_KINDS = (
    "depart_after",
    "mode",
    "hotel_rating",
    "hotel_price",
    "veg_dinner",
    "must_visit",
    "cuisine",
    "restaurant_rating",
    "visit_each_day",
)
NEEDS_A_NIGHT = ("hotel_rating", "hotel_price", "veg_dinner")


@dataclass
class Trip:
    world: World
    request: TripRequest
    plan: list[PlannedDay]


def _rating(rng: random.Random, lo: float, hi: float = 4.9) -> float:
    return round(rng.uniform(lo, hi), 1)


MAX_NIGHTS_PER_STOP = 3  # keeps each city's attractions within one search page


def _split_nights(rng: random.Random, nights: int, stops: int) -> list[int]:
    split = [1] * stops
    for _ in range(nights - stops):
        split[rng.choice([i for i in range(stops) if split[i] < MAX_NIGHTS_PER_STOP])] += 1
    return split


def _choose_constraints(rng: random.Random, count: int, day_trip: bool) -> list[Constraint]:
    kinds = [k for k in OPTIONAL_KINDS if not (day_trip and k in NEEDS_A_NIGHT)]
    chosen = rng.sample(kinds, min(count, len(kinds)))
    values = {
        "depart_after": rng.choice([8, 9, 10]) * 60,
        "mode": rng.choice(["train", "flight"]),
        "hotel_rating": rng.choice([3.5, 4.0, 4.5]),
        "hotel_price": rng.choice([90, 110, 130, 150]),
        "veg_dinner": True,
        "must_visit": None,  # the attraction's name, filled in once attractions exist
        "cuisine": rng.choice(CUISINES),
        "restaurant_rating": rng.choice([4.0, 4.3, 4.5]),
        "visit_each_day": True,
    }
    return [Constraint("stops")] + [Constraint(k, values[k]) for k in OPTIONAL_KINDS if k in chosen]


class _SightNames:
    """Unique attraction names within one world ("Old Fortress", "Bergen Zoo")."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def make(self, city: str) -> str:
        for _ in range(200):
            sight, adjective = self.rng.choice(SIGHTS), self.rng.choice(ADJECTIVES)
            name = f"{adjective} {sight}" if self.rng.random() < 0.5 and adjective not in sight else f"{city} {sight}"
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("ran out of attraction names")  # pragma: no cover - 200+ names per city


class _Builder:
    """Builds one trip: the plan first, then the world items around it."""

    def __init__(self, rng: random.Random, days: int, n_stops: int, n_constraints: int):
        self.rng = rng
        cities = rng.sample(CITIES, n_stops + 1)
        self.home, stop_cities = cities[0], cities[1:]
        nights = [0] if days == 1 else _split_nights(rng, days - 1, n_stops)
        self.stops = list(zip(stop_cities, nights))
        self.days = days
        self.start = date(2026, 1, 5) + timedelta(days=rng.randrange(340))
        self.constraints = _choose_constraints(rng, n_constraints, day_trip=days == 1)
        self.c = {c.kind: c.value for c in self.constraints}
        self.sight_names = _SightNames(rng)
        self.services: list[Service] = []
        self.hotels: list[Hotel] = []
        self.restaurants: list[Restaurant] = []
        self.attractions: list[Attraction] = []

    def weekday(self, day: int) -> str:
        return WEEKDAYS[(self.start + timedelta(days=day - 1)).weekday()]

    def iso(self, day: int) -> str:
        return (self.start + timedelta(days=day - 1)).isoformat()

    # -- transport ----------------------------------------------------------------------------
    def _service(self, mode: str, origin: str, dest: str, day: int, depart: int, price: int) -> Service:
        lo, hi = (60, 150) if mode == "flight" else (90, 150)
        duration = self.rng.randrange(lo, hi + 1, 5)
        s = Service("", mode, origin, dest, self.iso(day), depart, depart + duration, price)
        self.services.append(s)
        return s

    def leg(self, origin: str, dest: str, day: int, window: tuple[int, int], morning: bool) -> Service:
        """The plan's service for one leg, plus distractors on the same route and date."""
        rng, earliest = self.rng, self.c.get("depart_after", 0)
        lo = max(window[0], earliest) if morning else window[0]
        mode = self.c.get("mode") or rng.choice(["flight", "train"])
        other = "train" if mode == "flight" else "flight"
        depart = rng.randrange(lo, window[1] + 1, 5)
        base = rng.randint(60, 200) if mode == "flight" else rng.randint(35, 120)
        chosen = self._service(mode, origin, dest, day, depart, base)
        if morning and "depart_after" in self.c:  # cheaper, but leaves too early
            early = rng.randrange(6 * 60, self.c["depart_after"] - 15 + 1, 5)
            self._service(mode, origin, dest, day, early, max(20, base - rng.randint(10, 30)))
        if "mode" in self.c:  # cheaper, same departure window, wrong mode
            self._service(
                other, origin, dest, day, rng.randrange(lo, window[1] + 1, 5), max(20, base - rng.randint(5, 25))
            )
        for _ in range(rng.randint(1, 3)):  # other departures across the day, any mode
            m = rng.choice([mode, other])
            self._service(m, origin, dest, day, rng.randrange(6 * 60, 20 * 60, 5), base + rng.randint(-15, 60))
        return chosen

    # -- venues -------------------------------------------------------------------------------
    def hotel(self, city: str) -> Hotel:
        rng, min_rating, max_price = self.rng, self.c.get("hotel_rating"), self.c.get("hotel_price")
        price = rng.randint(max_price - 40, max_price) if max_price else rng.randint(60, 160)
        chosen = Hotel("", city, _rating(rng, min_rating or 3.0), price)
        self.hotels.append(chosen)
        if min_rating:  # cheaper, rated too low
            cheap = max(30, price - rng.randint(10, 30))
            self.hotels.append(Hotel("", city, _rating(rng, 2.5, min_rating - 0.1), cheap))
        if max_price:  # better rated, over the price limit
            self.hotels.append(
                Hotel("", city, _rating(rng, max(min_rating or 0, 4.5)), max_price + rng.randint(10, 40))
            )
        for _ in range(rng.randint(1, 2)):
            self.hotels.append(Hotel("", city, _rating(rng, 2.8), price + rng.randint(15, 70)))
        return chosen

    def restaurant(self, city: str, meal: str, cuisine: str | None = None) -> Restaurant:
        """A restaurant the plan uses for lunch or dinner in `city`, meeting the requirements."""
        rng = self.rng
        min_rating = self.c.get("restaurant_rating") or 3.0
        if meal == "lunch":
            opens, closes = rng.choice([(11 * 60, 15 * 60), (11 * 60 + 30, 16 * 60), (11 * 60, 23 * 60)])
            price, veg = rng.randint(10, 25), rng.random() < 0.4
        else:
            opens, closes = rng.choice([(18 * 60, 23 * 60), (17 * 60 + 30, 22 * 60 + 30), (11 * 60, 23 * 60)])
            price, veg = rng.randint(18, 45), bool(self.c.get("veg_dinner")) or rng.random() < 0.4
        r = Restaurant("", city, cuisine or rng.choice(CUISINES), veg, _rating(rng, min_rating), price, opens, closes)
        self.restaurants.append(r)
        return r

    def restaurant_distractors(self, city: str, dinner: Restaurant | None) -> None:
        rng, add = self.rng, self.restaurants.append
        min_rating, veg_dinner = self.c.get("restaurant_rating"), bool(self.c.get("veg_dinner"))
        if dinner is not None and veg_dinner:  # cheaper dinner, not vegetarian
            price = max(8, dinner.price - rng.randint(4, 12))
            add(
                Restaurant(
                    "", city, rng.choice(CUISINES), False, _rating(rng, min_rating or 3.0), price, 17 * 60, 23 * 60
                )
            )
        if min_rating:  # cheaper, open all day, rated too low
            add(
                Restaurant(
                    "",
                    city,
                    rng.choice(CUISINES),
                    veg_dinner,
                    _rating(rng, 2.8, min_rating - 0.1),
                    rng.randint(8, 14),
                    11 * 60,
                    23 * 60,
                )
            )
        # a cheap breakfast place: closed at lunch and dinner time
        add(
            Restaurant(
                "",
                city,
                rng.choice(CUISINES),
                rng.random() < 0.5,
                _rating(rng, 3.0),
                rng.randint(6, 10),
                7 * 60,
                11 * 60 + 30,
            )
        )
        for _ in range(rng.randint(1, 2)):  # dearer alternatives
            add(
                Restaurant(
                    "",
                    city,
                    rng.choice(CUISINES),
                    rng.random() < 0.4,
                    _rating(rng, 3.0),
                    rng.randint(25, 60),
                    12 * 60,
                    22 * 60,
                )
            )

    def attraction(self, city: str, stay_days: list[int], other_days: list[int]) -> Attraction:
        """An attraction the plan visits on one day of the stay: closed on one of `other_days`
        (the stay's remaining days) or on a weekday outside the stay, or never."""
        rng = self.rng
        closed = rng.choice([self.weekday(d) for d in other_days]) if other_days and rng.random() < 0.6 else None
        if closed is None and rng.random() < 0.5:
            stay = {self.weekday(d) for d in stay_days}
            closed = rng.choice([w for w in WEEKDAYS if w not in stay] or [None])
        opens, closes = rng.choice([9 * 60, 9 * 60 + 30, 10 * 60]), rng.choice([17 * 60, 17 * 60 + 30, 18 * 60])
        price = rng.choice([0, 5, 8, 10, 12, 15, 20, 25])
        a = Attraction("", self.sight_names.make(city), city, price, opens, closes, closed, rng.choice(VISIT_MINUTES))
        self.attractions.append(a)
        return a

    def attraction_distractors(self, city: str, stay_days: list[int]) -> None:
        rng, add = self.rng, self.attractions.append
        for _ in range(rng.randint(1, 2)):  # cheap and tempting, but closed on a day of the stay
            closed = self.weekday(rng.choice(stay_days))
            add(
                Attraction(
                    "",
                    self.sight_names.make(city),
                    city,
                    rng.choice([0, 4, 6]),
                    9 * 60,
                    18 * 60,
                    closed,
                    rng.choice(VISIT_MINUTES),
                )
            )
        # short midday hours only: neither a 10:00 nor a 15:00 visit fits
        add(Attraction("", self.sight_names.make(city), city, rng.choice([0, 5, 10]), 12 * 60, 14 * 60 + 30, None, 60))

    # -- the whole trip -----------------------------------------------------------------------
    def build(self) -> Trip:
        rng = self.rng
        plan = [PlannedDay() for _ in range(self.days)]
        # legs: (day, origin, destination, departure window, morning leg?)
        legs: list[tuple[int, str, str, tuple[int, int], bool]] = []
        if self.days == 1:
            city = self.stops[0][0]
            legs = [(1, self.home, city, (7 * 60, 10 * 60), True), (1, city, self.home, (17 * 60 + 30, 19 * 60), False)]
        else:
            day, here = 1, self.home
            for city, nights in self.stops:
                legs.append((day, here, city, (7 * 60 if day == 1 else 9 * 60, 10 * 60), True))
                day, here = day + nights, city
            legs.append((self.days, here, self.home, (15 * 60, 18 * 60), False))
        for day, origin, dest, window, morning in legs:
            plan[day - 1].travel.append(self.leg(origin, dest, day, window, morning))

        # the city each day's meals and visits happen in (the last day: where you leave from)
        day_city: list[str] = []
        for city, nights in self.stops:
            day_city += [city] * max(nights, 1)
        day_city = day_city[: self.days - 1] + [self.stops[-1][0]] if self.days > 1 else [self.stops[0][0]]

        cuisine_city = self.stops[0][0]
        for city, nights in self.stops:
            days_here = [d for d in range(1, self.days + 1) if day_city[d - 1] == city]
            hotel = self.hotel(city) if nights else None
            lunch = self.restaurant(city, "lunch", self.c.get("cuisine") if city == cuisine_city else None)
            dinner = self.restaurant(city, "dinner") if nights else None
            for d in days_here:
                p = plan[d - 1]
                leaves_today = d == self.days
                if not leaves_today and nights:
                    p.hotel = hotel
                p.meals.append((lunch, LUNCH))
                if not leaves_today and dinner is not None:
                    p.meals.append((dinner, DINNER))
            for d in days_here:
                others = [x for x in days_here if x != d]
                arrives_today = any(s.destination == city for s in plan[d - 1].travel)
                slot = AFTERNOON_VISIT if arrives_today else MORNING_VISIT
                sight = self.attraction(city, days_here, others)
                plan[d - 1].visits.append((sight, slot))
            self.restaurant_distractors(city, dinner)
            self.attraction_distractors(city, days_here)

        if "must_visit" in self.c:
            visited = [a for p in plan for a, _ in p.visits]
            target = rng.choice(visited)
            for c in self.constraints:
                if c.kind == "must_visit":
                    c.value = target.name

        self._assign_ids()
        budget = int(math.ceil(plan_cost(plan) * rng.uniform(1.04, 1.12) / 10.0) * 10)
        request = TripRequest(self.home, self.start.isoformat(), self.days, self.stops, budget, self.constraints)
        world = World(
            [self.home] + [c for c, _ in self.stops], self.services, self.hotels, self.restaurants, self.attractions
        )
        return Trip(world, request, plan)

    def _assign_ids(self) -> None:
        """Shuffle each kind and number it with random distinct 3-digit ids (no order hints)."""
        rng = self.rng
        flights = [s for s in self.services if s.mode == "flight"]
        trains = [s for s in self.services if s.mode == "train"]
        groups: tuple[tuple[str, Sequence[Record]], ...] = (
            ("F", flights),
            ("T", trains),
            ("H", self.hotels),
            ("R", self.restaurants),
            ("A", self.attractions),
        )
        for prefix, items in groups:
            numbers = rng.sample(range(100, 1000), len(items))
            for item, n in zip(items, numbers):
                item.id = f"{prefix}{n}"
        for kind in (self.services, self.hotels, self.restaurants, self.attractions):
            rng.shuffle(kind)


def build_trip(rng: random.Random, days: int, n_stops: int, n_constraints: int) -> Trip:
    """A trip request, its world and a plan that meets every requirement (see module docstring)."""
    nights = days - 1
    if (
        days < 1
        or n_stops < 1
        or (days > 1 and not n_stops <= nights <= n_stops * MAX_NIGHTS_PER_STOP)
        or (days == 1 and n_stops != 1)
    ):
        raise ValueError(f"cannot build a {days}-day trip with {n_stops} stops")
    return _Builder(rng, days, n_stops, n_constraints).build()
