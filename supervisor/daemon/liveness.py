"""Which of the daemon's services have checked in lately: what systemd's watchdog
(`life/systemd.py`) and `gpusv health` (`requests/telemetry.py`) both judge liveness by.
Times are `time.monotonic()` seconds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Service:
    period_s: float
    last: float | None


class HealthBoard:
    """Which services have checked in lately; times are `time.monotonic()` seconds."""

    def __init__(self) -> None:
        self._services: dict[str, _Service] = {}

    def register(self, name: str, period_s: float, now: float | None = None) -> None:
        """A service that must beat at least every `period_s`; `now` grants a first period."""
        if not period_s > 0:
            raise ValueError(f"{name}: period must be positive, got {period_s!r}")
        self._services[name] = _Service(period_s, now)

    def unregister(self, name: str) -> None:
        self._services.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._services

    def beat(self, name: str, now: float) -> None:
        try:
            self._services[name].last = now
        except KeyError:
            raise KeyError(f"health board: {name!r} was never registered") from None

    def last_beats(self) -> dict[str, float | None]:
        """Each service's last check-in (monotonic), None before its first."""
        return {name: svc.last for name, svc in self._services.items()}

    def stale(self, now: float) -> list[str]:
        """Services that have not beaten within their period (never-beaten ones included)."""
        return sorted(
            name
            for name, svc in self._services.items()
            if svc.last is None or now - svc.last > svc.period_s
        )

    def healthy(self, now: float) -> bool:
        return not self.stale(now)
