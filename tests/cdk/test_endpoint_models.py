"""NeuronServingEndpoint.add_model: a second model's hosts behind the same load balancer, by host name."""

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2_targets as targets
from aws_cdk.assertions import Template

from neuron_serving import NeuronServingEndpoint, ServingConfigError


def _endpoint():
    stack = Stack(App(), "Models")
    vpc = ec2.Vpc(stack, "Vpc", restrict_default_security_group=False)
    group = ec2.SecurityGroup(stack, "Hosts", vpc=vpc)
    return stack, NeuronServingEndpoint(stack, "Endpoint", vpc=vpc, target_port=8080), group


def test_each_model_gets_a_target_group_and_a_host_rule_in_order():
    stack, endpoint, hosts = _endpoint()
    for name in ("a", "b"):
        endpoint.add_model(name.upper(), host_header=f"{name}.llm.internal",
                           target=targets.InstanceIdTarget("i-0123456789abcdef0"), connections=hosts, target_port=8090)
    rules = Template.from_stack(stack).find_resources("AWS::ElasticLoadBalancingV2::ListenerRule")
    assert sorted((r["Properties"]["Priority"], r["Properties"]["Conditions"][0]["HostHeaderConfig"]["Values"][0])
                  for r in rules.values()) == [(11, "a.llm.internal"), (12, "b.llm.internal")]
    assert len(Template.from_stack(stack).find_resources("AWS::ElasticLoadBalancingV2::TargetGroup")) == 3


@pytest.mark.parametrize(("host", "problem"), [
    ("a.llm.internal", "host_header ('a.llm.internal') already routes to A"),
    ("Not A Host", "host_header ('Not A Host') must be a host name such as mistral.llm.example.com"),
])
def test_a_host_already_routed_or_malformed_is_refused(host, problem):
    _, endpoint, hosts = _endpoint()
    endpoint.add_model("A", host_header="a.llm.internal", target=targets.InstanceIdTarget("i-0123456789abcdef0"),
                       connections=hosts, target_port=8090)
    with pytest.raises(ServingConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        endpoint.add_model("B", host_header=host, target=targets.InstanceIdTarget("i-0123456789abcdef1"),
                           connections=hosts, target_port=8090)
