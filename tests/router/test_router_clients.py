"""The clients people use, unchanged, through the rendered router with API keys on (issue 37, part 2):
the REAL OpenAI SDK, huggingface_hub's InferenceClient, LangChain's ChatOpenAI, LiteLLM (their own
venv, ``.tools/clients``, from tests/harness/requirements-clients.txt, driven by
tests/harness/clients.py) and guidellm (``.tools/guidellm``), against the real HAProxy builds of the
router tests (conftest.py: Ubuntu 22.04's 2.4 and Debian 12's 2.6) in front of the fake TGI replicas
and vLLM servers, which answer as TGI v3.3.5 and vLLM 0.11.0 do (fake_tgi.py, fake_vllm.py): engine nxdi's
replicas are vLLM's server too (0.13.0, whose routes, errors and metrics the fake's citations hold for).

Each client's calls run once per build and engine, in one process (each client's import costs
seconds); each test reads one call's answer. docs/router.md has the table of what each client does.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_tgi import SERVED_MODEL
from routersim import Router, router_launcher

from neuron_serving.ops import guidellm
from neuron_serving.plan.engines import Engine, engine
from neuron_serving.render.router import ROUTER_ERRORS, UNAUTHORIZED, not_found_message
from neuron_serving.userdata import api_keys

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = Path(os.environ.get("NEURON_SERVING_CLIENTS_TOOLS") or ROOT / ".tools" / "clients")
DRIVER = ROOT / "tests" / "harness" / "clients.py"
GUIDELLM = Path(os.environ.get(guidellm.GUIDELLM_ENV) or ROOT / ".tools" / "guidellm" / "bin" / "guidellm")
MISSING = (f"{CLIENTS} is missing: python3 -m venv .tools/clients && .tools/clients/bin/pip install -r "
           "tests/harness/requirements-clients.txt (scripts/test does)")

KEY, WRONG = api_keys.new_key(), api_keys.new_key()
TEXT = "tok0 tok1 tok2"
"""What the fakes generate for the driver's 3 tokens (its ``TOKENS``)."""

CALLS = ("openai_models", "openai_chat", "openai_completions", "openai_chat_stream", "openai_completions_stream",
         "openai_embeddings", "hub_text_generation", "hub_text_generation_stream", "hub_text_generation_details",
         "hub_chat", "langchain_chat", "langchain_chat_stream", "litellm_chat", "litellm_chat_stream")
REFUSED = ("openai_models", "hub_text_generation")
"""The calls also made with an unknown key."""


def need(tool: Path, missing: str) -> None:
    """Skip without ``tool``, or fail when ``CI`` is set: CI would otherwise pass without the clients."""
    if not tool.exists():
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)


def openai_model(serving: Engine) -> str:
    """The ``model`` an OpenAI-compatible request names on the fakes: TGI's "tgi"
    (Engine.openai_model), vLLM's served model."""
    return serving.openai_model({"data": [{"id": SERVED_MODEL}]}) or SERVED_MODEL


def _driver(calls: list[list[str]], *options: str) -> dict[str, Any]:
    need(CLIENTS / "bin" / "python", MISSING)
    ran = subprocess.run([str(CLIENTS / "bin" / "python"), str(DRIVER), *options, json.dumps(calls)],
                         capture_output=True, text=True, timeout=600, check=False, stdin=subprocess.DEVNULL)
    assert ran.returncode == 0, ran.stderr[-3000:]
    answers: dict[str, Any] = json.loads(ran.stdout)
    return answers


def run_clients(router: Router, serving: Engine, calls: list[tuple[str, str]]) -> dict[str, Any]:
    """Each ``(call, key)`` of the driver against ``router``, by ``"<call> <key>"``."""
    return _driver([list(call) for call in calls], "--url", f"http://127.0.0.1:{router.port}",
                   "--model", openai_model(serving))


ENGINES = ("tgi", "vllm", "nxdi")


@pytest.fixture(scope="module", params=ENGINES)
def clients_engine(request: pytest.FixtureRequest) -> Engine:
    return engine(request.param)


@pytest.fixture(scope="module")
def every_answer(haproxy_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Every client call's answer through a one-replica router of each engine with API keys on,
    holding KEY: each call with KEY, and those of :data:`REFUSED` with an unknown key too; by engine.
    One driver process calls the three routers (each client's import costs seconds)."""
    workdir = tmp_path_factory.mktemp("clients")
    keys = workdir / "api-keys.sha256"
    keys.write_text(api_keys.keys_file_text([api_keys.digest(KEY)]))
    with router_launcher(haproxy_bin, workdir) as launch:
        urls = {}
        for name in ENGINES:
            router = launch(replicas=1, serving=engine(name), api_keys=True, keys_file=str(keys),
                            runtime_socket=str(workdir / f"admin-{name}.sock"), log_target="stdout format raw")
            urls[name] = f"http://127.0.0.1:{router.port}"
        calls = [[call, key, urls[name], openai_model(engine(name))] for name in ENGINES
                 for call, key in [(call, KEY) for call in CALLS] + [(c, WRONG) for c in REFUSED]]
        answers = _driver(calls)
        yield {name: {key.removesuffix(f" {url}"): answer for key, answer in answers.items() if key.endswith(f" {url}")}
               for name, url in urls.items()}


@pytest.fixture(scope="module")
def answers(every_answer: dict[str, dict[str, Any]], clients_engine: Engine) -> dict[str, Any]:
    """The answers through ``clients_engine``'s router (:func:`every_answer`)."""
    return every_answer[clients_engine.name]


def ok(answers: dict[str, Any], call: str, key: str = KEY) -> Any:
    """What ``call`` returned; fails with the client's error when it raised."""
    answer = answers[f"{call} {key}"]
    assert "ok" in answer, answer
    return answer["ok"]


def raised(answers: dict[str, Any], call: str, key: str = KEY) -> dict[str, Any]:
    """The error ``call`` raised; fails with its result when it returned."""
    answer: dict[str, Any] = answers[f"{call} {key}"]
    assert "raised" in answer, answer
    return answer


def tgi_only(serving: Engine) -> None:
    if serving.name != "tgi":
        pytest.skip("huggingface_hub's text_generation posts to TGI's / route, which vLLM does not have")


# --- the OpenAI SDK ---------------------------------------------------------------------------------------------


def test_the_openai_sdk_lists_the_served_model(answers, clients_engine) -> None:
    assert ok(answers, "openai_models") == [SERVED_MODEL]


def test_the_openai_sdk_gets_a_chat_completion(answers, clients_engine) -> None:
    assert ok(answers, "openai_chat") == {"text": TEXT, "completion_tokens": 3}


def test_the_openai_sdk_gets_a_completion(answers, clients_engine) -> None:
    assert ok(answers, "openai_completions") == {"text": TEXT, "completion_tokens": 3}


def test_the_openai_sdk_streams_a_chat_completion_and_its_usage(answers, clients_engine) -> None:
    assert ok(answers, "openai_chat_stream") == {"text": TEXT, "completion_tokens": 3}


def test_the_openai_sdk_streams_a_completion_and_its_usage(answers, clients_engine) -> None:
    assert ok(answers, "openai_completions_stream") == {"text": TEXT, "completion_tokens": 3}


def test_the_openai_sdk_shows_the_message_of_the_routers_401(answers, clients_engine) -> None:
    error = raised(answers, "openai_models", WRONG)

    assert error["raised"] == "openai.AuthenticationError"
    assert error["message"] == f"Error code: 401 - {UNAUTHORIZED}"
    assert (error["type"], error["code"]) == ("Unauthorized", "401")


def test_the_openai_sdk_shows_the_message_of_the_routers_404_for_a_route_not_served(answers, clients_engine) -> None:
    error = raised(answers, "openai_embeddings")

    assert error["raised"] == "openai.NotFoundError"
    assert error["message"] == f"Error code: 404 - {not_found_message(clients_engine)}"
    assert (error["type"], error["code"]) == ("Not Found", "404")


# --- huggingface_hub's InferenceClient ---------------------------------------------------------------------------


def test_the_hub_client_generates_text(answers, clients_engine) -> None:
    tgi_only(clients_engine)
    assert ok(answers, "hub_text_generation") == TEXT


def test_the_hub_client_streams_generated_text(answers, clients_engine) -> None:
    tgi_only(clients_engine)
    assert ok(answers, "hub_text_generation_stream") == TEXT


def test_the_hub_client_generates_text_with_details(answers, clients_engine) -> None:
    tgi_only(clients_engine)
    assert ok(answers, "hub_text_generation_details") == {"text": TEXT, "generated_tokens": 3}


def test_the_hub_client_gets_a_chat_completion(answers, clients_engine) -> None:
    assert ok(answers, "hub_chat") == {"text": TEXT, "completion_tokens": 3}


def test_the_hub_client_shows_the_message_of_the_routers_401_in_tgis_shape(answers, clients_engine) -> None:
    tgi_only(clients_engine)
    error = raised(answers, "hub_text_generation", WRONG)

    # huggingface_hub 2.4.0 inference/_common.py, raise_text_generation_error: TGI's error_type,
    # when there is one, picks the exception, which carries TGI's "error".
    assert error["raised"] == "huggingface_hub.errors.UnknownError"
    assert error["message"] == UNAUTHORIZED


def test_the_hub_client_on_vllm_is_refused_with_a_404_naming_the_routes(answers, clients_engine) -> None:
    if clients_engine.name == "tgi":
        pytest.skip("TGI serves text_generation")
    error = raised(answers, "hub_text_generation")

    assert error["status"] == 404
    assert not_found_message(clients_engine) in error["message"]


# --- LangChain's ChatOpenAI and LiteLLM -----------------------------------------------------------------------------


def test_langchains_chat_openai_gets_a_chat_completion(answers, clients_engine) -> None:
    assert ok(answers, "langchain_chat") == {"text": TEXT, "completion_tokens": 3}


def test_langchains_chat_openai_streams_a_chat_completion_and_its_usage(answers, clients_engine) -> None:
    assert ok(answers, "langchain_chat_stream") == {"text": TEXT, "completion_tokens": 3}


def test_litellm_gets_a_chat_completion(answers, clients_engine) -> None:
    assert ok(answers, "litellm_chat") == {"text": TEXT, "completion_tokens": 3}


def test_litellm_streams_a_chat_completion_and_its_usage(answers, clients_engine) -> None:
    assert ok(answers, "litellm_chat_stream") == {"text": TEXT, "completion_tokens": 3}


# --- errors the router answers itself, on both engines ---------------------------------------------------------------


@pytest.fixture
def keyed_router(start_router: Callable[..., Router], keys_dir: Path, serving: Engine) -> Router:
    """A one-replica router of ``serving`` holding KEY."""
    (keys_dir / "api-keys.sha256").write_text(api_keys.keys_file_text([api_keys.digest(KEY)]))
    return start_router(replicas=1, serving=serving, api_keys=True, keys_file=str(keys_dir / "api-keys.sha256"),
                        runtime_socket=str(keys_dir / "admin.sock"), log_target="stdout format raw")


def test_the_openai_sdk_shows_the_message_of_the_routers_503_when_no_replica_serves(keyed_router, serving) -> None:
    keyed_router.replicas["replica-0"].kill()
    keyed_router.wait_for_states({"replica-0": "DOWN"})

    error = raised(run_clients(keyed_router, serving, [("openai_chat", KEY)]), "openai_chat")

    assert error["raised"] == "openai.InternalServerError"
    assert error["message"] == f"Error code: 503 - {ROUTER_ERRORS[503]}"
    assert (error["status"], error["type"], error["code"]) == (503, "Service Unavailable", "503")


# --- guidellm -----------------------------------------------------------------------------------------------------


def test_guidellm_runs_every_chat_request_with_the_key(keyed_router, serving, tmp_path: Path, monkeypatch) -> None:
    # Chat only: each guidellm run costs 20 to 50 s here, and tests/ops/test_bench.py runs guidellm on
    # both routes through the router already (without keys, but for one --stack run).
    need(GUIDELLM, f"{GUIDELLM} is missing: scripts/test installs tests/harness/requirements-guidellm.txt")
    route = "chat"
    # One worker and a short start delay (guidellm/settings.py at 0.8.1), as tests/ops/test_bench.py runs it.
    monkeypatch.setenv("GUIDELLM__MAX_WORKER_PROCESSES", "1")
    monkeypatch.setenv("GUIDELLM__SCHEDULER_START_DELAY_NON_DISTRIBUTED", "0.1")
    workload = guidellm.Workload(guidellm.Tokens(16), guidellm.Tokens(4))
    spec = guidellm.scenario(target=f"http://127.0.0.1:{keyed_router.port}", model=openai_model(serving), route=route,
                             workload=workload, profile={"kind": "synchronous"}, max_seconds=60, max_requests=3,
                             tokenizer=guidellm.DEFAULT_TOKENIZER, report=tmp_path / "report.json")

    (measured,) = guidellm.run(str(GUIDELLM), spec, route, tmp_path, KEY)

    assert (measured.successful, measured.errored, measured.incomplete) == (3, 0, 0), measured.error
    assert len(keyed_router.replicas["replica-0"].served) == 3
