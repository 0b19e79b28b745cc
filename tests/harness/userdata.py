"""Reading a boot as the host gets it: the user data names the stack resource whose CloudFormation
metadata holds the stack's values, and those name its bundle (``BUNDLE``), a directory asset the CDK
zips and publishes (userdata/bootstrap.sh.j2, neuron_serving.render.bundle)."""

from __future__ import annotations

import inspect
import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

from neuron_serving.plan.host import HostSpec, resolve_host
from neuron_serving.plan.layout import ServingPlan
from neuron_serving.render.boot import BUNDLE_ENV, METADATA_KEY, HostBoot, render_boot_script
from neuron_serving.render.boot_options import BootOptions
from neuron_serving.render.bundle import MANIFEST, write_bundle
from tests.harness.aws import AwsEmulator

BUNDLE = re.compile(r"^BUNDLE='?(s3://[^/\s]+/([0-9a-f]{64})\.zip)'?$", re.M)
"""The bundle's S3 URI in a user data (:meth:`HostBoot.user_data`), and its asset hash (the object key's
stem)."""


def bundle_uri(user_data: str) -> str:
    """The S3 URI of the bundle ``user_data`` (:meth:`HostBoot.user_data`) names."""
    [(uri, _)] = BUNDLE.findall(user_data)
    return uri


def assembly_bundle(user_data: str, *assemblies: Path) -> Path:
    """The directory of the bundle ``user_data`` names, as a cloud assembly holds it (``asset.<hash>``,
    the asset's staged copy), from the first of ``assemblies`` that has it."""
    [(_, asset_hash)] = BUNDLE.findall(user_data)
    found = [a / f"asset.{asset_hash}" for a in assemblies if (a / f"asset.{asset_hash}" / MANIFEST).is_file()]
    assert found, f"no cloud assembly holds the boot bundle asset.{asset_hash}"
    return found[0]


_PUBLISHED: dict[str, bytes] = {}
"""Each bundle the CDK CLI zipped in this process, by its S3 URI (its asset hash)."""


def publish_bundle(aws: AwsEmulator, user_data: str, *assemblies: Path) -> None:
    """The bundle ``user_data`` names, published by the CDK CLI from the cloud assembly that holds it
    (:meth:`AwsEmulator.publish_assets`) to the place it names. The CLI runs once per bundle and
    process (about 4 s); later emulators get the same bytes, the CDK's own zip, put in place."""
    uri = bundle_uri(user_data)
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    if uri in _PUBLISHED:
        aws.put_s3_uri(uri, _PUBLISHED[uri])
        return
    region = re.fullmatch(r"cdk-hnb659fds-assets-\d{12}-([a-z0-9-]+)", bucket)
    assert region is not None, bucket
    aws.publish_assets(assembly_bundle(user_data, *assemblies).parent, "NeuronLlamaStack", region.group(1))
    assert key in aws.list_objects(bucket, ""), f"the CDK published no {uri}"
    _PUBLISHED[uri] = aws.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()


def files_in(directory: Path) -> dict[str, str]:
    """A bundle directory's files by their path on the host (the manifest itself left out)."""
    return {"/" + p.relative_to(directory).as_posix(): p.read_text()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST}


def zipped(directory: Path) -> bytes:
    """``directory`` zipped as the CDK publishes a directory asset: its files by relative path. For
    boots rendered without a stack; a synthesized stack's bundle is published by the CDK CLI itself
    (:func:`publish_bundle`)."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(directory).as_posix())
    return data.getvalue()


def zipped_boot(boot: HostBoot, scratch: Path) -> bytes:
    """``boot``'s bundle zipped, as the stack's asset would be published."""
    directory = scratch / f"bundle-{boot.digest}"
    if not directory.is_dir():
        write_bundle(boot.files, directory)
    return zipped(directory)


STACK_ENV = "/etc/neuron-serving/stack.env"
"""The values from the stack, which every script of the boot sources."""

EMBEDDED_FILE = re.compile(r"^cat >\"\$env_file\" <<'EOF'\n(.*?)^EOF$", re.MULTILINE | re.DOTALL)
"""The one file the user data writes itself, from a quoted heredoc: stack.env (``$env_file``), with
where the stack's values are."""

DEPLOYED_BUNDLE = "s3://cdk-hnb659fds-assets-123456789012-us-east-1/" + "0123456789abcdef" * 4 + ".zip"
"""A bundle's location as a deployed stack names it: the CDK bootstrap bucket's name (its default
qualifier, an account and a region) and an asset hash, the longest it is once CloudFormation has
filled in the names."""


DEPLOYED_STACK = "NeuronLlamaStack"
"""The stack name a rendered boot's user data carries."""
DEPLOYED_RESOURCE = "ExportBuilderHost6094748D"
"""The logical id of the host's resource a rendered boot's user data names: the longest of the
stack's launch templates (the builder's; the serving hosts' is ``HostF593FDA4``)."""


def user_data(boot: HostBoot) -> str:
    """``boot``'s user data as a deployed stack's would be (:data:`DEPLOYED_STACK`, us-east-1,
    :data:`DEPLOYED_BUNDLE`)."""
    return boot.user_data("us-east-1", DEPLOYED_STACK, DEPLOYED_RESOURCE, DEPLOYED_BUNDLE)


def deployed_values(boot: HostBoot) -> str:
    """The stack's values ``boot``'s user data reads from the host resource's metadata, as a deployed
    stack's would be."""
    return boot.values()


def deployed_metadata(boot: HostBoot) -> str:
    """The host resource's metadata, as DescribeStackResource returns it (a JSON string)."""
    return json.dumps(boot.metadata())


def embedded_files(boot: HostBoot) -> dict[str, str]:
    """Every file ``boot`` writes, by its path on the host: stack.env as the boot script leaves it
    (its user data's lines, then the stack's values from the metadata), the rest from its bundle."""
    [written] = EMBEDDED_FILE.findall(user_data(boot))
    return {STACK_ENV: written + deployed_values(boot), **boot.files}


def host_stack_env(boot: HostBoot) -> str:
    """``/etc/neuron-serving/stack.env`` as the host has it once the boot's steps run: the user
    data's lines, the stack's values, then the bundle's ``bundle.env`` (userdata/boot/prelude.sh.j2)."""
    return embedded_files(boot)[STACK_ENV] + boot.files[BUNDLE_ENV]


def readable(boot: HostBoot, *, leave_out: tuple[str, ...] = ()) -> str:
    """``boot`` as one text for a snapshot: its user data, the stack's values its host resource's
    metadata holds, then each file of its bundle after a ``# ==> path <==`` line (``leave_out``'s
    paths by name only)."""
    return user_data(boot) + f"# ==> metadata {METADATA_KEY} <==\n" + deployed_values(boot) + "".join(
        f"# ==> {path} <==\n" + ("<left out>\n" if path in leave_out else text)
        for path, text in sorted(boot.files.items()))


SPEC_SETTINGS = frozenset(inspect.signature(resolve_host).parameters) - {"plan"}
"""The values :func:`~neuron_serving.plan.host.resolve_host` takes: the host's spec."""


def spec_and_options(plan: ServingPlan, settings: dict[str, object]) -> tuple[HostSpec, BootOptions]:
    """``settings`` split as ``NeuronBootScript`` splits its props: the host's spec, resolved for
    ``plan``, and the options the stack supplies."""
    spec = {k: v for k, v in settings.items() if k in SPEC_SETTINGS}
    return (resolve_host(plan, **spec),  # type: ignore[arg-type]
            BootOptions(**{k: v for k, v in settings.items() if k not in SPEC_SETTINGS}))  # type: ignore[arg-type]


def boot_of(plan: ServingPlan, options: BootOptions | None = None, **spec: Any) -> HostBoot:
    """``plan``'s boot with the host spec ``spec``'s values name (:func:`resolve_host`; TGI, exporting
    on the host, by default) and ``options``."""
    return render_boot_script(plan, resolve_host(plan, **spec), options)
