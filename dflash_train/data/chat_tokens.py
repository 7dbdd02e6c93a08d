"""Token ids and loss masks of a conversation, built turn by turn so each assistant turn can
be the target's own answer (regenerated) or the data's text (kept): the chat template is
rendered for every prefix, the text between turns is tokenised as the template writes it,
and only assistant turns (up to and including their end-of-turn token) get loss."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from dflash_train.data.conversations import Conversation, Message


class ChatTemplateError(ValueError):
    """The target's chat template cannot be split into turns (one line, for the operator)."""


def render(
    tokenizer: Any,
    messages: Sequence[Message],
    generation_prompt: bool,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """`template_kwargs` go to the template itself (`enable_thinking` for Qwen3's)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError("target: its tokenizer has no chat template")
    return tokenizer.apply_chat_template(
        [m.as_dict() for m in messages],
        add_generation_prompt=generation_prompt,
        tokenize=False,
        **(template_kwargs or {}),
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


# First prompts by tokenizer, then by conversation prefix: a prompt answered K times (a
# `*K` spec) is rendered and tokenised once, not K times.
_FIRST_PROMPTS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[str, list[int]]]]
_FIRST_PROMPTS = weakref.WeakKeyDictionary()


def _first_prompt(
    tokenizer: Any, messages: Sequence[Message], template_kwargs: Mapping[str, Any]
) -> tuple[str, list[int]]:
    try:
        cache = _FIRST_PROMPTS.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: no cache
        cache = {}
    key = (*messages, repr(sorted(template_kwargs.items())))
    if key not in cache:
        text = render(tokenizer, messages, True, template_kwargs)
        cache[key] = (text, encode(tokenizer, text))
    return cache[key]


def answer_points(conversation: Conversation) -> list[int]:
    """Message indices where an assistant turn is (or, after a final user turn, would go)."""
    points = [i for i, m in enumerate(conversation) if m.role == "assistant"]
    if conversation[-1].role != "assistant":
        points.append(len(conversation))
    return points


class TurnBuilder:
    """One sample under construction. Call `prompt_ids(point)` then `add_answer(...)` for
    each answer point in order."""

    def __init__(
        self,
        tokenizer: Any,
        conversation: Conversation,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.messages = list(conversation)
        self.points = answer_points(conversation)
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.turns_finished: list[bool] = []
        self._consumed = ""  # the rendered text already turned into self.ids
        self._start = ""  # the rendering up to the pending answer
        self._pending: list[int] = []

    def prompt_ids(self, point: int) -> list[int]:
        """Everything before the assistant turn at `point`, ending with the template's
        assistant header."""
        if not self._consumed:
            self._start, ids = _first_prompt(
                self.tokenizer, self.messages[:point], self.template_kwargs
            )
            self._pending = list(ids)
            return self.ids + self._pending
        text = render(self.tokenizer, self.messages[:point], True, self.template_kwargs)
        if not text.startswith(self._consumed):
            raise ChatTemplateError(
                "target: its chat template renders earlier turns differently once later turns "
                "are added; multi-turn samples cannot be built from it"
            )
        self._start = text
        self._pending = encode(self.tokenizer, text[len(self._consumed) :])
        return self.ids + self._pending

    def add_answer(self, point: int, answer_ids: Sequence[int], content: str, stop: str) -> None:
        """Append the pending glue (no loss) and the answer (loss). `content` is the answer's
        text without its end-of-turn token, `stop` that token's text ('' if it was cut)."""
        self.ids += self._pending
        self.mask += [0] * len(self._pending)
        self.ids += list(answer_ids)
        self.mask += [1] * len(answer_ids)
        self.turns_finished.append(bool(stop))
        message = Message("assistant", content)
        if point < len(self.messages):
            self.messages[point] = message
        else:
            self.messages.append(message)
        expected = self._start + content + stop
        self._pending = []
        if point == self.points[-1]:
            return  # nothing follows: no later turn needs the rendering checked
        full = render(self.tokenizer, self.messages[: point + 1], False, self.template_kwargs)
        if not full.startswith(expected):
            raise ChatTemplateError(
                "target: its chat template does not write assistant turns verbatim after the "
                "generation prompt; multi-turn samples cannot be built from it"
            )
        self._consumed = expected


def kept_answer(tokenizer: Any, builder: TurnBuilder, point: int, stop_ids: Sequence[int]):
    """The data's own assistant turn at `point`: its tokens plus the end-of-turn token the
    template writes after it (ids, content, stop text)."""
    content = builder.messages[point].content
    full = render(tokenizer, builder.messages[: point + 1], False, builder.template_kwargs)
    rest = full[len(builder._start) + len(content) :]
    for stop_id in stop_ids:
        stop = tokenizer.decode([stop_id])
        if stop and rest.startswith(stop):
            return [*encode(tokenizer, content), int(stop_id)], content, stop
    return encode(tokenizer, content), content, ""
