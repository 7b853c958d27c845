"""Formatting shared by the renderers: numbers, sizes and times as a report prints them."""

from __future__ import annotations

from datetime import datetime

from drill.units import human_bytes, human_rate, human_seconds


def when(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC") if t is not None else "–"


def when_iso(v: str | None) -> str:
    return when(datetime.fromisoformat(v)) if v else "–"


def seconds(v: float | None) -> str:
    return human_seconds(v) if v is not None else "–"


def size(v: int | None) -> str:
    return human_bytes(v) if v is not None else "–"


def rate(v: float | None) -> str:
    return human_rate(v) if v is not None else "–"


def share(v: float | None) -> str:
    return f"{100 * v:.0f}%" if v is not None else "–"


def money(v: float | None) -> str:
    if v is None:
        return "–"
    return f"${v:,.0f}" if v >= 100 else f"${v:,.2f}"


def window(since: datetime | None, until: datetime) -> str:
    return f"{when(since)} – {when(until)}" if since else f"everything recorded up to {when(until)}"


def loss(v: object) -> str:
    return f"{v:.6g}" if isinstance(v, float) else ("–" if v is None else str(v))


__all__ = ["loss", "money", "rate", "sealed_at_save", "seconds", "share", "size", "when", "when_iso", "window"]


def sealed_at_save(save: dict | None) -> str:
    """``yes (hashing 0.41 s of a 3.2 s save, keyed)``, ``after the save (…)``, or ``no``."""
    if not save:
        return "no"
    how = "yes" if save.get("method") == "writer" else "after the save"
    keyed = ", keyed" if save.get("keyed") else ""
    return (
        f"{how} (hashing {human_seconds(save['hash_seconds'])} of a {human_seconds(save['save_seconds'])} save{keyed})"
    )
