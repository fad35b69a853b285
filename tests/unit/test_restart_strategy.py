"""The waits between attempts to place a lost Ray worker again (Flink's exponential-delay and
fixed-delay restart strategies), and their settings in the server's config. The strategy as the
Ray transport uses it, on a real cluster: tests/integration/test_ray_churn.py."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidArgument
from lowtide.server.config import ServerConfig
from lowtide.server.restart_strategy import Backoff, RestartStrategy


def waits(backoff: Backoff, attempts: int) -> list[float | None]:
    return [backoff.attempt_failed() for _ in range(attempts)]


def test_exponential_delay_doubles_each_wait_up_to_the_longest() -> None:
    backoff = Backoff(RestartStrategy(initial_backoff_s=0.5, max_backoff_s=5.0, backoff_multiplier=2.0))
    assert waits(backoff, 7) == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_fixed_delay_waits_the_same_every_time() -> None:
    backoff = Backoff(RestartStrategy("fixed-delay", initial_backoff_s=2.0, backoff_multiplier=3.0))
    assert waits(backoff, 4) == [2.0, 2.0, 2.0, 2.0]


def test_without_max_attempts_it_never_gives_up_and_the_wait_stays_bounded() -> None:
    backoff = Backoff(RestartStrategy(initial_backoff_s=1.0, max_backoff_s=60.0, backoff_multiplier=10.0))
    assert set(waits(backoff, 5000)[2:]) == {60.0}  # a day of outage: no overflow, no give-up


def test_max_attempts_failed_in_a_row_give_up() -> None:
    backoff = Backoff(RestartStrategy(initial_backoff_s=1.0, max_attempts=3))
    assert waits(backoff, 3) == [1.0, 2.0, None]


def test_a_worker_that_ran_quietly_long_enough_starts_over() -> None:
    backoff = Backoff(RestartStrategy(initial_backoff_s=1.0, reset_backoff_threshold_s=60.0, max_attempts=4))
    backoff.died(0.0)
    assert waits(backoff, 3) == [1.0, 2.0, 4.0]
    backoff.placed(10.0)
    backoff.died(30.0)  # lost again 20 s after it came up: the waits go on growing
    assert waits(backoff, 1) == [None]  # and this was its fourth failed attempt in a row

    quiet = Backoff(RestartStrategy(initial_backoff_s=1.0, reset_backoff_threshold_s=60.0, max_attempts=4))
    assert waits(quiet, 3) == [1.0, 2.0, 4.0]
    quiet.placed(10.0)
    quiet.died(70.0)  # up for 60 s: the count and the waits start over
    assert waits(quiet, 4) == [1.0, 2.0, 4.0, None]


def test_the_config_carries_the_strategy_under_flinks_names() -> None:
    config = ServerConfig.load(
        restart_strategy="fixed-delay",
        restart_initial_backoff_s=3.0,
        restart_max_backoff_s=30.0,
        restart_backoff_multiplier=1.5,
        restart_reset_backoff_threshold_s=600.0,
        restart_attempt_timeout_s=20.0,
        restart_max_attempts=5,
    )
    assert config.restart() == RestartStrategy("fixed-delay", 3.0, 30.0, 1.5, 600.0, 20.0, 5)
    assert ServerConfig.load().restart() == RestartStrategy()  # the defaults are the module's


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        (
            {"restart_strategy": "failure-rate"},
            "restart_strategy must be one of exponential-delay, fixed-delay",
        ),
        ({"restart_initial_backoff_s": 0.0}, "restart_initial_backoff_s must be more than 0"),
        ({"restart_initial_backoff_s": 90.0}, "at most restart_max_backoff_s"),
        ({"restart_backoff_multiplier": 0.5}, "restart_backoff_multiplier must be at least 1"),
        ({"restart_attempt_timeout_s": 0.0}, "restart_attempt_timeout_s must be more than 0"),
        ({"restart_max_attempts": -1}, "restart_max_attempts must not be negative"),
        ({"ray_node_ip": "10.0.0.5"}, "ray_node_ip .* is for ray = local"),
        ({"ray": "local", "ray_node_ip": "head"}, "ray_node_ip must be an IP address: 'head'"),
    ],
)
def test_settings_that_cannot_work_are_refused_in_one_line(setting: dict[str, object], reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason):
        ServerConfig.load(**setting)


def test_ray_node_ip_takes_an_address_for_a_private_cluster() -> None:
    assert ServerConfig.load(ray="local", ray_node_ip="10.0.0.5").ray_node_ip == "10.0.0.5"
