"""Suite `planning`: multi-day travel planning graded like DeepPlanning.

Each task generates a world (see `planning_world`): dated flights and trains between a few cities,
hotels, restaurants and attractions with prices, ratings, opening hours and closing days, behind
five search tools. The request names a home city, the cities to sleep in, the start date, a budget
and personal requirements ("no departure before 09:00", "hotels rated 4.0 or more", ...). The agent
submits one itinerary (`ITINERARY_FORMAT`) with the `submit` tool.

Grading (`grade_plan`):
- *commonsense* = weighted sum of binary dimensions (`COMMONSENSE_WEIGHTS`): the items exist,
  the route is consistent, times are feasible with no overlaps, venues are open, the plan is
  complete, the stated total equals the sum of prices, the sum is within budget;
- *personalised* = 1 when every requirement of the request holds, else 0 (all or nothing);
- score = (commonsense + personalised) / 2; a task passes (case accuracy) only at 1.0.
A plan that was never delivered (no submit, or text that is not an itinerary) scores 0.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from harnessrl.tasks.base import Environment, Family, Suite, Task, TaskParts, Tool, ToolFailed, solution_call
from harnessrl.tasks.grading import numbers_match
from harnessrl.tasks.suites.planning_world import (
    DINNER_WINDOW,
    MAX_ROWS,
    MEAL_MINUTES,
    WEEKDAYS,
    Attraction,
    Hotel,
    Restaurant,
    Service,
    TripRequest,
    World,
    build_trip,
    hhmm,
    plan_to_itinerary,
)
from harnessrl.types import Grade

# -- the itinerary format ---------------------------------------------------------------------------

ITINERARY_FORMAT = (
    'itinerary = {"days": [{"day": 1, "travel": ["F123"], "hotel": "H456", '
    '"meals": [{"id": "R789", "time": "13:00"}], "visits": [{"id": "A321", "time": "15:00"}]}, ...], '
    '"total_cost": 480}. One entry per trip day 1..N in order. travel: ids of the flights/trains taken '
    "that day (their times are fixed); hotel: where you sleep that night (null on the last day); "
    "meals last 60 min; a visit lasts the attraction's listed duration; time = start, HH:MM. "
    "total_cost = sum of every price: each leg, each hotel night, each meal, each ticket."
)


class PlanFormatError(ValueError):
    """The submitted itinerary does not follow ITINERARY_FORMAT (the message says where)."""


@dataclass
class Booking:
    id: str
    time: int  # start, minutes after midnight


@dataclass
class PlanDay:
    day: int
    travel: list[str] = field(default_factory=list)
    hotel: str | None = None
    meals: list[Booking] = field(default_factory=list)
    visits: list[Booking] = field(default_factory=list)


@dataclass
class Itinerary:
    days: list[PlanDay]
    total_cost: float


_TIME = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*$")
MAX_PLAN_DAYS = 31
MAX_ITEMS_PER_LIST = 40  # per day and list: far more than a day holds, and it bounds the overlap check


def _not_too_long(items: list[Any], where: str) -> None:
    if len(items) > MAX_ITEMS_PER_LIST:
        raise PlanFormatError(f"{where}: {len(items)} entries; at most {MAX_ITEMS_PER_LIST} per day")


def _time(value: Any, where: str) -> int:
    m = _TIME.match(value) if isinstance(value, str) else None
    if m is None or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise PlanFormatError(f"{where}: {value!r} is not a time HH:MM")
    return int(m.group(1)) * 60 + int(m.group(2))


def _id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PlanFormatError(f"{where}: expected an id string, got {value!r}")
    return value.strip().upper()


def _bookings(value: Any, where: str) -> list[Booking]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PlanFormatError(f'{where}: expected a list of {{"id": ..., "time": "HH:MM"}}')
    _not_too_long(value, where)
    out = []
    for i, b in enumerate(value):
        if not isinstance(b, dict):
            raise PlanFormatError(f'{where}[{i}]: expected {{"id": ..., "time": "HH:MM"}}, got {b!r}')
        out.append(Booking(_id(b.get("id"), f"{where}[{i}].id"), _time(b.get("time"), f"{where}[{i}].time")))
    return out


def _number(value: Any, where: str) -> float:
    if isinstance(value, str):  # "480" or "480.50": small models quote numbers
        try:
            value = float(value.strip())
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise PlanFormatError(f"{where}: expected a number, got {value!r}")
    return float(value)


def parse_itinerary(value: Any) -> Itinerary:
    """An Itinerary from the submitted object (or JSON text); PlanFormatError when malformed.

    Unknown keys are ignored; missing lists count as empty; a lone travel id may be a string; an
    object wrapped once more as {"itinerary": {...}} is unwrapped.
    """
    if isinstance(value, str):
        value = _json_object_in(value)
    if isinstance(value, dict) and "days" not in value and isinstance(value.get("itinerary"), dict):
        value = value["itinerary"]  # {"itinerary": {...}} wrapped once more
    if not isinstance(value, dict):
        raise PlanFormatError(
            f"the itinerary must be an object with 'days' and 'total_cost', got {type(value).__name__}"
        )
    days = value.get("days")
    if not isinstance(days, list) or not days:
        raise PlanFormatError("'days' must be a non-empty list of day objects")
    if len(days) > MAX_PLAN_DAYS:
        raise PlanFormatError(f"'days' has {len(days)} entries; at most {MAX_PLAN_DAYS}")
    if "total_cost" not in value:
        raise PlanFormatError("'total_cost' is missing")
    parsed = []
    for i, d in enumerate(days):
        where = f"days[{i}]"
        if not isinstance(d, dict):
            raise PlanFormatError(f"{where}: expected a day object, got {d!r}")
        day = d.get("day")
        if isinstance(day, float) and day.is_integer():
            day = int(day)
        if isinstance(day, bool) or not isinstance(day, int):
            raise PlanFormatError(f"{where}.day: expected the day number, got {day!r}")
        travel = d.get("travel") or []
        travel = [travel] if isinstance(travel, str) else travel
        if not isinstance(travel, list):
            raise PlanFormatError(f"{where}.travel: expected a list of flight/train ids")
        _not_too_long(travel, f"{where}.travel")
        hotel = d.get("hotel")
        parsed.append(
            PlanDay(
                day=day,
                travel=[_id(t, f"{where}.travel[{j}]") for j, t in enumerate(travel)],
                hotel=None if hotel in (None, "") else _id(hotel, f"{where}.hotel"),
                meals=_bookings(d.get("meals"), f"{where}.meals"),
                visits=_bookings(d.get("visits"), f"{where}.visits"),
            )
        )
    return Itinerary(parsed, _number(value["total_cost"], "total_cost"))


MAX_JSON_STARTS = 20  # braces tried as the start of the itinerary (bounds the work on odd text)


def _json_object_in(text: str) -> Any:
    """The first JSON object written in a text (a plain-text final answer may wrap it in prose)."""
    decoder = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r"\{", text[:100_000])][:MAX_JSON_STARTS]
    for start in starts:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            return obj
    raise PlanFormatError("no JSON itinerary object found")


# -- grading ------------------------------------------------------------------------------------------

COMMONSENSE_WEIGHTS = {
    "exists": 0.20,  # every id is a real item of the right kind; legs run on that day's date
    "route": 0.20,  # days 1..N; start at home; legs chain; you act where you are; end at home
    "time": 0.15,  # no overlapping items in a day; nothing past midnight; no attraction twice
    "hours": 0.15,  # meals and visits inside opening hours, not on the closing day
    "complete": 0.10,  # a hotel every night but the last; at least one meal every day
    "cost": 0.10,  # total_cost equals the sum of the prices
    "budget": 0.10,  # the sum of the prices is within the budget
}


@dataclass
class PlanReport:
    delivered: bool
    commonsense: float = 0.0
    personalised: float = 0.0
    dimensions: dict[str, float] = field(default_factory=dict)  # commonsense dimension -> 0/1
    requirements: dict[str, float] = field(default_factory=dict)  # personal requirement -> 0/1
    violations: dict[str, list[str]] = field(default_factory=dict)
    cost: float | None = None
    error: str | None = None

    @property
    def score(self) -> float:
        return (self.commonsense + self.personalised) / 2


@dataclass
class _Item:
    """One timed thing the traveller does on a day (a leg, a meal or a visit)."""

    kind: str
    id: str
    start: int
    end: int
    city: str  # where it happens (a leg: where it departs)
    arrives_in: str | None = None


def _kind_ok(world: World, item_id: str, kind: type) -> Any:
    item = world.by_id.get(item_id)
    return item if isinstance(item, kind) else None


def _commonsense(plan: Itinerary, world: World, request: TripRequest) -> tuple[dict[str, list[str]], float]:
    v: dict[str, list[str]] = {k: [] for k in COMMONSENSE_WEIGHTS}
    cost = 0.0
    numbers = [d.day for d in plan.days]
    if numbers != list(range(1, request.days + 1)):
        v["route"].append(f"days must be numbered 1..{request.days} in order, got {numbers}")

    where, visited = request.home, set()
    for d in plan.days:
        when = request.date_of(d.day)
        items: list[_Item] = []
        for sid in d.travel:
            s = _kind_ok(world, sid, Service)
            if s is None:
                v["exists"].append(f"day {d.day}: {sid} is not a flight or train")
                continue
            cost += s.price
            if when is None or s.date != when.isoformat():
                v["exists"].append(f"day {d.day}: {sid} runs on {s.date}, not on day {d.day}")
            items.append(_Item("leg", sid, s.depart, s.arrive, s.origin, s.destination))
        for kind, bookings, venue_type, noun in (
            ("meal", d.meals, Restaurant, "a restaurant"),
            ("visit", d.visits, Attraction, "an attraction"),
        ):
            for b in bookings:
                venue = _kind_ok(world, b.id, venue_type)
                if venue is None:
                    v["exists"].append(f"day {d.day}: {kind} {b.id} is not {noun}")
                    continue
                cost += venue.price
                end = b.time + (MEAL_MINUTES if kind == "meal" else venue.duration)
                items.append(_Item(kind, b.id, b.time, end, venue.city))
                if not (venue.opens <= b.time and end <= venue.closes):
                    v["hours"].append(
                        f"day {d.day}: {b.id} {hhmm(b.time)}-{hhmm(end)} "
                        f"is outside {hhmm(venue.opens)}-{hhmm(venue.closes)}"
                    )
                if kind == "visit":
                    if when is not None and venue.closed_on == WEEKDAYS[when.weekday()]:
                        v["hours"].append(f"day {d.day}: {b.id} is closed on {venue.closed_on}")
                    if b.id in visited:
                        v["time"].append(f"day {d.day}: {b.id} is visited twice")
                    visited.add(b.id)
        hotel = None
        if d.hotel is not None:
            hotel = _kind_ok(world, d.hotel, Hotel)
            if hotel is None:
                v["exists"].append(f"day {d.day}: {d.hotel} is not a hotel")
            else:
                cost += hotel.price

        items.sort(key=lambda it: (it.start, it.kind != "leg"))
        for i, a in enumerate(items):
            for later in items[i + 1 :]:
                if later.start < a.end:
                    v["time"].append(
                        f"day {d.day}: {a.id} {hhmm(a.start)}-{hhmm(a.end)} overlaps {later.id} at {hhmm(later.start)}"
                    )
        for it in items:
            if it.end > 24 * 60:
                v["time"].append(f"day {d.day}: {it.id} ends after midnight")
            if it.city != where:
                what = "departs from" if it.kind == "leg" else "is in"
                v["route"].append(f"day {d.day}: {it.id} {what} {it.city} but you are in {where}")
            if it.arrives_in is not None:
                where = it.arrives_in
        if hotel is not None and hotel.city != where:
            v["route"].append(f"day {d.day}: hotel {hotel.id} is in {hotel.city} but you end the day in {where}")
        if not d.meals:
            v["complete"].append(f"day {d.day}: no meal")
        if d.day < request.days and d.hotel is None:
            v["complete"].append(f"day {d.day}: no hotel for the night")
    if where != request.home:
        v["route"].append(f"the trip ends in {where}, not back home in {request.home}")
    if not numbers_match(plan.total_cost, cost):
        v["cost"].append(f"total_cost {plan.total_cost:g} but the prices add up to {cost:g}")
    if cost > request.budget:
        v["budget"].append(f"the prices add up to {cost:g}, over the budget of {request.budget}")
    return v, cost


def _meal_venues(plan: Itinerary, world: World) -> list[tuple[int, Restaurant, int]]:
    return [(d.day, r, b.time) for d in plan.days for b in d.meals if (r := _kind_ok(world, b.id, Restaurant))]


def _legs(plan: Itinerary, world: World) -> list[Service]:
    return [s for d in plan.days for sid in d.travel if (s := _kind_ok(world, sid, Service))]


def _hotels(plan: Itinerary, world: World) -> list[tuple[int, Hotel]]:
    return [(d.day, h) for d in plan.days if d.hotel and (h := _kind_ok(world, d.hotel, Hotel))]


def _check_stops(plan: Itinerary, world: World, request: TripRequest, value: Any) -> list[str]:
    out = []
    if request.days == 1:
        city = request.stops[0][0]
        if not any(s.destination == city for s in _legs(plan, world)):
            out.append(f"the plan never travels to {city}")
        return out
    slept = {day: h.city for day, h in _hotels(plan, world)}
    for night, city in enumerate(request.night_cities(), start=1):
        if slept.get(night) != city:
            out.append(f"night {night} must be in {city}, plan: {slept.get(night) or 'no hotel'}")
    return out


def _check_depart_after(plan: Itinerary, world: World, request: TripRequest, value: Any) -> list[str]:
    return [f"{s.id} departs at {hhmm(s.depart)}, before {hhmm(value)}" for s in _legs(plan, world) if s.depart < value]


def _check_mode(plan: Itinerary, world: World, request: TripRequest, value: Any) -> list[str]:
    return [f"{s.id} is a {s.mode}, not a {value}" for s in _legs(plan, world) if s.mode != value]


def _check_hotel_rating(plan: Itinerary, world: World, request: TripRequest, value: Any) -> list[str]:
    return [f"{h.id} is rated {h.rating}, below {value}" for _, h in _hotels(plan, world) if h.rating < value]


def _check_hotel_price(plan: Itinerary, world: World, request: TripRequest, value: Any) -> list[str]:
    return [f"{h.id} costs {h.price} a night, over {value}" for _, h in _hotels(plan, world) if h.price > value]


def _check_veg_dinner(plan: Itinerary, world: World, request: TripRequest, value: Any) -> list[str]:
    lo, hi = DINNER_WINDOW
    ok = {day for day, r, t in _meal_venues(plan, world) if r.vegetarian and lo <= t <= hi}
    return [f"day {d}: no vegetarian dinner" for d in range(1, request.days) if d not in ok]


def _check_must_visit(plan: Itinerary, world: World, request: TripRequest, value: Any) -> list[str]:
    names = {a.name for d in plan.days for b in d.visits if (a := _kind_ok(world, b.id, Attraction))}
    return [] if value in names else [f"{value} is not visited"]


def _check_cuisine(plan: Itinerary, world: World, request: TripRequest, value: Any) -> list[str]:
    return [] if any(r.cuisine == value for _, r, _ in _meal_venues(plan, world)) else [f"no {value} meal"]


def _check_restaurant_rating(plan: Itinerary, world: World, request: TripRequest, value: Any) -> list[str]:
    return [f"{r.id} is rated {r.rating}, below {value}" for _, r, _ in _meal_venues(plan, world) if r.rating < value]


def _check_visit_each_day(plan: Itinerary, world: World, request: TripRequest, value: Any) -> list[str]:
    seen = {d.day for d in plan.days for b in d.visits if _kind_ok(world, b.id, Attraction)}
    return [f"day {d}: no attraction" for d in range(1, request.days + 1) if d not in seen]


# requirement kind -> (how the request words it, check returning violations)
Check = Callable[[Itinerary, World, TripRequest, Any], list[str]]
CONSTRAINT_CHECKS: dict[str, tuple[Callable[[Any], str], Check]] = {
    "stops": (lambda v: "", _check_stops),
    "depart_after": (lambda v: f"no flight or train departing before {hhmm(v)}", _check_depart_after),
    "mode": (lambda v: "travel by train only" if v == "train" else "travel by plane only", _check_mode),
    "hotel_rating": (lambda v: f"hotels rated {v} or higher", _check_hotel_rating),
    "hotel_price": (lambda v: f"hotels at most {v} per night", _check_hotel_price),
    "veg_dinner": (
        lambda v: "a vegetarian dinner (starting 17:00-21:30) every evening before the last day",
        _check_veg_dinner,
    ),
    "must_visit": (lambda v: f"visit the {v}", _check_must_visit),
    "cuisine": (lambda v: f"eat {v} food at least once", _check_cuisine),
    "restaurant_rating": (lambda v: f"only restaurants rated {v} or higher", _check_restaurant_rating),
    "visit_each_day": (lambda v: "at least one attraction every day", _check_visit_each_day),
}


def grade_plan(plan: Itinerary | None, world: World, request: TripRequest, error: str | None = None) -> PlanReport:
    """Commonsense dimensions, personal requirements and the composite (see module docstring)."""
    if plan is None:
        return PlanReport(
            delivered=False,
            dimensions={k: 0.0 for k in COMMONSENSE_WEIGHTS},
            requirements={c.kind: 0.0 for c in request.constraints},
            error=error or "no itinerary submitted",
        )
    violations, cost = _commonsense(plan, world, request)
    dims = {k: 0.0 if violations[k] else 1.0 for k in COMMONSENSE_WEIGHTS}
    reqs = {}
    for c in request.constraints:
        found = CONSTRAINT_CHECKS[c.kind][1](plan, world, request, c.value)
        violations[f"requirement.{c.kind}"] = found
        reqs[c.kind] = 0.0 if found else 1.0
    return PlanReport(
        delivered=True,
        commonsense=round(sum(COMMONSENSE_WEIGHTS[k] * dims[k] for k in dims), 6),
        personalised=1.0 if all(reqs.values()) else 0.0,
        dimensions=dims,
        requirements=reqs,
        violations={k: found for k, found in violations.items() if found},
        cost=cost,
    )


class PlanGrader:
    """The task's `check`: reads the submitted itinerary from the environment and grades it.

    As a plain check it returns {"commonsense", "personalised"}, whose mean is the task score;
    `report` gives the full breakdown that `PlanningTask.grade` puts in the Grade.
    """

    def __init__(self, world: World, request: TripRequest):
        self.world, self.request = world, request

    def report(self, env: Environment) -> PlanReport:
        plan = env.state.get("itinerary")
        if plan is None and env.submitted and env.answer:  # a harness that takes prose as the answer
            try:
                plan = parse_itinerary(env.answer)
            except PlanFormatError as e:
                return grade_plan(None, self.world, self.request, f"the answer is not an itinerary: {e}")
        return grade_plan(plan, self.world, self.request)

    def __call__(self, env: Environment) -> dict[str, float]:
        r = self.report(env)
        return {"commonsense": r.commonsense, "personalised": r.personalised}


@dataclass
class PlanningTask(Task):
    """A Task whose Grade also carries the per-dimension and per-requirement breakdown.

    score = (commonsense + personalised) / 2, exactly the mean of what `check` returns; the other
    sub-scores (`commonsense.<dimension>`, `personalised.<requirement>`, `delivered`) explain it.
    """

    def grade(self, env: Environment) -> Grade:
        if not isinstance(self.check, PlanGrader):
            return super().grade(env)
        r = self.check.report(env)
        subscores = {"commonsense": r.commonsense, "personalised": r.personalised, "delivered": float(r.delivered)}
        subscores.update({f"commonsense.{k}": v for k, v in r.dimensions.items()})
        subscores.update({f"personalised.{k}": v for k, v in r.requirements.items()})
        details: dict[str, Any] = {
            "delivered": r.delivered,
            "weights": COMMONSENSE_WEIGHTS,
            "budget": self.check.request.budget,
            "cost": r.cost,
            "violations": r.violations,
        }
        if r.error:
            details["error"] = r.error
        return Grade(
            score=r.score,
            subscores=subscores,
            passed=r.score >= self.pass_threshold - 1e-9,
            threshold=self.pass_threshold,
            details=details,
        )


# -- tools ---------------------------------------------------------------------------------------------


def _world(env: Environment) -> World:
    return env.state["world"]


def _city(env: Environment, name: str) -> str:
    world = _world(env)
    for c in world.cities:
        if c.lower() == str(name).strip().lower():
            return c
    raise ToolFailed(f"unknown city '{name}' (cities: {', '.join(world.cities)})")


def _table(title: str, header: str, rows: list[str], empty: str) -> str:
    if not rows:
        return empty
    more = f"\n({len(rows) - MAX_ROWS} more not shown)" if len(rows) > MAX_ROWS else ""
    return "\n".join([title, header, *rows[:MAX_ROWS]]) + more


def _search_services(mode: str) -> Callable[..., str]:
    label = "flights" if mode == "flight" else "trains"

    def search(env: Environment, origin: str, destination: str, date: str) -> str:
        a, b = _city(env, origin), _city(env, destination)
        day = str(date).strip()
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", day):
            raise ToolFailed(f"date must be YYYY-MM-DD, got '{date}'")
        found = sorted(
            (s for s in _world(env).services if s.mode == mode and (s.origin, s.destination, s.date) == (a, b, day)),
            key=lambda s: s.price,
        )
        rows = [f"{s.id} | {hhmm(s.depart)} | {hhmm(s.arrive)} | {s.price}" for s in found]
        return _table(
            f"{label} {a} -> {b} on {day}:",
            "id | depart | arrive | price",
            rows,
            f"no {label} from {a} to {b} on {day}",
        )

    return search


def _search_city(
    label: str, items: Callable[[World], list[Any]], header: str, row: Callable[[Any], str]
) -> Callable[..., str]:
    """A search over one kind of venue in a city, cheapest first."""

    def search(env: Environment, city: str) -> str:
        c = _city(env, city)
        found = sorted((x for x in items(_world(env)) if x.city == c), key=lambda x: x.price)
        return _table(f"{label} in {c}:", header, [row(x) for x in found], f"no {label} in {c}")

    return search


_search_hotels = _search_city(
    "hotels", lambda w: w.hotels, "id | rating | price per night", lambda h: f"{h.id} | {h.rating} | {h.price}"
)
_search_restaurants = _search_city(
    "restaurants",
    lambda w: w.restaurants,
    "id | cuisine | vegetarian | rating | price | open",
    lambda r: (
        f"{r.id} | {r.cuisine} | {'yes' if r.vegetarian else 'no'} | {r.rating} | {r.price} | "
        f"{hhmm(r.opens)}-{hhmm(r.closes)}"
    ),
)
_search_attractions = _search_city(
    "attractions",
    lambda w: w.attractions,
    "id | name | ticket | open | closed on | visit",
    lambda a: (
        f"{a.id} | {a.name} | {a.price} | {hhmm(a.opens)}-{hhmm(a.closes)} | {a.closed_on or '-'} | {a.duration} min"
    ),
)


def _submit(env: Environment, itinerary: Any) -> str:
    try:
        plan = parse_itinerary(itinerary)
    except PlanFormatError as e:
        raise ToolFailed(f"itinerary not accepted, nothing was submitted: {e}") from None
    env.state["itinerary"] = plan
    env.submitted, env.answer = True, json.dumps(itinerary, sort_keys=True)
    return "Itinerary submitted."


_ROUTE = {
    "type": "object",
    "properties": {
        "origin": {"type": "string", "description": "city"},
        "destination": {"type": "string", "description": "city"},
        "date": {"type": "string", "description": "YYYY-MM-DD"},
    },
    "required": ["origin", "destination", "date"],
}
_CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

TOOLS = [
    Tool(
        "search_flights",
        "Flights between two cities on a date, cheapest first: id, depart, arrive, price.",
        _ROUTE,
        _search_services("flight"),
    ),
    Tool(
        "search_trains",
        "Trains between two cities on a date, cheapest first: id, depart, arrive, price.",
        _ROUTE,
        _search_services("train"),
    ),
    Tool("search_hotels", "Hotels in a city, cheapest first: id, rating, price per night.", _CITY, _search_hotels),
    Tool(
        "search_restaurants",
        "Restaurants in a city, cheapest first: id, cuisine, vegetarian, rating, price per meal, opening hours.",
        _CITY,
        _search_restaurants,
    ),
    Tool(
        "search_attractions",
        "Attractions in a city, cheapest first: id, name, ticket price, opening hours, weekday closed, visit length.",
        _CITY,
        _search_attractions,
    ),
    Tool(
        "submit",
        "Submit the final itinerary once, when it is complete. " + ITINERARY_FORMAT,
        {
            "type": "object",
            "properties": {"itinerary": {"type": "object", "description": "the plan, see above"}},
            "required": ["itinerary"],
        },
        _submit,
    ),
]

# -- families ------------------------------------------------------------------------------------------


def _instruction(request: TripRequest) -> str:
    start = request.date_of(1)
    if start is None:
        raise ValueError(f"a trip request of {request.days} days has no day 1")
    when = f"{WEEKDAYS[start.weekday()]} {request.start}"
    if request.days == 1:
        trip = f"Plan a day trip for one traveller on {when} from {request.home} to {request.stops[0][0]} and back."
    else:
        stays = ", then ".join(f"{n} night{'s' if n > 1 else ''} in {c}" for c, n in request.stops)
        trip = (
            f"Plan a {request.days}-day trip for one traveller from {request.home}, day 1 is {when}: {stays}, "
            f"back in {request.home} on day {request.days}."
        )
    wishes = [CONSTRAINT_CHECKS[c.kind][0](c.value) for c in request.constraints if c.kind != "stops"]
    needs = f" Requirements: {'; '.join(wishes)}." if wishes else ""
    return (
        f"{trip} Budget {request.budget} for everything (transport, hotel nights, meals, tickets).{needs}"
        " Use the search tools, then call submit with the itinerary."
    )


def _family(days: tuple[int, int], stops: int, constraints: tuple[int, int]) -> Family:
    def family(rng: random.Random) -> TaskParts:
        trip = build_trip(rng, rng.randint(*days), stops, rng.randint(*constraints))
        world, request = trip.world, trip.request
        calls = []
        for d, p in enumerate(trip.plan, start=1):
            for s in p.travel:
                tool = "search_flights" if s.mode == "flight" else "search_trains"
                calls.append(solution_call(tool, origin=s.origin, destination=s.destination, date=s.date))
        for city, _ in request.stops:
            for tool in ("search_hotels", "search_restaurants", "search_attractions"):
                if tool != "search_hotels" or request.days > 1:
                    calls.append(solution_call(tool, city=city))
        calls.append(solution_call("submit", itinerary=plan_to_itinerary(trip.plan)))

        def setup(env: Environment) -> None:
            env.state["world"] = world

        observed = ["search_restaurants"] + (["search_hotels"] if request.days > 1 else [])
        return {
            "instruction": _instruction(request),
            "setup": setup,
            "check": PlanGrader(world, request),
            "solution": calls,
            "required_observations": observed,
            "data": {"request": dataclasses.asdict(request), "world": world.digest()},
        }

    return family


# family -> (trip length in days, cities to sleep in, personal requirements besides the route)
DIFFICULTY = {
    "easy_day_trip": ((1, 1), 1, (1, 2)),
    "easy_overnight": ((2, 2), 1, (1, 2)),
    "medium_city_break": ((3, 4), 1, (2, 3)),
    "medium_two_cities": ((4, 4), 2, (2, 3)),
    "hard_two_cities": ((5, 6), 2, (3, 4)),
    "hard_three_cities": ((6, 7), 3, (3, 4)),
}


class PlanningSuite(Suite):
    name = "planning"
    description = (
        "Multi-day travel plans from searched flights, trains, hotels, restaurants and sights; "
        "DeepPlanning-style grading."
    )
    split_sizes = {"train": 2000, "dev": 48, "test": 72}
    pass_threshold = 1.0
    needs_workspace = False

    def families(self) -> dict[str, Family]:
        return {name: _family(*shape) for name, shape in DIFFICULTY.items()}

    def base_tools(self) -> list[Tool]:
        return list(TOOLS)

    def _make(self, split: str, index: int, sub: int) -> Task:
        task = super()._make(split, index, sub)
        return PlanningTask(**{f.name: getattr(task, f.name) for f in dataclasses.fields(Task)})
