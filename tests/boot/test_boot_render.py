"""The rendered boot script as text: shellcheck, the user data size limit, snapshots, options."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from bootsim import MODEL, SECRET_ARN, SMALL_MODEL, make_plan
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from neuron_serving.plan import ServingConfigError, ServingPlan
from neuron_serving.render.boot import (
    USER_DATA_LIMIT_BYTES,
    BootOptions,
    check_user_data_size,
    render_boot_script,
)

CONFIGS: dict[str, tuple[Callable[[], ServingPlan], str | None]] = {
    "inf2.xlarge-1-replica": (lambda: make_plan("inf2.xlarge", model_id=SMALL_MODEL), None),
    "inf2.48xlarge-tp8-secret-name": (lambda: make_plan("inf2.48xlarge", 8), "neuron-serving/hf-token"),
    "trn1.32xlarge-tp2-secret-arn": (lambda: make_plan("trn1.32xlarge", 2), SECRET_ARN),
    "trn1.32xlarge-tp2": (lambda: make_plan("trn1.32xlarge", 2), None),
    "inf2.48xlarge-tp2-secret-arn": (lambda: make_plan("inf2.48xlarge", 2), SECRET_ARN),
    "inf2.24xlarge-tp4": (lambda: make_plan("inf2.24xlarge", 4), None),
}

EMBEDDED_FILE = re.compile(r"^put (\S+) \d+ <<'EOF'\n(.*?)^EOF$", re.MULTILINE | re.DOTALL)


def rendered(config: str) -> tuple[ServingPlan, str]:
    make, secret = CONFIGS[config]
    plan = make()
    return plan, render_boot_script(plan, BootOptions(hf_token_secret=secret))


def embedded_files(script: str) -> dict[str, str]:
    """The files the script writes from quoted heredocs, by their path on the host."""
    return {path: text for path, text in EMBEDDED_FILE.findall(script)}


class ShellSnapshot(SingleFileSnapshotExtension):
    """One reviewable ``.sh`` file per snapshot."""

    _write_mode = WriteMode.TEXT
    file_extension = "sh"


@pytest.mark.parametrize("config", CONFIGS)
def test_shellcheck_passes_on_the_boot_script_and_every_script_it_writes(
    config: str, shellcheck: str, tmp_path: Path
) -> None:
    _, script = rendered(config)
    files = {"bootstrap": script} | {
        path: text for path, text in embedded_files(script).items() if text.startswith("#!/bin/bash\n")
    }
    assert set(files) == {"bootstrap", "/opt/neuron-serving/bin/export-model",
                          "/opt/neuron-serving/bin/run-replica"}
    paths = []
    for name, text in files.items():
        paths.append(tmp_path / name.rsplit("/", 1)[-1])
        paths[-1].write_text(text)
    result = subprocess.run([shellcheck, "-S", "warning", "-s", "bash", *map(str, paths)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("config", ["trn1.32xlarge-tp2-secret-arn", "inf2.48xlarge-tp2-secret-arn"])
def test_largest_configurations_stay_well_under_the_user_data_limit(config: str) -> None:
    plan, script = rendered(config)
    size = len(script.encode())
    assert len(plan.replicas) >= 12
    assert size <= USER_DATA_LIMIT_BYTES * 3 // 4, f"{config}: {size} bytes"
    check_user_data_size(script, plan)


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
    "config", ["inf2.xlarge-1-replica", "inf2.48xlarge-tp8-secret-name", "trn1.32xlarge-tp2-secret-arn"]
)
def test_boot_script_snapshot(config: str, snapshot: SnapshotAssertion) -> None:
    _, script = rendered(config)
    router = embedded_files(script)["/etc/haproxy/haproxy.cfg.new"]
    # The router config has its own tests; here it would only make every router change a boot change.
    scrubbed = script.replace(router, "# <render_router_config(plan), without its comment lines>\n")
    assert scrubbed == snapshot(extension_class=ShellSnapshot)


def test_rendering_is_deterministic() -> None:
    assert rendered("trn1.32xlarge-tp2-secret-arn") == rendered("trn1.32xlarge-tp2-secret-arn")


def test_secret_id_is_shell_quoted_so_an_unresolved_cdk_token_stays_one_word() -> None:
    plan = make_plan("inf2.48xlarge", 8)
    script = render_boot_script(plan, BootOptions(hf_token_secret="${Token[TOKEN.123]}"))
    assert "\nsecret='${Token[TOKEN.123]}'\n" in script


def test_boot_script_embeds_exactly_its_five_files_each_ending_at_its_heredoc_end() -> None:
    _, script = rendered("inf2.48xlarge-tp8-secret-name")
    files = embedded_files(script)
    assert sorted(files) == ["/etc/haproxy/haproxy.cfg.new", "/etc/neuron-serving/tgi.env",
                             "/etc/systemd/system/neuron-tgi@.service",
                             "/opt/neuron-serving/bin/export-model", "/opt/neuron-serving/bin/run-replica"]
    assert files["/etc/systemd/system/neuron-tgi@.service"].rstrip().endswith("WantedBy=multi-user.target")


@pytest.mark.parametrize(
    ("options", "setting"),
    [
        ({"image": ""}, "image"),
        ({"image": "ghcr.io/x y"}, "image"),
        ({"hf_token_secret": ""}, "hf_token_secret"),
        ({"hf_token_secret": "my secret\n"}, "hf_token_secret"),
        ({"pull_attempts": 0}, "pull_attempts"),
    ],
)
def test_boot_options_name_the_bad_setting(options: dict[str, object], setting: str) -> None:
    with pytest.raises(ServingConfigError, match=f"^{setting} "):
        BootOptions(**options)  # type: ignore[arg-type]
