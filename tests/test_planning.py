"""The `planning` suite: generated worlds, the itinerary format, DeepPlanning-style grading, and the
known-good plans played through every built-in harness."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from helpers import oracle_policy, replies_policy

from harnessrl.harness.registry import builtin_names, load_harness
from harnessrl.harness.spec import HarnessSpec
from harnessrl.metrics import harness_summary
from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Runner, make_jobs
from harnessrl.tasks import get_suite
from harnessrl.tasks.base import Environment, ToolFailed, generate_from_seed
from harnessrl.tasks.suites.planning import (
    COMMONSENSE_WEIGHTS,
    DIFFICULTY,
    PlanFormatError,
    PlanGrader,
    PlanningSuite,
    PlanningTask,
    grade_plan,
    parse_itinerary,
)
from harnessrl.tasks.suites.planning_world import MAX_ROWS, WEEKDAYS, Hotel, Service
from harnessrl.types import BlockReason, Termination


@pytest.fixture(scope="module")
def suite() -> PlanningSuite:
    return PlanningSuite()


@pytest.fixture(scope="module")
def sample(suite):
    return suite.tasks("dev") + suite.tasks("test")


def _run_solution(task, upto_submit: bool = True) -> Environment:
    env = task.make_env()
    for call in task.solution:
        if call["name"] == "submit" and not upto_submit:
            break
        out = task.tool(call["name"]).fn(env, **call["arguments"])
        env.calls.append((call["name"], call["arguments"], out))  # as the runner records it
    return env


def _plan(task) -> dict:
    return copy.deepcopy(task.solution[-1]["arguments"]["itinerary"])


def _grade(task, itinerary: dict, reprice: bool = True, request=None):
    """Grade an edited plan; with reprice, total_cost is set to the true sum first (so only the
    edit under test can break the plan)."""
    grader: PlanGrader = task.check
    request = request or grader.request
    if reprice:
        itinerary["total_cost"] = grade_plan(parse_itinerary(itinerary), grader.world, request).cost
    return grade_plan(parse_itinerary(itinerary), grader.world, request)


def _first(sample, family=None, where=lambda t: True):
    return next(t for t in sample if (family is None or t.family == family) and where(t))


def _kinds(task) -> set[str]:
    return {c.kind for c in task.check.request.constraints}


# -- the suite ----------------------------------------------------------------------------------------


def test_registered_with_families_per_difficulty(suite):
    assert isinstance(get_suite("planning"), PlanningSuite)
    assert suite.family_names() == list(DIFFICULTY)
    assert {n.split("_")[0] for n in suite.family_names()} == {"easy", "medium", "hard"}
    assert suite.split_sizes["dev"] == 48 and suite.split_sizes["test"] == 72
    assert suite.pass_threshold == 1.0 and not suite.needs_workspace


def test_worlds_are_deterministic_per_seed(suite):
    fresh = PlanningSuite()
    for a, b in zip(suite.tasks("train", 12), fresh.tasks("train", 12)):
        assert (a.fingerprint, a.instruction, a.solution) == (b.fingerprint, b.instruction, b.solution)
        assert a.check.world.digest() == b.check.world.digest()
    fam = suite.families()["medium_two_cities"]
    assert generate_from_seed(fam, 7)["data"] == generate_from_seed(fam, 7)["data"]
    assert generate_from_seed(fam, 7)["data"] != generate_from_seed(fam, 8)["data"]


def test_splits_are_disjoint(suite):
    test = {t.fingerprint for t in suite.tasks("test")}
    dev = {t.fingerprint for t in suite.tasks("dev")}
    train = {t.fingerprint for t in suite.tasks("train", 150)}
    assert len(test) == 72 and len(dev) == 48 and len(train) == 150
    assert not (test & dev) and not (test & train) and not (dev & train)


def test_trip_length_and_requirement_count_follow_the_difficulty(sample):
    for task in sample:
        (lo, hi), stops, (c_lo, c_hi) = DIFFICULTY[task.family]
        request = task.check.request
        assert lo <= request.days <= hi and len(request.stops) == stops
        assert c_lo <= len(request.constraints) - 1 <= c_hi  # "stops" is always there
        assert sum(n for _, n in request.stops) == request.days - 1
        assert isinstance(task, PlanningTask)


def test_solution_scores_full_marks_in_every_family(sample):
    assert {t.family for t in sample} == set(DIFFICULTY)
    for task in sample:
        env = _run_solution(task)
        grade = task.grade(env)
        assert grade.score == 1.0 and grade.passed, (task.id, grade.details)
        assert grade.subscores["commonsense"] == grade.subscores["personalised"] == grade.subscores["delivered"] == 1.0
        assert all(grade.subscores[f"commonsense.{k}"] == 1.0 for k in COMMONSENSE_WEIGHTS)
        # the plain check agrees with the composite
        assert sum(task.check(env).values()) / 2 == grade.score


def test_solution_uses_only_what_its_searches_showed(sample):
    """Every id in the known-good plan appears in the search results the solution saw, every
    search fits on one page, and prompts stay small enough for a 2k-token model."""
    for task in sample:
        env = _run_solution(task, upto_submit=False)
        seen = "\n".join(out for _, _, out in env.calls)
        assert "more not shown" not in seen
        assert all(len(out.splitlines()) <= MAX_ROWS + 2 for _, _, out in env.calls)
        assert max(len(out) for _, _, out in env.calls) < 700
        plan = _plan(task)
        ids = [
            i
            for d in plan["days"]
            for i in d["travel"] + [d["hotel"]] + [b["id"] for b in d["meals"] + d["visits"]]
            if i
        ]
        assert all(i in seen for i in ids), task.id
        assert len(task.instruction) < 600


def test_distractors_tempt_with_lower_prices(sample):
    """The cheapest listing is often one the requirements rule out (otherwise the task is trivial)."""
    tempted = 0
    for task in sample:
        world, request = task.check.world, task.check.request
        rating = request.constraint("hotel_rating")
        if rating:
            cheapest = min((h for h in world.hotels if h.city == request.stops[0][0]), key=lambda h: h.price)
            tempted += cheapest.rating < rating.value
    assert tempted >= 5


# -- the tools ---------------------------------------------------------------------------------------


def test_search_tools_errors_and_empty_results(sample):
    task = _first(sample, "medium_two_cities")
    env = task.make_env()
    request = task.check.request
    with pytest.raises(ToolFailed, match="unknown city 'Atlantis'.*" + request.home):
        task.tool("search_hotels").fn(env, city="Atlantis")
    with pytest.raises(ToolFailed, match="YYYY-MM-DD"):
        task.tool("search_trains").fn(env, origin=request.home, destination=request.stops[0][0], date="May 3")
    out = task.tool("search_flights").fn(env, origin=request.stops[0][0], destination=request.home, date="1999-01-01")
    assert out.startswith("no flights from")
    assert "no hotels in" in task.tool("search_hotels").fn(env, city=request.home.upper())


def test_submit_refuses_malformed_itineraries_without_submitting(sample):
    task = _first(sample)
    submit = task.tool("submit")
    bad = [
        ({"days": []}, "non-empty list"),
        ({"days": [{"day": 1}]}, "total_cost"),
        ({"days": [{"day": "one"}], "total_cost": 1}, "day number"),
        ({"days": [{"day": 1, "meals": [{"id": "R1", "time": "25:00"}]}], "total_cost": 1}, "not a time"),
        ({"days": [{"day": 1, "meals": "R1"}], "total_cost": 1}, "list of"),
        ({"days": [{"day": 1}], "total_cost": "lots"}, "expected a number"),
        ({"days": [{"day": 1, "travel": ["F1"] * 41}], "total_cost": 1}, "at most 40"),
    ]
    for itinerary, message in bad:
        env = task.make_env()
        with pytest.raises(ToolFailed, match=message):
            submit.fn(env, itinerary=itinerary)
        assert not env.submitted and "itinerary" not in env.state
        assert task.grade(env).score == 0.0


def test_parse_is_lenient_where_meaning_is_clear():
    plan = parse_itinerary(
        'Here it is: {"days": [{"day": 1.0, "travel": "t123", "hotel": "", '
        '"visits": [{"id": "a1", "time": "9:05"}]}], "total_cost": "12"}'
    )
    assert plan.days[0].travel == ["T123"] and plan.days[0].hotel is None and plan.days[0].meals == []
    assert plan.days[0].visits[0].time == 9 * 60 + 5 and plan.total_cost == 12.0
    wrapped = parse_itinerary({"itinerary": {"days": [{"day": 1}], "total_cost": 0}})
    assert wrapped.days[0].day == 1 and wrapped.total_cost == 0.0
    with pytest.raises(PlanFormatError, match="no JSON itinerary"):
        parse_itinerary("day 1: fly to Oslo")


# -- commonsense dimensions ---------------------------------------------------------------------------


def _only_broken(report, dimension: str) -> None:
    assert report.dimensions[dimension] == 0.0, report.violations
    others = {k: v for k, v in report.dimensions.items() if k != dimension}
    assert all(v == 1.0 for v in others.values()), report.violations
    assert report.commonsense == pytest.approx(1.0 - COMMONSENSE_WEIGHTS[dimension])


def test_wrong_total_breaks_cost_only(sample):
    task = _first(sample, "medium_city_break")
    plan = _plan(task)
    plan["total_cost"] += 5
    report = _grade(task, plan, reprice=False)
    _only_broken(report, "cost")
    assert report.personalised == 1.0 and report.score == pytest.approx(1 - COMMONSENSE_WEIGHTS["cost"] / 2)


def test_over_budget_breaks_budget_only(sample):
    task = _first(sample, "medium_city_break")
    request = dataclasses.replace(task.check.request, budget=_plan(task)["total_cost"] - 1)
    report = _grade(task, _plan(task), request=request)
    _only_broken(report, "budget")
    assert "over the budget" in report.violations["budget"][0]


def test_double_booking_breaks_time(sample):
    task = _first(sample, "medium_city_break")
    plan = _plan(task)
    day = plan["days"][1]  # a full day in the city: morning visit, lunch, dinner
    day["visits"][0]["time"] = day["meals"][0]["time"]
    report = _grade(task, plan)
    assert report.dimensions["time"] == 0.0 and "overlaps" in " ".join(report.violations["time"])


def test_visiting_an_attraction_twice_breaks_time(sample):
    task = _first(sample, "medium_city_break")
    plan = _plan(task)
    plan["days"][1]["visits"] = copy.deepcopy(plan["days"][0]["visits"])
    plan["days"][1]["visits"][0]["time"] = "10:00"
    report = _grade(task, plan)
    assert report.dimensions["time"] == 0.0 and "visited twice" in " ".join(report.violations["time"])


def test_meal_outside_opening_hours_breaks_hours(sample):
    task = _first(sample, "medium_city_break")
    plan = _plan(task)
    plan["days"][1]["meals"][0]["time"] = "07:00"  # lunch places open at 11:00 or later
    report = _grade(task, plan)
    _only_broken(report, "hours")


def test_closed_attraction_breaks_hours(sample):
    def closed_swap(task):
        world, request = task.check.world, task.check.request
        for i, day in enumerate(_plan(task)["days"], start=1):
            weekday = WEEKDAYS[request.date_of(i).weekday()]
            city = world.by_id[day["visits"][0]["id"]].city
            used = {b["id"] for d in _plan(task)["days"] for b in d["visits"]}
            for a in world.attractions:
                if (
                    a.city == city
                    and a.closed_on == weekday
                    and a.id not in used
                    and a.opens <= 10 * 60
                    and a.closes >= 17 * 60
                ):
                    return i, a
        return None

    task = _first(sample, where=lambda t: t.family.startswith("medium") and closed_swap(t) is not None)
    day, attraction = closed_swap(task)
    plan = _plan(task)
    plan["days"][day - 1]["visits"][0]["id"] = attraction.id
    report = _grade(task, plan)
    _only_broken(report, "hours")
    assert f"closed on {attraction.closed_on}" in report.violations["hours"][0]


def test_unknown_or_misdated_items_break_exists(sample):
    task = _first(sample, "medium_city_break")
    plan = _plan(task)
    plan["days"][1]["meals"][0]["id"] = "R000"
    report = _grade(task, plan)
    assert report.dimensions["exists"] == 0.0 and "R000 is not a restaurant" in report.violations["exists"][0]
    plan = _plan(task)
    plan["days"][0]["meals"][0]["id"] = plan["days"][0]["hotel"]  # a hotel is not a restaurant
    assert _grade(task, plan).dimensions["exists"] == 0.0


def test_impossible_leg_breaks_route(sample):
    task = _first(sample, "medium_two_cities")
    plan = _plan(task)
    # take the return leg on day 1 instead of the outbound one: wrong date and wrong origin
    plan["days"][0]["travel"], plan["days"][-1]["travel"] = plan["days"][-1]["travel"], plan["days"][0]["travel"]
    report = _grade(task, plan)
    assert report.dimensions["route"] == 0.0 and report.dimensions["exists"] == 0.0
    assert any("departs from" in v for v in report.violations["route"])
    plan = _plan(task)
    plan["days"][-1]["travel"] = []  # never comes home
    report = _grade(task, plan)
    _only_broken(report, "route")
    assert "not back home" in report.violations["route"][-1]


def test_acting_in_another_city_breaks_route(sample):
    task = _first(sample, "medium_two_cities")
    world = task.check.world
    plan = _plan(task)
    second_city = task.check.request.stops[1][0]
    lunch = next(r for r in world.restaurants if r.city == second_city and r.opens <= 13 * 60 and r.closes >= 14 * 60)
    plan["days"][0]["meals"][0]["id"] = lunch.id  # day 1 is spent in the first city
    report = _grade(task, plan)
    _only_broken(report, "route")


def test_missing_hotel_or_meal_breaks_complete(sample):
    task = _first(sample, "medium_city_break")
    plan = _plan(task)
    plan["days"][1]["meals"] = []
    _only_broken(_grade(task, plan), "complete")
    plan = _plan(task)
    plan["days"][0]["hotel"] = None
    report = _grade(task, plan)
    _only_broken(report, "complete")
    assert report.requirements["stops"] == 0.0 and report.personalised == 0.0


# -- personalised requirements ------------------------------------------------------------------------

SWAPPABLE = {"depart_after", "mode", "hotel_rating", "veg_dinner", "restaurant_rating"}


def _single_requirement_break(task):
    """A one-item swap (same kind, same place and date) that keeps commonsense at 1.0 but breaks a
    requirement: what a cheaper distractor does when an agent falls for it."""
    world = task.check.world
    base = _plan(task)
    for di, day in enumerate(base["days"]):
        slots = (
            [("travel", j) for j in range(len(day["travel"]))]
            + [("hotel", None)]
            + [("meals", j) for j in range(len(day["meals"]))]
        )
        for key, j in slots:
            current = day[key] if j is None else (day[key][j] if key == "travel" else day[key][j]["id"])
            if current is None:
                continue
            old = world.by_id[current]
            if isinstance(old, Service):
                pool = [
                    s
                    for s in world.services
                    if (s.origin, s.destination, s.date) == (old.origin, old.destination, old.date)
                ]
            elif isinstance(old, Hotel):
                pool = [h for h in world.hotels if h.city == old.city]
            else:
                pool = [r for r in world.restaurants if r.city == old.city]
            for new in pool:
                if new.id == current or new.price >= old.price:
                    continue
                plan = _plan(task)
                if key == "hotel":
                    plan["days"][di]["hotel"] = new.id
                elif key == "travel":
                    plan["days"][di]["travel"][j] = new.id
                else:
                    plan["days"][di]["meals"][j]["id"] = new.id
                report = _grade(task, plan)
                if report.commonsense == 1.0 and report.personalised == 0.0:
                    return report
    return None


def test_one_broken_requirement_zeroes_personalised_and_keeps_commonsense(sample):
    tasks = [t for t in sample if _kinds(t) & SWAPPABLE]
    assert len(tasks) >= 40
    for task in tasks:
        report = _single_requirement_break(task)
        assert report is not None, (task.id, _kinds(task))
        assert report.score == 0.5 and report.delivered
        broken = [k for k, v in report.requirements.items() if v == 0.0]
        assert broken and all(f"requirement.{k}" in report.violations for k in broken)


def test_each_requirement_kind_is_checked(sample):
    checked = set()
    for task in sample:
        request = task.check.request
        for c in request.constraints:
            if c.kind == "must_visit":
                plan = _plan(task)
                target = next(a.id for a in task.check.world.attractions if a.name == c.value)
                for d in plan["days"]:
                    d["visits"] = [b for b in d["visits"] if b["id"] != target]
            elif c.kind == "visit_each_day":
                plan = _plan(task)
                plan["days"][0]["visits"] = []
            elif c.kind == "cuisine":
                plan = _plan(task)
                for d in plan["days"]:
                    d["meals"] = [b for b in d["meals"] if task.check.world.by_id[b["id"]].cuisine != c.value]
            elif c.kind == "hotel_price":
                plan = _plan(task)
                city = task.check.world.by_id[plan["days"][0]["hotel"]].city
                plan["days"][0]["hotel"] = next(
                    h.id for h in task.check.world.hotels if h.city == city and h.price > c.value
                )
            else:
                continue
            report = _grade(task, plan)
            assert report.requirements[c.kind] == 0.0 and report.personalised == 0.0, (task.id, c)
            checked.add(c.kind)
    assert checked == {"must_visit", "visit_each_day", "cuisine", "hotel_price"}


# -- delivery -----------------------------------------------------------------------------------------


def test_undelivered_plan_scores_zero(sample):
    task = _first(sample, "easy_overnight")
    env = _run_solution(task, upto_submit=False)
    grade = task.grade(env)
    assert grade.score == 0.0 and not grade.passed
    assert grade.subscores["delivered"] == 0.0 and grade.details["delivered"] is False
    assert grade.subscores["commonsense"] == grade.subscores["personalised"] == 0.0


def test_plain_text_answers_are_parsed_or_undelivered(sample):
    task = _first(sample, "easy_overnight")
    env = task.make_env()
    env.submitted, env.answer = True, "I would fly there and see the sights."
    grade = task.grade(env)
    assert grade.score == 0.0 and grade.subscores["delivered"] == 0.0
    assert "not an itinerary" in grade.details["error"]
    import json

    env.answer = "My plan:\n" + json.dumps(_plan(task))
    assert task.grade(env).score == 1.0


# -- end to end through the runner ----------------------------------------------------------------------


def _wide(spec: HarnessSpec) -> HarnessSpec:
    data = spec.to_dict()
    data["rules"].update(max_new_tokens=1024, max_total_tokens=None)  # room for a 7-day itinerary
    return HarnessSpec.model_validate(data)


def _run(policy, spec, tasks):
    return Runner(policy, SamplingParams(temperature=0.0), progress=False).run(make_jobs(tasks, [spec], 1))


@pytest.mark.parametrize("harness", builtin_names())
def test_oracle_passes_every_family_through_every_harness(harness, suite, tokenizer):
    tasks = suite.tasks("dev", len(suite.family_names()))
    assert {t.family for t in tasks} == set(suite.family_names())
    spec = _wide(load_harness(harness))
    trajs = _run(oracle_policy(tasks, spec, tokenizer), spec, tasks)
    for t in trajs:
        assert t.termination == Termination.submitted and t.submitted, (t.family, t.termination)
        assert t.grade.score == 1.0 and t.grade.passed, (t.family, t.grade.details)
        assert t.grade.subscores["commonsense.route"] == 1.0
    m = harness_summary(trajs, 1)
    assert m.mean_score == 1.0 and m.delivery_rate == 1.0


def test_malformed_submit_is_a_recorded_failure_not_a_crash(suite, tokenizer):
    task = suite.tasks("dev", 1)[0]
    spec = load_harness("json-tools")
    replies = [
        '{"tool": "submit", "arguments": {"itinerary": "fly to Oslo"}}',
        '{"tool": "submit", "arguments": {"itinerary": {"days": [{"day": 1, '
        '"meals": [{"id": "R1", "time": "noon"}]}], "total_cost": 3}}}',
        '{"tool": "search_hotels", "arguments": {"city": "Nowhere"}}',
    ]
    (t,) = _run(replies_policy(replies, tokenizer), spec, [task])
    assert t.infra_error is None and t.termination == Termination.max_steps
    first, second, third = (s.tool_results[0] for s in t.steps[:3])
    assert first.blocked == BlockReason.invalid_arguments
    assert not second.ok and second.blocked is None and "not a time" in second.output
    assert not third.ok and "unknown city" in third.output
    assert "not a time" in t.steps[2].model_call.messages[-1].content  # the model is told why
    assert not t.submitted and t.grade.score == 0.0 and t.grade.subscores["delivered"] == 0.0
    assert harness_summary([t], 1).delivery_rate == 0.0


def test_tiny_random_model_episodes_end_cleanly(suite, tiny_policy):
    tasks = [_first(suite.tasks("dev"), "easy_day_trip")]
    specs = []
    for name in builtin_names():
        data = load_harness(name).to_dict()
        data["rules"].update(max_steps=2, max_new_tokens=12)
        specs.append(HarnessSpec.model_validate(data))
    trajs = Runner(tiny_policy, SamplingParams(temperature=0.0), progress=False, max_in_flight=8).run(
        make_jobs(tasks, specs, 1)
    )
    assert len(trajs) == len(specs)
    for t in trajs:
        assert t.infra_error is None and t.grade is not None and 0.0 <= t.grade.score <= 1.0
