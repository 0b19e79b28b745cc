"""The rendered boot script as text: shellcheck, the user data size limit, snapshots, options."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from bootsim import (
    CACHE_TOKEN,
    HOOK,
    MODEL,
    MONITORING,
    MONITORING_TOKENS,
    SECRET_ARN,
    SIGNAL,
    SMALL_MODEL,
    make_plan,
)
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from neuron_serving.plan import ServingConfigError, ServingPlan
from neuron_serving.plan.engines.nxdi import DLC_VLLM_0_16_0
from neuron_serving.plan.engines.tgi import TGI_3_3_5
from neuron_serving.plan.engines.vllm import OPTIMUM_NEURON_VLLM_0_4_5
from neuron_serving.plan.host import resolve_host
from neuron_serving.plan.metrics import MonitoringOptions
from neuron_serving.plan.timing import readiness_seconds
from neuron_serving.plan.volume import default_throughput
from neuron_serving.render.boot import (
    API_KEYS as KEY_SYNC,
)
from neuron_serving.render.boot import (
    BOOT_STEPS,
    BUNDLE_ENV,
    METADATA_KEY,
    SIGNAL_ID_LIMIT,
    USER_DATA_LIMIT_BYTES,
    WAIT_READY,
    WATCH_INTERRUPTION,
    HostBoot,
    check_user_data_size,
    render_boot_script,
)
from neuron_serving.render.boot_options import (
    BootOptions,
    ReadinessSignal,
    TerminationHook,
    WarmPoolHook,
    publishes,
    reports_phases,
)
from neuron_serving.render.bundle import digest, manifest, write_bundle
from neuron_serving.render.monitoring import PUBLISHER
from tests.harness.userdata import (
    DEPLOYED_BUNDLE,
    DEPLOYED_RESOURCE,
    DEPLOYED_STACK,
    EMBEDDED_FILE,
    STACK_ENV,
    boot_of,
    deployed_metadata,
    deployed_values,
    embedded_files,
    host_stack_env,
    readable,
    spec_and_options,
    user_data,
)

ROOT = Path(__file__).resolve().parents[2]

CONFIGS: dict[str, tuple[Callable[[], ServingPlan], str | None]] = {
    "inf2.xlarge-1-replica": (lambda: make_plan("inf2.xlarge", model_id=SMALL_MODEL), None),
    "inf2.48xlarge-tp8-secret-name": (lambda: make_plan("inf2.48xlarge", 8), "neuron-serving/hf-token"),
    "trn1.32xlarge-tp2-secret-arn": (lambda: make_plan("trn1.32xlarge", 2), SECRET_ARN),
    "trn1.32xlarge-tp2": (lambda: make_plan("trn1.32xlarge", 2), None),
    "inf2.48xlarge-tp2-secret-arn": (lambda: make_plan("inf2.48xlarge", 2), SECRET_ARN),
    "inf2.24xlarge-tp4": (lambda: make_plan("inf2.24xlarge", 4), None),
}

FLEET = {"artifact_cache": CACHE_TOKEN, "signal": SIGNAL, "warm_pool_hook": HOOK,
         "model_revision": "5f0b02c75b57c5855da9ae460ce51323ea669d8a",
         "monitoring": MONITORING_TOKENS}
"""Every fleet option on, the cache bucket, the service, the log groups and the publisher's copy
in S3 unresolved CDK tokens as the stack passes them, the model pinned to a commit."""

DIGEST = "sha256:" + "0123456789abcdef" * 4
"""A pinned image's digest: a longer image reference, so the largest configurations pin one."""

API_KEYS = {"api_keys_secret": "${Token[TOKEN.901]}",
            "load_balancer_authentication": True}
"""API keys with browser sign-in, the secret an unresolved token."""

OPTION_CONFIGS: dict[str, tuple[str, dict[str, object]]] = {
    "trn1.32xlarge-tp2-secret-arn-fleet": ("trn1.32xlarge-tp2-secret-arn", FLEET),
    "inf2.48xlarge-tp2-secret-arn-fleet": ("inf2.48xlarge-tp2-secret-arn", FLEET),
    "inf2.48xlarge-tp8-secret-name-prebuilt-hf": (
        "inf2.48xlarge-tp8-secret-name",
        {"prebuilt_export": "hf://aws-neuron/Llama-3.1-8B-Instruct-neuron", "signal": SIGNAL},
    ),
    "inf2.xlarge-prebuilt-s3-cache-only": ("inf2.xlarge-1-replica", {"prebuilt_export": "s3://models/llama"}),
    "inf2.24xlarge-tp4-cache-only": ("inf2.24xlarge-tp4", {"artifact_cache": "s3://cache-bucket"}),
    "inf2.xlarge-monitoring": ("inf2.xlarge-1-replica", {"monitoring": MONITORING}),
    "inf2.24xlarge-tp4-monitoring-signal": (
        "inf2.24xlarge-tp4", {"monitoring": MONITORING, "signal": SIGNAL},
    ),
    "inf2.24xlarge-tp4-vllm-monitoring-signal": (
        "inf2.24xlarge-tp4",
        {"engine": "vllm", "monitoring": MONITORING, "signal": SIGNAL},
    ),
    "trn1.32xlarge-tp2-secret-arn-vllm-fleet": ("trn1.32xlarge-tp2-secret-arn", {"engine": "vllm", **FLEET}),
    "inf2.24xlarge-tp4-nxdi-monitoring-signal": (
        "inf2.24xlarge-tp4", {"engine": "nxdi", "monitoring": MONITORING, "signal": SIGNAL},
    ),
    "trn1.32xlarge-tp2-secret-arn-nxdi-sdk2.31-fleet": (
        "trn1.32xlarge-tp2-secret-arn", {"engine": "nxdi", **FLEET, "image": DLC_VLLM_0_16_0.reference},
    ),
    "trn1.32xlarge-tp2-secret-arn-fleet-pinned": (
        "trn1.32xlarge-tp2-secret-arn", {**FLEET, "image": f"{TGI_3_3_5.reference}@{DIGEST}"},
    ),
    "trn1.32xlarge-tp2-secret-arn-vllm-fleet-pinned": (
        "trn1.32xlarge-tp2-secret-arn",
        {"engine": "vllm", **FLEET, "image": f"{OPTIMUM_NEURON_VLLM_0_4_5.reference}@{DIGEST}"},
    ),
    "inf2.24xlarge-tp4-api-keys-signal": ("inf2.24xlarge-tp4", {**API_KEYS, "signal": SIGNAL}),
    "inf2.24xlarge-tp4-interruptions-signal": ("inf2.24xlarge-tp4", {"interruptions": True, "signal": SIGNAL}),
    "inf2.24xlarge-tp4-interruptions-hook-signal": (
        "inf2.24xlarge-tp4", {"interruptions": True, "termination_hook": TerminationHook(
            hook_name="neuron-serving-termination", group_name="Stack-Fleet", heartbeat_timeout_seconds=900),
            "signal": SIGNAL},
    ),
    "inf2.24xlarge-tp4-interruptions-api-keys-signal": (
        "inf2.24xlarge-tp4", {**API_KEYS, "interruptions": True, "signal": SIGNAL},
    ),
    "inf2.24xlarge-tp4-ecr-mirror": (
        "inf2.24xlarge-tp4",
        {"image_registry": "111122223333.dkr.ecr.us-east-1.amazonaws.com/mirror", "artifact_cache": "s3://cache-bucket"},
    ),
    "inf2.24xlarge-tp4-builder": ("inf2.24xlarge-tp4", {"artifact_cache": "s3://cache-bucket", "export_role": "build"}),
    "inf2.24xlarge-tp4-wait-signal": (
        "inf2.24xlarge-tp4", {"artifact_cache": "s3://cache-bucket", "export_role": "wait", "signal": SIGNAL},
    ),
    "trn1.32xlarge-tp2-secret-arn-vllm-fleet-pinned-api-keys": (
        "trn1.32xlarge-tp2-secret-arn",
        {"engine": "vllm", **FLEET, **API_KEYS, "image": f"{OPTIMUM_NEURON_VLLM_0_4_5.reference}@{DIGEST}"},
    ),
}

def rendered(config: str) -> tuple[ServingPlan, HostBoot]:
    if config in OPTION_CONFIGS:
        base, options = OPTION_CONFIGS[config]
        make, secret = CONFIGS[base]
    else:
        (make, secret), options = CONFIGS[config], {}
    plan = make()
    return plan, render_boot_script(plan, *spec_and_options(plan, {"hf_token_secret": secret, **options}))


class ShellSnapshot(SingleFileSnapshotExtension):
    """One reviewable ``.sh`` file per snapshot."""

    _write_mode = WriteMode.TEXT
    file_extension = "sh"


SCRIPTS = {"bootstrap", "/opt/neuron-serving/bin/export-model", "/opt/neuron-serving/bin/run-replica"}
KILOBYTE = 1024


@pytest.mark.parametrize("config", [*CONFIGS, *OPTION_CONFIGS])
def test_shellcheck_passes_on_the_boot_script_and_every_script_it_writes(
    config: str, shellcheck: str, tmp_path: Path
) -> None:
    _, boot = rendered(config)
    script, embedded = user_data(boot), embedded_files(boot)
    # The bootstrap sources its steps: they are checked as the one shell that runs them (shellcheck
    # -x reads a sourced file's definitions but reports nothing in it).
    sourcing = f'\n. ".{BOOT_STEPS}"\n'
    assert script.count(sourcing) == 1
    files = {"bootstrap": script.replace(sourcing, "\n" + embedded[BOOT_STEPS])} | {
        path: text for path, text in embedded.items() if text.startswith("#!/bin/bash\n")
    }
    options = OPTION_CONFIGS[config][1] if config in OPTION_CONFIGS else {}
    readiness = {"signal", "warm_pool_hook"} & set(options)
    base = OPTION_CONFIGS[config][0] if config in OPTION_CONFIGS else config
    plan = CONFIGS[base][0]()
    spec, boot_options = spec_and_options(plan, {"hf_token_secret": CONFIGS[base][1], **options})
    reports = reports_phases(spec, boot_options)
    assert set(files) == SCRIPTS | {f"/opt/neuron-serving/bin/{name}" for name, wanted in [
        ("wait-ready", readiness), ("complete-lifecycle", "warm_pool_hook" in options), ("report-phase", reports),
        ("report-publish", publishes(spec, boot_options)),
        ("start-monitoring", "monitoring" in options), ("load-api-keys", "api_keys_secret" in options)] if wanted}
    paths = []
    for name, text in files.items():
        paths.append(tmp_path / name.rsplit("/", 1)[-1])
        paths[-1].write_text(text)
    result = subprocess.run([shellcheck, "-S", "warning", "-s", "bash", *map(str, paths)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("config", [*CONFIGS, *OPTION_CONFIGS])
def test_the_user_data_is_under_2_5_kb_and_the_same_whatever_the_features(config: str) -> None:
    _, boot = rendered(config)
    script = user_data(boot)
    size = len(script.encode())
    # The files are in the bundle and the deploy-time values in the host resource's metadata,
    # whatever their number: the user data is the bootstrap, where those values are, the bundle's
    # place (about 120 bytes, the longest a bucket name and an asset hash make it) and the resource
    # its FAILURE signal goes to, if any. Tests of synthesized stacks check the same with the names
    # CloudFormation fills in (tests/boot/test_boot_synthesized.py).
    assert size < 2.5 * KILOBYTE, f"{config}: {size} bytes"
    smallest = min(len(user_data(rendered(c)[1]).encode()) for c in CONFIGS)
    signal = "".join(f"{k}={v}\n" for k, v in boot.bootstrap_env.items())
    assert size - smallest == len(signal.encode()), config


@pytest.mark.parametrize("config", [*CONFIGS, *OPTION_CONFIGS])
def test_every_configuration_fits_in_the_user_data(config: str) -> None:
    plan, boot = rendered(config)
    check_user_data_size(user_data(boot), plan)


def test_size_check_names_the_size_the_limit_and_the_configuration() -> None:
    plan = make_plan("inf2.48xlarge", 2)
    with pytest.raises(ValueError) as raised:
        check_user_data_size("#!/bin/bash\n" + "#" * 20000 + "\n", plan)
    message = str(raised.value)
    assert "20013 bytes" in message
    assert "16384 bytes" in message
    assert f"{MODEL} on inf2.48xlarge (12 replicas of tensor_parallel 2" in message


def test_size_check_accepts_a_script_of_exactly_the_limit() -> None:
    check_user_data_size("#" * USER_DATA_LIMIT_BYTES, make_plan("inf2.48xlarge", 8))


@pytest.mark.parametrize(
    "config", ["inf2.xlarge-1-replica", "inf2.48xlarge-tp8-secret-name", "trn1.32xlarge-tp2-secret-arn",
               "trn1.32xlarge-tp2-secret-arn-fleet", "inf2.xlarge-monitoring",
               "trn1.32xlarge-tp2-secret-arn-vllm-fleet", "inf2.24xlarge-tp4-interruptions-signal",
               "inf2.24xlarge-tp4-nxdi-monitoring-signal"]
)
def test_boot_script_snapshot(config: str, snapshot: SnapshotAssertion) -> None:
    _, boot = rendered(config)
    # The router config has its own tests, and the publisher and the key sync are the package's files
    # as they are (tests/monitor, tests/ops): here each of their changes would only be a boot change.
    copies = {PUBLISHER: "publish_metrics.py", KEY_SYNC: "api_keys.py", WATCH_INTERRUPTION: "watch_interruption.py"}
    shown = readable(boot, leave_out=("/etc/haproxy/haproxy.cfg.new", *copies))
    assert shown == snapshot(extension_class=ShellSnapshot)
    for path, source in copies.items():
        if path in boot.files:
            assert boot.files[path] == (ROOT / "userdata" / source).read_text()


def test_rendering_is_deterministic() -> None:
    assert rendered("trn1.32xlarge-tp2-secret-arn") == rendered("trn1.32xlarge-tp2-secret-arn")


def test_secret_id_is_shell_quoted_so_an_unresolved_cdk_token_stays_one_word() -> None:
    plan = make_plan("inf2.48xlarge", 8)
    boot = boot_of(plan, BootOptions(hf_token_secret="${Token[TOKEN.123]}"))
    values = deployed_values(boot)
    assert "\nHF_TOKEN_SECRET='${Token[TOKEN.123]}'\n" in "\n" + values
    assert values.count("${Token[TOKEN.123]}") == 1
    assert "TOKEN.123" not in user_data(boot)


def test_the_bundle_holds_the_boot_files_and_the_user_data_only_where_the_stack_values_are() -> None:
    _, boot = rendered("inf2.48xlarge-tp8-secret-name")
    assert sorted(boot.files) == ["/etc/haproxy/haproxy.cfg.new", BUNDLE_ENV, "/etc/neuron-serving/replica.env",
                                  "/etc/neuron-serving/replicas.table",
                                  "/etc/systemd/system/neuron-replica@.service", BOOT_STEPS,
                                  "/opt/neuron-serving/bin/check-export", "/opt/neuron-serving/bin/export-model",
                                  "/opt/neuron-serving/bin/run-replica"]
    assert boot.files["/etc/systemd/system/neuron-replica@.service"].rstrip().endswith("WantedBy=multi-user.target")
    # Only stack.env is in the user data, and in it only where the stack's values are and the bundle's
    # place (no signal here); the values known at synth are bundled, and this boot has no deploy-time one.
    assert EMBEDDED_FILE.findall(user_data(boot)) == [
        f"STACK_REGION=us-east-1\nSTACK_NAME={DEPLOYED_STACK}\nHOST_RESOURCE={DEPLOYED_RESOURCE}\n"
        f"BUNDLE={DEPLOYED_BUNDLE}\n"]
    assert json.loads(deployed_metadata(boot)) == {METADATA_KEY: ""}
    assert boot.files[BUNDLE_ENV] == f"IMAGE={TGI_3_3_5.reference}\nHF_TOKEN_SECRET=neuron-serving/hf-token\n"
    assert f'sha256sum -c --quiet <<<"{boot.digest}  MANIFEST"' in user_data(boot)


def test_bundled_files_may_hold_no_deploy_time_value_and_are_executable_only_with_a_shebang(tmp_path: Path) -> None:
    with pytest.raises(ServingConfigError, match=r"^/etc/x .* cannot hold a deploy-time value"):
        manifest({"/etc/x": "BUCKET=${Token[TOKEN.7]}\n"})
    with pytest.raises(ServingConfigError, match=r"^bundle file \('etc/x'\) must be an absolute path"):
        manifest({"etc/x": "x\n"})
    files = {"/bin/x": "#!/bin/bash\n", "/etc/y": "k=v\n"}
    write_bundle(files, tmp_path)
    sums = [hashlib.sha256(text.encode()).hexdigest() for text in files.values()]
    assert (tmp_path / "MANIFEST").read_text() == f"{sums[0]}  bin/x\n{sums[1]}  etc/y\n"
    assert (tmp_path / "bin/x").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "etc/y").stat().st_mode & 0o777 == 0o644
    assert digest(files) == hashlib.sha256((tmp_path / "MANIFEST").read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("options", "setting"),
    [
        ({"image": ""}, "image"),
        ({"image": "ghcr.io/x y"}, "image"),
        ({"engine": "trt"}, "engine"),
        ({"engine": "vllm", "image": TGI_3_3_5.reference}, "image"),
        ({"hf_token_secret": ""}, "hf_token_secret"),
        ({"hf_token_secret": "my secret\n"}, "hf_token_secret"),
        ({"pull_attempts": 0}, "pull_attempts"),
        ({"pull_attempts": 7}, "pull_attempts"),
        ({"artifact_cache": "cache-bucket/exports"}, "artifact_cache"),
        ({"artifact_cache": "s3://"}, "artifact_cache"),
        ({"artifact_cache": "s3:// bucket"}, "artifact_cache"),
        ({"prebuilt_export": "gs://bucket/export"}, "prebuilt_export"),
        ({"prebuilt_export": "hf://"}, "prebuilt_export"),
        ({"prebuilt_export": "s3:///"}, "prebuilt_export"),
        ({"model_revision": "main branch"}, "model_revision"),
        ({"model_revision": "$(reboot)"}, "model_revision"),
        ({"model_revision": "-rf"}, "model_revision"),
        ({"model_revision": "v1", "prebuilt_export": "s3://models/llama"}, "model_revision"),
        ({"image_registry_pull_through": True}, "image_registry_pull_through"),
        ({"export_role": "wait", "prebuilt_export": "s3://models/llama"}, "export_role"),
        ({"signal": "NeuronLlamaStack"}, "signal"),
        ({"warm_pool_hook": "neuron-serving-launch"}, "warm_pool_hook"),
        ({"monitoring": {"service": "NeuronLlamaStack"}}, "monitoring"),
        ({"monitoring": MonitoringOptions(service="s", log_groups=MONITORING.log_groups,
                                          namespace="${Token[TOKEN.9]}")},
         "monitoring.namespace"),
        ({"monitoring": MonitoringOptions(service="s", log_groups={**MONITORING.log_groups, "boot": "boot:logs"})},
         r"monitoring.log_groups\['boot'\]"),
        ({"signal": SIGNAL, "ready_seconds": 0}, "ready_seconds"),
        ({"signal": SIGNAL, "ready_seconds": "2700"}, "ready_seconds"),
    ],
)
def test_boot_options_and_the_host_spec_name_the_bad_setting(options: dict[str, object], setting: str) -> None:
    with pytest.raises(ServingConfigError, match=f"^{setting} "):
        spec_and_options(make_plan("inf2.48xlarge", 8), options)


def test_the_host_spec_reports_every_problem_at_once() -> None:
    with pytest.raises(ServingConfigError) as raised:
        resolve_host(make_plan("inf2.48xlarge", 8), image="ghcr.io/x y", pull_attempts=0,
                     prebuilt_export="gs://bucket", image_registry_pull_through=True)
    assert [p.split(" ", 1)[0] for p in raised.value.problems] == [
        "image", "image_registry_pull_through", "prebuilt_export", "pull_attempts"]


@pytest.mark.parametrize(
    ("make", "setting"),
    [
        (lambda: ReadinessSignal(stack_name="", logical_id="Fleet"), "signal.stack_name"),
        (lambda: ReadinessSignal(stack_name="Stack", logical_id="Fleet Group"), "signal.logical_id"),
        (lambda: WarmPoolHook(hook_name="", group_name="Group"), "warm_pool_hook.hook_name"),
        (lambda: WarmPoolHook(hook_name="launch", group_name=" "), "warm_pool_hook.group_name"),
    ],
)
def test_signal_and_warm_pool_hook_name_the_bad_setting(make: Callable[[], object], setting: str) -> None:
    with pytest.raises(ServingConfigError, match=f"^{re.escape(setting)} "):
        make()


def test_without_fleet_options_the_script_has_no_metadata_readiness_signal_or_cache_step() -> None:
    for config in CONFIGS:
        boot = rendered(config)[1]
        # What the files run, without their comments (which explain what other configurations do).
        script = "".join(line + "\n" for text in boot.files.values() for line in text.splitlines()
                         if not line.lstrip().startswith("#"))
        assert "host.env" not in script and "wait-ready" not in script and "complete-lifecycle" not in script
        assert "aws s3" not in script and "signal-resource" not in script
        # The user data's own FAILURE signal (before the bundle is in) is off without a signal.
        assert "SIGNAL_RESOURCE=" not in user_data(boot) and not boot.bootstrap_env


def test_deploy_time_values_stay_one_quoted_word_in_the_metadata_and_only_there() -> None:
    boot = rendered("trn1.32xlarge-tp2-secret-arn-fleet")[1]
    script, files = user_data(boot), embedded_files(boot)
    # stack.env: the user data's lines (where the values are, the bundle's place and the FAILURE
    # signal's resource), then the values the host resource's metadata holds.
    assert files[STACK_ENV] == (
        f"STACK_REGION=us-east-1\nSTACK_NAME={DEPLOYED_STACK}\nHOST_RESOURCE={DEPLOYED_RESOURCE}\n"
        f"BUNDLE={DEPLOYED_BUNDLE}\nSIGNAL_RESOURCE=NeuronServingFleet\n"
        "CACHE_BUCKET='${Token[TOKEN.123]}'\n"
        "SERVICE='${Token[TOKEN.200]}'\nLOG_GROUP_BOOT='${Token[TOKEN.201]}'\n"
        "LOG_GROUP_REPLICAS='${Token[TOKEN.202]}'\nLOG_GROUP_ROUTER='${Token[TOKEN.203]}'\n"
        "LOG_GROUP_METRICS='${Token[TOKEN.204]}'\n")
    # The values known at synth travel in the bundle; on the host, stack.env holds both.
    assert files[BUNDLE_ENV] == (
        f"IMAGE={TGI_3_3_5.reference}\nHF_TOKEN_SECRET={SECRET_ARN}\nCACHE_PREFIX=exports/\n"
        "GROUP_NAME=NeuronLlamaStack-NeuronServingFleet\nHOOK_NAME=neuron-serving-launch\n"
        "METRICS_NAMESPACE=NeuronServing\nSIGNAL_STACK=NeuronLlamaStack\n")
    export_model = files["/opt/neuron-serving/bin/export-model"]
    assert "\ns3=s3://$CACHE_BUCKET/\ncached=$CACHE_PREFIX$key\n" in export_model
    assert '--bucket "$CACHE_BUCKET" --key' in export_model
    assert '--log-opt "awslogs-group=$LOG_GROUP_REPLICAS"' in files["/opt/neuron-serving/bin/run-replica"]
    for token in ["TOKEN.123", "TOKEN.200", "TOKEN.201", "TOKEN.202", "TOKEN.203", "TOKEN.204"]:
        assert deployed_metadata(boot).count(f"${{Token[{token}]}}") == 1, token
        assert token not in script


@pytest.mark.parametrize(
    ("cache", "line"),
    [("s3://cache-bucket", "CACHE_PREFIX=''"), ("s3://cache-bucket/a/b/", "CACHE_PREFIX=a/b/")],
)
def test_the_artifact_cache_prefix_may_be_empty_or_nested(cache: str, line: str) -> None:
    script = boot_of(make_plan("inf2.48xlarge", 8), BootOptions(artifact_cache=cache))
    stack_env = host_stack_env(script)
    assert "\nCACHE_BUCKET=cache-bucket\n" in stack_env
    assert f"\n{line}\n" in stack_env


def test_the_ready_unit_waits_for_every_replica_and_the_router_then_completes_the_lifecycle_action() -> None:
    files = embedded_files(rendered("trn1.32xlarge-tp2-secret-arn-fleet")[1])
    ready = files["/etc/systemd/system/neuron-serving-ready.service"].splitlines()
    assert [line for line in ready if line.startswith("ExecStart=")] == [
        "ExecStart=/opt/neuron-serving/bin/wait-ready --report",
        "ExecStart=/opt/neuron-serving/bin/complete-lifecycle CONTINUE",
    ]
    assert {"Type=oneshot", "After=haproxy.service", "WantedBy=multi-user.target"} <= set(ready)
    assert "Before=neuron-serving-ready.service" in files["/etc/systemd/system/neuron-replica@.service"]


LARGE_MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def _wait_ready_limit(plan: ServingPlan, **options: object) -> int:
    files = embedded_files(boot_of(plan, BootOptions(signal=SIGNAL, **options)))  # type: ignore[arg-type]
    found = re.search(r"^limit=\$\{NEURON_SERVING_READY_SECONDS:-(\d+)\}$", files[WAIT_READY], re.MULTILINE)
    assert found is not None
    return int(found.group(1))


def test_wait_ready_waits_as_long_as_the_plan_takes_to_read_and_load_its_model() -> None:
    small, large = make_plan("inf2.48xlarge"), make_plan("inf2.48xlarge", model_id=LARGE_MODEL)
    limits = {plan.model.name: _wait_ready_limit(plan) for plan in (small, large)}
    # 1.5 x (0.7 min reading 15 GiB at 341 MiB/s + 14 min loading); 1.5 x (1.3 min reading 131 GiB at 1,666 + 45)
    assert limits == {"llama-3.1-8b": 23 * 60, "llama-3.1-70b": 70 * 60}
    for plan in (small, large):
        assert limits[plan.model.name] == readiness_seconds(plan, default_throughput(plan))
        reading = plan.weights_bytes / (default_throughput(plan) * 1024**2)
        assert limits[plan.model.name] > reading


def test_wait_ready_takes_the_limit_it_is_given() -> None:
    assert _wait_ready_limit(make_plan("inf2.48xlarge"), ready_seconds=4321) == 4321


def test_a_warm_pool_hook_must_outlast_wait_ready_which_runs_without_heartbeats_after_a_warm_start() -> None:
    plan = make_plan("inf2.48xlarge", model_id=LARGE_MODEL)
    hook = WarmPoolHook(hook_name=HOOK.hook_name, group_name=HOOK.group_name, heartbeat_timeout_seconds=3600)
    with pytest.raises(ServingConfigError, match=r"^warm_pool_hook.heartbeat_timeout_seconds \(3600\) must be at "
                       r"least wait-ready's limit \(4200 s for llama-3.1-70b\)"):
        _wait_ready_limit(plan, warm_pool_hook=hook)
    with pytest.raises(ServingConfigError, match=r"^warm_pool_hook.heartbeat_timeout_seconds \(3600\)"):
        _wait_ready_limit(make_plan("inf2.48xlarge"), warm_pool_hook=hook, ready_seconds=3601)
    assert _wait_ready_limit(plan, warm_pool_hook=HOOK) == 4200


def test_the_signal_unique_id_is_cut_to_the_api_limit() -> None:
    _, boot = rendered("trn1.32xlarge-tp2-secret-arn-fleet")
    assert f"| head -c {SIGNAL_ID_LIMIT})" in boot.files[BOOT_STEPS]
    assert SIGNAL_ID_LIMIT == 64


def test_only_a_host_with_interruptions_has_the_watcher_its_unit_and_a_router_that_drains() -> None:
    from neuron_serving.userdata.watch_interruption import DRAIN_FILE, DRAIN_FILE_TEXT

    unit = "/etc/systemd/system/neuron-serving-interruption.service"
    plan = make_plan("inf2.24xlarge", 4)
    without = render_boot_script(plan, *spec_and_options(plan, {"signal": SIGNAL}))
    assert not {WATCH_INTERRUPTION, unit, DRAIN_FILE} & set(without.files)
    assert "draining" not in without.files["/etc/haproxy/haproxy.cfg.new"]
    assert "neuron-serving-interruption" not in without.files[BOOT_STEPS]
    boot = render_boot_script(plan, *spec_and_options(plan, {"signal": SIGNAL, "interruptions": True}))
    assert boot.files[WATCH_INTERRUPTION] == (ROOT / "userdata" / "watch_interruption.py").read_text()
    assert boot.files[DRAIN_FILE] == DRAIN_FILE_TEXT
    assert f"-f {DRAIN_FILE} }}" in boot.files["/etc/haproxy/haproxy.cfg.new"]
    assert ("ExecStart=/usr/bin/env python3 /opt/neuron-serving/bin/watch-interruption --report-phase "
            "/opt/neuron-serving/bin/report-phase --phase draining") in boot.files[unit]
    steps = boot.files[BOOT_STEPS]
    # Enabled with the router, started once the router serves.
    assert "systemctl enable haproxy neuron-serving-interruption\n" in steps
    assert steps.index("systemctl restart haproxy") < steps.index("systemctl start neuron-serving-interruption")
    # Without any other AWS option, interruptions still read the metadata: the host calls Auto Scaling.
    alone = render_boot_script(plan, *spec_and_options(plan, {"interruptions": True}))
    assert "/opt/neuron-serving/bin/report-phase" in alone.files


def test_with_a_termination_hook_the_watcher_reads_its_names_from_stack_env_and_its_timeout_from_the_unit() -> None:
    unit = "/etc/systemd/system/neuron-serving-interruption.service"
    _, without = rendered("inf2.24xlarge-tp4-interruptions-signal")
    assert "--hook-seconds" not in without.files[unit] and "stack.env" not in without.files[unit]
    assert "TERMINATION_HOOK_NAME" not in without.files[BUNDLE_ENV]
    _, boot = rendered("inf2.24xlarge-tp4-interruptions-hook-signal")
    assert "EnvironmentFile=/etc/neuron-serving/stack.env\n" in boot.files[unit]
    assert " --phase draining --hook-seconds 900\n" in boot.files[unit]
    assert "GROUP_NAME=Stack-Fleet\n" in boot.files[BUNDLE_ENV]
    assert "TERMINATION_HOOK_NAME=neuron-serving-termination\n" in boot.files[BUNDLE_ENV]


def test_a_termination_hook_without_interruptions_is_refused_naming_the_option() -> None:
    hook = TerminationHook(hook_name="neuron-serving-termination", group_name="Stack-Fleet",
                           heartbeat_timeout_seconds=900)
    with pytest.raises(ServingConfigError, match=r"^termination_hook \('neuron-serving-termination'\) applies only "
                       r"with interruptions"):
        BootOptions(termination_hook=hook)


def test_a_termination_hooks_timeout_is_checked_against_the_apis_range() -> None:
    with pytest.raises(ServingConfigError, match=r"^termination_hook.heartbeat_timeout_seconds \(10\) must be an "
                       r"integer from 30 to 7200"):
        TerminationHook(hook_name="h", group_name="g", heartbeat_timeout_seconds=10)


def test_a_builder_takes_no_interruptions() -> None:
    plan = make_plan("inf2.24xlarge", 4)
    with pytest.raises(ServingConfigError, match=r"export_role.*interruptions"):
        render_boot_script(plan, *spec_and_options(
            plan, {"artifact_cache": "s3://cache-bucket", "export_role": "build", "interruptions": True}))
