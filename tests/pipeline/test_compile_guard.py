"""The module lock: while one thread runs modules (and may compile), no other does; a host
sync inside lets the others in and takes the lock back at the same depth."""

from __future__ import annotations

import threading

from dflash_train.model.compile_guard import ModuleLock


def test_held_excludes_other_threads_and_paused_lets_them_in() -> None:
    lock = ModuleLock()
    log: list[str] = []
    worker_waiting, worker_ran = threading.Event(), threading.Event()

    def worker() -> None:
        worker_waiting.set()
        with lock.held():
            log.append("worker runs")
        worker_ran.set()

    with lock.held(), lock.held():  # re-entrant: the drafter step, then the loss inside it
        thread = threading.Thread(target=worker)
        thread.start()
        assert worker_waiting.wait(5)
        assert not worker_ran.wait(0.2)  # blocked while the step holds the lock
        log.append("step runs")
        with lock.paused():  # the loss waits on the device: the worker may launch meanwhile
            assert lock.depth == 0
            assert worker_ran.wait(5)
        assert lock.depth == 2
        log.append("step again")
    thread.join(5)
    assert log == ["step runs", "worker runs", "step again"]
    assert lock.depth == 0


def test_paused_outside_held_does_nothing() -> None:
    lock = ModuleLock()
    with lock.paused():
        assert lock.depth == 0
    with lock.held():
        assert lock.depth == 1
