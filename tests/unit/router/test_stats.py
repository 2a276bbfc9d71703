"""The occupancy integral the autoscaling counter reports."""

from __future__ import annotations

import pytest

from workerpool.router.stats import Occupancy


def test_occupancy_integrates_the_requests_held_over_time():
    occupancy = Occupancy(10.0)
    occupancy.count(11.0, 2)  # nothing held for the first second
    occupancy.count(14.0, 1)  # two held for three seconds
    assert occupancy.seconds(16.0) == pytest.approx(2 * 3 + 1 * 2)
    occupancy.count(16.0, 0)
    assert occupancy.seconds(100.0) == pytest.approx(8.0)  # idle time adds nothing


def test_a_count_repeated_within_a_stretch_changes_nothing():
    once, often = Occupancy(0.0), Occupancy(0.0)
    once.count(0.0, 3)
    for step in range(11):
        often.count(step / 10, 3)
    assert often.seconds(2.0) == pytest.approx(once.seconds(2.0)) == pytest.approx(6.0)
