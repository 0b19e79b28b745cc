"""``neuron-serving bench`` driving the REAL guidellm 0.8.1 (its own venv, ``.tools/guidellm``, from
tests/harness/requirements-guidellm.txt) against the REAL router (HAProxy with the rendered config) in
front of the fake TGI replicas and fake vLLM servers of tests/router, and, with ``--stack``, a stack in
moto's CloudFormation whose outputs point at that router. The CLI runs in this process (``main``).

guidellm runs with one worker process (``GUIDELLM__MAX_WORKER_PROCESSES``: its default, 10, each
importing torch, would take the 2 cores for seconds) and a 0.1 s scheduler start delay instead of 1 s
(``GUIDELLM__SCHEDULER_START_DELAY_NON_DISTRIBUTED``, guidellm/settings.py): each run still costs about
4 s of start-up, so the sweep's figures are measured once and checked by several tests.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from neuron_serving.cli import _parser as main_parser
from neuron_serving.cli import main
from neuron_serving.ops import bench as bench_module
from neuron_serving.ops import guidellm
from neuron_serving.ops.aws import OpsError
from neuron_serving.ops.endpoint import API_KEY_ENV, Endpoint
from neuron_serving.ops.guidellm import Measured, Percentiles, Tokens
from neuron_serving.ops.output import Printer
from neuron_serving.ops.stack import StackInfo
from neuron_serving.plan import ServingRequest, Workload, plan_serving, predict, request_from_layout
from neuron_serving.plan.engines import engine
from neuron_serving.plan.performance import replica_costs
from neuron_serving.plan.queueing import Call, percentile, simulate
from neuron_serving.userdata import api_keys
from tests.harness.aws import REGION, AwsEmulator

sys.path.insert(0, str(Path(__file__).parents[1] / "router"))
from fake_tgi import GENERATION_ERROR, SERVED_MODEL
from routersim import MISSING_HAPROXY, Router, find_haproxy, router_launcher

ROOT = Path(__file__).resolve().parents[2]
GUIDELLM = Path(os.environ.get(guidellm.GUIDELLM_ENV) or ROOT / ".tools" / "guidellm" / "bin" / "guidellm")
TEST_SETTINGS = {"GUIDELLM__MAX_WORKER_PROCESSES": "1", "GUIDELLM__SCHEDULER_START_DELAY_NON_DISTRIBUTED": "0.1"}
TOKEN_DELAY = 0.01
INPUT, OUTPUT, REQUESTS = 32, 8, 12
PNG = b"\x89PNG\r\n\x1a\n"
STACK = "BenchStack"
LAYOUT = {"model_id": SERVED_MODEL, "instance_type": "inf2.xlarge", "tensor_parallel": 2, "batch_size": 4,
          "sequence_length": 4096, "max_input_tokens": 3072, "dtype": "bf16"}
"""The stack's ServingPlan output (neuron_serving.plan.layout.layout_document)."""


def need(tool: Path | str | None, missing: str) -> None:
    """Skip without ``tool``, or fail when ``CI`` is set: CI would otherwise pass without running bench."""
    if tool is None or not Path(tool).exists():
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)


MISSING_GUIDELLM = (f"{GUIDELLM} is missing: python3 -m venv .tools/guidellm && .tools/guidellm/bin/pip install -r "
                    "tests/harness/requirements-guidellm.txt (scripts/test does)")


@contextlib.contextmanager
def guidellm_settings() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(guidellm.GUIDELLM_ENV, str(GUIDELLM))
        for name, value in TEST_SETTINGS.items():
            patch.setenv(name, value)
        patch.delenv(API_KEY_ENV, raising=False)
        yield


@dataclass
class Ran:
    code: int
    out: str
    err: str


def bench(*args: str) -> Ran:
    """``neuron-serving bench ARGS``, its exit status and what it printed (guidellm's own output goes to
    its log in the results directory)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["bench", *args])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return Ran(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def routers(workdir: Path) -> Iterator[Callable[..., Router]]:
    """``start(name="tgi", replicas=3, **options)``: the real router for engine ``name`` in front of
    its fakes, in ``workdir``; every one started is stopped when the block ends."""
    haproxy = find_haproxy()
    need(haproxy, MISSING_HAPROXY)
    need(GUIDELLM, MISSING_GUIDELLM)
    assert haproxy is not None
    with router_launcher(haproxy, workdir) as launch:
        def start(name: str = "tgi", replicas: int = 3, **options: Any) -> Router:
            return launch(replicas, TOKEN_DELAY, serving=engine(name), **options)

        yield start


@pytest.fixture
def start_router(tmp_path: Path) -> Iterator[Callable[..., Router]]:
    """:func:`routers` in the test's directory, for the test's length."""
    with routers(tmp_path) as start:
        yield start


# --- one sweep, measured once: synchronous, two constant rates between, throughput -----------------------


@dataclass
class Sweep:
    ran: Ran
    document: dict[str, Any]
    results: Path
    generated_tokens: int


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sweep]:
    workdir = tmp_path_factory.mktemp("sweep")
    with routers(workdir) as start:
        router = start()
        with guidellm_settings():
            ran = bench("--url", f"http://127.0.0.1:{router.port}", "--input-tokens", str(INPUT), "--output-tokens",
                        str(OUTPUT), "--max-requests", str(REQUESTS), "--max-seconds", "30", "--rate-steps", "2",
                        "--results-dir", str(workdir / "results"))
        generated = sum(fake.generated_tokens for fake in router.replicas.values())
    assert ran.code == 0, ran.err
    yield Sweep(ran, json.loads((workdir / "results" / "bench.json").read_text()), workdir / "results", generated)


def test_every_profile_runs_in_order_of_load(sweep):
    profiles = sweep.document["profiles"]

    assert [p["profile"] for p in profiles] == ["synchronous", "constant", "constant", "throughput"]
    low, high = (p["rate"] for p in profiles[1:3])
    assert 0 < low < high
    assert all(p["requests"] == {"successful": REQUESTS, "errored": 0, "incomplete": 0} for p in profiles)


def test_latencies_are_those_of_the_fakes_token_pace(sweep):
    for p in sweep.document["profiles"]:
        ttft, itl, e2e = p["ttft_s"], p["itl_ms"], p["e2e_s"]
        assert 0 < ttft["p50"] <= ttft["p90"] <= ttft["p99"] < e2e["p50"], p
        assert 0.8 * TOKEN_DELAY * 1e3 <= itl["p50"] <= 3 * TOKEN_DELAY * 1e3, p
        assert e2e["p50"] >= (OUTPUT - 1) * TOKEN_DELAY * 0.8, p


def test_load_grows_from_synchronous_to_throughput(sweep):
    rates = [p["requests_per_second"] for p in sweep.document["profiles"]]

    assert 0 < rates[0] < rates[-1]
    # One request at a time: about one per end-to-end latency.
    synchronous = sweep.document["profiles"][0]
    assert rates[0] == pytest.approx(1 / synchronous["e2e_s"]["p50"], rel=0.3)


def test_tokens_counted_are_the_tokens_the_fakes_generated(sweep):
    profiles = sweep.document["profiles"]

    assert sum(p["output_tokens"] for p in profiles) == sweep.generated_tokens == 4 * REQUESTS * OUTPUT
    # The fakes count the prompt's words: the default tokenizer makes prompts of exactly INPUT words.
    assert all(p["input_tokens_mean"] == INPUT and p["output_tokens_mean"] == OUTPUT for p in profiles)
    assert all(p["output_tokens_per_second"] > 0 for p in profiles)


def test_the_table_has_a_row_per_profile_with_each_figure(sweep):
    out = sweep.ran.out

    for header in ("req/s", "TTFT s p50 / p90 / p99", "ITL ms p50 / p90 / p99", "latency s p50 / p90 / p99",
                   "output tok/s", "errors"):
        assert header in out, out
    lines = out.splitlines()
    rows = [line for line in lines if line.startswith(("synchronous", "constant", "throughput"))]
    assert len(rows) == 4, out
    assert f"{INPUT} input and {OUTPUT} output tokens" in out
    assert "layout: unknown" in out and "no prediction" in out
    assert "pred" not in "\n".join(rows)


def test_results_hold_the_json_the_png_and_guidellms_files(sweep):
    assert sweep.document["results"]["json"] == str(sweep.results / "bench.json")
    assert (sweep.results / "bench.png").read_bytes().startswith(PNG)
    assert (sweep.results / "sweep.scenario.json").is_file() and (sweep.results / "sweep.guidellm.json").is_file()
    assert "Starting benchmark" in (sweep.results / "guidellm.log").read_text()
    assert sweep.document["guidellm"] == "0.8.1"
    assert sweep.document["predictions"] is None
    assert all(p["predicted"] is None for p in sweep.document["profiles"])
    assert sweep.document["instances"] == {"count": 1, "source": "assumed: give --instances for a fleet"}


# --- errors, keys, --stack and vLLM --------------------------------------------------------------------------


def test_a_replica_failing_its_generations_is_counted_in_the_throughput_profiles_errors(tmp_path, start_router):
    router = start_router()
    router.replicas["replica-1"].failing.add("/v1/completions")

    with guidellm_settings():
        ran = bench("--url", f"http://127.0.0.1:{router.port}", "--profiles", "throughput", "--max-requests", "6",
                    "--input-tokens", "16", "--output-tokens", "4", "--results-dir", str(tmp_path / "r"),
                    "--output", "json")

    assert ran.code == 0, ran.err
    (profile,) = json.loads(ran.out)["profiles"]
    assert profile["profile"] == "throughput"
    requests = profile["requests"]
    assert requests["errored"] >= 1 and requests["successful"] >= 1
    assert requests["errored"] + requests["successful"] == 6
    # TGI streams a generation error as an event of a 200 answer (the fake's docstring).
    assert GENERATION_ERROR in profile["first_error"]


def test_a_shared_prefix_workload_puts_one_of_the_prefixes_before_every_prompt(tmp_path, start_router):
    # What a prefix cache (engine nxdi) is measured with: guidellm's synthetic prefixes, through the real router.
    router = start_router("nxdi", replicas=1)
    with guidellm_settings():
        ran = bench("--url", f"http://127.0.0.1:{router.port}", "--profiles", "synchronous", "--max-requests", "6",
                    "--input-tokens", "16", "--output-tokens", "4", "--prefix-tokens", "64", "--prefix-count", "2",
                    "--max-seconds", "30", "--results-dir", str(tmp_path / "results"))
    assert ran.code == 0, ran.err
    scenario = json.loads((tmp_path / "results" / "synchronous.scenario.json").read_text())
    [data] = scenario["spec"]["data"]
    assert (data["prompt_tokens"], data["prefix_tokens"], data["prefix_count"]) == (16, 64, 2)
    prompts = [s.prompt for fake in router.replicas.values() for s in fake.served
               if s.path == "/v1/completions" and s.prompt]
    assert len(prompts) >= 6
    # Two prefixes of 64 tokens, each followed by a prompt of 16 of its own.
    heads = {p[:120] for p in prompts}
    assert len(heads) == 2 and len(set(prompts)) == len(prompts)
    document = json.loads((tmp_path / "results" / "bench.json").read_text())
    assert (document["workload"]["prefix_tokens"], document["workload"]["prefix_count"]) == (64, 2)
    assert "after a shared prefix of 64 (2 distinct)" in ran.out


def test_with_stack_the_url_key_and_layout_come_from_its_outputs_and_given_rates_run_at_constant_rate(
        tmp_path, aws_for: Callable[..., AwsEmulator], monkeypatch, start_router):
    key = api_keys.new_key()
    keys_file = tmp_path / "keys"
    keys_file.write_text(api_keys.keys_file_text([api_keys.digest(key)]))
    router = start_router("vllm", 1, api_keys=True, keys_file=str(keys_file),
                   runtime_socket=str(tmp_path / "admin.sock"))
    emulator = aws_for("cloudformation", default_region=REGION)
    outputs = {"EndpointUrl": f"http://127.0.0.1:{router.port}", "Engine": "vllm", "InstanceId": "i-0123456789abcdef0",
               "ApiKeysSecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:k",
               "ServingPlan": json.dumps(LAYOUT)}
    emulator.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps({
        "Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": {k: {"Value": v} for k, v in outputs.items()}}))

    with guidellm_settings():
        monkeypatch.setenv("BENCH_KEY", key)
        ran = bench("--stack", STACK, "--api-key-env", "BENCH_KEY", "--profiles", "constant", "--rate", "10,20",
                    "--max-requests", "3", "--input-tokens", "16", "--output-tokens", "4", "--route", "chat",
                    "--results-dir", str(tmp_path / "r"), "--output", "json")

    assert ran.code == 0, ran.err
    document = json.loads(ran.out)
    assert (document["engine"], document["model"], document["route"]) == ("vllm", SERVED_MODEL, "/v1/chat/completions")
    assert document["layout"] == {**LAYOUT, "engine": "vllm"}
    assert document["layout_source"] == f"stack {STACK}'s ServingPlan output"
    expected = predict(plan_serving(request_from_layout(LAYOUT)), Workload(16, 4))
    assert document["predictions"] == {
        "ttft_s": expected.ttft_s, "itl_batch1_s": expected.itl_batch1_s, "itl_full_batch_s": expected.itl_full_batch_s,
        "e2e_batch1_s": expected.ttft_s + 3 * expected.itl_batch1_s,
        "output_tokens_per_second": expected.tokens_per_second_instance,
        "requests_per_second": expected.requests_per_second_instance}
    assert [(p["profile"], p["rate"], p["requests"]["successful"]) for p in document["profiles"]] == [
        ("constant", 10.0, 3), ("constant", 20.0, 3)]
    # Each constant rate predicted: simulate() of its 3 requests arriving evenly at its measured rate.
    assert document["instances"] == {"count": 1, "source": f"stack {STACK}'s single instance (its InstanceId output)"}
    costs = replica_costs(plan_serving(request_from_layout(LAYOUT)))
    for p in document["profiles"]:
        rate, tokens = p["requests_per_second"], (round(p["input_tokens_mean"]), round(p["output_tokens_mean"]))
        timings = simulate(costs, 1, [Call(k / rate, *tokens) for k in range(3)])
        assert p["predicted"]["arrival_rate"] == rate and p["predicted"]["requests"] == 3
        ttft = sorted(t.ttft_s for t in timings)  # nearest rank of 3: the 2nd, then the 3rd
        assert p["predicted"]["ttft_s"] == {"p50": ttft[1], "p90": ttft[2], "p99": ttft[2]}, p
        assert p["predicted"]["e2e_s"]["p99"] == max(t.e2e_s for t in timings), p
    # The key reached guidellm through its environment, never a file.
    assert not [f for f in (tmp_path / "r").iterdir() if key in f.read_text(errors="replace")]


def test_an_endpoint_that_cannot_be_reached_gets_the_port_forwarding_advice_and_no_load(tmp_path):
    need(GUIDELLM, MISSING_GUIDELLM)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    with guidellm_settings():
        ran = bench("--url", f"http://127.0.0.1:{port}", "--engine", "tgi", "--results-dir", str(tmp_path / "r"))

    assert (ran.code, ran.out) == (1, "")
    assert "Connection refused" in ran.err and "AWS-StartPortForwardingSession" in ran.err
    assert "neuron-serving bench --url http://localhost:8080 --engine tgi" in ran.err
    assert not (tmp_path / "r").exists()


def test_without_guidellm_the_message_says_how_to_install_it(tmp_path):
    ran = bench("--url", "http://127.0.0.1:9", "--guidellm", str(tmp_path / "guidellm"))

    assert ran.code == 1
    assert f"--guidellm '{tmp_path / 'guidellm'}' is not an executable file" in ran.err
    assert "pip install guidellm==0.8.1" in ran.err


# --- options -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["--url", "http://x", "--stack", "S"], "argument --stack: not allowed with argument --url"),
    (["--profiles", "synchronous,sweep"], "'synchronous,sweep' must be a comma-separated list of synchronous, "
                                          "constant, throughput"),
    (["--input-tokens", "0"], "argument --input-tokens: '0' must be a whole number of at least 1"),
    (["--output-stdev", "-1"], "argument --output-stdev: '-1' must be a whole number of at least 0"),
    (["--rate", "2,0"], "argument --rate: '2,0' must be requests per second above 0"),
    (["--input-tokens", "10", "--input-min", "20"], "--input-min (20) <= --input-tokens (10) <= --input-max (none)"),
    (["--rate", "2", "--profiles", "synchronous"], "--rate is the constant profile's, which --profiles "
                                                   "(synchronous) leaves out"),
    (["--profiles", "constant"], "the constant profile needs --rate"),
    (["--stack", "S", "--model", "m"], "--model (the layout) go with --url: with --stack, the stack's ServingPlan"),
    (["--url", "http://x", "--model", "m", "--batch-size", "8"], "--model, --batch-size need --instance-type, "
                                                                 "--tensor-parallel too"),
    (["--tokenizer", "/nonexistent"], "--tokenizer '/nonexistent' is not a tokenizer directory"),
])
def test_a_bad_option_exits_2_naming_it(args, message):
    ran = bench(*args)

    assert ran.code == 2
    assert message in ran.err, ran.err


def test_a_results_directory_holding_files_is_refused(tmp_path):
    (tmp_path / "old.json").write_text("{}")

    ran = bench("--url", "http://x", "--results-dir", str(tmp_path))

    assert ran.code == 2 and "exists and is not an empty directory" in ran.err


# --- the default tokenizer -----------------------------------------------------------------------------------


def test_the_default_tokenizer_knows_every_token_of_guidellms_synthetic_prompts():
    need(GUIDELLM, MISSING_GUIDELLM)
    # guidellm/data/deserializers/synthetic.py: a counter, then Faker's text, cut to the token count
    # and decoded. The tool's own Python, offline, loads the tokenizer as guidellm does.
    script = f"""
import json
from faker import Faker
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained({str(guidellm.DEFAULT_TOKENIZER)!r})
faker = Faker()
faker.seed_instance(7)
ids = tokenizer.encode("120 3 m0 " + " ".join(faker.text(max_nb_chars=2000) for _ in range(100)))
prompt = tokenizer.decode(ids[:500], skip_special_tokens=True)
print(json.dumps([len(ids), ids.count(tokenizer.unk_token_id), len(prompt.split()), len(tokenizer.encode(prompt))]))
"""
    python = GUIDELLM.parent / "python"
    result = subprocess.run([str(python), "-c", script], capture_output=True, text=True, check=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    tokens, unknown, words, again = json.loads(result.stdout.splitlines()[-1])

    assert tokens > 10_000 and unknown == 0
    assert words == again == 500


# --- predictions beside the measured figures (the performance model plugs into _layout_predictions) -----------


PLAN = plan_serving(request_from_layout(LAYOUT))
"""One replica of batch 4 on an inf2.xlarge: prefills of 0.244 s, steps of about 15 ms."""


def measured(profile: str, rate: float | None, requests_per_second: float, *, successful: int = 50) -> Measured:
    """A benchmark of ``successful`` requests of 200 input and 100 output tokens on average."""
    latency = Percentiles(1.5, 1.6, 1.7)
    return Measured(profile, rate, 60.0, successful, 0, 0, requests_per_second, 240.0, 3.0, 199.6, 100.4, 14500,
                    latency, Percentiles(29.0, 30.0, 31.0), latency, None)


def simulated(rate: float | None, count: int, replicas: int, clients: int | None = None) -> dict[str, dict[str, float]]:
    """The percentiles simulate() gives for ``count`` requests of 200 and 100 tokens arriving every
    1 / ``rate`` s (one request without a rate), or from a closed loop of ``clients``, on
    ``replicas`` replicas of PLAN."""
    starts = [0.0] if rate is None else [k / rate for k in range(count)]
    if clients is not None:
        starts = [0.0] * count
    timings = simulate(replica_costs(PLAN), replicas, [Call(start, 200, 100) for start in starts], clients=clients)

    def percentiles(values: list[float]) -> dict[str, float]:
        return {"p50": percentile(values, 50), "p90": percentile(values, 90), "p99": percentile(values, 99)}

    return {"ttft_s": percentiles([t.ttft_s for t in timings]), "e2e_s": percentiles([t.e2e_s for t in timings]),
            "itl_ms": percentiles([(t.e2e_s - t.ttft_s) / 99 * 1e3 for t in timings])}


def test_a_synchronous_profile_is_predicted_as_a_request_alone():
    costs = replica_costs(PLAN)

    predicted = bench_module._predicted(measured("synchronous", None, 0.5), PLAN, 1)

    # Its prefill, then 99 steps of a batch with one busy slot: every percentile the same.
    assert predicted is not None
    expected = {"ttft_s": costs.prefill_s, "itl_ms": costs.step(1) * 1e3, "e2e_s": costs.prefill_s + 99 * costs.step(1)}
    for name, value in expected.items():
        assert predicted[name] == pytest.approx({"p50": value, "p90": value, "p99": value}), name
    assert (predicted["arrival_rate"], predicted["requests"], predicted["utilisation"]) == (None, 1, None)
    assert (predicted["input_tokens"], predicted["output_tokens"], predicted["instances"]) == (200, 100, 1)


def test_a_profile_s_prediction_leaves_the_shared_prefix_unprefilled_where_the_layout_caches_it():
    cached = plan_serving(replace(PLAN.request, prefix_cache_block_size=32))

    predicted = bench_module._predicted(measured("synchronous", None, 0.5), cached, 1, prefix_tokens=160)
    plain = bench_module._predicted(measured("synchronous", None, 0.5), cached, 1)

    # The measured prompts average 200 tokens, of which the 160 of the prefix are cached.
    assert predicted is not None and plain is not None
    costs = replica_costs(cached, workload=Workload(200, 100, prefix_tokens=160))
    assert predicted["ttft_s"]["p50"] == pytest.approx(costs.prefill_s)
    assert predicted["ttft_s"]["p50"] < plain["ttft_s"]["p50"] == pytest.approx(replica_costs(cached).prefill_s)


@pytest.mark.parametrize("instances", [1, 2])
def test_a_constant_profile_is_predicted_by_simulate_at_its_measured_rate_over_the_fleet(instances):
    # 1.4 requests/s measured: 90% of one replica's 1.56 at saturation (the performance model's).
    profile = measured("constant", 1.5, 1.4, successful=40)

    predicted = bench_module._predicted(profile, PLAN, instances)

    assert predicted is not None
    assert {k: predicted[k] for k in ("ttft_s", "itl_ms", "e2e_s")} == simulated(1.4, 40, instances)
    saturation = predict(PLAN, Workload(200, 100)).requests_per_second_instance * instances
    assert predicted["utilisation"] == pytest.approx(1.4 / saturation)
    assert (predicted["arrival_rate"], predicted["requests"], predicted["instances"]) == (1.4, 40, instances)
    # Not a request alone: each shares its steps with the batch and waits for newcomers' prefills.
    alone = simulated(None, 1, 1)
    assert predicted["itl_ms"]["p99"] > 1.1 * alone["itl_ms"]["p99"]
    assert predicted["e2e_s"]["p99"] > 1.1 * alone["e2e_s"]["p99"]


def test_each_prediction_sits_beside_the_figure_it_predicts():
    predictions = bench_module._layout_predictions(PLAN, guidellm.Workload(Tokens(200), Tokens(100)))
    assert predictions is not None
    profiles = [bench_module._profile_document(m, bench_module._predicted(m, PLAN, 2, max_concurrency=8)) for m in (
        measured("synchronous", None, 0.5), measured("constant", 0.5, 0.48), measured("throughput", None, 3.0))]
    out = io.StringIO()
    printer = Printer(stream=out)
    printer.console.width = 400  # a row on one line, as on a wide terminal: the 160 columns of a pipe wrap it
    bench_module._report(printer, {
        "url": "http://x", "engine": "tgi", "route": "/v1/completions", "layout": None, "layout_source": "-",
        "predictions": predictions, "instances": {"count": 2, "source": "--instances"}, "profiles": profiles,
        "results": {"json": "j", "png": "p"},
        "workload": {k: {"mean": 1, "stdev": 0, "minimum": None, "maximum": None}
                     for k in ("input_tokens", "output_tokens")}})

    synchronous, constant, throughput = (p["predicted"] for p in profiles)
    assert synchronous["ttft_s"] == simulated(None, 1, 2)["ttft_s"]
    assert constant["e2e_s"] == simulated(0.48, 50, 2)["e2e_s"]
    # The throughput profile: a closed loop of its concurrency limit, every request sent at once.
    assert throughput["itl_ms"] == simulated(None, 50, 2, clients=8)["itl_ms"]
    assert throughput["ttft_s"] == simulated(None, 50, 2, clients=8)["ttft_s"]
    # At saturation, the fleet's: the performance model's per instance (for the same tokens) times 2.
    assert (throughput["requests_per_second"], throughput["output_tokens_per_second"]) == pytest.approx((
        2 * predictions["requests_per_second"], 2 * predictions["output_tokens_per_second"]))
    assert "requests_per_second" not in constant

    def numbers(p: dict[str, float]) -> str:
        return " / ".join(bench_module._number(p[q]) for q in ("p50", "p90", "p99"))

    text = out.getvalue()
    rows = dict(zip(("synchronous", "constant", "throughput"), (
        line for line in text.splitlines() if line.startswith(("synchronous", "constant", "throughput"))),
        strict=True))
    for row, profile in zip(rows.values(), profiles, strict=True):
        predicted = profile["predicted"]
        assert f"1.5 / 1.6 / 1.7 (pred {numbers(predicted['ttft_s'])})" in row, row
        assert f"29 / 30 / 31 (pred {numbers(predicted['itl_ms'])})" in row, row
        assert f"1.5 / 1.6 / 1.7 (pred {numbers(predicted['e2e_s'])})" in row, row
    assert f"3 (pred {bench_module._number(2 * predictions['requests_per_second'])})" in rows["throughput"]
    assert f"240 (pred {bench_module._number(2 * predictions['output_tokens_per_second'])})" in rows["throughput"]
    assert "pred: the performance model's (neuron_serving.plan.performance) for 2 instances (--instances)" in text
    # 3 requests/s is 96% of the two instances' 3.13 at saturation: no note, which comes from 100%.
    assert throughput["utilisation"] < 1 and "of what the model's fleet completes" not in text


def test_a_rate_beyond_the_fleets_saturation_is_said_so():
    predictions = bench_module._layout_predictions(PLAN, guidellm.Workload(Tokens(200), Tokens(100)))
    profile = bench_module._profile_document(
        measured("constant", 4.0, 3.2), bench_module._predicted(measured("constant", 4.0, 3.2), PLAN, 1))
    out = io.StringIO()
    bench_module._report(Printer(stream=out), {
        "url": "http://x", "engine": "tgi", "route": "/v1/completions", "layout": None, "layout_source": "-",
        "predictions": predictions, "instances": {"count": 1, "source": "assumed"}, "profiles": [profile],
        "results": {"json": "j", "png": "p"},
        "workload": {k: {"mean": 1, "stdev": 0, "minimum": None, "maximum": None}
                     for k in ("input_tokens", "output_tokens")}})

    assert profile["predicted"]["utilisation"] == pytest.approx(3.2 / predictions["requests_per_second"])
    assert ("constant 4/s: 3.2 req/s is 205% of what the model's fleet completes at saturation: its queue grows"
            in out.getvalue())


def test_nothing_is_predicted_without_a_layout_or_a_completed_request():
    assert bench_module._predicted(measured("constant", 1.0, 1.0), None, 1) is None
    assert bench_module._predicted(measured("constant", 1.0, 0.0, successful=0), PLAN, 1) is None


@pytest.mark.parametrize(("flag", "outputs", "expected"), [
    (None, None, (1, "assumed: give --instances for a fleet")),
    (3, None, (3, "--instances")),
    (None, {"InstanceId": "i-1"}, (1, "stack S's single instance (its InstanceId output)")),
    (1, {"InstanceId": "i-1"}, (1, "stack S's single instance (its InstanceId output)")),
    (None, {"AutoScalingGroupName": "g"}, (1, "assumed: stack S's outputs do not count its fleet's instances, give "
                                              "--instances")),
    (4, {"AutoScalingGroupName": "g"}, (4, "--instances")),
])
def test_the_instances_come_from_the_flag_or_a_single_instance_stack_else_one_assumed(flag, outputs, expected):
    stack = StackInfo("S", "CREATE_COMPLETE", "", outputs) if outputs is not None else None
    args = argparse.Namespace(instances=flag)

    fleet = bench_module._fleet(args, Endpoint("http://x", None, None, stack, None))

    assert (fleet.instances, fleet.source) == expected


def test_instances_beyond_one_for_a_single_instance_stack_are_refused():
    stack = StackInfo("S", "CREATE_COMPLETE", "", {"InstanceId": "i-1"})
    with pytest.raises(OpsError, match="--instances 2: stack S is a single instance"):
        bench_module._fleet(argparse.Namespace(instances=2), Endpoint("http://x", None, None, stack, None))


def _url_args(*flags: str) -> Any:
    return main_parser().parse_args(["bench", "--url", "http://127.0.0.1:9", *flags])


def test_with_url_the_layout_flags_plan_the_layout_the_predictions_are_for():
    args = _url_args("--model", "meta-llama/Llama-3.1-8B-Instruct", "--instance-type", "inf2.48xlarge",
                     "--tensor-parallel", "8", "--batch-size", "8", "--sequence-length", "16512")
    plan, source = bench_module._layout(args, Endpoint(args.url, None, None, None, None))
    assert source == "the command's flags"
    assert plan is not None and (plan.degree, len(plan.replicas), plan.batch_size) == (8, 3, 8)
    predictions = bench_module._layout_predictions(plan, guidellm.Workload(Tokens(12000), Tokens(290)))
    assert predictions is not None
    assert predictions["ttft_s"] == pytest.approx(predict(plan, Workload(12000, 290)).ttft_s)


def test_a_shared_prefix_is_predicted_cached_where_the_layout_keeps_a_prefix_cache():
    request = ServingRequest("meta-llama/Meta-Llama-3-8B-Instruct", "inf2.24xlarge", tensor_parallel=2)
    shared = guidellm.Workload(Tokens(72), Tokens(100), prefix_tokens=3000, prefix_count=2)
    cached = bench_module._layout_predictions(plan_serving(replace(request, prefix_cache_block_size=32)), shared)
    plain = bench_module._layout_predictions(plan_serving(request), shared)
    assert cached is not None and plain is not None
    # The prompt is the prefix and its own 72 tokens; the cache holds the prefix's 93 whole blocks.
    assert cached["ttft_s"] == pytest.approx(predict(plan_serving(replace(request, prefix_cache_block_size=32)),
                                                     Workload(3072, 100, prefix_tokens=3000)).ttft_s)
    assert cached["ttft_s"] < 0.3 * plain["ttft_s"]


def test_a_draft_is_counted_in_the_predictions_given_its_acceptance():
    drafted = plan_serving(ServingRequest("meta-llama/Meta-Llama-3-8B-Instruct", "inf2.24xlarge", tensor_parallel=2,
                                          speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B"))
    shared = guidellm.Workload(Tokens(512), Tokens(100))
    counted = bench_module._layout_predictions(drafted, shared, 0.7)
    left_out = bench_module._layout_predictions(drafted, shared)
    assert counted is not None and left_out is not None
    assert counted["itl_batch1_s"] == pytest.approx(predict(drafted, Workload(512, 100, acceptance=0.7)).itl_batch1_s)
    assert counted["itl_batch1_s"] < 0.75 * left_out["itl_batch1_s"]
    profile = measured("synchronous", None, 0.5)
    with_draft = bench_module._predicted(profile, drafted, 1, acceptance=0.7)
    without = bench_module._predicted(profile, drafted, 1)
    assert with_draft is not None and without is not None
    assert with_draft["itl_ms"]["p50"] < 0.75 * without["itl_ms"]["p50"]
    assert with_draft["ttft_s"] == without["ttft_s"]


def test_an_acceptance_outside_0_to_1_is_refused_by_the_flag(capsys):
    with pytest.raises(SystemExit):
        main_parser().parse_args(["bench", "--url", "http://127.0.0.1:9", "--acceptance", "1.5"])
    assert "'1.5' must be a number between 0 and 1 (exclusive)" in capsys.readouterr().err
    assert main_parser().parse_args(["bench", "--url", "http://127.0.0.1:9", "--acceptance", "0.7"]).acceptance == 0.7


def test_layout_flags_that_make_no_layout_are_refused_naming_the_setting():
    args = _url_args("--model", "meta-llama/Llama-3.1-8B-Instruct", "--instance-type", "inf2.48xlarge",
                     "--tensor-parallel", "5")
    with pytest.raises(OpsError, match=r"the layout flags do not make a layout: tensor_parallel \(5\) must be one"):
        bench_module._layout(args, Endpoint(args.url, None, None, None, None))


def test_a_workload_longer_than_the_layouts_sequence_is_refused():
    plan = plan_serving(request_from_layout(LAYOUT))
    with pytest.raises(OpsError, match=r"does not fit the endpoint's layout: input_tokens \(4000\) must be at most"):
        bench_module._layout_predictions(plan, guidellm.Workload(Tokens(4000), Tokens(10)))
