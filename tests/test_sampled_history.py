"""Prompts that continue the tokens as sampled (HFPolicy.sampled_history, chat.continue_prompt_ids,
the harness's SampledPrefix): each call's prompt begins with the previous call's prompt and
completion, token for token, whatever the template or the tokenizer would make of the reply's text;
where a template cannot be continued that way, the whole conversation is rendered as before."""

from __future__ import annotations

import pytest
from helpers import with_template

from harnessrl.models import chat
from harnessrl.models.base import GenerationRequest, SampledPrefix
from harnessrl.types import Message


@pytest.fixture(scope="module")
def tok(tokenizer):
    return tokenizer


def conversation(reply: str) -> list[Message]:
    return [
        Message(role="system", content="You are terse."),
        Message(role="user", content="Add 2 and 3."),
        Message(role="assistant", content=reply),
        Message(role="user", content="Tool result:\n5"),
    ]


def im_end(tok) -> int:
    return tok.convert_tokens_to_ids("<|im_end|>")


def test_a_reply_tokenized_as_the_template_would_gives_the_rendered_prompt(tok):
    messages = conversation('{"name": "add", "arguments": {"a": 2, "b": 3}}')
    head = chat.render_prompt_ids(tok, messages[:2])
    reply = tok(messages[2].content, add_special_tokens=False)["input_ids"] + [im_end(tok)]
    ids = chat.continue_prompt_ids(tok, SampledPrefix(ids=head + reply, messages=3), messages, [im_end(tok)])
    assert ids == chat.render_prompt_ids(tok, messages)


def test_a_reply_split_otherwise_keeps_its_sampled_tokens(tok):
    """The model sampled "Fi" + "ve" where the tokenizer would write one token: the prompt keeps
    the sampled two, and reads as the same text."""
    messages = conversation("Five")
    head = chat.render_prompt_ids(tok, messages[:2])
    split = tok("Fi", add_special_tokens=False)["input_ids"] + tok("ve", add_special_tokens=False)["input_ids"]
    assert split != tok("Five", add_special_tokens=False)["input_ids"]
    sampled = head + split + [im_end(tok)]
    ids = chat.continue_prompt_ids(tok, SampledPrefix(ids=sampled, messages=3), messages, [im_end(tok)])
    assert ids[: len(sampled)] == sampled
    assert tok.decode(ids) == chat.render_prompt(tok, messages)
    assert ids != chat.render_prompt_ids(tok, messages)


def test_a_reply_cut_before_its_end_of_turn_gets_the_templates_markup(tok):
    """A reply cut at a stop string (or its token budget) sampled no <|im_end|>: the template's
    end markup follows its tokens."""
    messages = conversation("Thought: add them")
    head = chat.render_prompt_ids(tok, messages[:2])
    sampled = head + tok("Thought: add them", add_special_tokens=False)["input_ids"]
    ids = chat.continue_prompt_ids(tok, SampledPrefix(ids=sampled, messages=3), messages, [im_end(tok)])
    assert ids[: len(sampled)] == sampled and ids[len(sampled)] == im_end(tok)
    assert tok.decode(ids) == chat.render_prompt(tok, messages)


def test_a_template_that_rewrites_earlier_turns_is_rendered_whole(tok):
    """A template that shows a past reply differently once more turns follow (as some drop their
    reasoning) cannot be continued: None, and the policy renders the conversation as before."""
    rewriting = with_template(
        tok,
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}(earlier reply){% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    messages = conversation("Five")
    sampled = chat.render_prompt_ids(rewriting, messages[:2]) + tok("Five", add_special_tokens=False)["input_ids"]
    assert chat.continue_prompt_ids(rewriting, SampledPrefix(ids=sampled, messages=3), messages, []) is None
    # a prefix that does not end at an assistant reply is not continued either
    assert chat.continue_prompt_ids(tok, SampledPrefix(ids=sampled, messages=2), messages, []) is None


def test_the_policy_continues_only_when_asked(tiny_policy):
    messages = conversation("Five")
    head = chat.render_prompt_ids(tiny_policy.tokenizer, messages[:2])
    split = (
        tiny_policy.tokenizer("Fi", add_special_tokens=False)["input_ids"]
        + tiny_policy.tokenizer("ve", add_special_tokens=False)["input_ids"]
    )
    request = GenerationRequest(messages=messages, sampled_prefix=SampledPrefix(ids=head + split, messages=3))
    policy = tiny_policy.with_sampling(tiny_policy.default_sampling)
    assert policy.sampled_history is False
    assert policy.prompt_ids(request) == chat.render_prompt_ids(policy.tokenizer, messages)
    policy.sampled_history = True
    assert policy.prompt_ids(request)[: len(head) + 2] == head + split


def test_the_harness_offers_the_previous_calls_tokens_until_a_window_acts(tiny_policy):
    """json-tools without a window offers the previous call's tokens at every turn; with a history
    window of 1 the third prompt drops the first exchange, and nothing is offered there."""
    from harnessrl.harness.loops import Episode
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import HarnessSpec
    from harnessrl.tasks import get_suite
    from harnessrl.types import ModelCall

    task = get_suite("toolcalc").tasks("dev", 1)[0]

    def play(window):
        data = load_harness("json-tools").to_dict()
        data["rules"].update(history_window=window, max_steps=4)
        episode = Episode(task, HarnessSpec.model_validate(data), attempt=0)
        offered = []
        for _ in range(3):
            request = episode.request()
            offered.append(request.sampled_prefix)
            prompt = tiny_policy.prompt_ids(request)
            episode.consume(ModelCall(prompt_ids=prompt, completion_ids=[11, 12], logprobs=[0.0, 0.0], text="no call"))
        return offered

    first, second, third = play(None)
    assert first is None and second is not None and third is not None
    assert third.messages == second.messages + 2  # the reply and the feedback after it
    _, second_w, third_w = play(1)
    assert second_w is not None and third_w is None
