"""Suite `browse`: the site, its tools, graders, splits, and why the observation window matters."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import HarnessSpec
from harnessrl.models.base import SamplingParams
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Runner, make_jobs
from harnessrl.tasks.base import Environment, Task, ToolFailed, validate_arguments
from harnessrl.tasks.grading import fmt_number
from harnessrl.tasks.registry import get_suite
from harnessrl.tasks.suites.browse import BrowseSuite
from harnessrl.types import Message, ToolCall

FAMILIES = {"cheapest_pair", "top_poster", "out_of_stock_count", "post_author_order", "cancel_order"}


@pytest.fixture(scope="module")
def suite() -> BrowseSuite:
    return get_suite("browse")


def use(task: Task, env: Environment, name: str, **arguments) -> str:
    tool = task.tool(name)
    args, err = validate_arguments(tool.parameters, arguments)
    assert err is None, err
    return tool.fn(env, **args)


def play(task: Task, calls: list[dict]) -> tuple:
    env = task.make_env()
    outputs = [use(task, env, c["name"], **c["arguments"]) for c in calls]
    return task.grade(env), env, outputs


def by_family(suite, family: str, split: str = "dev") -> list[Task]:
    return [t for t in suite.tasks(split) if t.family == family]


# -- the suite -------------------------------------------------------------------------------------


def test_registered_with_core_splits_and_every_family_in_dev(suite):
    assert isinstance(suite, BrowseSuite)
    assert suite.split_sizes == {"train": 2000, "dev": 48, "test": 72}
    assert set(suite.families()) == FAMILIES
    assert {t.family for t in suite.tasks("dev")} == FAMILIES
    task = suite.tasks("dev", 1)[0]
    assert [t.name for t in task.tools] == ["open", "next_page", "search", "click", "submit"]
    assert task.make_env().workspace is None


def test_deterministic_and_splits_disjoint(suite):
    again = BrowseSuite()
    assert [t.fingerprint for t in again.tasks("dev")] == [t.fingerprint for t in suite.tasks("dev")]
    prints = {split: {t.fingerprint for t in suite.tasks(split)} for split in ("train", "dev", "test")}
    assert len(prints["dev"]) == 48 and len(prints["test"]) == 72 and len(prints["train"]) == 2000
    assert not prints["train"] & prints["dev"] and not prints["train"] & prints["test"]
    assert not prints["dev"] & prints["test"]
    assert suite.task("browse/test/00007").fingerprint == suite.tasks("test")[7].fingerprint


def test_every_solution_scores_full_marks_and_pages_are_compact(suite):
    tasks = suite.tasks("dev") + suite.tasks("test") + suite.tasks("train")[::25]
    for task in tasks:
        grade, env, outputs = play(task, task.solution)
        assert grade.passed and grade.score == 1.0, (task.id, task.family, grade.subscores)
        assert all(len(o) < 700 for o in outputs), task.id  # a 135M model reads these
        assert len(task.solution) <= 5  # fits the smallest built-in step budget (8)


def test_doing_nothing_or_guessing_never_passes(suite):
    for task in suite.tasks("dev") + suite.tasks("test"):
        grade, _, _ = play(task, [{"name": "submit", "arguments": {"answer": ""}}])
        assert not grade.passed, task.id
        if task.family != "cancel_order":  # graded on the site state, not on the answer
            grade, _, _ = play(task, task.solution[:-1] + [{"name": "submit", "arguments": {"answer": "123456"}}])
            assert not grade.passed, task.id


# -- answers need more than the last page -----------------------------------------------------------

LISTING = re.compile(r"^\[\d+\] (.+?) - \$(\d+\.\d\d) - stock (\d+) - rating", re.M)
POST = re.compile(r"^#(\d+) \[(\w+)\]: ", re.M)
COMPLAINT = re.compile(r"post #\d+ by \[\w+\] in \".*?\": My (.+?) arrived")
ORDER = re.compile(r"^\[\d+\] Order #(\d+) - \d+ x (.+?) - \$", re.M)


def answer_from(family: str, pages: str) -> str:
    """What a careful reader answers from the page text it can see (and nothing else)."""
    if family in ("cheapest_pair", "out_of_stock_count"):
        products = {name: (float(price), int(stock)) for name, price, stock in LISTING.findall(pages)}
        if family == "cheapest_pair":
            return fmt_number(sum(sorted(p for p, _ in products.values())[:2]))
        return str(sum(stock == 0 for _, stock in products.values()))
    if family == "top_poster":
        counts = Counter(dict(POST.findall(pages)).values())
        best = max(counts.values(), default=0)
        return " or ".join(u for u, c in counts.items() if c == best) or "unknown"  # a tie names every leader
    if family == "post_author_order":
        complaint = COMPLAINT.search(pages)
        orders = [o for o, name in ORDER.findall(pages) if complaint and name == complaint.group(1)]
        return orders[0] if orders else "unknown"
    raise AssertionError(family)


def test_answers_from_the_last_page_alone_are_wrong(suite):
    """Every multi-page question: the right answer needs every page; the last page alone is wrong."""
    for family, pages_needed in [
        ("cheapest_pair", 2),
        ("top_poster", 2),
        ("out_of_stock_count", 3),
        ("post_author_order", 2),
    ]:
        for task in by_family(suite, family) + by_family(suite, family, "test"):
            _, _, outputs = play(task, task.solution[:-1])
            assert len(outputs) == pages_needed
            for seen in range(1, pages_needed + 1):
                answer = answer_from(family, "\n".join(outputs[-seen:]))
                grade, _, _ = play(task, task.solution[:-1] + [{"name": "submit", "arguments": {"answer": answer}}])
                assert grade.passed == (seen == pages_needed), (task.id, seen, answer)


def reading_policy(tasks: list[Task], spec: HarnessSpec, tokenizer) -> ScriptedPolicy:
    """Browses like the known solution, then answers from the tool results still in its prompt.

    One task per instruction. It never remembers anything between calls: if the harness elided
    an earlier page, the facts on it are gone.
    """
    by_instruction = {t.instruction: t for t in tasks}
    assert len(by_instruction) == len(tasks)
    proto = get_protocol(spec.protocol.format, lenient=spec.protocol.lenient)

    def script(messages: list[Message]) -> str:
        start = next(i for i, m in enumerate(messages) if m.role == "user" and m.content in by_instruction)
        task = by_instruction[messages[start].content]
        done = sum(m.role == "assistant" for m in messages[start:])
        if done < len(task.solution) - 1:
            call = task.solution[done]
            return proto.render_call(ToolCall(name=call["name"], arguments=call["arguments"]))
        pages = "\n".join(m.content for m in messages[start:] if m.role == "tool")
        return proto.render_call(ToolCall(name="submit", arguments={"answer": answer_from(task.family, pages)}))

    return ScriptedPolicy(script, tokenizer=tokenizer, name="reader")


def _harness(window: int | None) -> HarnessSpec:
    data = load_harness("json-tools").to_dict()
    data["name"] = f"json-tools-obs{window}"
    data["rules"].update(observation_window=window, max_new_tokens=512, max_total_tokens=None)
    return HarnessSpec.model_validate(data)


def test_observation_window_two_beats_one_through_the_runner(suite, tokenizer):
    """The same reader, the same tasks: keeping two observations answers two-page questions that
    keeping one cannot; three-page questions need three."""
    tasks: list[Task] = []
    for family in ("cheapest_pair", "top_poster", "post_author_order", "out_of_stock_count"):
        unique = {t.instruction: t for t in by_family(suite, family)}
        tasks += list(unique.values())[:3]
    scores: dict[int | None, dict[str, list[float]]] = {}
    for window in (1, 2, 3, None):
        spec = _harness(window)
        runner = Runner(reading_policy(tasks, spec, tokenizer), SamplingParams(temperature=0.0), progress=False)
        trajs = runner.run(make_jobs(tasks, [spec], 1))
        assert all(t.submitted for t in trajs)
        per_family: dict[str, list[float]] = {}
        for t in trajs:
            per_family.setdefault(t.family, []).append(t.grade.score)
        scores[window] = {f: sum(v) / len(v) for f, v in per_family.items()}
        if window == 1:  # the elided page is a placeholder; the model's own calls stay
            last = next(t for t in trajs if t.family == "cheapest_pair").steps[-1].model_call.messages
            tool_msgs = [m.content for m in last if m.role == "tool"]
            assert re.fullmatch(r'\[observation elided: open url="/products\?category=\w+"\]', tool_msgs[0])
            assert "page 2 of 2" in tool_msgs[1]
            assert sum(m.role == "assistant" for m in last) == 2
    mean = {w: sum(s.values()) / len(s) for w, s in scores.items()}
    assert scores[1] == {"cheapest_pair": 0.0, "top_poster": 0.0, "post_author_order": 0.0, "out_of_stock_count": 0.0}
    assert scores[2] == {"cheapest_pair": 1.0, "top_poster": 1.0, "post_author_order": 1.0, "out_of_stock_count": 0.0}
    assert scores[3] == scores[None] == dict.fromkeys(scores[1], 1.0)
    assert mean[1] < mean[2] < mean[3]


# -- the site's tools ---------------------------------------------------------------------------------


def test_bad_addresses_links_and_pages_are_tool_failures(suite):
    task = by_family(suite, "cheapest_pair")[0]
    cat = task.data["category"]
    env = task.make_env()
    for name, args, message in [
        ("next_page", {}, "no page is open"),
        ("click", {"link": "1"}, "no page is open"),
        ("open", {"url": "/nowhere"}, "no page at '/nowhere'"),
        ("open", {"url": "http://[shop/"}, "not a valid address"),
        ("open", {"url": "/products?category=socks"}, "no category 'socks'"),
        ("open", {"url": f"/products?category={cat}&page=9"}, "there is no page 9 (pages 1-2)"),
        ("open", {"url": f"/products?category={cat}&page=two"}, "page must be a number"),
        ("open", {"url": "/product/999"}, "no product 999"),
        ("open", {"url": "/customer/nobody"}, "no customer 'nobody'"),
        ("open", {"url": "/order/12"}, "no order 12"),
        ("open", {"url": "/thread/77"}, "no thread 77"),
        ("search", {"query": "  ?! "}, "the search query is empty"),
    ]:
        with pytest.raises(ToolFailed, match=re.escape(message)):
            use(task, env, name, **args)
    # forgiving about the form of an address and of a link
    assert use(task, env, "open", url="http://shop.example/products?category=" + cat).startswith(
        f"Page: /products?category={cat} |"
    )
    assert use(task, env, "open", url=f"products?category={cat}").startswith(f"Page: /products?category={cat} |")
    with pytest.raises(ToolFailed, match=r"no link 'prev' on .* \(links: 1, 2, 3, 4, next\)"):
        use(task, env, "click", link="prev")
    second = use(task, env, "click", link="next")
    assert "page 2 of 2" in second
    with pytest.raises(ToolFailed, match="has no next page"):
        use(task, env, "next_page")
    first = use(task, env, "click", link="[prev]")
    name = re.search(r"^\[2\] (.+?) - ", first, re.M).group(1)
    assert use(task, env, "click", link=2).startswith("Page: /product/")  # a number, not a string
    assert "page 1 of 2" in use(task, env, "open", url=f"/products?category={cat}")
    assert use(task, env, "click", link=name.upper()) == use(task, env, "open", url=_product_url(env, name))
    page2 = use(task, env, "open", url=f"/products?category={cat}&page=2")
    name2 = re.search(r"^\[1\] (.+?) - ", page2, re.M).group(1)
    assert use(task, env, "click", link=name2[1:]) == use(task, env, "open", url=_product_url(env, name2))  # a part
    use(task, env, "open", url=f"/products?category={cat}&page=2")
    with pytest.raises(ToolFailed, match="no link '9'"):
        use(task, env, "click", link=9)  # a number is never matched inside a link's text


def _product_url(env: Environment, name: str) -> str:
    return "/product/%d" % next(p["id"] for p in env.state["site"]["products"] if p["name"] == name)


def test_search_finds_products_threads_posts_and_customers(suite):
    task = by_family(suite, "post_author_order")[0]
    env = task.make_env()
    site = env.state["site"]
    product = site["products"][0]
    page = use(task, env, "search", query=product["name"].lower())
    assert f"{product['name']} (product, $" in page
    thread = site["threads"][0]
    assert f"{thread['title']} (thread)" in use(task, env, "search", query=thread["title"])
    customer = site["customers"][0]
    assert f"(customer {customer['name']})" in use(task, env, "search", query=customer["user"])
    hits = use(task, env, "search", query=task.data["damage"])
    assert hits.count("post #") == 1  # the complaint is the only post with that word
    assert "no results" in use(task, env, "search", query="zeppelin")


def test_cancel_changes_the_site_state_and_is_graded_on_it(suite):
    for task in by_family(suite, "cancel_order"):
        user = task.data["user"]
        # cancelling another processing order of the same customer: no credit at all
        env = task.make_env()
        page = use(task, env, "open", url=f"/customer/{user}")
        target = task.solution[2]["arguments"]["link"]
        wrong = [
            n
            for n, status in re.findall(r"^\[(\d+)\] Order #\d+ .* - (\w+)$", page, re.M)
            if status == "processing" and n != target
        ]
        assert wrong, task.id  # the customer has another order that could be cancelled
        use(task, env, "click", link=wrong[0])
        assert "cancelled" in use(task, env, "click", link="cancel")
        assert task.grade(env).subscores == {"cancelled": 0.0, "others_unchanged": 0.0}
        # an order that is not processing has no cancel link
        done = [o for o in env.state["site"]["orders"] if o["status"] != "processing"]
        use(task, env, "open", url=f"/order/{done[0]['id']}")
        with pytest.raises(ToolFailed, match="no link 'cancel'"):
            use(task, env, "click", link="cancel")
        # a fresh environment starts from the generated state again, and doing nothing scores 0
        fresh = task.grade(task.make_env())
        assert fresh.subscores == {"cancelled": 0.0, "others_unchanged": 0.0} and fresh.score == 0.0


def test_tiny_random_model_browses_without_crashing(tiny_policy):
    from harnessrl.types import Termination

    tasks = get_suite("browse").tasks("dev", 1)
    specs = []
    for name in ("json-tools", "xml-tags", "react", "code-act"):  # every protocol
        data = load_harness(name).to_dict()
        data["rules"].update(max_steps=2, max_new_tokens=12, observation_window=1)
        specs.append(HarnessSpec.model_validate(data))
    trajs = Runner(tiny_policy, SamplingParams(temperature=1.0), progress=False).run(make_jobs(tasks, specs, 1))
    assert len(trajs) == len(tasks) * len(specs)
    for t in trajs:
        assert t.termination in {
            Termination.max_steps,
            Termination.submitted,
            Termination.max_tokens,
            Termination.loop_guard,
        }, (t.termination, t.infra_error)
        assert t.grade is not None


def test_odd_input_never_crashes_a_tool(suite):
    """Whatever a model sends, a tool answers with a page or a ToolFailed."""
    import random

    rng = random.Random(7)
    odd = [
        "",
        " ",
        "/",
        "//",
        "?",
        "&&",
        "%zz",
        "/products?category=",
        "/thread/1?page=-1",
        "/order/#1",
        "javascript:alert(1)",
        "http://",
        "http://[",
        "/product/1/2",
        "ñ/ü",
        "\x00",
        "[]",
        "[",
        "0",
        "-1",
        "1e9",
        None,
        3.5,
        True,
        [],
        {},
        "x" * 5000,
    ]
    odd += ["".join(rng.choice("/?&=#[]:%.-_ aZ09") for _ in range(rng.randint(1, 30))) for _ in range(200)]
    for task in [by_family(suite, f)[0] for f in sorted(FAMILIES)]:
        env = task.make_env()
        use(task, env, "open", url="/")
        for value in odd:
            for name, arg in [("open", "url"), ("search", "query"), ("click", "link")]:
                tool = task.tool(name)
                args, err = validate_arguments(tool.parameters, {arg: value})
                if err:
                    continue  # the runner blocks it before the tool runs
                try:
                    assert isinstance(tool.fn(env, **args), str)
                except ToolFailed:
                    pass
