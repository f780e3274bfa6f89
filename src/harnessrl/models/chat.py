"""Chat rendering and completion cutting shared by every local policy.

Prompts are rendered with the tokenizer's own chat template (add_generation_prompt=True) and
then tokenized without adding special tokens, so prompt_ids are exactly what the template says.

Role "tool": SmolLM2's ChatML template would print any role name verbatim
(``<|im_start|>tool``), but the model never saw such a turn in training. Unless a template
handles tool messages itself (it mentions "tool", as Qwen's does), a tool message is sent as a
user turn whose content starts with ``Tool result (NAME):`` and a newline (``Tool result:``
when the message has no name).

A template that wraps every tool message in ``<tool_response>`` tags itself (Qwen2.5, Qwen3,
Hermes) gets the results of the hermes protocol, which wraps them in the same tags, unwrapped:
each ``<tool_response>`` block of a tool message becomes a tool message of its own (the text
after the blocks, such as a blocked call's feedback, one more), so the template wraps each once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from harnessrl.models.base import SampledPrefix
from harnessrl.types import Message, ToolSchema

ToolRole = Literal["user", "tool"]

# ChatML without a default system prompt: used for local models whose tokenizer has no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# The tags a Qwen2.5 / Qwen3 / Hermes template puts around a tool message's content.
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>\n", "\n</tool_response>"


def _template_text(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates
        template = " ".join(template.values())
    return template


def template_handles(tokenizer, word: str) -> bool:
    """Whether the chat template refers to `word` as a string literal (role or variable)."""
    template = _template_text(tokenizer)
    return f"'{word}'" in template or f'"{word}"' in template or f" {word} " in template


def default_tool_role(tokenizer) -> ToolRole:
    return "tool" if template_handles(tokenizer, "tool") else "user"


def template_wraps_tool_results(tokenizer, tool_role: ToolRole) -> bool:
    """Whether tool messages go to the template as `tool` turns that it wraps in <tool_response>
    tags itself (then to_template_messages(..., wrapped_by_template=True) is what it should get)."""
    return tool_role == "tool" and TOOL_RESPONSE_OPEN.strip() in _template_text(tokenizer)


def split_tool_responses(content: str) -> list[str]:
    """A tool message's content for a template that wraps each tool message in <tool_response>
    tags: the text of each block it already holds in those tags (the hermes protocol's results,
    one per line), then the text after them, if any. A content that does not start with such a
    block, or holds the tags anywhere else, is returned whole."""
    tags = (TOOL_RESPONSE_OPEN.strip(), TOOL_RESPONSE_CLOSE.strip())
    pieces, rest = [], content
    while rest.startswith(TOOL_RESPONSE_OPEN):
        end = rest.find(TOOL_RESPONSE_CLOSE, len(TOOL_RESPONSE_OPEN))
        inner = rest[len(TOOL_RESPONSE_OPEN) : end]
        if end < 0 or any(tag in inner for tag in tags):
            return [content]
        pieces.append(inner)
        rest = rest[end + len(TOOL_RESPONSE_CLOSE) :]
        if rest and not rest.startswith("\n"):
            return [content]
        rest = rest[1:]
    if not pieces or any(tag in rest for tag in tags):
        return [content]
    return pieces + ([rest] if rest else [])


def tool_message_as_user(message: Message) -> str:
    label = f"Tool result ({message.name})" if message.name else "Tool result"
    return f"{label}:\n{message.content}"


def to_template_messages(
    messages: Sequence[Message],
    tool_role: ToolRole = "user",
    wrapped_by_template: bool = False,
    template_takes_tool_calls: bool = False,
) -> list[dict]:
    """The messages as the chat template takes them; `wrapped_by_template`: the template wraps each
    tool message in <tool_response> tags (template_wraps_tool_results), see split_tool_responses.
    An assistant message carrying native tool calls (`Message.tool_calls`) is passed with them in
    the transformers form when `template_takes_tool_calls`; else it is a ValueError: a template
    without them would drop the calls, and writing them as text is a harness's business."""
    out: list[dict] = []
    for m in messages:
        if m.tool_calls:
            if not template_takes_tool_calls:
                raise ValueError(
                    "a message carries native tool calls, which this model's chat template cannot show "
                    "(write them as text in a tool-call format)"
                )
            calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
            out.append({"role": m.role, "content": m.content, "tool_calls": calls})
            continue
        if m.role == "tool" and tool_role == "user":
            out.append({"role": "user", "content": tool_message_as_user(m)})
        elif m.role == "tool":
            name = {"name": m.name} if m.name else {}
            contents = split_tool_responses(m.content) if wrapped_by_template else [m.content]
            out.extend({"role": "tool", "content": content, **name} for content in contents)
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def render_prompt(
    tokenizer,
    messages: Sequence[Message],
    tool_role: ToolRole = "user",
    tools: Sequence[ToolSchema] | None = None,
) -> str:
    """The prompt text, ending with the assistant generation header."""
    return render_conversation(tokenizer, messages, tool_role, tools, generation_prompt=True)


def render_conversation(
    tokenizer,
    messages: Sequence[Message],
    tool_role: ToolRole = "user",
    tools: Sequence[ToolSchema] | None = None,
    *,
    generation_prompt: bool,
) -> str:
    """The conversation's text; with `generation_prompt`, ending with the assistant generation header."""
    if not messages:
        raise ValueError("cannot render an empty conversation")
    kwargs = {}
    # Native function calling only where the template knows what to do with `tools`; otherwise
    # the harness shows its tools in the system prompt and the schemas are not rendered here.
    if tools and template_handles(tokenizer, "tools"):
        kwargs["tools"] = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in tools
        ]
    wrapped = template_wraps_tool_results(tokenizer, tool_role)
    chat = to_template_messages(messages, tool_role, wrapped, "tool_calls" in _template_text(tokenizer))
    return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)


def render_prompt_ids(
    tokenizer,
    messages: Sequence[Message],
    tool_role: ToolRole = "user",
    tools: Sequence[ToolSchema] | None = None,
) -> list[int]:
    text = render_prompt(tokenizer, messages, tool_role, tools)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


_REPLY_MARK = "\x00harnessrl-reply\x00"  # stands for a reply's content, to find the markup after it


def continue_prompt_ids(
    tokenizer,
    prefix: SampledPrefix,
    messages: Sequence[Message],
    stop_ids: Sequence[int],
    tool_role: ToolRole = "user",
    tools: Sequence[ToolSchema] | None = None,
) -> list[int] | None:
    """The prompt ids of `messages` that continue the tokens the model sampled: `prefix.ids` (the
    previous prompt and its completion, standing for `messages[:prefix.messages]`, the last of
    them the reply), then the template's markup after a reply and the rendering of the new
    messages, tokenized. The reply's tokens stay as they were sampled, whatever the template
    would make of its text (a trimmed space, another split into tokens), so the prompt begins
    with the previous call's prompt and completion, token for token.

    None where the template cannot be continued that way: it renders the earlier turns
    differently once more follow (the conversation rendered up to the reply is not the start of
    the whole one), or the markup it puts after a reply does not begin with the sampled
    end-of-turn token. The caller then renders the whole conversation as usual."""
    n = prefix.messages
    if n >= len(messages) or messages[n - 1].role != "assistant" or not prefix.ids:
        return None
    full = render_conversation(tokenizer, messages, tool_role, tools, generation_prompt=True)
    head = render_conversation(tokenizer, messages[:n], tool_role, tools, generation_prompt=False)
    marked = render_conversation(
        tokenizer,
        [*messages[: n - 1], Message(role="assistant", content=_REPLY_MARK)],
        tool_role,
        tools,
        generation_prompt=False,
    )
    at = marked.find(_REPLY_MARK)
    if not full.startswith(head) or at < 0:
        return None
    after_reply = marked[at + len(_REPLY_MARK) :]
    if not head.endswith(after_reply):
        return None
    tail = after_reply + full[len(head) :]
    if prefix.ids[-1] in stop_ids:  # the reply ended with its end-of-turn token: the markup begins with it
        sampled_end = tokenizer.decode([prefix.ids[-1]], skip_special_tokens=False)
        if not tail.startswith(sampled_end):
            return None
        tail = tail[len(sampled_end) :]
    return [*prefix.ids, *tokenizer(tail, add_special_tokens=False)["input_ids"]]


def decode(tokenizer, ids: Sequence[int]) -> str:
    """Completion text: special tokens (<|im_end|>, ...) dropped, spacing left exactly as is."""
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def cut_at_stop_strings(
    tokenizer, ids: list[int], logprobs: list[float], stop: Sequence[str]
) -> tuple[list[int], list[float], str, bool]:
    """Cut a completion at the first of `stop`.

    Keeps the tokens up to and including the first token whose decoded prefix contains a stop
    string (so the ids still hold the stop the model produced), and returns the text of those
    tokens with the earliest stop string and everything after it removed.
    Returns (ids, logprobs, text, stopped).
    """
    full = decode(tokenizer, ids)
    stop = [s for s in stop if s]
    if not any(s in full for s in stop):
        return ids, logprobs, full, False

    def first_stop(text: str) -> int | None:
        found = [i for i in (text.find(s) for s in stop) if i >= 0]
        return min(found) if found else None

    # Smallest k whose decoded prefix ids[:k] contains a stop (binary search: containment only
    # grows with k).
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if first_stop(decode(tokenizer, ids[:mid])) is not None:
            hi = mid
        else:
            lo = mid + 1
    text = decode(tokenizer, ids[:lo])
    cut = first_stop(text)
    if cut is None:  # decoding was not prefix-monotone here; keep everything, cut the text
        lo, text, cut = len(ids), full, first_stop(full)
    return ids[:lo], logprobs[:lo], text[:cut], True


def finish_call(tokenizer, request, prompt_ids: list[int], ids: list[int], logprobs: list[float], finish: str):
    """The ModelCall of one request: cut at its stop strings, decoded, with the finish reason."""
    from harnessrl.types import ModelCall

    ids, logprobs, text, stopped = cut_at_stop_strings(tokenizer, ids, logprobs, request.stop)
    return ModelCall(
        prompt_ids=prompt_ids,
        completion_ids=ids,
        logprobs=logprobs,
        text=text,
        finish_reason="stop" if stopped else finish,
        messages=list(request.messages),
    )


def end_of_turn_ids(model, tokenizer) -> list[int]:
    """The ids that end an assistant turn: <|im_end|> where the vocabulary has it, the
    tokenizer's eos and the model's (generation) config eos ids."""
    from harnessrl.models.embedded import END_OF_TURN

    ids: set[int] = set()
    im_end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    return sorted(ids)
