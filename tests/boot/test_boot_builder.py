"""Small hosts serve big models: a builder instance exports into the artifact cache and leaves its
Auto Scaling group; serving hosts that cannot compile wait for that export, download it and never
compile. On simulated hosts whose ``aws`` is the real AWS CLI against moto (S3) and the recorder
(Auto Scaling, checked against botocore's model), and whose docker is the real CLI."""

from __future__ import annotations

from collections.abc import Callable

from bootsim import MARKER, SIGNAL, SMALL_MODEL, Host, make_plan

from neuron_serving.plan.engines.tgi import TGI, TGI_3_3_5
from neuron_serving.plan.phases import SECONDS_TAG
from neuron_serving.render.boot_options import BootOptions
from tests.harness.aws import AwsEmulator, Fault
from tests.harness.userdata import boot_of

CACHE = "s3://cache-bucket/exports"
BUCKET = "cache-bucket"
PLAN = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
KEY = TGI.export_key(PLAN, TGI_3_3_5)
BUILDER = boot_of(PLAN, BootOptions(artifact_cache=CACHE), export_role="build")
WAITER = boot_of(PLAN, BootOptions(artifact_cache=CACHE, signal=SIGNAL), export_role="wait")


def _log(host: Host) -> str:
    return host.path("/var/log/neuron-serving/boot.log").read_text()


def _left_its_group(aws: AwsEmulator, host: Host) -> bool:
    calls = aws.recorder.calls("TerminateInstanceInAutoScalingGroup")
    assert all(c.valid for c in calls), [c.errors for c in calls]
    return any(c.params == {"InstanceId": host.instance_id, "ShouldDecrementDesiredCapacity": True} for c in calls)


def test_the_builder_exports_publishes_serves_nothing_and_leaves_its_group(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    builder = make_host(1)
    assert builder.boot(BUILDER).returncode == 0, _log(builder)
    assert len(builder.exports()) == 1
    assert aws.get_object(BUCKET, f"exports/{KEY}/COMPLETE") is not None
    assert [u for u in builder.started_units() if u.startswith("neuron-replica")] == []
    assert _left_its_group(aws, builder)
    # Its boot ends in no phase that ends a boot: its end ends the compile, and tags its seconds.
    assert builder.phase_lines()[-1][0] == "export-model"
    assert list(builder.tag_reports()[-1]) == [SECONDS_TAG]


def test_a_host_that_cannot_compile_waits_for_the_builder_downloads_and_never_compiles(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    waiter, builder = make_host(1), make_host(1)
    waiting = waiter.boot_async(WAITER, NEURON_SERVING_POLL_SECONDS="1")
    assert builder.boot(BUILDER).returncode == 0, _log(builder)
    output, _ = waiting.communicate(timeout=240)
    assert waiting.returncode == 0, output
    assert waiter.exports() == []
    assert waiter.path(f"/var/lib/neuron-serving/exports/{KEY}/{MARKER}").read_text().startswith(
        f"downloaded from s3://{BUCKET}/exports/{KEY}/{builder.instance_id}/")
    steps = [p for p, _ in waiter.phases() if p in ("wait-export", "download-export")]
    assert steps == ["wait-export", "download-export"]
    signals = aws.recorder.calls("SignalResource")
    assert [(s.params["Status"], s.params["UniqueId"]) for s in signals] == [("SUCCESS", waiter.instance_id)]


def test_a_failed_builder_tells_the_waiting_hosts_why_and_they_fail_at_once(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    builder, waiter = make_host(1), make_host(1)
    assert builder.boot(BUILDER, STUB_EXPORT_FAIL="1").returncode != 0
    assert _left_its_group(aws, builder)
    failed = aws.get_object(BUCKET, f"exports/{KEY}/FAILED")
    assert failed == b"export-model: neuronx-cc: error: compilation failed\n"
    result = waiter.boot(WAITER, NEURON_SERVING_POLL_SECONDS="1")
    assert result.returncode != 0
    assert ("export-model: the builder's export failed: export-model: neuronx-cc: error: compilation failed"
            in _log(waiter))
    assert waiter.exports() == []
    signals = aws.recorder.calls("SignalResource")
    assert [s.params["Status"] for s in signals] == ["FAILURE"]


def test_a_new_builder_of_the_same_export_clears_an_earlier_failure(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    first, second = make_host(1), make_host(1)
    assert first.boot(BUILDER, STUB_EXPORT_FAIL="1").returncode != 0
    assert second.boot(BUILDER).returncode == 0, _log(second)
    assert aws.get_object(BUCKET, f"exports/{KEY}/FAILED") is None
    assert aws.get_object(BUCKET, f"exports/{KEY}/COMPLETE") is not None


# A role that may not list the bucket gets 403 for a marker not there yet (S3 API reference, HeadObject,
# "Permissions"); here S3 refuses the marker's HEAD, as for a role whose grant does not reach it.
REFUSED_MARKER = Fault.s3(403, "AccessDenied", "Access Denied", method="HEAD", path="*/COMPLETE")


def test_a_waiting_host_that_may_not_read_the_marker_fails_at_once_naming_the_error(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    waiter = make_host(1)
    waiter.faults.append(REFUSED_MARKER)
    result = waiter.boot(WAITER, NEURON_SERVING_POLL_SECONDS="1")
    assert result.returncode != 0
    # v2 reads a HEAD's 403, which has no body, as the code "403" and the message "Forbidden".
    assert (f"export-model: cannot read s3://{BUCKET}/exports/{KEY}/COMPLETE: An error occurred (403) when "
            "calling the HeadObject operation: Forbidden") in _log(waiter)
    assert [p for p, _ in waiter.phases()].count("wait-export") == 1
    assert [s.params["Status"] for s in aws.recorder.calls("SignalResource")] == ["FAILURE"]


def test_a_host_that_may_not_read_the_marker_says_so_and_exports_itself(make_host: Callable[..., Host]) -> None:
    host = make_host(1)
    host.faults.append(REFUSED_MARKER)
    result = host.boot(boot_of(PLAN, BootOptions(artifact_cache=CACHE)))
    assert result.returncode == 0, result.stdout
    assert len(host.exports()) == 1
    assert (f"export-model: cannot read s3://{BUCKET}/exports/{KEY}/COMPLETE: An error occurred (403) when "
            "calling the HeadObject operation: Forbidden; exporting here") in result.stdout
