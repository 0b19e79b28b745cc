"""Who may use the endpoint and what the hosts may do: API keys, TLS, OIDC sign-in, rate limiting,
the host role's permissions, permissions boundaries and role paths, and no secret anywhere in what
synthesis writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from aws_cdk import App, Stack, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from neuron_serving import (
    NeuronBootScript,
    NeuronLlamaStack,
    ServingConfigError,
    ServingRequest,
    StackSettings,
    plan_serving,
)
from neuron_serving.cdk.endpoint import NeuronServingEndpoint
from neuron_serving.plan.phases import PHASE_TAGS, PUBLISH_TAG
from neuron_serving.render.boot import API_KEYS
from neuron_serving.render.boot_options import reports_phases
from neuron_serving.render.router import KEYS_FILE

from .conftest import CERTIFICATE, FEATURE_FLAGS, service_authorization_reference, synthesize

INTERNET = {"internet_facing": "true", "allowed_cidrs": "203.0.113.0/24", "certificate_arn": CERTIFICATE}
OIDC = {"oidc_issuer": "https://idp.example.com", "oidc_client_id": "alb", "oidc_client_secret": "oidc/alb-secret",
        "oidc_authorization_endpoint": "https://idp.example.com/authorize",
        "oidc_token_endpoint": "https://idp.example.com/token",
        "oidc_user_info_endpoint": "https://idp.example.com/userinfo"}


def _router_config(template) -> str:
    return template.stack.boot_script.boot.files["/etc/haproxy/haproxy.cfg.new"]


# --- TLS -------------------------------------------------------------------------------------------------------

def test_an_internet_facing_endpoint_without_a_certificate_fails_naming_both_settings():
    with pytest.raises(ServingConfigError) as err:
        synthesize({"internet_facing": "true", "allowed_cidrs": "203.0.113.0/24"})
    message = str(err.value)
    assert message.startswith("certificate_arn (None) is required when internet_facing is true")


def test_the_endpoint_construct_refuses_internet_facing_without_a_certificate():
    stack = Stack(App(), "S")
    with pytest.raises(ServingConfigError, match=r"certificate \(None\) is required when internet_facing is true"):
        NeuronServingEndpoint(stack, "E", vpc=ec2.Vpc(stack, "V"), target_port=8080, internet_facing=True,
                              allowed_cidrs=["203.0.113.0/24"])


def test_internet_facing_serves_https_with_a_modern_policy_and_http_only_redirects(synth):
    template = synth(**INTERNET)
    listeners = {r["Properties"]["Port"]: r["Properties"]
                 for r in template.resources("AWS::ElasticLoadBalancingV2::Listener").values()}
    assert set(listeners) == {80, 443}
    assert listeners[443]["Protocol"] == "HTTPS"
    assert listeners[443]["SslPolicy"].startswith("ELBSecurityPolicy-TLS13-1-2")
    assert listeners[80]["DefaultActions"] == [{"RedirectConfig": {"Port": "443", "Protocol": "HTTPS",
                                                                   "StatusCode": "HTTP_301"}, "Type": "redirect"}]


@pytest.mark.parametrize("arn", ["abc", "arn:aws:iam::111122223333:server-certificate/x"])
def test_a_certificate_arn_that_is_not_acms_is_refused(arn: str):
    with pytest.raises(ServingConfigError, match=r"certificate_arn .* must be an ACM certificate ARN"):
        synthesize({"certificate_arn": arn})


# --- API keys --------------------------------------------------------------------------------------------------

def test_api_keys_are_on_by_default_when_internet_facing_with_a_new_empty_secret(synth):
    template = synth(**INTERNET)
    (secret_id, secret), = template.resources("AWS::SecretsManager::Secret").items()
    assert secret["Properties"]["SecretString"] == "{}"
    assert template.json["Outputs"]["ApiKeysSecretArn"]["Value"] == {"Ref": secret_id}
    assert f"-f {KEYS_FILE}" in _router_config(template)
    readable = [s for s in template.host_statements() if "secretsmanager" in json.dumps(s)]
    assert readable == [{"Action": ["secretsmanager:DescribeSecret", "secretsmanager:GetSecretValue"],
                         "Effect": "Allow", "Resource": {"Ref": secret_id}}]
    assert template.stack.boot_script.options.api_keys_secret == template.stack.api_keys_secret.secret_arn


def test_an_internal_endpoint_has_no_api_keys_unless_asked(synth):
    internal = synth()
    assert not internal.resources("AWS::SecretsManager::Secret")
    assert "api-keys" not in _router_config(internal) and "ApiKeysSecretArn" not in internal.json["Outputs"]
    opted_in = synth(api_keys="true")
    assert len(opted_in.resources("AWS::SecretsManager::Secret")) == 1
    assert f"-f {KEYS_FILE}" in _router_config(opted_in)


def test_an_existing_keys_secret_is_read_by_name_and_never_created(synth):
    template = synth(api_keys="true", api_keys_secret="team/llm-keys")
    assert not template.resources("AWS::SecretsManager::Secret")
    readable = [s for s in template.host_statements() if "secretsmanager" in json.dumps(s)]
    assert ":secret:team/llm-keys-??????" in json.dumps(readable)
    assert template.stack.boot_script.options.api_keys_secret == "team/llm-keys"


def test_the_key_sync_is_in_the_boot_bundle_which_the_host_alone_may_read(synth):
    template = synth(api_keys="true")
    boot_script = template.stack.boot_script
    assert boot_script.boot.files[API_KEYS].startswith("#!/usr/bin/env python3\n")
    gets = [s for s in template.host_statements() if s["Action"] == "s3:GetObject"]
    # The bundles, each keyed by its content's hash in the assets bucket (every launch template version's).
    assert [s["Resource"] for s in gets if json.dumps(s["Resource"]).endswith('"/*.zip"]]}')]


def test_internet_facing_without_api_keys_or_sign_in_is_refused():
    with pytest.raises(ServingConfigError, match=r"api_keys \(False\) cannot be false when internet_facing is true"):
        synthesize({**INTERNET, "api_keys": "false"})


# --- OIDC sign-in ------------------------------------------------------------------------------------------------

def test_oidc_signs_browsers_in_while_bearer_requests_go_to_the_routers_key_check(synth):
    template = synth(**INTERNET, **OIDC)
    https = next(r["Properties"] for r in template.resources("AWS::ElasticLoadBalancingV2::Listener").values()
                 if r["Properties"]["Port"] == 443)
    sign_in, forward = https["DefaultActions"]
    assert sign_in["Type"] == "authenticate-oidc"
    resolved = "{{resolve:secretsmanager:oidc/alb-secret:SecretString:::}}"
    assert sign_in["AuthenticateOidcConfig"]["ClientSecret"] == resolved
    assert forward["Type"] == "forward"
    rule = template.only("AWS::ElasticLoadBalancingV2::ListenerRule")
    assert rule["Conditions"] == [{"Field": "http-header", "HttpHeaderConfig": {
        "HttpHeaderName": "Authorization", "Values": ["Bearer *"]}}]
    assert [a["Type"] for a in rule["Actions"]] == ["forward"]
    assert "acl signed_in req.hdr_cnt(x-amzn-oidc-identity) gt 0" in _router_config(template)


def test_oidc_without_api_keys_signs_everyone_in_at_the_load_balancer_alone(synth):
    template = synth(certificate_arn=CERTIFICATE, **OIDC)
    https = next(r["Properties"] for r in template.resources("AWS::ElasticLoadBalancingV2::Listener").values()
                 if r["Properties"]["Port"] == 443)
    assert [a["Type"] for a in https["DefaultActions"]] == ["authenticate-oidc", "forward"]
    assert not template.resources("AWS::ElasticLoadBalancingV2::ListenerRule")
    assert "known_key" not in _router_config(template) and "signed_in" not in _router_config(template)


def test_oidc_needs_every_setting_and_https():
    with pytest.raises(ServingConfigError) as err:
        synthesize({"oidc_issuer": OIDC["oidc_issuer"]})
    message = str(err.value)
    assert "oidc_client_id (None) is required with oidc_issuer" in message
    assert "certificate_arn (None) is required with oidc_*" in message


# --- rate limiting -------------------------------------------------------------------------------------------------

def test_no_web_acl_unless_a_rate_limit_is_asked_for(synth):
    assert not synth().resources("AWS::WAFv2::WebACL")


def test_a_rate_limit_is_a_waf_rate_based_rule_per_client_ip_on_the_load_balancer(synth):
    template = synth(rate_limit="600")
    acl = template.only("AWS::WAFv2::WebACL")
    assert acl["Scope"] == "REGIONAL" and acl["DefaultAction"] == {"Allow": {}}
    (rule,) = acl["Rules"]
    assert rule["Statement"] == {"RateBasedStatement": {"AggregateKeyType": "IP", "Limit": 600,
                                                        "EvaluationWindowSec": 300}}
    assert rule["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 429
    association = template.only("AWS::WAFv2::WebACLAssociation")
    (alb,) = template.resources("AWS::ElasticLoadBalancingV2::LoadBalancer")
    assert association["ResourceArn"] == {"Ref": alb}


@pytest.mark.parametrize("limit", ["9", "2000000001"])
def test_a_rate_limit_outside_wafs_range_is_refused(limit: str):
    with pytest.raises(ServingConfigError, match=rf"rate_limit \({limit}\) must be 10 to 2000000000"):
        synthesize({"rate_limit": limit})


# --- least privilege -----------------------------------------------------------------------------------------------

def test_session_manager_is_granted_without_the_managed_policy_that_reads_every_parameter(synth):
    template = synth()
    assert "AmazonSSMManagedInstanceCore" not in json.dumps(template.json)
    assert "ssm:GetParameter" not in json.dumps(template.host_statements())
    (register,) = [s for s in template.host_statements() if s["Action"] == "ssm:UpdateInstanceInformation"]
    assert register["Resource"]["Fn::Join"][1][-1] == ":instance/*"


@pytest.mark.parametrize("context", [{}, {"fleet": "asg", "warm_pool": "true", "hf_token_secret": "hf/token",
                                      "api_keys": "true"}])
def test_every_host_action_is_one_aws_defines_and_star_only_where_it_names_no_resource(synth, context):
    reference = service_authorization_reference()
    for statement in synth(**context).host_statements():
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        for action in actions:
            assert action in reference, action
            if statement["Resource"] == "*":
                assert [t["resource_type"] for t in reference[action]["resource_types"]] == [""], action
    # ssm:UpdateInstanceInformation may name the instance (arn:...:ec2:...:instance/<id>).
    kinds = {t["resource_type"] for t in reference["ssm:UpdateInstanceInformation"]["resource_types"]}
    assert "instance" in kinds


@pytest.mark.parametrize("context", [{}, {"fleet": "asg", "warm_pool": "true"}])
def test_the_host_may_tag_only_its_own_instance_and_only_with_the_boot_phase_and_publish_keys(synth, context):
    (statement,) = [s for s in synth(**context).host_statements() if "ec2:CreateTags" in json.dumps(s["Action"])]
    assert statement["Action"] == "ec2:CreateTags" and statement["Effect"] == "Allow"
    assert statement["Resource"] == {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":ec2:",
                                                       {"Ref": "AWS::Region"}, ":", {"Ref": "AWS::AccountId"},
                                                       ":instance/*"]]}
    assert statement["Condition"] == {
        "StringEquals": {"aws:ARN": "${ec2:SourceInstanceARN}"},
        "ForAllValues:StringEquals": {"aws:TagKeys": [*PHASE_TAGS, PUBLISH_TAG]},
        "Null": {"aws:TagKeys": "false"},
    }
    # aws:TagKeys is a condition key of ec2:CreateTags on instances; aws:ARN, which names the
    # resource acted on, is in no service's list (see NeuronBootScript._grant_phase_tags).
    (instance,) = [t for t in service_authorization_reference()["ec2:CreateTags"]["resource_types"]
                   if t["resource_type"] == "instance"]
    assert "aws:TagKeys" in instance["condition_keys"]


def test_a_boot_script_that_reports_no_phase_is_granted_no_tagging():
    stack = Stack(App(), "Own")
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    boot = NeuronBootScript(stack, "Boot", plan=plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge")))
    boot.grant_boot(role)
    boot.attach(ec2.LaunchTemplate(stack, "Template", user_data=boot.user_data).node.default_child)
    assert not reports_phases(boot.spec, boot.options)
    assert not any("report-phase" in text for text in [boot.script, *boot.boot.files.values()])
    assert "ec2:CreateTags" not in json.dumps(Template.from_stack(stack).to_json())


def test_a_permissions_boundary_and_a_path_apply_to_every_role_of_the_stack(synth):
    template = synth(permissions_boundary="arn:aws:iam::111122223333:policy/team-boundary", role_path="/neuron/")
    roles = template.resources("AWS::IAM::Role")
    assert len(roles) >= 3  # the host, the flow logs, aws-cdk-lib's custom resource provider
    for role in roles.values():
        assert role["Properties"]["Path"] == "/neuron/"
        assert role["Properties"]["PermissionsBoundary"] == "arn:aws:iam::111122223333:policy/team-boundary"


def test_bad_boundary_and_path_name_their_settings():
    with pytest.raises(ServingConfigError) as err:
        synthesize({"permissions_boundary": "not a policy", "role_path": "neuron"})
    assert "permissions_boundary ('not a policy') must be a managed policy's name or its ARN" in str(err.value)
    assert "role_path ('neuron') must start and end with /" in str(err.value)


# --- no secret in what synthesis writes ------------------------------------------------------------------------

SECRET_PATTERNS = {
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}"),
    "API key": re.compile(r"\bnsk-[A-Za-z0-9_-]{20,}"),
    "AWS access key": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "a value given to a secret": re.compile(
        r'"(SecretString|ClientSecret)":\s*"(?!\{\}"|\{\{resolve:secretsmanager:)'),
    "password or token assignment": re.compile(
        r"(?i)\b(password|passwd|api_key|token)\s*=\s*['\"]?[A-Za-z0-9/+_-]{16,}"),
}


def _texts(outdir: Path) -> dict[str, str]:
    texts = {str(p.relative_to(outdir)): p.read_text(errors="replace") for p in outdir.rglob("*") if p.is_file()}
    template = json.loads(texts["NeuronLlamaStack.template.json"])
    for name, resource in template["Resources"].items():
        if resource["Type"] == "AWS::EC2::LaunchTemplate":
            user_data = json.dumps(resource["Properties"]["LaunchTemplateData"]["UserData"])
            texts[f"{name} user data"] = user_data
    return texts


def test_no_secret_in_the_cloud_assembly_or_any_rendered_script(tmp_path: Path):
    context = {**FEATURE_FLAGS, **INTERNET, **OIDC, "hf_token_secret": "hf/token", "fleet": "asg",
               "rate_limit": "1000"}
    app = App(context=context, outdir=str(tmp_path))
    stack = NeuronLlamaStack(app, "NeuronLlamaStack", settings=StackSettings.from_context(app.node.try_get_context))
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    app.synth()
    texts = _texts(tmp_path)
    texts["boot script"] = stack.boot_script.script
    texts["boot script's files"] = "".join(stack.boot_script.boot.files.values())
    # The assets are there too: the key sync and the metrics publisher.
    assert any("def update_router" in t for t in texts.values())
    assert any("class Publisher" in t for t in texts.values())
    found = [(name, what, m.group(0)[:40]) for name, text in texts.items()
             for what, pattern in SECRET_PATTERNS.items() for m in pattern.finditer(text)]
    assert found == []


def test_the_secret_scan_finds_what_it_looks_for():
    planted = ('"SecretString": "s3cr3t"', "token=" + "hf_" + "A" * 34, "nsk-" + "b" * 43, "AKIA" + "C" * 16)
    for text in planted:
        assert any(p.search(text) for p in SECRET_PATTERNS.values()), text

