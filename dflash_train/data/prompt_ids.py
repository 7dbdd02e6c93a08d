"""The token ids a prompt becomes under the target's chat template, ending where the
assistant's answer begins, and the ids that end an answer: what prepare, eval and the in-run
held-out evaluation all feed the target."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dflash_train.config.prepare_config import PrepareError
from dflash_train.data.chat_tokens import ChatTemplateError, encode, render
from dflash_train.data.conversations import Conversation, user_turn

if TYPE_CHECKING:
    from dflash_train.targets.frozen_target import Target


def chat_prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The user turn rendered with the target's chat template, ending where the assistant's
    answer begins."""
    try:
        return encode(tokenizer, render(tokenizer, user_turn(prompt), generation_prompt=True))
    except ChatTemplateError as exc:
        raise PrepareError(str(exc)) from None


def conversation_prompt_ids(tokenizer: Any, conversation: Conversation) -> list[int]:
    try:
        return encode(tokenizer, render(tokenizer, conversation, generation_prompt=True))
    except ChatTemplateError as exc:
        raise PrepareError(str(exc)) from None


def stop_token_ids(target: Target) -> list[int]:
    """End-of-turn ids: the tokenizer's eos plus whatever the model's generation config
    stops on (Qwen3 lists both <|im_end|> and <|endoftext|>)."""
    ids: list[int] = []
    configured = getattr(target.model.generation_config, "eos_token_id", None)
    candidates = [target.tokenizer.eos_token_id]
    candidates += configured if isinstance(configured, list) else [configured]
    for token in candidates:
        if token is not None and int(token) not in ids:
            ids.append(int(token))
    if not ids:
        raise PrepareError("target: neither tokenizer nor generation config names an eos token")
    return ids
