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


CAPACITY_RESERVATION_PREFERENCES = ("capacity-reservations-first", "capacity-reservations-only", "none")
"""The Auto Scaling group's CapacityReservationPreference values a fleet may set (Auto Scaling API model,
CapacityReservationSpecification, botocore/data/autoscaling/2011-01-01/service-2.json of awscli 1.46.3;
``default``, the launch template's preference, is what leaving it unset gives)."""

CAPACITY_BLOCK_LEAD_MINUTES = 60
"""How long before its Capacity Block ends the fleet scales to zero. EC2 begins terminating a block's
instances 30 minutes before the end (Amazon EC2 User Guide, Capacity Blocks for ML); the fleet's own
scale-in, an hour before, lets the load balancer drain every host first."""


def capacity_source_problems(*, several_types: bool, spot_percent: int, on_demand_base: int | None,
                             max_capacity: int | None, reservations: tuple[str, ...] | list[str],
                             preference: str | None, warm_pool: bool,
                             block: str | None) -> list[tuple[str, object, str]]:
    """Where a fleet's hosts come from, as ``(name, value, allowed)`` (the settings' keys, which the fleet's
    props share): several instance types, Spot, Capacity Reservations, a Capacity Block. ``max_capacity``
    is ``None`` when only CloudFormation knows it."""
    problems: list[tuple[str, object, str]] = []
    if warm_pool and (several_types or spot_percent):
        problems.append(("warm_pool", True, "cannot be combined with " + (
            "several instance_types" if several_types else f"spot_percent {spot_percent}") + ": Auto Scaling "
            "keeps no warm pool for a group with a mixed instances policy or Spot Instances (Amazon EC2 Auto "
            "Scaling User Guide, warm pools, limitations)"))
    if on_demand_base is not None:
        if not spot_percent:
            problems.append(("on_demand_base_capacity", on_demand_base, "applies only with spot_percent above 0"))
        elif max_capacity is not None and not 0 <= on_demand_base <= max_capacity:
            problems.append(("on_demand_base_capacity", on_demand_base, f"must be 0 to max_capacity ({max_capacity})"))
    if preference == "none" and reservations:
        problems.append(("capacity_reservation_preference", preference, "contradicts capacity_reservations: give "
                         "capacity-reservations-first or -only, or leave the reservations out"))
    if preference == "capacity-reservations-only" and spot_percent:
        problems.append(("capacity_reservation_preference", preference, "puts every host in a reservation, which "
                         f"a Spot host never is: set spot_percent 0 (it is {spot_percent})"))
    if block is not None:
        if several_types:
            problems.append(("instance_types", "several", f"must be one type with capacity_block {block}: a block "
                             "reserves one instance type"))
        for name, value in (("spot_percent", spot_percent), ("capacity_reservations", reservations),
                            ("capacity_reservation_preference", preference)):
            if value:
                problems.append((name, value, f"does not apply with capacity_block {block}: its hosts run in the "
                                 "block"))
    return problems
