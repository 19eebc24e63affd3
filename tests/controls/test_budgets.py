"""Usage budgets: the pure parts (windows, what counts, deltas, which budget is spent, commands)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from pipeline.controls.budgets import (
    BudgetLimit,
    Budgets,
    Counted,
    Grant,
    Spent,
    Totals,
    counted,
    delta,
    describe,
    parse_grant,
    parse_target,
    spent,
    window_at,
)
from pipeline.session.models import UsageSnapshot
from pipeline.settings import BotConfig


def test_a_day_window_turns_over_at_midnight_in_the_bots_time_zone() -> None:
    budgets = Budgets(timezone="Asia/Shanghai")
    # 17:30 UTC is already the next day in Shanghai (UTC+8).
    window = window_at(budgets, datetime(2026, 12, 6, 17, 30, tzinfo=UTC))
    assert window.ident == "d2026-12-07"
    assert window.ends_at == datetime(2026, 12, 7, 16, 0, tzinfo=UTC)
    assert window_at(budgets, datetime(2026, 12, 6, 15, 59, tzinfo=UTC)).ident == "d2026-12-06"


def test_a_day_with_a_daylight_saving_change_ends_at_the_wall_clock_midnight() -> None:
    budgets = Budgets(timezone="Europe/Berlin")
    # 29 March 2026: clocks go from 02:00 to 03:00; the day is 23 hours long.
    window = window_at(budgets, datetime(2026, 3, 29, 12, 0, tzinfo=UTC))
    assert window.ident == "d2026-03-29"
    assert window.ends_at == datetime(2026, 3, 29, 22, 0, tzinfo=UTC)  # midnight CEST (UTC+2)


def test_a_month_window_and_the_year_turning_over() -> None:
    budgets = Budgets(period="month", timezone="America/New_York")
    window = window_at(budgets, datetime(2027, 1, 1, 3, 0, tzinfo=UTC))  # still 31 Dec in New York
    assert (window.ident, window.label) == ("m2026-12", "2026-12")
    assert window.ends_at == datetime(2027, 1, 1, 5, 0, tzinfo=UTC)
    assert window_at(budgets, datetime(2027, 1, 1, 5, 0, tzinfo=UTC)).ident == "m2027-01"


def test_an_unknown_time_zone_is_refused_when_the_bots_file_is_read() -> None:
    with pytest.raises(ValidationError, match="not an IANA time zone"):
        Budgets(timezone="Mars/Olympus")
    bot = BotConfig.model_validate(
        {"platform": "console", "bot_id": "b", "budgets": {"per_chat": {"tokens": 1000}, "timezone": "Europe/Paris"}}
    )
    assert bot.budgets.enabled and not BotConfig(platform="console", bot_id="c").budgets.enabled


def test_what_counts_as_tokens_is_configured() -> None:
    usage = UsageSnapshot.model_validate(
        {
            "active_seconds": 12.3456,
            "input_tokens": 100,
            "output_tokens": 20,
            "cache_read_input_tokens": 1000,
            "cache_creation": {"ephemeral_5m_input_tokens": 5, "ephemeral_1h_input_tokens": 3},
        }
    )
    assert counted(usage, Budgets().token_kinds) == Counted(tokens=128, active_ms=12346)
    assert counted(usage, ["input", "output", "cache_read"]).tokens == 1120


def test_a_replayed_or_older_report_adds_nothing() -> None:
    accounted = Counted(1500, 4000)
    assert delta(accounted, Counted(1800, 4500)) == Counted(300, 500)
    assert delta(accounted, accounted) == Counted(0, 0)
    assert delta(accounted, Counted(1200, 3000)) == Counted(0, 0)
    assert delta(Counted(), Counted(42, 7)) == Counted(42, 7)


def test_a_budget_is_spent_at_its_limit_plus_the_grants() -> None:
    budgets = Budgets(per_chat=BudgetLimit(tokens=1000), per_user=BudgetLimit(active_seconds=60))
    assert spent(budgets, {"chat": Totals(tokens=999), "user": Totals(active_ms=59_999)}) is None
    assert spent(budgets, {"chat": Totals(tokens=1000), "user": Totals()}) == Spent("chat", "tokens")
    assert spent(budgets, {"chat": Totals(tokens=1400, granted_tokens=500), "user": Totals()}) is None
    assert spent(budgets, {"chat": Totals(), "user": Totals(active_ms=60_000)}) == Spent("user", "active_seconds")
    # A scope without a limit is never spent, whatever its totals.
    assert spent(budgets, {"bot": Totals(tokens=10**9)}) is None


def test_grants_and_targets_are_read_from_the_command() -> None:
    assert parse_grant("5000", []) == Grant(5000, "tokens", None)
    assert parse_grant("20k @alice", []) == Grant(20_000, "tokens", "alice")
    assert parse_grant("@alice 20K", []) == Grant(20_000, "tokens", "alice")
    assert parse_grant("10m", ["u-7"]) == Grant(600_000, "active_seconds", "u-7")
    assert parse_grant("90s u-8", []) == Grant(90_000, "active_seconds", "u-8")
    assert parse_grant("lots", []) is None
    assert parse_grant("0", []) is None
    assert parse_target("", []) is None
    assert parse_target("@bob", []) == "bob"
    assert parse_target("12345", []) is None  # an amount, not a user
    assert parse_target("u-9", []) == "u-9"


def test_a_report_shows_the_limit_and_the_grants() -> None:
    limit = BudgetLimit(tokens=10_000, active_seconds=600)
    assert describe(Totals(1200, 30_500, 5000, 0), limit) == ("1200 / 10000 (+5000)", "30.5 / 600")
    assert describe(Totals(7, 0), None) == ("7", "0")
