"""The router in front of vLLM servers: the real HAProxy with the config rendered for the vLLM
engine, fake OpenAI-compatible servers behind it (fake_vllm.py)."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fake_vllm import SERVED_MODEL
from routersim import Router, make_plan

from neuron_serving.plan.engines.vllm import VLLM
from neuron_serving.render.router import render_router_config

StartRouter = Callable[..., Router]


def completion(max_tokens: int = 1, stream: bool = False) -> dict[str, object]:
    return {"model": SERVED_MODEL, "prompt": "ping", "max_tokens": max_tokens, "stream": stream}


def test_haproxy_accepts_the_config_rendered_for_vllm_and_checks_its_health_route_with_get(
    haproxy_bin: str, tmp_path: Path,
) -> None:
    text = render_router_config(make_plan(3), VLLM)
    # vLLM's /health is GET-only: HAProxy's default OPTIONS check would get 405.
    assert "http-check send meth GET uri /health ver HTTP/1.1" in text
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    result = subprocess.run([haproxy_bin, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 0 and "[WARNING]" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_streamed_completion_chunks_arrive_as_generated_and_end_with_done(start_router: StartRouter) -> None:
    router = start_router(replicas=1, token_delay=0.3, serving=VLLM)
    conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=10)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(completion(5, stream=True)),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type", "").startswith("text/event-stream")
        arrivals: list[tuple[float, bytes]] = []
        for _ in range(50):
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data:"):
                arrivals.append((time.monotonic(), line[len(b"data:"):].strip()))
    finally:
        conn.close()
    assert arrivals[-1][1] == b"[DONE]"
    chunks = [(at, json.loads(data)) for at, data in arrivals[:-1]]
    assert "".join(c["choices"][0]["text"] for _, c in chunks) == " ".join(f"tok{i}" for i in range(5))
    assert chunks[0][0] < chunks[-1][1]["sent_at"] - 0.8
    assert max(at - c["sent_at"] for at, c in chunks) < 0.1


def test_chat_and_completion_and_models_routes_pass_through(start_router: StartRouter) -> None:
    router = start_router(replicas=3, serving=VLLM)
    chat = router.request("POST", "/v1/chat/completions", {"model": SERVED_MODEL, "max_tokens": 3,
                                                             "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status == 200 and json.loads(chat.body)["choices"][0]["message"]["content"] == "tok0 tok1 tok2"
    models = router.request("GET", "/v1/models")
    assert models.status == 200 and [m["id"] for m in json.loads(models.body)["data"]] == [SERVED_MODEL]
    unknown = router.request("POST", "/v1/completions", {**completion(), "model": "other"})
    assert unknown.status == 404 and json.loads(unknown.body)["error"]["type"] == "NotFoundError"


def test_a_server_whose_engine_died_gets_no_requests_once_marked_down(start_router: StartRouter) -> None:
    router = start_router(replicas=3, serving=VLLM)
    router.replicas["replica-2"].healthy = False  # vLLM's /health answers 503 once its engine is dead
    router.wait_for_states({"replica-0": "UP", "replica-1": "UP", "replica-2": "DOWN"})
    served_before = len(router.replicas["replica-2"].served)
    responses = [router.request("POST", "/v1/completions", completion()) for _ in range(12)]
    assert [r.status for r in responses] == [200] * 12
    assert {r.replica for r in responses} == {"replica-0", "replica-1"}
    assert len(router.replicas["replica-2"].served) == served_before


def test_concurrent_long_completions_spread_over_all_servers(start_router: StartRouter) -> None:
    # 3 s each: all six in flight together even on a busy machine (test_router.py says why).
    router = start_router(replicas=3, token_delay=0.3, serving=VLLM)
    with ThreadPoolExecutor(max_workers=6) as pool:
        responses = list(pool.map(lambda _: router.request("POST", "/v1/completions", completion(10)), range(6)))
    assert [r.status for r in responses] == [200] * 6
    assert Counter(r.replica for r in responses) == {"replica-0": 2, "replica-1": 2, "replica-2": 2}
