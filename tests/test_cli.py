"""The neuron-serving CLI prints every valid degree so a user can choose before deploying."""

import subprocess
import sys

from neuron_serving.cli import main


def test_plan_lists_every_allowed_degree_with_replicas_memory_and_fit(capsys):
    assert main(["plan", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--instance-type", "inf2.48xlarge"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("meta-llama/Llama-3.1-70B-Instruct on inf2.48xlarge (about $12.98/h on demand)")
    assert lines[1].split() == ["degree", "replicas", "idle", "cores", "GiB/core", "of", "fits"]
    rows = {int(line.split()[0]): line.split() for line in lines[2:14]}
    assert sorted(rows) == list(range(2, 25, 2))
    assert rows[8][1] == "3" and rows[8][-1] == "no"
    assert rows[24][1] == "1" and rows[24][-1] == "yes"
    assert lines[-1].startswith("default (smallest degree that fits): 12 -> replica-0: neuron0-5")


def test_plan_on_trainium_lists_only_runtime_topologies(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--instance-type", "trn1.32xlarge", "--batch-size", "32"]) == 0
    degrees = [int(line.split()[0]) for line in capsys.readouterr().out.splitlines()[2:-1]]
    assert degrees == [2, 8, 16, 32]


def test_plan_reports_a_model_that_fits_nowhere(capsys):
    assert main(["plan", "--model", "llama-3-8b", "--instance-type", "inf2.8xlarge", "--batch-size", "64",
                 "--sequence-length", "8192"]) == 0
    assert "no layout: model_id ('llama-3-8b') fits at no tensor_parallel degree" in capsys.readouterr().out


def test_plan_with_a_bad_setting_exits_2_naming_it(capsys):
    assert main(["plan", "--instance-type", "g5.xlarge"]) == 2
    assert "instance_type ('g5.xlarge') is not a supported Neuron instance type" in capsys.readouterr().err


def test_the_console_script_is_installed_and_does_not_start_the_cdk_runtime_nor_import_boto3():
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from neuron_serving.cli import main; main(['plan']); "
         "print('jsii' in sys.modules, 'aws_cdk' in sys.modules, 'boto3' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )
    assert result.stdout.splitlines()[-1] == "False False False"
