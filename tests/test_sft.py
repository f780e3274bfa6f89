"""Supervised fine-tuning on stored episodes: selection, the replay into a target harness, the
loss mask on the real chat template, training (loss, adapter, exact resume), the placebo, the
JSONL export and every refused input. Source episodes come from the oracle (each task's known
solution) run through the real runner into a run database on toolcalc."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import typer
from helpers import oracle_policy, replies_policy
from safetensors.torch import load_file
from typer.testing import CliRunner

from harnessrl.cli.train import train_app
from harnessrl.harness.loops import Episode, episode_id
from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.registry import load_harness
from harnessrl.kernel import enter
from harnessrl.models.base import GenerationRequest, SamplingParams, request_seed
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Runner, make_jobs
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite
from harnessrl.train.config import SFTConfig
from harnessrl.train.grpo import pad_units
from harnessrl.train.sft import run_sft, units_of
from harnessrl.train.sft_data import (
    ChatRenderer,
    SFTError,
    SourceEpisode,
    build_examples,
    select_episodes,
    source_actions,
)
from harnessrl.train.sft_sample import check_sampling_harness
from harnessrl.types import (
    ActionKind,
    InnerCall,
    Intervention,
    ModelCall,
    Step,
    ToolCall,
    ToolResult,
    Trajectory,
)

N_TASKS = 5


def _store(folder: Path, trajectories) -> Path:
    with RunStore(folder) as store:
        for t in trajectories:
            store.add(t)
    return folder


def _run(policy, tasks, spec):
    return Runner(policy, SamplingParams(temperature=0.0), max_retries=0, progress=False).run(
        make_jobs(tasks, [spec], 1)
    )


@pytest.fixture(scope="module")
def toolcalc_tasks():
    return get_suite("toolcalc").tasks("train", N_TASKS)


@pytest.fixture(scope="module")
def source_run(tmp_path_factory, toolcalc_tasks, tokenizer) -> Path:
    """The oracle's passing json-tools episodes of N_TASKS toolcalc tasks."""
    spec = load_harness("json-tools")
    trajectories = _run(oracle_policy(toolcalc_tasks, spec, tokenizer), toolcalc_tasks, spec)
    assert all(t.grade.passed for t in trajectories)
    return _store(tmp_path_factory.mktemp("src") / "run", trajectories)


@pytest.fixture(scope="module")
def renderer(tokenizer):
    return ChatRenderer(tokenizer)


def sft_run(config: SFTConfig, out, *, resume=False, progress=False, **job):
    """`run_sft` over the job context the kernel makes of `config` (the other options: run_sft's)."""
    return run_sft(enter("train sft", config, out, resume=resume, error=SFTError, progress=progress), **job)


def _config(source_run, **kw) -> SFTConfig:
    base = dict(from_runs=[str(source_run)], as_harness="react", model="tiny-random", epochs=1, batch_size=4)
    return SFTConfig(**{**base, **kw})


# ------------------------------------------------------------------------------------ the data


def test_the_mask_covers_exactly_the_reply_and_its_end_of_turn_on_the_chat_template(source_run, renderer, tokenizer):
    examples = build_examples(select_episodes([source_run]), load_harness("react"), renderer).examples
    assert examples
    units = units_of(type("S", (), {"examples": examples})())
    batch = pad_units(units, pad_id=tokenizer.pad_token_id or 0)
    for row, ex in enumerate(examples):
        # the whole conversation rendered by the template: prompt ids, then exactly the completion ids
        full = tokenizer.apply_chat_template(ex.chat_messages(renderer.tool_role), tokenize=False)
        ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        p, c = len(ex.prompt_ids), len(ex.completion_ids)
        assert ids[: p + c] == ex.prompt_ids + ex.completion_ids
        assert tokenizer.decode(ids[p + c :]).strip() == ""  # only the template's newline after <|im_end|>
        assert tokenizer.decode(ex.completion_ids) == ex.completion + "<|im_end|>"
        mask = batch["completion_mask"][row]
        assert mask.nonzero().flatten().tolist() == list(range(p, p + c))
        assert tokenizer.decode(batch["input_ids"][row][mask.bool()].tolist()) == ex.completion + "<|im_end|>"


def test_json_episodes_replayed_as_react_show_react_prompts_with_the_same_actions(source_run, renderer, toolcalc_tasks):
    selection = select_episodes([source_run])
    target = load_harness("react")
    found = build_examples(selection, target, renderer)
    assert found.stats["replayed"] == N_TASKS and found.stats["dropped"] == {}
    assert found.stats["result_mismatches"] == 0
    source_calls = {e.trajectory.task_id: [s.tool_calls for s in e.trajectory.steps] for e in selection.episodes}
    assert len(found.examples) == sum(len(v) for v in source_calls.values())  # one example per model call
    react = get_protocol("react")
    by_id = {t.id: t for t in toolcalc_tasks}
    for ex in found.examples:
        episode = Episode(by_id[ex.task_id], target, 0)
        try:
            intro = episode.messages()  # the target's system prompt, its demonstrations, the task
        finally:
            episode.env.close()
        assert ex.messages[: len(intro)] == intro
        assert "Action Input:" in intro[0].content  # the tools shown in react form
        assert ex.completion.startswith("Action: ") and '"tool"' not in ex.completion
        assert all('{"tool"' not in m.content for m in ex.messages)
        assert all(m.content.startswith("Observation: ") for m in ex.messages if m.role == "tool")
        turn = sum(m.role == "assistant" for m in ex.messages[len(intro) :])
        calls = react.parse(ex.completion).calls
        expected = source_calls[ex.task_id][turn]
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in expected]


def test_plan_execute_target_gets_a_plan_turn_it_does_not_learn(source_run, renderer):
    found = build_examples(select_episodes([source_run]), load_harness("plan-execute"), renderer)
    assert found.stats["dropped"] == {}
    plain = build_examples(select_episodes([source_run]), load_harness("json-tools"), renderer)
    assert len(found.examples) == len(plain.examples)  # the derived plan is context, not an example
    assert all(any(m.content.startswith("1. ") for m in ex.messages) for ex in found.examples)


def _step(index, calls, results, action=ActionKind.tool_calls, text="", interventions=()):
    return Step(
        index=index,
        model_call=ModelCall(prompt_ids=[], completion_ids=[], logprobs=[], text=text),
        action=action,
        tool_calls=calls,
        tool_results=results,
        interventions=list(interventions),
    )


def test_source_actions_keep_what_happened_and_drop_what_did_not():
    add = ToolCall(name="add", arguments={"a": 1, "b": 2})
    steps = [
        _step(0, [], [], ActionKind.malformed, text="{oops"),
        _step(
            1,
            [ToolCall(name="add", arguments={"a": "x"})],
            [ToolResult(name="add", output="bad", ok=False, blocked="invalid_arguments")],
        ),
        _step(
            2,
            [ToolCall(name="sum3", arguments={"x": "1"})],
            [
                ToolResult(
                    name="sum3",
                    output="3",
                    inner_calls=[InnerCall(call=add, result=ToolResult(name="add", output="3"))],
                )
            ],
            text='{"tool": "sum3", "arguments": {"x": "1"}}',
        ),
        _step(3, [ToolCall(name="remember", arguments={"note": "n"})], [ToolResult(name="remember", output="Saved.")]),
        _step(
            4,
            [ToolCall(name="submit", arguments={"answer": "3"})],
            [ToolResult(name="submit", output="Check.")],
            interventions=[Intervention(kind="submit_checkpoint", message="Check.")],
        ),
        _step(5, [], [], ActionKind.text, text="It is 3."),
    ]
    traj = Trajectory(
        episode_id="e",
        task_id="toolcalc/train/0",
        suite="toolcalc",
        family="f",
        split="train",
        harness="h",
        attempt=0,
        instruction="i",
        steps=steps,
        answer="It is 3.",
    )
    found = source_actions(SourceEpisode(traj, "run", "json"), {"add", "submit"})
    assert [[(c.name, c.arguments) for c in a.calls] for a in found.actions] == [
        [("add", {"a": 1, "b": 2})],  # the helper's own call, with its recorded result
        [("submit", {"answer": "It is 3."})],  # a prose final answer, submitted
    ]
    assert found.actions[0].expected[0].output == "3"
    assert found.dropped == {
        "malformed": 1,
        "refused_calls": 1,
        "helper_calls_expanded": 1,
        "memory_notes": 1,
        "held_back_submits": 1,
    }
    with pytest.raises(SFTError, match="calls add, which the target harness does not offer"):
        source_actions(SourceEpisode(traj, "run", "json"), {"submit"})


def test_placebo_shuffles_only_the_submit_answers_across_tasks(source_run, renderer):
    selection = select_episodes([source_run])
    spec = load_harness("json-tools")
    real = build_examples(selection, spec, renderer).examples
    placebo = build_examples(selection, spec, renderer, placebo="shuffle-answers", seed=3).examples
    assert len(real) == len(placebo)
    proto = get_protocol("json")
    answers = {}
    for r, p in zip(real, placebo):
        assert (r.source_episode, r.step, r.messages, r.prompt_ids) == (
            p.source_episode,
            p.step,
            p.messages,
            p.prompt_ids,
        )
        rc, pc = proto.parse(r.completion).calls, proto.parse(p.completion).calls
        if rc[0].name != "submit":
            assert r.completion == p.completion and r.completion_ids == p.completion_ids
            continue
        assert pc[0].name == "submit" and pc[0].arguments != rc[0].arguments
        answers[r.task_id] = (rc[0].arguments["answer"], pc[0].arguments["answer"])
    assert len(answers) == N_TASKS
    # a permutation of the real answers, none kept by its own task
    assert sorted(a for a, _ in answers.values()) == sorted(b for _, b in answers.values())
    again = build_examples(selection, spec, renderer, placebo="shuffle-answers", seed=3).examples
    assert [e.completion for e in again] == [e.completion for e in placebo]  # seeded


# ---------------------------------------------------------------------------------- training


def test_tiny_sft_lowers_the_loss_and_writes_a_loadable_adapter(source_run, tmp_path):
    from harnessrl.models import load_policy

    out = tmp_path / "sft"
    export = tmp_path / "ex.jsonl"
    summary = sft_run(_config(source_run, epochs=6, batch_size=64, lr=1e-2), out, export_jsonl=export, progress=False)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 7))
    assert lines[-1]["loss"] < lines[0]["loss"] - 0.5  # one batch of every example: the same loss, going down
    assert {"loss", "tokens", "lr", "epoch", "grad_norm"} <= set(lines[0])
    meta = json.loads((out / "adapter" / "harnessrl.json").read_text())
    assert meta["base_model"] == "tiny-random" and meta["harness"] == "react"
    assert json.loads((out / "config.json").read_text())["data"]["examples"] == summary.examples

    policy = load_policy(f"hf:{out / 'adapter'}")
    request = GenerationRequest(
        messages=json.loads(export.read_text().splitlines()[0])["messages"][:-1], max_new_tokens=4
    )
    call = policy.complete([request], SamplingParams(temperature=0.0))[0]
    assert call.completion_ids

    # the export: one model call per line, the chat messages whose template gives the prompt ids
    rows = [json.loads(x) for x in export.read_text().splitlines()]
    assert len(rows) == summary.examples
    assert all(set(r) == {"messages"} and r["messages"][-1]["role"] == "assistant" for r in rows)
    assert {m["role"] for r in rows for m in r["messages"]} <= {"system", "user", "assistant"}


def test_resume_equals_the_uninterrupted_run(source_run, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    sft_run(_config(source_run, epochs=2, lr=1e-2), whole, progress=False)
    sft_run(_config(source_run, epochs=1, lr=1e-2), cut, progress=False)
    sft_run(_config(source_run, epochs=2, lr=1e-2), cut, resume=True, progress=False)

    def metrics(folder):
        return [
            {k: v for k, v in json.loads(x).items() if k != "seconds"}
            for x in (folder / "metrics.jsonl").read_text().splitlines()
        ]

    assert metrics(whole) == metrics(cut)
    a = load_file(str(whole / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(cut / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_packed_rows_give_the_same_loss_and_gradients_with_fewer_tokens(source_run, renderer, tokenizer):
    """--pack: the calls of one episode that extend one another share a row; every completion
    token is read at its own position, so the loss and the LoRA gradients equal the unpacked ones."""
    from harnessrl.models import load_policy
    from harnessrl.train import lora
    from harnessrl.train.sft import sft_loss

    examples = build_examples(select_episodes([source_run]), load_harness("react"), renderer).examples
    units = units_of(type("S", (), {"examples": examples})())
    episodes = [u.episode_id for u in units]
    assert len(set(episodes)) < len(units)  # multi-turn: several calls per episode
    policy = load_policy("tiny-random")
    peft_model, trainable, _ = lora.attach(policy, _config(source_run), ValueError)
    pad_id = tokenizer.pad_token_id or 0

    def run(pack: bool):
        for t in trainable:
            t.grad = None
        loss, tokens, padded = sft_loss(peft_model, units, pad_id, 4096, pack)
        return loss, tokens, padded, [t.grad.detach().clone() for t in trainable]

    loss, tokens, padded, grads = run(False)
    loss_p, tokens_p, padded_p, grads_p = run(True)
    assert tokens_p == tokens and loss_p == pytest.approx(loss, rel=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(grads, grads_p))
    assert padded_p < padded  # the shared prefixes are forwarded once


def test_packed_epochs_keep_each_episodes_calls_together_in_a_seeded_episode_order():
    from harnessrl.train.sft import epoch_order

    episodes = ["a", "b", "a", "c", "b", "a"]
    order = epoch_order(6, seed=3, epoch=0, episodes=episodes)
    assert sorted(order) == list(range(6)) and order == epoch_order(6, seed=3, epoch=0, episodes=episodes)
    grouped = [episodes[i] for i in order]
    assert all(grouped.index(e) + grouped.count(e) - 1 == len(grouped) - 1 - grouped[::-1].index(e) for e in "abc")
    assert [i for i in order if episodes[i] == "a"] == [0, 2, 5]  # an episode's calls in their order
    orders = {tuple(epoch_order(6, seed=3, epoch=k, episodes=episodes)) for k in range(8)}
    assert len(orders) > 1  # the episodes are shuffled anew each epoch


def test_a_packed_run_trains_records_pack_and_a_run_without_it_does_not(source_run, tmp_path):
    packed, plain = tmp_path / "packed", tmp_path / "plain"
    sft_run(_config(source_run, epochs=2, lr=1e-2, pack=True), packed, progress=False)
    sft_run(_config(source_run, epochs=2, lr=1e-2), plain, progress=False)
    assert json.loads((packed / "config.json").read_text())["pack"] is True
    assert "pack" not in json.loads((plain / "config.json").read_text())  # as runs were recorded before
    lines = [json.loads(x) for x in (packed / "metrics.jsonl").read_text().splitlines()]
    plain_lines = [json.loads(x) for x in (plain / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == len(plain_lines)
    assert sum(r["tokens"] for r in lines) == sum(r["tokens"] for r in plain_lines)  # every example once an epoch
    assert sum(r["padded_tokens"] for r in lines) < sum(r["padded_tokens"] for r in plain_lines)


# ---------------------------------------------------------------------------------- refusals


def _cli():
    app = typer.Typer()
    app.add_typer(train_app, name="train")

    @app.command()
    def version() -> None:  # a second command, so that `train` stays a sub-command
        pass

    return app


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory, toolcalc_tasks, tokenizer) -> Path:
    spec = load_harness("json-tools")
    wrong = replies_policy(['{"tool": "submit", "arguments": {"answer": "no idea"}}'], tokenizer)
    trajectories = _run(wrong, toolcalc_tasks[:2], spec)
    assert not any(t.grade.passed for t in trajectories)
    return _store(tmp_path_factory.mktemp("fail") / "run", trajectories)


@pytest.fixture(scope="module")
def other_suite_run(tmp_path_factory, tokenizer) -> Path:
    spec = load_harness("json-tools")
    tasks = get_suite("planning").tasks("train", 1)
    trajectories = _run(oracle_policy(tasks, spec, tokenizer), tasks, spec)
    return _store(tmp_path_factory.mktemp("other") / "run", trajectories)


@pytest.fixture(scope="module")
def foreign_tool_run(tmp_path_factory, source_run) -> Path:
    """A passing episode whose first call used a tool (web_search) that no toolcalc task offers."""
    with RunStore(source_run) as store:
        traj = next(store.trajectories())
    traj.steps[0].tool_calls[0].name = "web_search"
    traj.steps[0].tool_results[0].name = "web_search"
    return _store(tmp_path_factory.mktemp("foreign") / "run", [traj])


@pytest.mark.parametrize(
    "case, message",
    [
        ("no-from", "no --from run folder given"),
        ("not-a-run", "no run database there"),
        ("only-failing", "no episode to learn from"),
        ("min-score-too-high", "no episode to learn from"),
        ("mixed-suites", "episodes of different suites"),
        ("foreign-tool", "calls web_search, which the target harness does not offer"),
        ("unknown-harness", "--as-harness: unknown harness 'nope'"),
        ("placebo-one-task", "needs episodes of at least two tasks"),
        ("bad-placebo", "--placebo must be none or shuffle-answers"),
        ("export-only-alone", "--export-only needs --export-jsonl PATH or --export-hf DIR"),
        ("resume-nothing", "holds no fine-tuning run to resume"),
        ("no-datasets", "--export-hf needs the Hugging Face datasets package: pip install 'harnessrl[datasets]'"),
        ("sample-zero", "--sample must be >= 1"),
        ("sample-option-alone", "--sample-harness needs --sample N"),
        ("unknown-sample-harness", "--sample-harness: unknown harness 'nope'"),
        ("sample-without-suite", "--sample without --from needs --sample-suite NAME"),
        ("sample-harness-as-target", "--sample-harness: unknown harness 'nope'"),
        ("sample-without-tasks", "--sample without --from needs --sample-tasks M"),
        ("sample-tasks-with-from", "--sample-tasks chooses the tasks to sample when there is no --from"),
        ("sample-other-suite", "--sample-suite planning: the --from runs hold episodes of suite toolcalc"),
        ("empty-model-path", "model path '' does not exist"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(
    case, message, tmp_path, monkeypatch, source_run, failing_run, other_suite_run, foreign_tool_run
):
    out, export = tmp_path / "o", tmp_path / "ex.jsonl"
    args = {
        "no-from": [],
        "not-a-run": ["--from", str(tmp_path / "nothing")],
        "only-failing": ["--from", str(failing_run)],
        "min-score-too-high": ["--from", str(failing_run), "--min-score", "0.5"],
        "mixed-suites": ["--from", str(source_run), "--from", str(other_suite_run)],
        "foreign-tool": ["--from", str(foreign_tool_run)],
        "unknown-harness": ["--from", str(source_run), "--as-harness", "nope"],
        "placebo-one-task": [
            "--from",
            str(foreign_tool_run),
            "--as-harness",
            "json-tools",
            "--placebo",
            "shuffle-answers",
        ],
        "bad-placebo": ["--from", str(source_run), "--placebo", "swap"],
        "export-only-alone": ["--from", str(source_run), "--export-only"],
        "resume-nothing": ["--from", str(source_run), "--resume"],
        "no-datasets": ["--from", str(source_run), "--export-hf", str(tmp_path / "hf")],
        "sample-zero": ["--from", str(source_run), "--sample", "0"],
        "sample-option-alone": ["--from", str(source_run), "--sample-harness", "react"],
        "unknown-sample-harness": ["--from", str(source_run), "--sample", "2", "--sample-harness", "nope"],
        "sample-without-suite": ["--as-harness", "react", "--sample", "2", "--sample-tasks", "2"],
        "sample-harness-as-target": [
            "--sample",
            "2",
            "--sample-suite",
            "toolcalc",
            "--sample-tasks",
            "2",
            "--sample-harness",
            "nope",
        ],
        "sample-without-tasks": ["--as-harness", "react", "--sample", "2", "--sample-suite", "toolcalc"],
        "sample-tasks-with-from": ["--from", str(failing_run), "--sample", "2", "--sample-tasks", "2"],
        "sample-other-suite": ["--from", str(source_run), "--sample", "2", "--sample-suite", "planning"],
        "empty-model-path": ["--from", str(source_run), "--model", "hf:"],  # the last --model counts
    }[case]
    if case == "no-datasets":
        monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    if case == "placebo-one-task":  # one task only, and its tools all offered: only the placebo is wrong
        args[1] = str(_one_task_run(tmp_path, source_run))
    if case != "export-only-alone":
        args += ["--export-jsonl", str(export)]
    r = CliRunner().invoke(_cli(), ["train", "sft", "--model", "tiny-random", "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()) and "Traceback" not in r.output
    assert not out.exists() and not export.exists() and not (tmp_path / "hf").exists()


def test_the_export_renders_the_prompts_of_a_template_that_wraps_tool_messages(source_run, tokenizer, tmp_path):
    """hermes-tools results under a template that wraps tool messages in <tool_response> itself:
    each is wrapped once in the prompts, and the exported messages render into those prompts."""
    from helpers import TOOL_RESPONSE_TEMPLATE, with_template

    from harnessrl.train.sft_data import write_jsonl

    qwen_like = ChatRenderer(with_template(tokenizer, TOOL_RESPONSE_TEMPLATE))
    assert qwen_like.tool_role == "tool" and qwen_like.wrapped_by_template
    examples = build_examples(select_episodes([source_run]), load_harness("hermes-tools"), qwen_like).examples
    with_results = [ex for ex in examples if any(m.role == "tool" for m in ex.messages)]
    assert with_results
    path = write_jsonl(tmp_path / "x.jsonl", examples, qwen_like.tool_role, qwen_like.wrapped_by_template)
    lines = [json.loads(line)["messages"] for line in path.read_text(encoding="utf-8").splitlines()]
    for ex, messages in zip(examples, lines, strict=True):
        prompt = qwen_like.tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        assert qwen_like.tokenizer(prompt, add_special_tokens=False)["input_ids"] == ex.prompt_ids
        assert "<tool_response>\n<tool_response>" not in prompt
    assert any("<tool_response>" in tokenizer.decode(ex.prompt_ids) for ex in with_results)


def _one_task_run(tmp_path: Path, source_run: Path) -> Path:
    with RunStore(source_run) as store:
        traj = next(store.trajectories())
    return _store(tmp_path / "one", [traj])


def test_a_resume_on_other_episodes_is_refused(source_run, tmp_path):
    import shutil

    with RunStore(source_run) as store:
        trajectories = list(store.trajectories())
    data, out = tmp_path / "data", tmp_path / "o"
    config = _config(data, as_harness="json-tools")
    _store(data, trajectories)
    sft_run(config, out, progress=False)
    shutil.rmtree(data)
    _store(data, trajectories[:3])  # the same --from, other episodes in it
    with pytest.raises(SFTError, match="the examples differ from the ones its checkpoint was trained on"):
        sft_run(config, out, resume=True, progress=False)


def test_episodes_the_target_cannot_reproduce_are_dropped_with_their_reason(source_run, renderer):
    tight = load_harness("json-tools")
    tight = tight.model_copy(update={"rules": tight.rules.model_copy(update={"max_steps": 1})})
    with pytest.raises(
        SFTError,
        match=r"none of the 5 selected episodes can be replayed in json-tools: 5 x the "
        r"episode ended in json-tools before submitting \(1 steps used\)",
    ):
        build_examples(select_episodes([source_run]), tight, renderer)


def test_a_target_that_holds_back_the_submit_gets_it_again(source_run, renderer):
    spec = load_harness("json-tools")
    checkpoint = spec.rules.submit_checkpoint.model_copy(update={"enabled": True})
    held = spec.model_copy(update={"rules": spec.rules.model_copy(update={"submit_checkpoint": checkpoint})})
    plain = build_examples(select_episodes([source_run]), spec, renderer)
    found = build_examples(select_episodes([source_run]), held, renderer)
    assert found.stats["dropped"] == {} and len(found.examples) == len(plain.examples) + N_TASKS
    last_two = [ex for ex in found.examples if "submit" in ex.completion]
    assert len(last_two) == 2 * N_TASKS
    assert any(m.content.endswith(checkpoint.message) for ex in last_two for m in ex.messages)


# ------------------------------------------------------------------------------- the HF dataset


def test_the_hf_dataset_holds_the_jsonl_messages_and_renders_to_the_training_tokens(
    source_run, renderer, tokenizer, tmp_path
):
    import datasets

    out, export, hf = tmp_path / "o", tmp_path / "ex.jsonl", tmp_path / "hf"
    base = ["train", "sft", "--model", "tiny-random", "--from", str(source_run), "--as-harness", "react"]
    r = CliRunner().invoke(
        _cli(), [*base, "--out", str(out), "--export-only", "--export-jsonl", str(export), "--export-hf", str(hf)]
    )
    assert r.exit_code == 0, r.output
    assert f"exported: {hf}" in r.output and not out.exists()
    ds = datasets.load_from_disk(str(hf))
    lines = [json.loads(x) for x in export.read_text().splitlines()]
    assert ds["messages"] == [line["messages"] for line in lines]  # exactly what the JSONL holds
    examples = build_examples(select_episodes([source_run]), load_harness("react"), renderer).examples
    assert len(ds) == len(examples) > N_TASKS
    for row, ex in zip(ds, examples):
        # the chat template on the row's messages gives the example's training tokens
        prompt = tokenizer.apply_chat_template(row["messages"][:-1], tokenize=False, add_generation_prompt=True)
        assert tokenizer(prompt, add_special_tokens=False)["input_ids"] == ex.prompt_ids
        full = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        assert ids[: len(ex.prompt_ids) + len(ex.completion_ids)] == ex.prompt_ids + ex.completion_ids
        assert {k: v for k, v in row.items() if k != "messages"} == {
            "task_id": ex.task_id,
            "suite": "toolcalc",
            "harness": "react",
            "source_harness": "json-tools",
            "source_run": str(source_run),
            "source_episode": ex.source_episode,
            "step": ex.step,
            "placebo": False,
        }

    # the placebo's examples say so; a dataset saved before in the folder is replaced
    r = CliRunner().invoke(_cli(), [*base, "--export-only", "--export-hf", str(hf), "--placebo", "shuffle-answers"])
    assert r.exit_code == 0, r.output
    placebo = datasets.load_from_disk(str(hf))
    assert len(placebo) == len(examples) and set(placebo["placebo"]) == {True}
    assert placebo["messages"] != ds["messages"]


def test_export_hf_refuses_a_folder_holding_other_files(source_run, tmp_path):
    hf = tmp_path / "mine"
    hf.mkdir()
    (hf / "notes.txt").write_text("keep me")
    with pytest.raises(SFTError, match="holds files other than a saved dataset"):
        sft_run(_config(source_run), tmp_path / "o", export_hf=hf, export_only=True, progress=False)
    assert [p.name for p in hf.iterdir()] == ["notes.txt"]


# ------------------------------------------------------------------------- rejection sampling


class AttemptPolicy(ScriptedPolicy):
    """Per (task, attempt): the task's known solution, or a wrong answer submitted at once. The
    runner's per-request seed says which task, attempt and turn a request belongs to."""

    def __init__(self, tasks, spec, tokenizer, passing: set[tuple[int, int]], attempts: int, seed: int = 0):
        self.turns = {
            request_seed(seed, t.id, a, turn): (i, t, a, turn)
            for i, t in enumerate(tasks)
            for a in range(attempts)
            for turn in range(spec.rules.max_steps)
        }
        self.passing, self.spec, self.current = passing, spec, None
        self.proto = get_protocol(spec.protocol.format)
        self.calls = 0
        super().__init__(self.script, tokenizer=tokenizer, name="attempts")

    def _complete_one(self, request):
        self.calls += 1
        self.current = self.turns[request.seed]
        return super()._complete_one(request)

    def script(self, messages):
        i, task, attempt, turn = self.current
        if (i, attempt) not in self.passing:
            return self.proto.render_call(ToolCall(name="submit", arguments={"answer": "no idea"}))
        per_reply = max(1, math.ceil(len(task.solution) / self.spec.rules.max_steps))
        chunk = task.solution[turn * per_reply : (turn + 1) * per_reply]
        return "\n".join(self.proto.render_call(ToolCall(name=c["name"], arguments=c["arguments"])) for c in chunk)


def test_sampling_keeps_each_tasks_best_attempt_and_a_resume_reuses_the_attempts(toolcalc_tasks, tokenizer, tmp_path):
    import datasets

    spec = load_harness("json-tools")
    tasks = toolcalc_tasks[:3]
    # task 0: attempts 1 and 2 pass (keep 1, the first of the best); task 1: none does; task 2: all do
    policy = AttemptPolicy(tasks, spec, tokenizer, {(0, 1), (0, 2), (2, 0), (2, 1), (2, 2)}, attempts=3)
    config = SFTConfig(
        as_harness="json-tools",
        model="tiny-random",
        sample=3,
        sample_suite="toolcalc",
        sample_tasks=3,
        epochs=1,
        batch_size=64,
    )
    out, hf = tmp_path / "sft", tmp_path / "hf"
    summary = sft_run(config, out, export_hf=hf, sample_policy=policy, progress=False)
    assert policy.calls > 0
    data = json.loads((out / "config.json").read_text())["data"]
    sampling = data["sampling"]
    assert (sampling["attempts"], sampling["tasks"], sampling["kept"]) == (3, 3, 2)
    assert sampling["run"] == str(out / "samples") and sampling["harness"] == "json-tools"
    per_task = sampling["per_task"]
    t0, t1, t2 = (t.id for t in tasks)
    assert per_task[t0] == {
        "attempts": 3,
        "infra_errors": 0,
        "best_score": 1.0,
        "kept": episode_id(t0, "json-tools", 1),
        "attempt": 1,
    }
    assert per_task[t1]["kept"] is None and per_task[t1]["why"] == "no attempt passes (best score 0.00)"
    assert per_task[t2]["kept"] == episode_id(t2, "json-tools", 0)
    assert data["selected"] == data["replayed"] == 2 and summary.steps == 1
    rows = datasets.load_from_disk(str(hf))
    assert set(rows["source_episode"]) == {per_task[t0]["kept"], per_task[t2]["kept"]}
    assert set(rows["source_run"]) == {str(out / "samples")}

    # OUT/samples is an evaluation run folder holding every attempt
    samples = json.loads((out / "samples" / "config.json").read_text())
    assert samples["task_ids"] == [t0, t1, t2] and samples["attempts"] == 3
    with RunStore(out / "samples") as store:
        assert len(list(store.trajectories(with_tokens=False))) == 9
    assert (out / "samples" / "summary.json").is_file()

    # a resume samples nothing again and trains on the same examples
    idle = AttemptPolicy(tasks, spec, tokenizer, set(), attempts=3)
    config.epochs = 2
    again = sft_run(config, out, resume=True, sample_policy=idle, progress=False)
    assert idle.calls == 0 and again.steps == 2
    assert json.loads((out / "config.json").read_text())["data"]["sampling"]["per_task"] == per_task


def test_sampling_with_from_samples_the_tasks_its_runs_name(
    failing_run, toolcalc_tasks, tokenizer, tmp_path, monkeypatch
):
    import harnessrl.train.sft as sft

    with RunStore(failing_run) as store:
        named = [t.task_id for t in store.trajectories(with_tokens=False)]
    # no --as-harness: the harness of the --from episodes (none passes), where the attempts run too
    spec = load_harness("json-tools")
    tasks = [t for t in toolcalc_tasks if t.id in named]
    policy = AttemptPolicy(tasks, spec, tokenizer, {(0, 0), (1, 0)}, attempts=1)
    summaries = []

    def run_sft_with_the_policy(*args, **kw):
        summaries.append(run_sft(*args, **kw, sample_policy=policy))
        return summaries[-1]

    monkeypatch.setattr(sft, "run_sft", run_sft_with_the_policy)
    out, export = tmp_path / "o", tmp_path / "ex.jsonl"
    r = CliRunner().invoke(
        _cli(),
        ["train", "sft", "--model", "tiny-random", "--from", str(failing_run), "--sample", "1", "--out", str(out)]
        + ["--export-only", "--export-jsonl", str(export)],
    )
    assert r.exit_code == 0, r.output
    said = f"sampled 1 attempts of each of 2 tasks in json-tools: 2 tasks kept their best one ({out / 'samples'})"
    assert said in r.output
    samples = json.loads((out / "samples" / "config.json").read_text())
    assert samples["task_ids"] == named and list(samples["harnesses"]) == ["json-tools"]
    assert not (out / "config.json").exists()  # --export-only: no fine-tuning run folder
    data = summaries[0].data
    assert data.not_selected == 2 and data.selected == data.replayed == 2  # the --from ones all failed
    assert summaries[0].harness == "json-tools" and len(export.read_text().splitlines()) == data.examples


def test_nothing_passing_after_sampling_exits_2_and_keeps_the_attempts_for_the_next_start(tmp_path):
    import yaml

    short = load_harness("json-tools").to_dict()
    short["name"] = "json-tools-short"
    short["rules"].update(max_steps=1, max_new_tokens=8)  # the tiny random model: one short reply
    spec_path = tmp_path / "short.yaml"
    spec_path.write_text(yaml.safe_dump(short))
    out = tmp_path / "o"
    base = ["train", "sft", "--model", "tiny-random", "--as-harness", "json-tools", "--out", str(out)]
    base += ["--sample-suite", "toolcalc", "--sample-tasks", "1", "--sample-harness", str(spec_path)]
    for _ in range(2):
        r = CliRunner().invoke(_cli(), [*base, "--sample", "1"])
        assert r.exit_code == 2, r.output
        assert "no episode to learn from: no attempt passes among the 1 per task of the 1 tasks sampled in " in (
            " ".join(r.output.split())
        )
        assert "Traceback" not in r.output and not (out / "config.json").exists()
        with RunStore(out / "samples") as store:
            assert len(list(store.trajectories(with_tokens=False))) == 1  # the second start ran nothing new
    # other sampling options with these attempts there: refused, saying why
    r = CliRunner().invoke(_cli(), [*base, "--sample", "2"])
    assert r.exit_code == 2 and "holds attempts sampled with other options" in r.output, r.output


def test_a_sampling_harness_whose_tools_the_target_lacks_is_refused(toolcalc_tasks):
    target = load_harness("json-tools")
    shell = target.rules.shell.model_copy(update={"enabled": True})
    sampler = target.model_copy(
        update={"name": "json-shell", "rules": target.rules.model_copy(update={"shell": shell})}
    )
    task = dataclasses.replace(toolcalc_tasks[0], offers_shell=True)
    check_sampling_harness([task], target, target)
    check_sampling_harness([toolcalc_tasks[0]], sampler, target)  # no shell on a task that offers none
    with pytest.raises(SFTError, match="--sample-harness json-shell offers shell for task .* which the target"):
        check_sampling_harness([task], sampler, target)


def test_as_harness_own_keeps_each_episode_in_the_harness_it_ran_in(tmp_path, toolcalc_tasks, tokenizer):
    """Oracle episodes of two harnesses (what `harnessrl eval --model oracle -H a,b` stores): with
    --as-harness own, one adapter learns each harness's own format; without it, a clear error."""
    trajectories = []
    for name in ("json-tools", "code-act"):
        spec = load_harness(name)
        trajectories += _run(oracle_policy(toolcalc_tasks, spec, tokenizer), toolcalc_tasks, spec)
    source = _store(tmp_path / "two", trajectories)
    with pytest.raises(SFTError, match="several harnesses .*--as-harness own"):
        sft_run(_config(source, as_harness=None), tmp_path / "refused", progress=False)
    assert not (tmp_path / "refused").exists()

    out = tmp_path / "own"
    summary = sft_run(_config(source, as_harness="own"), out, export_jsonl=tmp_path / "own.jsonl", progress=False)
    assert summary.harness == "own"
    assert set(summary.data.by_harness) == {"json-tools", "code-act"}
    lines = [json.loads(line) for line in (tmp_path / "own.jsonl").read_text().splitlines()]
    assert summary.data.examples == len(lines) == sum(x["examples"] for x in summary.data.by_harness.values())
    json_tools = load_harness("json-tools").system_prompt.split("\n")[0]
    code_act = load_harness("code-act").system_prompt.split("\n")[0]
    systems = [line["messages"][0]["content"] for line in lines]
    assert any(json_tools in s for s in systems) and any(code_act in s for s in systems)
    assert json.loads((out / "adapter" / "harnessrl.json").read_text())["harness"] == "own"
    assert summary.data.dropped == {}  # the keys of one harness's stats, summed over the harnesses

    # the command line's summary of such a run (it read the one-harness keys and died on them)
    both = tmp_path / "both"
    r = CliRunner().invoke(
        _cli(),
        ["train", "sft", "--model", "tiny-random", "--from", str(source), "--as-harness", "own", "--out", str(both)]
        + ["--export-only", "--export-jsonl", str(tmp_path / "cli.jsonl"), "--export-hf", str(tmp_path / "hf")],
    )
    assert r.exit_code == 0, r.output
    assert f"{summary.data.examples} examples from" in r.output and "exported:" in r.output
