"""Says a compile after the warm-up, as it begins and when it has ended. A batch shape with no
graph yet compiles on the thread that meets it: a target worker (and with it the pool: 49 s
for a one-row batch of an fp8 target on an H100) or the drafter's step (its layers' stretches,
its flex attention). `watching` marks a call of one part on one shape. Dynamo's
start-of-compile callback, which runs on the compiling thread, tells the start hook as the
first compile inside such a call begins; dynamo's graph count, which rose during the call,
tells the end hook with the call's seconds. Module runs are serialised (compile_guard.GUARD),
so a graph made during a call is that call's."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)
# (part, what the message calls it, shape) -> None; the end hook gets the seconds too.
StartHook = Callable[[str, str, tuple[int, ...]], None]
EndHook = Callable[[str, str, tuple[int, ...], float], None]


class _Hooks:
    on_start: StartHook | None = None
    on_end: EndHook | None = None


# The part, name and shape of the call this thread is in, until its first compile.
_stretch = threading.local()


def _compile_started(*_args: Any) -> None:
    """Dynamo's start-of-compile callback. torch 2.5 calls it with no arguments, later
    releases with the compile's id."""
    what, hook = getattr(_stretch, "what", None), _Hooks.on_start
    if what is not None and hook is not None:
        _stretch.what = None  # once per call
        try:
            hook(*what)
        except Exception:  # an announcement that fails must not fail the compile, or the run
            log.exception("compile_watch: the start hook failed")


def set_hooks(on_start: StartHook | None = None, on_end: EndHook | None = None) -> None:
    """The hooks to tell (none: no more); the start one registered with dynamo while set."""
    import torch

    handler = torch._dynamo.callback_handler
    if _compile_started in handler.start_callbacks:
        handler.remove_start_callback(_compile_started)
    _Hooks.on_start, _Hooks.on_end = on_start, on_end
    if on_start is not None:
        handler.register_start_callback(_compile_started)


@contextmanager
def watching(part: str, what: str, shape: tuple[int, ...]) -> Iterator[None]:
    """A call of `part` on `shape` runs inside: a compile it makes is said (with no hooks,
    nothing is counted)."""
    on_end = _Hooks.on_end
    if _Hooks.on_start is None and on_end is None:
        yield
        return
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    start = time.perf_counter()
    outer = getattr(_stretch, "what", None)
    _stretch.what = (part, what, shape)
    try:
        yield
    finally:
        _stretch.what = outer
    if on_end is not None and counters["stats"]["unique_graphs"] > graphs:
        on_end(part, what, shape, time.perf_counter() - start)
