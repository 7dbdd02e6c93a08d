"""Replay of a finished run: every line of a status stream (kept raw, decoded again when
applied), and the RunState at any line rebuilt from the nearest snapshot, so a time cursor
moves both ways without keeping a state per line. A ReplaySession can read the stream from
the box but has no way to send a control command."""

from __future__ import annotations

import bisect
import pickle
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dflash_train import protocol
from dflash_train.protocol import Reply, StatusLine
from dflash_tui.sources.session import ReadOnlyError, Session, check_inert
from dflash_tui.sources.state import RunState
from dflash_tui.sources.transport import Transport

KINDS = tuple(protocol.KINDS)
# What `[` and `]` jump between: the moments an operator looks for in a finished run.
MARK_KINDS = frozenset({"run_start", "checkpoint", "event", "run_end"})
PROGRESS_KINDS = frozenset({"step", "prepare"})
# Snapshots of the state: at most this many, at least this many lines apart.
MAX_SNAPSHOTS = 24
MIN_SNAPSHOT_GAP = 256
FINE_PER_GAP = 8
LOAD_TIMEOUT_S = 600.0


class ReplayError(ValueError):
    """The stream cannot be replayed; one line saying why."""


class ReplayClock:
    """The replay's 'now': the time of the line at the cursor. RunState stamps arrivals with
    it, so ages and stalls read as they did at that moment of the run."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Timeline:
    """The whole stream and a cursor on it. `seek(i)` makes `state` the RunState after line
    `i` (0-based) was applied. Building one walks the stream once, to its end."""

    def __init__(
        self,
        raws: Sequence[bytes],
        *,
        clock: ReplayClock | None = None,
        make_state: Callable[[ReplayClock], RunState] | None = None,
    ) -> None:
        self._raw: list[bytes] = []
        self._kind = array("b")
        self._t = array("d")
        self._seq = array("q")
        self.rejected: Counter[str] = Counter()
        self.clock = clock or ReplayClock()
        self._make_state = make_state or (lambda clock: RunState(clock=clock))
        # Coarse snapshots over the whole stream; fine ones inside the stretch last walked
        # backwards, so stepping back line by line replays a few hundred lines, not thousands.
        self._gap = max(MIN_SNAPSHOT_GAP, len(raws) // MAX_SNAPSHOTS + 1)
        self._fine_gap = max(MIN_SNAPSHOT_GAP // 4, self._gap // FINE_PER_GAP)
        self._snapshots: dict[int, bytes] = {}
        self._fine: dict[int, bytes] = {}
        self.state = self._make_state(self.clock)
        for raw in raws:
            decoded = protocol.decode_line(raw)
            if not isinstance(decoded, StatusLine):
                self.rejected[decoded.code] += 1
                continue
            if decoded.kind not in KINDS:
                continue
            self._raw.append(bytes(raw))
            self._kind.append(KINDS.index(decoded.kind))
            self._t.append(decoded.t)
            self._seq.append(decoded.seq)
            self._apply(len(self._raw) - 1, decoded)  # the first walk decodes only once
        if not self._raw:
            raise ReplayError("the stream holds no status line to replay")
        self.state.rejected_lines.update(self.rejected)
        self.position = self.end

    def __len__(self) -> int:
        return len(self._raw)

    def line(self, index: int) -> StatusLine:
        decoded = protocol.decode_line(self._raw[index])
        assert isinstance(decoded, StatusLine)  # it decoded when it was loaded
        return decoded

    def kind(self, index: int) -> str:
        return KINDS[self._kind[index]]

    def time(self, index: int) -> float:
        return self._t[index]

    def seq(self, index: int) -> int:
        return self._seq[index]

    @property
    def end(self) -> int:
        return len(self._raw) - 1

    def _apply(self, index: int, line: StatusLine, *, fine: bool = False) -> None:
        self.clock.t = self._t[index]
        self.state.apply(line)
        if index % self._gap == 0 and index not in self._snapshots:
            self._snapshots[index] = self._freeze()
        elif fine and index % self._fine_gap == 0 and index not in self._fine:
            self._fine[index] = self._freeze()

    def seek(self, index: int) -> RunState:
        index = max(0, min(self.end, index))
        base = self._nearest(index)
        backwards = index < self.position
        if backwards or (base is not None and base > self.position):
            self._restore(base, backwards)
        for i in range(self.position + 1, index + 1):
            self._apply(i, self.line(i), fine=backwards)
        self.position = index
        self.clock.t = self._t[index]
        return self.state

    def _nearest(self, index: int) -> int | None:
        marks = sorted([*self._snapshots, *self._fine])
        at = bisect.bisect_right(marks, index) - 1
        return marks[at] if at >= 0 else None

    def _freeze(self) -> bytes:
        state = self.state
        state.clock = None  # type: ignore[assignment]  # the clock is shared, not copied
        try:
            return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            state.clock = self.clock

    def _restore(self, base: int | None, backwards: bool) -> None:
        if backwards and base in self._snapshots:
            # A new stretch walked backwards: the fine snapshots of the last one go.
            self._fine = {i: b for i, b in self._fine.items() if base <= i < base + self._gap}
        if base is None:
            state = self._make_state(self.clock)
            self.position = -1
        else:
            state = pickle.loads(self._snapshots.get(base) or self._fine[base])
            state.clock = self.clock
            self.position = base
        state.rejected_lines = Counter(self.rejected)
        self.state = state

    # -- moving the cursor ---------------------------------------------------------------

    def _find(self, kinds: frozenset[str], start: int, step: int) -> int | None:
        wanted = {KINDS.index(k) for k in kinds if k in KINDS}
        i = start
        while 0 <= i <= self.end:
            if self._kind[i] in wanted:
                return i
            i += step
        return None

    def next_step(self, direction: int) -> int:
        """The index of the next (+1) or previous (-1) step line from the cursor, or a
        prepare's progress line (a prepare has no steps: ←/→ jumped from its first line to
        its last); the stream's first or last line when there is none."""
        found = self._find(PROGRESS_KINDS, self.position + direction, direction)
        if found is None:
            return self.end if direction > 0 else 0
        return found

    def next_mark(self, direction: int) -> int:
        """The next or previous checkpoint, event, run start or run end."""
        found = self._find(MARK_KINDS, self.position + direction, direction)
        if found is None:
            return self.end if direction > 0 else 0
        return found


def read_stream_file(path: Path) -> list[bytes]:
    """The complete lines of a status stream on this machine (a line still being written,
    without its newline, is left out)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReplayError(f"{path}: cannot read: {exc.strerror or exc}") from None
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: empty, or a partial line
    return [line for line in lines if line.strip()]


def stream_path(target: Path) -> Path:
    """The stream a local replay reads: RUN_DIR/status.jsonl, or the .jsonl file given (a
    rotated `status.<run_id>.jsonl` too)."""
    if target.is_dir():
        return target / "status.jsonl"
    if target.suffix == ".jsonl":
        return target
    raise ReplayError(f"{target}: neither a run directory nor a .jsonl status stream")


class ReplaySession(Session):
    """A Session that only reads: it fetches the whole stream once (`load`) and refuses
    every control call before anything reaches the transport, whatever the caller says."""

    def __init__(
        self,
        transport: Transport,
        *,
        run_dir: str,
        stream_file: Path | None = None,
        stream_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs["read_only"] = True
        super().__init__(transport, run_dir=run_dir, **kwargs)
        self.stream_file = stream_file  # a stream on this machine
        self.stream_name = stream_name  # a rotated stream in the box's run dir

    @property
    def read_only(self) -> bool:
        return True

    async def load(self) -> list[bytes]:
        """Every complete line of the stream: from the local file, or through the box's
        `tail` without --follow (over SSH or a local subprocess), of RUN_DIR/status.jsonl
        or of the rotated stream named."""
        if self.stream_file is not None:
            return read_stream_file(self.stream_file)
        argv = [*self.trainer, "tail", self.run_dir, "--from-seq", "-1"]
        if self.stream_name is not None:
            argv += ["--stream", check_inert("stream", self.stream_name)]
        lines: list[bytes] = []
        refusal: str | None = None
        # A TransportError (HostKeyUnknown among them) goes up as it is: the app offers
        # to trust an unknown host key, as for a live console.
        async with self.transport.stream(argv) as stream:
            async for raw in stream:
                if not isinstance(protocol.decode_line(raw), StatusLine):
                    # A tail that cannot start says why in a JSON reply.
                    reply = protocol.decode_reply(raw)
                    if isinstance(reply, Reply) and not reply.ok:
                        refusal = reply.error
                        continue
                lines.append(raw)
            end = stream.end
        if refusal is not None:
            raise ReplayError(refusal)
        if end is not None and end.returncode not in (0, None):
            why = end.stderr_tail.decode("utf-8", "replace").strip().splitlines()
            raise ReplayError(
                f"tail failed (exit {end.returncode})" + (f": {why[-1]}" if why else "")
            )
        return lines

    def _refuse(self, action: str) -> ReadOnlyError:
        return ReadOnlyError(f"{action}: a replay cannot send control commands")

    def _require_control(self, action: str) -> None:
        raise self._refuse(action)

    async def _call(self, command: str, argv: Sequence[str], timeout: float) -> Reply:
        # Every command the Session would send goes through here: a replay sends none,
        # whatever method a later change adds.
        raise self._refuse(command)

    async def launch(self, train_args: Sequence[str], **_: Any) -> Reply:
        raise self._refuse("launch")

    async def stop(self, timeout: float = 60) -> Reply:
        raise self._refuse("stop")

    async def restart(self, **_: Any) -> Reply:
        raise self._refuse("restart")

    async def set_setting(self, key: str, value: str) -> Reply:
        raise self._refuse("set")

    async def follow(self) -> None:
        """A replay follows nothing: the stream was read whole by `load`."""
        return None

    async def follow_gpus(self, interval: float = 2.0) -> None:
        return None
