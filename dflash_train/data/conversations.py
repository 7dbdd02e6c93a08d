"""Chat data in the field's usual shapes, read into one form: a conversation is a tuple of
(role, content) messages with roles system, user and assistant.

Accepted per JSON line: `{"prompt": str}`; OpenAI-style `{"messages": [{"role", "content"}]}`;
ShareGPT `{"conversations": [{"from": "human"|"gpt"|"system", "value"}]}`; and
`{"conversations": [{"role", "content"}]}`. A text file gives one user prompt a line.
Every problem is one line naming the file, the line and the field."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_train.data.prompts import BUILTIN, PromptError, Split, load_prompts

ROLES = ("system", "user", "assistant")
# ShareGPT's speaker names (and the variants seen in public dumps) to roles.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class Message:
    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


Conversation = tuple[Message, ...]


def user_turn(prompt: str) -> Conversation:
    return (Message("user", prompt),)


# What a directory of prompts may hold; other files in it are ignored.
DATA_SUFFIXES = (".jsonl", ".parquet", ".txt")


def expand_files(path: Path) -> list[Path]:
    """A file as itself; a directory as its data files (any depth), in name order. Hidden
    files and folders are not data: a prepare's own work dir (`.<out>.prepare/`) may sit
    among the prompts."""
    if not path.is_dir():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and p.suffix in DATA_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


def load_conversations(spec: str, split: Split = "train") -> list[Conversation]:
    """`builtin` and text files give single user turns; a .jsonl file or a .parquet file
    (one record a row, the same fields) may hold any of the accepted shapes, mixed; a
    directory gives the conversations of its data files in name order."""
    if spec == BUILTIN:
        return [user_turn(p) for p in load_prompts(spec, split)]
    path = Path(spec).expanduser()
    if path.is_dir():
        files = expand_files(path)
        if not files:
            raise PromptError(f"prompts {spec}: a directory without .jsonl, .parquet or .txt files")
        return [c for file in files for c in load_conversations(str(file), split)]
    if path.suffix == ".parquet":
        return _parquet_conversations(spec, path)
    if not spec.endswith(".jsonl"):
        return [user_turn(p) for p in load_prompts(spec, split)]
    load_prompts_checks(spec, path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PromptError(f"prompts {spec}: not UTF-8 text (byte {exc.start})") from None
    lines = [(f"line {n}", line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    return _parsed(spec, lines)


def _parsed(spec: str, records: Sequence[tuple[str, str | dict[str, Any]]]) -> list[Conversation]:
    """Each (where, record) parsed; blank prompts skipped; none at all is an error."""
    conversations = []
    for where, record in records:
        conversation = parse_record(record, f"prompts {spec}: {where}")
        if conversation:
            conversations.append(conversation)
    if not conversations:
        raise PromptError(f"prompts {spec}: holds no prompts")
    return conversations


def _parquet_conversations(spec: str, path: Path) -> list[Conversation]:
    """Each row is one record, read as a JSON line would be; errors name the row (1-based)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    load_prompts_checks(spec, path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise PromptError(f"prompts {spec}: not a readable parquet file ({reason})") from None
    return _parsed(spec, [(f"row {n}", row) for n, row in enumerate(table.to_pylist(), 1)])


def load_prompts_checks(spec: str, path: Path) -> None:
    if not path.exists():
        raise PromptError(f"prompts {spec}: no such file (or use 'builtin')")
    if not path.is_file():
        raise PromptError(f"prompts {spec}: not a regular file")


def parse_record(line: str | dict[str, Any], where: str) -> Conversation:
    """One JSON line (or a parquet row) -> a conversation ((), for a blank `prompt`, which
    is skipped). A row's columns that are null are absent."""
    if isinstance(line, dict):
        record: Any = {k: v for k, v in line.items() if v is not None}
    else:
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise PromptError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise PromptError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        return _turns(record["messages"], where, "messages")
    if "conversations" in record:
        return _turns(record["conversations"], where, "conversations")
    if "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str):
            raise PromptError(f"{where}: prompt: expected a string")
        return user_turn(prompt) if prompt.strip() else ()
    raise PromptError(f"{where}: no string field 'prompt' (nor 'messages' or 'conversations')")


def _turns(turns: Any, where: str, field: str) -> Conversation:
    if not isinstance(turns, list):
        raise PromptError(f"{where}: {field}: expected a list of turns")
    if not turns:
        raise PromptError(f"{where}: {field}: empty")
    messages = [_message(turn, f"{where}: {field}[{i}]") for i, turn in enumerate(turns)]
    for i, message in enumerate(messages):
        if message.role == "system" and i > 0:
            raise PromptError(f"{where}: {field}[{i}].role: a system turn after the first turn")
    roles = [m.role for m in messages if m.role != "system"]
    if "user" not in roles:
        raise PromptError(f"{where}: {field}: no user turn")
    if roles[0] != "user":
        first = next(i for i, m in enumerate(messages) if m.role != "system")
        raise PromptError(f"{where}: {field}[{first}].role: the first turn must be the user's")
    return tuple(messages)


def _message(turn: Any, where: str) -> Message:
    if not isinstance(turn, dict):
        raise PromptError(f"{where}: expected an object")
    if "from" in turn or "value" in turn:  # ShareGPT
        speaker, content = turn.get("from"), turn.get("value")
        if not isinstance(speaker, str) or speaker.lower() not in SHAREGPT_ROLES:
            raise PromptError(
                f"{where}.from: {speaker!r} is not one of {', '.join(sorted(SHAREGPT_ROLES))}"
            )
        if not isinstance(content, str):
            raise PromptError(f"{where}.value: expected a string")
        return Message(SHAREGPT_ROLES[speaker.lower()], content)
    role, content = turn.get("role"), turn.get("content")
    if not isinstance(role, str) or role not in ROLES:
        raise PromptError(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise PromptError(f"{where}.content: expected a string")
    return Message(role, content)


def eval_prompt(conversation: Conversation) -> Conversation:
    """What eval decodes from: the conversation up to its last user turn."""
    last_user = max(i for i, m in enumerate(conversation) if m.role == "user")
    return conversation[: last_user + 1]
