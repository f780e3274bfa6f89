"""Harness evolution: noise threshold, acceptance, re-measured incumbent, held-out discipline,
resume and lock, proposers (rules catalogue, llm garbage), the evolution.jsonl record.

The agent is a scripted policy whose success rate depends on the harness spec, so the truth is
known: lessons in the system prompt (capabilities.experiences) raise it from 0.3 to 0.95, every
other edit changes nothing. Each episode is one reply (submit the right word or a wrong one).
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from pathlib import Path

import pytest

from harnessrl.errors import JobError
from harnessrl.evolve import Evolution, EvolveConfig, EvolveError
from harnessrl.evolve.acceptance import (
    acceptance_threshold,
    compare,
    confirmed_choice,
    estimate_noise,
    score_resolution,
    screening_winners,
    unseen_rate_floor,
)
from harnessrl.evolve.edits import apply_changes, apply_diff, spec_diff, spec_from_text
from harnessrl.evolve.loop import episode_scores, stream_seed
from harnessrl.evolve.proposers import RULE_EDITS, LLMProposer, Proposal, ProposalContext, RulesProposer
from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import HarnessSpec, SpecError, parse_spec
from harnessrl.metrics import task_scores
from harnessrl.models.base import Policy, PolicyError
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.store import RunStore
from harnessrl.tasks.base import SUBMIT_TOOL, Environment, Task
from harnessrl.tasks.suites.workspace import WorkspaceSuite
from harnessrl.triage import CONTENT, PROCESS
from harnessrl.types import Message, ToolCall

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "tiger",
    "lemon",
    "piano",
    "ocean",
    "amber",
    "cedar",
    "delta",
    "ember",
    "frost",
    "grape",
    "harbor",
]
P_BASE, P_LESSONS = 0.3, 0.95
LESSONS = "## Lessons from earlier attempts"

SEED = parse_spec(
    {
        "name": "one-shot",
        "system_prompt": "Submit the word the user asks for.\n{tools}",
        "protocol": {"format": "json"},
        "rules": {"max_steps": 1, "max_new_tokens": 64},
    }
)


def say_task(split: str, i: int) -> Task:
    word = WORDS[i % len(WORDS)]

    def check(env: Environment) -> dict[str, float]:
        return {"word": float((env.answer or "").strip() == word)}

    return Task(
        id=f"say/{split}/{i:05d}",
        suite="say",
        family="say_word",
        split=split,
        seed=i,
        instruction=f"Submit the word '{word}' (task {split} {i}).",
        tools=[SUBMIT_TOOL],
        setup=lambda env: None,
        check=check,
        needs_workspace=False,
        data={"word": word},
    )


def dev_and_test(n_dev: int = 12, n_test: int = 6) -> tuple[list[Task], list[Task]]:
    return [say_task("dev", i) for i in range(n_dev)], [say_task("test", i) for i in range(n_test)]


class _CrashingBackend(Policy):
    """Raises a non-PolicyError (the runner itself breaks) when a system prompt has `word`."""

    def __init__(self, inner: Policy, word: str | None):
        self.inner, self.word, self.name = inner, word, inner.name

    def complete(self, requests, sampling=None):
        if self.word and any(self.word in r.messages[0].content for r in requests):
            raise SystemError("backend crashed")
        return self.inner.complete(requests, sampling)


class SpecDependentAgent:
    """Right word with probability P_LESSONS when the prompt has lessons, else P_BASE.

    Draws come from one seeded RNG in call order (the runner's order is deterministic).
    `kill_at`: raise KeyboardInterrupt on that call (a killed process), once.
    `crash_word`: a RuntimeError from the backend when the system prompt contains it.
    """

    def __init__(self, tokenizer, seed: int = 0, kill_at: int | None = None, crash_word: str | None = None):
        self.rng = random.Random(seed)
        self.calls = 0
        self.kill_at = kill_at
        self.crash_word = crash_word
        self.proto = get_protocol("json", lenient=True)
        self.policy = _CrashingBackend(
            ScriptedPolicy(self.reply, tokenizer=tokenizer, name="spec-dependent"), crash_word
        )

    def reply(self, messages: list[Message]) -> str:
        self.calls += 1
        if self.kill_at is not None and self.calls == self.kill_at:
            self.kill_at = None
            raise KeyboardInterrupt
        system = messages[0].content
        word = next(
            m.content.split("'")[1] for m in messages if m.role == "user" and m.content.startswith("Submit the word")
        )
        p = P_LESSONS if LESSONS in system else P_BASE
        answer = word if self.rng.random() < p else "wrong"
        return self.proto.render_call(ToolCall(name="submit", arguments={"answer": answer}))


def config(**kw) -> EvolveConfig:
    base = dict(
        suite="say",
        seed_harness="one-shot",
        model="scripted",
        dev_tasks=12,
        test_tasks=6,
        rollouts=8,
        iterations=2,
        candidates=2,
    )
    base.update(kw)
    return EvolveConfig(**base)


def evolution(folder: Path, agent: SpecDependentAgent, proposer=None, **kw) -> Evolution:
    cfg = config(**kw)
    dev, test = dev_and_test(cfg.dev_tasks, cfg.test_tasks)
    return Evolution(folder, cfg, SEED, dev, test, agent.policy, proposer or RulesProposer())


def log_lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "evolution.jsonl").read_text().splitlines()]


def test_spec_diff_round_trips_and_invalid_edits_are_refused():
    react = load_harness("react")
    new = apply_changes(react, {"rules.loop_guard.repeats": 2, "capabilities.experiences": ["Read first."]})
    diff = spec_diff(react, new)
    assert {c["path"]: c["to"] for c in diff} == {
        "rules.loop_guard.repeats": 2,
        "capabilities.experiences": ["Read first."],
    }
    assert apply_diff(react, diff) == new
    with pytest.raises(SpecError, match="loop_guard.repeats"):
        apply_changes(react, {"rules.loop_guard.repeats": 1})
    with pytest.raises(SpecError, match="not a section"):
        apply_changes(react, {"system_prompt.x": 1})
    with pytest.raises(SpecError, match="not valid YAML"):
        spec_from_text("```yaml\nname: [unclosed\n```")


def test_noise_estimate_and_threshold_formula():
    a = {"t1": 1.0, "t2": 0.5, "t3": 0.0, "t4": 0.5}
    b = {"t1": 0.5, "t2": 0.5, "t3": 0.5, "t4": 0.5}
    noise = estimate_noise(a, b)  # d = 0.5, 0, -0.5, 0 -> sd(d) = sqrt(0.5 / 3)
    sd_d = (0.5 / 3) ** 0.5
    assert noise.sd_task_difference == pytest.approx(sd_d)
    assert noise.sd_dev_mean == pytest.approx(sd_d / (2 * 4) ** 0.5)
    assert noise.sd_paired_difference == pytest.approx(sd_d / 2)
    assert acceptance_threshold(noise) == pytest.approx(2 * sd_d / 2)
    assert acceptance_threshold(noise, 2.0, floor=0.9) == 0.9
    assert compare(b, {k: v + 0.5 for k, v in b.items()}, 0.4).accepted
    assert not compare(b, {k: v + 0.3 for k, v in b.items()}, 0.4).accepted
    with pytest.raises(ValueError, match="at least 2 tasks"):
        estimate_noise({"t1": 1.0}, {"t1": 0.0})
    assert noise.sd_paired_difference_within_tasks is None
    assert noise.sd_paired_difference == noise.sd_paired_difference_between_runs


def test_the_noise_sd_is_the_larger_of_the_between_run_and_within_task_estimates():
    # two runs that agree on every task mean, but each task's 2 attempts disagree: no spread between
    # runs, plenty within tasks (the between-run estimate alone would say 0)
    a = b = {"t1": 0.5, "t2": 0.5, "t3": 0.5}
    eps = {"t1": [1.0, 0.0], "t2": [0.0, 1.0], "t3": [1.0, 0.0]}
    noise = estimate_noise(a, b, eps, eps)
    var = 1 / 3  # sample variance of [1, 0, 1, 0]
    within = (3 * var * (1 / 2 + 1 / 2)) ** 0.5 / 3
    assert noise.sd_paired_difference_between_runs == 0
    assert noise.sd_paired_difference_within_tasks == pytest.approx(within)
    assert noise.sd_paired_difference == pytest.approx(within) and noise.sd_dev_mean == pytest.approx(within / 2**0.5)
    assert not noise.degenerate and noise.to_json()["degenerate"] is False
    # and when the runs disagree more than the attempts spread, the between-run estimate wins
    c = {"t1": 1.0, "t2": 0.0, "t3": 1.0}
    wide = estimate_noise(a, c, eps, {"t1": [1.0, 1.0], "t2": [0.0, 0.0], "t3": [1.0, 1.0]})
    assert wide.sd_paired_difference == wide.sd_paired_difference_between_runs > wide.sd_paired_difference_within_tasks
    same, one_each = {"t1": 0.0, "t2": 1.0}, {"t1": [0.0], "t2": [1.0]}
    flat = estimate_noise(same, same, one_each, one_each)
    assert flat.degenerate
    assert score_resolution(12, 8) == pytest.approx(1 / 96)
    assert acceptance_threshold(flat, 2.0, floor=score_resolution(12, 8)) == pytest.approx(1 / 96)
    # greedy decoding with mixed scores: no spread because there is none, not because it hid
    assert unseen_rate_floor(flat, 4) == 0.0
    zeros, none_pass = {"t1": 0.0, "t2": 0.0}, {"t1": [0.0, 0.0], "t2": [0.0, 0.0]}
    at_zero = estimate_noise(zeros, zeros, none_pass, none_pass)
    assert unseen_rate_floor(at_zero, 192) == pytest.approx(2 * (2 * (3 / 192) * (1 - 3 / 192) / 96) ** 0.5)
    ones, all_pass = {"t1": 1.0, "t2": 1.0}, {"t1": [1.0, 1.0], "t2": [1.0, 1.0]}
    assert unseen_rate_floor(estimate_noise(ones, ones, all_pass, all_pass), 192) == unseen_rate_floor(at_zero, 192)
    assert unseen_rate_floor(at_zero, 4) == pytest.approx(2 * (2 * 0.5 * 0.5 / 2) ** 0.5)  # p capped at 1/2
    with pytest.raises(ValueError, match="at least 2"):
        unseen_rate_floor(at_zero, 1)


def test_screening_winners_and_the_confirmed_choice():
    assert screening_winners({"c1": 0.10, "c2": 0.30, "c3": 0.04, "c4": None, "c5": 0.30}, 0.05) == ["c2", "c5", "c1"]
    assert confirmed_choice({"c2": 0.02, "c1": 0.09, "c5": None}, 0.05) == "c1"
    assert confirmed_choice({"c2": 0.05}, 0.05) is None  # must exceed, not equal
    assert confirmed_choice({}, 0.05) is None


class WatchingProposer(RulesProposer):
    """The rules proposer, plus a look into the run database each time it is asked."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.calls = 0
        self.test_episodes_seen: list[int] = []

    def propose(self, ctx):
        self.calls += 1
        db = sqlite3.connect(self.folder / "run.db")
        self.test_episodes_seen.append(
            db.execute("SELECT COUNT(*) FROM episodes WHERE task_id LIKE '%/test/%'").fetchone()[0]
        )
        db.close()
        return super().propose(ctx)


def test_loop_accepts_a_real_improvement_rejects_noise_and_confirms_once(tmp_path, tokenizer):
    folder = tmp_path / "evo"
    agent = SpecDependentAgent(tokenizer)
    watcher = WatchingProposer(folder)
    final = evolution(folder, agent, watcher).run()

    # threshold from the two seed runs, recomputed from the stored episodes
    with RunStore(folder) as store:
        ta = list(store.trajectories("noise.a", with_tokens=False))
        tb = list(store.trajectories("noise.b", with_tokens=False))
        labels = set(store.harnesses())
        per_label = {h: len(list(store.trajectories(h, with_tokens=False))) for h in labels}
    noise = json.loads((folder / "noise.json").read_text())
    expected = estimate_noise(task_scores(ta), task_scores(tb), episode_scores(ta), episode_scores(tb))
    assert noise["threshold"] == pytest.approx(max(2.0 * expected.sd_paired_difference, 1 / (12 * 8)))
    assert noise["threshold"] > 0 and noise["score_resolution"] == pytest.approx(1 / (12 * 8))

    lines = log_lines(folder)
    first = [ln for ln in lines if ln["iteration"] == 1]
    # dominant class is content: lessons (the true fix) first, then the ledger (no effect)
    assert [ln["edit"] for ln in first] == ["experience-library", "state-ledger"]
    lessons, ledger = first
    assert lessons["accepted"] and lessons["delta"] > lessons["threshold"]
    # accepted only after it beat the threshold again on fresh samples, against a fresh incumbent run
    assert lessons["confirmation"]["beats_threshold"] and lessons["confirmation"]["delta"] > lessons["threshold"]
    assert lessons["confirmation"]["dev"]["label"] == "i01.c1.confirm"
    assert lessons["confirmation"]["incumbent_dev"]["label"] == "i01.incumbent.confirm"
    assert not ledger["accepted"] and ledger["delta"] <= ledger["threshold"] and ledger["confirmation"] is None
    assert all(ln["target"] == "content" for ln in first)

    # the incumbent is re-measured every iteration, and iteration 2 builds on the accepted edit
    assert {"i01.incumbent", "i02.incumbent"} <= labels
    assert per_label["i01.incumbent"] == per_label["i02.incumbent"] == 12 * 8
    second = [ln for ln in lines if ln["iteration"] == 2]
    assert second and all(ln["parent"] == "i01.c1" for ln in second)
    assert all(ln["incumbent_dev"]["label"] == "i02.incumbent" for ln in second)

    # held-out tasks were never run before the final step, and then once per side
    assert watcher.calls == 2 and watcher.test_episodes_seen == [0, 0]
    assert {h for h in labels if h.startswith("test.")} == {"test.seed", "test.best"}
    assert per_label["test.seed"] == per_label["test.best"] == 6 * 8

    assert final.best == "i01.c1"
    assert final.best_harness.mean_score > final.seed.mean_score
    assert final.paired_difference.mean_difference > 0.4
    on_disk = (folder / "final.json").read_text()
    assert on_disk == json.dumps(final.model_dump(), indent=1) + "\n"  # final.json is the model's dump, in order
    best = parse_spec(__import__("yaml").safe_load((folder / "best_harness.yaml").read_text()))
    assert best.capabilities.experiences and best.name == "one-shot-evolved"
    for side in ("seed", "best_harness"):
        assert set(getattr(final, side).triage) == {"n_failed", "counts", "rates", "process_share", "content_share"}
        assert 0 <= getattr(final, side).delivery_rate <= 1
    assert final.wall_time_s > 0

    # a finished folder is locked
    with pytest.raises(JobError, match="finished and locked"):
        evolution(folder, SpecDependentAgent(tokenizer)).run()


LINE_FIELDS = {
    "iteration",
    "candidate",
    "parent",
    "proposer",
    "edit",
    "hypothesis",
    "target",
    "diff",
    "spec_fingerprint",
    "status",
    "error",
    "dev",
    "incumbent_dev",
    "delta",
    "delta_ci95",
    "threshold",
    "beats_threshold",
    "confirmation",
    "accepted",
}
DEV_FIELDS = {"label", "mean", "ci95", "n_episodes", "delivery_rate", "n_infra_errors", "seed"}


def test_evolution_lines_have_every_field(tmp_path, tokenizer):
    folder = tmp_path / "evo"
    evolution(folder, SpecDependentAgent(tokenizer), iterations=1).run()
    lines = log_lines(folder)
    assert lines
    for ln in lines:
        assert set(ln) == LINE_FIELDS
        assert ln["status"] == "measured" and ln["diff"] and ln["hypothesis"]
        assert set(ln["dev"]) == set(ln["incumbent_dev"]) == DEV_FIELDS
        if ln["confirmation"] is not None:
            assert set(ln["confirmation"]) == {
                "dev",
                "incumbent_dev",
                "delta",
                "delta_ci95",
                "beats_threshold",
                "error",
            }
            assert set(ln["confirmation"]["dev"]) == DEV_FIELDS
        lo, hi = ln["dev"]["ci95"]
        assert lo <= ln["dev"]["mean"] <= hi
        assert len(ln["delta_ci95"]) == 2


def test_killed_loop_resumes_without_losing_work(tmp_path, tokenizer):
    folder = tmp_path / "evo"
    # noise 2 x 96 calls, i01.incumbent 96: call 300 is inside the first candidate's run
    agent = SpecDependentAgent(tokenizer, kill_at=300)
    first = WatchingProposer(folder)
    with pytest.raises(KeyboardInterrupt):
        evolution(folder, agent, first).run()
    assert first.calls == 1
    assert (folder / "proposals" / "i01.json").is_file()
    assert not (folder / "evolution.jsonl").read_text()  # the iteration did not complete
    with RunStore(folder) as store:
        stored_at_kill = store.count()
    assert stored_at_kill >= 3 * 96

    again = SpecDependentAgent(tokenizer, seed=1)
    second = WatchingProposer(folder)
    final = evolution(folder, again, second).run()
    assert second.calls == 1  # iteration 1's proposals came from the folder; only iteration 2 asked
    with RunStore(folder) as store:
        total = store.count()
    assert again.calls == total - stored_at_kill  # nothing finished before the kill ran again
    assert [ln["iteration"] for ln in log_lines(folder)].count(1) == 2
    assert final.best != "seed" or final.accepted_edits == []
    with pytest.raises(JobError, match="finished and locked"):
        evolution(folder, again).run()


def test_resume_with_another_configuration_is_refused(tmp_path, tokenizer):
    folder = tmp_path / "evo"
    with pytest.raises(KeyboardInterrupt):
        evolution(folder, SpecDependentAgent(tokenizer, kill_at=5)).run()
    with pytest.raises(JobError, match="rollouts"):
        evolution(folder, SpecDependentAgent(tokenizer), rollouts=4).run()


def test_a_resume_may_shorten_the_search_and_goes_on_to_the_test(tmp_path, tokenizer):
    folder = tmp_path / "evo"
    with pytest.raises(KeyboardInterrupt):  # call 300 is inside iteration 1's first candidate
        evolution(folder, SpecDependentAgent(tokenizer, kill_at=300), iterations=3).run()
    final = evolution(folder, SpecDependentAgent(tokenizer, seed=1), iterations=1).run()
    assert final.iterations_run == 1
    assert {ln["iteration"] for ln in log_lines(folder)} == {1}
    assert json.loads((folder / "config.json").read_text())["iterations"] == 1
    with RunStore(folder) as store:
        assert "test.seed" in store.harnesses()  # the held-out split ran


def test_a_callers_stop_when_ends_the_search_and_a_kill_before_its_answer_changes_nothing(tmp_path, tokenizer):
    """`stop_when(iterations_done)` is asked after each iteration; its reason ends the search, the
    held-out phase runs at that iteration and final.json says why. A kill while it is being asked
    (the iteration saved, no answer yet) resumes to the same end without another iteration."""
    folder = tmp_path / "evo"
    asked: list[int] = []

    def killed(done: int) -> str | None:
        asked.append(done)
        raise KeyboardInterrupt

    agent = SpecDependentAgent(tokenizer)
    cfg = config(iterations=3)
    dev, test = dev_and_test(cfg.dev_tasks, cfg.test_tasks)
    with pytest.raises(KeyboardInterrupt):
        Evolution(folder, cfg, SEED, dev, test, agent.policy, RulesProposer(), stop_when=killed).run()
    assert asked == [1] and {ln["iteration"] for ln in log_lines(folder)} == {1}
    calls_at_kill = agent.calls

    def ceiling(done: int) -> str | None:
        asked.append(done)
        return "enough" if done >= 1 else None

    final = Evolution(folder, cfg, SEED, dev, test, agent.policy, RulesProposer(), stop_when=ceiling).run()
    assert asked == [1, 1]
    assert final.iterations_run == 1 and final.stopped_by == "enough"
    assert {ln["iteration"] for ln in log_lines(folder)} == {1}  # no second iteration ran
    with RunStore(folder) as store:
        assert "test.seed" in store.harnesses()  # the held-out phase ran at iteration 1
        assert not any(h.startswith("i02") for h in store.harnesses())
    assert agent.calls > calls_at_kill  # only the held-out episodes were added
    # without a stop_when the search runs its budget, and says nothing stopped it
    other = evolution(tmp_path / "budget", SpecDependentAgent(tokenizer), iterations=1).run()
    assert other.stopped_by is None and other.iterations_run == 1


class FixedProposer:
    name = "fixed"

    def __init__(self, proposals):
        self.proposals = proposals

    def propose(self, ctx):
        return list(self.proposals)


def test_a_candidate_that_crashes_the_runner_is_recorded_and_skipped(tmp_path, tokenizer):
    folder = tmp_path / "evo"
    crash = apply_changes(SEED, {"capabilities.experiences": ["CRASH the backend"]})
    good = apply_changes(SEED, {"capabilities.experiences": ["Submit exactly the word asked for."]})
    proposer = FixedProposer([Proposal("crashes", "content", "x", crash), Proposal("helps", "content", "y", good)])
    agent = SpecDependentAgent(tokenizer, crash_word="CRASH")
    final = evolution(folder, agent, proposer, iterations=1).run()
    crashed, helped = log_lines(folder)
    assert crashed["status"] == "crashed" and "backend crashed" in crashed["error"] and not crashed["accepted"]
    assert helped["status"] == "measured" and helped["accepted"]
    assert final.crashed_candidates == 1 and final.best == "i01.c2"


def test_llm_garbage_is_counted_and_skipped(tmp_path, tokenizer):
    valid = apply_changes(SEED, {"capabilities.experiences": ["Submit exactly the word asked for."]})
    replies = [
        "I think you should add more examples.\n: : [unclosed",  # not YAML
        # invalid spec
        "HYPOTHESIS: stop loops\nTARGET: loop\n```yaml\nname: x\nsystem_prompt: hi\nbogus_field: 1\n```",
        "HYPOTHESIS: lessons fix wrong answers\nTARGET: content\n```yaml\n" + valid.to_yaml() + "```",
    ]
    asked: list[list[Message]] = []

    def proposer_model(messages):
        asked.append(messages)
        return replies[(len(asked) - 1) % len(replies)]

    proposer = LLMProposer(ScriptedPolicy(proposer_model, tokenizer=tokenizer, name="proposer"))
    folder = tmp_path / "evo"
    final = evolution(folder, SpecDependentAgent(tokenizer), proposer, iterations=1, candidates=3).run()
    lines = log_lines(folder)
    assert [ln["status"] for ln in lines] == ["invalid", "invalid", "measured"]
    assert "not valid YAML" in lines[0]["error"] or "must be a mapping" in lines[0]["error"]
    assert "bogus_field" in lines[1]["error"]
    assert lines[2]["target"] == "content" and lines[2]["hypothesis"] == "lessons fix wrong answers"
    assert lines[2]["accepted"]
    assert final.invalid_proposals == 2
    # the model saw the spec, and full failing trajectories (every reply and the grade)
    prompt = asked[0][-1].content
    assert "system_prompt:" in prompt and "## Failing trajectories (full)" in prompt
    assert "MODEL: " in prompt and "CALL submit" in prompt and "END: submitted" in prompt


def test_llm_proposer_backend_failure_becomes_one_invalid_proposal(tokenizer):
    def broken(messages):
        raise PolicyError("server down")

    proposer = LLMProposer(ScriptedPolicy(broken, tokenizer=tokenizer))
    ctx = ProposalContext(1, SEED, {"counts": {}, "episodes": []}, [], [], [], n=2)
    (p,) = proposer.propose(ctx)
    assert p.spec is None and "server down" in p.error


def _ctx(cls: str, incumbent: HarnessSpec) -> ProposalContext:
    tools = [t.schema for t in WorkspaceSuite().base_tools()] + [SUBMIT_TOOL.schema]
    evidence = {
        "content": "delivered; score 0.50 < 1.00 (file=1.00, content=0.00)",
        "insufficient_evidence": "submitted without a successful read_file",
        "blocked_call": "read_file refused (invalid_arguments): missing required argument 'path'",
    }.get(cls, "x")
    episodes = [
        {"episode_id": f"e{i}", "class": cls, "family": "csv_report", "evidence": evidence, "step": 1} for i in range(3)
    ]
    other = "loop" if cls != "loop" else "content"
    episodes.append({"episode_id": "o", "class": other, "family": "f", "evidence": "x", "step": 1})
    triage = {"counts": {cls: 3, other: 1}, "episodes": episodes, "n_passed": 1, "n_valid": 5}
    return ProposalContext(1, incumbent, triage, [], [], tools, n=len(RULE_EDITS[cls]))


EXPECTED_PATHS = {
    "malformed_call": {"format-demonstration": {"rules.demonstrations"}, "format-feedback": set()},
    "blocked_call": {"blocked-feedback": set(), "tool-usage-lesson": {"capabilities.experiences"}},
    "loop": {"loop-guard": {"rules.loop_guard.repeats"}, "state-ledger": {"capabilities.ledger.enabled"}},
    "budget_exhausted": {
        "budget-notice": {"rules.budget_notice.remaining_steps"},
        "plan-checkpoint": {"loop.kind"},
        "more-steps": {"rules.max_steps", "rules.max_total_tokens"},
    },
    "no_delivery": {
        "submit-lesson": {"capabilities.experiences"},
        "budget-notice": {"rules.budget_notice.remaining_steps"},
    },
    "insufficient_evidence": {
        "verify-before-submit": {"rules.submit_checkpoint.enabled"},
        "evidence-lesson": {"capabilities.experiences"},
    },
    "content": {
        "experience-library": {"capabilities.experiences"},
        "state-ledger": {"capabilities.ledger.enabled"},
        "helper-tools": {"capabilities.helper_tools"},
    },
}


@pytest.mark.parametrize("cls", PROCESS + CONTENT)
def test_rules_proposer_maps_each_class_to_its_edits(cls):
    # the feedback edits only apply to a harness that has feedback switched off
    incumbent = apply_changes(load_harness("react"), {"rules.feedback.show_format": False, "protocol.lenient": False})
    proposals = RulesProposer().propose(_ctx(cls, incumbent))
    expected = EXPECTED_PATHS[cls]
    assert [p.edit for p in proposals] == list(expected)
    for p in proposals:
        assert p.target == cls and p.hypothesis and p.spec is not None
        paths = {c["path"] for c in spec_diff(incumbent, p.spec)}
        assert paths >= expected[p.edit] and paths
    if cls == "content":
        lessons = proposals[0].spec.capabilities.experiences
        assert any("content" in le and "file" not in le.split("short on:")[1] for le in lessons)
        assert {h.name for h in proposals[2].spec.capabilities.helper_tools} == {"look_and_read", "write_and_check"}
    if cls == "malformed_call":
        demo = proposals[0].spec.rules.demonstrations[-1]
        assert demo.calls[0].name in {
            "list_dir",
            "read_file",
            "write_file",
            "append_file",
            "move_file",
            "delete_file",
            "search_text",
        }


def test_rules_proposer_skips_what_was_tried_and_the_dominant_class_comes_first():
    react = load_harness("react")
    ctx = _ctx("budget_exhausted", react)
    ctx.n = 2
    first = RulesProposer().propose(ctx)
    assert [p.edit for p in first] == ["budget-notice", "plan-checkpoint"]
    from harnessrl.evolve.edits import spec_fingerprint

    ctx.tried = {spec_fingerprint(p.spec) for p in first}
    assert [p.edit for p in RulesProposer().propose(ctx)] == ["more-steps", "loop-guard"]


class _CannedChat:
    """A minimal OpenAI-compatible chat server: answers each request with the next canned reply."""

    def __init__(self, replies: list[str]):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.replies, self.bodies = list(replies), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append(body)
                text = server.replies[(len(server.bodies) - 1) % len(server.replies)]
                out = json.dumps(
                    {
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                        ]
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_llm_proposer_over_an_openai_compatible_server(tokenizer):
    from harnessrl.models import load_policy

    valid = apply_changes(SEED, {"rules.loop_guard.enabled": True})
    server = _CannedChat(
        ["no spec here, sorry", "HYPOTHESIS: a guard stops loops\nTARGET: loop\n```yaml\n" + valid.to_yaml() + "```"]
    )
    try:
        proposer = LLMProposer(load_policy(f"openai:fake-proposer@{server.url}"))
        agent = SpecDependentAgent(tokenizer)
        failing = agent.policy.inner  # one failing episode to show in full
        from harnessrl.rollout import Runner, make_jobs

        trajs = Runner(failing, progress=False).run(make_jobs([say_task("dev", 0)], [SEED], 3))
        failures = [t for t in trajs if not t.grade.passed]
        triage = {
            "counts": {"content": len(failures)},
            "episodes": [
                {
                    "episode_id": t.episode_id,
                    "class": "content",
                    "family": t.family,
                    "evidence": "delivered; score 0.00 < 1.00",
                    "step": 0,
                }
                for t in failures
            ],
        }
        ctx = ProposalContext(1, SEED, triage, failures, [], [SUBMIT_TOOL.schema], n=2)
        # the two requests go out concurrently: which one got which reply is not fixed
        bad, good = sorted(proposer.propose(ctx), key=lambda p: p.spec is not None)
    finally:
        server.close()
    assert bad.spec is None and bad.error and bad.raw == "no spec here, sorry"
    assert (
        good.spec is not None
        and good.target == "loop"
        and spec_diff(SEED, good.spec) == [{"path": "rules.loop_guard.enabled", "from": False, "to": True}]
    )
    sent = server.bodies[0]["messages"][-1]["content"]
    assert failures and all(t.episode_id in sent for t in failures[:4])


def test_cli_refuses_bad_configurations_and_a_finished_folder(tmp_path):
    from typer.testing import CliRunner

    from harnessrl.cli import app

    cli = CliRunner()

    def run(*args):
        return cli.invoke(app, ["evolve", "--model", "tiny-random", "--out", str(tmp_path / "evo"), *args])

    r = run("--proposer", "llm")
    assert r.exit_code == 2 and "needs --proposer-model" in r.output
    r = run("--proposer", "llm", "--proposer-model", "smollm2-135m")
    assert r.exit_code == 2 and "openai:NAME@URL" in r.output
    r = run("--dev-tasks", "1")
    assert r.exit_code == 2 and "--dev-tasks must be >= 2" in r.output
    r = run("--resume")
    assert r.exit_code == 2 and "holds no evolution run" in r.output
    folder = tmp_path / "evo"
    folder.mkdir()
    # a run of a built-in suite (the kernel reads the suite before the job looks at the folder)
    (folder / "config.json").write_text(json.dumps(config(suite="toolcalc", seed_harness="react").to_json()))
    r = run()
    assert r.exit_code == 2 and "already holds a run" in r.output
    (folder / "state.json").write_text(json.dumps({"phase": "finished"}))
    (folder / "LOCKED").write_text("final.json is written\n")  # what a finished run leaves
    r = run("--resume")
    assert r.exit_code == 2 and "finished and locked" in r.output


def test_the_command_line_resume_takes_the_recorded_options_and_refuses_a_given_difference(tmp_path, monkeypatch):
    """The one resume rule (harnessrl.kernel): options left out take the recorded values, a given
    --iterations changes the search length (said), a given --rollouts that differs is refused."""
    from typer.testing import CliRunner

    import harnessrl.evolve.run as evolve_run
    from harnessrl.cli import app

    seen = []
    real_run_evolve = evolve_run.run_evolve

    def fake_run_evolve(ctx, stop_when=None):
        seen.append(ctx.config)
        raise EvolveError("stopped by the test")

    monkeypatch.setattr(evolve_run, "run_evolve", fake_run_evolve)
    folder = tmp_path / "evo"
    folder.mkdir()
    recorded = config(suite="toolcalc", seed_harness="react", model="tiny-random", iterations=5, rollouts=8)
    (folder / "config.json").write_text(json.dumps(recorded.to_json()))
    (folder / "state.json").write_text(json.dumps({"phase": "search"}))
    base = ["evolve", "--out", str(folder), "--resume"]
    r = CliRunner().invoke(app, [*base, "--iterations", "1"])
    assert r.exit_code == 2 and "stopped by the test" in r.output
    assert "--iterations changed: 5 -> 1" in r.output
    assert (seen[-1].iterations, seen[-1].rollouts, seen[-1].model) == (1, 8, "tiny-random")  # the rest recorded
    CliRunner().invoke(app, base)
    assert seen[-1].iterations == 5  # not given: the stored search length
    monkeypatch.setattr(evolve_run, "run_evolve", real_run_evolve)
    r = CliRunner().invoke(app, [*base, "--rollouts", "2"])
    assert r.exit_code == 2 and "rollouts (8 -> 2)" in r.output, r.output
    assert "Leave those options out" in r.output


def test_degenerate_noise_falls_back_to_the_floor_and_says_so(tmp_path, tokenizer):
    proto = get_protocol("json", lenient=True)
    always_wrong = ScriptedPolicy(
        lambda m: proto.render_call(ToolCall(name="submit", arguments={"answer": "wrong"})), tokenizer=tokenizer
    )
    cfg = config(iterations=1, candidates=1, rollouts=2, min_threshold=0.2)
    dev, test = dev_and_test(cfg.dev_tasks, cfg.test_tasks)
    said: list[str] = []
    Evolution(tmp_path / "evo", cfg, SEED, dev, test, always_wrong, RulesProposer(), log=said.append).run()
    noise = json.loads((tmp_path / "evo" / "noise.json").read_text())
    # --min-threshold above every other floor is the threshold
    assert noise["sd_task_difference"] == 0 and noise["unseen_rate_floor"] < 0.2 and noise["threshold"] == 0.2
    assert any(s.startswith("warning: the two seed runs agree on every dev task") for s in said)
    (line,) = log_lines(tmp_path / "evo")
    assert line["delta"] == 0 and not line["accepted"]  # nothing changes an always-wrong agent


def test_format_demonstration_replays_a_solved_train_task_with_real_results():
    from harnessrl.evolve.proposers import ProposalContext, RulesProposer, worked_example
    from harnessrl.tasks import get_suite

    suite = get_suite("workspace")
    train = suite.tasks("train", 8)
    example = worked_example(train)
    task = next(t for t in train if t.instruction == example["instruction"])
    assert task.split == "train" and 2 <= len(example["calls"]) <= 4
    assert [c["name"] for c in example["calls"]] == [c["name"] for c in task.solution]
    assert example["calls"][-1]["name"] == "submit"
    looked = [c for c in example["calls"][:-1] if c["result"]]
    assert looked and not any(c["result"].startswith("error:") for c in looked)  # real tool output

    spec = load_harness("react")
    ctx = ProposalContext(
        iteration=1,
        incumbent=spec,
        triage={"counts": {"malformed_call": 3}, "episodes": []},
        failures=[],
        history=[],
        tools=[t.schema for t in task.tools],
        n=1,
        worked_example=example,
    )
    (proposal,) = RulesProposer().propose(ctx)
    assert proposal.edit == "format-demonstration"
    demos = proposal.spec.rules.demonstrations
    assert len(demos) == len(spec.rules.demonstrations) + 1 and demos[-1].instruction == task.instruction
    # an example must not come from the tasks the loop decides or reports on
    with pytest.raises(EvolveError, match="train split"):
        Evolution(
            Path("/nonexistent"),
            EvolveConfig(suite="workspace", seed_harness="react", model="tiny-random", dev_tasks=2, test_tasks=2),
            spec,
            suite.tasks("dev", 2),
            suite.tasks("test", 2),
            None,
            RulesProposer(),
            example_tasks=suite.tasks("dev", 1),
        )


# -- sampling streams, confirmation, exact resume --------------------------------------------------


class SeededAgent(Policy):
    """An agent whose answers depend on the sampling seed of the call, as a model's samples do.

    Each request draws u = sha256(seed, prompt[, n]) in [0, 1) and submits the right word when
    u < p(system prompt, seed) (default: P_LESSONS with lessons, else P_BASE).
    `counting=False`: u is a function of (seed, prompt), so a new process answers as the old one.
    `counting=True`: n counts the requests with this (seed, prompt) that THIS object has answered,
    like a backend that seeds each call from a counter its process starts at 0.
    `kill_after`: a KeyboardInterrupt (a killed process) on the first call after that many requests.
    """

    def __init__(self, tokenizer, p=None, counting: bool = False, kill_after: int | None = None):
        self.p = p or (lambda system, seed: P_LESSONS if LESSONS in system else P_BASE)
        self.counting, self.kill_after = counting, kill_after
        self.seen: dict[tuple[int, str], int] = {}
        self.served, self.seeds = 0, []
        self.seed = 0
        self.proto = get_protocol("json", lenient=True)
        self.script = ScriptedPolicy(self.reply, tokenizer=tokenizer, name="seeded")
        self.name = "seeded"
        self.policy = self  # as SpecDependentAgent: what the loop is given

    def complete(self, requests, sampling=None):
        if self.kill_after is not None and self.served >= self.kill_after:
            self.kill_after = None
            raise KeyboardInterrupt
        self.served += len(requests)
        self.seed = sampling.seed
        self.seeds.append(sampling.seed)
        return self.script.complete(requests, sampling)

    def reply(self, messages: list[Message]) -> str:
        prompt = "\n".join(m.content for m in messages)
        n = self.seen.get((self.seed, prompt), 0)
        self.seen[(self.seed, prompt)] = n + 1
        key = f"{self.seed}|{prompt}|{n if self.counting else ''}"
        u = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
        word = next(
            m.content.split("'")[1] for m in messages if m.role == "user" and m.content.startswith("Submit the word")
        )
        answer = word if u < self.p(messages[0].content, self.seed) else "wrong"
        return self.proto.render_call(ToolCall(name="submit", arguments={"answer": answer}))


def _seeds_by_label(folder: Path) -> dict[str, int]:
    noise = json.loads((folder / "noise.json").read_text())
    seeds = {r["label"]: r["seed"] for r in noise["runs"]}
    for ln in log_lines(folder):
        confirmation = ln["confirmation"] or {}
        for rec in (ln["dev"], ln["incumbent_dev"], confirmation.get("dev"), confirmation.get("incumbent_dev")):
            if rec:
                seeds[rec["label"]] = rec["seed"]
    return seeds


def test_each_measurement_samples_from_the_stream_its_label_names(tmp_path, tokenizer):
    folder = tmp_path / "evo"
    evolution(folder, SpecDependentAgent(tokenizer), iterations=2, rollouts=4, seed=7).run()
    seeds = _seeds_by_label(folder)
    # two looks at the seed harness: two streams
    assert seeds["noise.a"] != seeds["noise.b"]
    assert seeds["noise.a"] == stream_seed(7, "noise.a") and seeds["noise.b"] == stream_seed(7, "noise.b")
    # the arms of one iteration share a stream (paired); iterations and confirmations get their own
    for it in (1, 2):
        arms = {seeds[label] for label in seeds if label.startswith(f"i{it:02d}.") and not label.endswith(".confirm")}
        assert arms == {stream_seed(7, f"i{it:02d}")}
    assert seeds["i01.incumbent.confirm"] == seeds["i01.c1.confirm"] == stream_seed(7, "i01.confirm")
    assert len({stream_seed(7, s) for s in ("noise.a", "noise.b", "i01", "i02", "i01.confirm", "test")}) == 6
    assert stream_seed(7, "i01") != stream_seed(8, "i01")
    assert 0 <= stream_seed(7, "test") < 2**31


def test_a_kill_between_the_noise_runs_does_not_replay_noise_a_as_noise_b(tmp_path, tokenizer):
    # a backend whose samples come from (seed, a counter of its process): killed right after noise.a
    # (12 tasks x 4 rollouts), a fresh process would replay noise.a's samples if noise.b had its seed
    folder = tmp_path / "evo"
    with pytest.raises(KeyboardInterrupt):
        evolution(folder, SeededAgent(tokenizer, counting=True, kill_after=12 * 4), iterations=1, rollouts=4).run()
    with RunStore(folder) as store:
        # all of noise.a; of noise.b at most what finished while the interrupted run wound down
        # (the runner lets the episodes in flight end, and keeps them)
        stored = {h: len(list(store.trajectories(h, with_tokens=False))) for h in store.harnesses()}
        assert stored.get("noise.a") == 12 * 4 and stored.get("noise.b", 0) < 12 * 4, stored
    evolution(folder, SeededAgent(tokenizer, counting=True), iterations=1, rollouts=4).run()
    noise = json.loads((folder / "noise.json").read_text())
    assert noise["sd_task_difference"] > 0 and noise["sd_paired_difference_between_runs"] > 0  # not a replay
    assert noise["threshold"] > 2 * noise["score_resolution"]
    a, b = noise["runs"]
    assert a["seed"] != b["seed"]


def test_a_candidate_that_was_lucky_once_is_not_confirmed(tmp_path, tokenizer):
    # the candidate is better only under iteration 1's sampling stream: a lucky draw, in truth no gain
    lucky_seed = stream_seed(0, "i01")

    def p(system, seed):
        return 1.0 if "LUCKY" in system and seed == lucky_seed else P_BASE

    lucky = apply_changes(SEED, {"capabilities.experiences": ["LUCKY"]})
    said: list[str] = []
    cfg = config(iterations=1, candidates=1, rollouts=4)
    dev, test = dev_and_test(cfg.dev_tasks, cfg.test_tasks)
    evo = Evolution(
        tmp_path / "evo",
        cfg,
        SEED,
        dev,
        test,
        SeededAgent(tokenizer, p=p, counting=True),
        FixedProposer([Proposal("lucky", "content", "x", lucky)]),
        log=said.append,
    )
    final = evo.run()
    (line,) = log_lines(tmp_path / "evo")
    assert line["beats_threshold"] and line["delta"] > 0.4  # screening alone would have accepted it
    conf = line["confirmation"]
    assert conf["dev"]["label"] == "i01.c1.confirm" and conf["incumbent_dev"]["label"] == "i01.incumbent.confirm"
    assert not conf["beats_threshold"] and conf["delta"] <= line["threshold"]
    assert not line["accepted"] and final.best == "seed" and final.accepted_edits == []
    assert final.unconfirmed_candidates == 1
    assert json.loads((tmp_path / "evo" / "state.json").read_text())["unconfirmed_candidates"] == 1
    assert any("not confirmed" in s for s in said)


def test_a_resumed_loop_decides_exactly_as_an_uninterrupted_one(tmp_path, tokenizer):
    # answers are a function of (seed, prompt): a resumed process samples what the killed one would have
    whole = tmp_path / "whole"
    evolution(whole, SeededAgent(tokenizer), iterations=2, rollouts=4).run()
    # noise 2 x 48, i01.incumbent 48, i01.c1 48, i01.c2 48, i01.incumbent.confirm 48: request 310 is in i01.c1.confirm
    cut = tmp_path / "cut"
    killed = SeededAgent(tokenizer, kill_after=310)
    with pytest.raises(KeyboardInterrupt):
        evolution(cut, killed, iterations=2, rollouts=4).run()
    with RunStore(cut) as store:
        assert "i01.c1.confirm" in store.harnesses() and "i01.c2" in store.harnesses()
        stored_at_kill = store.count()
    again = SeededAgent(tokenizer)
    evolution(cut, again, iterations=2, rollouts=4).run()
    with RunStore(cut) as store:
        assert again.served == store.count() - stored_at_kill  # nothing finished before the kill ran again
    assert log_lines(cut) == log_lines(whole)  # every delta, confirmation, verdict and seed
    assert _seeds_by_label(cut) == _seeds_by_label(whole)
    for name in ("noise.json", "best_harness.yaml"):
        assert (cut / name).read_text() == (whole / name).read_text()
    final_cut, final_whole = (json.loads((f / "final.json").read_text()) for f in (cut, whole))
    final_cut.pop("wall_time_s"), final_whole.pop("wall_time_s")
    assert final_cut == final_whole and final_whole["accepted_edits"]


def test_a_degenerate_noise_estimate_never_means_a_zero_threshold(tmp_path, tokenizer):
    proto = get_protocol("json", lenient=True)
    wrong = proto.render_call(ToolCall(name="submit", arguments={"answer": "wrong"}))
    always_wrong = ScriptedPolicy(lambda m: wrong, tokenizer=tokenizer)
    cfg = config(iterations=1, candidates=1, rollouts=2)  # --min-threshold 0 (the default)
    dev, test = dev_and_test(cfg.dev_tasks, cfg.test_tasks)
    said: list[str] = []
    Evolution(tmp_path / "evo", cfg, SEED, dev, test, always_wrong, RulesProposer(), log=said.append).run()
    noise = json.loads((tmp_path / "evo" / "noise.json").read_text())
    assert noise["degenerate"] and noise["sd_paired_difference"] == 0
    # 0 of 48 episodes passed: a pass rate up to 3/48 could hide there, and the threshold is the
    # noise such a rate makes (2 SD of a paired difference of two 24-episode means), far above
    # one episode's worth of score
    p = 3 / 48
    assert noise["threshold"] == pytest.approx(2 * (2 * p * (1 - p) / 24) ** 0.5) == noise["unseen_rate_floor"]
    assert noise["threshold"] > 3 * noise["score_resolution"]
    assert any("every one of the 48 seed episodes scored 0" in s for s in said)


def test_useless_edits_are_almost_never_accepted_over_a_whole_search():
    from harnessrl.evolve.simulate import acceptance_rate

    shape = {"dev_tasks": 24, "rollouts": 4, "iterations": 20, "candidates": 2, "runs": 1000}
    # the loop's rule: screening + confirmation, noise = max(between runs, within tasks), floor 1/(T R)
    assert acceptance_rate("loop", **shape) <= 0.05
    # one stage at 2 SD accepts a useless edit in most searches of 40 candidates
    assert acceptance_rate("single", **shape) >= 0.3
    # and a real gain still gets through
    assert acceptance_rate("loop", **(shape | {"runs": 200}), effect=0.25) >= 0.6


def test_the_simulation_command_prints_every_rule(capsys):
    from harnessrl.evolve.simulate import RULES, main

    main(["--dev-tasks", "6", "--rollouts", "2", "--iterations", "2", "--runs", "5"])
    out = capsys.readouterr().out
    assert "6 dev tasks x 2 rollouts, 2 iterations x 2 candidates, 5 searches per rule" in out
    assert all(f"| {name} | " in out for name in RULES)
