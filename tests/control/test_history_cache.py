"""`tail --history` saves its summary beside the stream and the next attach continues it:
the same bytes as a summary from scratch, and the early stream is not read again. A saved
summary that no longer fits the stream (rotated, truncated, other points) is ignored, and
one that cannot be read or written changes nothing."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from control_harness import dflash_argv, write_stream
from test_control_history import _long_run

from dflash_train import protocol
from dflash_train.rundir import RunDir
from dflash_train.stream import summary_cache as history_cache
from dflash_train.stream.summary_cache import SAVE_AFTER_BYTES, cache_path
from dflash_train.stream.writer import StatusWriter

POINTS = "40"


def _history(run_dir: Path, points: str = POINTS) -> bytes:
    """The summary as sent; the history_end marker's own timestamp (when it was sent) is
    blanked so two attaches compare byte for byte."""
    done = subprocess.run(
        dflash_argv("tail", str(run_dir), "--history", points),
        capture_output=True,
        timeout=60,
        check=True,
    )
    body, marker = done.stdout.rstrip(b"\n").rsplit(b"\n", 1)
    assert b'"code":"history_end"' in marker
    return body + b"\n" + re.sub(rb'"t":[0-9.]+,', b'"t":0,', marker)


def _from_scratch(run_dir: Path, points: str = POINTS) -> bytes:
    """A full pass: with no saved summary (the pass saves a new one)."""
    status = RunDir.at(run_dir).status
    for saved in (cache_path(status, int(points)), history_cache.lines_path(status, int(points))):
        if saved.is_file():
            saved.unlink()
    return _history(run_dir, points)


def test_next_attach_continues_the_saved_summary(tmp_path: Path) -> None:
    status = RunDir.at(tmp_path).status
    lines = _long_run(3000)
    write_stream(status, "run-c", lines[:4000])
    first = _history(tmp_path)
    saved = cache_path(status, int(POINTS))
    assert saved.exists() and status.stat().st_size >= SAVE_AFTER_BYTES
    assert first == _from_scratch(tmp_path)

    write_stream(status, "run-c", lines[4000:])  # the run went on (same run, same file)
    resumed = _history(tmp_path)
    assert resumed == _from_scratch(tmp_path)  # byte for byte what a full pass gives
    assert b'"seq":0,' in resumed.split(b"\n", 1)[0]  # run_start kept, whole

    # Proof that the early stream was not read again: change a loss in its first lines
    # (same length, so the file's end and the saved offset still match) and the attach
    # still reports the value it summarised before.
    raw = status.read_bytes()
    at = raw.index(b'"loss":', 2000)
    end = raw.index(b",", at)
    forged = raw[:at] + b'"loss":' + b"7" * (end - at - len(b'"loss":')) + raw[end:]
    status.write_bytes(forged)  # rewritten in place: same inode
    assert _history(tmp_path) == resumed
    assert _from_scratch(tmp_path) != resumed  # a full pass does see the change


def test_a_saved_summary_that_no_longer_fits_is_ignored(tmp_path: Path) -> None:
    status = RunDir.at(tmp_path).status
    lines = _long_run(3000)
    write_stream(status, "run-a", lines)
    _history(tmp_path)
    assert cache_path(status, int(POINTS)).exists()

    # Replaced by a new run's longer stream (a new file): the old summary must not leak in.
    rotated = status.with_name("status.run-a.jsonl")
    os.replace(status, rotated)
    write_stream(status, "run-b", _long_run(3500))
    assert status.stat().st_size > rotated.stat().st_size
    fresh = _history(tmp_path)
    assert b"run-a" not in fresh and fresh == _from_scratch(tmp_path)

    # Cut short in place (same inode) and grown past the saved offset before the next
    # attach: the bytes before that offset are no longer the ones summarised.
    text = status.read_bytes()
    inode = status.stat().st_ino
    status.write_bytes(text[: text.rfind(b"\n", 0, len(text) // 3) + 1])
    write_stream(status, "run-b", [(k, {**f, "loss": 3.25} if k == "step" else f)
                                   for k, f in _long_run(4000)[1:]])  # fmt: skip
    assert status.stat().st_ino == inode and status.stat().st_size > len(text)
    assert _history(tmp_path) == _from_scratch(tmp_path)

    # Other points: a summary of its own.
    assert _history(tmp_path, "12") == _from_scratch(tmp_path, "12")
    assert cache_path(status, 12).exists()


def test_an_unusable_save_changes_nothing(tmp_path: Path) -> None:
    status = RunDir.at(tmp_path).status
    write_stream(status, "run-u", _long_run(3000))
    expected = _from_scratch(tmp_path)
    saved = cache_path(status, int(POINTS))
    saved.unlink()
    saved.mkdir()  # can be neither read nor replaced
    assert _history(tmp_path) == expected
    saved.rmdir()
    saved.write_text("{not json")
    assert _history(tmp_path) == expected
    assert saved.read_text() != "{not json"  # replaced by a good one
    saved.write_text('{"v": 1, "points": 40, "inode": 1, "offset": "x"}')
    assert _history(tmp_path) == expected


def test_the_writer_keeps_the_summary_current_so_a_first_attach_reads_only_the_tail(
    tmp_path: Path,
) -> None:
    status = RunDir.at(tmp_path).status
    lines = _long_run(3000)
    writer = StatusWriter(status, "run-k", summary_points=int(POINTS))
    for i, (kind, fields) in enumerate(lines):
        writer.write(kind, **{"t": 1000.0 + i * 0.001, **fields})
    writer.close()
    # Never attached, yet the summary beside the stream covers all of it.
    saved = history_cache.load(status, int(POINTS))
    assert saved is not None and saved.offset == status.stat().st_size
    first = _history(tmp_path)

    # Proof that this first attach did not read the stream the writer summarised: forge a
    # loss early on (same length, same inode) and the attach still reports the true one.
    raw = status.read_bytes()
    at = raw.index(b'"loss":', 2000)
    end = raw.index(b",", at)
    status.write_bytes(raw[:at] + b'"loss":' + b"7" * (end - at - len(b'"loss":')) + raw[end:])
    assert _history(tmp_path) == first
    status.write_bytes(raw)
    assert first == _from_scratch(tmp_path)  # and it is byte for byte a full pass

    # A resumed run (same run id) picks the saved summary up and goes on from it.
    writer = StatusWriter(status, "run-k", summary_points=int(POINTS))
    more = _long_run(3400)[6001:]
    for i, (kind, fields) in enumerate(more):
        writer.write(kind, **{"t": 2000.0 + i * 0.001, **fields})
    writer.close()
    assert history_cache.load(status, int(POINTS)).offset == status.stat().st_size  # type: ignore[union-attr]
    assert _history(tmp_path) == _from_scratch(tmp_path)

    # Written on after the last save (a writer without the summary): the attach sends the
    # saved lines, then those new lines whole, and its marker's cursor is the newest seq.
    writer = StatusWriter(status, "run-k", summary_points=int(POINTS))
    for kind, fields in _long_run(20)[1:]:  # (a full pass removed the saved lines)
        writer.write(kind, **fields)
    writer.close()
    kept = _history(tmp_path)
    assert history_cache.load_lines(status, int(POINTS)) is not None
    newest = protocol.decode_line(status.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1])
    last = write_stream(status, "run-k", _long_run(40)[1:])
    sent = _history(tmp_path).split(b"\n")
    assert sent[: kept.count(b"\n")] == kept.split(b"\n")[:-1]
    tail = [protocol.decode_line(line) for line in sent[kept.count(b"\n") : -1]]
    assert len(tail) == len(_long_run(40)) - 1 and not any(t.get("history") for t in tail)
    assert f'"cursor":{last},'.encode() in sent[-1]
    # The marker dates the newest line, the one sent whole after the saved lines.
    assert protocol.decode_line(sent[-1]).get("last_t") == tail[-1].t
    # And the attach of the saved lines alone dated the newest line they covered.
    assert protocol.decode_line(kept.split(b"\n")[-1]).get("last_t") == newest.t


def test_a_save_does_not_recreate_a_run_dir_deleted_while_it_serialises(
    tmp_path: Path,
) -> None:
    """The orphaned-trainer race: the stream was open for the check, then the operator's
    `rm -r` removed the run dir while the summary was being serialised."""
    import shutil

    from dflash_train.stream.summary import HistorySummary

    run_dir = tmp_path / "run"
    status = RunDir.at(run_dir).status
    write_stream(status, "run-d", _long_run(50))

    class DeletedMeanwhile(HistorySummary):
        def state(self) -> dict[str, object]:
            shutil.rmtree(run_dir)
            return super().state()

    summary = DeletedMeanwhile(int(POINTS))
    inode = status.stat().st_ino
    assert not history_cache.save(status, summary, status.stat().st_size, inode)
    assert not run_dir.exists()
