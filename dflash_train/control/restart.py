"""Restart a run from its recorded config (RUN_DIR/config.json): apply the overrides (any
option), check the whole new config and, on resume, the checkpoint it would load (a bad
override or an incompatible checkpoint stops nothing), stop the trainer, then start the new
config, resuming the run's own newest checkpoint under the same run id, or from scratch under
a new one (`fresh`), which leaves the old run's checkpoints and export in place."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from dflash_train import protocol
from dflash_train.checkpoint import layout as checkpoint_layout
from dflash_train.checkpoint.store import recorded_run
from dflash_train.config import ConfigError, TrainConfig
from dflash_train.config.cli_options import config_args
from dflash_train.control.launch import (
    REDACTED,
    ControlBusy,
    control_guard,
    load_env_file,
    start_verified,
)
from dflash_train.control.preflight import PreflightError
from dflash_train.control.run_config import (
    OverrideError,
    carried_settings,
    changed_options,
    override_values,
    recorded_config,
    restarted_config,
    with_values,
)
from dflash_train.control.stop import stop_run
from dflash_train.rundir import LockHeld, RunDir, RunLock, lock_is_held, read_json
from dflash_train.stream.append import append_line


def restart_run(
    run_dir: RunDir,
    *,
    fresh: bool,
    sets: Mapping[str, str],
    extra_args: Sequence[str],
    env: Mapping[str, str],
    wait_s: float,
    stop_timeout_s: float,
    allow_busy: bool = False,
    min_free_bytes: int | None = None,
    env_file: str | None = None,
) -> protocol.Reply:
    record = read_json(run_dir.run_json)
    if not isinstance(record, dict) or not isinstance(record.get("train_args"), list):
        return protocol.reply_error(
            "restart", "no_record", f"run_dir: {run_dir.run_json} is missing: nothing to restart"
        )
    old_id = record.get("run_id")
    run_id = old_id if not fresh and isinstance(old_id, str) else uuid.uuid4().hex[:12]
    # Secrets were never written down: they must be given again.
    recorded_env = record.get("env") if isinstance(record.get("env"), dict) else {}
    kept = {k: str(v) for k, v in recorded_env.items() if v != REDACTED}
    dropped = sorted(k for k, v in recorded_env.items() if v == REDACTED and k not in env)
    new_env = {**kept, **env}
    new_env.pop("DFLASH_RUN_ID", None)
    # The env file is named again, never copied: its secrets are read afresh on the box.
    recorded_file = record.get("env_file")
    env_file = env_file or (recorded_file if isinstance(recorded_file, str) else None)
    try:
        environ = {**(load_env_file(env_file) if env_file else {}), **new_env}
        base = recorded_config(run_dir, record, environ)
        owned = {"run_id": run_id, "resume_from": None, "output_dir": str(run_dir.root)}
        overrides = override_values(sets, extra_args)
        carried = carried_settings(run_dir, old_id, base, overrides)
        new = restarted_config(base, overrides, environ=environ, owned=owned, carried=carried)
    except OverrideError as exc:  # a bad override stops nothing
        return protocol.reply_error("restart", exc.code, exc.message)
    except PreflightError as exc:
        return protocol.reply_error("restart", exc.code, exc.message)
    except ConfigError as exc:
        return protocol.reply_error("restart", "bad_record", f"recorded config: {exc}")
    recorded_resume = base.config.run.resume_from
    explicit = None if recorded_resume in (None, "latest") else recorded_resume
    if not fresh and isinstance(old_id, str):
        refusal = _check_resumable(run_dir, old_id, new.config, base.config, explicit)
        if refusal is not None:
            return refusal
    root = run_dir.checkpoints
    try:
        # The restart lock, from before the stop until the new trainer is verified: the
        # old trainer's run_end then says `restarting`, so every console reads RESTARTING
        # (not STOPPED) for the pass between the two trainers.
        with control_guard(run_dir), RunLock(run_dir.restart_lock):
            stopped: dict[str, Any] | None = None
            if lock_is_held(run_dir.lock):
                stop = stop_run(run_dir, timeout_s=stop_timeout_s)
                if not stop.ok:
                    return protocol.reply_error(
                        "restart", stop.error_code or "stop_failed", stop.error or "", **stop.data
                    )
                stopped = dict(stop.data)
            if fresh and isinstance(old_id, str):
                # The old run's export joins its checkpoints, where run.json names it.
                checkpoint_layout.set_aside_export(run_dir.root, run_id, owner_hint=old_id)
            # Looked up after the stop: a trainer checkpoints on SIGTERM. Only this run's
            # own checkpoints count; a run started from another run's checkpoint (an
            # explicit --resume-from PATH) that has none of its own yet starts there again.
            resume = None if fresh else checkpoint_layout.newest_of_run(root, run_id)
            resume_from = "latest" if resume is not None else None
            if resume is None and not fresh and explicit is not None:
                resume = checkpoint_layout.resolve_resume(explicit, root, run_id)
                resume_from = explicit
            new = with_values(new, "restart", resume_from=resume_from)
            args = config_args(new.config)
            launched = start_verified(
                run_dir,
                args,
                env=new_env,
                wait_s=wait_s,
                allow_busy=allow_busy,
                min_free_bytes=min_free_bytes,
                env_file=env_file,
                config=new,
            )
            if not launched.ok and stopped is not None:
                _say_restart_failed(run_dir, launched)
    except ControlBusy as exc:
        return protocol.reply_error("restart", "busy", str(exc))
    except LockHeld as exc:  # a restarter that got past control_guard cannot meet one
        return protocol.reply_error("restart", "busy", str(exc))
    layout = checkpoint_layout.run_layout(run_dir.root, run_id)
    previous = None
    if fresh and isinstance(old_id, str):
        previous = checkpoint_layout.run_summary(run_dir.root, old_id)
    data = {
        **launched.data,
        "stopped": stopped,
        "resumed_from": str(resume) if resume else None,
        "resumed_run": recorded_run(resume) if resume else None,
        "fresh": fresh,
        # Where the run that a fresh start left behind keeps its checkpoints and export.
        "previous_run": previous,
        "checkpoints": layout["checkpoints"],
        "changed": changed_options(new, base, carried),
        # Live values set on the box (`set`) that the new start keeps, over the record.
        "carried": {k: {"from": base.config.get(k), "to": v} for k, v in carried.items()},
        "train_args": args,
        "env_dropped": dropped,
    }
    if not launched.ok:
        return protocol.reply_error(
            "restart", launched.error_code or "launch_failed", launched.error or "", **data
        )
    return protocol.reply_ok("restart", **data)


def _say_restart_failed(run_dir: RunDir, launched: protocol.Reply) -> None:
    """The old trainer's run_end said a restart was under way; the new trainer did not
    come up. Said in the stream (no trainer writes it now), so every console leaves
    RESTARTING for STOPPED and alerts, not only the one that asked for the restart."""
    why = launched.error or launched.error_code or "the new trainer did not start"
    fields = {
        "level": "error",
        "code": protocol.RESTART_FAILED,
        "message": f"restart failed: {why}"[:500],
        "error_code": launched.error_code,
    }
    with contextlib.suppress(LockHeld):  # a trainer holds it after all: it is no failure
        append_line(run_dir, "event", fields)


def _check_resumable(
    run_dir: RunDir,
    run_id: str,
    new: TrainConfig,
    recorded: TrainConfig,
    explicit: str | None,
) -> protocol.Reply | None:
    """Refuse (before anything is stopped) a resume whose checkpoint was trained with
    another shape than the new config, or is already at its max_steps (a restart of a
    completed run that kept the limit would start a trainer that trains nothing). With no
    checkpoint yet, the live run's recorded config stands for the one it will write on
    SIGTERM."""
    wanted = checkpoint_layout.facts_from_config(new)
    candidate = checkpoint_layout.newest_of_run(run_dir.checkpoints, run_id)
    try:
        if candidate is None and explicit is not None:
            candidate = checkpoint_layout.resolve_resume(explicit, run_dir.checkpoints, run_id)
        if candidate is not None:
            saved = checkpoint_layout.checkpoint_facts(candidate)
            what = f"checkpoint {candidate}"
        else:
            saved = checkpoint_layout.facts_from_config(recorded)
            what = f"run {run_id} (no checkpoint yet; its next one)"
        checkpoint_layout.check_compatible(what, saved, wanted)
        if candidate is not None and (
            done := checkpoint_layout.nothing_to_train(candidate, new.optimiser.max_steps)
        ):
            return protocol.reply_error("restart", "nothing_to_train", done, run_id=run_id)
    except checkpoint_layout.IncompatibleCheckpoint as exc:
        return protocol.reply_error(
            "restart", "incompatible_checkpoint", str(exc), field=exc.field, run_id=run_id
        )
    except ValueError as exc:
        return protocol.reply_error("restart", "bad_checkpoint", f"resume: {exc}", run_id=run_id)
    return None
