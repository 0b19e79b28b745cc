"""The compile caches in the stack (issue 26): the export consults the Hub cache and the artifact
bucket's compile cache by default, each can be turned off, and the host may touch only the compile
cache's prefix. What the export then does with them is tests/boot/test_boot_export.py's and
tests/harness/test_compile_cache.py's."""

from __future__ import annotations

import json

import pytest

from neuron_serving import ServingConfigError, StackSettings
from neuron_serving.cdk.artifact_cache import COMPILE_CACHE_ACTIONS, COMPILE_CACHE_PREFIX
from neuron_serving.plan.host import PUBLIC_HUB_CACHE

from .conftest import service_authorization_reference


def _compile_cache_statements(template) -> list[dict]:
    return [s for s in template.host_statements()
            if COMPILE_CACHE_PREFIX in json.dumps(s.get("Resource")) + json.dumps(s.get("Condition"))]


def _cache_bucket(template) -> dict:
    """The artifact cache's bucket ARN, as the template names it."""
    (bucket,) = [k for k in template.resources("AWS::S3::Bucket") if k.startswith("ArtifactCache")]
    return {"Fn::GetAtt": [bucket, "Arn"]}


def _bucket_listings(template) -> list[dict]:
    """The host's statements on listing the artifact cache's bucket."""
    return [s for s in template.host_statements()
            if s["Action"] == "s3:ListBucket" and s["Resource"] == _cache_bucket(template)]


def test_by_default_the_export_uses_the_public_hub_cache_and_the_buckets_compile_cache(synth):
    template = synth()
    stack = template.stack
    assert stack.boot_script.spec.hub_cache == PUBLIC_HUB_CACHE
    assert stack.boot_script.options.compile_cache == stack.artifact_cache.compile_cache_uri
    # The bucket's name is filled in at deploy: the URL is in the launch template's metadata.
    (launch,) = template.resources("AWS::EC2::LaunchTemplate").values()
    assert "COMPILE_CACHE='s3://" in json.dumps(launch["Metadata"])
    (objects,) = _compile_cache_statements(template)
    assert objects["Action"] == sorted(COMPILE_CACHE_ACTIONS) and objects["Effect"] == "Allow"
    assert objects["Resource"]["Fn::Join"][1][1] == f"/{COMPILE_CACHE_PREFIX}/*"


def test_a_graph_the_compile_cache_lacks_is_a_404_as_the_host_may_list_the_whole_bucket(synth):
    # S3 answers a HEAD or GET of a missing key with 404 only to a caller that may list the bucket,
    # and with 403 otherwise (S3 API reference, HeadObject and GetObject, "Permissions").
    template = synth()
    assert {"Action": "s3:ListBucket", "Effect": "Allow", "Resource": _cache_bucket(template)} in (
        _bucket_listings(template))


def test_the_hosts_listing_holds_for_a_head_of_a_graph_which_carries_no_prefix(synth):
    # Whether a HEAD of a missing key may list the bucket is decided on the HEAD's own request, which
    # has the condition keys of s3:GetObject (the action a HEAD needs) and the global ones, never
    # s3:prefix: that is a key of ListBucket alone, in parliament's copy of AWS's Service
    # Authorization Reference. A condition on a key the request lacks is false (IAM user guide,
    # "IAM JSON policy elements: Condition").
    privileges = service_authorization_reference()
    head_keys = {key for kind in privileges["s3:GetObject"]["resource_types"] for key in kind["condition_keys"]}
    assert "s3:prefix" not in head_keys
    assert "s3:prefix" in {key for kind in privileges["s3:ListBucket"]["resource_types"]
                           for key in kind["condition_keys"]}
    holding = [s for s in _bucket_listings(synth()) if s["Effect"] == "Allow"
               and all(key.startswith("aws:") or key in head_keys
                       for operator in s.get("Condition", {}).values() for key in operator)]
    assert holding != []


def test_without_the_compile_cache_the_host_still_lists_the_bucket_so_that_a_missing_marker_is_a_404(synth):
    # The artifact cache's markers are looked up as the graphs are (read_marker in export-model.sh.j2).
    template = synth(compile_cache="false", boot_disk_minutes="10")  # as the test below
    assert _bucket_listings(template) == [{"Action": "s3:ListBucket", "Effect": "Allow",
                                           "Resource": _cache_bucket(template)}]


def test_without_the_compile_cache_the_host_gets_neither_its_url_nor_its_grant(synth):
    template = synth(compile_cache="false", boot_disk_minutes="10")  # one synthesis, test_root_volume.py too
    assert template.stack.boot_script.options.compile_cache is None
    assert _compile_cache_statements(template) == []
    assert "COMPILE_CACHE" not in json.dumps(template.json)


def test_a_prebuilt_export_has_no_compile_cache(synth):
    template = synth(prebuilt_export="s3://team-exports/llama3-8b/tp2")  # test_fleet.py synthesizes it too
    assert template.stack.boot_script.options.compile_cache is None
    assert _compile_cache_statements(template) == []


def test_the_hub_cache_may_be_a_private_repository_or_off():
    def host(**context):
        return StackSettings.from_context(lambda key: context.get(key)).host()

    assert host(hub_compile_cache_repo="my-org/neuron-cache").hub_cache == "my-org/neuron-cache"
    assert host(hub_compile_cache="false", engine="vllm").hub_cache is None
    assert host(hub_compile_cache="false", prebuilt_export="s3://my-exports/llama").hub_cache is None


def test_the_tgi_images_optimum_neuron_cannot_export_offline_so_the_hub_cache_stays_on():
    # optimum-neuron 0.3.0's export stops at its first graph without the Hub cache repository
    # (tests/harness/test_compile_cache.py runs it): refused at synth, not an hour into a boot.
    with pytest.raises(ServingConfigError) as err:
        StackSettings.from_context(lambda key: {"hub_compile_cache": "false"}.get(key))
    assert ("hub_compile_cache (False) must be true with ghcr.io/huggingface/text-generation-inference:3.3.5-neuron: "
            "its optimum-neuron 0.3.0 cannot export offline") in str(err.value)


@pytest.mark.parametrize("repo", ["not a repo", "org/", "a/b/c"])
def test_a_bad_hub_cache_repository_names_the_setting(repo):
    with pytest.raises(ServingConfigError) as err:
        StackSettings.from_context(lambda key: {"hub_compile_cache_repo": repo}.get(key))
    assert f"hub_compile_cache_repo ({repo!r}) must be a Hugging Face Hub repository id" in str(err.value)


def test_the_stacks_vpc_reaches_s3_through_a_gateway_endpoint(synth):
    # The caches, the bundle and ECR's layers at the instance's bandwidth, not the NAT gateway's 5 Gbps
    # (neuron_serving.plan.time_to_serve.s3_bytes_per_second counts on it).
    template = synth()
    (endpoint,) = template.resources("AWS::EC2::VPCEndpoint").values()
    properties = endpoint["Properties"]
    assert properties["VpcEndpointType"] == "Gateway"
    assert properties["ServiceName"]["Fn::Join"][1][-1] == ".s3"
    private = {k for k, r in template.resources("AWS::EC2::RouteTable").items() if "Private" in k}
    assert private and private <= {table["Ref"] for table in properties["RouteTableIds"]}
