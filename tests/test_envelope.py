"""envelope(): a long series cut down to each bucket's lowest and highest point."""
from __future__ import annotations

import random

import pytest

from gpumemdoctor.reporters.envelope import envelope


def test_a_short_series_comes_back_whole():
    points = [(0.0, 1), (1.0, None), (2.0, 3)]
    assert envelope(points, buckets=10) == points


def test_length_is_bounded_whatever_the_input():
    rng = random.Random(7)
    points = [(i * 0.005, rng.randrange(1 << 30)) for i in range(200_000)]
    out = envelope(points, buckets=500)
    assert len(out) <= 2 * 500 + 2
    assert len(out) > 500  # random data: most buckets keep two points


def test_a_single_spike_and_the_floor_survive():
    points = [(i * 0.01, 1000 + (i % 7)) for i in range(100_000)]
    points[54_321] = (points[54_321][0], 900_000)  # one sample's spike
    points[77_777] = (points[77_777][0], 10)  # one sample's dip
    out = envelope(points, buckets=200)
    assert max(v for _, v in out) == 900_000
    assert min(v for _, v in out) == 10
    assert points[54_321] in out and points[77_777] in out
    # everything it keeps was recorded, in the recorded order
    assert all(p in set(points) for p in out)
    assert [t for t, _ in out] == sorted(t for t, _ in out)


def test_first_and_last_points_are_kept():
    points = [(float(i), i % 13) for i in range(10_000)]
    out = envelope(points, buckets=50)
    assert out[0] == points[0] and out[-1] == points[-1]


def test_each_bucket_keeps_its_own_minimum_and_maximum():
    # a sawtooth: every bucket of 100 points rises from 0 to 99
    points = [(float(i), i % 100) for i in range(10_000)]
    out = envelope(points, buckets=100)
    lows = [p for p in out if p[1] == 0]
    highs = [p for p in out if p[1] == 99]
    assert len(lows) == 100 and len(highs) == 100


def test_missing_values_are_dropped_when_cutting_down():
    points = [(float(i), None if i % 2 else i) for i in range(10_000)]
    out = envelope(points, buckets=10)
    assert all(v is not None for _, v in out)


def test_all_points_at_one_moment():
    points = [(5.0, i) for i in range(1000)]
    out = envelope(points, buckets=10)
    assert (5.0, 0) in out and (5.0, 999) in out and len(out) <= 22


def test_buckets_must_be_positive():
    with pytest.raises(ValueError):
        envelope([(0.0, 1)], buckets=0)
