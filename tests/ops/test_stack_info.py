"""How the operator's commands read a stack's outputs: the keys are those of the synthesized templates."""

import json
from pathlib import Path

import pytest

from neuron_serving.ops.aws import OpsError
from neuron_serving.ops.stack import StackInfo

SNAPSHOTS = Path(__file__).parents[1] / "cdk" / "__snapshots__" / "test_synth_checks"


def _outputs(config: str) -> dict[str, str]:
    template = json.loads((SNAPSHOTS / f"test_template_matches_snapshot[{config}].json").read_text())
    return {key: json.dumps(value.get("Value")) for key, value in template["Outputs"].items()}


@pytest.mark.parametrize("config", ["default", "fleet"])
def test_every_output_the_commands_read_is_found_by_its_name_in_the_synthesized_template(config):
    info = StackInfo("S", "CREATE_COMPLETE", "", _outputs(config))
    for name in ("EndpointUrl", "Engine", "TargetGroupArn", "RouterPort", "BootPhaseMinutes", "DashboardUrl",
                 "BootLogGroup", "ReplicasLogGroup", "RouterLogGroup", "MetricsLogGroup"):
        assert info.output(name), name
    assert info.output("LogGroup") is None  # a name is matched whole, never as a fragment of another
    host = "InstanceId" if config == "default" else "AutoScalingGroupName"
    assert info.output(host)


def test_the_boot_phase_estimates_are_read_from_their_output():
    info = StackInfo("S", "CREATE_COMPLETE", "", {"BootPhaseMinutes": '{"export": 53, "load": 15}'})
    assert info.boot_phase_minutes == {"export": 53, "load": 15}
    assert StackInfo("S", "CREATE_COMPLETE", "", {}).boot_phase_minutes == {}


def test_a_missing_output_says_whether_to_wait_or_to_redeploy():
    with pytest.raises(OpsError, match="CREATE_IN_PROGRESS and has no EndpointUrl output yet"):
        StackInfo("S", "CREATE_IN_PROGRESS", "", {}).require("EndpointUrl", "the endpoint")
    with pytest.raises(OpsError, match=r"has no EndpointUrl output \(the endpoint\).*Deploy it again"):
        StackInfo("S", "UPDATE_COMPLETE", "", {}).require("EndpointUrl", "the endpoint")
