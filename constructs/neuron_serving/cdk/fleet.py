"""An Auto Scaling fleet of Neuron hosts from the same launch template as the single instance."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import jsii
from aws_cdk import Acknowledgment, CfnResource, Duration, IStableNumberProducer, Lazy, Stack, Token, Validations
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns

from constructs import Construct

from ..plan import identifiers
from ..plan.errors import Problems, ServingConfigError, problem
from ..plan.identifiers import cron
from ..plan.timing import boot_minutes
from ..settings import limits
from .instance import NeuronServingLaunchTemplate
from .monitoring import NeuronServingMonitoring
from .validation import check_props

ASSUMED_REQUEST_SECONDS = 20
"""Average request duration behind the default scaling target: a batch slot serves about three
requests a minute."""


@jsii.implements(ec2.IConnectable, iam.IGrantable)
class NeuronServingFleet(Construct):
    """An Auto Scaling group of Neuron serving hosts over private subnets in every AZ.

    - Creation and rolling updates wait for each new host to signal that every replica serves;
      a failed boot signals failure with its reason, so a deployment fails in minutes.
    - Updates (model, layout, image or AMI) replace one host at a time and keep
      ``min_capacity - 1`` in service, so a fleet of two or more serves throughout.
    - ELB health checks, with a grace period that covers pull, export and load.
    - Scale-in lets in-flight generations finish: the group deregisters a host from the target
      group and waits out its deregistration delay before terminating it.
    - With a boot script that has ``interruptions`` (a Spot fleet), a termination lifecycle hook: each
      host drains and completes it once its requests in flight are done, and Capacity Rebalancing
      launches a Spot host's replacement before it terminates the host at risk.
    - Optional warm pool of stopped hosts that already hold the image and the export, when the
      boot script was given a ``warm_pool_hook``.

    :param vpc: the VPC.
    :param launch_template: the host definition; its boot script must signal this fleet.
    :param min_capacity: Default: 1.
    :param max_capacity: Default: 2.
    :param desired_capacity: Default: none (CloudFormation leaves the current size alone).
    :param vpc_subnets: Default: private subnets with egress, in every AZ.
    :param health_check_grace: Default: the boot script's boot timeout.
    :param instance_warmup: how long a new host's metrics are left out of scaling decisions.
        Default: the boot estimate of a host that finds the export in the cache.
    :param notifications_topic: receives every launch, termination and their failures.
        Default: a new topic, encrypted with a new customer-managed key (AWS-managed SNS keys
        cannot be granted to the Auto Scaling service), SSL only.
    :param spot_percent: the share of the fleet above ``on_demand_base_capacity`` that runs on Spot
        (0 to 100), allocated capacity-optimized across the instance types in their order, with capacity
        rebalancing (a host at elevated risk of interruption is replaced before it is interrupted).
        Default: 0 (On-Demand only).
    :param on_demand_base_capacity: with ``spot_percent``, the size (in hosts of the first instance type)
        that is always On-Demand. Default: ``min_capacity``.
    :param capacity_reservations: On-Demand Capacity Reservations to launch into: ids (``cr-...``) or
        ARNs of resource groups of reservations. Default: none.
    :param capacity_reservation_preference: ``capacity-reservations-first``, ``capacity-reservations-only``
        or ``none`` (the group's CapacityReservationSpecification). Default: ``capacity-reservations-first``
        with ``capacity_reservations``, else the launch template's (open reservations that match).
    :param capacity_block: a Capacity Block for ML the fleet runs in: the hosts launch into it, in its zone
        only, and a scheduled action scales the fleet to zero an hour before it ends. Default: none.

    **Several instance types.** When the boot script lays the plan out on several instance types
    (``NeuronBootScript(instance_types=...)``), the group launches any of them through a mixed instances
    policy, in their order of preference, and counts capacity in replicas: each type weighs its replica
    count (WeightedCapacity), and ``min_capacity``, ``max_capacity`` and ``desired_capacity`` are hosts of
    the first type, so the group holds ``min_capacity`` times its replicas whichever types it gets. The
    group may go above its maximum by up to the largest weight (Auto Scaling API reference, MaxSize).
    Creation waits for as many signals as the fewest hosts that hold the minimum.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        launch_template: NeuronServingLaunchTemplate,
        min_capacity: int = limits.DEFAULT_MIN_CAPACITY,
        max_capacity: int = limits.DEFAULT_MAX_CAPACITY,
        desired_capacity: int | None = None,
        vpc_subnets: ec2.SubnetSelection | None = None,
        health_check_grace: Duration | None = None,
        instance_warmup: Duration | None = None,
        notifications_topic: sns.ITopic | None = None,
        spot_percent: int = 0,
        on_demand_base_capacity: int | None = None,
        capacity_reservations: Sequence[str] = (),
        capacity_reservation_preference: str | None = None,
        capacity_block: CapacityBlock | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        boot_script = launch_template.boot_script
        hook = boot_script.warm_pool_hook
        layouts = boot_script.layouts
        problems = Problems()
        for name, value, allowed in limits.capacity_source_problems(
                several_types=len(layouts) > 1, spot_percent=spot_percent, on_demand_base=on_demand_base_capacity,
                max_capacity=None if Token.is_unresolved(max_capacity) else max_capacity,
                reservations=tuple(capacity_reservations), preference=capacity_reservation_preference,
                warm_pool=hook is not None, block=capacity_block.reservation_id if capacity_block else None):
            problems.add("launch_template" if name == "warm_pool" else name, value, allowed)
        if not 0 <= spot_percent <= 100:
            problems.add("spot_percent", spot_percent, "must be 0 to 100 percent")
        if capacity_reservation_preference not in (None, *limits.CAPACITY_RESERVATION_PREFERENCES):
            problems.add("capacity_reservation_preference", capacity_reservation_preference,
                         f"must be one of {', '.join(limits.CAPACITY_RESERVATION_PREFERENCES)}")
        for reservation in capacity_reservations:
            if (wrong := identifiers.capacity_reservation(reservation)) is not None:
                problems.add("capacity_reservations", reservation, wrong)
        if capacity_block is not None and (wrong := identifiers.capacity_block(capacity_block.reservation_id)):
            problems.add("capacity_block", capacity_block.reservation_id, wrong)
        self.weights: dict[str, int] | None = (
            {plan.instance.name: len(plan.replicas) for plan in layouts} if len(layouts) > 1 else None)
        """Each instance type's replicas, which it weighs in the group, with several types; else ``None``
        (the group counts hosts)."""
        unit = len(layouts[0].replicas) if self.weights else 1
        if self.weights and any(Token.is_unresolved(v) for v in (min_capacity, max_capacity, desired_capacity)):
            problems.add("min_capacity", min_capacity, "and max_capacity and desired_capacity must be known at "
                         "synth with several instance types: the group counts them in replicas")
        problems.add_all(check_props(self, [min_capacity, max_capacity, desired_capacity], _capacity_problems))
        if hook is not None:
            problems.add_all(check_props(
                self, [max_capacity],
                lambda high: [] if (wrong := limits.warm_pool_capacity(high)) is None else [problem(
                    "launch_template", launch_template.node.path,
                    f"has a boot script with a warm_pool_hook, which {wrong}")]))
        if boot_script.signal is None:
            problems.add("launch_template", launch_template.node.path,
                         "must carry a boot script with a signal: the fleet waits for each host to serve")
        problems.raise_if_any()
        assert boot_script.signal is not None

        timeout = boot_script.boot_timeout
        self.unit = unit
        """The group's capacity units per host of the first instance type: its replicas with several
        types, else 1."""
        self.launch_template = launch_template
        self.plan = launch_template.plan
        self.role = launch_template.role
        self.connections = launch_template.connections
        self.notifications_topic = notifications_topic or self._new_topic()
        mixed = self.weights is not None or spot_percent > 0
        units = (min_capacity * unit, max_capacity * unit,
                 None if desired_capacity is None else desired_capacity * unit)
        if capacity_block is not None:
            launch_template.launch_into_capacity_block(capacity_block.reservation_id)
            vpc_subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                                              availability_zones=[capacity_block.zone])
        # Creation waits for the fewest hosts that hold the minimum (each host signals once).
        fewest_hosts = -(-units[0] // max(self.weights.values())) if self.weights else None
        self.auto_scaling_group = autoscaling.AutoScalingGroup(
            self,
            "Group",
            vpc=vpc,
            launch_template=None if mixed else launch_template.launch_template,
            mixed_instances_policy=self._mixed_policy(
                launch_template, spot_percent,
                None if on_demand_base_capacity is None and not spot_percent
                else (min_capacity if on_demand_base_capacity is None else on_demand_base_capacity) * unit,
            ) if mixed else None,
            capacity_rebalance=True if spot_percent > 0 else None,
            # The boot script completes the warm pool's lifecycle hook on this group, or a draining host
            # asks it to replace it, by name: the name must be known before the group exists.
            auto_scaling_group_name=boot_script.group_name,
            min_capacity=units[0],
            max_capacity=units[1],
            desired_capacity=units[2],
            vpc_subnets=vpc_subnets or ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            health_checks=autoscaling.HealthChecks.with_additional_checks(
                additional_types=[autoscaling.AdditionalHealthCheckType.ELB],
                grace_period=health_check_grace or timeout,
            ),
            signals=(autoscaling.Signals.wait_for_count(fewest_hosts, timeout=timeout) if fewest_hosts is not None
                     else autoscaling.Signals.wait_for_min_capacity(timeout=timeout)),
            update_policy=autoscaling.UpdatePolicy.rolling_update(
                max_batch_size=1,
                min_instances_in_service=(
                    max(fewest_hosts - 1, 0) if fewest_hosts is not None else _from_min_capacity(
                        self, min_capacity, less=1, at_least=0,
                        why="a rolling update keeps min_capacity - 1 hosts in service")),
                wait_on_resource_signals=True,
                pause_time=timeout,
            ),
            default_instance_warmup=instance_warmup
            or Duration.minutes(boot_minutes(self.plan, throughput=boot_script.root_volume.throughput, exports=False)),
            group_metrics=[autoscaling.GroupMetrics.all()],
            notifications=[autoscaling.NotificationConfiguration(topic=self.notifications_topic)],
        )
        cfn_group = self.auto_scaling_group.node.default_child
        assert isinstance(cfn_group, autoscaling.CfnAutoScalingGroup)
        if mixed:
            Validations.of(self.auto_scaling_group).acknowledge(Acknowledgment(
                id="AwsSolutions::AwsSolutions-EC26",
                reason="The mixed instances policy launches the launch template, whose one EBS volume, the root "
                "volume, is encrypted (NeuronServingLaunchTemplate); the rule cannot follow the policy's reference "
                "to it and stops with an error instead of a finding"))
        # The boot script signals this logical id.
        cfn_group.override_logical_id(boot_script.signal.logical_id)
        if capacity_reservations or capacity_reservation_preference is not None:
            ids = [r for r in capacity_reservations if r.startswith("cr-")]
            groups = [r for r in capacity_reservations if not r.startswith("cr-")]
            cfn_group.capacity_reservation_specification = \
                autoscaling.CfnAutoScalingGroup.CapacityReservationSpecificationProperty(
                    capacity_reservation_preference=capacity_reservation_preference or "capacity-reservations-first",
                    capacity_reservation_target=autoscaling.CfnAutoScalingGroup.CapacityReservationTargetProperty(
                        capacity_reservation_ids=ids or None,
                        capacity_reservation_resource_group_arns=groups or None,
                    ) if capacity_reservations else None,
                )
        self.capacity_block = capacity_block
        if capacity_block is not None:
            # EC2 terminates a block's instances 30 minutes before its end (Amazon EC2 User Guide, Capacity
            # Blocks for ML): the fleet scales to zero before then, which drains each host from the load
            # balancer first.
            autoscaling.CfnScheduledAction(
                self, "CapacityBlockEnd",
                auto_scaling_group_name=self.auto_scaling_group.auto_scaling_group_name,
                start_time=capacity_block.scale_in_time, min_size=0, max_size=0, desired_capacity=0,
            )
        self.min_capacity = min_capacity
        if (termination := boot_script.termination_hook) is not None:
            # A terminating host drains, waits for its requests in flight and completes this hook; should it
            # not, the group terminates it after the timeout all the same.
            self.auto_scaling_group.add_lifecycle_hook(
                "Terminate",
                lifecycle_hook_name=termination.hook_name,
                lifecycle_transition=autoscaling.LifecycleTransition.INSTANCE_TERMINATING,
                heartbeat_timeout=Duration.seconds(termination.heartbeat_timeout_seconds),
                default_result=autoscaling.DefaultResult.CONTINUE,
            )
        if hook is not None:
            self.auto_scaling_group.add_lifecycle_hook(
                "Launch",
                lifecycle_hook_name=hook.hook_name,
                lifecycle_transition=autoscaling.LifecycleTransition.INSTANCE_LAUNCHING,
                # The hook holds each host until the boot script completes it, renewed by the
                # script's heartbeats; should they stop, the host continues after this timeout
                # and its ELB health check decides whether it gets traffic.
                heartbeat_timeout=Duration.seconds(hook.heartbeat_timeout_seconds),
                default_result=autoscaling.DefaultResult.CONTINUE,
            )
            self.auto_scaling_group.add_warm_pool(
                pool_state=autoscaling.PoolState.STOPPED,
                reuse_on_scale_in=True,
            )

    def _mixed_policy(self, launch_template: NeuronServingLaunchTemplate, spot_percent: int,
                      on_demand_base: int | None) -> autoscaling.MixedInstancesPolicy:
        """The launch template with an override per instance type (its replicas as its weight, with several
        types), On-Demand in their order (``prioritized``) and Spot capacity-optimized with their order as
        priorities (``capacity-optimized-prioritized``: Auto Scaling API reference, InstancesDistribution)."""
        return autoscaling.MixedInstancesPolicy(
            launch_template=launch_template.launch_template,
            launch_template_overrides=[
                autoscaling.LaunchTemplateOverrides(
                    instance_type=ec2.InstanceType(plan.instance.name),
                    weighted_capacity=self.weights[plan.instance.name] if self.weights else None)
                for plan in launch_template.boot_script.layouts],
            instances_distribution=autoscaling.InstancesDistribution(
                on_demand_allocation_strategy=autoscaling.OnDemandAllocationStrategy.PRIORITIZED,
                on_demand_base_capacity=on_demand_base,
                on_demand_percentage_above_base_capacity=100 - spot_percent,
                spot_allocation_strategy=(autoscaling.SpotAllocationStrategy.CAPACITY_OPTIMIZED_PRIORITIZED
                                          if spot_percent else None),
            ),
        )

    def _new_topic(self) -> sns.Topic:
        key = kms.Key(
            self, "NotificationsKey", enable_key_rotation=True,
            description="Encrypts the Neuron fleet's scaling notifications",
        )
        # Auto Scaling publishes with its service-linked role.
        key.grant(
            iam.ArnPrincipal(
                Stack.of(self).format_arn(
                    service="iam", region="", resource="role",
                    resource_name="aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling",
                )
            ),
            "kms:Decrypt", "kms:GenerateDataKey*",
        )
        return sns.Topic(self, "Notifications", master_key=key, enforce_ssl=True)

    @property
    def grant_principal(self) -> iam.IPrincipal:
        return self.role

    def scale_on_requests(self, target_requests_per_minute: int | None = None) -> None:
        """Track ALB requests per host. Call after the fleet is a target of an endpoint.

        :param target_requests_per_minute: Default: every batch slot of every replica busy with
            requests of about 20 seconds.
        """
        if self.weights is not None:
            raise ServingConfigError([problem(
                "target_requests_per_minute", target_requests_per_minute, "counts requests per host, and hosts of "
                f"this fleet's types serve different numbers of replicas ({_weights_text(self.weights)}): use "
                "scale_on_in_flight_requests, which counts per replica")])
        plan = self.plan
        target = (
            target_requests_per_minute
            if target_requests_per_minute is not None
            else len(plan.replicas) * plan.batch_size * 60 // ASSUMED_REQUEST_SECONDS
        )
        problems = check_props(self, [target], lambda value: [] if (wrong := limits.requests_per_minute(value))
                               is None else [problem("target_requests_per_minute", value, wrong)])
        if problems:
            raise ServingConfigError(problems)
        policy = self.auto_scaling_group.scale_on_request_count(
            "RequestsPerHost", target_requests_per_minute=target
        )
        # aws-cdk-lib makes the policy depend on the listener, which its resource label already
        # references; cfn-lint warns (W3005) on that generated DependsOn. Silence just that.
        cfn_policy = policy.node.default_child
        assert isinstance(cfn_policy, CfnResource)
        cfn_policy.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
        self.target_requests_per_minute = target

    def scale_on_in_flight_requests(
        self, monitoring: NeuronServingMonitoring, target_per_replica: float | None = None
    ) -> None:
        """Track the average in-flight requests per replica (queued or in the batch), the signal
        that shows LLM saturation: requests per minute mean little when one takes seconds and
        another minutes. The hosts must publish to ``monitoring``.

        :param target_per_replica: Default: the batch size, every batch slot busy and nothing
            queued.
        """
        target = float(self.plan.batch_size) if target_per_replica is None else target_per_replica
        problems = check_props(self, [target], lambda value: [] if (wrong := limits.in_flight_requests(value))
                               is None else [problem("target_per_replica", value, wrong)])
        if problems:
            raise ServingConfigError(problems)
        self.auto_scaling_group.scale_to_track_metric(
            "InFlightPerReplica",
            metric=monitoring.metric("InFlightRequests", statistic="Average"),
            target_value=target,
        )
        self.target_in_flight_requests = target

    def metric_desired_capacity(self) -> cloudwatch.Metric:
        """How many hosts the group wants (``GroupDesiredCapacity``, published because the group
        collects its metrics), the largest value of each minute."""
        return cloudwatch.Metric(
            namespace="AWS/AutoScaling",
            metric_name="GroupDesiredCapacity",
            dimensions_map={"AutoScalingGroupName": self.auto_scaling_group.auto_scaling_group_name},
            statistic="Maximum",
            period=Duration.minutes(1),
        )

    def metric_launch_shortfall(self) -> cloudwatch.MathExpression:
        """Capacity the group wants but has neither in service nor launching (``GroupDesiredCapacity`` less
        ``GroupInServiceCapacity`` and ``GroupPendingCapacity``, in capacity units, each minute; Auto Scaling
        user guide, "Amazon CloudWatch metrics for Amazon EC2 Auto Scaling"). A launch in progress, or a host
        booting behind the launch lifecycle hook, is pending; what stays short with nothing pending is capacity
        the group failed to launch (no capacity for its types in its zones, a vCPU quota, a reservation full or
        a Capacity Block not active), until its next attempt."""
        def group_metric(name: str, statistic: str) -> cloudwatch.Metric:
            return cloudwatch.Metric(
                namespace="AWS/AutoScaling", metric_name=name, statistic=statistic, period=Duration.minutes(1),
                dimensions_map={"AutoScalingGroupName": self.auto_scaling_group.auto_scaling_group_name})
        return cloudwatch.MathExpression(
            expression="MAX([0, FILL(desired, 0) - FILL(serving, 0) - FILL(pending, 0)])",
            using_metrics={"desired": group_metric("GroupDesiredCapacity", "Minimum"),
                           "serving": group_metric("GroupInServiceCapacity", "Maximum"),
                           "pending": group_metric("GroupPendingCapacity", "Maximum")},
            label="capacity not launched", period=Duration.minutes(1))

    def scale_on_schedule(self, *, scale_down: str, scale_up: str) -> None:
        """Scale to zero on ``scale_down`` and back to ``min_capacity`` on ``scale_up``: cron
        expressions (minute hour day month weekday, UTC)."""
        problems = Problems()
        for name, expression in (("scale_down", scale_down), ("scale_up", scale_up)):
            if (shape := cron(expression.strip())) is not None:
                problems.add(name, expression, shape)
        problems.raise_if_any()
        self.auto_scaling_group.scale_on_schedule(
            "ScaleToZero",
            schedule=autoscaling.Schedule.expression(scale_down.strip()),
            min_capacity=0,
            desired_capacity=0,
        )
        self.auto_scaling_group.scale_on_schedule(
            "ScaleBack",
            schedule=autoscaling.Schedule.expression(scale_up.strip()),
            min_capacity=self.min_capacity * self.unit if self.weights else self.min_capacity,
            desired_capacity=max(self.min_capacity * self.unit, 1) if self.weights else _from_min_capacity(
                self, self.min_capacity, less=0, at_least=1, why="scaling back starts at least one host"),
        )


@dataclass(frozen=True)
class CapacityBlock:
    """A Capacity Block for ML: a reservation of one instance type in one zone, from a start to an end.

    :param reservation_id: its Capacity Reservation id (``cr-...``).
    :param zone: its Availability Zone.
    :param end: when it ends (UTC).
    """

    reservation_id: str
    zone: str
    end: datetime.datetime

    @property
    def scale_in_time(self) -> str:
        """When the fleet scales to zero: ``limits.CAPACITY_BLOCK_LEAD_MINUTES`` before the end, as a
        scheduled action's StartTime (``YYYY-MM-DDThh:mm:ssZ``, UTC)."""
        end = self.end if self.end.tzinfo else self.end.replace(tzinfo=datetime.UTC)
        lead = datetime.timedelta(minutes=limits.CAPACITY_BLOCK_LEAD_MINUTES)
        return (end.astimezone(datetime.UTC) - lead).strftime("%Y-%m-%dT%H:%M:%SZ")



def _weights_text(weights: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in weights.items())


def _capacity_problems(min_capacity: int, max_capacity: int, desired_capacity: int | None) -> list[str]:
    return [problem(name, value, allowed)
            for name, value, allowed in limits.capacity_problems(min_capacity, max_capacity, desired_capacity)]


def _from_min_capacity(scope: Construct, min_capacity: int, *, less: int, at_least: int, why: str) -> float:
    """``max(min_capacity - less, at_least)``. A token known at synth (a ``Lazy`` value) is resolved
    then; one only CloudFormation knows (a parameter) cannot be computed on, which synthesis reports
    naming the prop and ``why`` it is computed on."""
    if not Token.is_unresolved(min_capacity):
        return max(min_capacity - less, at_least)
    return Token.as_number(Lazy.number(_Computed(scope, min_capacity, less, at_least, why)))


@jsii.implements(IStableNumberProducer)
class _Computed:
    def __init__(self, scope: Construct, min_capacity: int, less: int, at_least: int, why: str) -> None:
        self._scope, self._min_capacity, self._less, self._at_least, self._why = (
            scope, min_capacity, less, at_least, why)

    def produce(self) -> int:
        value = Stack.of(self._scope).resolve(self._min_capacity)
        if not isinstance(value, int | float):
            raise ServingConfigError([problem("min_capacity", value, f"must be known at synth: {self._why}")])
        return max(int(value) - self._less, self._at_least)
