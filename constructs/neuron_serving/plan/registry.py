"""Serving images from a private Amazon ECR registry: a mirror of the public images, or an ECR pull
through cache of their registry, for accounts whose hosts cannot reach public registries.

The image keeps its identity: the same repository path and tag (and digest, when pinned) as the
known image, under the ECR registry and an optional prefix, so the library still knows its tools.
``ghcr.io/huggingface/text-generation-inference:3.3.5-neuron`` with the registry
``111122223333.dkr.ecr.us-east-1.amazonaws.com/ghcr`` is pulled as
``111122223333.dkr.ecr.us-east-1.amazonaws.com/ghcr/huggingface/text-generation-inference:3.3.5-neuron``:
the form an ECR pull through cache rule with the prefix ``ghcr`` serves (Amazon ECR User Guide,
"Sync an upstream registry with an Amazon ECR private registry": ``<registry>/<prefix>/<upstream
repository>:<tag>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_REGISTRY = re.compile(
    r"(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z]{2}(?:-gov|-iso|-isob)?-[a-z]+-\d)\.amazonaws\.com(?P<cn>\.cn)?"
    r"(?:/(?P<prefix>[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*))?"
)
"""An ECR private registry's host (``<account>.dkr.ecr.<region>.amazonaws.com``, ``.com.cn`` in China:
Amazon ECR User Guide, "Amazon ECR private registry") and an optional repository prefix, in the
characters ECR repository names take (CreateRepository, repositoryName:
``(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*``)."""


@dataclass(frozen=True)
class EcrRegistry:
    """A private ECR registry and the prefix its copies of the images live under."""

    account: str
    region: str
    partition: str
    host: str
    prefix: str

    def reference(self, image: str) -> str:
        """Where ``image`` (a known public image reference) is in this registry."""
        return f"{self.host}/{self.repository(image)}{_tag_and_digest(image)}"

    def repository(self, image: str) -> str:
        """The ECR repository name that holds ``image``."""
        head, slash, last = _without_registry(image).split("@", 1)[0].rpartition("/")
        name = f"{head}{slash}{last.split(':', 1)[0]}"
        return f"{self.prefix}/{name}" if self.prefix else name


def ecr_registry_problem(value: str) -> str | None:
    """A shape check (:mod:`~neuron_serving.plan.identifiers`): ``None`` for an ECR registry."""
    if _REGISTRY.fullmatch(value):
        return None
    return ("must be a private ECR registry, <12-digit account>.dkr.ecr.<region>.amazonaws.com, optionally "
            "followed by /<repository prefix> (such as a pull through cache rule's prefix)")


def parse_registry(value: str) -> EcrRegistry:
    """``value`` (of the shape :func:`ecr_registry_problem` accepts) as an :class:`EcrRegistry`."""
    match = _REGISTRY.fullmatch(value)
    if match is None:
        raise ValueError(value)
    host = value.split("/", 1)[0]
    return EcrRegistry(match["account"], match["region"], "aws-cn" if match["cn"] else
                       "aws-us-gov" if "-gov-" in match["region"] else "aws", host, match["prefix"] or "")


def _without_registry(image: str) -> str:
    """``image`` without its registry host: the first path part, when it names a host (has a dot or
    a colon, or is ``localhost``: distribution/reference ``normalize.go``, splitDockerDomain)."""
    first, _, rest = image.partition("/")
    return rest if rest and ("." in first or ":" in first or first == "localhost") else image


def _tag_and_digest(image: str) -> str:
    path, at, digest = _without_registry(image).partition("@")
    last = path.rsplit("/", 1)[-1]
    tag = f":{last.rsplit(':', 1)[1]}" if ":" in last else ""
    return f"{tag}{at}{digest}"
