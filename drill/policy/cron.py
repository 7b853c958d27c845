"""A policy's crontab expression as an APScheduler trigger: 5 fields, or 6 with seconds first."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apscheduler.triggers.cron import CronTrigger


def cron_trigger(expr: str, timezone: str = "UTC") -> CronTrigger:
    """APScheduler trigger for a crontab expression: 5 fields, or 6 with seconds first."""
    from apscheduler.triggers.cron import CronTrigger

    fields = expr.split()
    if len(fields) == 6:
        second, minute, hour, day, month, dow = fields
        return CronTrigger(
            second=second, minute=minute, hour=hour, day=day, month=month, day_of_week=dow, timezone=timezone
        )
    if len(fields) != 5:
        raise ValueError(
            f"expected 5 fields (minute hour day month weekday), or 6 with seconds first; got {len(fields)}"
        )
    return CronTrigger.from_crontab(expr, timezone=timezone)
