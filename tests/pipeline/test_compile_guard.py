"""The compile guard: while one thread may compile (exclusive), no other runs modules."""

from __future__ import annotations

import threading

from dflash_train.pipeline.compile_guard import CompileGuard


def test_exclusive_waits_for_other_shared_holders_and_blocks_new_ones() -> None:
    guard = CompileGuard()
    log: list[str] = []
    worker_in, release_worker, main_done = threading.Event(), threading.Event(), threading.Event()

    def worker() -> None:
        with guard.shared():
            log.append("worker runs")
            worker_in.set()
            release_worker.wait(5)
            log.append("worker done")
        main_done.wait(5)
        with guard.shared():  # after the compile, shared again
            log.append("worker again")

    thread = threading.Thread(target=worker)
    thread.start()
    assert worker_in.wait(5)
    with guard.shared():  # the drafter's step holds it shared ...
        upgraded = threading.Event()

        def release_later() -> None:
            log.append("release")
            release_worker.set()

        timer = threading.Timer(0.05, release_later)
        timer.start()
        with guard.exclusive():  # ... and upgrades for a compile: waits for the worker
            log.append("compile")
            upgraded.set()
        timer.join()
    main_done.set()
    thread.join(5)
    assert log == ["worker runs", "release", "worker done", "compile", "worker again"]


def test_worker_exclusive_and_drafter_upgrade_do_not_deadlock() -> None:
    guard = CompileGuard()
    order: list[str] = []
    main_in = threading.Event()

    def worker() -> None:
        main_in.wait(5)
        with guard.exclusive():  # an unseen batch signature: holds nothing, asks alone
            order.append("worker compile")

    thread = threading.Thread(target=worker)
    thread.start()
    with guard.shared():
        main_in.set()
        with guard.exclusive():  # nested upgrade while the worker waits
            order.append("drafter compile")
            with guard.exclusive():
                order.append("nested")
    thread.join(5)
    assert not thread.is_alive()
    assert order == ["drafter compile", "nested", "worker compile"]
