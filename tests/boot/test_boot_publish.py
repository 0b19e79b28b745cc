"""A publish that fails is visible to the operator, not only in export.log (issue 37): a host that
compiled the model and could not publish it to the artifact cache tags its instance with why
(``neuron-serving status`` shows it) and, with monitoring, puts the metric the stack's alarm watches;
it still serves. A builder, whose only work is the publish, fails. On simulated hosts, whose real AWS CLI
v2 gets S3's refusal of a PutObject the role may not make (``STUB_S3_UPLOAD_DENIED``, bootsim.AWS_KNOBS)."""

from __future__ import annotations

import re
from collections.abc import Callable

from bootsim import BOOT_LOG, CACHE, MONITORING, SIGNAL, SMALL_MODEL, Host, make_plan

from neuron_serving.plan.engines.tgi import TGI, TGI_3_3_5
from neuron_serving.plan.metrics import DEFAULT_NAMESPACE, EXPORT_PUBLISH_FAILURES
from neuron_serving.plan.phases import PUBLISH_RACED, PUBLISH_TAG, PUBLISHED
from neuron_serving.render.boot import REPORT_PUBLISH
from neuron_serving.render.boot_options import BootOptions
from tests.harness.aws import Fault
from tests.harness.userdata import boot_of

MakeHost = Callable[..., Host]
PLAN = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
KEY = TGI.export_key(PLAN, TGI_3_3_5)
MONITORED = boot_of(PLAN, BootOptions(artifact_cache=CACHE, signal=SIGNAL, monitoring=MONITORING))
DENIED = "failed: An error occurred AccessDenied when calling the PutObject operation: Access Denied"
"""The tag of a publish that S3 refused: the AWS CLI's error without the file it names, and without the
parentheses, which a tag value may not hold."""


def publish_tags(host: Host) -> list[str]:
    """The values of each report of :data:`PUBLISH_TAG` so far."""
    return [tags[PUBLISH_TAG] for tags in host.tag_reports() if PUBLISH_TAG in tags]


def publish_failures(host: Host) -> list[tuple[str, list[dict[str, object]]]]:
    """Each put of :data:`EXPORT_PUBLISH_FAILURES`: its namespace and data."""
    return [(namespace, data) for namespace, data in host.metric_data()
            if any(d["MetricName"] == EXPORT_PUBLISH_FAILURES for d in data)]


def test_a_host_whose_uploads_are_refused_still_serves_and_signals_success(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(MONITORED, STUB_S3_UPLOAD_DENIED="1")
    assert result.returncode == 0, result.stdout
    signals = host.aws("cloudformation", "signal-resource")
    assert [s[s.index("--status") + 1] for s in signals] == ["SUCCESS"]


def test_a_host_whose_uploads_are_refused_tags_its_instance_that_the_publish_failed_and_why(
    make_host: MakeHost,
) -> None:
    host = make_host(1)
    assert host.boot(MONITORED, STUB_S3_UPLOAD_DENIED="1").returncode == 0
    assert publish_tags(host) == [DENIED]
    [create] = [a for a in host.aws("ec2", "create-tags") if PUBLISH_TAG in a[a.index("--tags") + 1]]
    assert create[create.index("--resources") + 1] == host.instance_id
    assert create[create.index("--region") + 1] == "us-east-2"


def test_a_host_whose_uploads_are_refused_puts_one_failure_for_the_service_and_one_for_the_instance(
    make_host: MakeHost,
) -> None:
    host = make_host(1)
    assert host.boot(MONITORED, STUB_S3_UPLOAD_DENIED="1").returncode == 0
    service = {"Name": "Service", "Value": MONITORING.service}
    instance = {"Name": "InstanceId", "Value": host.instance_id}
    assert publish_failures(host) == [(DEFAULT_NAMESPACE, [
        {"MetricName": EXPORT_PUBLISH_FAILURES, "Unit": "Count", "Value": 1, "Dimensions": [service]},
        {"MetricName": EXPORT_PUBLISH_FAILURES, "Unit": "Count", "Value": 1, "Dimensions": [service, instance]},
    ])]


def test_a_refused_publish_says_in_the_boot_output_that_later_hosts_compile_again(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(MONITORED, STUB_S3_UPLOAD_DENIED="1")
    # The CRT transfer client names the local file without its leading "/" (tried with AWS CLI v2 2.36.7).
    local = str(host.root).removeprefix("/")
    # Which upload fails first is the transfer's to decide: any file of the export.
    line = (rf"export-model: not published: upload failed: {re.escape(local)}/var/lib/neuron-serving/exports/{KEY}/"
            rf"(\S+) to s3://cache-bucket/exports/{KEY}/{host.instance_id}/\1 An error occurred \(AccessDenied\) when "
            r"calling the PutObject operation: Access Denied \(the hosts after this one find no export in "
            rf"s3://cache-bucket/exports/{KEY}/ and compile again; see {re.escape(str(host.root))}/var/log/"
            r"neuron-serving/export.log\)\n")
    assert re.search(line, result.stdout), result.stdout


def test_a_refused_conditional_write_is_a_failed_publish_too(make_host: MakeHost) -> None:
    host = make_host(1)
    assert host.boot(MONITORED, STUB_PUT_OBJECT_DENIED="1").returncode == 0
    assert publish_tags(host) == [DENIED]
    assert len(publish_failures(host)) == 1


def test_a_published_export_is_tagged_published_and_puts_no_failure(make_host: MakeHost) -> None:
    host = make_host(1)
    assert host.boot(MONITORED).returncode == 0
    assert publish_tags(host) == [PUBLISHED]
    assert publish_failures(host) == []


def test_a_host_that_another_published_before_is_tagged_so_and_puts_no_failure(make_host: MakeHost) -> None:
    hosts = [make_host(1), make_host(1)]
    # A slow compiler: both hosts find no COMPLETE and export; one publishes, the other's write fails.
    boots = [h.boot_async(MONITORED, STUB_EXPORT_SECONDS="5") for h in hosts]
    assert [b.communicate(timeout=240) and b.returncode for b in boots] == [0, 0]
    assert sorted(tag for h in hosts for tag in publish_tags(h)) == sorted([PUBLISHED, PUBLISH_RACED])
    assert [publish_failures(h) for h in hosts] == [[], []]


def test_a_race_lost_is_told_by_s3s_own_412_with_its_condition_field(make_host: MakeHost) -> None:
    # S3 answers a conditional write that fails with 412 PreconditionFailed and the failed condition in
    # the error's <Condition> field (S3 API reference, PutObject, "Errors"; "Error responses"). AWS CLI v2
    # may write an error's modeled fields after the error line (awscli/errorhandler.py,
    # EnhancedErrorFormatter, at 2.36.7); the publish reads the error wherever it is in its output.
    host = make_host(1)
    publish = Fault.s3(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold",
                       method="PUT", path="*/COMPLETE", extra="<Condition>If-None-Match</Condition>")
    host.faults.append(publish)
    assert host.boot(MONITORED).returncode == 0
    assert publish_tags(host) == [PUBLISH_RACED]
    assert publish_failures(host) == []
    assert "PreconditionFailed" in host.path("/var/log/neuron-serving/export.log").read_text()


def test_a_host_without_monitoring_tags_the_failed_publish_and_puts_no_metric(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(PLAN, BootOptions(artifact_cache=CACHE, signal=SIGNAL)), STUB_S3_UPLOAD_DENIED="1")
    assert result.returncode == 0, result.stdout
    assert [t.split(":")[0] for t in publish_tags(host)] == ["failed"]
    assert host.metric_data() == []


def test_a_refused_report_of_the_failed_publish_is_logged_and_the_boot_goes_on(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(MONITORED, STUB_S3_UPLOAD_DENIED="1", STUB_TAGS_FAIL="1", STUB_METRICS_FAIL="1")
    assert result.returncode == 0, result.stdout
    log = host.path(BOOT_LOG).read_text()
    assert "report-publish: failed not reported (exit 254)" in log
    assert "report-publish: the failed publish not put as a metric (exit 254)" in log


def test_a_host_that_downloads_the_export_reports_no_publish(make_host: MakeHost) -> None:
    first, second = make_host(1), make_host(1)
    assert first.boot(MONITORED).returncode == 0
    assert second.boot(MONITORED).returncode == 0
    assert second.exports() == []
    assert publish_tags(second) == []
    assert [a for a in second.calls("aws") if REPORT_PUBLISH in " ".join(a)] == []


BUILDER = boot_of(PLAN, BootOptions(artifact_cache=CACHE), export_role="build")


def test_a_builder_that_publishes_succeeds(make_host: MakeHost) -> None:
    builder = make_host(1)
    result = builder.boot(BUILDER)
    assert result.returncode == 0, result.stdout
    assert publish_tags(builder) == [PUBLISHED]


def test_a_builder_whose_uploads_are_refused_fails_and_tells_the_waiting_hosts_why(make_host: MakeHost) -> None:
    builder = make_host(1)
    result = builder.boot(BUILDER, STUB_S3_UPLOAD_DENIED="1")
    assert result.returncode != 0
    assert publish_tags(builder) == [DENIED]
    failed = (builder.s3_object(f"{CACHE}/{KEY}/FAILED") or b"").decode()
    # The step's name, then export-model's own words (which name it too).
    assert failed.startswith("export-model: ")
    assert failed.endswith(f"export-model: the export is not in s3://cache-bucket/exports/{KEY}/: An "
                                       "error occurred (AccessDenied) when calling the PutObject operation: Access "
                                       "Denied\n")
