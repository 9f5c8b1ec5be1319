"""Consumer-group settings the broker enforces: FIFO delivery, the delivery-attempt limit and the retry backoff.

They are replicated state (``commands.GroupSettings`` applied by the dispatcher, saved in its snapshots) because
the state machine itself decides with them: a pop never grants a message past the group's last attempt (it goes
to the dead-letter topic instead), and a FIFO group never gets two messages of one message group in flight. A
group nobody configured has RocketMQ's defaults: not FIFO, 16 retries (17 deliveries), the customized backoff.

Backoff: RocketMQ's customized levels are ``1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h`` and its
proxy starts a consumer group's retries at the third level (the first retry after 10 s, then 30 s, 1 m, ...,
capped at 2 h); exponential backoff is ``initial * multiplier ** (attempt - 1)`` capped at ``max``. The delay is
told to the clients in their Telemetry settings (a PushConsumer applies it itself through
ChangeInvisibleDuration), and it is what our own ``Consumer.later`` applies (docs/rocketmq.md, Retry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

DEFAULT_MAX_ATTEMPTS: Final = 17  # RocketMQ: maxReconsumeTimes 16, plus the first delivery
MAX_ATTEMPTS_LIMIT: Final = 1000
LEVELS_MS: Final = (
    1_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    180_000,
    240_000,
    300_000,
    360_000,
    420_000,
    480_000,
    540_000,
    600_000,
    1_200_000,
    1_800_000,
    3_600_000,
    7_200_000,
)
FIRST_LEVEL: Final = 2  # the proxy's first retry uses the third level (10 s)
CUSTOMIZED: Final = "customized"
EXPONENTIAL: Final = "exponential"


class GroupSettingsError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class GroupSettings:
    fifo: bool = False
    max_attempts: int = DEFAULT_MAX_ATTEMPTS  # deliveries, the first included; then the dead-letter topic
    backoff: str = CUSTOMIZED
    levels_ms: tuple[int, ...] = LEVELS_MS[FIRST_LEVEL:]  # customized: the delay before retry 1, 2, ...
    initial_ms: int = 1_000  # exponential
    max_ms: int = 7_200_000
    multiplier: float = 2.0

    def check(self) -> GroupSettings:
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise GroupSettingsError(
                f"max_attempts must be in 1..{MAX_ATTEMPTS_LIMIT}, got {self.max_attempts}"
            )
        if self.backoff not in (CUSTOMIZED, EXPONENTIAL):
            raise GroupSettingsError(
                f"backoff must be {CUSTOMIZED!r} or {EXPONENTIAL!r}, got {self.backoff!r}"
            )
        if (
            not self.levels_ms
            or len(self.levels_ms) > 64
            or any(not 0 < v <= 86_400_000 for v in self.levels_ms)
        ):
            raise GroupSettingsError("levels_ms needs 1..64 delays, each 1 ms..1 day")
        if not 0 < self.initial_ms <= self.max_ms <= 86_400_000:
            raise GroupSettingsError("exponential backoff needs 0 < initial_ms <= max_ms <= 1 day")
        if not 1.0 <= self.multiplier <= 100.0:
            raise GroupSettingsError(f"multiplier must be in 1..100, got {self.multiplier}")
        return self

    def backoff_ms(self, attempt: int) -> int:
        """The delay before the next delivery after delivery ``attempt`` (1 = the first) failed."""
        retry = max(1, attempt)
        if self.backoff == CUSTOMIZED:
            return self.levels_ms[min(retry, len(self.levels_ms)) - 1]
        return int(min(self.max_ms, self.initial_ms * self.multiplier ** (retry - 1)))

    def to_json(self) -> dict[str, Any]:
        return {
            "fifo": self.fifo,
            "max_attempts": self.max_attempts,
            "backoff": self.backoff,
            "levels_ms": list(self.levels_ms),
            "initial_ms": self.initial_ms,
            "max_ms": self.max_ms,
            "multiplier": self.multiplier,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GroupSettings:
        try:
            return cls(
                bool(d.get("fifo", False)),
                int(d.get("max_attempts", DEFAULT_MAX_ATTEMPTS)),
                str(d.get("backoff", CUSTOMIZED)),
                tuple(int(v) for v in d.get("levels_ms", LEVELS_MS[FIRST_LEVEL:])),
                int(d.get("initial_ms", 1_000)),
                int(d.get("max_ms", 7_200_000)),
                float(d.get("multiplier", 2.0)),
            ).check()
        except (TypeError, ValueError) as err:
            raise GroupSettingsError(f"malformed group settings: {err}") from None


DEFAULT: Final = GroupSettings()
