"""Supervised examples from stored episodes, re-rendered into the harness the model will run in.

Read top to bottom:

    select_episodes(runs, min_score)     passing (or score >= min_score) episodes of run folders;
                                         infrastructure errors skipped; one suite only
    source_actions(trajectory)           what the episode DID: its executed tool calls with their
                                         recorded results (refused calls, malformed or empty
                                         replies, held-back submits dropped; helper tools
                                         expanded into their own calls; a prose final answer as
                                         a submit call), the reasoning text around each call
    replay(actions, task, target)        a real Episode of the target harness, driven by a
                                         scripted reply per recorded action, in the target's
                                         protocol: the tools run again on a fresh environment
                                         and every prompt is exactly what the target shows
    SFTExample                           one model call of a replay: the prompt (messages and
                                         token ids from the tokenizer's chat template) and the
                                         completion (the reply's tokens and the end-of-turn token)

A replay is dropped, with its reason counted, when the target cannot reproduce the episode: its
step budget or token limits end it before the submission, its stop strings or max_new_tokens
cut a reply, or the replayed episode does not pass the selection any more. A re-executed tool
whose result differs from the recorded one is counted (`result_mismatches`), not dropped: the
example shows what the target's tools answered.

No torch here: `harnessrl train sft --export-jsonl` needs only a tokenizer.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from harnessrl.errors import JobError
from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.spec import HarnessSpec
from harnessrl.types import ActionKind, Message, ModelCall, ToolCall, ToolResult, ToolSchema, Trajectory

if TYPE_CHECKING:
    from harnessrl.models.chat import ToolRole

PLACEBOS = ("none", "shuffle-answers")


class SFTError(JobError):
    """Bad input for supervised fine-tuning (selection, harness, run folders): reported before
    anything is written (the CLI exits 2)."""


# ------------------------------------------------------------------------------------ selection


@dataclass
class SourceEpisode:
    """A selected episode and what its run folder says about the harness that produced it."""

    trajectory: Trajectory
    run: str
    protocol: str | None  # the source harness's protocol format, when the run recorded its spec


@dataclass
class EpisodeSelection:
    """The stored episodes `--from` selected for fine-tuning, and what their runs say about them."""

    episodes: list[SourceEpisode]
    suite: str
    stats: dict[str, Any]
    task_ids: list[str] = field(default_factory=list)  # every task the runs hold an episode of, in order
    harnesses: list[str] = field(default_factory=list)  # every harness the runs hold an episode of
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)  # harness name -> spec the runs recorded


OWN = "own"  # --as-harness own: each episode replayed in the harness it ran in


def run_database_folder(run: str | Path) -> Path:
    """The folder holding a run's run.db: the run folder itself, or its `rollouts/` (a training run)."""
    from harnessrl.store import RunStore

    path = Path(run).expanduser()
    for folder in (path, path / "rollouts"):
        if RunStore.exists(folder):
            return folder
    raise SFTError(f"--from {run}: no run database there (run.db, or rollouts/run.db of a training run)")


def _source_specs(config: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """harness name -> spec dict, from a run's recorded config (eval: `harnesses`, train:
    `harness_specs`)."""
    specs: dict[str, Any] = {}
    for key in ("harnesses", "harness_specs"):
        value = (config or {}).get(key)
        if isinstance(value, dict):
            specs.update({k: v for k, v in value.items() if isinstance(v, dict)})
    return specs


def _source_protocols(config: dict[str, Any] | None) -> dict[str, str]:
    """harness name -> protocol format, from a run's recorded config; a built-in harness's name
    is enough when the run recorded nothing."""
    specs = _source_specs(config)
    out = {}
    for name, spec in specs.items():
        fmt = ((spec or {}).get("protocol") or {}).get("format") if isinstance(spec, dict) else None
        if isinstance(fmt, str):
            out[name] = fmt
    return out


def _builtin_protocol(harness: str) -> str | None:
    from harnessrl.harness.registry import builtin_names, load_harness
    from harnessrl.harness.spec import require_loop_harness

    if harness not in builtin_names():
        return None
    return require_loop_harness(load_harness(harness), "a built-in harness").protocol.format


def select_episodes(
    runs: Sequence[str | Path], min_score: float | None = None, *, allow_empty: bool = False
) -> EpisodeSelection:
    """The episodes to learn from: passing ones (`min_score` None) or those scoring >= min_score,
    infrastructure errors skipped, over every run folder (in the order given). All must be of
    one suite; an empty selection is an error, unless `allow_empty` (sampling will add episodes:
    the runs must still hold some episode, to name the suite and its tasks)."""
    from harnessrl.store import RunStore, StoreError

    if not runs:
        raise SFTError("no --from run folder given")
    episodes: list[SourceEpisode] = []
    suites: dict[str, list[str]] = defaultdict(list)
    infra_suites: set[str] = set()
    task_ids: dict[str, None] = {}  # ordered
    harnesses: set[str] = set()
    recorded: dict[str, dict[str, Any]] = {}
    stats = {"episodes": 0, "infra_errors": 0, "not_selected": 0, "selected": 0}
    for run in runs:
        folder = run_database_folder(run)
        try:
            with RunStore(folder) as store:
                protocols = _source_protocols(store.config)
                for name, spec in _source_specs(store.config).items():
                    recorded.setdefault(name, spec)
                trajectories = list(store.trajectories(with_tokens=False))
        except (StoreError, OSError, ValueError) as e:
            raise SFTError(f"--from {run}: cannot read its run database ({e})") from None
        for traj in trajectories:
            stats["episodes"] += 1
            task_ids.setdefault(traj.task_id)
            harnesses.add(traj.harness)
            if traj.is_infra_error:
                stats["infra_errors"] += 1
                infra_suites.add(traj.suite)
                continue
            if str(run) not in suites[traj.suite]:
                suites[traj.suite].append(str(run))
            grade = traj.grade
            keep = grade is not None and (grade.passed if min_score is None else grade.score >= min_score - 1e-9)
            if not keep:
                stats["not_selected"] += 1
                continue
            protocol = protocols.get(traj.harness) or _builtin_protocol(traj.harness)
            episodes.append(SourceEpisode(traj, str(run), protocol))
    if len(suites) > 1:
        shown = "; ".join(f"{s}: {', '.join(r)}" for s, r in sorted(suites.items()))
        raise SFTError(f"the --from run folders hold episodes of different suites ({shown}); train on one suite")
    if allow_empty:
        names = set(suites) or infra_suites
        if len(names) != 1:
            raise SFTError(
                f"--from {', '.join(map(str, runs))}: "
                + ("no episode there" if not names else f"episodes of different suites ({', '.join(sorted(names))})")
            )
        stats["selected"] = len(episodes)
        return EpisodeSelection(episodes, next(iter(names)), stats, list(task_ids), sorted(harnesses), recorded)
    if not episodes:
        what = "passing" if min_score is None else f"scoring >= {min_score:g}"
        raise SFTError(
            f"no episode to learn from: none of the {stats['episodes']} episodes of {', '.join(map(str, runs))} "
            f"is {what} ({stats['infra_errors']} infrastructure errors)"
            + ("; lower it with --min-score" if min_score is None else "")
        )
    stats["selected"] = len(episodes)
    return EpisodeSelection(episodes, next(iter(suites)), stats, list(task_ids), sorted(harnesses), recorded)


# -------------------------------------------------------------------------------------- actions


@dataclass
class Action:
    """One reply to replay: the tool calls to make (with the results they had in the source
    episode, None where unknown) and the reasoning text written before them."""

    calls: list[ToolCall]
    expected: list[ToolResult | None]
    thought: str = ""


@dataclass
class SourceActions:
    plan: str | None  # the plan a plan-execute source wrote, if any
    actions: list[Action]
    dropped: dict[str, int] = field(default_factory=dict)


def source_actions(source: SourceEpisode, target_tools: set[str]) -> SourceActions:
    """What the episode did, as replies to replay (see the module docstring).

    `target_tools`: the names the target harness offers for this task. A helper tool the target
    does not offer is replaced by the calls it made; a `remember` note the target cannot take is
    dropped (it changed no environment); any other call of a tool the target does not offer is
    an error: the target cannot act it out.
    """
    traj = source.trajectory
    protocol = get_protocol(source.protocol) if source.protocol else None
    plan: str | None = None
    actions: list[Action] = []
    dropped: dict[str, int] = defaultdict(int)
    for step in traj.steps:
        call = step.model_call
        if step.action == ActionKind.plan:
            plan = call.text.strip() or None
            continue
        if step.action == ActionKind.text:  # a prose final answer: the same answer, submitted
            actions.append(Action([ToolCall(name="submit", arguments={"answer": traj.answer or ""})], [None]))
            continue
        if step.action != ActionKind.tool_calls:
            dropped[step.action.value] += 1
            continue
        held_back = any(iv.kind == "submit_checkpoint" for iv in step.interventions)
        calls: list[ToolCall] = []
        expected: list[ToolResult | None] = []
        for i, (tc, result) in enumerate(zip(step.tool_calls, step.tool_results)):
            if result.blocked is not None:
                dropped["refused_calls"] += 1
                continue
            if held_back and tc.name == "submit" and i == len(step.tool_results) - 1:
                dropped["held_back_submits"] += 1
                continue
            if result.inner_calls and tc.name not in target_tools:
                for inner in result.inner_calls:
                    calls.append(_bare(inner.call))
                    expected.append(inner.result)
                dropped["helper_calls_expanded"] += 1
                continue
            if tc.name == "remember" and tc.name not in target_tools:
                dropped["memory_notes"] += 1
                continue
            calls.append(_bare(tc))
            expected.append(result)
        dropped["unexecuted_calls"] += max(0, len(step.tool_calls) - len(step.tool_results))
        if not calls:
            continue
        thought = protocol.parse(call.text).thought if protocol is not None else ""
        actions.append(Action(calls, expected, thought))
    missing = sorted({c.name for a in actions for c in a.calls} - target_tools)
    if missing:
        raise SFTError(
            f"episode {traj.episode_id} ({traj.task_id}, harness {traj.harness}, run {source.run}) calls "
            f"{', '.join(missing)}, which the target harness does not offer for this task "
            f"(it offers: {', '.join(sorted(target_tools))})"
        )
    return SourceActions(plan, actions, {k: v for k, v in dropped.items() if v})


def _bare(call: ToolCall) -> ToolCall:
    return ToolCall(name=call.name, arguments=json.loads(json.dumps(call.arguments)))


def final_answer(actions: list[Action]) -> ToolCall | None:
    """The last submit call of the replies (the answer the episode was graded on)."""
    for action in reversed(actions):
        for call in reversed(action.calls):
            if call.name == "submit":
                return call
    return None


# ------------------------------------------------------------------------------------- examples


@dataclass
class SFTExample:
    """One model call of a replayed episode: learn `completion_ids` after `prompt_ids`."""

    source_episode: str
    task_id: str
    source_harness: str
    harness: str
    step: int
    messages: list[Message]  # the prompt as the target harness builds it
    completion: str  # the reply (text); its tokens end with the end-of-turn token
    prompt_ids: list[int]
    completion_ids: list[int]
    tools: list[ToolSchema] | None = None  # the schemas a native-tools template renders
    source_run: str = ""  # the run folder the episode was read from
    placebo: bool = False  # its final submit carries another task's answer (--placebo)

    def chat_messages(self, tool_role: ToolRole, wrapped_by_template: bool = False) -> list[dict[str, Any]]:
        """The conversation in the chat `messages` format, as the tokenizer's template receives
        it (tool results as `tool_role` turns; see chat.to_template_messages for
        `wrapped_by_template`), ending with this call's reply."""
        from harnessrl.models import chat

        msgs = chat.to_template_messages(self.messages, tool_role, wrapped_by_template)
        return [*msgs, {"role": "assistant", "content": self.completion}]


@dataclass
class Replay:
    source: SourceEpisode
    examples: list[SFTExample] = field(default_factory=list)
    dropped: str | None = None  # why the target could not reproduce the episode (None: kept)
    actions: list[Action] = field(default_factory=list)  # the source's replies (true answers)
    dropped_actions: dict[str, int] = field(default_factory=dict)
    result_mismatches: int = 0
    trajectory: Trajectory | None = None  # the replayed episode


class ChatRenderer:
    """Prompt and completion tokens exactly as a local policy of this tokenizer has them: the
    chat template with the generation header, then the reply's tokens and the end-of-turn token."""

    def __init__(self, tokenizer, tool_role: ToolRole | None = None):
        from harnessrl.models import chat
        from harnessrl.models.embedded import END_OF_TURN

        self.tokenizer = tokenizer
        self.tool_role = tool_role or chat.default_tool_role(tokenizer)
        self.wrapped_by_template = chat.template_wraps_tool_results(tokenizer, self.tool_role)
        eot = tokenizer.convert_tokens_to_ids(END_OF_TURN)
        if not isinstance(eot, int) or eot == tokenizer.unk_token_id:
            eot = tokenizer.eos_token_id
        if eot is None:
            raise SFTError("the tokenizer has neither <|im_end|> nor an end-of-sequence token to end a reply with")
        self.end_of_turn = int(eot)

    def call(self, request, text: str) -> ModelCall:
        from harnessrl.models import chat

        prompt = chat.render_prompt_ids(self.tokenizer, request.messages, self.tool_role, request.tools)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.end_of_turn]
        finish = "stop"
        if len(ids) > request.max_new_tokens:
            ids, finish = ids[: request.max_new_tokens], "length"
        return chat.finish_call(self.tokenizer, request, prompt, ids, [0.0] * len(ids), finish)


def render_action(protocol, action: Action) -> str:
    """One reply in the target's protocol: the reasoning first, then every call."""
    parts = [protocol.render_call(c, thought=action.thought if i == 0 else "") for i, c in enumerate(action.calls)]
    return "\n".join(parts)


def _same_result(expected: ToolResult | None, got: ToolResult) -> bool:
    if expected is None:
        return True
    return (expected.full_output or expected.output) == (got.full_output or got.output) and expected.ok == got.ok


def replay(
    source: SourceEpisode,
    task,
    spec: HarnessSpec,
    renderer: ChatRenderer,
    min_score: float | None = None,
    answer: dict[str, Any] | None = None,
) -> Replay:
    """Act the source episode out in the target harness (see the module docstring).

    `answer`: arguments that replace the final submit's (the placebo); the replay's grade is then
    not checked. Raises SFTError when the episode calls a tool the target does not offer.
    """
    from harnessrl.harness.loops import Episode, InfraError

    traj = source.trajectory
    try:
        episode = Episode(task, spec, traj.attempt)
    except InfraError as e:
        return Replay(source, dropped=f"the environment could not be set up again: {e}")
    closed = False
    try:
        found = source_actions(source, {t.name for t in episode.tools})
        out = Replay(source, actions=found.actions, dropped_actions=found.dropped)
        actions = copy.deepcopy(found.actions)
        if answer is not None:
            last = final_answer(actions)
            if last is not None:
                last.arguments = dict(answer)
        queue = list(actions)
        protocol = episode.protocol
        resubmit: Action | None = None
        while not episode.done:
            request = episode.request()
            trained = True
            action: Action | None = None
            if episode.needs_plan:
                if found.plan is not None:
                    text = found.plan
                else:  # a source without a plan: the plan lists the recorded calls, shown but not learned
                    text = "\n".join(
                        f"{i}. {c.name}({json.dumps(c.arguments, ensure_ascii=False)})"
                        for i, c in enumerate((c for a in actions for c in a.calls), 1)
                    )
                    trained = False
            elif resubmit is not None:
                action, resubmit = resubmit, None
                text = render_action(protocol, action)
            elif queue:
                action = queue.pop(0)
                text = render_action(protocol, action)
            else:
                return _drop(out, f"the recorded actions ran out before the episode ended in {spec.name}")
            call = renderer.call(request, text)
            if call.finish_reason == "length":
                return _drop(out, f"a reply is longer than {spec.name}'s max_new_tokens")
            if call.text != text:
                return _drop(out, f"{spec.name}'s stop strings cut a reply")
            episode.consume(call)
            step = episode.steps[-1]
            if action is not None:
                if [(c.name, c.arguments) for c in step.tool_calls] != [(c.name, c.arguments) for c in action.calls]:
                    return _drop(out, f"{spec.name}'s protocol does not read a reply back as its calls")
                for expected, got in zip(action.expected, step.tool_results):
                    out.result_mismatches += not _same_result(expected, got)
                if any(iv.kind == "submit_checkpoint" for iv in step.interventions):
                    resubmit = Action([action.calls[-1]], [None])  # held back: submit it again
            if trained:
                out.examples.append(
                    SFTExample(
                        source_episode=traj.episode_id,
                        task_id=traj.task_id,
                        source_harness=traj.harness,
                        harness=spec.name,
                        step=step.index,
                        messages=list(request.messages),
                        completion=text,
                        prompt_ids=list(call.prompt_ids),
                        completion_ids=list(call.completion_ids),
                        tools=list(request.tools) if request.tools and spec.protocol.native_tools else None,
                        source_run=source.run,
                        placebo=answer is not None,
                    )
                )
        closed = True
        out.trajectory = result = episode.finish()
        grade = result.grade
        if result.termination is None or result.termination.value != "submitted":
            why = result.termination_detail or (result.termination.value if result.termination else "no reason")
            return _drop(out, f"the episode ended in {spec.name} before submitting ({why})")
        if answer is None and (
            grade is None or not (grade.passed if min_score is None else grade.score >= min_score - 1e-9)
        ):
            return _drop(out, f"replayed in {spec.name}, the episode no longer passes the selection")
        return out
    except InfraError as e:
        return Replay(source, dropped=f"a tool crashed in the replay: {e}")
    finally:
        if not closed:
            episode.env.close()


def _drop(replay: Replay, reason: str) -> Replay:
    replay.dropped, replay.examples = reason, []
    return replay


# ------------------------------------------------------------------------------------- the set


@dataclass
class ExampleSet:
    examples: list[SFTExample]
    suite: str
    harness: str
    stats: dict[str, Any]

    def fingerprint(self) -> str:
        """A hash of every example's tokens: a resumed run must train on exactly the same data."""
        h = hashlib.sha256()
        for ex in self.examples:
            h.update(json.dumps([ex.prompt_ids, ex.completion_ids]).encode())
        return h.hexdigest()[:16]


def shuffled_answers(replays: list[Replay], seed: int) -> dict[str, dict[str, Any]]:
    """source episode id -> the final submit arguments of an episode of ANOTHER task (seeded).

    The tasks are put in a seeded random order and each takes the answers of the next task in
    that cycle (an episode picks among them by its position), so no episode keeps its task's
    answer. Needs episodes of at least two tasks."""
    by_task: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for r in replays:
        last = final_answer(r.actions)
        by_task[r.source.trajectory.task_id].append((r.source.trajectory.episode_id, last.arguments if last else {}))
    tasks = sorted(by_task)
    if len(tasks) < 2:
        raise SFTError("--placebo shuffle-answers needs episodes of at least two tasks to swap answers between")
    random.Random(f"harnessrl-sft-placebo:{seed}").shuffle(tasks)
    out = {}
    for i, task in enumerate(tasks):
        donors = by_task[tasks[(i + 1) % len(tasks)]]
        for j, (episode_id, _) in enumerate(by_task[task]):
            out[episode_id] = dict(donors[j % len(donors)][1])
    return out


def own_specs(selection: EpisodeSelection) -> dict[str, HarnessSpec]:
    """--as-harness own: every selected episode's own harness, as its run recorded it (a built-in
    harness by name when the run recorded no spec). SFTError for one that cannot be loaded."""
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import SpecError, parse_spec, require_loop_harness

    out: dict[str, HarnessSpec] = {}
    for name in sorted({e.trajectory.harness for e in selection.episodes}):
        try:
            recorded = selection.specs.get(name)
            spec = parse_spec(recorded, name) if recorded is not None else load_harness(name)
            out[name] = require_loop_harness(spec, "re-rendering its conversations")
        except SpecError as e:
            raise SFTError(f"--as-harness own: the episodes' harness {name!r} cannot be loaded ({e})") from None
    return out


def build_examples_own(
    selection: EpisodeSelection,
    specs: dict[str, HarnessSpec],
    renderer: ChatRenderer,
    **options: Any,
) -> ExampleSet:
    """--as-harness own: each harness's episodes replayed in that harness (`build_examples` per
    harness), in one example set; the stats are kept per harness."""
    sets = {}
    for name, spec in specs.items():
        part = EpisodeSelection([e for e in selection.episodes if e.trajectory.harness == name], selection.suite, {})
        sets[name] = build_examples(part, spec, renderer, **options)
    stats: dict[str, Any] = {
        **selection.stats,
        "replayed": sum(x.stats["replayed"] for x in sets.values()),
        # the same keys as one harness's stats (readers such as the CLI's summary use them)
        "dropped": dict(sum((Counter(x.stats["dropped"]) for x in sets.values()), Counter())),
        "examples": sum(x.stats["examples"] for x in sets.values()),
        "by_harness": {name: x.stats for name, x in sets.items()},
    }
    return ExampleSet([ex for x in sets.values() for ex in x.examples], selection.suite, OWN, stats)


def build_examples(
    selection: EpisodeSelection,
    spec: HarnessSpec,
    renderer: ChatRenderer,
    *,
    min_score: float | None = None,
    placebo: str = "none",
    seed: int = 0,
    suite=None,
) -> ExampleSet:
    """Every selected episode replayed in `spec`; the kept replays' model calls as examples.

    placebo "shuffle-answers": the kept episodes replayed again with their final submit's
    arguments swapped across tasks (`shuffled_answers`); every other reply is the same.
    Raises SFTError when no episode can be replayed, or the placebo would change nothing.
    """
    from harnessrl.tasks import get_suite

    if placebo not in PLACEBOS:
        raise SFTError(f"--placebo must be {' or '.join(PLACEBOS)}, got {placebo!r}")
    try:
        suite = suite if suite is not None else get_suite(selection.suite)
    except ValueError as e:
        raise SFTError(f"the episodes' suite cannot be loaded: {e}") from None

    def task_of(source: SourceEpisode):
        try:
            return suite.task(source.trajectory.task_id)
        except (ValueError, IndexError) as e:
            raise SFTError(f"episode {source.trajectory.episode_id}: its task cannot be rebuilt ({e})") from None

    replays = [replay(s, task_of(s), spec, renderer, min_score) for s in selection.episodes]
    kept = [r for r in replays if r.dropped is None]
    reasons = Counter(r.dropped for r in replays if r.dropped is not None)
    if not kept:
        shown = "; ".join(f"{n} x {why}" for why, n in reasons.most_common())
        raise SFTError(f"none of the {len(replays)} selected episodes can be replayed in {spec.name}: {shown}")
    stats: dict[str, Any] = {
        **selection.stats,
        "replayed": len(kept),
        "dropped": dict(reasons),
        "result_mismatches": sum(r.result_mismatches for r in kept),
        "actions_dropped": dict(sum((Counter(r.dropped_actions) for r in kept), Counter())),
    }
    if placebo == "shuffle-answers":
        answers = shuffled_answers(kept, seed)
        changed = sum(answers[r.source.trajectory.episode_id] != _answer_args(r) for r in kept)
        if not changed:
            raise SFTError(
                "--placebo shuffle-answers changes nothing: the final submit calls of these episodes carry the same "
                "arguments (or none)"
            )
        placebo_replays = [
            replay(r.source, task_of(r.source), spec, renderer, answer=answers[r.source.trajectory.episode_id])
            for r in kept
        ]
        stats["placebo_changed_answers"] = changed
        stats["placebo_dropped"] = sum(r.dropped is not None for r in placebo_replays)
        kept = [r for r in placebo_replays if r.dropped is None]
    examples = [ex for r in kept for ex in r.examples]
    stats["examples"] = len(examples)
    return ExampleSet(examples, selection.suite, spec.name, stats)


def _answer_args(r: Replay) -> dict[str, Any]:
    last = final_answer(r.actions)
    return last.arguments if last else {}


def example_row(
    example: SFTExample, tool_role: ToolRole, suite: str, wrapped_by_template: bool = False
) -> dict[str, Any]:
    """One example as a dataset row: the `messages` (what the JSONL export writes) and where it
    comes from."""
    return {
        "messages": example.chat_messages(tool_role, wrapped_by_template),
        "task_id": example.task_id,
        "suite": suite,
        "harness": example.harness,
        "source_harness": example.source_harness,
        "source_run": example.source_run,
        "source_episode": example.source_episode,
        "step": example.step,
        "placebo": example.placebo,
    }


HF_INSTALL = "pip install 'harnessrl[datasets]'"


def check_hf_export(path: str | os.PathLike[str]) -> Path:
    """Refuse, before anything is written, an --export-hf that cannot be done: no `datasets`
    package, or a folder that holds something other than a saved dataset (it is replaced)."""
    import importlib.util

    if importlib.util.find_spec("datasets") is None:
        raise SFTError(f"--export-hf needs the Hugging Face datasets package: {HF_INSTALL}")
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise SFTError(f"--export-hf {path}: a file is there, not a folder")
    if path.is_dir() and any(path.iterdir()) and not (path / "dataset_info.json").is_file():
        raise SFTError(f"--export-hf {path}: the folder holds files other than a saved dataset; name a new folder")
    return path


def write_hf_dataset(
    path: str | os.PathLike[str],
    examples: list[SFTExample],
    tool_role: ToolRole,
    suite: str,
    wrapped_by_template: bool = False,
) -> Path:
    """The examples as a Hugging Face dataset saved to disk (`datasets.load_from_disk(path)`),
    written in a temporary folder beside `path`, then renamed into place (a dataset saved there
    before is replaced)."""
    import os
    import shutil
    import tempfile

    path = check_hf_export(path)
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = path.with_name(f".{path.name}.old")
    bars = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # one small save: its bar would only interleave with ours
    try:
        rows = [example_row(ex, tool_role, suite, wrapped_by_template) for ex in examples]
        datasets.Dataset.from_list(rows).save_to_disk(str(tmp / "data"))
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            os.rename(path, old)
        os.rename(tmp / "data", path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if bars:
            datasets.enable_progress_bars()
    return path


def write_jsonl(
    path: str | os.PathLike[str], examples: list[SFTExample], tool_role: ToolRole, wrapped_by_template: bool = False
) -> Path:
    """The examples in the chat `messages` format, one model call per line, written atomically."""
    import os

    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for ex in examples:
            messages = ex.chat_messages(tool_role, wrapped_by_template)
            fh.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
