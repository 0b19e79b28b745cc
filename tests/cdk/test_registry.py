"""The serving image from a private ECR registry: the hosts' (and the builder's) exact pull
permissions, and nothing of ECR without it."""

import json

import pytest

from neuron_serving import ServingConfigError, StackSettings

from .conftest import service_authorization_reference, synthesized

REGISTRY = "111122223333.dkr.ecr.us-east-1.amazonaws.com"
REPOSITORY = "arn:aws:ecr:us-east-1:111122223333:repository/ghcr/huggingface/text-generation-inference"


def _ecr_statements(template: dict) -> list[dict]:
    return [s for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
            for s in r["Properties"]["PolicyDocument"]["Statement"] if "ecr:" in json.dumps(s["Action"])]


def _actions(statement: dict) -> list[str]:
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


def _ecr_grants(template: dict) -> dict[str, set[str]]:
    """Each resource's ECR actions (CDK merges statements of one resource: minimizePolicies)."""
    grants: dict[str, set[str]] = {}
    for statement in _ecr_statements(template):
        grants.setdefault(json.dumps(statement["Resource"]), set()).update(
            a for a in _actions(statement) if a.startswith("ecr:"))
    return grants


def test_a_mirror_grants_a_token_and_pulling_the_image_s_one_repository():
    assert _ecr_grants(synthesized(image_registry=f"{REGISTRY}/ghcr").json) == {
        json.dumps(REPOSITORY): {"ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"},
        '"*"': {"ecr:GetAuthorizationToken"},
    }


def test_a_pull_through_cache_may_also_create_the_repository_and_import_the_image():
    grants = _ecr_grants(synthesized(image_registry=f"{REGISTRY}/ghcr", image_registry_pull_through="true").json)
    assert grants[json.dumps(REPOSITORY)] == {"ecr:BatchGetImage", "ecr:BatchImportUpstreamImage",
                                              "ecr:CreateRepository", "ecr:GetDownloadUrlForLayer"}


def test_the_builder_pulls_from_the_registry_too():
    template = synthesized(instance_type="inf2.xlarge", image_registry=f"{REGISTRY}/ghcr").json
    policies = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"]
    roles = {ref["Ref"] for p in policies if "ecr:BatchGetImage" in json.dumps(p["PolicyDocument"])
             for ref in p["Roles"]}
    assert len(roles) == 2


def test_without_a_registry_the_hosts_have_no_ecr_permission():
    assert _ecr_statements(synthesized().json) == []


NEWER_THAN_PARLIAMENT = {"ecr:BatchImportUpstreamImage"}
"""Actions whose repository resource type the Service Authorization Reference lists now
(list_amazonelasticcontainerregistry.html: BatchImportUpstreamImage, repository*) and parliament
1.6.4's older copy does not."""


def test_every_ecr_action_is_one_aws_defines_on_repositories_or_on_nothing():
    privileges = service_authorization_reference()
    grants = _ecr_grants(synthesized(image_registry=f"{REGISTRY}/ghcr", image_registry_pull_through="true").json)
    for resource, actions in grants.items():
        for action in actions:
            kinds = {k["resource_type"] for k in privileges[action]["resource_types"]}
            # On "*": an action that takes no resource. On the repository: one that takes it (CreateRepository
            # also lists "" for the registry-wide part of its tagging).
            assert (kinds == {""} if resource == '"*"' else "repository*" in kinds
                    or action in NEWER_THAN_PARLIAMENT), (action, kinds)


@pytest.mark.parametrize("registry", ["ghcr.io/huggingface", "111122223333.dkr.ecr.us-east-1.amazonaws.com/Upper",
                                      "1111.dkr.ecr.us-east-1.amazonaws.com"])
def test_a_registry_that_is_not_a_private_ecr_one_is_refused(registry):
    with pytest.raises(ServingConfigError, match=rf"^image_registry \('{registry}'\) must be a private ECR registry"):
        StackSettings(image_registry=registry)


def test_pull_through_without_a_registry_is_refused():
    with pytest.raises(ServingConfigError, match=r"image_registry_pull_through \(True\) applies only with "
                                                 "image_registry"):
        StackSettings(image_registry_pull_through=True)
