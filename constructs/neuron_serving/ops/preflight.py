"""``neuron-serving preflight``: will this stack deploy here? Checks, with read-only AWS calls, what
synth cannot: that the region offers each of the fleet's instance types in the AZs the hosts launch
in, that the account's On-Demand (and, with ``spot_percent``, Spot) vCPU quota covers the fleet, that
the machine image resolves, that the secrets exist, that the CDK bootstrap stack is new enough, which
capacity reservations the hosts could use, and that the reservations and the Capacity Block the
settings name exist, are of the fleet's types and zones, and are usable.

The settings are the stack's own: the ``context`` of the app's cdk.json, then cdk.context.json,
then ``-c key=value``, validated by :meth:`StackSettings.from_context` and planned as synth plans
them, so bad settings fail here with synth's words (exit status 2) before any AWS call.

Each check becomes one row (pass, warn, fail, or skip when it does not apply); a check that AWS
refuses becomes a ``fail`` row naming the refused IAM action, and the others still run. Exit
status: 0 when nothing failed, 1 when a check failed or AWS could not be reached at all (no
credentials, no region), 2 for bad settings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..plan.engines import check_dlami_parameter
from ..plan.errors import ServingConfigError, problem
from ..plan.instances import INSTANCES, InstanceSpec
from ..settings import StackSettings
from .aws import EXIT_FAILURE, REGION_HELP, Aws, OpsError, run_aws
from .output import Printer, output_option

EXIT_BAD_SETTINGS = 2
"""The exit status for settings synth would refuse too (and for a missing cdk.json)."""

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"

DEFAULT_TOOLKIT_STACK = "CDKToolkit"
"""The bootstrap stack's name unless ``cdk bootstrap --toolkit-stack-name`` chose another."""

REQUIRED_BOOTSTRAP_VERSION = 6
"""What stacks synthesized by aws-cdk-lib 2.275.0 need: its DefaultStackSynthesizer requires
MIN_BOOTSTRAP_STACK_VERSION = 6 for deployment (``_requiredBootstrapVersionForDeployment``, and the
template's CheckBootstrapVersion rule refuses versions 1 to 5), unless session tags are configured,
which this app does not do (aws-cdk-lib 2.275.0, core/lib/stack-synthesizers/default-synthesizer.js,
read from the jsii bundle aws_cdk/_jsii/aws-cdk-lib@2.275.0.jsii.tgz)."""

VCPU_QUOTAS = {
    "inf2": ("L-1945791B", "Running On-Demand Inf instances"),
    "trn1": ("L-2C3B7624", "Running On-Demand Trn instances"),
}
"""Service Quotas codes (service code ``ec2``) of the on-demand vCPU quota of each family in the
catalog (trn1n counts against Trn). Codes and names as listed by ListServiceQuotas, quoted in
brennerm/aws-quota-checker aws_quota/check/ec2.py (Inf) and scttfrdmn/mycelium
truffle/pkg/quotas/quotas.go (QuotaCodeInf, QuotaCodeTrn)."""

SPOT_VCPU_QUOTAS = {
    "inf2": ("L-B5D1601B", "All Inf Spot Instance Requests"),
    "trn1": ("L-6B0D517C", "All Trn Spot Instance Requests"),
}
"""Service Quotas codes (service code ``ec2``) of the Spot vCPU quota of each family in the catalog,
counting the vCPUs of open and active Spot requests. Codes as zuul lists them, ``INSTANCE_QUOTA_CODES``
``'inf': ['L-1945791B', 'L-B5D1601B']`` and ``'trn': ['L-2C3B7624', 'L-6B0D517C']`` ([on-demand, spot],
zuul/driver/aws/const.py, read in the fork pythonerdog/zuul at 04c4541); the Inf one also in
brennerm/aws-quota-checker aws_quota/check/ec2.py (SpotInfRequestCountCheck). scttfrdmn/mycelium
truffle/pkg/quotas/quotas.go gives L-5480EFD2 for Trn Spot, which zuul's HOST_QUOTA_CODES lists as
the Dedicated Hosts quota of ``inf``: not used."""

QUOTA_TYPE_PREFIXES = {"inf2": "inf", "trn1": "trn"}
"""The instance types counting against the same quota: every Inf (or Trn) generation shares it, as
the quota's name says. Matched here rather than with an EC2 filter wildcard."""

@dataclass(frozen=True)
class Check:
    """One row: what was checked, its ``result`` (pass, warn, fail, skip), what was found, and for a
    failure what to do."""

    check: str
    result: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Target:
    """Where the hosts launch and how many vCPUs they may take."""

    region: str
    settings: StackSettings
    spec: InstanceSpec
    machine_parameter: str | None
    vpc_id: str | None
    toolkit_stack: str

    @property
    def fleet(self) -> bool:
        return self.settings.fleet == "asg"

    @property
    def max_hosts(self) -> int:
        return self.settings.capacity()[1] if self.fleet else 1

    @property
    def types(self) -> tuple[str, ...]:
        """The instance types the hosts may be, in order of preference (a single instance: its own)."""
        return self.settings.fleet_types if self.fleet else (self.spec.name,)

    @property
    def replicas(self) -> dict[str, int]:
        """Each type's replicas per host: its weight in the group when there are several types."""
        plans = self.settings.layouts() if self.fleet else (self.settings.plan(),)
        return {kind: len(plan.replicas) for kind, plan in zip(self.types, plans, strict=True)}

    @property
    def max_units(self) -> int:
        """The group's maximum in replicas: hosts of ``instance_type`` times its replicas per host."""
        return self.max_hosts * self.replicas[self.spec.name]

    def split(self) -> tuple[int, int]:
        """The replicas the group may run On-Demand and on Spot at its maximum: the base (in hosts of
        ``instance_type``, default the group's minimum) and ``100 - spot_percent`` % of the rest On-Demand,
        ``spot_percent`` % of the rest on Spot (Auto Scaling's InstancesDistribution,
        OnDemandBaseCapacity and OnDemandPercentageAboveBaseCapacity). Both shares are rounded up, so
        each quota is checked against the most its share could be, whichever way Auto Scaling rounds."""
        total = self.max_units
        percent = self.settings.spot_percent if self.fleet else 0
        if not percent:
            return total, 0
        base = self.settings.on_demand_base_capacity
        base_hosts = self.settings.capacity()[0] if base is None else base
        base_units = min(base_hosts, self.max_hosts) * self.replicas[self.spec.name]
        rest = total - base_units
        return base_units + math.ceil(rest * (100 - percent) / 100), math.ceil(rest * percent / 100)

    def worst_hosts(self, units: int) -> tuple[str, int, int]:
        """``(type, hosts, vCPUs)``: of the fleet's types, the one whose hosts for ``units`` replicas take
        the most vCPUs (the group could launch ``ceil(units / replicas)`` of any one type), earliest first."""
        best = ("", 0, -1)
        for kind in self.types:
            hosts = math.ceil(units / self.replicas[kind])
            vcpus = hosts * INSTANCES[kind].vcpus
            if vcpus > best[2]:
                best = (kind, hosts, vcpus)
        return best


# ---------------------------------------------------------------------------------------------------------------
# Settings, as synth reads them


def read_context(app_dir: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """The app's context: ``-c`` over cdk.json's ``context`` over cdk.context.json.

    That order is the CDK CLI's: ``Configuration.load`` builds its Context from the command line's
    bag, then cdk.json's ``context``, then cdk.context.json (then ~/.cdk.json, which preflight
    does not read), and the first bag holding a key wins (aws/aws-cdk-cli,
    packages/aws-cdk/lib/cli/user-configuration.ts)."""
    cdk_json = app_dir / "cdk.json"
    if not cdk_json.is_file():
        raise _settings_error("app_dir", str(app_dir),
                                        "holds no cdk.json: run in the app's directory or pass --app-dir")
    context: dict[str, Any] = {}
    for path in (app_dir / "cdk.context.json", cdk_json):
        if not path.is_file():
            continue
        try:
            document = json.loads(path.read_text())
        except ValueError as err:
            raise _settings_error(str(path), None, f"is not valid JSON ({err})") from None
        bag = document.get("context", {}) if path == cdk_json else document
        if not isinstance(bag, dict):
            raise _settings_error(str(path), None, "must hold a JSON object of context keys")
        context.update(bag)
    for item in overrides:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise _settings_error("-c", item, "must be key=value")
        context[key.strip()] = value
    return context


def _settings_error(setting: str, value: object, allowed: str) -> ServingConfigError:
    return ServingConfigError([problem(setting, value, allowed)])


def target_of(args: argparse.Namespace, region: str) -> Target:
    """The validated settings and where they put the hosts; :class:`ServingConfigError` as synth
    raises it (settings, then the layout, then the image and its DLAMI parameter, as
    ``NeuronLlamaStack`` checks them)."""
    context = read_context(Path(args.app_dir), args.context or [])
    settings = StackSettings.from_context(context.get, given=context)
    parameter = None
    if not settings.ami_id:
        image = settings.host().image
        parameter = settings.dlami_parameter or image.dlami_parameter
        check_dlami_parameter(image, parameter)
    return Target(region, settings, INSTANCES[settings.request.instance_type], parameter, args.vpc_id,
                  args.toolkit_stack_name)


# ---------------------------------------------------------------------------------------------------------------
# The checks


def _denied_row(name: str, fix: str = "") -> Callable[[OpsError], Check]:
    def row(err: OpsError) -> Check:
        return Check(name, FAIL, str(err), fix or "grant the action named, or run as an identity that has it")

    return row


def check_zones(aws: Aws, target: Target) -> tuple[Check, list[str]]:
    """The AZs offering each of the fleet's types, against the AZs of the subnets the hosts launch in."""
    name = "availability zones"
    kind = target.spec.name
    offerings = {t: _offered(aws, t) for t in target.types}
    offered = offerings[kind]
    settings = target.settings
    if settings.capacity_block_zone is not None:
        # A Capacity Block's hosts launch in its zone only (cdk/fleet.py).
        zones, where = [settings.capacity_block_zone], "the Capacity Block's zone (capacity_block_zone)"
    elif target.vpc_id is None and settings.availability_zones:
        zones, where = list(settings.availability_zones), "the stack's new VPC: availability_zones"
    elif target.vpc_id is None:
        zones, where = _new_vpc_zones(aws, target)
    else:
        zones, where = _private_subnet_zones(aws, target)
        if not zones:
            return Check(name, FAIL, f"VPC {target.vpc_id} has no private subnet with egress (a route to 0.0.0.0/0 "
                         "through a NAT or transit gateway, no route to an internet gateway), which is where the "
                         "hosts launch", "add private subnets with a NAT gateway, or pass another --vpc-id"), []
    used = zones[:1] if not target.fleet else zones
    if len(target.types) == 1:
        missing = [z for z in used if z not in offered]
        detail = (f"{kind} is offered in {', '.join(offered) or 'no AZ of ' + target.region}; the hosts launch in "
                  f"{', '.join(used)} ({where})")
        if not offered:
            return Check(name, FAIL, detail, f"pick a region that offers {kind} (`aws ec2 describe-instance-type-"
                         f"offerings --filters Name=instance-type,Values={kind}` per region), or another type"), used
        if missing:
            fix = (f"choose a region whose {'first AZ' if not target.fleet else 'first two AZs'} offer {kind}, or pass "
                   f"a VPC (--vpc-id, and the same VPC to the stack) whose private subnets are in {', '.join(offered)}")
            return Check(name, FAIL, f"{detail}: not offered in {', '.join(missing)}", fix), used
        result, fix = PASS, ""
    else:
        # Several types: the group launches, in each of its AZs, whichever of them that AZ offers. A type no AZ of
        # the hosts offers is never launched; an AZ offering none of them launches nothing.
        there = {t: [z for z in used if z in offerings[t]] for t in target.types}
        detail = f"the hosts launch in {', '.join(used)} ({where}); " + "; ".join(
            f"{t} is offered in {', '.join(there[t]) or 'none of them'}"
            + (f" (in the region: {', '.join(offerings[t]) or 'nowhere'})" if there[t] != offerings[t] else "")
            for t in target.types)
        nowhere = [t for t in target.types if not there[t]]
        bare = [z for z in used if not any(z in offerings[t] for t in target.types)]
        if nowhere:
            return Check(name, FAIL, f"{detail}: the group can never launch {', '.join(nowhere)}",
                         f"drop {', '.join(nowhere)} from instance_types, or launch the hosts in AZs that offer it "
                         "(--vpc-id, and the same VPC to the stack)"), used
        result, fix = PASS, ""
        if bare:
            detail += f": {', '.join(bare)} offers none of the fleet's types, so the group launches no host there"
            result, fix = WARN, "add a type offered there to instance_types, or launch the hosts in other AZs"
    builder = target.settings.builder
    if builder is not None:
        # The builder's group launches in any of the private subnets: one AZ offering it is enough.
        for_builder = [z for z in zones if z in _offered(aws, builder.instance.name)]
        detail += f"; the export builder, {builder.instance.name}, in {', '.join(for_builder) or 'none of them'}"
        if not for_builder:
            return Check(name, FAIL, detail, f"choose a builder_instance_type offered in {', '.join(zones)}"), used
    return Check(name, result, detail, fix), used


def _offered(aws: Aws, kind: str) -> list[str]:
    """The AZs of the region that offer the instance type ``kind``."""
    offerings = aws.pages("ec2", "describe_instance_type_offerings", kind, "InstanceTypeOfferings",
                          LocationType="availability-zone",
                          Filters=[{"Name": "instance-type", "Values": [kind]}])
    return sorted({str(o["Location"]) for o in offerings})


def _new_vpc_zones(aws: Aws, target: Target) -> tuple[list[str], str]:
    """The AZs of the stack's new VPC: ``ec2.Vpc(max_azs=2)`` in an environment-agnostic stack puts its
    subnets in ``Fn::Select [0|1, Fn::GetAZs ""]``. Fn::GetAZs lists the region's AZs in alphabetical
    order, only those with a default subnet unless none has one
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/intrinsic-function-reference-getavailabilityzones.html).
    A single instance launches in the first selected subnet (cdk/instance.py), so in the first AZ."""
    zones = aws.call("ec2", "describe_availability_zones", target.region,
                     Filters=[{"Name": "zone-type", "Values": ["availability-zone"]},
                              {"Name": "state", "Values": ["available"]}])["AvailabilityZones"]
    names = sorted(str(z["ZoneName"]) for z in zones)
    defaults = aws.pages("ec2", "describe_subnets", "default subnets", "Subnets",
                         Filters=[{"Name": "default-for-az", "Values": ["true"]}])
    with_default = {str(s["AvailabilityZone"]) for s in defaults}
    if with_default:
        names = [n for n in names if n in with_default]
    return names[:2], "the stack's new VPC: the first two AZs Fn::GetAZs lists"


def _private_subnet_zones(aws: Aws, target: Target) -> tuple[list[str], str]:
    """The AZs of the VPC's private subnets, sorted, as ``ec2.Vpc.from_lookup`` groups them."""
    vpc_id = str(target.vpc_id)
    where = [{"Name": "vpc-id", "Values": [vpc_id]}]
    aws.call("ec2", "describe_vpcs", vpc_id, explain=_vpc_not_found(vpc_id, target.region), VpcIds=[vpc_id])
    subnets = aws.pages("ec2", "describe_subnets", vpc_id, "Subnets", Filters=where)
    tables = aws.pages("ec2", "describe_route_tables", vpc_id, "RouteTables", Filters=where)
    zones = sorted({str(s["AvailabilityZone"]) for s in subnets if subnet_type(s, tables) == "Private"})
    return zones, f"the private subnets of {vpc_id}"


def _vpc_not_found(vpc_id: str, region: str) -> Callable[[str, str], str | None]:
    def explain(code: str, message: str) -> str | None:
        if code in ("InvalidVpcID.NotFound", "InvalidVpcID.Malformed"):
            return f"VPC {vpc_id} not found in {region}: check --vpc-id and --region"
        return None

    return explain


def subnet_type(subnet: Mapping[str, Any], tables: Sequence[Mapping[str, Any]]) -> str:
    """Public, Private or Isolated, decided as aws-cdk's VPC context provider (behind
    ``Vpc.fromLookup``) decides: the ``aws-cdk:subnet-type`` tag; else Public when the subnet maps
    public IPs on launch or its route table has a route to an internet gateway (``igw-``); else
    Private when it routes 0.0.0.0/0 to a NAT gateway or a transit gateway; else Isolated. A subnet
    with no route table of its own uses the VPC's main one (aws/aws-cdk-cli
    packages/@aws-cdk/toolkit-lib/lib/context-providers/vpcs.ts, ``readVpcProps`` and
    ``RouteTables``; read in the fork orien/aws-cdk-cli at 2093af0)."""
    tags = {t.get("Key"): t.get("Value") for t in subnet.get("Tags", [])}
    if tags.get("aws-cdk:subnet-type"):
        return str(tags["aws-cdk:subnet-type"])
    if subnet.get("MapPublicIpOnLaunch"):
        return "Public"
    own = [t for t in tables if any(a.get("SubnetId") == subnet.get("SubnetId") for a in t.get("Associations", []))]
    main = [t for t in tables if any(a.get("Main") for a in t.get("Associations", []))]
    routes = [r for t in (own or main)[:1] for r in t.get("Routes", [])]
    if any(str(r.get("GatewayId", "")).startswith("igw-") for r in routes):
        return "Public"
    if any((r.get("NatGatewayId") or r.get("TransitGatewayId")) and r.get("DestinationCidrBlock") == "0.0.0.0/0"
           for r in routes):
        return "Private"
    return "Isolated"


def check_quota(aws: Aws, target: Target, *, spot: bool = False) -> Check:
    """The family's On-Demand (or Spot) vCPU quota against the most vCPUs the group could run in that
    market, and what already runs there. With several types the group counts replicas, so the worst
    case is, over the fleet's types, the vCPUs of the hosts of one type holding the market's share."""
    name = "Spot vCPU quota" if spot else "vCPU quota"
    code, title = (SPOT_VCPU_QUOTAS if spot else VCPU_QUOTAS)[target.spec.family]
    on_demand, on_spot = target.split()
    units = on_spot if spot else on_demand
    kind, count, need = target.worst_hosts(units)
    hosts = f"{count} x {kind} ({INSTANCES[kind].vcpus} vCPUs each)"
    if len(target.types) > 1:
        hosts += f", the most vCPUs of the fleet's types for {units} replicas"
    if on_spot:
        percent = target.settings.spot_percent
        share = (f"{percent}% of the replicas above the On-Demand base" if spot else
                 f"the On-Demand base and {100 - percent}% of the replicas above it")
        hosts = f"{share} ({units} of {target.max_units} replicas): {hosts}"
    builder = target.settings.builder
    if builder is not None and not spot:
        # The export builder runs beside the first hosts, which wait for its export; same family, same quota.
        need += builder.instance.vcpus
        hosts += f" and the export builder, 1 x {builder.instance.name} ({builder.instance.vcpus} vCPUs)"
    quota = _quota_value(aws, code)

    def increase(vcpus: float) -> str:
        return (f"request at least {vcpus:g} vCPUs for {title!r}: `aws service-quotas request-service-quota-increase "
                f"--service-code ec2 --quota-code {code} --desired-value {vcpus:g} --region {target.region}`")

    detail = f"{title} ({code}) is {quota:g} vCPUs; {hosts} need {need}"
    if quota < need:
        return Check(name, FAIL, detail, increase(need))
    try:
        used = _running_vcpus(aws, target.spec.family, spot=spot)
    except OpsError as err:
        return Check(name, WARN, f"{detail}; could not count the running instances using it: {err}")
    running = "running Spot instances" if spot else "running instances"
    if used and used + need > quota:
        return Check(name, WARN, f"{detail}, but {running} of the quota already use {used} vCPUs, "
                     f"leaving {quota - used:g}", f"stop some of them, or {increase(used + need)}")
    return Check(name, PASS, detail + (f"; {running} use {used}" if used else ""))


def _quota_value(aws: Aws, code: str) -> float:
    """The account's applied value, else AWS's default (GetServiceQuota answers NoSuchResourceException
    for a quota never changed in the account: Service Quotas API reference, GetServiceQuota)."""
    from_default: list[bool] = []

    def explain(error_code: str, message: str) -> str | None:
        if error_code == "NoSuchResourceException":
            from_default.append(True)
            return "no applied value"
        return None

    try:
        answer = aws.call("service-quotas", "get_service_quota", code, explain=explain,
                          ServiceCode="ec2", QuotaCode=code)
    except OpsError:
        if not from_default:
            raise
        answer = aws.call("service-quotas", "get_aws_default_service_quota", code, ServiceCode="ec2", QuotaCode=code)
    return float(answer["Quota"]["Value"])


def _running_vcpus(aws: Aws, family: str, *, spot: bool = False) -> int:
    """vCPUs of the pending and running On-Demand instances of the family's quota (Spot instances
    count against the Spot quota instead), or with ``spot`` of its running Spot instances."""
    reservations = aws.pages("ec2", "describe_instances", f"{family} instances", "Reservations",
                             Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    total = 0
    for instance in (i for r in reservations for i in r.get("Instances", [])):
        kind = str(instance.get("InstanceType", ""))
        if (instance.get("InstanceLifecycle") == "spot") != spot or not kind.startswith(QUOTA_TYPE_PREFIXES[family]):
            continue
        known = INSTANCES.get(kind)
        cpu = instance.get("CpuOptions") or {}
        total += known.vcpus if known else int(cpu.get("CoreCount", 0)) * int(cpu.get("ThreadsPerCore", 1))
    return total


def check_image(aws: Aws, target: Target) -> Check:
    name = "machine image"
    ami_id = target.settings.ami_id
    if ami_id:
        def missing_ami(code: str, message: str) -> str | None:
            if code.startswith("InvalidAMIID"):
                return f"ami_id {ami_id} does not exist in {target.region} ({code})"
            return None

        images = aws.call("ec2", "describe_images", ami_id, explain=missing_ami, ImageIds=[ami_id])["Images"]
        if not images:
            return Check(name, FAIL, f"ami_id {ami_id} is not visible in {target.region}",
                         "copy the AMI to this region (AMI ids differ per region), or drop ami_id for the DLAMI")
        image = images[0]
        state = str(image.get("State", "available"))
        detail = f"ami_id {ami_id}: {image.get('Name', '')} ({state}, {image.get('Architecture', '?')})"
        if state != "available":
            return Check(name, FAIL, detail, "wait for the image to become available, or pick another ami_id")
        return Check(name, PASS, detail)
    parameter = str(target.machine_parameter)

    def missing_parameter(code: str, message: str) -> str | None:
        if code == "ParameterNotFound":
            return f"SSM parameter {parameter} does not exist in {target.region}"
        return None

    value = aws.call("ssm", "get_parameter", parameter, explain=missing_parameter, Name=parameter)
    return Check(name, PASS, f"{parameter} resolves to {value['Parameter']['Value']} (EC2 resolves it again "
                 "at each launch)")


def check_secrets(aws: Aws, target: Target) -> list[Check]:
    """The secrets the stack refers to by name, without reading their values."""
    rows = []
    for key in ("hf_token_secret", "api_keys_secret"):
        secret = getattr(target.settings, key)
        name = f"secret {key}"
        if not secret:
            if key == "hf_token_secret":
                rows.append(Check(name, SKIP, "not configured (needed for gated models only)"))
            continue

        def missing(code: str, message: str, secret: str = secret, key: str = key) -> str | None:
            if code == "ResourceNotFoundException":
                return f"{key} {secret} not found in {target.region}"
            return None

        try:
            described = aws.call("secretsmanager", "describe_secret", secret, explain=missing, SecretId=secret)
        except OpsError as err:
            rows.append(Check(name, FAIL, str(err), f"create the secret in {target.region}, or fix -c {key}"
                              if "not found" in str(err) else "grant secretsmanager:DescribeSecret on it"))
            continue
        if described.get("DeletedDate"):
            rows.append(Check(name, FAIL, f"{key} {described['ARN']} is scheduled for deletion",
                              f"`aws secretsmanager restore-secret --secret-id {secret}`"))
            continue
        rows.append(Check(name, PASS, f"{described['ARN']} exists"))
    return rows


def check_bootstrap(aws: Aws, target: Target, account: str) -> Check:
    name = "CDK bootstrap"
    stack = target.toolkit_stack
    bootstrap = f"npx cdk bootstrap aws://{account}/{target.region}"

    def absent(code: str, message: str) -> str | None:
        if code == "ValidationError" and "does not exist" in message:
            return f"no bootstrap stack {stack} in {target.region}"
        return None

    try:
        (found,) = aws.call("cloudformation", "describe_stacks", stack, explain=absent, StackName=stack)["Stacks"]
    except OpsError as err:
        fix = bootstrap if "no bootstrap stack" in str(err) else "grant cloudformation:DescribeStacks on it"
        return Check(name, FAIL, str(err), fix)
    status = str(found.get("StackStatus", ""))
    outputs = {o.get("OutputKey"): o.get("OutputValue") for o in found.get("Outputs", [])}
    version_text = outputs.get("BootstrapVersion")
    if not status.endswith("_COMPLETE") or status.startswith(("ROLLBACK", "DELETE")):
        return Check(name, FAIL, f"{stack} is {status}", f"fix or delete {stack}, then `{bootstrap}`")
    if version_text is None or not str(version_text).isdigit():
        return Check(name, WARN, f"{stack} ({status}) has no BootstrapVersion output: is it a CDK bootstrap stack?",
                     f"`{bootstrap}`")
    version = int(str(version_text))
    detail = f"{stack} ({status}), version {version}; aws-cdk-lib 2.275 needs {REQUIRED_BOOTSTRAP_VERSION} or newer"
    if version < REQUIRED_BOOTSTRAP_VERSION:
        return Check(name, FAIL, detail, f"upgrade it: `{bootstrap}`")
    return Check(name, PASS, detail)


def check_reservations(aws: Aws, target: Target, zones: Iterable[str]) -> Check:
    """Active capacity reservations of the fleet's types: open ones in the hosts' AZs are used by any
    matching launch; targeted ones only by launches naming them (EC2 user guide, capacity reservations,
    instance eligibility: "open" and "targeted"), which are those of ``capacity_reservations``."""
    name = "capacity reservations"
    kinds = ", ".join(target.types)
    found = aws.pages("ec2", "describe_capacity_reservations", kinds, "CapacityReservations",
                      Filters=[{"Name": "instance-type", "Values": list(target.types)},
                               {"Name": "state", "Values": ["active"]}])
    if not found:
        return Check(name, PASS, f"none active for {kinds}: the hosts launch on regular on-demand capacity")
    zones = set(zones)
    named = set(target.settings.capacity_reservations)
    usable = [r for r in found if r.get("AvailabilityZone") in zones
              and (r.get("InstanceMatchCriteria") == "open" or r.get("CapacityReservationId") in named)]
    listing = "; ".join(f"{r.get('CapacityReservationId')}{_of_type(r, target)} in {r.get('AvailabilityZone')}: "
                        f"{r.get('AvailableInstanceCount', 0)} of {r.get('TotalInstanceCount', 0)} free "
                        f"({r.get('InstanceMatchCriteria')})" for r in found)
    if usable:
        free = sum(int(r.get("AvailableInstanceCount", 0)) for r in usable)
        what = target.spec.name if len(target.types) == 1 else "hosts"
        return Check(name, PASS, f"{free} {what} free in reservations they use (open, or named in "
                     f"capacity_reservations) in the hosts' AZs: {listing}")
    return Check(name, WARN, f"active reservations the hosts cannot use (another AZ, or targeted): {listing}",
                 "reservations are billed whether used or not: make them open in the hosts' AZs, name them in "
                 "capacity_reservations, or cancel them")


def _of_type(reservation: Mapping[str, Any], target: Target) -> str:
    """`` (type)`` after a reservation's id when the fleet has several types."""
    return f" ({reservation.get('InstanceType')})" if len(target.types) > 1 else ""


RESERVATION_TYPE = "AWS::EC2::CapacityReservation"
"""How Resource Groups names a capacity reservation member (ListGroupResources ``ResourceType``; EC2 user
guide, "Work with Capacity Reservation groups")."""

CAPACITY_BLOCK_STATES = ("scheduled", "active")
"""The states of a Capacity Block the fleet can still run in: paid and not yet begun, or running. The
others (``payment-pending``, ``payment-failed``, ``expired``, ``cancelled``, ...) are the
``CapacityReservationState`` enum of botocore 1.44.5's EC2 model (data/ec2/2016-11-15/service-2.json)."""

BLOCK_END_TOLERANCE = datetime.timedelta(minutes=1)
"""How far the block's EndDate may be from ``capacity_block_end``, which has minutes only."""


def check_named_reservations(aws: Aws, target: Target, zones: Sequence[str]) -> list[Check]:
    """Each of ``capacity_reservations``: a reservation id described, a resource group's reservations
    listed then described, each judged by :func:`_judge_reservation`. One row per entry."""
    rows = []
    for entry in target.settings.capacity_reservations:
        group = entry.startswith("arn:")
        name = f"reservation group {entry.rsplit('/', 1)[-1]}" if group else f"reservation {entry}"
        try:
            ids = _group_reservations(aws, entry) if group else [entry]
            if not ids:
                rows.append(Check(name, FAIL, f"resource group {entry} holds no capacity reservation",
                                  "add the reservations to the group, or drop it from capacity_reservations"))
                continue
            found = _describe_reservations(aws, ids, target.region)
        except OpsError as err:
            missing = "not found" in str(err) or "does not exist" in str(err)
            rows.append(Check(name, FAIL, str(err), "fix capacity_reservations, or create the reservation in "
                              f"{target.region}" if missing else "grant the action named, or run as an identity "
                              "that has it"))
            continue
        judged = [_judge_reservation(r, target, zones) for r in found]
        problems = [p for _, p in judged if p]
        detail = "; ".join(d for d, _ in judged)
        if group:
            detail = f"{entry}: {detail}"
        if problems:
            rows.append(Check(name, FAIL, f"{detail}: {'; '.join(problems)}",
                              "name reservations that are active, of the fleet's types and in the hosts' AZs"))
        elif all(int(r.get("AvailableInstanceCount", 0)) == 0 for r in found):
            rows.append(Check(name, WARN, f"{detail}: no instance free", "the hosts launch on regular On-Demand "
                              "capacity (with capacity-reservations-only, not at all) until one is free"))
        else:
            rows.append(Check(name, PASS, detail))
    return rows


def _group_reservations(aws: Aws, arn: str) -> list[str]:
    """The reservation ids of a resource group's members (ListGroupResources, ``Group`` and ``Resources``,
    the deprecated ``GroupName`` and ``ResourceIdentifiers`` aside: botocore 1.44.5
    data/resource-groups/2017-11-27/service-2.json)."""
    def missing(code: str, message: str) -> str | None:
        if code == "NotFoundException":
            return f"resource group {arn} not found ({message})"
        return None

    members = aws.pages("resource-groups", "list_group_resources", arn, "Resources", explain=missing, Group=arn,
                        Filters=[{"Name": "resource-type", "Values": [RESERVATION_TYPE]}])
    arns = [str(m.get("Identifier", {}).get("ResourceArn", "")) for m in members
            if m.get("Identifier", {}).get("ResourceType") == RESERVATION_TYPE]
    return [a.rsplit("/", 1)[-1] for a in arns]


def _describe_reservations(aws: Aws, ids: Sequence[str], region: str) -> list[Any]:
    def missing(code: str, message: str) -> str | None:
        if code.startswith("InvalidCapacityReservationId"):
            return f"{', '.join(ids)}: not found in {region} ({code})"
        return None

    found: list[Any] = aws.pages("ec2", "describe_capacity_reservations", ", ".join(ids), "CapacityReservations",
                                 explain=missing, CapacityReservationIds=list(ids))
    return found


def _judge_reservation(reservation: Mapping[str, Any], target: Target, zones: Sequence[str]) -> tuple[str, str]:
    """A reservation's line (id: state, type, zone, free count) and what is wrong with it, if anything."""
    rid, state = reservation.get("CapacityReservationId"), reservation.get("State")
    kind, zone = reservation.get("InstanceType"), reservation.get("AvailabilityZone")
    line = (f"{rid}: {state}, {kind} in {zone}, {reservation.get('AvailableInstanceCount', 0)} of "
            f"{reservation.get('TotalInstanceCount', 0)} free")
    wrong = []
    if state != "active":
        wrong.append(f"{rid} is {state}, not active")
    if kind not in target.types:
        wrong.append(f"{rid} is of {kind}, not of the fleet's types ({', '.join(target.types)})")
    if zones and zone not in zones:
        wrong.append(f"{rid} is in {zone}, not in the hosts' AZs ({', '.join(zones)})")
    return line, "; ".join(wrong)


def check_capacity_block(aws: Aws, target: Target) -> Check:
    """The Capacity Block for ML the settings name: a ``capacity-block`` reservation of ``instance_type``
    in ``capacity_block_zone``, scheduled or active, ending at ``capacity_block_end`` (EC2
    DescribeCapacityReservations: ``ReservationType``, ``State``, ``StartDate``, ``EndDate``)."""
    settings = target.settings
    block = str(settings.capacity_block)
    name = "capacity block"
    try:
        (found,) = _describe_reservations(aws, [block], target.region)
    except OpsError as err:
        missing = "not found" in str(err)
        return Check(name, FAIL, str(err), f"fix capacity_block, or purchase the block in {target.region}"
                     if missing else "grant the action named, or run as an identity that has it")
    kind, zone, state = found.get("InstanceType"), found.get("AvailabilityZone"), found.get("State")
    start, end = found.get("StartDate"), found.get("EndDate")
    detail = (f"{block}: {found.get('ReservationType', 'default')}, {state}, {found.get('TotalInstanceCount', 0)} x "
              f"{kind} in {zone}, from {_minute(start)} to {_minute(end)}")
    wrong = []
    if found.get("ReservationType") != "capacity-block":
        wrong.append(f"it is a {found.get('ReservationType', 'default')} reservation, not a Capacity Block")
    if kind != target.spec.name:
        wrong.append(f"its type is {kind}, not instance_type {target.spec.name}")
    if zone != settings.capacity_block_zone:
        wrong.append(f"its zone is {zone}, not capacity_block_zone {settings.capacity_block_zone}")
    if state not in CAPACITY_BLOCK_STATES:
        wrong.append(f"its state is {state}, not {' or '.join(CAPACITY_BLOCK_STATES)}")
    wanted = datetime.datetime.fromisoformat(str(settings.capacity_block_end).replace("Z", "+00:00"))
    if not isinstance(end, datetime.datetime) or abs(end - wanted) > BLOCK_END_TOLERANCE:
        wrong.append(f"it ends at {_minute(end)}, not capacity_block_end {settings.capacity_block_end}")
    if wrong:
        return Check(name, FAIL, f"{detail}: {'; '.join(wrong)}",
                     "set capacity_block_zone and capacity_block_end to the block's, or name another block")
    return Check(name, PASS, detail)


def _minute(moment: object) -> str:
    if isinstance(moment, datetime.datetime):
        return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ")
    return "?" if moment is None else str(moment)


def run_checks(aws: Aws, target: Target, account: str) -> list[Check]:
    """Every check; a refusal of one becomes its fail row and the next one runs."""
    rows: list[Check] = []
    zones: list[str] = []
    try:
        row, zones = check_zones(aws, target)
        rows.append(row)
    except OpsError as err:
        rows.append(_denied_row("availability zones")(err))
    steps: list[tuple[str, Callable[[], Check | list[Check]]]] = [
        ("vCPU quota", lambda: check_quota(aws, target)),
        *([("Spot vCPU quota", lambda: check_quota(aws, target, spot=True))] if target.split()[1] else []),
        ("machine image", lambda: check_image(aws, target)),
        ("secrets", lambda: check_secrets(aws, target)),
        ("CDK bootstrap", lambda: check_bootstrap(aws, target, account)),
        ("capacity reservations", lambda: check_reservations(aws, target, zones)),
    ]
    if target.fleet and target.settings.capacity_reservations:
        steps.append(("capacity_reservations", lambda: check_named_reservations(aws, target, zones)))
    if target.fleet and target.settings.capacity_block:
        steps.append(("capacity block", lambda: check_capacity_block(aws, target)))
    for name, step in steps:
        try:
            result = step()
        except OpsError as err:
            rows.append(_denied_row(name)(err))
            continue
        rows.extend(result if isinstance(result, list) else [result])
    return rows


# ---------------------------------------------------------------------------------------------------------------
# The command


def register(commands: Any) -> None:
    """Add ``preflight`` to the CLI's subcommands (``commands``, from ``add_subparsers``)."""
    parser = commands.add_parser(
        "preflight", parents=[output_option()], help="check an account and region before deploying",
        description=__doc__.split("\n\n")[0], epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--region", help=REGION_HELP)
    parser.add_argument("-c", "--context", action="append", metavar="KEY=VALUE",
                        help="a context value, as `cdk deploy -c` takes it (repeatable)")
    parser.add_argument("--app-dir", default=".", help="the CDK app's directory, holding cdk.json (default: .)")
    parser.add_argument("--vpc-id", help="for an app that passes its own VPC: check its private subnets instead of "
                                         "the stack's new VPC")
    parser.add_argument("--toolkit-stack-name", default=DEFAULT_TOOLKIT_STACK,
                        help=f"the CDK bootstrap stack (default: {DEFAULT_TOOLKIT_STACK})")
    parser.set_defaults(run=preflight_command)


_EPILOG = """\
Read-only calls, each needing its IAM action: sts:GetCallerIdentity,
ec2:DescribeInstanceTypeOfferings, ec2:DescribeAvailabilityZones, ec2:DescribeSubnets,
ec2:DescribeVpcs and ec2:DescribeRouteTables (with --vpc-id), servicequotas:GetServiceQuota and
servicequotas:GetAWSDefaultServiceQuota, ec2:DescribeInstances, ssm:GetParameter or
ec2:DescribeImages (with ami_id), secretsmanager:DescribeSecret (for configured secrets),
cloudformation:DescribeStacks, ec2:DescribeCapacityReservations, and
resource-groups:ListGroupResources (for resource groups in capacity_reservations).

Exit status: 0 nothing failed (warnings allowed), 1 a check failed or AWS was unreachable,
2 bad settings.
"""


def preflight_command(args: argparse.Namespace) -> int:
    """Run the checks and print them; see the module's docstring for the exit status."""
    printer = Printer(getattr(args, "output", "text"))
    # Settings first, and before any AWS call: they need no credentials.
    try:
        target = target_of(args, "")
    except ServingConfigError as err:
        print(f"neuron-serving: {err}", file=sys.stderr)
        return EXIT_BAD_SETTINGS

    def command() -> int:
        aws = Aws.connect(args.region)
        region = aws.region
        account = str(aws.call("sts", "get_caller_identity", "your credentials")["Account"])
        located = Target(region, target.settings, target.spec, target.machine_parameter, target.vpc_id,
                         target.toolkit_stack)
        rows = run_checks(aws, located, account)
        failed = any(r.result == FAIL for r in rows)
        _print(printer, located, account, rows)
        return EXIT_FAILURE if failed else 0

    return run_aws(command)


def _print(printer: Printer, target: Target, account: str, rows: Sequence[Check]) -> None:
    failed = [r for r in rows if r.result == FAIL]
    if printer.json:
        printer.document({
            "region": target.region, "account": account, "instance_type": target.spec.name,
            "instance_types": list(target.types),
            "fleet": target.settings.fleet, "max_hosts": target.max_hosts, "vpc_id": target.vpc_id,
            "ok": not failed, "checks": [asdict(r) for r in rows],
        })
        return
    title = (f"Preflight of {target.max_hosts} x {target.spec.name} ({target.settings.fleet}) in {target.region}, "
             f"account {account}")
    printer.print(printer.table(("check", "result", "detail", "fix"),
                                [(r.check, r.result, r.detail, r.fix) for r in rows], title=title, outcome_column=1))
    printer.print(f"{len(failed)} check(s) failed: fix them before `cdk deploy`." if failed
                  else "No check failed: ready to deploy.")
