"""Combining the clocks a claim's mechanism needs (each a value and the least value at which it acts):
shared by the parts' pages, which each read several clocks (Part II's SGD noise, Part III's rho dynamics)."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["share_done", "furthest_from_done"]


def share_done(regime) -> float:
    """How much of its need a clock has done: `value / needed` (a mapping or an object with `value` and
    `needed`, e.g. `lowrank.book.verdicts.Regime` or the dicts of `lowrank.square.timescales`); infinite for a
    need of 0 or less, which is done whatever the value. At least 1 exactly when the clock is reached
    (`value >= needed`, for a value >= 0)."""
    value, needed = (regime["value"], regime["needed"]) if isinstance(regime, Mapping) else (regime.value, regime.needed)
    return math.inf if needed <= 0 else value / needed


def furthest_from_done(regimes):
    """Of several clocks (mappings or objects with `value` and `needed`, e.g. `lowrank.book.verdicts.Regime`
    or the dicts of `lowrank.square.timescales`), the one furthest from done: the smallest `share_done`,
    `value / needed`; a need of 0 or less is done whatever the value. A claim is in its regime only when
    every clock is, so this one decides. ValueError for no clock."""
    regimes = list(regimes)
    if not regimes:
        raise ValueError("furthest_from_done needs at least one regime")
    return min(regimes, key=share_done)
