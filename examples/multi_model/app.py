#!/usr/bin/env python3
"""Two models on two fleets behind one internal load balancer, routed by host name:
``llama.llm.internal`` (the default route, Llama 3 8B) and ``small.llm.internal`` (Llama 3.2 3B). Each model has its own
boot script, fleet, readiness signal, dashboard and alarms; they share the VPC, the load balancer
and the compile-once artifact cache. Uses only the installed package."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import App, CfnOutput, Stack, Validations
from aws_cdk import aws_ec2 as ec2
from cdk_nag import AwsSolutionsChecks

from constructs import Construct
from neuron_serving import (
    NeuronArtifactCache,
    NeuronBootScript,
    NeuronServingEndpoint,
    NeuronServingFleet,
    NeuronServingLaunchTemplate,
    NeuronServingMonitoring,
    ReadinessSignal,
    ServingRequest,
    neuron_dlami,
    plan_serving,
)


@dataclass(frozen=True)
class Model:
    name: str  # construct ids, the Service dimension and the dashboard's name
    host: str  # the Host header that routes to it
    request: ServingRequest


MODELS = (
    Model("Llama", "llama.llm.internal",
          ServingRequest("NousResearch/Meta-Llama-3-8B-Instruct", "inf2.24xlarge", tensor_parallel=2)),
    Model("Small", "small.llm.internal",
          ServingRequest("unsloth/Llama-3.2-3B-Instruct", "inf2.8xlarge", tensor_parallel=2)),
)


class TwoModels(Stack):
    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        vpc = ec2.Vpc(self, "Vpc", max_azs=2, nat_gateways=1)
        vpc.add_flow_log("FlowLogs", traffic_type=ec2.FlowLogTrafficType.REJECT)
        plans = [plan_serving(model.request) for model in MODELS]
        endpoint = NeuronServingEndpoint(self, "Endpoint", vpc=vpc, target_port=plans[0].router_port)
        # The cache's S3 access logs go to the bucket of the load balancer's access logs.
        cache = NeuronArtifactCache(self, "ArtifactCache", server_access_logs_bucket=endpoint.access_logs_bucket)
        for model, plan in zip(MODELS, plans, strict=True):
            monitoring = NeuronServingMonitoring(self, f"{model.name}Monitoring",
                                                 service=f"{self.stack_name}-{model.name}",
                                                 dashboard_name=f"{self.stack_name}-{model.name}")
            boot = NeuronBootScript(self, f"{model.name}Boot", plan=plan, artifact_cache=cache, monitoring=monitoring,
                                    signal=ReadinessSignal(stack_name=self.stack_name,
                                                           logical_id=f"{model.name}Fleet"))
            host = NeuronServingLaunchTemplate(self, f"{model.name}Host", vpc=vpc, boot_script=boot,
                                               machine_image=neuron_dlami(boot.serving_image.dlami_parameter))
            fleet = NeuronServingFleet(self, f"{model.name}Fleet", vpc=vpc, launch_template=host)
            if model is MODELS[0]:
                endpoint.add_target(fleet.auto_scaling_group, fleet)
                group = endpoint.target_group
            else:
                group = endpoint.add_model(f"{model.name}Routers", host_header=model.host,
                                           target=fleet.auto_scaling_group, connections=fleet,
                                           target_port=plan.router_port)
            fleet.scale_on_in_flight_requests(monitoring)
            monitoring.watch(plan=plan, engine=boot.engine, endpoint_load_balancer=endpoint.load_balancer,
                             target_group=group, desired_capacity=fleet.metric_desired_capacity(),
                             publishes_exports=boot.publishes_exports)
            CfnOutput(self, f"{model.name}HostHeader", value=model.host,
                      description=f"Send {model.request.model_id} requests with this Host header")
        CfnOutput(self, "EndpointUrl", value=endpoint.url,
                  description="The load balancer: point llama.llm.internal and small.llm.internal at it")


app = App()
TwoModels(app, "TwoModels")
Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
