"""While `tail --follow` waits for lines, it watches the run lock: a trainer killed without
a run_end (SIGKILL, the OOM killer, a segfault) frees the lock at once, and the console
hears of it on the channel it already reads, as a `trainer_gone` marker, instead of after
a minute of silence. So does a run directory deleted under its trainer (the lock file goes
with it; the trainer notices and exits, writing nothing there)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from dflash_train import protocol
from dflash_train.rundir import lock_holder_pid, lock_is_held
from dflash_train.stream.reader import last_record, read_envelope, tail_lines

# A `stop` that escalated to SIGKILL writes the run_end for its trainer once the lock is
# free: give it that long before calling the trainer gone.
GRACE_S = 2.0
# The lock is probed at most this often, however fast lines come.
PROBE_EVERY_S = 0.5
# How far back the events appended after a run_end are looked through.
ENDED_TAIL_BYTES = 256 * 1024


class TrainerWatch:
    """`check()` answers the marker once the lock it saw held has been free for the grace
    period, and only when the stream's last line is not a run_end. A lock never seen held
    says nothing: a run that died before this tail started is the console's to ask
    `status` about (its silence dates from the history's end)."""

    def __init__(
        self,
        lock: Path,
        stream: Path,
        *,
        grace_s: float = GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lock = lock
        self.stream = stream
        self.grace_s = grace_s
        self.clock = clock
        self._free_since: float | None = None
        self._judged = True  # nothing to judge until a holder is seen
        self._probed_at = -PROBE_EVERY_S
        self._holder: int | None = None  # the pid the lock file named when seen held

    def saw_lines(self) -> None:
        """New lines came while following, not yet sent: while no holder has been seen,
        the lock is probed now, not at the next PROBE_EVERY_S, so a writer that took the
        lock after one probe and is killed (once its line has come) before the next is
        still seen alive. A writer without the lock (a test's synthetic stream) is not."""
        if self._judged and lock_is_held(self.lock):
            self._seen_held()
            self._probed_at = self.clock()

    def _seen_held(self) -> None:
        if self._judged or self._free_since is not None:  # a new spell: who holds it now
            self._holder = lock_holder_pid(self.lock)
        self._free_since, self._judged = None, False

    def check(self, last: tuple[str, int] | None = None) -> bytes | None:
        """`last`: the run and seq of the newest line the tail sent, for the marker when
        the stream went with its run directory."""
        now = self.clock()
        if now - self._probed_at < PROBE_EVERY_S:
            return None
        self._probed_at = now
        if lock_is_held(self.lock):
            self._seen_held()
            return None
        if self._free_since is None:
            self._free_since = now
        if self._judged or now - self._free_since < self.grace_s:
            return None
        self._judged = True  # one look per spell: a finished run's tail reads no more
        newest = last_record(self.stream)
        if newest is None:
            if last is None or self.stream.parent.exists():
                return None
            return protocol.trainer_gone_marker(*last, self._holder, run_dir_gone=True)
        if _ended(self.stream):
            return None
        # The pid seen holding the lock, not the file's pid now: a control-plane command that
        # took the lock for a moment after the trainer died leaves its own pid in the file.
        return protocol.trainer_gone_marker(newest.run, newest.seq, self._holder)


def _ended(stream: Path) -> bool:
    """Whether the stream's newest line other than an `event` is a run_end: the control
    plane appends events after a run's end (an evaluation by hand, a restart that failed),
    each under the run lock, and such a holder leaving is no trainer gone."""
    for raw in reversed(tail_lines(stream, ENDED_TAIL_BYTES)):
        env = read_envelope(raw)
        if env is not None and env.kind != "event":
            return env.kind == "run_end"
    return False
