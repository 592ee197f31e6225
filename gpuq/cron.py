"""Cron expressions: the standard five fields (minute hour day-of-month month day-of-week), UTC.

Each field is ``*``, a number, a range ``a-b``, any of them with a step (``*/15``,
``0-30/10``, ``5/20`` = 5-max/20), or a comma-separated list of these. Months and weekdays
also take English three-letter names (``JAN``, ``MON``); weekday 0 and 7 are Sunday. As in
cron, when both day fields are restricted (neither starts with ``*``) a day matches if
either does; otherwise both must (the ``*`` one matches every day).
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from gpuq.errors import BadSchedule

FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
          ("day of week", 0, 7))
NAMES = {3: ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
         4: ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]}
SEARCH_DAYS = 8 * 366 + 1  # the longest gap between two matching days (Feb 29 across 2100)
MINUTE_MS = 60_000


def _number(text: str, index: int) -> int:
    names = NAMES.get(index, [])
    if text.lower() in names:
        return names.index(text.lower()) + (1 if index == 3 else 0)
    if not text.isdigit():
        raise ValueError(f"{text!r} is not a number")
    return int(text)


def _field(text: str, index: int) -> frozenset[int]:
    name, lo, hi = FIELDS[index]
    out: set[int] = set()
    for item in text.split(","):
        span, slash, step_text = item.partition("/")
        try:
            step = int(step_text) if step_text.isdigit() else 1
            if slash and not step_text.isdigit() or step < 1:  # "5/" is no step
                raise ValueError(f"step {step_text!r} must be a number >= 1")
            if span == "*":
                start, end = lo, hi
            else:
                first, dash, last = span.partition("-")
                start = _number(first, index)
                end = _number(last, index) if dash else (hi if step_text else start)
            if not lo <= start <= end <= hi:
                raise ValueError(f"{span!r} is outside {lo}-{hi} or runs backwards")
        except ValueError as exc:
            raise BadSchedule(f"cron {name} field {text!r}: {exc}") from None
        out.update(range(start, end + 1, step))
    if index == 4 and 7 in out:  # 7 is Sunday too
        out = (out - {7}) | {0}
    return frozenset(out)


@dataclass(frozen=True)
class Cron:
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    either_day: bool  # both day fields restricted: a day matches if either does

    @classmethod
    def parse(cls, text: str) -> Cron:
        if not isinstance(text, str):
            raise BadSchedule(f"cron {text!r}: expected text of 5 fields")
        parts = text.split()
        if len(parts) != 5:
            raise BadSchedule(f"cron {text!r}: expected 5 fields (minute hour day-of-month "
                                f"month day-of-week), got {len(parts)}")
        m, h, dom, month, dow = (_field(p, i) for i, p in enumerate(parts))
        cron = cls(" ".join(parts), m, h, dom, month, dow,
                   not parts[2].startswith("*") and not parts[4].startswith("*"))
        if not cron.either_day and not any(d <= calendar.monthrange(2000, m)[1]
                                           for m in cron.months for d in cron.days):
            raise BadSchedule(f"cron {text!r} never fires: no month has those days")
        return cron

    def day_matches(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom, dow = d.day in self.days, d.isoweekday() % 7 in self.weekdays
        return (dom or dow) if self.either_day else (dom and dow)

    def matches(self, at_ms: int) -> bool:
        """Whether the minute holding ``at_ms`` (epoch ms, UTC) matches."""
        t = datetime.fromtimestamp(at_ms // MINUTE_MS * 60, UTC)
        return t.minute in self.minutes and t.hour in self.hours and self.day_matches(t.date())

    def _times(self) -> list[tuple[int, int]]:
        return sorted((h, m) for h in self.hours for m in self.minutes)

    def latest(self, at_ms: int) -> int | None:
        """The start (epoch ms) of the latest matching minute at or before ``at_ms``."""
        t = datetime.fromtimestamp(at_ms // MINUTE_MS * 60, UTC)
        times = self._times()
        for back in range(SEARCH_DAYS):
            d = t.date() - timedelta(days=back)
            if not self.day_matches(d):
                continue
            fits = [hm for hm in times if back or hm <= (t.hour, t.minute)]
            if fits:
                h, m = fits[-1]
                return _epoch_ms(d, h, m)
        return None

    def next_after(self, at_ms: int) -> int | None:
        """The start (epoch ms) of the first matching minute after ``at_ms``."""
        t = datetime.fromtimestamp(at_ms // MINUTE_MS * 60, UTC)
        times = self._times()
        for ahead in range(SEARCH_DAYS):
            d = t.date() + timedelta(days=ahead)
            if not self.day_matches(d):
                continue
            fits = [hm for hm in times if ahead or hm > (t.hour, t.minute)]
            if fits:
                h, m = fits[0]
                return _epoch_ms(d, h, m)
        return None


def _epoch_ms(d: date, hour: int, minute: int) -> int:
    return int(datetime(d.year, d.month, d.day, hour, minute, tzinfo=UTC).timestamp()) * 1000
