import math

import pytest

from lowrank.book import verdicts
from lowrank.core import regimes


def test_furthest_from_done_takes_the_smallest_share_of_its_need():
    """A = 7 of 6.9 (1.01 of its need) against a lambda = 0 share of 0.4 of 0.5 (0.8): the second is further
    from done; a share of 0.6 of 0.5 (1.2) is not, and A decides. Mappings (Part III's clocks) alike; a
    need of 0 is done whatever the value."""
    a = verdicts.Regime("A", 7.0, 6.9, "test")
    settle = verdicts.Regime("share kept", 0.4, 0.5, "test")
    assert regimes.furthest_from_done([a, settle]) is settle and not settle.reached
    assert regimes.furthest_from_done([a, verdicts.Regime("share kept", 0.6, 0.5, "test")]) is a
    clocks = [{"value": 0.1, "needed": 0.5}, {"value": 3.0, "needed": 2.0}, {"value": 0.0, "needed": 0.0}]
    assert regimes.furthest_from_done(clocks) is clocks[0]
    assert regimes.furthest_from_done(clocks[1:]) is clocks[1]
    with pytest.raises(ValueError):
        regimes.furthest_from_done([])


def test_share_done_by_hand():
    """0.4 of 0.5 is 0.8 of its need, 7 of 6.9 is 1.0145; a need of 0 is done whatever the value (inf), as
    furthest_from_done counts it; at least 1 exactly when reached."""
    assert regimes.share_done(verdicts.Regime("share kept", 0.4, 0.5, "test")) == pytest.approx(0.8)
    assert regimes.share_done({"value": 7.0, "needed": 6.9}) == pytest.approx(7 / 6.9)
    assert regimes.share_done({"value": 0.0, "needed": 0.0}) == math.inf
    assert regimes.share_done({"value": 3.0, "needed": -1.0}) == math.inf
    assert regimes.share_done({"value": 0.0, "needed": 2.0}) == 0.0
    for value, needed in [(0.5, 0.5), (0.49, 0.5), (2.0, 1.0), (0.0, 0.0), (1.0, 0.0)]:
        r = verdicts.Regime("q", value, needed, "test")
        assert (regimes.share_done(r) >= 1) == r.reached
    clocks = [{"value": 0.1, "needed": 0.5}, {"value": 3.0, "needed": 2.0}, {"value": 0.0, "needed": 0.0}]
    assert regimes.furthest_from_done(clocks) is min(clocks, key=regimes.share_done)
