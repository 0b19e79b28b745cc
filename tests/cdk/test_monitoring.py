"""Monitoring in the template: log groups, the dashboard, alarms on an encrypted topic, the
hosts' permissions, and scaling on the serving signal."""

import json

import pytest
from aws_cdk.assertions import Match

from neuron_serving import AlarmThresholds, ServingConfigError
from neuron_serving.plan.metrics import API_KEY_SYNC_FAILURES, DEFAULT_NAMESPACE, EXPORT_PUBLISH_FAILURES, LOG_KINDS
from neuron_serving.plan.phases import BOOT_PHASE_METRIC, MEASURED, PUBLISH_TAG

from .conftest import service_authorization_reference, synthesize

FLEET = {"fleet": "asg", "min_capacity": "2", "max_capacity": "4"}
ALARMS = {"ErrorRate", "NoHealthyHosts", "P99Latency", "NeuronExecutionErrors", "UncorrectedEcc", "DiskNearlyFull"}
DEFAULT_ALARMS = ALARMS | {"ExportPublish"}
"""The default stack's: its hosts compile and publish the export to the stack's artifact cache."""


def _alarms(template):
    return {k: v["Properties"] for k, v in template.resources("AWS::CloudWatch::Alarm").items()}


def _alarm(template, name):
    (alarm,) = [p for k, p in _alarms(template).items() if k.startswith(f"Monitoring{name}")]
    return alarm


def _dashboard_body(template) -> dict:
    body = template.only("AWS::CloudWatch::Dashboard")["DashboardBody"]
    parts = body["Fn::Join"][1] if isinstance(body, dict) else [body]
    return json.loads("".join(p if isinstance(p, str) else "TOKEN" for p in parts))


def test_four_log_groups_with_retention_and_their_names_in_the_outputs(synth):
    template = synth()
    groups = template.resources("AWS::Logs::LogGroup")
    monitoring = {k: v for k, v in groups.items() if k.startswith("Monitoring")}
    assert len(monitoring) == len(LOG_KINDS)
    assert {g["Properties"]["RetentionInDays"] for g in monitoring.values()} == {14}
    outputs = template.json["Outputs"]
    for kind in LOG_KINDS:
        (output,) = [o for k, o in outputs.items() if k.startswith(f"Monitoring{kind.capitalize()}LogGroup")]
        assert output["Value"]["Ref"] in monitoring


def test_log_retention_is_a_setting_and_only_values_cloudwatch_accepts_pass(synth):
    groups = synth(log_retention_days="90").resources("AWS::Logs::LogGroup")
    assert {g["Properties"]["RetentionInDays"] for k, g in groups.items() if k.startswith("Monitoring")} == {90}
    with pytest.raises(ServingConfigError, match=r"^log_retention_days \(13\) must be one of 1, 3, 5, 7, 14"):
        synthesize({"log_retention_days": "13"})


def test_hosts_may_write_to_the_four_log_groups_and_nothing_else_of_logs_or_metrics(synth):
    template = synth()
    statements = [s for p in template.resources("AWS::IAM::Policy").values()
                  if any("Host" in r["Ref"] for r in p["Properties"]["Roles"])
                  for s in p["Properties"]["PolicyDocument"]["Statement"]]
    (logs_statement,) = [s for s in statements if "logs:PutLogEvents" in json.dumps(s["Action"])]
    assert sorted(logs_statement["Action"]) == ["logs:CreateLogStream", "logs:DescribeLogStreams",
                                                "logs:PutLogEvents"]
    resources = {r["Fn::GetAtt"][0] for r in logs_statement["Resource"]}
    assert resources == {k for k in template.resources("AWS::Logs::LogGroup") if k.startswith("Monitoring")}
    # Metrics travel as EMF in the logs, but for the boot's phase times, put in the namespace only.
    (metrics_statement,) = [s for s in statements if "cloudwatch:" in json.dumps(s["Action"])]
    assert metrics_statement == {"Action": "cloudwatch:PutMetricData", "Effect": "Allow", "Resource": "*",
                                 "Condition": {"StringEquals": {"cloudwatch:namespace": DEFAULT_NAMESPACE}}}
    # PutMetricData names no resource type, and cloudwatch:namespace is its condition key.
    privilege = service_authorization_reference()["cloudwatch:PutMetricData"]
    assert [(t["resource_type"], t["condition_keys"]) for t in privilege["resource_types"]] == [
        ("", ["cloudwatch:namespace"])]


def test_one_dashboard_with_a_row_per_concern_each_opened_by_a_text_and_its_url_in_the_outputs(synth):
    template = synth()
    widgets = _dashboard_body(template)["widgets"]
    texts = [w["properties"]["markdown"] for w in widgets if w["type"] == "text"]
    assert [t.split("\n")[0] for t in texts] == ["## Traffic", "## Serving", "## Neuron", "## Hosts", "## Boots"]
    assert all(len(t.split("\n", 1)[1]) > 80 for t in texts)  # each says how to read its row
    titles = {w["properties"].get("title") for w in widgets if w["type"] == "metric"}
    assert {"Target response time", "Errors", "Hosts", "Queue", "Request duration (s)",
            "Time per output token (s)", "Generated tokens per second", "NeuronCore utilization (%)",
            "Neuron device memory used (bytes)", "Execution errors by type", "Execution latency (s)",
            "ECC events", "CPU (%)", "Memory (%)", "Disk (%)"} <= titles
    url = json.dumps([o for k, o in template.json["Outputs"].items() if k.startswith("MonitoringDashboardUrl")])
    assert "cloudwatch/home?region=" in url and "#dashboards/dashboard/" in url


def test_latency_widgets_show_p50_p90_p99_and_utilization_average_and_maximum_per_instance(synth):
    widgets = {w["properties"].get("title"): w["properties"]["metrics"]
               for w in _dashboard_body(synth())["widgets"] if w["type"] == "metric"}
    stats = [m[-1].get("stat") for m in widgets["Time per output token (s)"]]
    assert stats == ["p50", "p90", "p99"]
    utilization = widgets["NeuronCore utilization (%)"]
    assert [m[-1].get("stat", "Average") for m in utilization[:2]] == ["Average", "Maximum"]  # Average: no "stat"
    (search,) = [m[0]["expression"] for m in utilization if isinstance(m[0], dict)]
    assert search.startswith("SEARCH('{NeuronServing,Service,InstanceId} MetricName=\"NeuronCoreUtilization\"")


def test_seven_alarms_notify_the_topic_on_alarm_and_on_recovery_and_ignore_missing_data(synth):
    template = synth()
    alarms = _alarms(template)
    assert {next(n for n in DEFAULT_ALARMS if k.startswith(f"Monitoring{n}")) for k in alarms} == DEFAULT_ALARMS
    (topic,) = template.resources("AWS::SNS::Topic").keys() - {k for k in template.resources("AWS::SNS::Topic")
                                                                if k.startswith("Fleet")}
    for alarm in alarms.values():
        assert alarm["AlarmActions"] == [{"Ref": topic}] == alarm["OKActions"]
        assert alarm["TreatMissingData"] == "notBreaching"


def test_alarm_thresholds_have_documented_defaults_and_context_overrides(synth):
    default, tuned = synth(), synth(alarm_5xx_percent="2.5", alarm_p99_latency_seconds="120", alarm_disk_percent="90")
    assert [_alarm(default, n)["Threshold"] for n in ("ErrorRate", "P99Latency", "DiskNearlyFull")] == [5, 60, 85]
    assert [_alarm(tuned, n)["Threshold"] for n in ("ErrorRate", "P99Latency", "DiskNearlyFull")] == [2.5, 120, 90]
    assert _alarm(default, "P99Latency")["ExtendedStatistic"] == "p99"
    assert _alarm(default, "UncorrectedEcc")["MetricName"] == "EccUncorrectedEvents"


@pytest.mark.parametrize(("context", "message"), [
    ({"alarm_5xx_percent": "0"}, r"^alarm_5xx_percent \(0.0\) must be a number above 0 and at most 100"),
    ({"alarm_disk_percent": "full"}, r"^alarm_disk_percent \('full'\) must be a number"),
    ({"alarm_email": "ops at example.com"}, r"^alarm_email \('ops at example.com'\) must be one e-mail address"),
])
def test_bad_alarm_settings_fail_synthesis_naming_the_setting(context, message):
    with pytest.raises(ServingConfigError, match=message):
        synthesize(context)


def test_the_alarm_topic_is_encrypted_with_a_key_cloudwatch_may_use_and_takes_an_email(synth):
    template = synth(alarm_email="oncall@example.com")
    (topic_id, topic), = [(k, v) for k, v in template.resources("AWS::SNS::Topic").items()
                          if k.startswith("Monitoring")]
    key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key_policy = json.dumps(template.json["Resources"][key_id]["Properties"]["KeyPolicy"])
    assert '"Service": "cloudwatch.amazonaws.com"' in key_policy
    (subscription,) = template.resources("AWS::SNS::Subscription").values()
    assert subscription["Properties"] == {"Protocol": "email", "Endpoint": "oncall@example.com",
                                          "TopicArn": {"Ref": topic_id}}


def test_no_healthy_hosts_counts_only_while_the_fleet_wants_hosts_and_waits_a_cached_boot(synth):
    alarm = _alarm(synth(**FLEET), "NoHealthyHosts")
    (expression,) = [m["Expression"] for m in alarm["Metrics"] if "Expression" in m]
    assert expression == "IF(desired > 0 AND healthy < 1, 1, 0)"
    desired = next(m for m in alarm["Metrics"] if m["Id"] == "desired")["MetricStat"]["Metric"]
    assert desired["MetricName"] == "GroupDesiredCapacity"
    # a cached boot: pull, download, then reading the weights and loading them (wait-ready's limit)
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 50


def test_the_fleet_scales_on_in_flight_requests_per_replica_with_the_batch_size_as_target(synth):
    (policy,) = synth(**FLEET).resources("AWS::AutoScaling::ScalingPolicy").values()
    config = policy["Properties"]["TargetTrackingConfiguration"]
    assert config["TargetValue"] == 4
    assert config["CustomizedMetricSpecification"] == {
        "Namespace": DEFAULT_NAMESPACE, "MetricName": "InFlightRequests",
        "Dimensions": [{"Name": "Service", "Value": "NeuronLlamaStack"}], "Statistic": "Average"}


def test_the_fleet_scales_on_requests_per_host_when_asked_and_not_on_both(synth):
    (policy,) = synth(**FLEET, target_requests_per_minute="30").resources("AWS::AutoScaling::ScalingPolicy").values()
    config = policy["Properties"]["TargetTrackingConfiguration"]
    assert config["PredefinedMetricSpecification"]["PredefinedMetricType"] == "ALBRequestCountPerTarget"
    target = synth(**FLEET, target_in_flight_requests="2.5").resources("AWS::AutoScaling::ScalingPolicy")
    assert next(iter(target.values()))["Properties"]["TargetTrackingConfiguration"]["TargetValue"] == 2.5
    with pytest.raises(ServingConfigError, match=r"^target_in_flight_requests \(3.0\) cannot be combined"):
        synthesize({**FLEET, "target_in_flight_requests": "3", "target_requests_per_minute": "30"})


def test_monitoring_attaches_to_a_users_own_auto_scaling_group():
    """Hosts of the user's own group publish when their boot script has monitoring; the
    construct watches whatever load balancer and target group front them."""
    from aws_cdk import App, Stack
    from aws_cdk import aws_autoscaling as autoscaling
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_elasticloadbalancingv2 as elbv2
    from aws_cdk.assertions import Template

    from neuron_serving import (
        AlarmThresholds,
        NeuronBootScript,
        NeuronServingLaunchTemplate,
        NeuronServingMonitoring,
        ServingRequest,
        neuron_dlami,
        plan_serving,
    )

    stack = Stack(App(), "Platform")
    vpc = ec2.Vpc(stack, "Vpc", restrict_default_security_group=False)
    plan = plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge"))
    monitoring = NeuronServingMonitoring(stack, "Monitoring", service="team-a-llama", log_retention_days=30,
                                         thresholds=AlarmThresholds(p99_latency_seconds=20))
    boot = NeuronBootScript(stack, "Boot", plan=plan, monitoring=monitoring)
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot, machine_image=neuron_dlami("/p"))
    group = autoscaling.AutoScalingGroup(stack, "Own", vpc=vpc, launch_template=host.launch_template, max_capacity=3)
    alb = elbv2.ApplicationLoadBalancer(stack, "Alb", vpc=vpc)
    target_group = alb.add_listener("Http", port=80, open=False).add_targets(
        "Hosts", port=plan.router_port, targets=[group], protocol=elbv2.ApplicationProtocol.HTTP)
    monitoring.watch(plan=plan, endpoint_load_balancer=alb, target_group=target_group)
    group.scale_to_track_metric("InFlight", metric=monitoring.metric("InFlightRequests"), target_value=3)

    resources = Template.from_stack(stack).to_json()["Resources"]
    body = json.dumps(next(r for r in resources.values() if r["Type"] == "AWS::CloudWatch::Dashboard"))
    assert "team-a-llama" in body
    alarms = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    assert len(alarms) == len(ALARMS)
    assert {a.get("Threshold") for a in alarms} >= {20}
    assert boot.options.monitoring.service == "team-a-llama"
    policy = json.dumps([r for r in resources.values() if r["Type"] == "AWS::IAM::Policy"])
    assert "logs:PutLogEvents" in policy and "s3:GetObject" in policy


def test_a_widget_for_a_metric_outside_the_catalog_cannot_be_built(synth):
    monitoring = synth().stack.monitoring
    with pytest.raises(KeyError, match="no metric 'TokensPerDollar' in the catalog"):
        monitoring.metric("TokensPerDollar")
    with pytest.raises(KeyError, match="QueueSize is not published with dimensions"):
        monitoring.metric("QueueSize", dimensions={"ErrorType": "model"})


@pytest.mark.parametrize(("engine", "sources"), [
    ("tgi", ["QueueSize = `tgi_queue_size`", "TimePerOutputToken = `tgi_request_mean_time_per_token_duration`"]),
    ("vllm", ["QueueSize = `vllm:num_requests_waiting`", "BatchSize = `vllm:num_requests_running`",
              "RequestFailures = `http_requests_total{handler=\"/v1/completions\",status=\"4xx\"}",
              "TimePerOutputToken = `vllm:request_time_per_output_token_seconds`"]),
])
def test_the_serving_row_names_the_engine_and_its_metric_names(synth, engine, sources):
    widgets = _dashboard_body(synth(engine=engine))["widgets"]
    [serving] = [w["properties"]["markdown"] for w in widgets
                 if w["type"] == "text" and w["properties"]["markdown"].startswith("## Serving")]
    assert serving.startswith(f"## Serving\n{'vLLM' if engine == 'vllm' else 'TGI'}'s own view")
    for source in sources:
        assert source in serving


# --- API keys: the hosts' failed key syncs ---------------------------------------------------------------------


def _assert_any_failure_alarm(template, metric: str, description: str) -> None:
    """An alarm on the service's Sum of ``metric`` over 5 minutes, at one failure or more, that notifies the
    topic of both states and whose description matches ``description``."""
    (topic,) = [k for k in template.resources("AWS::SNS::Topic") if k.startswith("Monitoring")]
    template.template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "Namespace": DEFAULT_NAMESPACE,
        "MetricName": metric,
        "Dimensions": [{"Name": "Service", "Value": "NeuronLlamaStack"}],
        "Statistic": "Sum",
        "Period": 300,
        "Threshold": 1,
        "EvaluationPeriods": 1,
        "DatapointsToAlarm": 1,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "TreatMissingData": "notBreaching",
        "AlarmActions": [{"Ref": topic}],
        "OKActions": [{"Ref": topic}],
        "AlarmDescription": Match.string_like_regexp(
            description),
    })


def test_with_api_keys_the_api_key_sync_alarm_fires_on_a_failed_sync_of_any_host_and_notifies_the_topic(synth):
    template = synth(api_keys="true")
    _assert_any_failure_alarm(template, API_KEY_SYNC_FAILURES,
                              r"api-keys sync failed .* keep the keys they had.*journalctl -u neuron-serving-api-keys")
    assert {next(n for n in (*DEFAULT_ALARMS, "ApiKeySync") if k.startswith(f"Monitoring{n}"))
            for k in _alarms(template)} == DEFAULT_ALARMS | {"ApiKeySync"}


def test_without_api_keys_there_is_no_api_key_sync_alarm_nor_its_dashboard_line(synth):
    template = synth()
    assert not any(p.get("MetricName") == API_KEY_SYNC_FAILURES for p in _alarms(template).values())
    assert API_KEY_SYNC_FAILURES not in json.dumps(_dashboard_body(template))


def test_with_api_keys_the_dashboard_shows_failed_syncs_beside_the_refused_requests(synth):
    widgets = _dashboard_body(synth(api_keys="true"))["widgets"]
    (failures,) = [w["properties"]["metrics"] for w in widgets
                   if w["type"] == "metric" and w["properties"].get("title") == "Replicas and failures"]
    assert [DEFAULT_NAMESPACE, API_KEY_SYNC_FAILURES, "Service", "NeuronLlamaStack",
            {"label": "failed API key syncs", "period": 60, "stat": "Sum"}] in failures
    [serving] = [w["properties"]["markdown"] for w in widgets
                 if w["type"] == "text" and w["properties"]["markdown"].startswith("## Serving")]
    assert "`journalctl -u neuron-serving-api-keys`" in serving and "`<instance id>/api-keys`" in serving


# --- The artifact cache: the hosts' failed publishes ---------------------------------------------------------------


def test_hosts_that_publish_exports_have_an_alarm_on_any_failed_publish_that_says_what_to_check(synth):
    template = synth()
    _assert_any_failure_alarm(template, EXPORT_PUBLISH_FAILURES,
                              r"could not publish the export to the artifact cache.*compiles again.*neuron-serving "
                              r"status.*" + PUBLISH_TAG
                              + r".*/var/log/neuron-serving/export\.log.*s3:PutObject.*bucket")


def test_hosts_that_publish_exports_show_their_failed_publishes_in_the_boots_row(synth):
    widgets = _dashboard_body(synth())["widgets"]
    (failures,) = [w["properties"]["metrics"] for w in widgets
                   if w["type"] == "metric" and w["properties"].get("title") == "Exports not published"]
    assert failures == [[DEFAULT_NAMESPACE, EXPORT_PUBLISH_FAILURES, "Service", "NeuronLlamaStack",
                         {"label": "failed publishes (all hosts, per hour)", "period": 3600, "stat": "Sum"}]]
    [boots] = [w["properties"]["markdown"] for w in widgets
               if w["type"] == "text" and w["properties"]["markdown"].startswith("## Boots")]
    assert "could not publish the export to the artifact cache" in boots


def test_hosts_that_serve_a_prebuilt_export_publish_nothing_and_have_no_publish_alarm_nor_widget(synth):
    template = synth(prebuilt_export="s3://team-exports/llama3-8b/tp2")
    assert not any(p.get("MetricName") == EXPORT_PUBLISH_FAILURES for p in _alarms(template).values())
    assert EXPORT_PUBLISH_FAILURES not in json.dumps(_dashboard_body(template))


def test_the_api_key_sync_alarm_threshold_is_a_whole_number_of_at_least_one():
    with pytest.raises(ServingConfigError, match=r"^api_key_sync_failures \(0\) must be a whole number of at least 1"):
        AlarmThresholds(api_key_sync_failures=0)


def test_alarm_thresholds_alone_name_their_own_props_all_at_once():
    with pytest.raises(ServingConfigError) as err:
        AlarmThresholds(error_rate_percent=500, disk_percent=-3)
    assert err.value.problems == ("error_rate_percent (500) must be a number above 0 and at most 100",
                                  "disk_percent (-3) must be a number above 0 and at most 100")


def test_a_token_threshold_is_checked_when_the_app_synthesizes():
    from aws_cdk import App, Lazy, Stack, Token

    from neuron_serving import NeuronServingMonitoring

    from .test_fleet import Producer
    stack = Stack(App(), "Own")
    NeuronServingMonitoring(stack, "Monitoring", thresholds=AlarmThresholds(
        error_rate_percent=Token.as_number(Lazy.number(Producer(500)))))
    with pytest.raises(Exception, match=r"error_rate_percent \(500\) must be a number above 0 and at most 100"):
        stack.node.root.synth()


def test_the_monitoring_construct_accepts_the_retention_days_the_settings_list_and_no_table_of_its_own():
    from aws_cdk import App, Stack
    from aws_cdk.assertions import Template

    from neuron_serving import NeuronServingMonitoring
    from neuron_serving.cdk import monitoring
    from neuron_serving.settings import LOG_RETENTION_DAYS
    assert not hasattr(monitoring, "RETENTION_DAYS")
    stack = Stack(App(), "Own")
    NeuronServingMonitoring(stack, "Monitoring", log_retention_days=LOG_RETENTION_DAYS[-1])
    Template.from_stack(stack).resource_properties_count_is("AWS::Logs::LogGroup", {"RetentionInDays": 3653},
                                                            len(LOG_KINDS))
    with pytest.raises(ServingConfigError, match=r"^log_retention_days \(13\) must be one of 1, 3, 5"):
        NeuronServingMonitoring(stack, "Other", log_retention_days=13)


def test_the_boots_row_shows_each_phase_that_takes_minutes_for_the_slowest_host_of_each_hour(synth):
    widgets = {w["properties"].get("title"): w["properties"]
               for w in _dashboard_body(synth())["widgets"] if w["type"] == "metric"}
    lines = widgets["Boot phases, slowest host (s)"]["metrics"]
    assert [(line[:2], dict(zip(line[2:6:2], line[3:6:2], strict=True))) for line in lines] == [
        ([DEFAULT_NAMESPACE, BOOT_PHASE_METRIC], {"Service": "NeuronLlamaStack", "Phase": phase.name})
        for phase in MEASURED]
    assert {"install-tools", "pull-image", "export-model", "download-checkpoint", "download-export",
            "wait-ready"} <= {phase.name for phase in MEASURED}
    assert [line[-1] for line in lines] == [{"label": p.name, "period": 3600, "stat": "Maximum"} for p in MEASURED]
