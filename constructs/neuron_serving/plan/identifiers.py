"""The identifiers a configuration names: ARNs, AMI and VPC ids, S3 URIs, cron
expressions. Each check returns ``None`` for a value of the right shape, else what is allowed, in
the house wording (``setting (value) <what is allowed>``, see :func:`~.errors.problem`), so a typo
stops synthesis instead of a deployment an hour later.

Shape only: whether the thing exists, and may be used, is for the deployment to find out.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable

Check = Callable[[str], "str | None"]
"""A shape check: ``None`` when the value has the shape, else what is allowed."""

_PARTITION = r"arn:aws(?:-cn|-us-gov|-iso|-iso-b)?"
"""The partitions' ARN prefixes (IAM User Guide, "IAM identifiers", ARN format)."""

_REGION = r"[a-z]{2}(?:-gov|-iso|-isob)?-[a-z]+-\d"
_ACCOUNT = r"\d{12}"

_CERTIFICATE = re.compile(rf"{_PARTITION}:acm:{_REGION}:{_ACCOUNT}:certificate/[0-9a-f-]{{36}}")
"""ACM certificate ARNs end in a UUID (ACM API Reference, CertificateSummary.CertificateArn:
``arn:aws:acm:region:123456789012:certificate/12345678-1234-1234-1234-123456789012``)."""

_SECRET_ARN = re.compile(rf"{_PARTITION}:secretsmanager:{_REGION}:{_ACCOUNT}:secret:[A-Za-z0-9/_+=.@-]{{1,512}}")
_SECRET_NAME = re.compile(r"[A-Za-z0-9/_+=.@-]{1,512}")
"""Secrets Manager names: 1 to 512 of ASCII letters, digits and ``/_+=.@-`` (Secrets Manager API
Reference, CreateSecret, Name)."""

_TOPIC = re.compile(rf"{_PARTITION}:sns:{_REGION}:{_ACCOUNT}:[A-Za-z0-9_-]{{1,256}}(?:\.fifo)?")
"""SNS topic names: up to 256 letters, digits, hyphens and underscores (SNS API Reference,
CreateTopic, Name)."""

_AMI = re.compile(r"ami-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_VPC = re.compile(r"vpc-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_SUBNET = re.compile(r"subnet-(?:[0-9a-f]{8}|[0-9a-f]{17})")
"""EC2 resource ids: the prefix, then 8 (older) or 17 hexadecimal digits (EC2 User Guide,
"Resource IDs")."""

_AZ = re.compile(rf"{_REGION}[a-z]")

_BUCKET = re.compile(r"(?!xn--)(?!sthree-)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](?<!-s3alias)(?<!--ol-s3)")
"""General purpose bucket names: 3 to 63 lowercase letters, digits, dots and hyphens, beginning and
ending with a letter or digit, without the reserved prefixes and suffixes (S3 User Guide, "General
purpose bucket naming rules")."""

_HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
"""A Hub repository id, ``namespace/name`` (huggingface_hub ``validate_repo_id``: letters, digits,
``-_.``, at most 96 characters each)."""

_DLAMI_PARAMETER = re.compile(r"/[A-Za-z0-9_./-]{1,1010}")

_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


def certificate_arn(value: str) -> str | None:
    if _CERTIFICATE.fullmatch(value):
        return None
    return "must be an ACM certificate ARN: arn:aws:acm:<region>:<12-digit account>:certificate/<uuid>"


def secret(value: str) -> str | None:
    """A Secrets Manager secret, by name or ARN."""
    if value.startswith("arn:"):
        if _SECRET_ARN.fullmatch(value):
            return None
        return "must be a Secrets Manager secret ARN: arn:aws:secretsmanager:<region>:<12-digit account>:secret:<name>"
    if _SECRET_NAME.fullmatch(value):
        return None
    return "must be a secret's name (1 to 512 of letters, digits and /_+=.@-) or its ARN"


def topic_arn(value: str) -> str | None:
    if _TOPIC.fullmatch(value):
        return None
    return "must be an SNS topic ARN: arn:aws:sns:<region>:<12-digit account>:<name>"


def ami_id(value: str) -> str | None:
    return None if _AMI.fullmatch(value) else "must be an AMI id: ami- and 8 or 17 lowercase hexadecimal digits"


def vpc_id(value: str) -> str | None:
    return None if _VPC.fullmatch(value) else "must be a VPC id: vpc- and 8 or 17 lowercase hexadecimal digits"


def subnet_id(value: str) -> str | None:
    return None if _SUBNET.fullmatch(value) else "must be a subnet id: subnet- and 8 or 17 lowercase hexadecimal digits"


def availability_zone(value: str) -> str | None:
    return None if _AZ.fullmatch(value) else "must be an Availability Zone name such as us-east-1a"


def ssm_parameter(value: str) -> str | None:
    return None if _DLAMI_PARAMETER.fullmatch(value) else "must be an SSM parameter name starting with /"


def email(value: str) -> str | None:
    return None if _EMAIL.fullmatch(value) else "must be one e-mail address"


_HUB_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")


def hub_revision(value: object) -> str | None:
    """A Hub commit, branch or tag."""
    if isinstance(value, str) and _HUB_REVISION.fullmatch(value):
        return None
    return "must be a Hub commit, branch or tag: letters, digits and ._/- only, at most 255 characters, or None"


def hub_repo(value: str) -> str | None:
    """A Hub repository id, ``namespace/name``."""
    if _HF_REPO.fullmatch(value):
        return None
    return ("must be a Hugging Face Hub repository id, <namespace>/<name> (letters, digits and -_. only, at most "
            "96 characters each)")


def s3_uri(value: str) -> str | None:
    """``s3://bucket`` or ``s3://bucket/prefix``."""
    if value.startswith("s3://"):
        bucket, _, key = value.removeprefix("s3://").partition("/")
        if _BUCKET.fullmatch(bucket) and ".." not in bucket and not any(c.isspace() for c in key):
            return None
    return "must be an S3 URI, s3://<bucket>/<prefix>, with a valid bucket name and no spaces"


def export_location(value: str) -> str | None:
    """Where a prebuilt export lives: an S3 prefix or a Hub repository."""
    if value.startswith("hf://"):
        if _HF_REPO.fullmatch(value.removeprefix("hf://")):
            return None
        return "must be s3://<bucket>/<prefix> or hf://<namespace>/<repository>"
    if s3_uri(value) is None:
        return None
    return "must be s3://<bucket>/<prefix> or hf://<namespace>/<repository>"


_CAPACITY_RESERVATION = re.compile(r"cr-[0-9a-f]{17}")
_RESOURCE_GROUP = re.compile(rf"{_PARTITION}:resource-groups:{_REGION}:{_ACCOUNT}:group/"
                             r"(?:[a-zA-Z0-9_.-]{1,300}|[a-zA-Z0-9_.-]{1,150}/[a-z0-9]{26})")
"""A Capacity Reservation's id (``cr-`` and 17 hex digits, as EC2 prints them) and a resource group's ARN
(GroupArn's pattern in the Resource Groups API model, botocore/data/resource-groups/2017-11-27/service-2.json
of awscli 1.46.3)."""

_UTC_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2})?Z")


def capacity_reservation(value: str) -> str | None:
    """A Capacity Reservation the fleet targets: its id, or a resource group of reservations."""
    if _CAPACITY_RESERVATION.fullmatch(value) or _RESOURCE_GROUP.fullmatch(value):
        return None
    return ("must be a Capacity Reservation id (cr- and 17 hex digits) or the ARN of a resource group of "
            "reservations (arn:aws:resource-groups:<region>:<account>:group/<name>)")


def capacity_block(value: str) -> str | None:
    """A Capacity Block for ML, which is a Capacity Reservation: its id."""
    if _CAPACITY_RESERVATION.fullmatch(value):
        return None
    return "must be the Capacity Block's reservation id (cr- and 17 hex digits)"


def utc_time_value(value: str) -> datetime.datetime:
    """A time :func:`utc_time` accepts, as an aware ``datetime``."""
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def utc_time(value: str) -> str | None:
    """A moment in UTC, ``YYYY-MM-DDTHH:MM[:SS]Z`` (ISO 8601), as EC2 and Auto Scaling print times."""
    if _UTC_TIME.fullmatch(value):
        try:
            utc_time_value(value)
            return None
        except ValueError:
            pass
    return "must be a time in UTC, YYYY-MM-DDTHH:MMZ (such as 2026-12-01T11:30Z)"


_CRON_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")),
    ("day of week", 0, 7, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)
"""Unix cron, which Auto Scaling's scheduled actions take (Auto Scaling API Reference,
PutScheduledUpdateGroupAction, Recurrence: "in Unix cron syntax format"; fields and names as in
crontab(5): minute, hour, day of month, month, day of week with 0 and 7 both Sunday)."""


def cron(value: str) -> str | None:
    """A five-field Unix cron expression (UTC)."""
    fields = value.split()
    if len(fields) != len(_CRON_FIELDS):
        return "must be a cron expression of 5 fields (minute hour day month weekday), such as '0 20 * * 1-5'"
    for text, (name, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        if not all(_cron_item(item, low, high, names) for item in text.split(",")):
            return f"has a bad {name} field {text!r}: numbers {low}-{high}, ranges a-b, lists a,b, steps */n or a-b/n"
    return None


def _cron_item(item: str, low: int, high: int, names: tuple[str, ...]) -> bool:
    span, _, step = item.partition("/")
    if step and not (step.isdigit() and int(step) > 0):
        return False
    if span == "*":
        return True
    first, _, last = span.partition("-")
    values = [_cron_value(v, low, names) for v in ((first, last) if last else (first,))]
    numbers = [v for v in values if v is not None and low <= v <= high]
    return len(numbers) == len(values) and numbers == sorted(numbers)


def _cron_value(text: str, low: int, names: tuple[str, ...]) -> int | None:
    if text.isdigit():
        return int(text)
    upper = text.upper()
    return names.index(upper) + (low if names and low == 1 else 0) if upper in names else None
