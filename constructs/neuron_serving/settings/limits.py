"""The ranges and defaults that both a setting and the construct prop it becomes are checked
against, each defined once. A check here returns what is allowed (or ``None``), so that each
caller names the value the way its user spells it: the settings by their keys, a construct by
its own props."""

from __future__ import annotations

RATE_LIMIT_RANGE = (10, 2_000_000_000)
"""An AWS WAF rate-based rule's limit: 10 to 2e9 requests per evaluation window (WAFV2 API,
RateBasedStatement.Limit, min 10 and max 2000000000 in botocore 1.43.11
data/wafv2/2019-07-29/service-2.json)."""

LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
                      3288, 3653)
"""The retention periods CloudWatch Logs accepts, in days (CloudWatch Logs API Reference,
PutRetentionPolicy, retentionInDays)."""

DEFAULT_LOG_RETENTION_DAYS = 14

PERCENT_RANGE = (0, 100)
"""An alarm on a percentage fires above 0 and at most at 100."""

LATENCY_SECONDS_RANGE = (0, 3600)
"""An alarm on the load balancer's response time: above 0, at most an hour."""

DEFAULT_ERROR_RATE_PERCENT = 5.0
DEFAULT_P99_LATENCY_SECONDS = 60.0
DEFAULT_DISK_PERCENT = 85.0

DEFAULT_MIN_CAPACITY = 1
DEFAULT_MAX_CAPACITY = 2

WARM_POOL_MIN_CAPACITY = 2
"""A warm pool holds hosts beyond those in service: with one host at most there is nothing to warm."""


def rate_limit(value: float) -> str | None:
    low, high = RATE_LIMIT_RANGE
    return None if low <= value <= high else (f"must be {low} to {high} requests per client IP per 5 minutes "
                                              "(AWS WAF's rate-based rule limits)")


def log_retention(value: int) -> str | None:
    return None if value in LOG_RETENTION_DAYS else f"must be one of {', '.join(map(str, LOG_RETENTION_DAYS))}"


def above_at_most(low: float, high: float) -> str:
    """What a threshold in ``(low, high]`` allows, in words."""
    return f"must be a number above {low} and at most {high}"


def in_range(value: object, low: float, high: float) -> bool:
    """``value`` is a number (not a bool) above ``low`` and at most ``high``."""
    return isinstance(value, int | float) and not isinstance(value, bool) and low < value <= high


def capacity_problems(min_capacity: int, max_capacity: int, desired_capacity: int | None) -> list[tuple[str, int, str]]:
    """A fleet's sizes, as ``(name, value, allowed)``: the names are both the settings' and the
    fleet construct's props."""
    problems = []
    if max_capacity < 1:
        problems.append(("max_capacity", max_capacity, "must be at least 1"))
    if min_capacity < 0:
        problems.append(("min_capacity", min_capacity, "must be at least 0"))
    elif min_capacity > max_capacity:
        problems.append(("min_capacity", min_capacity, f"must be <= max_capacity ({max_capacity})"))
    if desired_capacity is not None and not min_capacity <= desired_capacity <= max_capacity:
        problems.append(("desired_capacity", desired_capacity,
                         f"must lie between min_capacity ({min_capacity}) and max_capacity ({max_capacity})"))
    return problems


def warm_pool_capacity(max_capacity: int) -> str | None:
    if max_capacity >= WARM_POOL_MIN_CAPACITY:
        return None
    return (f"needs max_capacity of at least {WARM_POOL_MIN_CAPACITY} (got {max_capacity}): a single instance has "
            "nothing to warm")


def requests_per_minute(value: float) -> str | None:
    return None if value >= 1 else "must be at least 1"


def in_flight_requests(value: float) -> str | None:
    return None if value > 0 else "must be above 0"
