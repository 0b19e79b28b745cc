"""``neuron-serving preflight``: each check passing and failing, against moto's server on loopback
(``tests/harness/aws.py``) for EC2, SSM, Secrets Manager, CloudFormation and STS, and against the recorder
``tests/harness/quota_recorder.py`` for what moto 5.2.5 lacks (Service Quotas for ec2, EC2
DescribeCapacityReservations, Resource Groups ListGroupResources), which forwards every other EC2 call to moto.

Region us-east-1: moto 5.2.5's offerings data (moto/ec2/resources/instance_type_offerings/availability-zone/
us-east-1.json.gz) offers inf2.24xlarge in us-east-1a, b, c and f, trn1.32xlarge in b, c and f only; moto's
default VPC has a default subnet in each of us-east-1a to f, so Fn::GetAZs's first two are a and b.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from neuron_serving.cli import main
from tests.harness.aws import FAKE_ACCESS_KEY, FAKE_SECRET_KEY, LOOPBACK, TOOLS, MotoServer
from tests.harness.quota_recorder import QuotaRecorder

if not (TOOLS / "bin" / "python").exists() and importlib.util.find_spec("moto") is None:
    pytest.skip("pip install -r tests/harness/requirements-aws.txt (no moto)", allow_module_level=True)

REGION = "us-east-1"
INF = "L-1945791B"
TRN = "L-2C3B7624"
INF_SPOT = "L-B5D1601B"
TRN_SPOT = "L-6B0D517C"
DLAMI = "/neuron-serving-test/dlami/latest/image_id"
"""moto refuses parameter names starting with aws, so the default /aws/service/neuron/... parameter cannot be
created there: tests of a resolving parameter name this one with -c dlami_parameter."""


@pytest.fixture
def recorder(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[QuotaRecorder]:
    """moto (reset) for everything, but the recorder for EC2 and Service Quotas; fake credentials only."""
    moto_server.reset()
    with QuotaRecorder(moto_server.url, quotas={INF: 192.0, TRN: 256.0, INF_SPOT: 192.0, TRN_SPOT: 256.0},
                       defaults={INF: 0.0, TRN: 0.0, INF_SPOT: 0.0, TRN_SPOT: 0.0}) as rec:
        for name in [n for n in os.environ if n.startswith("AWS_")]:
            monkeypatch.delenv(name)
        for name, value in {
            "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
            "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": REGION,
            "NO_PROXY": LOOPBACK, "no_proxy": LOOPBACK,
            "AWS_ENDPOINT_URL": moto_server.url, "AWS_ENDPOINT_URL_EC2": rec.url,
            "AWS_ENDPOINT_URL_SERVICE_QUOTAS": rec.url, "AWS_ENDPOINT_URL_RESOURCE_GROUPS": rec.url,
        }.items():
            monkeypatch.setenv(name, value)
        yield rec


def moto(moto_server: MotoServer, service: str) -> Any:
    return boto3.client(service, endpoint_url=moto_server.url, region_name=REGION,
                        aws_access_key_id=FAKE_ACCESS_KEY, aws_secret_access_key=FAKE_SECRET_KEY)


@pytest.fixture
def account(moto_server: MotoServer, recorder: QuotaRecorder) -> MotoServer:
    """An account ready to deploy: the DLAMI parameter, a bootstrap stack of version 30."""
    moto(moto_server, "ssm").put_parameter(Name=DLAMI, Value="ami-0123456789abcdef0", Type="String")
    bootstrap(moto_server, "30")
    return moto_server


def bootstrap(moto_server: MotoServer, version: str | None, name: str = "CDKToolkit") -> None:
    template: dict[str, Any] = {"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}}
    if version is not None:
        template["Outputs"] = {"BootstrapVersion": {"Value": version}}
    moto(moto_server, "cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An app directory whose cdk.json names the test DLAMI parameter; the working directory."""
    (tmp_path / "cdk.json").write_text(json.dumps({"app": "python3 app.py", "context": {
        "@aws-cdk/core:checkSecretUsage": True, "dlami_parameter": DLAMI}}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def preflight(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    """Run the command with ``--output json``: (exit status, the document or {}, stderr)."""
    status = main(["preflight", "--output", "json", *args])
    out, err = capsys.readouterr()
    return status, (json.loads(out) if out.strip() else {}), err


def row(document: dict[str, Any], check: str) -> dict[str, str]:
    (found,) = [r for r in document["checks"] if r["check"] == check]
    return found


# --- everything passes ------------------------------------------------------------------------------------------

def test_a_ready_account_passes_every_check_and_exits_0(account, app, capsys):
    status, document, err = preflight(capsys)
    assert status == 0, (document, err)
    assert document["ok"] is True
    assert document["region"] == REGION and document["instance_type"] == "inf2.24xlarge"
    results = {r["check"]: r["result"] for r in document["checks"]}
    assert results == {"availability zones": "pass", "vCPU quota": "pass", "machine image": "pass",
                       "secret hf_token_secret": "skip", "CDK bootstrap": "pass", "capacity reservations": "pass"}
    assert "us-east-1a, us-east-1b" in row(document, "availability zones")["detail"]
    assert "resolves to ami-0123456789abcdef0" in row(document, "machine image")["detail"]
    assert set(document["checks"][0]) == {"check", "result", "detail", "fix"}


def test_the_text_output_is_a_table_with_every_check(account, app, capsys):
    assert main(["preflight"]) == 0
    out = capsys.readouterr().out
    for word in ("check", "result", "availability zones", "vCPU quota", "CDK bootstrap", "No check failed"):
        assert word in out


# --- availability zones -----------------------------------------------------------------------------------------

def test_an_instance_type_missing_from_the_first_az_fails(account, app, capsys):
    status, document, _ = preflight(capsys, "-c", "instance_type=trn1.32xlarge")
    assert status == 1 and document["ok"] is False
    zones = row(document, "availability zones")
    assert zones["result"] == "fail"
    assert "not offered in us-east-1a" in zones["detail"] and zones["fix"]


def test_a_fleet_needs_the_type_in_both_azs(account, app, capsys):
    _, document, _ = preflight(capsys, "-c", "instance_type=trn1.32xlarge", "-c", "fleet=asg")
    zones = row(document, "availability zones")
    assert zones["result"] == "fail" and "us-east-1a, us-east-1b" in zones["detail"]
    assert "not offered in us-east-1a" in zones["detail"]


def test_a_new_vpc_in_the_zones_given_is_judged_by_them(account, app, capsys):
    _, document, _ = preflight(capsys, "-c", "instance_type=trn1.32xlarge", "-c", "fleet=asg",
                               "-c", "availability_zones=us-east-1b,us-east-1c")
    zones = row(document, "availability zones")
    assert "availability_zones" in zones["detail"] and "us-east-1b, us-east-1c" in zones["detail"]
    assert "us-east-1a" not in zones["detail"].split("offered in")[0]


def private_vpc(moto_server: MotoServer, zones: list[str]) -> str:
    """A VPC with a public subnet (route to an internet gateway) in us-east-1a and private subnets (a NAT
    route) in ``zones``; one more subnet with no route out (isolated) in us-east-1d."""
    ec2 = moto(moto_server, "ec2")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    public = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.0.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    public_table = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=public_table, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
    ec2.associate_route_table(RouteTableId=public_table, SubnetId=public)
    nat = ec2.create_nat_gateway(SubnetId=public, AllocationId=ec2.allocate_address(Domain="vpc")["AllocationId"])
    private_table = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=private_table, DestinationCidrBlock="0.0.0.0/0",
                     NatGatewayId=nat["NatGateway"]["NatGatewayId"])
    for index, zone in enumerate(zones, 1):
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{index}.0/24", AvailabilityZone=zone)["Subnet"]
        ec2.associate_route_table(RouteTableId=private_table, SubnetId=subnet["SubnetId"])
    ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.99.0/24", AvailabilityZone="us-east-1d")
    return str(vpc)


def test_an_existing_vpc_is_judged_by_its_private_subnets_only(account, app, capsys):
    vpc = private_vpc(account, ["us-east-1b", "us-east-1c"])
    status, document, _ = preflight(capsys, "-c", "instance_type=trn1.32xlarge", "-c", "fleet=asg",
                                    "--vpc-id", vpc)
    zones = row(document, "availability zones")
    assert zones["result"] == "pass", zones
    assert "us-east-1b, us-east-1c" in zones["detail"] and f"private subnets of {vpc}" in zones["detail"]
    assert status == 0


def test_an_existing_vpc_with_a_private_subnet_where_the_type_is_missing_fails(account, app, capsys):
    vpc = private_vpc(account, ["us-east-1a", "us-east-1b"])
    _, document, _ = preflight(capsys, "-c", "instance_type=trn1.32xlarge", "-c", "fleet=asg", "--vpc-id", vpc)
    assert row(document, "availability zones")["result"] == "fail"


def test_a_vpc_without_private_subnets_fails(account, app, capsys):
    vpc = moto(account, "ec2").create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
    _, document, _ = preflight(capsys, "--vpc-id", vpc)
    zones = row(document, "availability zones")
    assert zones["result"] == "fail" and "no private subnet" in zones["detail"]


def test_an_unknown_vpc_fails_its_row_and_the_other_checks_still_run(account, app, capsys):
    _, document, _ = preflight(capsys, "--vpc-id", "vpc-0000000000000000f")
    assert "not found" in row(document, "availability zones")["detail"]
    assert row(document, "vCPU quota")["result"] == "pass"


def test_several_types_show_each_types_zones_and_pass_when_each_is_offered(account, app, capsys):
    status, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", "instance_types=inf2.24xlarge,inf2.48xlarge")
    zones = row(document, "availability zones")
    assert zones["result"] == "pass", zones
    assert "the hosts launch in us-east-1a, us-east-1b" in zones["detail"]
    assert "inf2.24xlarge is offered in us-east-1a, us-east-1b (in the region: us-east-1a, us-east-1b, us-east-1c, " \
        "us-east-1f)" in zones["detail"]
    assert "inf2.48xlarge is offered in us-east-1a, us-east-1b" in zones["detail"]
    assert status == 0


def test_a_type_no_zone_of_the_hosts_offers_fails_naming_it(account, app, capsys):
    vpc = private_vpc(account, ["us-east-1b"])
    status, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", "instance_types=trn1.32xlarge,trn1n.32xlarge",
                                    "--vpc-id", vpc)
    zones = row(document, "availability zones")
    assert status == 1 and zones["result"] == "fail", zones
    assert "trn1.32xlarge is offered in us-east-1b" in zones["detail"]
    assert "trn1n.32xlarge is offered in none of them (in the region: us-east-1c)" in zones["detail"]
    assert zones["detail"].endswith("the group can never launch trn1n.32xlarge")
    assert "drop trn1n.32xlarge from instance_types" in zones["fix"]


def test_a_zone_offering_none_of_the_types_warns(account, app, capsys):
    vpc = private_vpc(account, ["us-east-1a", "us-east-1c"])
    status, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", "instance_types=trn1.32xlarge,trn1n.32xlarge",
                                    "--vpc-id", vpc)
    zones = row(document, "availability zones")
    assert zones["result"] == "warn", zones
    assert "us-east-1a offers none of the fleet's types" in zones["detail"]
    assert "trn1.32xlarge is offered in us-east-1c" in zones["detail"] and zones["fix"]
    assert status == 0


# --- vCPU quota -------------------------------------------------------------------------------------------------

def test_a_zero_quota_fails_and_names_the_quota_code_and_the_increase(account, app, recorder, capsys):
    recorder.quotas[INF] = 0.0
    status, document, _ = preflight(capsys)
    quota = row(document, "vCPU quota")
    assert status == 1 and quota["result"] == "fail"
    assert "is 0 vCPUs" in quota["detail"] and "need 96" in quota["detail"]
    assert f"--quota-code {INF} --desired-value 96" in quota["fix"]


def test_a_quota_below_the_fleets_maximum_fails(account, app, recorder, capsys):
    recorder.quotas[INF] = 192.0
    _, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", "max_capacity=3")
    quota = row(document, "vCPU quota")
    assert quota["result"] == "fail" and "3 x inf2.24xlarge" in quota["detail"] and "need 288" in quota["detail"]


def test_an_export_builder_counts_in_the_quota_and_its_zones_are_checked(account, app, recorder, capsys):
    recorder.quotas[INF] = 32.0
    _, document, _ = preflight(capsys, "-c", "instance_type=inf2.xlarge")
    quota = row(document, "vCPU quota")
    assert ("1 x inf2.xlarge (4 vCPUs each) and the export builder, 1 x inf2.8xlarge (32 vCPUs) need 36"
            in quota["detail"])
    assert quota["result"] == "fail" and "--desired-value 36" in quota["fix"]
    assert "the export builder, inf2.8xlarge, in us-east-1" in row(document, "availability zones")["detail"]


def test_without_an_applied_value_the_aws_default_is_used(account, app, recorder, capsys):
    del recorder.quotas[TRN]
    recorder.defaults[TRN] = 128.0
    _, document, _ = preflight(capsys, "-c", "instance_type=trn1.32xlarge", "--vpc-id",
                               private_vpc(account, ["us-east-1b"]))
    assert row(document, "vCPU quota")["result"] == "pass"
    assert recorder.operations()[-3:-1] == ["GetServiceQuota", "GetAWSDefaultServiceQuota"] or \
        {"GetServiceQuota", "GetAWSDefaultServiceQuota"} <= set(recorder.operations())
    assert all(not c.errors for c in recorder.calls)


def test_running_instances_of_the_family_that_leave_too_little_warn(account, app, recorder, capsys):
    recorder.quotas[INF] = 100.0
    ec2 = moto(account, "ec2")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.run_instances(ImageId=image, InstanceType="inf2.8xlarge", MinCount=1, MaxCount=1)
    ec2.run_instances(ImageId=image, InstanceType="m5.24xlarge", MinCount=1, MaxCount=1)  # another quota
    status, document, _ = preflight(capsys)
    quota = row(document, "vCPU quota")
    assert quota["result"] == "warn" and "already use 32 vCPUs" in quota["detail"], quota
    assert status == 0


def test_several_types_take_the_worst_case_over_the_types(account, app, recorder, capsys):
    # 2 hosts of inf2.24xlarge are 12 replicas; inf2.8xlarge holds 1, so the group could run 12 of them.
    recorder.quotas[INF] = 383.0
    _, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", "max_capacity=2",
                               "-c", "instance_types=inf2.24xlarge,inf2.48xlarge,inf2.8xlarge")
    quota = row(document, "vCPU quota")
    assert quota["result"] == "fail", quota
    assert ("12 x inf2.8xlarge (32 vCPUs each), the most vCPUs of the fleet's types for 12 replicas need 384"
            in quota["detail"])
    assert f"--quota-code {INF} --desired-value 384" in quota["fix"]
    recorder.quotas[INF] = 384.0
    _, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", "max_capacity=2",
                               "-c", "instance_types=inf2.24xlarge,inf2.48xlarge,inf2.8xlarge")
    assert row(document, "vCPU quota")["result"] == "pass"


def test_spot_splits_the_fleet_between_the_on_demand_and_the_spot_quota(account, app, recorder, capsys):
    # 4 hosts of inf2.24xlarge are 24 replicas; the base (min_capacity 1) is 6, half the other 18 on Spot.
    recorder.quotas[INF] = 288.0
    recorder.quotas[INF_SPOT] = 191.0
    args = ("-c", "fleet=asg", "-c", "max_capacity=4", "-c", "spot_percent=50")
    status, document, _ = preflight(capsys, *args)
    on_demand, spot = row(document, "vCPU quota"), row(document, "Spot vCPU quota")
    assert on_demand["result"] == "pass", on_demand
    assert ("the On-Demand base and 50% of the replicas above it (15 of 24 replicas): 3 x inf2.24xlarge "
            "(96 vCPUs each) need 288") in on_demand["detail"]
    assert status == 1 and spot["result"] == "fail", spot
    assert ("All Inf Spot Instance Requests (L-B5D1601B) is 191 vCPUs; 50% of the replicas above the On-Demand "
            "base (9 of 24 replicas): 2 x inf2.24xlarge (96 vCPUs each) need 192") in spot["detail"]
    assert f"--quota-code {INF_SPOT} --desired-value 192" in spot["fix"]
    recorder.quotas[INF] = 287.0
    recorder.quotas[INF_SPOT] = 192.0
    _, document, _ = preflight(capsys, *args)
    assert row(document, "vCPU quota")["result"] == "fail"
    assert row(document, "Spot vCPU quota")["result"] == "pass"


def test_an_on_demand_base_of_zero_puts_the_share_above_it_on_spot(account, app, recorder, capsys):
    del recorder.quotas[TRN_SPOT]
    recorder.defaults[TRN_SPOT] = 256.0
    _, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", "instance_type=trn1.32xlarge", "-c", "max_capacity=2",
                               "-c", "spot_percent=100", "-c", "on_demand_base_capacity=0",
                               "--vpc-id", private_vpc(account, ["us-east-1b"]))
    assert "(0 of 32 replicas): 0 x trn1.32xlarge" in row(document, "vCPU quota")["detail"]
    spot = row(document, "Spot vCPU quota")
    assert spot["result"] == "pass" and "All Trn Spot Instance Requests (L-6B0D517C) is 256 vCPUs" in spot["detail"]
    assert "(32 of 32 replicas): 2 x trn1.32xlarge (128 vCPUs each) need 256" in spot["detail"]


def test_running_spot_instances_count_against_the_spot_quota_only(account, app, recorder, capsys):
    recorder.quotas[INF_SPOT] = 200.0
    ec2 = moto(account, "ec2")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.run_instances(ImageId=image, InstanceType="inf2.8xlarge", MinCount=1, MaxCount=1,
                      InstanceMarketOptions={"MarketType": "spot"})
    status, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", "max_capacity=4", "-c", "spot_percent=50")
    spot = row(document, "Spot vCPU quota")
    assert spot["result"] == "warn" and "running Spot instances of the quota already use 32 vCPUs" in spot["detail"]
    on_demand = row(document, "vCPU quota")
    assert on_demand["result"] == "fail" and "running" not in on_demand["detail"]  # 288 needed, 192 applied
    assert status == 1


# --- machine image ----------------------------------------------------------------------------------------------

def test_an_unknown_dlami_parameter_fails(account, app, capsys):
    _, document, _ = preflight(capsys, "-c", "dlami_parameter=")
    image = row(document, "machine image")
    assert image["result"] == "fail"
    assert "/aws/service/neuron/dlami/" in image["detail"] and "does not exist in us-east-1" in image["detail"]


def test_a_pinned_ami_is_looked_up(account, app, capsys):
    ami = moto(account, "ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    _, document, _ = preflight(capsys, "-c", f"ami_id={ami}")
    assert row(document, "machine image")["result"] == "pass"
    _, document, _ = preflight(capsys, "-c", "ami_id=ami-0000000000000dead")
    image = row(document, "machine image")
    assert image["result"] == "fail" and "ami-0000000000000dead" in image["detail"]


# --- secrets ----------------------------------------------------------------------------------------------------

def test_an_existing_token_secret_passes_and_a_missing_one_fails(account, app, capsys):
    moto(account, "secretsmanager").create_secret(Name="hf-token", SecretString="hf_x")
    _, document, _ = preflight(capsys, "-c", "hf_token_secret=hf-token")
    assert row(document, "secret hf_token_secret")["result"] == "pass"
    status, document, _ = preflight(capsys, "-c", "hf_token_secret=no-such-token")
    secret = row(document, "secret hf_token_secret")
    assert status == 1 and secret["result"] == "fail" and "no-such-token not found" in secret["detail"]


def test_a_secret_the_caller_may_not_describe_fails_naming_the_action(account, app, capsys, monkeypatch):
    iam = moto(account, "iam")
    iam.create_user(UserName="deployer")
    iam.put_user_policy(UserName="deployer", PolicyName="all-but-secrets", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": ["ec2:*", "ssm:*", "cloudformation:*", "sts:*"], "Resource": "*"}]}))
    key = iam.create_access_key(UserName="deployer")["AccessKey"]
    moto(account, "secretsmanager").create_secret(Name="hf-token", SecretString="hf_x")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    with account.iam_enforced():
        status, document, _ = preflight(capsys, "-c", "hf_token_secret=hf-token")
    secret = row(document, "secret hf_token_secret")
    assert status == 1 and secret["result"] == "fail", document
    assert "secretsmanager:DescribeSecret" in secret["detail"]
    assert row(document, "CDK bootstrap")["result"] == "pass"


# --- CDK bootstrap ----------------------------------------------------------------------------------------------

def test_no_bootstrap_stack_fails_with_the_bootstrap_command(recorder, moto_server, app, capsys):
    moto(moto_server, "ssm").put_parameter(Name=DLAMI, Value="ami-0123456789abcdef0", Type="String")
    status, document, _ = preflight(capsys)
    boot = row(document, "CDK bootstrap")
    assert status == 1 and boot["result"] == "fail"
    assert "no bootstrap stack CDKToolkit" in boot["detail"]
    assert "cdk bootstrap aws://123456789012/us-east-1" in boot["fix"]


def test_an_old_bootstrap_version_fails_and_another_toolkit_name_is_used(recorder, moto_server, app, capsys):
    moto(moto_server, "ssm").put_parameter(Name=DLAMI, Value="ami-0123456789abcdef0", Type="String")
    bootstrap(moto_server, "5", name="MyToolkit")
    _, document, _ = preflight(capsys, "--toolkit-stack-name", "MyToolkit")
    boot = row(document, "CDK bootstrap")
    assert boot["result"] == "fail" and "version 5" in boot["detail"] and "needs 6" in boot["detail"]


# --- capacity reservations --------------------------------------------------------------------------------------

def reservation(zone: str, criteria: str = "open", kind: str = "inf2.24xlarge") -> dict[str, Any]:
    return {"CapacityReservationId": f"cr-{zone[-1]}{criteria[0]}00000000000000", "InstanceType": kind,
            "AvailabilityZone": zone, "AvailableInstanceCount": 2, "TotalInstanceCount": 2, "State": "active",
            "InstanceMatchCriteria": criteria, "InstancePlatform": "Linux/UNIX", "Tenancy": "default"}


def test_open_reservations_in_the_hosts_az_pass_and_name_the_free_instances(account, app, recorder, capsys):
    recorder.reservations.append(reservation("us-east-1a"))
    _, document, _ = preflight(capsys)
    found = row(document, "capacity reservations")
    assert found["result"] == "pass" and "2 inf2.24xlarge free" in found["detail"]
    (call,) = [c for c in recorder.calls if c.operation == "DescribeCapacityReservations"]
    assert call.errors == [] and {f["Name"] for f in call.params["Filters"]} == {"instance-type", "state"}


def test_reservations_the_hosts_cannot_use_warn(account, app, recorder, capsys):
    recorder.reservations += [reservation("us-east-1c"), reservation("us-east-1a", "targeted"),
                              reservation("us-east-1a", kind="inf2.xlarge")]
    status, document, _ = preflight(capsys)
    found = row(document, "capacity reservations")
    assert found["result"] == "warn" and "us-east-1c" in found["detail"] and "targeted" in found["detail"]
    assert "inf2.xlarge" not in found["detail"]
    assert status == 0


def test_a_denied_reservation_lookup_is_one_fail_row(account, app, recorder, capsys):
    recorder.deny.add("DescribeCapacityReservations")
    status, document, _ = preflight(capsys)
    found = row(document, "capacity reservations")
    assert status == 1 and found["result"] == "fail" and "ec2:DescribeCapacityReservations" in found["detail"]
    assert row(document, "vCPU quota")["result"] == "pass"


# --- capacity_reservations -------------------------------------------------------------------------------------

ACCOUNT = "123456789012"
GROUP = f"arn:aws:resource-groups:{REGION}:{ACCOUNT}:group/serving-reservations"


def named(rid: str, zone: str = "us-east-1a", kind: str = "inf2.24xlarge", state: str = "active",
          free: int = 2, **extra: Any) -> dict[str, Any]:
    """A targeted reservation, as DescribeCapacityReservations items hold it."""
    return {"CapacityReservationId": rid, "InstanceType": kind, "AvailabilityZone": zone, "State": state,
            "AvailableInstanceCount": free, "TotalInstanceCount": 2, "InstanceMatchCriteria": "targeted",
            "InstancePlatform": "Linux/UNIX", "Tenancy": "default", **extra}


def cr_arn(rid: str) -> str:
    return f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/{rid}"


CR1, CR2, CR3 = "cr-0aaaaaaaaaaaaaaa1", "cr-0aaaaaaaaaaaaaaa2", "cr-0aaaaaaaaaaaaaaa3"


def test_a_named_reservation_of_the_fleet_in_the_hosts_az_passes(account, app, recorder, capsys):
    recorder.reservations.append(named(CR1))
    status, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", f"capacity_reservations={CR1}")
    found = row(document, f"reservation {CR1}")
    assert found["result"] == "pass" and found["detail"] == f"{CR1}: active, inf2.24xlarge in us-east-1a, 2 of 2 free"
    # Targeted, but named: the hosts use it.
    assert row(document, "capacity reservations")["result"] == "pass"
    described = [c for c in recorder.calls if c.operation == "DescribeCapacityReservations"]
    assert any(c.params.get("CapacityReservationIds") == [CR1] for c in described)
    assert all(not c.errors for c in recorder.calls) and status == 0


@pytest.mark.parametrize(("reservation", "wrong"), [
    (named(CR1, kind="inf2.xlarge"), f"{CR1} is of inf2.xlarge, not of the fleet's types (inf2.24xlarge)"),
    (named(CR1, zone="us-east-1c"), f"{CR1} is in us-east-1c, not in the hosts' AZs (us-east-1a, us-east-1b)"),
    (named(CR1, state="expired"), f"{CR1} is expired, not active"),
])
def test_a_named_reservation_of_another_type_zone_or_state_fails(account, app, recorder, capsys, reservation, wrong):
    recorder.reservations.append(reservation)
    status, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", f"capacity_reservations={CR1}")
    found = row(document, f"reservation {CR1}")
    assert status == 1 and found["result"] == "fail", found
    assert found["detail"].endswith(wrong) and found["fix"]


def test_a_named_reservation_that_does_not_exist_fails_and_one_full_warns(account, app, recorder, capsys):
    recorder.reservations.append(named(CR2, free=0))
    status, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", f"capacity_reservations={CR1},{CR2}")
    missing, full = row(document, f"reservation {CR1}"), row(document, f"reservation {CR2}")
    assert status == 1 and missing["result"] == "fail", missing
    assert "not found in us-east-1 (InvalidCapacityReservationId.NotFound)" in missing["detail"]
    assert full["result"] == "warn" and "0 of 2 free: no instance free" in full["detail"]


def test_a_resource_group_is_listed_then_each_reservation_described(account, app, recorder, capsys):
    recorder.reservations += [named(CR1), named(CR2, zone="us-east-1b", kind="inf2.48xlarge")]
    recorder.groups[GROUP] = [cr_arn(CR1), cr_arn(CR2)]
    args = ("-c", "fleet=asg", "-c", "instance_types=inf2.24xlarge,inf2.48xlarge",
            "-c", f"capacity_reservations={GROUP}")
    status, document, _ = preflight(capsys, *args)
    found = row(document, "reservation group serving-reservations")
    assert found["result"] == "pass", found
    assert f"{CR1}: active, inf2.24xlarge in us-east-1a" in found["detail"]
    assert f"{CR2}: active, inf2.48xlarge in us-east-1b" in found["detail"]
    (listed,) = [c for c in recorder.calls if c.operation == "ListGroupResources"]
    assert listed.params["Group"] == GROUP and listed.errors == [] and status == 0
    recorder.reservations.append(named(CR3, state="cancelled"))
    recorder.groups[GROUP].append(cr_arn(CR3))
    _, document, _ = preflight(capsys, *args)
    found = row(document, "reservation group serving-reservations")
    assert found["result"] == "fail" and found["detail"].endswith(f"{CR3} is cancelled, not active")


def test_an_unknown_or_denied_resource_group_fails(account, app, recorder, capsys):
    status, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", f"capacity_reservations={GROUP}")
    found = row(document, "reservation group serving-reservations")
    assert status == 1 and found["result"] == "fail" and f"resource group {GROUP} not found" in found["detail"]
    recorder.groups[GROUP] = []
    recorder.deny.add("ListGroupResources")
    _, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", f"capacity_reservations={GROUP}")
    found = row(document, "reservation group serving-reservations")
    assert found["result"] == "fail" and "resource-groups:ListGroupResources" in found["detail"]
    recorder.deny.clear()
    _, document, _ = preflight(capsys, "-c", "fleet=asg", "-c", f"capacity_reservations={GROUP}")
    assert "holds no capacity reservation" in row(document, "reservation group serving-reservations")["detail"]


# --- capacity_block -----------------------------------------------------------------------------------------------

BLOCK = "cr-0b10c000000000001"


def block_settings() -> tuple[dt.datetime, tuple[str, ...]]:
    end = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(second=0, microsecond=0)
    return end, ("-c", "fleet=asg", "-c", "availability_zones=us-east-1a,us-east-1b", "-c",
                 "instance_type=trn1.32xlarge", "-c", f"capacity_block={BLOCK}",
                 "-c", "capacity_block_zone=us-east-1b", "-c", f"capacity_block_end={end:%Y-%m-%dT%H:%MZ}")


def block(end: dt.datetime, **changes: Any) -> dict[str, Any]:
    start = end - dt.timedelta(days=1)
    return {**named(BLOCK, zone="us-east-1b", kind="trn1.32xlarge", state="scheduled", ReservationType="capacity-block",
                    StartDate=f"{start:%Y-%m-%dT%H:%M:%S.000Z}", EndDate=f"{end:%Y-%m-%dT%H:%M:%S.000Z}"), **changes}


def test_a_scheduled_capacity_block_of_the_type_zone_and_end_passes(account, app, recorder, capsys):
    end, args = block_settings()
    recorder.reservations.append(block(end + dt.timedelta(seconds=30)))
    _, document, _ = preflight(capsys, *args, "--vpc-id", private_vpc(account, ["us-east-1b"]))
    found = row(document, "capacity block")
    assert found["result"] == "pass", found
    start = end - dt.timedelta(days=1)
    assert found["detail"] == (f"{BLOCK}: capacity-block, scheduled, 2 x trn1.32xlarge in us-east-1b, from "
                               f"{start:%Y-%m-%dT%H:%MZ} to {end:%Y-%m-%dT%H:%MZ}")


@pytest.mark.parametrize(("changes", "wrong"), [
    ({"EndDate": "2099-01-01T00:00:00.000Z"}, "it ends at 2099-01-01T00:00Z, not capacity_block_end"),
    ({"State": "payment-pending"}, "its state is payment-pending, not scheduled or active"),
    ({"ReservationType": "default"}, "it is a default reservation, not a Capacity Block"),
    ({"AvailabilityZone": "us-east-1c"}, "its zone is us-east-1c, not capacity_block_zone us-east-1b"),
    ({"InstanceType": "trn1n.32xlarge"}, "its type is trn1n.32xlarge, not instance_type trn1.32xlarge"),
])
def test_a_capacity_block_not_as_the_settings_say_fails(account, app, recorder, capsys, changes, wrong):
    end, args = block_settings()
    recorder.reservations.append(block(end, **changes))
    status, document, _ = preflight(capsys, *args)
    found = row(document, "capacity block")
    assert status == 1 and found["result"] == "fail", found
    assert wrong in found["detail"] and found["fix"]


def test_a_missing_capacity_block_fails(account, app, recorder, capsys):
    _, args = block_settings()
    _, document, _ = preflight(capsys, *args)
    found = row(document, "capacity block")
    assert found["result"] == "fail" and f"{BLOCK}: not found in us-east-1" in found["detail"]


# --- settings and the session -----------------------------------------------------------------------------------

def test_a_bad_context_value_gives_the_settings_error_and_exit_2_before_any_call(recorder, app, capsys):
    status, document, err = preflight(capsys, "-c", "max_capacity=lots")
    assert status == 2 and document == {}
    assert "max_capacity ('lots') must be a whole number" in err
    assert recorder.calls == []


def test_cdk_json_context_is_read_and_overridden_by_c(recorder, app, capsys):
    (app / "cdk.context.json").write_text(json.dumps({"instance_type": "inf2.nope"}))
    status, _, err = preflight(capsys)
    assert status == 2 and "inf2.nope" in err
    status, _, err = preflight(capsys, "-c", "instance_type=inf2.xlarge", "-c", "min_capacity=3")
    assert status == 2 and "min_capacity" in err and "fleet=asg" in err


def test_cdk_json_wins_over_cdk_context_json_as_in_the_cdk_cli(recorder, app, capsys):
    cdk_json = json.loads((app / "cdk.json").read_text())
    cdk_json["context"]["instance_type"] = "inf2.48xlarge"
    (app / "cdk.json").write_text(json.dumps(cdk_json))
    (app / "cdk.context.json").write_text(json.dumps({"instance_type": "inf2.nope"}))
    status, document, err = preflight(capsys)
    # The settings pass (cdk.json's instance type), so the checks run: refused by synth, it would exit 2.
    assert status != 2 and "inf2.nope" not in err
    assert "inf2.48xlarge" in json.dumps(document)


def test_a_missing_cdk_json_says_where_to_run(recorder, tmp_path, capsys):
    status, _, err = preflight(capsys, "--app-dir", str(tmp_path))
    assert status == 2 and "holds no cdk.json" in err


def test_missing_credentials_are_one_sentence(app, monkeypatch, capsys):
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in {"AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(name, value)
    status, document, err = preflight(capsys)
    assert status == 1 and document == {}
    assert err.startswith("neuron-serving: no AWS credentials found") and "Traceback" not in err


def test_a_missing_region_and_a_misspelt_one_are_one_sentence(recorder, app, monkeypatch, capsys):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    status, _, err = preflight(capsys)
    assert status == 1 and "no AWS region: pass --region" in err
    status, _, err = preflight(capsys, "--region", "us-east-9")
    assert status == 1 and "region 'us-east-9' is not one boto3 knows" in err
