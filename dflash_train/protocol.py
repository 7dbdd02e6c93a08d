"""The contract between trainer and console: status-stream lines, control replies, live settings.

Standard library only: the console imports this module and must never pull in torch.
Decoding never raises; a bad line yields a `Rejected` with a reason the reader can count.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
# A line longer than this is refused before json parsing: a runaway writer must not
# make the console allocate megabytes per line.
MAX_LINE_BYTES = 1 << 20

# ---------------------------------------------------------------------------------------
# Status stream

NUMBER = (int, float)
OPT_NUMBER = (int, float, type(None))  # metrics may be null when not finite
ENVELOPE: dict[str, tuple[type, ...]] = {
    "v": (int,),
    "seq": (int,),
    "t": NUMBER,
    "run": (str,),
    "kind": (str,),
}

# kind -> required fields and their accepted JSON types. Extra fields are allowed and
# kept, so a writer may add detail without a schema bump.
KINDS: dict[str, dict[str, tuple[type, ...]]] = {
    "run_start": {
        "config": (dict,),
        "topology": (dict,),
        "dataset": (dict,),
        "batches_per_epoch": (int,),
        "total_steps": (int,),
        "pid": (int,),
        "host": (str,),
    },
    # acc: the drafts' accuracy on the interval's training blocks, slots averaged; tau: those
    # blocks' teacher-forced acceptance length (1 + the mean leading run of right drafts:
    # what rounds would accept); optional slot_acc: each slot's accuracy.
    "step": {
        "step": (int,),
        "epoch": (int,),
        "epoch_progress": NUMBER,
        "loss": OPT_NUMBER,
        "acc": OPT_NUMBER,
        "tau": OPT_NUMBER,
        "lr": NUMBER,
        "grad_norm": OPT_NUMBER,
        "tokens": (int,),
        "ktok_s": NUMBER,
    },
    "queue": {
        "hs_ready": (int,),
        "hs_queue_depth": (int,),
        "hs_min_ready": (int,),
        "producer_wait": NUMBER,
        "consumer_wait": NUMBER,
        "starved": NUMBER,
        "bucket_mix": (dict,),
    },
    "gpu": {
        "available": (bool,),
        "gpus": (list,),
    },
    "profile": {
        "stages_ms": (dict,),
        "allocator": (dict,),
    },
    "event": {
        "level": (str,),
        "message": (str,),
        "code": (str,),
    },
    "checkpoint": {
        "step": (int,),
        "path": (str,),
        "seconds": NUMBER,
    },
    "heartbeat": {},
    # A prepare run's progress (run_start says mode "prepare"): answers of all, answer
    # tokens/s over all devices and per device, truncated answers, seconds left (null
    # until known).
    "prepare": {
        "prompts_done": (int,),
        "prompts_total": (int,),
        "answers_done": (int,),
        "answers_total": (int,),
        "answer_tokens": (int,),
        "tokens_per_s": NUMBER,
        "truncated": (int,),
        "eta_s": OPT_NUMBER,
        "devices": (list,),
    },
    "run_end": {
        "reason": (str,),
        "exit_code": (int,),
    },
}
EVENT_LEVELS = ("info", "warning", "error")
# Event codes whose lines carry more required fields, checked like a kind's. `eval`: one
# held-out evaluation of the drafter at `step` (in the run, or `dflash-train eval
# --run-dir` by hand): `tau` the mean tokens per draft-verify round of real greedy
# speculative decoding on `prompts` held-out prompts x up to `tokens` new tokens, `tau_tf`
# the teacher-forced acceptance length on the held-out answers (null when the held-out set
# has none), `lossless` every output equal to plain greedy decoding, `seconds` what the
# evaluation took. A target the decoder cannot drive (a hybrid of linear-attention layers,
# whose recurrent state cannot be cut back after a rejected draft) is scored teacher-forced
# only: `tau` and `lossless` null, `tau_tf` set, `prompts` 0. Optional: mismatched (how many
# of the `prompts` outputs differ from plain greedy: 0 when lossless; in bfloat16 a
# near-tie can make one differ), slot_acc
# (teacher-forced per-slot accuracy), round_lengths ([k - 1]: decoding rounds that made k
# tokens), tau_tf_seen and slot_acc_seen (the same teacher-forced figures on as many
# training samples as held-out answers, cut to their length: seen against unseen; the
# run's own), dtype, device, block_size, checkpoint (its path), source ("run" or "manual"),
# phases_s (the run's: seconds of setup, greedy, speculative, teacher_forced,
# teacher_forced_seen), greedy_decoded (prompts whose plain greedy decoding this one made).
EVENT_CODE_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "eval": {
        "step": (int,),
        "tau": OPT_NUMBER,
        "tau_tf": OPT_NUMBER,
        "lossless": (bool, type(None)),
        "prompts": (int,),
        "tokens": (int,),
        "seconds": NUMBER,
    },
}
RUN_END_REASONS = ("completed", "signal", "error")
GPU_FIELDS: dict[str, tuple[type, ...]] = {
    "index": (int,),
    "role": (str,),
    "util": OPT_NUMBER,
    "mem_used": OPT_NUMBER,
    "mem_total": OPT_NUMBER,
    "power_w": OPT_NUMBER,
    "power_limit_w": OPT_NUMBER,
    "temp_c": OPT_NUMBER,
}


@dataclass(frozen=True)
class StatusLine:
    """One decoded status-stream line. `fields` holds everything but the envelope."""

    v: int
    seq: int
    t: float
    run: str
    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


@dataclass(frozen=True)
class Rejected:
    """Why a line was not accepted. `code` is stable (for counting), `reason` is for people."""

    code: str
    reason: str
    # A notice of a line the box skipped (code `oversized`) names that line, so a reader's
    # cursor can move past it and a resumed `tail` does not send the notice again.
    of_run: str | None = None
    of_seq: int | None = None


class EncodeError(ValueError):
    pass


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    # bool is an int subclass in Python but never a valid count or number here.
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _type_names(types: tuple[type, ...]) -> str:
    names = {int: "integer", float: "number", str: "string", dict: "object"}
    names |= {list: "array", bool: "boolean", type(None): "null"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def _check_required(
    where: str, fields: Mapping[str, Any], wanted: Mapping[str, tuple[type, ...]]
) -> Rejected | None:
    for name, types in wanted.items():
        if name not in fields:
            return Rejected("missing_field", f"{where}: missing field {name!r}")
        if not _type_ok(fields[name], types):
            got = type(fields[name]).__name__
            return Rejected(
                "wrong_type", f"{where}.{name}: expected {_type_names(types)}, got {got}"
            )
    return None


def _check_fields(kind: str, fields: Mapping[str, Any]) -> Rejected | None:
    problem = _check_required(kind, fields, KINDS[kind])
    if problem is not None:
        return problem
    if kind == "event" and fields["level"] not in EVENT_LEVELS:
        return Rejected("bad_value", f"event.level: {fields['level']!r} not in {EVENT_LEVELS}")
    if kind == "event" and fields["code"] in EVENT_CODE_FIELDS:
        code = fields["code"]
        problem = _check_required(f"event {code}", fields, EVENT_CODE_FIELDS[code])
        if problem is not None:
            return problem
        if code == "eval" and fields["tau"] is None and fields["tau_tf"] is None:
            return Rejected("bad_value", "event eval: tau and tau_tf both null: nothing measured")
    if kind == "run_end" and fields["reason"] not in RUN_END_REASONS:
        return Rejected(
            "bad_value", f"run_end.reason: {fields['reason']!r} not in {RUN_END_REASONS}"
        )
    if kind == "gpu":
        for i, gpu in enumerate(fields["gpus"]):
            if not isinstance(gpu, dict):
                return Rejected("wrong_type", f"gpu.gpus[{i}]: expected object")
            for name, types in GPU_FIELDS.items():
                if name in gpu and not _type_ok(gpu[name], types):
                    return Rejected(
                        "wrong_type", f"gpu.gpus[{i}].{name}: expected {_type_names(types)}"
                    )
            if "index" not in gpu:
                return Rejected("missing_field", f"gpu.gpus[{i}]: missing field 'index'")
    return None


def encode_line(kind: str, *, seq: int, run: str, t: float | None = None, **fields: Any) -> str:
    """Build one status line (with its trailing newline). Raises EncodeError on a bad record:
    the writer is our own code, so a bad record is a bug to surface, not to skip."""
    if kind not in KINDS:
        raise EncodeError(f"unknown kind {kind!r}")
    clash = set(fields) & set(ENVELOPE)
    if clash:
        raise EncodeError(f"{kind}: field names clash with the envelope: {sorted(clash)}")
    clean = _finite_or_none(fields)
    problem = _check_fields(kind, clean)
    if problem is not None:
        raise EncodeError(problem.reason)
    record = {"v": SCHEMA_VERSION, "seq": seq, "t": time.time() if t is None else t}
    record |= {"run": run, "kind": kind, **clean}
    return json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"


def decode_line(raw: str | bytes) -> StatusLine | Rejected:
    """Decode one line; never raises."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_LINE_BYTES:
            return Rejected("too_long", f"line of {len(raw)} bytes exceeds {MAX_LINE_BYTES}")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejected("not_utf8", f"not UTF-8: {exc.reason} at byte {exc.start}")
    if len(raw) > MAX_LINE_BYTES:
        return Rejected("too_long", f"line of {len(raw)} characters exceeds {MAX_LINE_BYTES}")
    text = raw.strip()
    if not text:
        return Rejected("empty", "empty line")
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        return Rejected("malformed_json", f"malformed JSON: {exc}")
    if not isinstance(obj, dict):
        return Rejected("not_object", f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("skipped") == SKIPPED_OVERSIZED and "kind" not in obj:
        return _skipped_reason(obj)
    for name, types in ENVELOPE.items():
        if name not in obj:
            return Rejected("missing_field", f"missing envelope field {name!r}")
        if not _type_ok(obj[name], types):
            return Rejected("wrong_type", f"envelope.{name}: expected {_type_names(types)}")
    if obj["v"] > SCHEMA_VERSION:
        return Rejected(
            "newer_version", f"schema v{obj['v']} is newer than this reader (v{SCHEMA_VERSION})"
        )
    if obj["v"] < 1:
        return Rejected("bad_value", f"schema version {obj['v']} is not valid")
    if obj["seq"] < 0:
        return Rejected("bad_value", "seq must not be negative")
    kind = obj["kind"]
    if kind not in KINDS:
        return Rejected("unknown_kind", f"unknown kind {kind!r}")
    fields = {k: v for k, v in obj.items() if k not in ENVELOPE}
    problem = _check_fields(kind, fields)
    if problem is not None:
        return problem
    return StatusLine(obj["v"], obj["seq"], float(obj["t"]), obj["run"], kind, fields)


# Lines `tail` sends that the trainer never wrote: events repeating the seq of the line
# before them (readers pass them on even when their seq is not new). `history_end` closes
# the summary of the past; `trainer_gone` says the run lock's holder died without run_end.
HISTORY_END = "history_end"
TRAINER_GONE = "trainer_gone"
MARKER_CODES = frozenset({HISTORY_END, TRAINER_GONE})

# A native crash's report in train.log (faulthandler, which the trainer installs) begins with
# this line and lists the innermost frame first: `status` sends such a tail from this line,
# and the console shows its head, not its end (the outermost frames).
FATAL_PREFIX = "Fatal Python error: "


def is_crash_report(log_tail: Sequence[str]) -> bool:
    return bool(log_tail) and str(log_tail[0]).startswith(FATAL_PREFIX)


# A restart between its two trainers: the old trainer's run_end carries `restarting: true`
# (it ended for the restart, which held RunDir.restart_lock); an `event` of code
# `restart_failed` follows when the new trainer did not come up.
RESTART_FAILED = "restart_failed"


def eval_score(fields: Mapping[str, Any]) -> float | None:
    """What ranks an evaluation (an `eval` event, a checkpoint's eval.json or its listing):
    its finite `tau`, else (a hybrid target's, never decoded) its finite `tau_tf`, else
    None. One rule for the box and the console."""
    for key in ("tau", "tau_tf"):
        value = fields.get(key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and math.isfinite(value):
            return float(value)
    return None


def round_shares(
    round_lengths: Sequence[int], drafts: Sequence[int] = (1, 2, 4, 8)
) -> dict[int, float]:
    """An evaluation's `round_lengths` ([k - 1]: rounds that made k tokens) read as the share
    of rounds that kept at least d drafts, for each d in `drafts` inside the block: 1 is how
    often the first draft is right, 8 how often a round runs long. Empty without rounds.
    One rule for the box's study table and the console."""
    rounds = sum(round_lengths)
    return {d: sum(round_lengths[d:]) / rounds for d in drafts if rounds and d < len(round_lengths)}


def init_from_text(source: Mapping[str, Any]) -> str:
    """run_start's `init_from` in words: "export PATH (run R, step N)". One wording for the
    trainer's event and the console's run details."""
    origin = f" (run {source.get('run')}, step {source.get('step')})" if source.get("run") else ""
    return f"{source.get('kind')} {source.get('path')}{origin}"


def is_marker(line: StatusLine) -> bool:
    return line.kind == "event" and line.fields.get("code") in MARKER_CODES


def trainer_gone_marker(
    run: str, seq: int, pid: int | None, *, run_dir_gone: bool = False
) -> bytes:
    """Stamped with the box's clock when `tail` found the lock free and no run_end, or
    (`run_dir_gone`) the run directory itself deleted under its trainer."""
    who = f"the trainer (pid {pid})" if pid is not None else "the trainer"
    if run_dir_gone:
        why = f"the run directory was deleted: {who} stops itself without a run_end"
    else:
        why = f"{who} is gone: run.lock is free and the stream has no run_end"
    text = encode_line(
        "event",
        seq=seq,
        run=run,
        level="error",
        code=TRAINER_GONE,
        message=why,
        pid=pid,
        marker=True,
    )
    return text.rstrip("\n").encode("utf-8")


# `dflash-train tail` never sends a line over MAX_LINE_BYTES: it sends this notice in its
# place, which every reader counts as a rejected line of reason `oversized`.
SKIPPED_OVERSIZED = "oversized"


def skipped_notice(
    size: int, seq: int | None = None, kind: str | None = None, run: str | None = None
) -> bytes:
    """The line `tail` sends instead of a line of `size` bytes (its seq, kind and run if
    known)."""
    record: dict[str, Any] = {"v": SCHEMA_VERSION, "skipped": SKIPPED_OVERSIZED, "bytes": size}
    if seq is not None:
        record["of_seq"] = seq
    if kind is not None:
        record["of_kind"] = kind
    if run is not None:
        record["of_run"] = run
    return json.dumps(record, separators=(",", ":")).encode()


def _skipped_reason(obj: Mapping[str, Any]) -> Rejected:
    size, seq, kind = obj.get("bytes"), obj.get("of_seq"), obj.get("of_kind")
    what = f"line {seq}" if type(seq) is int else "a line"
    if isinstance(kind, str):
        what += f" ({kind[:40]})"
    shown = f" of {size} bytes" if type(size) is int else ""
    run = obj.get("of_run")
    return Rejected(
        SKIPPED_OVERSIZED,
        f"{what}{shown} not sent by the box: over {MAX_LINE_BYTES} bytes",
        of_run=run if isinstance(run, str) else None,
        of_seq=seq if type(seq) is int and seq >= 0 else None,
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


# ---------------------------------------------------------------------------------------
# Live settings (control.json)


@dataclass(frozen=True)
class IntSetting:
    name: str
    minimum: int
    maximum: int
    # When set, the upper bound is the current value of this other setting.
    maximum_from: str | None = None
    help: str = ""


LIVE_SETTINGS: dict[str, IntSetting] = {
    "hs_queue_depth": IntSetting(
        "hs_queue_depth", 1, 4096, help="most hidden-state batches held ready"
    ),
    "hs_min_ready": IntSetting(
        "hs_min_ready",
        1,
        4096,
        maximum_from="hs_queue_depth",
        help="ready batches needed before the drafter draws one at random",
    ),
}
DEFAULT_SETTINGS: dict[str, int] = {"hs_queue_depth": 8, "hs_min_ready": 2}

# `dflash-train gpus --follow` lines belong to no run: this run id says so to the reader.
GPUS_RUN_ID = "gpus"
# The file a run's stream is rotated to when a new run id starts in its run dir (by
# StatusWriter; run ids are config.RUN_ID_PATTERN): one plain file name, no path.
ROTATED_STREAM = re.compile(r"status\.[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\.jsonl")


class SettingError(ValueError):
    """A one-line, operator-facing reason naming the setting."""


def parse_setting_value(key: str, raw: str | int) -> int:
    if key not in LIVE_SETTINGS:
        known = ", ".join(sorted(LIVE_SETTINGS))
        raise SettingError(f"{key}: unknown setting (known: {known})")
    if isinstance(raw, bool):
        raise SettingError(f"{key}: expected an integer, got a boolean")
    if isinstance(raw, int):
        return raw
    text = str(raw).strip()
    try:
        return int(text, 10)
    except ValueError:
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise SettingError(f"{key}: expected an integer, got {shown!r}") from None


def validate_settings(
    updates: Mapping[str, str | int], current: Mapping[str, int]
) -> dict[str, int]:
    """Parse and check `updates` against `current` (the values in force). The checks use the
    merged result, so `hs_queue_depth=90 hs_min_ready=30` is judged as a pair."""
    parsed = {key: parse_setting_value(key, raw) for key, raw in updates.items()}
    merged = {**DEFAULT_SETTINGS, **current, **parsed}
    for key in parsed:
        spec = LIVE_SETTINGS[key]
        value = merged[key]
        upper = spec.maximum
        if spec.maximum_from is not None:
            upper = min(upper, merged[spec.maximum_from])
        if not spec.minimum <= value <= upper:
            bound = f"{spec.maximum_from}={upper}" if spec.maximum_from else str(upper)
            raise SettingError(f"{key}: {value} is out of range {spec.minimum}..{bound}")
    # A new depth may strand the current min-ready above it.
    dependant = [s for s in LIVE_SETTINGS.values() if s.maximum_from in parsed]
    for spec in dependant:
        if merged[spec.name] > merged[spec.maximum_from]:  # type: ignore[index]
            raise SettingError(
                f"{spec.maximum_from}: {merged[spec.maximum_from]} is below "  # type: ignore[index]
                f"{spec.name}={merged[spec.name]}; lower {spec.name} too"
            )
    return parsed


@dataclass(frozen=True)
class ControlFile:
    """control.json: a revision number the trainer acknowledges, and the wanted settings."""

    rev: int
    settings: Mapping[str, int]

    def to_json(self) -> str:
        return json.dumps({"v": SCHEMA_VERSION, "rev": self.rev, "settings": dict(self.settings)})


def decode_control(text: str) -> ControlFile | Rejected:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return Rejected("malformed_json", f"control.json: malformed JSON: {exc}")
    if not isinstance(obj, dict):
        return Rejected("not_object", "control.json: expected an object")
    if not _type_ok(obj.get("rev"), (int,)):
        return Rejected("wrong_type", "control.json: rev must be an integer")
    settings = obj.get("settings")
    if not isinstance(settings, dict):
        return Rejected("wrong_type", "control.json: settings must be an object")
    for key, value in settings.items():
        if key not in LIVE_SETTINGS:
            return Rejected("unknown_setting", f"control.json: unknown setting {key!r}")
        if not _type_ok(value, (int,)):
            return Rejected("wrong_type", f"control.json: {key} must be an integer")
    return ControlFile(obj["rev"], settings)


# ---------------------------------------------------------------------------------------
# Control-plane replies: every subcommand prints exactly one of these (tail and
# `gpus --follow` stream status lines / readings instead).

COMMANDS = ("launch", "stop", "restart", "status", "tail", "gpus", "set", "export", "eval")
# finished: completed its schedule (or ended by an error: `reason` says); stopped: ended by
# a signal (`stop`, a restart's stop), resumable; crashed: gone without a run_end;
# restarting: a `restart` holds the run dir's restart lock (between its two trainers).
RUN_STATES = (
    "running", "finished", "stopped", "crashed", "stalled", "not_started", "restarting",
)  # fmt: skip


@dataclass(frozen=True)
class Reply:
    command: str
    ok: bool
    data: Mapping[str, Any] = field(default_factory=dict)
    error_code: str | None = None
    error: str | None = None

    def to_json(self) -> str:
        record: dict[str, Any] = {"v": SCHEMA_VERSION, "command": self.command, "ok": self.ok}
        if not self.ok:
            record["error_code"] = self.error_code
            record["error"] = self.error
        record |= _finite_or_none(dict(self.data))
        return json.dumps(record, allow_nan=False)


def reply_ok(command: str, **data: Any) -> Reply:
    return Reply(command, True, data)


def reply_error(command: str, code: str, message: str, **data: Any) -> Reply:
    return Reply(command, False, data, code, message)


def decode_reply(text: str | bytes) -> Reply | Rejected:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return Rejected("empty", "no reply on stdout")
    try:
        obj = json.loads(lines[-1])
    except ValueError as exc:
        return Rejected("malformed_json", f"reply is not JSON: {exc}: {lines[-1][:200]!r}")
    if not isinstance(obj, dict):
        return Rejected("not_object", "reply is not a JSON object")
    if not _type_ok(obj.get("v"), (int,)) or obj["v"] > SCHEMA_VERSION:
        return Rejected("newer_version", f"reply schema {obj.get('v')!r} not understood")
    if not isinstance(obj.get("command"), str) or not isinstance(obj.get("ok"), bool):
        return Rejected("missing_field", "reply lacks command/ok")
    data = {k: v for k, v in obj.items() if k not in ("v", "command", "ok", "error", "error_code")}
    if obj["ok"]:
        return Reply(obj["command"], True, data)
    code, message = obj.get("error_code"), obj.get("error")
    if not isinstance(code, str) or not isinstance(message, str):
        return Rejected("missing_field", "failed reply lacks error_code/error")
    return Reply(obj["command"], False, data, code, message)
