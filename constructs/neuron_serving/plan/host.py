"""What a serving host runs, resolved once: :class:`HostSpec`.

The settings (:meth:`~neuron_serving.settings.stack_settings.StackSettings.host`) or a construct's
own props (:func:`resolve_host`) name the engine, the image, the registry, the export's source and
the model's revision as strings; they are resolved here, once per synth and with every problem at
once, into the :class:`~neuron_serving.plan.engines.Engine` and
:class:`~neuron_serving.plan.engines.ServingImage` that the boot's rendering
(:func:`~neuron_serving.render.boot.render_boot_script`), the router, the monitoring and the
constructs read. Nothing downstream looks an engine up or resolves an image again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .engines import DEFAULT_ENGINE, Engine, ServingImage
from .engines import engine as find_engine
from .errors import Problems, ServingConfigError
from .identifiers import hub_repo, hub_revision
from .layout import ServingPlan
from .registry import EcrRegistry, ecr_registry_problem, parse_registry
from .timing import PULL_MINUTES

DEFAULT_PULL_ATTEMPTS = 5
"""Image pulls tried before the boot fails; the waits between them grow 10, 20, 40, 80 s."""

FIRST_PULL_WAIT_SECONDS = 10
"""The wait after the first failed pull; each later one doubles (userdata/boot/pull-image.sh.j2)."""


def pull_waits_seconds(attempts: int) -> int:
    """The waits between ``attempts`` pulls: 10, 20, 40... seconds, ``10 * (2**(attempts-1) - 1)``."""
    return FIRST_PULL_WAIT_SECONDS * ((1 << (attempts - 1)) - 1)


MAX_PULL_ATTEMPTS = max(n for n in range(1, 20) if pull_waits_seconds(n) <= PULL_MINUTES * 60 / 2)
"""The most pulls whose waits take at most half the pull's allowance in the boot timeout
(``plan.timing.PULL_MINUTES``), leaving the other half to the pulls themselves: 6 (310 s)."""

PUBLIC_HUB_CACHE = "aws-neuron/optimum-neuron-cache"
"""optimum-neuron's public Hub cache of compiled graphs, which its export consults unless
``CUSTOM_CACHE_REPO`` names another (optimum/neuron/utils/cache_utils.py ``HF_HUB_CACHE_REPOS`` and
``get_hf_hub_cache_repo``, at v0.3.0 and v0.4.5)."""

EXPORT_ROLES = ("serve", "wait", "build")
"""What a host does about the export: ``serve`` (download it from the cache, or make and publish it,
then serve), ``wait`` (never compile: wait for a builder's export in the cache, then serve) or
``build`` (make and publish it, serve nothing, then leave its Auto Scaling group)."""


@dataclass(frozen=True)
class HostSpec:
    """A serving host's engine, image and export, resolved (:func:`resolve_host`).

    :param engine: the serving engine.
    :param image: the serving image, known to the engine and able to export and serve the plan's
        model; its ``reference`` carries the digest when pinned.
    :param registry: the private ECR registry the image is pulled from, or None for its own.
    :param registry_pull_through: the registry is an ECR pull through cache.
    :param model_revision: the Hub revision of the model to export, or None.
    :param prebuilt_export: an export to serve instead of exporting (``s3://`` or ``hf://``), or None.
    :param export_role: one of :data:`EXPORT_ROLES`.
    :param pull_attempts: image pulls tried before the boot fails.
    :param hub_cache: the Hub repository of compiled graphs the export consults before compiling
        (optimum-neuron's Hub cache), or None to export offline, compiling every graph.
    """

    engine: Engine
    image: ServingImage
    registry: EcrRegistry | None = None
    registry_pull_through: bool = False
    model_revision: str | None = None
    prebuilt_export: str | None = None
    export_role: str = "serve"
    pull_attempts: int = DEFAULT_PULL_ATTEMPTS
    hub_cache: str | None = PUBLIC_HUB_CACHE

    @property
    def pulled(self) -> str:
        """The reference the host pulls: the image's, under the private registry when there is one."""
        return self.registry.reference(self.image.reference) if self.registry else self.image.reference

    @property
    def exports(self) -> bool:
        """Whether the model is exported for this host (by it or a builder), not served as prebuilt."""
        return self.prebuilt_export is None

    @property
    def compiles(self) -> bool:
        """Whether this host may compile: it exports, and does not wait for a builder's export."""
        return self.exports and self.export_role != "wait"

    def for_builder(self) -> HostSpec:
        """The spec of the builder that exports for hosts of this spec: the same engine, image,
        registry and revision (so the same export key), exporting and serving nothing."""
        return dataclasses.replace(self, export_role="build")


def resolve_host(
    plan: ServingPlan,
    *,
    engine: str | Engine = DEFAULT_ENGINE,
    image: str | ServingImage | None = None,
    image_registry: str | None = None,
    image_registry_pull_through: bool = False,
    model_revision: str | None = None,
    prebuilt_export: str | None = None,
    export_role: str = "serve",
    pull_attempts: int = DEFAULT_PULL_ATTEMPTS,
    hub_cache: str | None = PUBLIC_HUB_CACHE,
) -> HostSpec:
    """The :class:`HostSpec` these values name for ``plan``. Raises
    :class:`~neuron_serving.plan.errors.ServingConfigError` with every problem at once, each naming
    its setting (``engine``, ``image``, ``model_id``, ``image_registry``, ...).

    :param engine: a key of :data:`~neuron_serving.plan.engines.ENGINES`, or the engine the settings
        already looked up. Default: ``tgi``.
    :param image: one of the engine's ``images``, optionally pinned (``<known image>@sha256:<64
        lowercase hex digits>``), or the image the settings already resolved
        (:meth:`~neuron_serving.plan.engines.Engine.image`); either way it must serve ``plan``.
        Default: the engine's first image, by its tag.
    :param image_registry: a private ECR registry and optional prefix (:mod:`~neuron_serving.plan.registry`).
    :param image_registry_pull_through: the registry is an ECR pull through cache.
    :param model_revision: a Hub commit, branch or tag; not with ``prebuilt_export``.
    :param prebuilt_export: ``s3://bucket/prefix`` or ``hf://org/repo``.
    :param export_role: one of :data:`EXPORT_ROLES`; ``wait`` and ``build`` take no ``prebuilt_export``.
    :param pull_attempts: 1 to :data:`MAX_PULL_ATTEMPTS`.
    :param hub_cache: a Hub repository id (``namespace/name``) of compiled graphs, or None.
        Default: :data:`PUBLIC_HUB_CACHE`.
    """
    problems = Problems()
    found: Engine | None = None
    serving: ServingImage | None = None
    try:
        found = engine if isinstance(engine, Engine) else find_engine(engine)
        if isinstance(image, ServingImage):
            serving = image
        elif image is not None and (not isinstance(image, str) or not image or has_space(image)):
            problems.add("image", image, "must be a non-empty image reference without spaces, or None")
        else:
            serving = found.image(image or found.default_image.reference)
        if serving is not None:
            found.check_serves(plan, serving)
            compiles = prebuilt_export is None and export_role != "wait"
            if hub_cache is None and compiles and not serving.export.exports_offline:
                problems.add("hub_compile_cache", False, f"must be true with {serving.reference}: its "
                             f"{serving.export.title} cannot export offline (its compile cache asks the Hub cache "
                             "repository and stops at the first graph when it cannot); to keep the Hub out, serve a "
                             "prebuilt_export, or use engine=vllm")
    except ServingConfigError as error:
        problems.add_all(error.problems)
    registry = None
    if image_registry is not None:
        if (shape := ecr_registry_problem(str(image_registry))) is not None:
            problems.add("image_registry", image_registry, shape)
        else:
            registry = parse_registry(image_registry)
    if image_registry_pull_through and image_registry is None:
        problems.add("image_registry_pull_through", True, "applies only with image_registry")
    if prebuilt_export is not None and s3_parts(prebuilt_export) is None and hf_repo(prebuilt_export) is None:
        problems.add("prebuilt_export", prebuilt_export, "must be s3://bucket/prefix or hf://org/repo, "
                     "without spaces, or None")
    if model_revision is not None and (said := hub_revision(model_revision)) is not None:
        problems.add("model_revision", model_revision, said)
    elif model_revision is not None and prebuilt_export is not None:
        problems.add("model_revision", model_revision, "does not apply to a prebuilt_export, which is served as is")
    if export_role not in EXPORT_ROLES:
        problems.add("export_role", export_role, f"must be one of {', '.join(EXPORT_ROLES)}")
    elif export_role != "serve" and prebuilt_export is not None:
        problems.add("export_role", export_role, "takes no prebuilt_export: the builder publishes the export to "
                     "the artifact cache, and the serving hosts wait for it there")
    if not isinstance(pull_attempts, int) or isinstance(pull_attempts, bool) or not (
            1 <= pull_attempts <= MAX_PULL_ATTEMPTS):
        problems.add("pull_attempts", pull_attempts, f"must be an integer from 1 to {MAX_PULL_ATTEMPTS}: the waits "
                     f"between pulls double from {FIRST_PULL_WAIT_SECONDS} s, and {MAX_PULL_ATTEMPTS} pulls wait "
                     f"{pull_waits_seconds(MAX_PULL_ATTEMPTS)} s, half the {PULL_MINUTES} minutes the boot timeout "
                     "allows for pulling")
    if hub_cache is not None and (not isinstance(hub_cache, str) or (shape := hub_repo(hub_cache)) is not None):
        problems.add("hub_compile_cache_repo", hub_cache, shape if isinstance(hub_cache, str) else "must be a "
                     "Hugging Face Hub repository id, <namespace>/<name>, or None")
    problems.raise_if_any()
    assert found is not None and serving is not None  # every other outcome raised above
    return HostSpec(engine=found, image=serving, registry=registry,
                    registry_pull_through=image_registry_pull_through, model_revision=model_revision,
                    prebuilt_export=prebuilt_export, export_role=export_role, pull_attempts=pull_attempts,
                    hub_cache=hub_cache if serving.export.hub_cache_variable is not None else None)


def has_space(text: str) -> bool:
    return any(c.isspace() for c in text)


def _after_scheme(uri: object, scheme: str) -> str | None:
    if not isinstance(uri, str) or not uri.startswith(scheme) or has_space(uri):
        return None
    return uri[len(scheme):].strip("/") or None


def s3_parts(uri: object) -> tuple[str, str] | None:
    """``(bucket, prefix)`` of an ``s3://`` URI, the prefix without slashes at either end."""
    rest = _after_scheme(uri, "s3://")
    if rest is None:
        return None
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


def hf_repo(uri: object) -> str | None:
    """The ``org/repo`` of an ``hf://`` URI."""
    return _after_scheme(uri, "hf://")
