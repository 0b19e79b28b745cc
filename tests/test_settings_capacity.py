"""Where a fleet's hosts come from: several instance types, Spot, Capacity Reservations and Capacity
Blocks, as settings. Each bad combination stops synthesis naming the setting, its value and why."""

import datetime

import pytest

from neuron_serving import ServingConfigError, StackSettings

BLOCK = "cr-0123456789abcdef0"
FUTURE = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3)).strftime("%Y-%m-%dT%H:%MZ")


def _settings(**context):
    return StackSettings.from_context(context.get)


def _problems(**context) -> str:
    with pytest.raises(ServingConfigError) as caught:
        _settings(**context)
    return str(caught.value)


def test_instance_types_lay_out_one_export_on_each_type_and_name_the_first_the_instance_type():
    settings = _settings(fleet="asg", instance_types="inf2.48xlarge,inf2.24xlarge,inf2.8xlarge")
    assert settings.instance_type == "inf2.48xlarge"
    layouts = settings.layouts()
    assert [(p.instance.name, len(p.replicas), p.degree) for p in layouts] == [
        ("inf2.48xlarge", 12, 2), ("inf2.24xlarge", 6, 2), ("inf2.8xlarge", 1, 2)]
    assert {p.batch_size for p in layouts} == {settings.plan().batch_size}
    assert settings.fleet_types == ("inf2.48xlarge", "inf2.24xlarge", "inf2.8xlarge")


def test_without_instance_types_the_fleet_is_the_instance_type_alone():
    settings = _settings(fleet="asg", instance_type="inf2.8xlarge")
    assert settings.fleet_types == ("inf2.8xlarge",)
    assert [p.instance.name for p in settings.layouts()] == ["inf2.8xlarge"]


def test_an_instance_type_that_is_not_the_first_of_instance_types_is_refused():
    text = _problems(fleet="asg", instance_type="inf2.24xlarge", instance_types="inf2.48xlarge,inf2.24xlarge")
    assert "instance_types (['inf2.48xlarge', 'inf2.24xlarge']) must start with instance_type (inf2.24xlarge)" in text


def test_types_that_cannot_serve_the_layout_are_each_named_with_why():
    text = _problems(fleet="asg", tensor_parallel="4",
                     instance_types="inf2.48xlarge,inf2.8xlarge,trn1.32xlarge,inf2.9xlarge,inf2.48xlarge")
    assert "instance_types ('inf2.8xlarge') cannot hold a replica of tensor_parallel 4" in text
    assert "instance_types ('trn1.32xlarge') is a trn1 type, but the fleet's export is compiled for inf2" in text
    assert "instance_types ('inf2.9xlarge') must be one of inf2.xlarge" in text
    assert "instance_types ('inf2.48xlarge') is listed twice" in text


def test_instance_types_belong_to_a_fleet():
    assert "instance_types (('inf2.48xlarge', 'inf2.24xlarge')) applies to fleet=asg only" in _problems(
        instance_types="inf2.48xlarge,inf2.24xlarge")


def test_a_type_too_small_to_compile_gives_the_fleet_a_builder():
    settings = _settings(fleet="asg", instance_types="inf2.24xlarge,inf2.xlarge")
    assert settings.builder is not None and settings.builder.instance.name == "inf2.8xlarge"
    assert settings.host().export_role == "wait"
    assert _settings(fleet="asg", instance_types="inf2.24xlarge,inf2.8xlarge").builder is None


def test_several_types_refuse_a_warm_pool_and_a_per_host_request_target():
    text = _problems(fleet="asg", max_capacity="3", warm_pool="true", target_requests_per_minute="100",
                     instance_types="inf2.48xlarge,inf2.24xlarge")
    assert "warm_pool (True) cannot be combined with several instance_types: Auto Scaling keeps no warm pool" in text
    assert "target_requests_per_minute (100) counts requests per host" in text


def test_spot_is_a_percentage_with_an_on_demand_base_and_no_warm_pool():
    settings = _settings(fleet="asg", max_capacity="4", spot_percent="50", on_demand_base_capacity="1")
    assert (settings.spot_percent, settings.on_demand_base_capacity) == (50, 1)
    text = _problems(fleet="asg", max_capacity="4", spot_percent="101")
    assert "spot_percent (101) must be 0 to 100 percent" in text
    text = _problems(fleet="asg", max_capacity="4", spot_percent="50", on_demand_base_capacity="5", warm_pool="true")
    assert "on_demand_base_capacity (5) must be 0 to max_capacity (4)" in text
    assert "warm_pool (True) cannot be combined with spot_percent 50" in text
    assert "on_demand_base_capacity (1) applies only with spot_percent above 0" in _problems(
        fleet="asg", on_demand_base_capacity="1")
    assert "spot_percent (50) applies to fleet=asg only" in _problems(spot_percent="50")


def test_capacity_reservations_by_id_or_resource_group_with_a_preference():
    group = "arn:aws:resource-groups:us-east-1:111122223333:group/neuron-reservations"
    settings = _settings(fleet="asg", capacity_reservations=f"cr-0123456789abcdef0,{group}",
                         capacity_reservation_preference="capacity-reservations-only")
    assert settings.capacity_reservations == ("cr-0123456789abcdef0", group)
    text = _problems(fleet="asg", capacity_reservations="cr-1,arn:aws:ec2:us-east-1:111122223333:group/x")
    assert "capacity_reservations ('cr-1') must be a Capacity Reservation id (cr- and 17 hex digits)" in text
    assert "capacity_reservations ('arn:aws:ec2:us-east-1:111122223333:group/x') must be" in text
    assert "capacity_reservation_preference ('first') must be one of capacity-reservations-first" in _problems(
        fleet="asg", capacity_reservation_preference="first")
    text = _problems(fleet="asg", capacity_reservations="cr-0123456789abcdef0", capacity_reservation_preference="none")
    assert "capacity_reservation_preference ('none') contradicts capacity_reservations" in text
    text = _problems(fleet="asg", spot_percent="20", capacity_reservation_preference="capacity-reservations-only")
    assert "which a Spot host never is: set spot_percent 0 (it is 20)" in text


def test_a_capacity_block_is_one_trn1_type_in_one_zone_until_its_end():
    settings = _settings(fleet="asg", instance_type="trn1.32xlarge", model_id="llama-3.1-8b", capacity_block=BLOCK,
                         capacity_block_zone="us-east-1a", capacity_block_end=FUTURE,
                         availability_zones="us-east-1a,us-east-1b")
    assert (settings.capacity_block, settings.capacity_block_zone) == (BLOCK, "us-east-1a")
    assert "capacity_block_zone ('us-east-1a') needs availability_zones that include it" in _problems(
        fleet="asg", instance_type="trn1.32xlarge", model_id="llama-3.1-8b", capacity_block=BLOCK,
        capacity_block_zone="us-east-1a", capacity_block_end=FUTURE)
    text = _problems(fleet="asg", capacity_block=BLOCK, spot_percent="10")
    assert "capacity_block_zone (None) is required with capacity_block" in text
    assert "capacity_block_end (None) is required with capacity_block" in text
    assert "instance_type ('inf2.24xlarge') is not offered as a Capacity Block for ML" in text
    assert "spot_percent (10) does not apply with capacity_block" in text
    assert "capacity_block (None) is required with capacity_block_zone" in _problems(
        fleet="asg", capacity_block_zone="us-east-1a")


def test_a_capacity_block_that_ends_within_the_hour_or_outside_the_vpcs_zones_is_refused():
    soon = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%MZ")
    common = dict(fleet="asg", instance_type="trn1.32xlarge", model_id="llama-3.1-8b", capacity_block=BLOCK)
    assert f"capacity_block_end ('{soon}') must be more than 60 minutes from now" in _problems(
        **common, capacity_block_zone="us-east-1a", capacity_block_end=soon)
    assert "capacity_block_end ('2026-13-01T00:00Z') must be a time in UTC" in _problems(
        **common, capacity_block_zone="us-east-1a", capacity_block_end="2026-13-01T00:00Z")
    text = _problems(**common, capacity_block_zone="us-east-1c", capacity_block_end=FUTURE,
                     vpc_id="vpc-0123456789abcdef0", availability_zones="us-east-1a,us-east-1b",
                     private_subnet_ids="subnet-0123456789abcdef0,subnet-0123456789abcdef1",
                     allowed_cidrs="10.0.0.0/16")
    assert "capacity_block_zone ('us-east-1c') must be one of availability_zones (us-east-1a, us-east-1b)" in text


def test_availability_zones_choose_the_new_vpcs_zones_two_or_more_of_one_region():
    assert _settings(availability_zones="us-east-1a,us-east-1c,us-east-1d").availability_zones == (
        "us-east-1a", "us-east-1c", "us-east-1d")
    assert "availability_zones (['us-east-1a']) must name at least two different zones" in _problems(
        availability_zones="us-east-1a")
    assert "availability_zones (['us-east-1a', 'us-west-2a']) must all be zones of one region" in _problems(
        availability_zones="us-east-1a,us-west-2a")
