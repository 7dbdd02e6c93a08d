"""Says a compile as it begins. After the warm-up, a batch shape with no graph yet compiles on
the thread that meets it: a target worker (and with it the pool: 49 s for a one-row batch of
an fp8 target on an H100) or the drafter's step. The graph counters tell when such a compile
has ended (the `compiled` events); dynamo's start-of-compile callback, which runs on the
compiling thread, tells when it begins. `watching` marks a stretch of the calling thread as
one part's call on one shape; the hook hears of the first compile inside it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)
# (part, what the message calls it, shape) -> None
StartHook = Callable[[str, str, tuple[int, ...]], None]


class _Hook:
    on_start: StartHook | None = None


# The part, name and shape of the call this thread is in, until its first compile.
_stretch = threading.local()


def _compile_started(*_args: Any) -> None:
    """Dynamo's start-of-compile callback. torch 2.5 calls it with no arguments, later
    releases with the compile's id."""
    what, hook = getattr(_stretch, "what", None), _Hook.on_start
    if what is not None and hook is not None:
        _stretch.what = None  # once per call
        try:
            hook(*what)
        except Exception:  # an announcement that fails must not fail the compile, or the run
            log.exception("compile_watch: the start hook failed")


def set_start_hook(hook: StartHook | None) -> None:
    """The hook to tell (None: no more), registered with dynamo while it is set."""
    import torch

    handler = torch._dynamo.callback_handler
    if _compile_started in handler.start_callbacks:
        handler.remove_start_callback(_compile_started)
    _Hook.on_start = hook
    if hook is not None:
        handler.register_start_callback(_compile_started)


@contextmanager
def watching(part: str, what: str, shape: tuple[int, ...]) -> Iterator[None]:
    """A call of `part` on `shape` runs inside: a compile it starts is said as it begins."""
    if _Hook.on_start is None:
        yield
        return
    outer = getattr(_stretch, "what", None)
    _stretch.what = (part, what, shape)
    try:
        yield
    finally:
        _stretch.what = outer
