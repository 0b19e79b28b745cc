"""The Application Load Balancer in front of the hosts' routers."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Acknowledgment, Duration, SecretValue, Stack, Token, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_wafv2 as wafv2

from constructs import Construct

from ..plan.errors import Problems, problem
from ..render.router import STREAM_TIMEOUT_SECONDS
from ..settings import limits
from .buckets import log_bucket
from .scanners import skip_checkov
from .validation import check_props

DEFAULT_IDLE_TIMEOUT = Duration.seconds(300)
RATE_LIMIT_WINDOW_SECONDS = 300
"""The window of the rate-based rule's count: 60, 120, 300 or 600 seconds (WAFV2 API,
RateBasedStatement.EvaluationWindowSec; botocore 1.43.11 data/wafv2/2019-07-29/service-2.json).
cfn-lint checks the template against CloudFormation's schema of it."""
API_KEY_RULE_PRIORITY = 10


@dataclass(frozen=True)
class OidcSignIn:
    """Browser sign-in at the load balancer with an OpenID Connect provider (Cognito user pools
    are one: issuer ``https://cognito-idp.<region>.amazonaws.com/<pool id>``, endpoints under the
    pool's domain, ``/oauth2/authorize``, ``/oauth2/token`` and ``/oauth2/userInfo``).

    :param issuer: the provider's issuer URL.
    :param client_id: the load balancer's OAuth client id.
    :param client_secret: its client secret, such as ``SecretValue.secrets_manager(name)``
        (resolved at deploy time, never in the template).
    :param authorization_endpoint: the provider's authorization endpoint.
    :param token_endpoint: its token endpoint.
    :param user_info_endpoint: its user info endpoint.
    :param scope: the scopes asked for. Default: ``openid``.
    """

    issuer: str
    client_id: str
    client_secret: SecretValue
    authorization_endpoint: str
    token_endpoint: str
    user_info_endpoint: str
    scope: str = "openid"
ACCESS_LOG_PREFIX = "alb"


class NeuronServingEndpoint(Construct):
    """An ALB that spreads requests over Neuron hosts by least outstanding requests.

    Secure by default: internal, reachable only from the VPC's CIDR; internet-facing only when
    asked, then only from ``allowed_cidrs`` and only over HTTPS; HTTPS when a certificate is given,
    with HTTP redirected to it and a TLS 1.2+ policy; access logs to an encrypted, SSL-only
    bucket; invalid header fields dropped. The API keys are checked by each host's router
    (:class:`NeuronBootScript`'s ``api_keys_secret``), not here.

    :param vpc: the VPC of the load balancer and the hosts.
    :param target_port: the hosts' router port.
    :param internet_facing: place the load balancer in public subnets. Default: false.
    :param allowed_cidrs: who may connect. Default: the VPC's CIDR; required when
        ``internet_facing``.
    :param certificate: an ACM certificate for an HTTPS listener. Required when
        ``internet_facing``. Default: HTTP only.
    :param oidc: browser users sign in at the HTTPS listener before their requests are
        forwarded; needs ``certificate``. Default: no sign-in.
    :param api_keys: the routers check API keys: with ``oidc``, requests that carry
        ``Authorization: Bearer`` are forwarded without the sign-in, for the routers to check
        their key. Default: false.
    :param rate_limit: block a client IP that sends more than this many requests in 5 minutes,
        with an AWS WAF web ACL on the load balancer (about $5 a month for the web ACL, $1 for the
        rule and $0.60 per million requests). Default: no rate limit.
    :param idle_timeout: how long a connection may stay silent, which bounds the time to the
        first streamed token and between non-streamed responses. At most 900 seconds, the
        on-host router's own timeout. Default: 300 seconds.
    :param deregistration_delay: how long a host being removed keeps its in-flight requests.
        Default: 300 seconds.
    :param access_logs_bucket: Default: a new bucket, retained when the stack is deleted.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        target_port: int,
        internet_facing: bool = False,
        allowed_cidrs: Sequence[str] = (),
        certificate: elbv2.IListenerCertificate | None = None,
        oidc: OidcSignIn | None = None,
        api_keys: bool = False,
        rate_limit: int | None = None,
        idle_timeout: Duration = DEFAULT_IDLE_TIMEOUT,
        deregistration_delay: Duration = DEFAULT_IDLE_TIMEOUT,
        access_logs_bucket: s3.IBucket | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        problems = Problems()
        if internet_facing and not allowed_cidrs:
            problems.add(
                "allowed_cidrs",
                list(allowed_cidrs),
                "must list who may connect when internet_facing is true "
                "(an unauthenticated LLM endpoint is never opened to everyone by default)",
            )
        if internet_facing and certificate is None:
            problems.add("certificate", None, "is required when internet_facing is true: an internet-facing endpoint "
                         "serves HTTPS only, so prompts and keys never cross the internet in clear text")
        if oidc is not None and certificate is None:
            problems.add("certificate", None, "is required with oidc: a load balancer signs users in on an HTTPS "
                         "listener only")
        if rate_limit is not None:
            problems.add_all(check_props(self, [rate_limit], lambda value: [] if (wrong := limits.rate_limit(value))
                                         is None else [problem("rate_limit", value, wrong)]))
        networks = []
        for cidr in allowed_cidrs:
            try:
                networks.append(ipaddress.ip_network(cidr, strict=True))
            except ValueError:
                problems.add("allowed_cidrs", cidr, "is not a valid CIDR (such as 203.0.113.0/24)")
        if not 1 <= idle_timeout.to_seconds() <= STREAM_TIMEOUT_SECONDS:
            problems.add(
                "idle_timeout",
                idle_timeout.to_seconds(),
                f"must be 1 to {STREAM_TIMEOUT_SECONDS} seconds: the on-host router must never close "
                "an idle connection before the load balancer does, or clients get 502s",
            )
        problems.raise_if_any()

        self.load_balancer = elbv2.ApplicationLoadBalancer(
            self,
            "LoadBalancer",
            vpc=vpc,
            internet_facing=internet_facing,
            vpc_subnets=ec2.SubnetSelection(
                subnet_type=ec2.SubnetType.PUBLIC if internet_facing else ec2.SubnetType.PRIVATE_WITH_EGRESS
            ),
            idle_timeout=idle_timeout,
            drop_invalid_header_fields=True,
        )
        self.access_logs_bucket = access_logs_bucket or log_bucket(self, "AccessLogs")
        self._log_access_logs(ACCESS_LOG_PREFIX)

        port = 443 if certificate else 80
        peers = [_peer(n) for n in networks]
        if not peers:
            peers = [ec2.Peer.ipv4(vpc.vpc_cidr_block)]
            if Token.is_unresolved(vpc.vpc_cidr_block):
                Validations.of(self.load_balancer).acknowledge(
                    Acknowledgment(
                        id="AwsSolutions::AwsSolutions-EC23",
                        reason="Ingress is limited to the VPC's own CIDR, which the rule cannot read "
                        "because it is only known at deploy time",
                    )
                )
        for peer in peers:
            self.load_balancer.connections.allow_from(peer, ec2.Port.tcp(port), "LLM clients")

        self._vpc = vpc
        self._deregistration_delay = deregistration_delay
        self.target_group = self._routers("Routers", target_port)
        self.target_port = target_port
        self._oidc = oidc
        self._hosts: dict[str, str] = {}
        if certificate:
            forward = elbv2.ListenerAction.forward([self.target_group])
            self.listener = self.load_balancer.add_listener(
                "Https",
                port=443,
                protocol=elbv2.ApplicationProtocol.HTTPS,
                certificates=[certificate],
                ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS,
                open=False,
                default_action=forward if oidc is None else elbv2.ListenerAction.authenticate_oidc(
                    issuer=oidc.issuer,
                    client_id=oidc.client_id,
                    client_secret=oidc.client_secret,
                    authorization_endpoint=oidc.authorization_endpoint,
                    token_endpoint=oidc.token_endpoint,
                    user_info_endpoint=oidc.user_info_endpoint,
                    scope=oidc.scope,
                    next=forward,
                ),
            )
            if oidc is not None and api_keys:
                # ALB header conditions compare values case-insensitively, with * as a wildcard (ELBv2
                # API, HttpHeaderConditionConfig; botocore 1.43.11 data/elbv2/2015-12-01/service-2.json).
                # Every request without a bearer token passes the sign-in; every request with one goes
                # to the routers, which refuse it unless its key is known.
                self.listener.add_action(
                    "ApiKeyClients",
                    priority=API_KEY_RULE_PRIORITY,
                    conditions=[elbv2.ListenerCondition.http_header("Authorization", ["Bearer *"])],
                    action=forward,
                )
            for peer in peers:
                self.load_balancer.connections.allow_from(peer, ec2.Port.tcp(80), "redirect to HTTPS")
            self.load_balancer.add_redirect(source_port=80, target_port=443, open=False)
        else:
            # Internal only (an internet-facing endpoint requires a certificate).
            self.listener = self.load_balancer.add_listener(
                "Http",
                port=80,
                protocol=elbv2.ApplicationProtocol.HTTP,
                open=False,
                default_target_groups=[self.target_group],
            )
            reason = ("An internal load balancer reachable only from the VPC or allowed_cidrs, to which no "
                      "certificate was given (certificate_arn): HTTPS needs a certificate of a domain the "
                      "clients resolve. Internet-facing endpoints serve HTTPS only")
            for check in ("CKV_AWS_2", "CKV_AWS_103"):
                skip_checkov(self.listener, check, reason)
        self.web_acl = self._rate_limit(rate_limit) if rate_limit is not None else None
        scheme = "https" if certificate else "http"
        self.url: str = f"{scheme}://{self.load_balancer.load_balancer_dns_name}"
        """The endpoint's base URL."""

    def _rate_limit(self, limit: int) -> wafv2.CfnWebACL:
        name = f"{Stack.of(self).stack_name}-{self.node.id}-rate"
        visibility = wafv2.CfnWebACL.VisibilityConfigProperty(
            cloud_watch_metrics_enabled=True, sampled_requests_enabled=True, metric_name=name)
        acl = wafv2.CfnWebACL(
            self,
            "RateLimit",
            scope="REGIONAL",
            default_action=wafv2.CfnWebACL.DefaultActionProperty(allow={}),
            visibility_config=visibility,
            custom_response_bodies={"rate-limited": wafv2.CfnWebACL.CustomResponseBodyProperty(
                content_type="APPLICATION_JSON",
                content='{"error":{"message":"Rate limit exceeded: slow down and retry","type":"requests",'
                        '"code":"rate_limit_exceeded"}}')},
            rules=[wafv2.CfnWebACL.RuleProperty(
                name="requests-per-client-ip",
                priority=0,
                statement=wafv2.CfnWebACL.StatementProperty(
                    rate_based_statement=wafv2.CfnWebACL.RateBasedStatementProperty(
                        aggregate_key_type="IP", limit=limit, evaluation_window_sec=RATE_LIMIT_WINDOW_SECONDS)),
                action=wafv2.CfnWebACL.RuleActionProperty(block=wafv2.CfnWebACL.BlockActionProperty(
                    custom_response=wafv2.CfnWebACL.CustomResponseProperty(
                        response_code=429, custom_response_body_key="rate-limited"))),
                visibility_config=visibility,
            )],
        )
        skip_checkov(acl, "CKV_AWS_192", "This web ACL only limits request rates; no Java runs behind it (HAProxy, "
                     "the serving engines' Rust and Python servers), so the Log4j rule set would inspect every "
                     "request at a cost for nothing")
        wafv2.CfnWebACLAssociation(self, "RateLimitAssociation", resource_arn=self.load_balancer.load_balancer_arn,
                                   web_acl_arn=acl.attr_arn)
        return acl

    def _log_access_logs(self, prefix: str) -> None:
        # ApplicationLoadBalancer.log_access_logs needs a region to pick the ELB account of the
        # bucket policy. The log delivery service principal works in every region (the
        # principal CDK itself falls back to, aws-cdk PR #37319), so the stack stays
        # environment-agnostic.
        bucket = self.access_logs_bucket
        result = bucket.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal("logdelivery.elasticloadbalancing.amazonaws.com")],
                actions=["s3:PutObject"],
                resources=[bucket.arn_for_objects(f"{prefix}/AWSLogs/{Stack.of(self).account}/*")],
            )
        )
        self.load_balancer.set_attribute("access_logs.s3.enabled", "true")
        self.load_balancer.set_attribute("access_logs.s3.bucket", bucket.bucket_name)
        self.load_balancer.set_attribute("access_logs.s3.prefix", prefix)
        # The load balancer checks that it may write to the bucket when logging is switched on.
        if result.policy_dependable is not None:
            self.load_balancer.node.add_dependency(result.policy_dependable)

    def _routers(self, construct_id: str, port: int) -> elbv2.ApplicationTargetGroup:
        """A target group of hosts' routers on ``port``, balanced by least outstanding requests."""
        return elbv2.ApplicationTargetGroup(
            self,
            construct_id,
            vpc=self._vpc,
            port=port,
            protocol=elbv2.ApplicationProtocol.HTTP,
            target_type=elbv2.TargetType.INSTANCE,
            load_balancing_algorithm_type=elbv2.TargetGroupLoadBalancingAlgorithmType.LEAST_OUTSTANDING_REQUESTS,
            deregistration_delay=self._deregistration_delay,
            health_check=elbv2.HealthCheck(
                path="/health",
                healthy_http_codes="200",
                interval=Duration.seconds(15),
                timeout=Duration.seconds(5),
                healthy_threshold_count=2,
                unhealthy_threshold_count=3,
            ),
        )

    def add_model(
        self,
        construct_id: str,
        *,
        host_header: str,
        target: elbv2.IApplicationLoadBalancerTarget,
        connections: ec2.IConnectable,
        target_port: int,
    ) -> elbv2.ApplicationTargetGroup:
        """Serve a second model from this load balancer: requests whose ``Host`` header is
        ``host_header`` (such as ``mistral.llm.example.com``, a name that resolves to the load
        balancer) go to ``target``'s routers on ``target_port``, in a target group of their own;
        the rest keep going to the first model's. Host-based rather than path-based: the engines
        serve fixed routes (``/generate``, ``/v1/chat/completions``), which a path prefix would
        have to be cut from. Returns the model's target group (for its monitoring).

        Only without OIDC sign-in (its listener rule would have to repeat the sign-in). Raises
        :class:`ServingConfigError` naming ``host_header`` when another model has it."""
        problems = Problems()
        if self._oidc is not None:
            problems.add("oidc", "sign-in", "cannot be combined with add_model: sign the users of each model in "
                         "on a load balancer of its own")
        if host_header in self._hosts:
            problems.add("host_header", host_header, f"already routes to {self._hosts[host_header]}")
        if not _HOST.fullmatch(host_header):
            problems.add("host_header", host_header, "must be a host name such as mistral.llm.example.com")
        problems.raise_if_any()
        self._hosts[host_header] = construct_id
        group = self._routers(construct_id, target_port)
        group.add_target(target)
        self.listener.add_action(
            construct_id,
            # Rules are evaluated by priority, lowest first; each model's comes after the API-key rule.
            priority=API_KEY_RULE_PRIORITY + len(self._hosts),
            conditions=[elbv2.ListenerCondition.host_headers([host_header])],
            action=elbv2.ListenerAction.forward([group]),
        )
        connections.connections.allow_from(
            self.load_balancer, ec2.Port.tcp(target_port), "router port, from the load balancer"
        )
        return group

    def add_target(self, target: elbv2.IApplicationLoadBalancerTarget, connections: ec2.IConnectable) -> None:
        """Send traffic to ``target`` and open its security group to the load balancer only."""
        self.target_group.add_target(target)
        connections.connections.allow_from(
            self.load_balancer, ec2.Port.tcp(self.target_port), "router port, from the load balancer"
        )


_HOST = re.compile(r"(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}")
"""A lowercase DNS name of labels of at most 63 letters, digits and hyphens (RFC 1035, section 2.3.1)."""


def _peer(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> ec2.IPeer:
    if network.version == 6:
        return ec2.Peer.ipv6(str(network))
    return ec2.Peer.ipv4(str(network))
