#!/usr/bin/env python3
"""Wires the app: reads context, builds NeuronLlamaStack, adds cdk-nag. Nothing else."""

import sys

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from neuron_serving import NeuronLlamaStack, ServingConfigError, StackSettings

app = App()
try:
    settings = StackSettings.from_context(app.node.try_get_context, given=app.node.get_all_context())
    NeuronLlamaStack(app, "NeuronLlamaStack", settings=settings)
except ServingConfigError as err:
    sys.exit(f"NeuronLlamaStack: {err}")
Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
