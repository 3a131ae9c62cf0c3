"""Combining the clocks a claim's mechanism needs (each a value and the least value at which it acts):
shared by the parts' pages, which each read several clocks (Part II's SGD noise, Part III's rho dynamics)."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["furthest_from_done"]


def furthest_from_done(regimes):
    """Of several clocks (mappings or objects with `value` and `needed`, e.g. `lowrank.book.verdicts.Regime`
    or the dicts of `lowrank.square.timescales`), the one furthest from done: the smallest share
    `value / needed`; a need of 0 or less is done whatever the value. A claim is in its regime only when
    every clock is, so this one decides. ValueError for no clock."""
    regimes = list(regimes)
    if not regimes:
        raise ValueError("furthest_from_done needs at least one regime")

    def share(r) -> float:
        value, needed = (r["value"], r["needed"]) if isinstance(r, Mapping) else (r.value, r.needed)
        return math.inf if needed <= 0 else value / needed

    return min(regimes, key=share)
