"""The console's no-UI pieces behind alerts, filters, the GPU source and reply lines."""

from __future__ import annotations

import pytest

from dflash_train import protocol
from dflash_train.protocol import StatusLine
from dflash_tui.screens.reply import describe_reply, reply_line
from dflash_tui.sources.alerts import AlertTracker, osc_notification
from dflash_tui.sources.gpu_source import GpuSourcePicker
from dflash_tui.sources.line_filter import FilterError, LineFilter
from dflash_tui.sources.profiles import ProfileError, parse_profile
from dflash_tui.widgets.header import HeaderFacts, render_header


def line(kind: str, run: str = "r1", t: float = 0.0, **fields: object) -> StatusLine:
    decoded = protocol.decode_line(protocol.encode_line(kind, seq=1, run=run, t=t, **fields))
    assert isinstance(decoded, StatusLine)
    return decoded


def nonfinite(run: str = "r1", **extra: object) -> StatusLine:
    return line("event", run, level="error", code="nonfinite_step", message="nan", **extra)


def test_history_never_alerts_and_a_new_run_rearms_its_causes() -> None:
    tracker = AlertTracker(clock=lambda: 0.0)
    assert tracker.on_line(nonfinite(history=True)) is None  # the past, summarised
    assert tracker.on_line(nonfinite()) is not None
    assert tracker.on_line(nonfinite()) is None
    assert tracker.badge == "nan_steps"
    assert tracker.on_line(nonfinite(run="r2")) is not None  # another run: its own alert
    tracker.acknowledge()
    assert tracker.badge is None


def test_a_lost_connection_needs_a_minute_and_a_connection_first() -> None:
    tracker = AlertTracker(clock=lambda: 0.0)
    assert tracker.check("not_started", "reconnecting", 0) == []
    assert tracker.check("not_started", "reconnecting", 500) == []  # never connected
    assert tracker.check("running", "connected", 500) == []
    assert tracker.check("running", "no_run", 600) == []  # an answer, not a lost line
    assert tracker.check("running", "reconnecting", 700) == []
    assert tracker.check("running", "reconnecting", 759) == []
    (alert,) = tracker.check("running", "reconnecting", 760)
    assert alert.cause == "connection_lost" and "60 s" in alert.text
    assert tracker.check("running", "reconnecting", 900) == []


def test_desktop_notification_escapes_plain_and_through_tmux() -> None:
    plain = osc_notification("dflash: run crashed", "exit 1;\nboom\x07", in_tmux=False)
    assert plain == (
        "\x1b]9;dflash: run crashed: exit 1; boom\x07"
        "\x1b]777;notify;dflash: run crashed;exit 1, boom\x07"
    )
    wrapped = osc_notification("t", "b", in_tmux=True)
    assert wrapped.startswith("\x1bPtmux;\x1b\x1b]9;t: b\x07") and wrapped.endswith("\x1b\\")
    assert "\x1b]" not in wrapped.replace("\x1b\x1b]", "")  # every inner ESC is doubled


def test_filter_plain_ignores_case_and_regex_after_re() -> None:
    assert LineFilter.parse("warn").select(["WARNING x", "step 1"]) == ["WARNING x"]
    assert LineFilter.parse(r"re:^step \d$").select(["step 1", "step 10"]) == ["step 1"]
    assert LineFilter.parse("re:").select(["a"]) == ["a"]
    with pytest.raises(FilterError, match="invalid pattern"):
        LineFilter.parse("re:(")


def test_gpu_source_follows_the_monitor_tick_and_keeps_roles() -> None:
    now = [100.0]
    picker = GpuSourcePicker(clock=lambda: now[0])
    gpus = [{"index": 0, "role": "drafter", "util": 50.0}]
    for t in (0.0, 2.0, 4.0, 6.0, 8.0, 10.0):  # a 2 s monitor, not the default 5 s
        picker.trainer_reading(line("gpu", t=t, available=True, gpus=gpus))
    box = line("gpu", run="gpus", available=True, gpus=[{"index": 0, "role": "", "util": 0.0}])
    now[0] += 6  # two 5 s ticks have not passed, but three 2 s ticks have
    shown = picker.box_reading(box, run_live=True)
    assert shown is not None and shown["gpus"][0]["role"] == "drafter"
    view = picker.view(now[0] + 1)
    assert view.describe() == "box `gpus --follow` · 1 s old (trainer silent 7 s)"


def test_header_links_the_wandb_run() -> None:
    colours = dict.fromkeys(("primary", "secondary", "accent", "warning", "error", "success"), "")
    url = "https://wandb.ai/team/dflash/runs/1f900d3a"
    facts = HeaderFacts("box", "runs/x", "1f900d3a", "running", False, False, None, None,
                        None, None, None, None, None, wandb_url=url)  # fmt: skip
    text = render_header(facts, colours, 160)
    assert f"W&B {url}" in text.plain
    assert any(f"link {url}" in str(span.style) for span in text.spans)


def test_replies_read_as_words_never_reprs() -> None:
    restart = protocol.reply_ok(
        "restart", message="restarted: resumed from step 73 in 5.4 s, run 1f900d3a, pid 9569",
        stopped={"run_id": "1f900d3a", "pid": 9000}, train_args=["--lr", "1e-4"],
        env_dropped=[], run_id="1f900d3a", pid=9569, resumed_from="/r/step_0000073",
    )  # fmt: skip
    assert reply_line(restart) == "restarted: resumed from step 73 in 5.4 s, run 1f900d3a, pid 9569"
    failed = protocol.reply_error("set", "out_of_range", "hs_min_ready: 9 is out of range 1..8",
                                  current={"hs_min_ready": 2, "hs_queue_depth": 8})  # fmt: skip
    headline, facts, _ = describe_reply(failed)
    assert headline == "set failed: hs_min_ready: 9 is out of range 1..8"
    assert "current: hs_min_ready=2, hs_queue_depth=8" in facts
    for text in (*describe_reply(restart), *describe_reply(failed)):
        assert "{" not in text and "[" not in text and "'" not in text


def test_profile_alerts_are_checked() -> None:
    assert parse_profile("p", {"alerts": ["bell", "osc"]}).alerts == ("bell", "osc")
    with pytest.raises(ProfileError, match=r"profiles.p.alerts: 'beep' is not one of"):
        parse_profile("p", {"alerts": ["beep"]})
    assert parse_profile("p", {"env_file": "/root/.config/dflash/env"}).env_file


def test_a_silent_stream_is_a_stall_only_while_the_box_says_the_trainer_lives() -> None:
    tracker = AlertTracker(clock=lambda: 0.0)
    tracker.on_connection("connected")
    assert tracker.check("stalled", "connected", 10) == []  # not yet asked
    tracker.on_status(protocol.reply_ok("status", state="stalled", run_id="r1"))
    (stall,) = tracker.check("stalled", "connected", 11)
    assert stall.cause == "stall"
    dead = AlertTracker(clock=lambda: 0.0)
    dead.on_connection("connected")
    crash = dead.on_status(protocol.reply_ok("status", state="crashed", run_id="r1",
                                             log_tail=["Killed"]))  # fmt: skip
    assert crash is not None and crash.cause == "crash" and "train.log: Killed" in crash.text
    assert dead.check("stalled", "connected", 20) == []  # one alert for one cause


def test_a_restart_under_the_same_run_id_clears_the_crash() -> None:
    tracker = AlertTracker(clock=lambda: 0.0)
    assert tracker.on_line(line("run_end", reason="error", exit_code=1)) is not None
    assert tracker.badge == "crashed"
    start = {"config": {}, "topology": {}, "dataset": {}, "batches_per_epoch": 1,
             "total_steps": 9, "pid": 1, "host": "h"}  # fmt: skip
    tracker.on_line(line("run_start", history=True, **start))
    assert tracker.badge == "crashed"  # the summary of the past is no restart
    tracker.on_line(line("run_start", **start))
    assert tracker.badge is None
    assert tracker.on_line(line("run_end", reason="error", exit_code=1)) is not None
