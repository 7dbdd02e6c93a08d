"""Progress lines on stderr: plain lines with done/total, figures and ETA when stderr is no
terminal; a tqdm bar on a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import io
import os
import struct
import termios

from dflash_train.pipeline.progress_line import ProgressLine, duration, step_figures


class Clock:
    """Seconds the test says have passed."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_carry_done_total_figures_and_the_time_left() -> None:
    out, clock = io.StringIO(), Clock()
    line = ProgressLine("step", 100, stream=out, clock=clock)
    line.update(10, "loss 5.0000")
    clock.now += 30.0  # 20 steps in 30 s: 70 left take 105 s
    line.update(30, step_figures({"loss": 4.25, "acc": 0.5, "ktok_s": 12.34}))
    assert out.getvalue().splitlines() == [
        "step 10/100  loss 5.0000  ETA —",
        "step 30/100  loss 4.2500  acc 0.500  12.3 Ktok/s  ETA 1m 45s",
    ]
    assert step_figures({"loss": None, "acc": None, "ktok_s": 1.0}) == ("loss —  acc —  1.0 Ktok/s")
    assert [duration(s) for s in (5, 65, 3 * 3600 + 120)] == ["5s", "1m 05s", "3h 02m"]


def test_a_terminal_gets_a_tqdm_bar() -> None:
    master, slave = os.openpty()
    # A terminal of 100 columns (a fresh pty has none, and tqdm would draw nothing).
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with os.fdopen(slave, "w") as tty:
        line = ProgressLine("step", 10, stream=tty)
        line.update(3, "loss 1.2345")
        line.close()
    # The pty hands bytes over asynchronously (a loaded machine showed one read getting only the
    # bar's first draw): read until the closed end is drained, which the master answers with EIO.
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    shown = b"".join(chunks).decode()
    assert "step" in shown and "3/10" in shown and "loss 1.2345" in shown
    assert "\r" in shown  # redrawn in place, not one line per update
