"""Granger F-test: finds a known lagged dependence, not an independent one; the F tail matches published tables."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sitsd.rca.granger import f_survival, granger


@pytest.mark.parametrize("f, d1, d2, alpha", [(2.696, 3, 100, 0.05), (3.984, 3, 100, 0.01), (4.965, 1, 10, 0.05),
                                              (10.04, 1, 10, 0.01), (2.368, 5, 60, 0.05)])
def test_f_tail_matches_published_critical_values(f, d1, d2, alpha):
    assert f_survival(f, d1, d2) == pytest.approx(alpha, abs=2e-4)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lag=st.integers(1, 4), gain=st.floats(0.3, 2.0))
def test_lagged_dependence_is_found_in_the_right_direction(seed, lag, gain):
    rng = np.random.default_rng(seed)
    n = 1500
    x = rng.standard_normal(n)
    y = rng.standard_normal(n) * 0.5
    y[lag:] += gain * x[:-lag]
    assert granger(x, y, lags=4).p_value < 1e-6
    assert granger(y, x, lags=4).p_value > 1e-6  # the effect does not predict its cause


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), ar=st.floats(0.0, 0.9))
def test_independent_series_show_no_dependence(seed, ar):
    rng = np.random.default_rng(seed)
    n = 1500
    x = rng.standard_normal(n)
    y = np.zeros(n)
    e = rng.standard_normal(n)
    for i in range(1, n):  # y has its own memory, but nothing of x
        y[i] = ar * y[i - 1] + e[i]
    assert granger(x, y, lags=3).p_value > 1e-6


def test_constant_or_short_series_give_no_evidence():
    assert granger(np.ones(100), np.arange(100.0)).p_value == 1.0
    assert granger(np.arange(5.0), np.arange(5.0)).p_value == 1.0


def test_command_drives_the_roll_gap_in_the_closed_loop(runner):
    res = runner.run(None, seed=3, seconds=12.0)
    w = res.window
    assert granger(w.column("command"), w.column("roll_gap"), 3).p_value < 1e-6
