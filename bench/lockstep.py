"""Arms of a benchmark round decoded in lockstep: `chunk` tokens of each arm in turn.

On a shared machine the speed drifts over seconds to minutes, and a 512-token run of one arm
takes half a minute, so arms run one after the other see different machines: in issue 5's runs
the same arm twice (plain, plain2) differed by up to 4% in a round's median. Here every arm of a
round generates at once, each in its own thread, and a baton lets exactly one of them run at a
time, `chunk` tokens per turn, the arms' order reversed every cycle (A B C C B A ...). A slow
minute then slows every arm alike. Each arm's decode time is the sum of its own turns (from its
first token on: prefill excluded), so its tokens per second are what it would show alone on
that machine. The forwards are never interrupted (the turn ends between tokens), so the gate's
timings are the same as in a run of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch


class _Arm(threading.Thread):
    def __init__(self, name: str, run: Callable[[Callable], object], chunk: int, done: threading.Semaphore):
        super().__init__(name=f"arm-{name}", daemon=True)
        self.run_fn, self.chunk, self.done = run, chunk, done
        self.turn = threading.Semaphore(0)
        self.active = 0.0             # seconds of this arm's own turns, from its first token
        self.tokens = 0
        self.result = None
        self.error: BaseException | None = None
        self.finished = False
        self._resumed: float | None = None

    def on_token(self, tok, logits):
        now = time.perf_counter()
        if self._resumed is None:     # the first token: decode time starts here
            self._resumed = now
        self.tokens += 1
        if self.tokens % self.chunk == 0:
            self.active += now - self._resumed
            self.done.release()       # hand the baton back ...
            self.turn.acquire()       # ... and wait for the next turn
            self._resumed = time.perf_counter()
        return None

    def run(self):
        threads = torch.get_num_threads()
        self.turn.acquire()
        try:
            torch.set_num_threads(threads)
            self.result = self.run_fn(self.on_token)
            if self._resumed is not None:
                self.active += time.perf_counter() - self._resumed
        except BaseException as e:    # noqa: BLE001 - reported by the caller
            self.error = e
        finally:
            self.finished = True
            self.done.release()


def lockstep(runs: dict[str, Callable[[Callable], object]], chunk: int) -> dict[str, tuple[object, float]]:
    """runs: name -> fn(on_token) that generates (passing on_token to Engine.generate) and returns
    its result. -> name -> (result, seconds of decode in that arm's own turns)."""
    done = threading.Semaphore(0)
    arms = {n: _Arm(n, fn, chunk, done) for n, fn in runs.items()}
    for a in arms.values():
        a.start()
    order, cycle = list(arms), 0
    while not all(a.finished for a in arms.values()):
        for n in (order if cycle % 2 == 0 else order[::-1]):
            a = arms[n]
            if a.finished:
                continue
            a.turn.release()
            done.acquire()
        cycle += 1
    for a in arms.values():
        a.join()
        if a.error is not None:
            raise a.error
    return {n: (a.result, a.active) for n, a in arms.items()}
