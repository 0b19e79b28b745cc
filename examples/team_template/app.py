#!/usr/bin/env python3
"""Two teams' endpoints from the platform team's template (team.py), with cdk-nag's checks."""

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks
from team import llm_endpoint

app = App()
llm_endpoint(app, "search", preset="llama-3.1-8b-throughput")
llm_endpoint(app, "support", fleet="asg", min_capacity=2, max_capacity=4)
Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
