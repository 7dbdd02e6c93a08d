"""JSON Schema (draft 2020-12) of the status stream's lines and the control plane's replies,
generated from `protocol` (KINDS, the envelope, the enums), so it cannot drift from what
`decode_line` and `decode_reply` accept. `dflash-train schema` prints it. Standard library
only, like protocol.py."""

from __future__ import annotations

from typing import Any

from dflash_train import protocol

DIALECT = "https://json-schema.org/draft/2020-12/schema"
_JSON_TYPES = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    dict: "object",
    list: "array",
    type(None): "null",
}


def json_types(types: tuple[type, ...]) -> str | list[str]:
    """protocol's accepted Python types as JSON Schema types. An int-or-float field is a
    "number" (JSON's integers are numbers); a bool never is, in both."""
    names = [_JSON_TYPES[t] for t in types]
    if "number" in names and "integer" in names:
        names.remove("integer")
    return names[0] if len(names) == 1 else names


def _fields(wanted: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    return {
        "required": list(wanted),
        "properties": {name: {"type": json_types(types)} for name, types in wanted.items()},
    }


def _kind_rules() -> list[dict[str, Any]]:
    rules = []
    for kind, wanted in protocol.KINDS.items():
        then = _fields(wanted)
        props = then["properties"]
        if kind == "event":
            props["level"]["enum"] = list(protocol.EVENT_LEVELS)
        elif kind == "run_end":
            props["reason"]["enum"] = list(protocol.RUN_END_REASONS)
        elif kind == "gpu":
            gpu = {name: {"type": json_types(t)} for name, t in protocol.GPU_FIELDS.items()}
            props["gpus"]["items"] = {"type": "object", "required": ["index"], "properties": gpu}
        rules.append({"if": {"properties": {"kind": {"const": kind}}}, "then": then})
    return rules


def status_line_schema() -> dict[str, Any]:
    """One line of status.jsonl (or of `dflash-train tail`): the envelope, the kind's required
    fields and types; other fields are allowed (a writer may add detail without a bump)."""
    envelope = _fields(protocol.ENVELOPE)
    envelope["properties"]["v"] |= {"minimum": 1, "maximum": protocol.SCHEMA_VERSION}
    envelope["properties"]["seq"] |= {"minimum": 0}
    envelope["properties"]["kind"] |= {"enum": list(protocol.KINDS)}
    return {
        "title": "dflash status stream line",
        "type": "object",
        **envelope,
        "allOf": _kind_rules(),
    }


def skipped_notice_schema() -> dict[str, Any]:
    """The line `tail` sends in place of one over protocol.MAX_LINE_BYTES."""
    return {
        "title": "dflash tail: an oversized line not sent",
        "type": "object",
        "required": ["v", "skipped", "bytes"],
        "properties": {
            "v": {"type": "integer", "minimum": 1, "maximum": protocol.SCHEMA_VERSION},
            "skipped": {"const": protocol.SKIPPED_OVERSIZED},
            "bytes": {"type": "integer"},
            "of_seq": {"type": "integer"},
            "of_kind": {"type": "string"},
            "of_run": {"type": "string"},
        },
        "not": {"required": ["kind"]},
    }


def reply_schema() -> dict[str, Any]:
    """The one JSON reply a control command prints: `ok`, and on failure `error_code` and
    `error`; each command adds its own fields."""
    return {
        "title": "dflash-train reply",
        "type": "object",
        "required": ["v", "command", "ok"],
        "properties": {
            "v": {"type": "integer", "maximum": protocol.SCHEMA_VERSION},
            "command": {"type": "string", "examples": list(protocol.COMMANDS)},
            "ok": {"type": "boolean"},
            "error_code": {"type": "string"},
            "error": {"type": "string"},
        },
        "if": {"properties": {"ok": {"const": False}}},
        "then": {"required": ["error_code", "error"]},
    }


def document(only: str | None = None) -> dict[str, Any]:
    """The whole schema: a stream line, tail's skipped notice, or a reply (`only` picks one:
    "stream", "reply")."""
    defs = {
        "status_line": status_line_schema(),
        "skipped_notice": skipped_notice_schema(),
        "reply": reply_schema(),
    }
    picks = {
        None: list(defs),
        "stream": ["status_line", "skipped_notice"],
        "reply": ["reply"],
    }[only]
    return {
        "$schema": DIALECT,
        "title": f"dflash protocol v{protocol.SCHEMA_VERSION}",
        "$defs": {name: defs[name] for name in picks},
        "oneOf": [{"$ref": f"#/$defs/{name}"} for name in picks],
    }
