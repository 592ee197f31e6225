"""gpuq.cron: the five-field parser, checked by hand and against a brute-force minute walk."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.cron import MINUTE_MS, Cron
from gpuq.errors import ScheduleError


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp()) * 1000


def test_fields_lists_ranges_steps_and_names() -> None:
    c = Cron.parse("*/15 9-17/4 1,15 JAN-mar mon-fri")
    assert c.minutes == {0, 15, 30, 45} and c.hours == {9, 13, 17}
    assert c.days == {1, 15} and c.months == {1, 2, 3} and c.weekdays == {1, 2, 3, 4, 5}
    assert Cron.parse("5/20 * * * 7").minutes == {5, 25, 45}
    assert Cron.parse("0 0 * * 7").weekdays == {0}


def test_daily_at_three() -> None:
    c = Cron.parse("0 3 * * *")
    assert c.next_after(ms(2024, 5, 1, 3, 0)) == ms(2024, 5, 2, 3, 0)
    assert c.next_after(ms(2024, 5, 1, 2, 59)) == ms(2024, 5, 1, 3, 0)
    assert c.latest(ms(2024, 5, 1, 3, 0) + 59_999) == ms(2024, 5, 1, 3, 0)
    assert c.latest(ms(2024, 5, 1, 2, 59)) == ms(2024, 4, 30, 3, 0)


def test_both_day_fields_restricted_match_either() -> None:
    c = Cron.parse("0 0 13 * 5")  # the 13th, and every Friday
    assert c.matches(ms(2024, 9, 13))  # a Friday the 13th
    assert c.matches(ms(2024, 9, 6))  # a Friday
    assert c.matches(ms(2024, 10, 13))  # a Sunday the 13th
    assert not c.matches(ms(2024, 10, 14))
    only_fridays = Cron.parse("0 0 * * 5")
    assert only_fridays.matches(ms(2024, 9, 6)) and not only_fridays.matches(ms(2024, 10, 13))


def test_leap_day_is_found_years_away() -> None:
    c = Cron.parse("0 0 29 2 *")
    assert c.next_after(ms(2097, 3, 1)) == ms(2104, 2, 29)  # 2100 is no leap year
    assert c.latest(ms(2104, 2, 28)) == ms(2096, 2, 29)


@pytest.mark.parametrize("text, fragment", [
    ("* * * *", "expected 5 fields"),
    ("60 * * * *", "minute field"),
    ("* 24 * * *", "hour field"),
    ("* * 0 * *", "day of month field"),
    ("* * * 13 *", "month field"),
    ("* * * * 8", "day of week field"),
    ("*/0 * * * *", "step"),
    ("*/ * * * *", "step"),  # regression: an empty step read as 1
    ("5/ * * * *", "step"),
    ("5-1 * * * *", "runs backwards"),
    ("1,,2 * * * *", "minute field"),
    ("a * * * *", "minute field"),
    ("0 0 30 2 *", "never fires"),
    ("0 0 31 4,6 *", "never fires"),
])
def test_bad_expressions_are_one_clear_error(text: str, fragment: str) -> None:
    with pytest.raises(ScheduleError, match=fragment):
        Cron.parse(text)


def _field(lo: int, hi: int) -> st.SearchStrategy[str]:
    n = st.integers(lo, hi)
    item = st.one_of(
        st.just("*"), n.map(str),
        st.tuples(n, n).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.tuples(st.sampled_from(["*", str(lo)]), st.integers(1, 9)).map(lambda x: f"{x[0]}/{x[1]}"))
    return st.lists(item, min_size=1, max_size=3).map(",".join)


EXPRESSIONS = st.tuples(_field(0, 59), _field(0, 23), _field(1, 31), _field(1, 12), _field(0, 7)) \
    .map(" ".join)
TIMES = st.integers(ms(2020, 1, 1), ms(2030, 1, 1))
WALK = 3 * 24 * 60  # minutes the brute force walks


def _parsed(text: str) -> Cron | None:
    try:
        return Cron.parse(text)
    except ScheduleError:
        return None


@settings(max_examples=150, deadline=None)
@given(EXPRESSIONS, TIMES)
def test_next_after_and_latest_agree_with_a_minute_walk(text: str, at: int) -> None:
    c = _parsed(text)
    if c is None:
        return
    start = at // MINUTE_MS * MINUTE_MS
    ahead = next((start + i * MINUTE_MS for i in range(1, WALK) if c.matches(start + i * MINUTE_MS)), None)
    if ahead is not None:
        assert c.next_after(at) == ahead
    else:
        found = c.next_after(at)
        assert found is None or found >= start + WALK * MINUTE_MS
    back = next((start - i * MINUTE_MS for i in range(WALK) if c.matches(start - i * MINUTE_MS)), None)
    if back is not None:
        assert c.latest(at) == back
    else:
        found = c.latest(at)
        assert found is None or found <= start - WALK * MINUTE_MS


@settings(max_examples=100, deadline=None)
@given(EXPRESSIONS, TIMES)
def test_matches_follows_the_fields(text: str, at: int) -> None:
    c = _parsed(text)
    if c is None:
        return
    t = datetime.fromtimestamp(at / 1000, UTC)
    parts = text.split()
    dom, dow = t.day in c.days, t.isoweekday() % 7 in c.weekdays
    day = (dom or dow) if not parts[2].startswith("*") and not parts[4].startswith("*") else (dom and dow)
    expected = t.minute in c.minutes and t.hour in c.hours and t.month in c.months and day
    assert c.matches(at) == expected


def test_a_cron_that_is_not_text_is_a_schedule_error_and_a_number_interval_is_seconds() -> None:
    """The defect: the Python API raised AttributeError for every=10 or cron=5. Then every=10
    was refused as "expected a number and a unit" (found by a QA pass): a number is seconds,
    as the text "10" is."""
    from gpuq.schedule import parse_every

    with pytest.raises(ScheduleError, match="expected text"):
        Cron.parse(5)  # type: ignore[arg-type]
    assert parse_every(10) == parse_every("10") == 10_000 and parse_every(1.5) == 1500
    for bad in (True, float("nan"), float("inf"), None):
        with pytest.raises(ScheduleError, match="expected a number and a unit"):
            parse_every(bad)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="at least 1 s"):
        parse_every(0.5)


def test_an_interval_too_large_for_a_float_is_a_schedule_error() -> None:
    """The defect: --every 999...9 (400 digits) is inf ms, and int(inf) raised OverflowError,
    a traceback instead of the one-line error the CLI gives every bad interval."""
    from gpuq.schedule import parse_every

    with pytest.raises(ScheduleError, match="at most 366 days"):
        parse_every("9" * 400)
    with pytest.raises(ScheduleError, match="at most 366 days"):
        parse_every("9" * 400 + "d")
