"""Stack settings from CDK context (cdk.json or ``-c key=value``), validated in one pass.

Values given with ``-c`` arrive as strings, values in cdk.json as JSON types; both are accepted.
Every problem is collected and reported at once, each naming the context key.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .plan.errors import Problems
from .plan.layout import ServingRequest
from .plan.tgi import DEFAULT_IMAGE

DEFAULT_MODEL_ID = "NousResearch/Meta-Llama-3-8B-Instruct"
"""Llama 3 8B Instruct as published by Meta, mirrored without the gate: no token needed."""

DEFAULT_INSTANCE_TYPE = "inf2.24xlarge"
"""6 Neuron devices: the default 8B model fits at degree 2, giving 6 data-parallel replicas."""

DEFAULT_DLAMI_PARAMETER = "/aws/service/neuron/dlami/base/ubuntu-24.04/latest/image_id"
"""The Neuron DLAMI with drivers and tools only, meant for containerised serving."""

CONTEXT_KEYS = (
    "model_id", "model_config", "instance_type", "tensor_parallel", "batch_size", "sequence_length",
    "max_input_tokens", "dtype", "hf_token_secret", "image", "ami_id", "dlami_parameter",
    "internet_facing", "allowed_cidrs", "certificate_arn",
)


@dataclass(frozen=True)
class StackSettings:
    """Everything ``NeuronLlamaStack`` is configured with.

    :param request: the serving request (model, instance type, shapes, degree).
    :param image: the TGI Neuron serving image. Default: ``DEFAULT_IMAGE``.
    :param hf_token_secret: name or ARN of a Secrets Manager secret holding a Hugging Face
        token, for gated models. Default: none.
    :param ami_id: a pinned AMI id instead of the DLAMI parameter. Default: none.
    :param dlami_parameter: the public SSM parameter naming the DLAMI, resolved at each launch.
    :param internet_facing: an internet-facing load balancer. Default: false (internal).
    :param allowed_cidrs: CIDRs that may reach the endpoint. Default: the VPC's CIDR when
        internal; required when internet-facing.
    :param certificate_arn: an ACM certificate for an HTTPS listener. Default: HTTP only.
    """

    request: ServingRequest
    image: str = DEFAULT_IMAGE
    hf_token_secret: str | None = None
    ami_id: str | None = None
    dlami_parameter: str = DEFAULT_DLAMI_PARAMETER
    internet_facing: bool = False
    allowed_cidrs: tuple[str, ...] = field(default=())
    certificate_arn: str | None = None

    @classmethod
    def from_context(cls, get: Callable[[str], Any]) -> StackSettings:
        """Read and validate every context key; raise once with all problems."""
        problems = Problems()
        reader = _Reader(get, problems)
        request = ServingRequest(
            model_id=reader.text("model_id", DEFAULT_MODEL_ID),
            model_config=reader.optional_text("model_config"),
            instance_type=reader.text("instance_type", DEFAULT_INSTANCE_TYPE),
            tensor_parallel=reader.degree("tensor_parallel"),
            batch_size=reader.integer("batch_size", ServingRequest.batch_size),
            sequence_length=reader.integer("sequence_length", ServingRequest.sequence_length),
            max_input_tokens=reader.optional_integer("max_input_tokens"),
            dtype=reader.text("dtype", ServingRequest.dtype),
        )
        settings = cls(
            request=request,
            image=reader.text("image", DEFAULT_IMAGE),
            hf_token_secret=reader.optional_text("hf_token_secret"),
            ami_id=reader.optional_text("ami_id"),
            dlami_parameter=reader.text("dlami_parameter", DEFAULT_DLAMI_PARAMETER),
            internet_facing=reader.boolean("internet_facing", False),
            allowed_cidrs=reader.cidrs("allowed_cidrs"),
            certificate_arn=reader.optional_text("certificate_arn"),
        )
        problems.raise_if_any()
        return settings


class _Reader:
    def __init__(self, get: Callable[[str], Any], problems: Problems) -> None:
        self._get = get
        self._problems = problems

    def _raw(self, key: str) -> Any:
        value = self._get(key)
        return None if value is None or value == "" else value

    def optional_text(self, key: str) -> str | None:
        value = self._raw(key)
        if value is None:
            return None
        if not isinstance(value, str):
            self._problems.add(key, value, "must be a string")
            return None
        return value.strip()

    def text(self, key: str, default: str) -> str:
        return self.optional_text(key) or default

    def optional_integer(self, key: str) -> int | None:
        value = self._raw(key)
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        self._problems.add(key, value, "must be a whole number")
        return None

    def integer(self, key: str, default: int) -> int:
        value = self.optional_integer(key)
        return default if value is None else value

    def degree(self, key: str) -> int | None:
        value = self._raw(key)
        if isinstance(value, str) and value.strip().lower() == "auto":
            return None
        return self.optional_integer(key)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._raw(key)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        self._problems.add(key, value, "must be true or false")
        return default

    def cidrs(self, key: str) -> tuple[str, ...]:
        value = self._raw(key)
        if value is None:
            return ()
        items: Any
        if isinstance(value, str):
            text = value.strip()
            try:
                items = json.loads(text) if text.startswith("[") else text.split(",")
            except json.JSONDecodeError:
                items = None
            if not isinstance(items, list):
                self._problems.add(key, value, "must be a list of CIDRs or a comma-separated string")
                return ()
        elif isinstance(value, list):
            items = value
        else:
            self._problems.add(key, value, "must be a list of CIDRs or a comma-separated string")
            return ()
        result = []
        for item in items:
            try:
                result.append(str(ipaddress.ip_network(str(item).strip(), strict=True)))
            except ValueError:
                self._problems.add(key, item, "is not a valid CIDR (such as 203.0.113.0/24)")
        return tuple(result)
