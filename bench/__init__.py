"""Benchmarks, never part of the unit suite (``make bench``): each contender beside its baseline or
the physical floor in the same run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["best_of"]


def best_of(run: Callable[[], Any], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``run``, in seconds (the others waited on the machine)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)
