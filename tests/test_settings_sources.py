"""Settings from code, presets and an organisation's config file; typos and identifier shapes caught
at synth, every problem at once; the configuration table (docs/configuration.md) generated from the
definitions."""

import json
from pathlib import Path

import pytest

from neuron_serving import ServingConfigError, StackSettings
from neuron_serving.settings import PRESETS, SETTINGS
from neuron_serving.settings.table import configuration_table, with_table

ROOT = Path(__file__).resolve().parents[1]
CERTIFICATE = "arn:aws:acm:us-east-1:111122223333:certificate/3f2a6c1e-8d4b-4e7a-9c2f-1b5d7e9a0c3d"


def _from_context(context, given=None):
    return StackSettings.from_context(context.get, given=context.keys() if given is None else given)


# -- defaults from code ----------------------------------------------------------------------------

def test_code_and_context_share_every_default():
    assert StackSettings() == _from_context({})


def test_every_setting_is_a_keyword_with_its_documentation_in_the_docstring():
    doc = StackSettings.__doc__ or ""
    for definition in SETTINGS:
        assert f":param {definition.name}: {definition.doc} Default: {definition.default_text}." in doc


def test_settings_given_in_code_are_checked_like_context():
    with pytest.raises(ServingConfigError) as error:
        StackSettings(batch_size="8", internet_facing="yes", allowed_cidrs=("10.0.0.1/8",))
    assert error.value.problems == (
        "batch_size ('8') must be a whole number",
        "internet_facing ('yes') must be true or false",
        "allowed_cidrs ('10.0.0.1/8') is not a valid CIDR (such as 203.0.113.0/24)",
    )


def test_api_keys_follow_internet_facing_unless_given():
    settings = StackSettings(internet_facing=True, allowed_cidrs=("203.0.113.0/24",), certificate_arn=CERTIFICATE)
    assert settings.api_keys is True
    assert StackSettings().api_keys is False


def test_replace_refuses_an_unknown_setting_with_the_closest():
    with pytest.raises(ServingConfigError, match=r"tensor_paralel \(8\) is not a setting; did you mean "
                                                 r"tensor_parallel\?"):
        StackSettings().replace(tensor_paralel=8)


# -- typos -----------------------------------------------------------------------------------------

def test_an_unknown_context_key_is_refused_naming_the_closest_setting():
    with pytest.raises(ServingConfigError, match=r"^tensor_paralel \('8'\) is not a setting; did you mean "
                                                 r"tensor_parallel\?$"):
        _from_context({"tensor_paralel": "8"})


def test_a_key_close_to_no_setting_points_to_the_table():
    with pytest.raises(ServingConfigError, match=r"zzz \('1'\) is not a setting; see the configuration table"):
        _from_context({"zzz": "1"})


def test_feature_flags_lookups_and_the_cli_s_own_keys_are_not_settings_and_not_typos():
    context = {"@aws-cdk/core:checkSecretUsage": True, "aws:cdk:enable-path-metadata": True,
               "availability-zones:account=111122223333:region=us-east-1": ["us-east-1a"], "preset": None}
    assert _from_context(context) == StackSettings()


def test_without_the_list_of_given_keys_only_settings_are_read():
    assert StackSettings.from_context({"tensor_paralel": "8"}.get) == StackSettings()


def test_every_problem_is_reported_at_once():
    with pytest.raises(ServingConfigError) as error:
        _from_context({"tensor_paralel": "8", "certificate_arn": "arn:aws:acm:us-east-1:1:certificate/x",
                       "ami_id": "ami-123", "prebuilt_export": "s3://Bad_Bucket/x", "fleet": "asg",
                       "scale_down_schedule": "0 20 * * 1-5", "scale_up_schedule": "0 7 * 13 *",
                       "hf_token_secret": "arn:aws:secretsmanager:us-east-1:111122223333:token",
                       "alarm_topic_arn": "arn:aws:sns:us-east-1:111122223333:"})
    assert [p.split(" ", 1)[0] for p in error.value.problems] == [
        "tensor_paralel", "hf_token_secret", "ami_id", "prebuilt_export", "certificate_arn", "scale_up_schedule",
        "alarm_topic_arn"]


# -- shapes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("certificate_arn", "arn:aws:iam::111122223333:server-certificate/x", "must be an ACM certificate ARN"),
    ("hf_token_secret", "has spaces", "must be a secret's name"),
    ("api_keys_secret", "arn:aws:secretsmanager:us-east-1:111122223333:keys", "must be a Secrets Manager secret ARN"),
    ("ami_id", "ami-XYZ", "must be an AMI id"),
    ("prebuilt_export", "s3://ab/prefix", "must be s3://<bucket>/<prefix> or hf://<namespace>/<repository>"),
    ("prebuilt_export", "hf://just-a-name", "must be s3://<bucket>/<prefix> or hf://<namespace>/<repository>"),
    ("scale_down_schedule", "0 20 * *", "must be a cron expression of 5 fields"),
    ("scale_down_schedule", "0 20 * * MON-SUNDAY", "has a bad day of week field"),
    ("scale_down_schedule", "5-1 20 * * *", "has a bad minute field"),
    ("vpc_id", "vpc-12", "must be a VPC id"),
    ("alarm_email", "ops at example.com", "must be one e-mail address"),
    ("dlami_parameter", "aws/service/neuron", "must be an SSM parameter name starting with /"),
    ("name_prefix", "9team", "must start with a letter"),
])
def test_identifiers_of_the_wrong_shape_are_refused_at_synth(key, value, allowed):
    context = {key: value, "fleet": "asg"} if "schedule" in key else {key: value}
    with pytest.raises(ServingConfigError) as error:
        _from_context(context)
    assert any(p.startswith(f"{key} ({value!r}) {allowed}") for p in error.value.problems), error.value.problems


@pytest.mark.parametrize(("key", "value"), [
    ("certificate_arn", CERTIFICATE),
    ("hf_token_secret", "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf/token-AbCdEf"),
    ("hf_token_secret", "hf/token"),
    ("ami_id", "ami-0123456789abcdef0"),
    ("ami_id", "ami-01234567"),
    ("prebuilt_export", "s3://team-exports/llama3-8b/tp2"),
    ("prebuilt_export", "hf://aws-neuron/Llama-3.1-8B-Instruct-neuron"),
    ("alarm_email", "ops@example.com"),
    ("alarm_topic_arn", "arn:aws:sns:eu-west-1:111122223333:on-call"),
])
def test_identifiers_of_the_right_shape_are_accepted(key, value):
    assert getattr(_from_context({key: value}), key) == value


@pytest.mark.parametrize("expression", ["0 20 * * 1-5", "*/15 0-6 1,15 JAN-MAR sun", "0 0 * * 7", "30 6 */2 * *"])
def test_cron_expressions_auto_scaling_takes_are_accepted(expression):
    settings = _from_context({"fleet": "asg", "scale_down_schedule": expression, "scale_up_schedule": "0 7 * * *"})
    assert settings.scale_down_schedule == expression


# -- presets ---------------------------------------------------------------------------------------

def test_a_preset_sets_its_settings():
    settings = _from_context({"preset": "llama-3.1-8b-throughput"})
    assert (settings.instance_type, settings.tensor_parallel, settings.batch_size) == ("inf2.48xlarge", 2, 8)
    assert len(settings.plan().replicas) == 12


def test_explicit_settings_override_the_preset():
    settings = _from_context({"preset": "llama-3.1-8b-latency", "tensor_parallel": "4"})
    assert settings.tensor_parallel == 4 and settings.instance_type == "inf2.48xlarge"


def test_a_preset_from_code_takes_overrides():
    settings = StackSettings.from_preset("llama-3-70b-inf2", fleet="asg")
    assert (settings.model_id, settings.tensor_parallel, settings.fleet) == (
        "NousResearch/Meta-Llama-3-70B-Instruct", 24, "asg")


def test_an_unknown_preset_names_the_known_ones():
    with pytest.raises(ServingConfigError, match=r"preset \('llama'\) must be one of llama-3.1-8b-latency, "):
        _from_context({"preset": "llama"})


def test_a_problem_with_a_preset_s_value_says_it_came_from_the_preset():
    with pytest.raises(ServingConfigError, match=r"^preset llama-3.1-8b-latency: tensor_parallel \(8\) must be one "
                                                 r"of 2 on inf2.8xlarge"):
        _from_context({"preset": "llama-3.1-8b-latency", "instance_type": "inf2.8xlarge"})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_plans(name):
    settings = StackSettings.from_preset(name)
    assert settings.plan().degree == settings.tensor_parallel


# -- an organisation's config file -----------------------------------------------------------------

ORG = """\
# The platform team's defaults
vpc_id: vpc-0123456789abcdef0
availability_zones: [us-east-1a, us-east-1b]
private_subnet_ids: [subnet-0123456789abcdef0, subnet-0123456789abcdef1]
allowed_cidrs: [10.20.0.0/16]
permissions_boundary: team-boundary
role_path: /ml/
tags: {team: ml-platform, cost-center: 4711}
name_prefix: ml-
log_retention_days: 90
alarm_topic_arn: arn:aws:sns:us-east-1:111122223333:on-call
"""


def test_a_yaml_config_file_applies_its_settings(tmp_path):
    path = tmp_path / "org.yaml"
    path.write_text(ORG)
    settings = _from_context({"config": str(path)})
    assert settings.vpc_id == "vpc-0123456789abcdef0"
    assert settings.private_subnet_ids == ("subnet-0123456789abcdef0", "subnet-0123456789abcdef1")
    assert settings.tags == {"team": "ml-platform", "cost-center": "4711"}
    assert (settings.log_retention_days, settings.role_path, settings.name_prefix) == (90, "/ml/", "ml-")


def test_a_json_config_file_is_read_too_and_context_overrides_it(tmp_path):
    path = tmp_path / "org.json"
    path.write_text(json.dumps({"log_retention_days": 30, "alarm_email": "ops@example.com"}))
    settings = _from_context({"config": str(path), "log_retention_days": "7"})
    assert (settings.log_retention_days, settings.alarm_email) == (7, "ops@example.com")


def test_config_file_problems_name_the_file_and_the_key(tmp_path):
    path = tmp_path / "org.yaml"
    path.write_text("log_retention_days: 13\nrole_pth: /ml/\ntags: [a, b]\n")
    with pytest.raises(ServingConfigError) as error:
        _from_context({"config": str(path)})
    assert error.value.problems == (
        f"{path}: role_pth ('/ml/') is not a setting; did you mean role_path?",
        f"{path}: tags (['a', 'b']) must be a mapping of names to values (a JSON object on the command line)",
        f"{path}: log_retention_days (13) must be one of 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, "
        "731, 1096, 1827, 2192, 2557, 2922, 3288, 3653",
    )


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("org.yaml", "vpc_id: [unclosed\n", "is not valid YAML: line 2"),
    ("org.json", "{\"vpc_id\": }", "is not valid JSON: line 1"),
    ("org.yaml", "- a list\n", "must hold a mapping of setting names to values"),
    ("org.toml", "x = 1", "must be a .yaml, .yml, .json file"),
])
def test_a_config_file_that_cannot_be_read_says_why(tmp_path, name, text, problem):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ServingConfigError, match=rf"^config \('{path}'\) {problem}"):
        _from_context({"config": str(path)})


def test_a_missing_config_file_is_named(tmp_path):
    with pytest.raises(ServingConfigError, match=r"config \('.*nope.yaml'\) cannot be read: No such file"):
        _from_context({"config": str(tmp_path / "nope.yaml")})


def test_an_imported_vpc_needs_its_subnets_zones_and_the_allowed_networks():
    with pytest.raises(ServingConfigError) as error:
        _from_context({"vpc_id": "vpc-0123456789abcdef0", "private_subnet_ids": "subnet-0123456789abcdef0"})
    assert [p.split(" ", 1)[0] for p in error.value.problems] == ["availability_zones", "allowed_cidrs"]


# -- the configuration page ------------------------------------------------------------------------

def test_the_configuration_table_is_generated_from_the_definitions():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert with_table(page) == page, "run: python -m neuron_serving.settings.table docs/configuration.md"
    for definition in SETTINGS:
        assert f"| `{definition.name}` | {definition.default_text} |" in configuration_table()


# -- small hosts -----------------------------------------------------------------------------------

def test_a_host_too_small_to_compile_serves_a_prebuilt_export():
    settings = _from_context({"instance_type": "inf2.xlarge", "prebuilt_export": "s3://team-exports/llama3-8b/tp2"})
    assert (settings.plan().instance.name, len(settings.plan().replicas)) == ("inf2.xlarge", 1)


def test_a_host_too_small_to_compile_without_a_prebuilt_export_gets_the_cheapest_builder_that_can():
    settings = _from_context({"instance_type": "inf2.xlarge"})
    assert settings.builder is not None
    assert (settings.builder.instance.name, settings.builder.degree) == ("inf2.8xlarge", settings.plan().degree)
