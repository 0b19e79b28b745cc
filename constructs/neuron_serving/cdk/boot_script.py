"""The boot scripts as a construct: the rendered user data plus the permissions it needs."""

from __future__ import annotations

from aws_cdk import Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager

from constructs import Construct

from ..plan.layout import ServingPlan
from ..plan.tgi import DEFAULT_IMAGE
from ..render.boot import BootOptions, check_user_data_size, render_boot_script


class NeuronBootScript(Construct):
    """User data that exports the model once and starts the plan's TGI replicas and router.

    The rendered script is checked against the EC2 user-data limit (16 KB) when constructed, so
    an oversized configuration fails at synth, never at launch.

    :param plan: the serving plan to realise on the host.
    :param image: the TGI Neuron serving image; the export runs inside it so that compiler
        versions match. Default: ``DEFAULT_IMAGE``.
    :param hf_token_secret: a secret holding a Hugging Face token for gated models. The token is
        read on the host at boot; it never appears in the user data or the template.
        Default: no token.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        plan: ServingPlan,
        image: str = DEFAULT_IMAGE,
        hf_token_secret: secretsmanager.ISecret | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.plan = plan
        self.image = image
        self.hf_token_secret = hf_token_secret
        secret_id = None
        if hf_token_secret is not None:
            # The complete ARN identifies the secret exactly; a secret imported by name has only
            # a partial ARN (a deploy-time token), and the name is then the plain identifier.
            arn, name = hf_token_secret.secret_arn, hf_token_secret.secret_name
            secret_id = arn if not Token.is_unresolved(arn) or Token.is_unresolved(name) else name
        self.script: str = render_boot_script(plan, BootOptions(image=image, hf_token_secret=secret_id))
        """The rendered boot script (tokens, if any, unresolved)."""
        check_user_data_size(self.script, plan)
        self.user_data = ec2.UserData.custom(self.script)
        """The script as EC2 user data, for a launch template."""

    def grant_boot(self, grantee: iam.IGrantable) -> None:
        """Give ``grantee`` (the instance role) what the boot script calls: reading the token."""
        if self.hf_token_secret is not None:
            self.hf_token_secret.grant_read(grantee)
