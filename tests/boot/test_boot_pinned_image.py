"""A serving image pinned by digest, booted on a simulated host whose docker is the real CLI
(tests/harness/dockerd.py records what it asks the engine): the engine is asked for the digest,
the Hub download, the export and every replica run the pinned reference, and the export is filed
under the pinned image's key. A malformed digest refused at synth is one the real CLI would refuse
on the host, at the pull."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from bootsim import EXPORTS, MARKER, Host, make_plan

from neuron_serving.plan import ServingConfigError
from neuron_serving.plan.engines import ENGINES, ServingImage
from neuron_serving.plan.engines.tgi import TGI_3_3_5
from neuron_serving.plan.engines.vllm import OPTIMUM_NEURON_VLLM_0_4_5
from neuron_serving.render.boot import RUN_REPLICA
from tests.harness import dockerd
from tests.harness.userdata import boot_of

MakeHost = Callable[..., Host]
MODEL = "NousResearch/Meta-Llama-3-8B-Instruct"
DIGEST = "sha256:" + "0123456789abcdef" * 4
"""A well-formed digest: the fake engine serves whatever digest it is asked for."""


@pytest.mark.parametrize("image", [TGI_3_3_5, OPTIMUM_NEURON_VLLM_0_4_5], ids=["tgi", "vllm"])
def test_a_pinned_image_is_pulled_by_its_digest_and_every_container_runs_the_pinned_reference(
    make_host: MakeHost, image: ServingImage,
) -> None:
    engine = next(e for e in ENGINES.values() if image in e.images)
    pinned = f"{image.reference}@{DIGEST}"
    plan = make_plan("inf2.24xlarge", 2, model_id=MODEL)
    # An engine that holds no image: a container of anything but the pulled digest would need a pull.
    host = make_host(plan.instance.devices, images=())
    result = host.boot(boot_of(plan, engine=engine.name, image=pinned),
                       STUB_SERVED_MODEL=MODEL)
    assert result.returncode == 0, result.stdout + result.stderr
    for replica in plan.replicas:
        assert host.run(RUN_REPLICA, str(replica.index)).returncode == 0

    assert f"\nIMAGE={pinned}\n" in host.path("/etc/neuron-serving/stack.env").read_text()
    assert [argv for argv in host.calls("docker") if argv[0] == "pull"] == [["pull", pinned]]
    # docker/cli v28.2.2 vendor/github.com/docker/docker/client/image_pull.go: the repository and the
    # digest, as the "tag" parameter; the reference's tag is not sent, so the engine pulls the digest.
    record = host.engine.record_path
    assert record is not None
    pulls = dockerd.requests(record, "POST", "/images/create")
    assert [(r["query"], r["status"]) for r in pulls] == [
        ({"fromImage": image.reference.rpartition(":")[0], "tag": DIGEST}, 200)]
    creates = dockerd.requests(record, "POST", "/containers/create")
    assert [r["status"] for r in creates] == [201] * len(creates)
    containers = host.containers()
    assert {c["Image"] for c in containers} == {pinned}
    assert {c["name"] for c in containers} >= {f"replica-{r.index}" for r in plan.replicas}
    entrypoints = [c["Entrypoint"] for c in containers if c["Entrypoint"]]
    assert entrypoints == [[image.export.hub_cli], [image.export.entrypoint]] == [["huggingface-cli"], ["optimum-cli"]]

    key = engine.export_key(plan, engine.image(pinned))
    assert key != engine.export_key(plan, image)
    assert host.path(f"{EXPORTS}/{key}/{MARKER}").is_file()
    assert all(c["HostConfig"]["Binds"] == [f"{host.path(EXPORTS)}/{key}:/models/{key}:ro"]
               for c in containers if c["name"].startswith("replica-"))


@pytest.mark.parametrize("digest", [
    "sha256:" + "0123456789ABCDEF" * 4,
    "sha256:" + "0123456789abcdef" * 3,
    "md5:" + "0123456789abcdef" * 2,
    "0123456789abcdef" * 4,
])
def test_a_digest_refused_at_synth_is_one_the_real_docker_cli_would_refuse_at_boot(
    make_host: MakeHost, digest: str,
) -> None:
    pinned = f"{TGI_3_3_5.reference}@{digest}"
    with pytest.raises(ServingConfigError, match=r"^image \(.*\) has a malformed digest"):
        boot_of(make_plan("inf2.24xlarge", 2, model_id=MODEL), image=pinned)
    host = make_host(1, images=())
    pull = subprocess.run([host.env["REAL_DOCKER"], "pull", pinned], env=host.env, capture_output=True, text=True,
                          timeout=30, check=False)
    assert pull.returncode != 0 and pull.stderr.strip()
    record = host.engine.record_path
    assert record is not None and dockerd.requests(record, "POST", "/images/create") == []
