"""The float32 threshold search and its proof (streamline.thresholds)."""

from __future__ import annotations


import numpy as np
import pytest

from custom_ops.quant import quant
from streamline.thresholds import (KEY_NEG_INF, KEY_POS_INF, check_thresholds, float32_to_key, key_to_float32,
                                   least_float32_reaching)

RNG = np.random.default_rng(0)


def _up(x: float) -> np.float32:
    return np.nextafter(np.float32(x), np.float32(np.inf))


def test_keys_order_floats_and_merge_signed_zeros():
    x = np.concatenate([RNG.normal(size=1000) * 10.0 ** RNG.integers(-40, 38, size=1000),
                        [0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -3.4e38]]).astype(np.float32)
    keys = float32_to_key(x)
    order = np.argsort(keys, kind="stable")
    assert np.all(np.diff(x[order]) >= 0)
    assert float32_to_key(np.float32(-0.0)) == float32_to_key(np.float32(0.0)) == 0
    assert float32_to_key(np.float32(np.inf)) == KEY_POS_INF and float32_to_key(np.float32(-np.inf)) == KEY_NEG_INF
    back = key_to_float32(keys)
    assert np.array_equal(back, np.where(x == 0, np.float32(0), x))
    # consecutive keys are consecutive floats
    assert key_to_float32(float32_to_key(np.float32(1.0)) + 1) == _up(1.0)
    assert key_to_float32(np.int64(-1)) == -np.float32(1e-45)


def test_round_half_even_thresholds_are_exact():
    """3-bit signed ROUND with s = 1: a tie k + 1/2 belongs to the even neighbour, so the threshold of an even
    level is the tie itself and that of an odd level the float just above it."""
    s = np.ones((1, 1), np.float32)
    table = np.arange(-4, 4, dtype=np.float32)[None, :]

    def f(x):
        return quant(x, s, np.float32(0), 3, True, False, "ROUND")

    t, reachable = least_float32_reaching(f, table)
    assert reachable.all()
    expected = [_up(-3.5), -2.5, _up(-1.5), -0.5, _up(0.5), 1.5, _up(2.5)]
    assert t.tolist() == [[float(v) for v in expected]]
    assert check_thresholds(f, table, t) is None


@pytest.mark.parametrize("mode", ["ROUND", "FLOOR", "CEIL", "UP", "DOWN", "HALF_UP", "HALF_DOWN"])
def test_search_agrees_with_the_definition_and_ignores_bad_estimates(mode):
    """Per channel, each threshold is reached and the float below it is not; a wildly wrong estimate only costs
    time (the bracket is verified and dropped)."""
    s = np.exp(RNG.uniform(-6, 2, size=(16, 1))).astype(np.float32)
    z = RNG.integers(-2, 3, size=(16, 1)).astype(np.float32)
    table = ((np.arange(-8, 8, dtype=np.float32)[None, :] - z) * s).astype(np.float32)

    def f(x):
        return quant(x, s, z, 4, True, False, mode)

    t1, _ = least_float32_reaching(f, table)
    t2, _ = least_float32_reaching(f, table, estimate=np.full((16, 15), 1e30))
    assert np.array_equal(t1, t2)
    assert check_thresholds(f, table, t1) is None
    target = float32_to_key(table[:, 1:])
    assert np.all(float32_to_key(f(t1)) >= target)
    below = np.nextafter(t1, np.float32(-np.inf))
    assert np.all(float32_to_key(f(below)) < target)


def test_check_rejects_wrong_thresholds_and_wrong_tables():
    s = np.full((1, 1), 0.1, np.float32)
    table = ((np.arange(0, 8, dtype=np.float32)[None, :]) * s).astype(np.float32)

    def f(x):
        return quant(x, s, np.float32(0), 3, False, False, "ROUND")

    t, _ = least_float32_reaching(f, table)
    assert check_thresholds(f, table, t) is None
    late = t.copy()
    late[0, 3] = _up(late[0, 3])
    assert check_thresholds(f, table, late) is not None
    early = t.copy()
    early[0, 3] = np.nextafter(early[0, 3], np.float32(-np.inf))
    assert check_thresholds(f, table, early) is not None
    wrong_table = table.copy()
    wrong_table[0, 5] = _up(wrong_table[0, 5])  # not what the kernel outputs
    assert check_thresholds(f, wrong_table, t) is not None


def test_unreachable_level_is_flagged():
    """Composed with a Clip that cuts off the top levels, those levels are never reached."""
    s = np.ones((1, 1), np.float32)
    table = np.arange(0, 8, dtype=np.float32)[None, :]

    def f(x):
        return quant(np.minimum(x, np.float32(4.2)), s, np.float32(0), 3, False, False, "ROUND")

    _, reachable = least_float32_reaching(f, table)
    assert reachable.tolist() == [[True, True, True, True, False, False, False]]


def test_eight_bit_per_channel_search():
    """255 thresholds for each of 512 channels (the size of a wide 8-bit layer)."""
    s = np.exp(RNG.uniform(-6, 0, size=(512, 1))).astype(np.float32)
    table = ((np.arange(-128, 128, dtype=np.float32)[None, :]) * s).astype(np.float32)
    estimate = (np.arange(-127, 128)[None, :] - 0.5) * s.astype(np.float64)

    def f(x):
        return quant(x, s, np.float32(0), 8, True, False, "ROUND")

    t, reachable = least_float32_reaching(f, table, estimate)
    assert check_thresholds(f, table, t) is None and reachable.all()
