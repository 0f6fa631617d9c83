"""A bound on the time a user's code may run in this process (a chat template's Jinja, which
can loop without end): `deadline(seconds)` raises `TimedOut` where it is exceeded. It uses
SIGALRM, so it bounds only on the main thread of a Unix process; elsewhere it does not bound,
and says so in `Deadline.bounded`."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

TEMPLATE_SECONDS = 10  # a chat template's render; one that runs longer loops without end
TEMPLATE_LOOPS = (  # said where a render ran past it
    f"base_models[0]: the chat template took over {TEMPLATE_SECONDS} s to render a "
    "conversation (a loop without end for some conversations?); fix the template (the "
    "manifest's chat_template file, or the base model's)"
)


class TimedOut(BaseException):  # noqa: N818 - read as `except TimedOut`
    """The code under a deadline ran past it. Not an Exception: code that takes any error of
    a user's template for its verdict on one row (and goes on to the next) lets it through."""


@dataclass
class Deadline:
    """Whether the time was bounded, and whether it ran out (the code may have caught
    `TimedOut` and raised something else: `expired` still says so)."""

    bounded: bool
    expired: bool = False


_RUNNING = [0]  # deadlines running on the main thread now


def within(seconds: float) -> AbstractContextManager[Deadline | None]:
    """`deadline(seconds)`, or nothing where a deadline runs already (a build's batch: its
    bound covers the block, and each render's own would cost ~10 us against ~30-250 us)."""
    return nullcontext() if _RUNNING[0] else deadline(seconds)


@contextmanager
def deadline(seconds: float) -> Iterator[Deadline]:
    """Raise `TimedOut` in the block when it runs over `seconds` (main thread, Unix only;
    an outer timer is restored after)."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield Deadline(bounded=False)
        return
    state = Deadline(bounded=True)

    def ran_out(signum: int, frame: object) -> None:
        state.expired = True
        raise TimedOut(f"over {seconds:g} s")

    began = time.monotonic()
    earlier = signal.signal(signal.SIGALRM, ran_out)
    outer = signal.setitimer(signal.ITIMER_REAL, seconds)
    _RUNNING[0] += 1
    try:
        yield state
    finally:
        _RUNNING[0] -= 1
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, earlier)
        if outer[0] > 0:  # an outer timer goes on, less the time this block took
            left = max(outer[0] - (time.monotonic() - began), 1e-6)
            signal.setitimer(signal.ITIMER_REAL, left, outer[1])
