"""Logs, one dashboard and alarms for Neuron serving hosts, from the metrics they publish."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Aws, CfnOutput, Duration, Stack, Token
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions

from constructs import Construct

from ..plan.engines import DEFAULT_ENGINE, ENGINES, Engine
from ..plan.errors import Problems, ServingConfigError, problem
from ..plan.identifiers import email
from ..plan.layout import ServingPlan
from ..plan.metrics import (
    API_KEY_SYNC_FAILURES,
    CAPACITY,
    DEFAULT_NAMESPACE,
    ERROR_TYPE,
    EXECUTION_ERROR_TYPES,
    EXPORT_PUBLISH_FAILURES,
    INSTANCE,
    INSTANCE_TYPE,
    LOG_KINDS,
    PHASE,
    SERVICE,
    ZONE,
    MonitoringOptions,
    metric,
)
from ..plan.phases import BOOT_PHASE_METRIC, MEASURED, PUBLISH_TAG
from ..render.boot import API_KEYS_UNIT
from ..settings import limits
from .scanners import LOG_GROUP_KEY_REASON, acknowledge_any_resource, skip_checkov
from .validation import check_props

_THRESHOLD_RANGES = (
    ("error_rate_percent", limits.PERCENT_RANGE),
    ("p99_latency_seconds", limits.LATENCY_SECONDS_RANGE),
    ("disk_percent", limits.PERCENT_RANGE),
)
"""The thresholds' props and their ranges (those of the ``alarm_*`` settings)."""


def _threshold_problems(name: str, value: object, low: float, high: float) -> list[str]:
    return [] if limits.in_range(value, low, high) else [problem(name, value, limits.above_at_most(low, high))]

DASHBOARD_REPLICA_METRICS = ("InFlightRequests", "BatchSize", "QueueSize", "QueueDuration", "RequestDuration",
                             "TimePerOutputToken", "GeneratedTokens", "Requests", "RequestFailures")
"""The replica metrics on the dashboard (and, InFlightRequests, in the fleet's scaling policy)."""

ONE_MINUTE = Duration.minutes(1)
FIVE_MINUTES = Duration.minutes(5)
ONE_HOUR = Duration.hours(1)


@dataclass(frozen=True)
class AlarmThresholds:
    """When the alarms fire. Every alarm treats missing data as not breaching: no traffic, or a
    fleet scaled to zero, is not an incident.

    :param error_rate_percent: 5xx answers (the targets' and the load balancer's) as a percentage
        of requests, over 5 minutes, in 2 of 3 periods. Default: 5.
    :param p99_latency_seconds: the load balancer's p99 target response time over 5 minutes, in 3
        of 3 periods. A streamed request answers at its first token; a non-streamed one at its
        last, so set this above the longest generation you expect to be normal. Default: 60.
    :param disk_percent: the fullest host's root file system, over 5 minutes, twice. Default: 85.
    :param execution_errors: failed executions on the NeuronCores (every error type) within 5
        minutes. Default: 1.
    :param uncorrected_ecc_events: uncorrected memory or SRAM ECC events within 5 minutes.
        Default: 1.
    :param api_key_sync_failures: with API keys, failed runs of a host's key sync within 5
        minutes, all hosts together. Each host runs it every minute; a failed run leaves the keys
        in force as they were, so a key added, rotated or revoked since does not take effect.
        Default: 1.
    """

    error_rate_percent: float = limits.DEFAULT_ERROR_RATE_PERCENT
    p99_latency_seconds: float = limits.DEFAULT_P99_LATENCY_SECONDS
    disk_percent: float = limits.DEFAULT_DISK_PERCENT
    execution_errors: int = 1
    uncorrected_ecc_events: int = 1
    api_key_sync_failures: int = 1

    def __post_init__(self) -> None:
        problems = Problems()
        for name, (low, high) in _THRESHOLD_RANGES:
            value = getattr(self, name)
            # A token's value is known at synth only: NeuronServingMonitoring checks it then.
            if not Token.is_unresolved(value):
                problems.add_all(_threshold_problems(name, value, low, high))
        for setting, count in (("execution_errors", self.execution_errors),
                               ("uncorrected_ecc_events", self.uncorrected_ecc_events),
                               ("api_key_sync_failures", self.api_key_sync_failures)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                problems.add(setting, count, "must be a whole number of at least 1")
        problems.raise_if_any()


class NeuronServingMonitoring(Construct):
    """What a Neuron serving deployment shows: its logs, one dashboard, alarms on an SNS topic.

    Hosts publish the metrics of :mod:`neuron_serving.plan.metrics` (replicas, router, Neuron
    Monitor, host) and ship their logs when their boot script gets :attr:`boot_options`, and
    their role :meth:`grant_publish`. :meth:`watch` then adds the dashboard rows and alarms for an
    endpoint, with or without a fleet. Works the same for one instance, a fleet, or a user's own
    Auto Scaling group.

    :param service: the ``Service`` dimension: one deployment's metrics. Default: the stack name.
    :param namespace: the CloudWatch namespace. Default: ``NeuronServing``.
    :param log_retention_days: how long the log groups keep logs (a value CloudWatch Logs
        accepts: 1, 3, 5, 7, 14, 30, 60, 90...). Default: 14.
    :param alarm_topic: where alarms (and their recovery) go. Default: a new topic, encrypted with
        a new customer-managed key that CloudWatch may use, SSL only.
    :param alarm_email: an address subscribed to the alarm topic (it must confirm). Default: none.
    :param thresholds: Default: :class:`AlarmThresholds` defaults.
    :param dashboard_name: Default: the stack name.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        service: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        log_retention_days: int = limits.DEFAULT_LOG_RETENTION_DAYS,
        alarm_topic: sns.ITopic | None = None,
        alarm_email: str | None = None,
        thresholds: AlarmThresholds | None = None,
        dashboard_name: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.thresholds = thresholds or AlarmThresholds()
        problems = Problems()
        problems.add_all(check_props(self, [log_retention_days], _retention_problems))
        if alarm_email is not None and (wrong := email(alarm_email)) is not None:
            problems.add("alarm_email", alarm_email, wrong)
        for name, (low, high) in _THRESHOLD_RANGES:
            problems.add_all(check_props(self, [getattr(self.thresholds, name)],
                                         lambda value, n=name, lo=low, hi=high: _threshold_problems(n, value, lo, hi)))
        problems.raise_if_any()
        self.service: str = service or stack.stack_name
        self.namespace = namespace
        self.log_groups: dict[str, logs.LogGroup] = {}
        for kind in LOG_KINDS:
            # The days themselves, as CloudWatch Logs takes them: the accepted values are listed
            # once (settings.limits), and RetentionDays' members carry only names in Python.
            group = logs.LogGroup(self, f"{kind.capitalize()}Logs", retention=logs.RetentionDays.INFINITE)
            cfn_group = group.node.default_child
            assert isinstance(cfn_group, logs.CfnLogGroup)
            cfn_group.retention_in_days = log_retention_days
            skip_checkov(group, "CKV_AWS_158", LOG_GROUP_KEY_REASON)
            self.log_groups[kind] = group
        self.boot_options = MonitoringOptions(
            service=self.service,
            log_groups={kind: group.log_group_name for kind, group in self.log_groups.items()},
            namespace=namespace,
        )
        """For :class:`~neuron_serving.NeuronBootScript` ``monitoring``."""
        self.alarm_topic: sns.ITopic = alarm_topic or self._new_topic()
        if alarm_email is not None:
            self.alarm_topic.add_subscription(subscriptions.EmailSubscription(alarm_email))
        self.dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=dashboard_name or stack.stack_name,
            default_interval=Duration.hours(3),
        )
        self.dashboard_url: str = (
            f"https://{Aws.REGION}.console.aws.amazon.com/cloudwatch/home?region={Aws.REGION}"
            f"#dashboards/dashboard/{self.dashboard.dashboard_name}"
        )
        self.alarms: dict[str, cloudwatch.Alarm] = {}

    def _new_topic(self) -> sns.Topic:
        key = kms.Key(self, "AlarmsKey", enable_key_rotation=True,
                      description="Encrypts the Neuron serving alarms topic")
        # CloudWatch publishes alarm notifications as its service principal.
        key.grant(iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*")
        return sns.Topic(self, "Alarms", master_key=key, enforce_ssl=True)

    def grant_publish(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let hosts ship logs and EMF metrics to these log groups, and put their boot's phase times
        (:data:`~neuron_serving.plan.phases.BOOT_PHASE_METRIC`, once a boot ends: a stopped or
        terminated host would lose an EMF line the agent has not shipped yet) with
        ``cloudwatch:PutMetricData`` in this namespace only, and nothing else.

        PutMetricData names no resource type; its condition key ``cloudwatch:namespace`` limits it
        to a namespace (Service Authorization Reference, Amazon CloudWatch; CloudWatch user guide,
        "Using condition keys to limit access to CloudWatch namespaces",
        https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/iam-cw-condition-keys-namespace.html)."""
        logs_grant = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resource_arns=[group.log_group_arn for group in self.log_groups.values()],
        )
        acknowledge_any_resource(self, "cloudwatch:PutMetricData names no resource type (Service Authorization "
                                 "Reference, Amazon CloudWatch): the hosts may put metrics in the monitoring's "
                                 "namespace only (cloudwatch:namespace)")
        return logs_grant.combine(iam.Grant.add_to_principal(
            grantee=grantee, actions=["cloudwatch:PutMetricData"], resource_arns=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": self.namespace}},
        ))

    def metric(
        self,
        name: str,
        *,
        statistic: str = "Average",
        period: Duration = ONE_MINUTE,
        dimensions: dict[str, str] | None = None,
        label: str | None = None,
    ) -> cloudwatch.Metric:
        """A catalog metric for the whole deployment (``Service``), or for ``dimensions`` on top.
        A name outside the catalog is a ``KeyError``, so no widget can show a metric no host
        publishes."""
        spec = metric(name)
        dims = {SERVICE: self.service, **(dimensions or {})}
        if tuple(sorted(dims)) not in {tuple(sorted(s)) for s in spec.dimension_sets}:
            raise KeyError(f"{name} is not published with dimensions {sorted(dims)}")
        return cloudwatch.Metric(
            namespace=self.namespace, metric_name=name, dimensions_map=dims, statistic=statistic,
            period=period, label=label, unit=None,
        )

    def per_instance(self, name: str, statistic: str = "Average", label: str | None = None) -> cloudwatch.IMetric:
        """One line per instance of the deployment, whatever instances exist now (a SEARCH)."""
        spec = metric(name)
        if (SERVICE, INSTANCE) not in spec.dimension_sets:
            raise KeyError(f"{name} is not published per instance")
        return cloudwatch.MathExpression(
            expression=(f"SEARCH('{{{self.namespace},{SERVICE},{INSTANCE}}} MetricName=\"{name}\" "
                        f"{SERVICE}=\"{self.service}\"', '{statistic}', 60)"),
            using_metrics={},
            label=label or "",
            period=ONE_MINUTE,
        )

    def hosts_by(self, dimension: str) -> cloudwatch.IMetric:
        """The hosts serving metrics now, one line per value of ``dimension`` (``InstanceType``,
        ``AvailabilityZone`` or ``Capacity``): ``Hosts``' Sum per minute (a SEARCH)."""
        if (SERVICE, dimension) not in metric("Hosts").dimension_sets:
            raise KeyError(f"Hosts is not published by {dimension}")
        return cloudwatch.MathExpression(
            expression=(f"SEARCH('{{{self.namespace},{SERVICE},{dimension}}} MetricName=\"Hosts\" "
                        f"{SERVICE}=\"{self.service}\"', 'Sum', 60)"),
            using_metrics={}, label="", period=ONE_MINUTE,
        )

    def watch(
        self,
        *,
        plan: ServingPlan,
        engine: Engine | None = None,
        endpoint_load_balancer: elbv2.IApplicationLoadBalancer,
        target_group: elbv2.IApplicationTargetGroup,
        desired_capacity: cloudwatch.IMetric | None = None,
        launch_shortfall: cloudwatch.IMetric | None = None,
        capacity_reservations: Sequence[str] = (),
        boot_minutes: int = 45,
        api_keys: bool = False,
        publishes_exports: bool = False,
    ) -> None:
        """Add the dashboard and alarms for hosts of ``plan`` behind this load balancer.

        :param engine: the hosts' serving engine: the dashboard shows only the replica metrics it
            has a source for, and names those sources. Default: TGI.

        :param desired_capacity: an Auto Scaling group's ``GroupDesiredCapacity``; with it, "no
            healthy hosts" counts only while hosts are wanted (a fleet scaled to zero is quiet).
        :param launch_shortfall: an Auto Scaling group's capacity wanted but neither in service nor launching
            (``NeuronServingFleet.metric_launch_shortfall``); with it, an alarm fires when the group has failed
            to launch for :data:`CANNOT_LAUNCH_MINUTES` minutes, and the dashboard shows it.
        :param capacity_reservations: the Capacity Reservations (ids, or resource groups' ARNs) and Capacity
            Block the hosts launch into: the dashboard shows how many instances run in each, from EC2's own
            ``UsedInstanceCount``.
        :param boot_minutes: how long a host takes to serve once launched: "no healthy hosts"
            waits this long so that a scale-out from zero does not page.
        :param api_keys: the hosts' boot script has ``api_keys_secret``: the dashboard also shows
            their failed key syncs, and the ``ApiKeySync`` alarm watches them. Default: false.
        :param publishes_exports: the hosts compile the model and publish the export to an artifact cache
            (``neuron_serving.render.boot_options.publishes``): the dashboard also shows their failed
            publishes, and the ``ExportPublish`` alarm watches them. Default: false.
        """
        self._traffic_row(endpoint_load_balancer, target_group)
        engine = engine or ENGINES[DEFAULT_ENGINE]
        self._check_published(engine)
        self._serving_row(plan, engine, api_keys=api_keys)
        self._neuron_row()
        self._host_row(launch_shortfall, capacity_reservations)
        self._boot_row(publishes_exports=publishes_exports)
        self._alarms(endpoint_load_balancer, target_group, desired_capacity, boot_minutes)
        if launch_shortfall is not None:
            self._alarm(
                "CannotLaunch", f"the fleet has wanted capacity it neither has nor is launching for "
                f"{CANNOT_LAUNCH_MINUTES} minutes: its launches fail (no capacity for its instance types in its zones, "
                "a vCPU quota, a reservation full or a Capacity Block not active). Why: the fleet's notifications "
                "topic (EC2_INSTANCE_LAUNCH_ERROR), aws autoscaling describe-scaling-activities, and "
                "neuron-serving preflight", launch_shortfall, 1, CANNOT_LAUNCH_MINUTES, CANNOT_LAUNCH_MINUTES - 2,
                cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD)
        if api_keys:
            self._api_keys_alarm()
        if publishes_exports:
            self._export_publish_alarm()
        CfnOutput(self, "DashboardUrl", value=self.dashboard_url, description="The serving dashboard")
        CfnOutput(self, "AlarmTopicArn", value=self.alarm_topic.topic_arn, description="Alarms are published here")
        for kind, group in self.log_groups.items():
            CfnOutput(self, f"{kind.capitalize()}LogGroup", value=group.log_group_name,
                      description=f"CloudWatch Logs group: {_LOG_DESCRIPTIONS[kind]}")

    # --- dashboard ---------------------------------------------------------------------------

    def _row(self, markdown: str, *graphs: cloudwatch.IWidget) -> None:
        self.dashboard.add_widgets(cloudwatch.TextWidget(markdown=markdown, width=24, height=2))
        self.dashboard.add_widgets(*graphs)

    def _traffic_row(self, alb: elbv2.IApplicationLoadBalancer, tg: elbv2.IApplicationTargetGroup) -> None:
        m = alb.metrics
        self._row(
            "## Traffic\nRequests through the load balancer, their latency to the targets (for a streamed "
            "request, time to the first token; otherwise the whole generation), errors, and how many "
            "hosts pass the health check. 5xx from the load balancer itself mean no healthy host.",
            _graph("Requests", [m.request_count(period=ONE_MINUTE, label="requests")]),
            _graph("Target response time", [
                m.target_response_time(statistic=p, period=ONE_MINUTE, label=p) for p in ("p50", "p90", "p99")
            ]),
            _graph("Errors", [
                m.http_code_target(elbv2.HttpCodeTarget.TARGET_4XX_COUNT, period=ONE_MINUTE, label="target 4xx"),
                m.http_code_target(elbv2.HttpCodeTarget.TARGET_5XX_COUNT, period=ONE_MINUTE, label="target 5xx"),
                m.http_code_elb(elbv2.HttpCodeElb.ELB_5XX_COUNT, period=ONE_MINUTE, label="load balancer 5xx"),
            ]),
            _graph("Hosts", [
                tg.metrics.healthy_host_count(statistic="Minimum", period=ONE_MINUTE, label="healthy"),
                tg.metrics.unhealthy_host_count(statistic="Maximum", period=ONE_MINUTE, label="unhealthy"),
            ]),
        )

    def _check_published(self, engine: Engine) -> None:
        """Every replica metric the dashboard, alarms and scaling use is one ``engine`` publishes."""
        missing = [m for m in DASHBOARD_REPLICA_METRICS if m not in engine.metrics.published]
        if missing:
            raise ServingConfigError([problem("engine", engine.name, f"publishes no {', '.join(missing)}, which the "
                                              "dashboard shows")])

    def _serving_row(self, plan: ServingPlan, engine: Engine, *, api_keys: bool) -> None:
        tokens = self.metric("GeneratedTokens", statistic="Sum")
        sources = "; ".join(f"{m} = `{engine.metrics.describe(m)}`" for m in DASHBOARD_REPLICA_METRICS)
        self._row(
            f"## Serving\n{engine.title}'s own view, from every replica. In-flight requests per replica near the "
            f"batch size ({plan.batch_size}) means the batch is full: queue time then grows, and the fleet scales "
            "out. Time per output token is the decode speed each request saw.\n\n"
            f"From each replica's /metrics: {sources}."
            + (" A failed API key sync leaves a host's keys as they were: its journal "
               f"(`journalctl -u {API_KEYS_UNIT}`) and the metrics log group's stream `<instance id>/api-keys` "
               "say why." if api_keys else ""),
            _graph("In-flight requests per replica", [
                self.metric("InFlightRequests", label="average"),
                self.metric("InFlightRequests", statistic="Maximum", label="busiest replica"),
                self.metric("BatchSize", label="batch (average)"),
            ], annotation=(float(plan.batch_size), "batch size")),
            _graph("Queue", [
                self.metric("QueueSize", statistic="Sum", label="replica queues (all replicas)"),
                self.metric("RouterQueue", statistic="Sum", label="router queue (all hosts)"),
                self.metric("QueueDuration", statistic="p90", label="queue time p90 (s)"),
            ]),
            _graph("Request duration (s)", [
                self.metric("RequestDuration", statistic=p, label=p) for p in ("p50", "p90", "p99")
            ]),
            _graph("Time per output token (s)", [
                self.metric("TimePerOutputToken", statistic=p, label=p) for p in ("p50", "p90", "p99")
            ]),
            _graph("Generated tokens per second", [
                cloudwatch.MathExpression(expression="tokens / PERIOD(tokens)", using_metrics={"tokens": tokens},
                                          label="tokens/s", period=ONE_MINUTE),
            ]),
            _graph("Replicas and failures", [
                self.metric("ReplicasUp", statistic="Sum", label="replicas up"),
                self.metric("Requests", statistic="Sum", label="requests"),
                self.metric("RequestFailures", statistic="Sum", label="failed requests"),
                self.metric("UnauthorizedRequests", statistic="Sum", label="refused: no or unknown API key"),
                *([self.metric(API_KEY_SYNC_FAILURES, statistic="Sum", label="failed API key syncs")]
                  if api_keys else []),
            ]),
        )

    def _neuron_row(self) -> None:
        self._row(
            "## Neuron\nFrom Neuron Monitor on every host. NeuronCore utilization is per core: the average "
            "shows how busy the fleet is, the maximum its busiest core. Execution errors and uncorrected "
            "ECC events should stay at zero; an uncorrected ECC event means the device needs replacing.",
            _graph("NeuronCore utilization (%)", [
                self.metric("NeuronCoreUtilization", label="fleet average"),
                self.metric("NeuronCoreUtilization", statistic="Maximum", label="busiest core"),
                self.per_instance("NeuronCoreUtilization"),
            ]),
            _graph("Neuron device memory used (bytes)", [
                self.per_instance("NeuronDeviceMemoryUsed", statistic="Maximum"),
            ]),
            _graph("Execution errors by type", [
                self.metric("ExecutionErrors", statistic="Sum", dimensions={ERROR_TYPE: t}, label=t)
                for t in EXECUTION_ERROR_TYPES
            ]),
            _graph("Execution latency (s)", [
                self.metric("ExecutionLatency", label="p50 (average of replicas)"),
                self.metric("ExecutionLatencyP99", statistic="Maximum", label="p99 (worst replica)"),
            ]),
            _graph("ECC events", [
                self.metric("EccCorrectedEvents", statistic="Sum", label="corrected"),
                self.metric("EccUncorrectedEvents", statistic="Sum", label="uncorrected"),
            ]),
        )

    def _host_row(self, launch_shortfall: cloudwatch.IMetric | None, reservations: Sequence[str]) -> None:
        self._row(
            "## Hosts\nWhich hosts the fleet got, by instance type, zone and purchasing option (on-demand or spot), "
            "as each counts itself each minute"
            + (", and the capacity it wants but cannot launch (in replicas with several instance types)"
               if launch_shortfall is not None else "")
            + "; then CPU, memory and the root disk, which holds the serving image and the exports. A full disk "
            "stops exports and image pulls.",
            *(_graph(f"Hosts by {title}", [self.hosts_by(dimension)])
              for title, dimension in (("instance type", INSTANCE_TYPE), ("zone", ZONE), ("capacity", CAPACITY))),
            *([_graph("Capacity not launched", [launch_shortfall])] if launch_shortfall is not None else []),
            *([_graph("Instances in the capacity reservations", _reservation_metrics(reservations))]
              if reservations else []),
            *(
                _graph(f"{title} (%)", [
                    self.metric(name, statistic="Maximum", label="highest host"),
                    self.per_instance(name),
                ])
                for title, name in (("CPU", "CpuUtilization"), ("Memory", "MemoryUtilization"),
                                    ("Disk", "DiskUtilization"))
            ),
        )

    def _boot_row(self, *, publishes_exports: bool) -> None:
        self._row(
            "## Boots\nHow long each phase of the hosts' boots took, as each host measured it, put once its boot "
            "ended (ready, failed, or prepared in the warm pool): the slowest host in each hour. "
            "`neuron-serving status` shows each host's phases beside the plan's estimates; a phase far above "
            "its estimate points at the download, the export or the root volume's throughput."
            + (" A host that compiled the model and could not publish the export to the artifact cache serves its "
               "own, but each host after it compiles again: `neuron-serving status` and the host's export.log say "
               "why." if publishes_exports else ""),
            _graph("Boot phases, slowest host (s)", [
                self.metric(BOOT_PHASE_METRIC, statistic="Maximum", period=ONE_HOUR, dimensions={PHASE: phase.name},
                            label=phase.name)
                for phase in MEASURED
            ]),
            *([_graph("Exports not published", [
                self.metric(EXPORT_PUBLISH_FAILURES, statistic="Sum", period=ONE_HOUR,
                            label="failed publishes (all hosts, per hour)"),
            ])] if publishes_exports else []),
        )

    # --- alarms ------------------------------------------------------------------------------

    def _alarm(self, name: str, description: str, metric: cloudwatch.IMetric, threshold: float,
               evaluation_periods: int, datapoints: int,
               comparison: cloudwatch.ComparisonOperator) -> None:
        alarm = cloudwatch.Alarm(
            self, name, metric=metric, threshold=threshold, evaluation_periods=evaluation_periods,
            datapoints_to_alarm=datapoints, comparison_operator=comparison,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=description,
        )
        action = actions.SnsAction(self.alarm_topic)
        alarm.add_alarm_action(action)
        alarm.add_ok_action(action)
        self.alarms[name] = alarm

    def _alarms(self, alb: elbv2.IApplicationLoadBalancer, tg: elbv2.IApplicationTargetGroup,
                desired: cloudwatch.IMetric | None, boot_minutes: int) -> None:
        t = self.thresholds
        above = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
        at_least = cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
        m = alb.metrics
        self._alarm(
            "ErrorRate", f"5xx answers above {t.error_rate_percent}% of requests",
            cloudwatch.MathExpression(
                expression="IF(requests > 0, 100 * (FILL(target, 0) + FILL(elb, 0)) / requests, 0)",
                using_metrics={
                    "requests": m.request_count(period=FIVE_MINUTES),
                    "target": m.http_code_target(elbv2.HttpCodeTarget.TARGET_5XX_COUNT, period=FIVE_MINUTES),
                    "elb": m.http_code_elb(elbv2.HttpCodeElb.ELB_5XX_COUNT, period=FIVE_MINUTES),
                },
                period=FIVE_MINUTES, label="5xx %",
            ),
            t.error_rate_percent, 3, 2, above,
        )
        healthy = tg.metrics.healthy_host_count(statistic="Minimum", period=ONE_MINUTE)
        no_healthy: cloudwatch.IMetric = (
            cloudwatch.MathExpression(
                expression="IF(desired > 0 AND healthy < 1, 1, 0)",
                using_metrics={"desired": desired, "healthy": healthy}, period=ONE_MINUTE, label="no healthy host",
            )
            if desired is not None
            else cloudwatch.MathExpression(expression="IF(healthy < 1, 1, 0)", using_metrics={"healthy": healthy},
                                           period=ONE_MINUTE, label="no healthy host")
        )
        # A host takes boot_minutes to serve: waiting that long keeps a scale-out from zero quiet;
        # under traffic, the 5xx alarm reports an outage sooner.
        minutes = max(5, min(boot_minutes, 1440))
        self._alarm("NoHealthyHosts", f"no host has passed the health check for {minutes} minutes while hosts "
                    "are wanted", no_healthy, 1, minutes, minutes, at_least)
        self._alarm(
            "P99Latency", f"p99 target response time above {t.p99_latency_seconds} s",
            m.target_response_time(statistic="p99", period=FIVE_MINUTES), t.p99_latency_seconds, 3, 3, above,
        )
        self._alarm(
            "NeuronExecutionErrors", f"at least {t.execution_errors} failed executions on the NeuronCores in 5 minutes",
            cloudwatch.MathExpression(
                expression=" + ".join(f"FILL({e}, 0)" for e in EXECUTION_ERROR_TYPES),
                using_metrics={e: self.metric("ExecutionErrors", statistic="Sum", period=FIVE_MINUTES,
                                              dimensions={ERROR_TYPE: e}) for e in EXECUTION_ERROR_TYPES},
                period=FIVE_MINUTES, label="execution errors",
            ),
            t.execution_errors, 1, 1, at_least,
        )
        self._alarm(
            "UncorrectedEcc", "an uncorrected ECC event on a Neuron device: replace the host",
            self.metric("EccUncorrectedEvents", statistic="Sum", period=FIVE_MINUTES),
            t.uncorrected_ecc_events, 1, 1, at_least,
        )
        self._alarm(
            "DiskNearlyFull", f"a host's root file system is above {t.disk_percent}% full",
            self.metric("DiskUtilization", statistic="Maximum", period=FIVE_MINUTES), t.disk_percent, 2, 2, above,
        )

    def _api_keys_alarm(self) -> None:
        t = self.thresholds
        self._alarm(
            "ApiKeySync", f"api-keys sync failed at least {t.api_key_sync_failures} time(s) in 5 minutes: those hosts "
            "keep the keys they had, so a key added, rotated or revoked in the secret since does not take effect. "
            f"Why: journalctl -u {API_KEYS_UNIT} on the host, or the Reason of the lines in the metrics log group's "
            "stream <instance id>/api-keys",
            self.metric(API_KEY_SYNC_FAILURES, statistic="Sum", period=FIVE_MINUTES), t.api_key_sync_failures, 1, 1,
            cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        )

    def _export_publish_alarm(self) -> None:
        # A publish fails once per host that compiled: any one is worth a look, as each host after it
        # compiles again (an hour or more of a large instance each).
        self._alarm(
            "ExportPublish", "a host compiled the model but could not publish the export to the artifact cache: it "
            "serves its own export, and every host launched after it finds no export and compiles again. Why: "
            f"neuron-serving status (the host's tag {PUBLISH_TAG}), or /var/log/neuron-serving/export.log (the boot "
            "log group's stream <instance id>/export). Check that the hosts' role may s3:PutObject below the "
            "cache's prefix (NeuronArtifactCache.grant_cache), that the cache bucket exists, and that the hosts "
            "reach S3 (its VPC endpoint or a NAT gateway)",
            self.metric(EXPORT_PUBLISH_FAILURES, statistic="Sum", period=FIVE_MINUTES), 1, 1, 1,
            cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        )


_LOG_DESCRIPTIONS = {
    "boot": "each host's boot, export and readiness logs",
    "replicas": "each replica's output, a stream per host and replica",
    "router": "the on-host router (HAProxy)",
    "metrics": "the hosts' embedded-metric-format records",
}


RESERVATION_NAMESPACE = "AWS/EC2CapacityReservations"
"""EC2's own Capacity Reservation metrics."""


def _reservation_metrics(reservations: Sequence[str]) -> list[cloudwatch.IMetric]:
    """How many instances run in each Capacity Reservation (a Capacity Block is one): EC2 publishes
    ``UsedInstanceCount`` in ``AWS/EC2CapacityReservations`` by ``CapacityReservationId`` every five minutes
    (Amazon EC2 User Guide, "Monitor Capacity Reservations using CloudWatch metrics"). A resource group's
    reservations are known only at launch: every reservation of the account, by a SEARCH."""
    ids = [r for r in reservations if r.startswith("cr-")]
    metrics: list[cloudwatch.IMetric] = [
        cloudwatch.Metric(namespace=RESERVATION_NAMESPACE, metric_name="UsedInstanceCount", statistic="Maximum",
                          dimensions_map={"CapacityReservationId": r}, period=FIVE_MINUTES, label=r)
        for r in ids]
    if len(ids) < len(reservations):
        metrics.append(cloudwatch.MathExpression(
            expression=(f"SEARCH('{{{RESERVATION_NAMESPACE},CapacityReservationId}} MetricName=\"UsedInstanceCount\"', "
                        "'Maximum', 300)"),
            using_metrics={}, label="", period=FIVE_MINUTES))
    return metrics


CANNOT_LAUNCH_MINUTES = 10
"""How long a fleet's shortfall must last (in 8 of its minutes: a retried launch is pending for a while) before
the alarm fires. Auto Scaling retries a failed launch within minutes, so a shortfall that long is no blip."""


def _graph(title: str, metrics: list[cloudwatch.IMetric], *,
           annotation: tuple[float, str] | None = None) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(
        title=title, left=metrics, width=8, height=6,
        left_annotations=[cloudwatch.HorizontalAnnotation(value=annotation[0], label=annotation[1])]
        if annotation else None,
    )


def _retention_problems(days: int) -> list[str]:
    wrong = limits.log_retention(days)
    return [] if wrong is None else [problem("log_retention_days", days, wrong)]
