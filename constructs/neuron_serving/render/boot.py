"""The boot script: the EC2 user data that turns a Neuron DLAMI instance into the plan's host.

It runs once as root under cloud-init and leaves on the host (every path below
``$NEURON_SERVING_ROOT``, which is empty on a real host and set by tests and chroot-style image
builds; devices handed to docker stay the real ``/dev/neuronN``):

- ``/opt/neuron-serving/bin/export-model``: the one-time export (``userdata/export-model.sh.j2``);
- ``/opt/neuron-serving/bin/run-replica``: one TGI container (``userdata/run-replica.sh.j2``);
- ``/etc/systemd/system/neuron-tgi@.service``: one unit per replica (``userdata/neuron-tgi@.service.j2``);
- ``/etc/neuron-serving/``: ``tgi.env`` (shared settings), ``replica-N.conf`` (devices, port,
  env file), ``replica-N.env`` (``docker --env-file``), ``hf-token.env`` (mode 0600, only with
  a token secret);
- ``/var/lib/neuron-serving/exports/<export key>/`` with its completion marker;
- ``/etc/haproxy/haproxy.cfg``: the router (:func:`~neuron_serving.render.router.render_router_config`);
- ``/var/log/neuron-serving/``: ``boot.log``, ``export.log`` and ``status`` (the step reached).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.errors import Problems, ServingConfigError, problem
from ..plan.layout import Replica, ServingPlan
from ..plan.tgi import CONTAINER_PORT, DEFAULT_IMAGE, MODEL_MOUNT, export_key, replica_environment
from .router import render_router_config
from .templates import Unquoted, render

USER_DATA_LIMIT_BYTES = 16384
"""EC2 accepts at most 16 KB of user data, counted before base64 encoding."""

TOKEN_FILE = "/etc/neuron-serving/hf-token.env"
"""The root-only ``docker --env-file`` holding ``HF_TOKEN``, when a token secret is configured."""

DEFAULT_PULL_ATTEMPTS = 5
"""Image pulls tried before the boot fails; the waits between them grow 10, 20, 40, 80 s."""

ROUTER_SOURCE = "userdata/haproxy.cfg.j2"
"""Where the router config's comments live: the boot script carries the config without them."""

HEREDOC_END = "EOF"
"""The terminator of the quoted heredocs that embed rendered files in the boot script."""


@dataclass(frozen=True)
class BootOptions:
    """What the boot script needs beyond the serving plan.

    :param image: the TGI Neuron serving image. The export runs inside it, so the compiler is
        the one the replicas run with. Default: ``DEFAULT_IMAGE`` (TGI 3.3.5 Neuron).
    :param hf_token_secret: name or ARN of a Secrets Manager secret whose plain-text value is a
        Hugging Face token, for gated models. Only this id is in the user data; the host reads
        the token at boot into a root-only file. The instance role must be allowed to read the
        secret. Default: no token (public models only).
    :param pull_attempts: how many times the image pull is tried before the boot fails.
        Default: 5 (about 2.5 minutes of waits).
    """

    image: str = DEFAULT_IMAGE
    hf_token_secret: str | None = None
    pull_attempts: int = DEFAULT_PULL_ATTEMPTS

    def __post_init__(self) -> None:
        problems = Problems()
        if not isinstance(self.image, str) or not self.image or _has_space(self.image):
            problems.add("image", self.image, "must be a non-empty image reference without spaces")
        secret = self.hf_token_secret
        if secret is not None and (not isinstance(secret, str) or not secret or _has_space(secret)):
            problems.add("hf_token_secret", secret, "must be a secret name or ARN without spaces, or None")
        attempts = self.pull_attempts
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            problems.add("pull_attempts", attempts, "must be an integer of at least 1")
        problems.raise_if_any()


def _has_space(text: str) -> bool:
    return any(c.isspace() for c in text)


def render_boot_script(plan: ServingPlan, options: BootOptions | None = None) -> str:
    """The user data for ``plan``: a bash script that checks the Neuron devices, installs what is
    missing, reads the Hugging Face token (when configured), pulls the image, exports the model
    once, starts one ``neuron-tgi@N`` unit per replica and the HAProxy router.

    :param plan: the validated serving layout.
    :param options: image, token secret and retries. Default: ``BootOptions()``.

    The result is not checked against the user data limit: see :func:`check_user_data_size`.
    """
    options = options or BootOptions()
    key = export_key(plan, options.image)
    token_file = TOKEN_FILE if options.hf_token_secret is not None else None
    common_env, replica_table = _replica_settings(plan, f"{MODEL_MOUNT}/{key}")
    files = {
        "export-model": render(
            "export-model.sh.j2",
            image=options.image,
            key=key,
            devices=plan.instance.devices,
            token_file=token_file,
            mount=MODEL_MOUNT,
            model=plan.model_id,
            batch_size=plan.batch_size,
            sequence_length=plan.sequence_length,
            cores=plan.degree,
            dtype=plan.dtype,
        ),
        "run-replica": render(
            "run-replica.sh.j2",
            image=options.image,
            key=key,
            token_file=token_file,
            mount=MODEL_MOUNT,
            container_port=CONTAINER_PORT,
        ),
        "neuron-tgi@.service": render("neuron-tgi@.service.j2"),
        "tgi.env": common_env,
        "replica table": replica_table,
        "haproxy.cfg": _without_comment_lines(render_router_config(plan), ROUTER_SOURCE),
    }
    for name, text in files.items():
        _check_embeddable(name, text)
    return render(
        "bootstrap.sh.j2",
        description=Unquoted(_describe(plan, options)),
        devices=plan.instance.devices,
        instance_type=plan.instance.name,
        hf_token_secret=options.hf_token_secret,
        token_file=TOKEN_FILE,
        image=options.image,
        pull_attempts=options.pull_attempts,
        export_model=files["export-model"],
        run_replica=files["run-replica"],
        unit=files["neuron-tgi@.service"],
        common_env=common_env,
        replica_table=replica_table,
        replicas=_replicas(plan),
        router_port=plan.router_port,
        router_config=files["haproxy.cfg"],
    )


def check_user_data_size(script: str, plan: ServingPlan) -> None:
    """Raise a ``ValueError`` when ``script`` is larger than EC2 accepts as user data.

    :param script: the rendered boot script.
    :param plan: the plan it was rendered for, named in the message.
    """
    size = len(script.encode("utf-8"))
    if size > USER_DATA_LIMIT_BYTES:
        raise ServingConfigError(
            [
                f"the boot script for {_configuration(plan)} is {size} bytes, over the EC2 user data "
                f"limit of {USER_DATA_LIMIT_BYTES} bytes; a larger tensor_parallel (fewer replicas), "
                "a shorter model_id or a shorter image name makes it smaller"
            ]
        )


def _configuration(plan: ServingPlan) -> str:
    return (
        f"{plan.model_id} on {plan.instance.name} ({_replicas(plan)} of tensor_parallel "
        f"{plan.degree}, batch_size {plan.batch_size}, sequence_length {plan.sequence_length})"
    )


def _replicas(plan: ServingPlan) -> str:
    count = len(plan.replicas)
    return f"{count} replica" if count == 1 else f"{count} replicas"


def _describe(plan: ServingPlan, options: BootOptions) -> str:
    # A comment line of the script: no line break may end it early.
    return " ".join(f"{_configuration(plan)}, {plan.dtype}, image {options.image}".split())


def _replica_settings(plan: ServingPlan, model_dir: str) -> tuple[str, str]:
    """The ``docker --env-file`` lines all replicas share, and the table the boot script turns
    into per-replica files: ``index port devices KEY=value...`` with the settings that differ.

    A setting differs when it does for another replica index, so the split does not depend on
    how many replicas the plan has.
    """
    envs = [replica_environment(plan, r, model_dir) for r in plan.replicas]
    probe = replica_environment(plan, Replica(index=len(plan.replicas), devices=(), port=0), model_dir)
    own = [k for k, v in envs[0].items() if probe.get(k) != v or any(e.get(k) != v for e in envs)]
    problems = Problems()
    for env in envs:
        for k, v in env.items():
            if "\n" in v or "\r" in v:
                problems.add(f"replica setting {k}", v, "must fit on one line of a docker env file")
            elif k in own and (_has_space(v) or not v):
                problems.add(f"replica setting {k}", v, "must be one word: it differs between replicas")
    problems.raise_if_any()
    common = "".join(f"{k}={v}\n" for k, v in envs[0].items() if k not in own)
    rows = "".join(
        " ".join([str(r.index), str(r.port), ",".join(map(str, r.devices)), *(f"{k}={env[k]}" for k in own)])
        + "\n"
        for r, env in zip(plan.replicas, envs, strict=True)
    )
    return common, rows


def _without_comment_lines(text: str, source: str) -> str:
    """``text`` without its whole-line ``#`` comments, under a line naming the commented source.

    The router config is two thirds comments, which would take a quarter of the 16 KB of user
    data; on the host, the config itself is what HAProxy and an operator need.
    """
    kept = "".join(f"{line}\n" for line in text.splitlines() if not line.lstrip().startswith("#"))
    return (f"# Rendered from {source} (cdk-neuron-serving), which explains each setting; its "
            "comments are left out of the 16 KB of user data.\n" + kept)


def _check_embeddable(name: str, text: str) -> None:
    if not text.endswith("\n") or HEREDOC_END in text.splitlines():
        raise ServingConfigError(
            [problem(name, text[:60] + "...",
                     f"cannot be embedded in a heredoc: it must end with a line break and have no "
                     f"line '{HEREDOC_END}'")]
        )
