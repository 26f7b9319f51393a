"""The suite's time limits follow the machine's speed (tests/time_scale.py): measured once by the
controller, handed to every worker, applied to pytest-timeout's limit of each test."""

from __future__ import annotations

import os

import pytest
import time_scale


def test_the_controller_measured_the_factor_and_the_worker_inherited_it():
    assert time_scale.ENV in os.environ
    assert 1.0 <= time_scale.factor() <= time_scale.CAP


def test_the_default_limit_is_scaled(request: pytest.FixtureRequest):
    limit = request.node.get_closest_marker("timeout").args[0]
    assert limit == pytest.approx(request.config.getoption("timeout") * time_scale.factor())


@pytest.mark.timeout(7)
def test_a_tests_own_limit_is_scaled_instead_of_the_default(request: pytest.FixtureRequest):
    assert request.node.get_closest_marker("timeout").args[0] == pytest.approx(7 * time_scale.factor())


def test_a_fast_machine_keeps_the_limits_as_written(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(time_scale, "_probe", lambda: time_scale.REFERENCE_S / 3)
    assert time_scale.measure() == 1.0
    monkeypatch.setattr(time_scale, "_probe", lambda: time_scale.REFERENCE_S * 2.5)
    assert time_scale.measure() == pytest.approx(2.5)
    monkeypatch.setattr(time_scale, "_probe", lambda: time_scale.REFERENCE_S * 10)
    assert time_scale.measure() == time_scale.CAP
