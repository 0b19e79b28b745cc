"""The neuron-serving CLI prints every valid degree, with the performance model's predictions, so a
user can choose before deploying; an objective recommends one."""

import json
import os
import subprocess
import sys

import pytest

from neuron_serving.cli import main
from neuron_serving.plan.instances import INSTANCES

LLAMA_8B = ["plan", "--model", "meta-llama/Meta-Llama-3.1-8B-Instruct", "--instance-type", "inf2.48xlarge"]
HEADER = ["degree", "replicas", "idle", "cores", "GiB/core", "of", "fits", "TTFT", "s", "ITL1", "ms", "ITL", "ms",
          "tok/s", "$/Mtok", "cached"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No test here reaches the Hub: plan says its cache could not be read (tests/ops/test_plan_hub_cache.py
    reads it from the fake Hub)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def _rows(out: str) -> dict[int, list[str]]:
    return {int(line.split()[0]): line.split() for line in out.splitlines() if line.split()[0].isdigit()}


def test_plan_lists_every_allowed_degree_with_replicas_memory_and_fit(capsys):
    assert main(["plan", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--instance-type", "inf2.48xlarge"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("meta-llama/Llama-3.1-70B-Instruct on inf2.48xlarge (about $12.98/h on demand)")
    assert lines[1].startswith("predicted for 512 input and 256 output tokens per request")
    assert lines[2].split() == HEADER
    rows = _rows("\n".join(lines))
    assert sorted(rows) == list(range(2, 25, 2))
    assert rows[8][1] == "3" and rows[8][5] == "no"
    assert rows[24][1] == "1" and rows[24][5] == "yes"
    assert any(line.startswith("default (smallest degree that fits): 12 -> replica-0: neuron0-5") for line in lines)


def test_plan_with_int8_weights_fits_a_70b_model_on_half_the_cores_and_only_with_nxdi(capsys):
    assert main(["plan", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--instance-type", "inf2.48xlarge",
                 "--engine", "nxdi", "--quantization", "int8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(", bf16 with int8 weights")
    rows = _rows("\n".join(lines))
    assert (rows[4][5], rows[6][5]) == ("no", "yes")
    assert any(line.startswith("default (smallest degree that fits): 6 -> replica-0: neuron0-2") for line in lines)
    assert main(["plan", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--quantization", "int8"]) == 2
    assert "quantization ('int8') is not made by engine tgi; engine nxdi makes it" in capsys.readouterr().err


def test_plan_predicts_every_fitting_degree_and_leaves_the_others_blank(capsys):
    assert main(["plan", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--instance-type", "inf2.48xlarge"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows[8][6:11] == ["-"] * 5
    ttft, itl1, itl, tokens, usd = map(float, rows[12][6:11])
    assert 0 < ttft < 10 and 0 < itl1 <= itl < 1000 and tokens > 0 and usd > 0


def test_plan_on_trainium_lists_only_runtime_topologies(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--instance-type", "trn1.32xlarge", "--batch-size", "32"]) == 0
    assert sorted(_rows(capsys.readouterr().out)) == [2, 8, 16, 32]


def test_latency_and_cost_objectives_recommend_different_layouts_with_their_reasons(capsys):
    recommended = []
    for objective in ("latency", "cost"):
        assert main([*LLAMA_8B, "--objective", objective]) == 0
        lines = capsys.readouterr().out.splitlines()
        line, layout = (next(x for x in lines if x.startswith(start)) for start in ("recommended: ", "layout: "))
        assert line.startswith("recommended: degree ")
        assert layout.startswith("layout: replica-0: ")
        recommended.append(line)
    latency, cost = recommended
    assert latency.startswith("recommended: degree 24 (1 replica), batch 1, sequence 1024: an inter-token latency at "
                              "full batch of ")
    assert cost.startswith("recommended: degree 2 (12 replicas), batch 48, sequence 1024: the lowest price per million "
                           "output tokens, $")


def test_a_limit_lists_the_degrees_it_rules_out(capsys):
    fixed = ["--batch-size", "4", "--sequence-length", "4096"]
    assert main([*LLAMA_8B, *fixed, "--objective", "cost", "--max-itl-ms", "30"]) == 0
    out = capsys.readouterr().out
    slow = [degree for degree, row in _rows(out).items() if float(row[8]) > 30]
    ruled_out = [line for line in out.splitlines() if line.startswith("ruled out: ")]
    assert slow and [line.split()[3].rstrip(",") for line in ruled_out] == [str(degree) for degree in slow]
    assert all(": misses max_itl_ms (30): " in line for line in ruled_out)
    assert f"recommended: degree {slow[-1]} " not in out


def test_the_workload_options_change_the_predictions(capsys):
    assert main([*LLAMA_8B, "--output-tokens", "64"]) == 0
    short = float(_rows(capsys.readouterr().out)[8][9])
    assert main([*LLAMA_8B, "--output-tokens", "1024"]) == 0
    long = float(_rows(capsys.readouterr().out)[8][9])
    assert short < long


def test_json_output_is_one_document_with_request_options_predictions_and_recommendation(capsys):
    assert main([*LLAMA_8B, "--objective", "cost", "--max-itl-ms", "30", "--input-tokens", "1000",
                 "--batch-size", "4", "--sequence-length", "4096", "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["request"]["instance_type"] == "inf2.48xlarge"
    assert document["workload"] == {"input_tokens": 1000, "output_tokens": 256, "prefix_tokens": 0, "acceptance": None,
                                    "trace": None}
    assert document["objective"] == "cost"
    assert document["constraints"] == {"max_itl_ms": 30.0, "max_ttft_ms": None, "min_tokens_per_second": None}
    assert [d["degree"] for d in document["degrees"]] == list(range(2, 25, 2))
    assert set(document["degrees"][0]["prediction"]) == {
        "degree", "replicas", "ttft_s", "itl_batch1_s", "itl_full_batch_s", "tokens_per_second_replica",
        "tokens_per_second_instance", "requests_per_second_instance", "usd_per_million_tokens"}
    fast = [d for d in document["degrees"] if d["prediction"]["itl_full_batch_s"] <= 0.030]
    assert [r["layout"] for r in document["rejected"]] == [
        f"degree {d['degree']}, batch 4, sequence 4096" for d in document["degrees"] if d not in fast]
    cheapest = min(fast, key=lambda d: d["prediction"]["usd_per_million_tokens"])
    assert document["recommendation"]["degree"] == cheapest["degree"]
    assert document["recommendation"]["prediction"] == cheapest["prediction"]
    assert document["recommendation"]["reason"].startswith("the lowest price per million output tokens")
    assert document["no_layout"] is None


def test_json_output_without_an_objective_recommends_the_default_layout(capsys):
    assert main([*LLAMA_8B, "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["objective"] is None
    assert document["recommendation"]["degree"] == 2


def test_any_instance_type_with_the_cost_objective_compares_every_instance_type(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--instance-type", "any", "--objective", "cost"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].split()[:4] == ["instance", "type", "$/h", "degree"]
    assert ("recommended: inf2.xlarge, degree 2 (1 replica), batch 48, sequence 1024: the best of the 7 instance "
            "types") in out
    assert ("note: instance_type ('inf2.xlarge') has 16 GiB of host memory; exporting llama-3.1-8b (8.0 B parameters) "
            "needs about 34 GiB") in out


def test_an_unknown_objective_exits_2_naming_the_allowed_ones(capsys):
    with pytest.raises(SystemExit) as exited:
        main([*LLAMA_8B, "--objective", "fast"])
    assert exited.value.code == 2
    assert "argument --objective: invalid choice: 'fast' (choose from 'latency', 'throughput', 'cost', 'goodput')" in (
        capsys.readouterr().err)


@pytest.mark.parametrize(("arguments", "message"), [
    (["--objective", "cost", "--max-itl-ms", "-3"], "max_itl_ms (-3.0) must be a positive number"),
    (["--max-ttft-ms", "500"], "max_ttft_ms (500.0) needs --objective"),
    (["--input-tokens", "0"], "input_tokens (0) must be an integer of at least 1"),
    (["--output-tokens", "4000"], "output_tokens (4000) plus input_tokens (512) must be at most sequence_length"),
    (["--objective", "latency", "--max-itl-ms", "5"], "max_itl_ms (5.0) cannot be met on inf2.48xlarge"),
])
def test_bad_plan_input_exits_2_naming_it(capsys, arguments, message):
    assert main([*LLAMA_8B, *arguments]) == 2
    assert message in capsys.readouterr().err


def test_any_instance_type_needs_an_objective(capsys):
    assert main(["plan", "--instance-type", "any"]) == 2
    assert "instance_type ('any') needs --objective" in capsys.readouterr().err


def test_plan_reports_a_model_that_fits_nowhere(capsys):
    assert main(["plan", "--model", "llama-3-8b", "--instance-type", "inf2.8xlarge", "--batch-size", "64",
                 "--sequence-length", "8192"]) == 0
    assert "no layout: model_id ('llama-3-8b') fits at no tensor_parallel degree" in capsys.readouterr().out


def test_plan_with_a_bad_setting_exits_2_naming_it(capsys):
    assert main(["plan", "--instance-type", "g5.xlarge"]) == 2
    assert "instance_type ('g5.xlarge') is not a supported Neuron instance type" in capsys.readouterr().err


def test_the_console_script_is_installed_and_does_not_start_the_cdk_runtime_nor_import_boto3():
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from neuron_serving.cli import main; main(['plan']); "
         "print('jsii' in sys.modules, 'aws_cdk' in sys.modules, 'boto3' in sys.modules)"],
        capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.stdout.splitlines()[-1] == "False False False"


def test_json_output_of_any_instance_type_compares_them_all_in_the_ops_commands_format(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--instance-type", "any", "--objective", "cost",
                 "--output", "json"]) == 0
    out = capsys.readouterr().out
    document = json.loads(out)
    # Written as every operator command writes its document (ops/output.Printer), so one parser reads them all.
    assert out == json.dumps(document, indent=2, sort_keys=True) + "\n"
    compared = [entry["instance_type"] for entry in document["instance_types"]]
    ruled_out = [entry["instance_type"] for entry in document["ruled_out"]]
    assert len(compared) == 7 and sorted(compared + ruled_out) == sorted(INSTANCES)
    assert document["recommendation"]["instance_type"] == "inf2.xlarge"
    assert "needs about 34 GiB" in document["recommendation"]["cannot_compile"]


def test_cost_chooses_the_batch_and_sequence_too_unless_they_are_given(capsys):
    assert main([*LLAMA_8B, "--objective", "cost", "--output", "json"]) == 0
    chosen = json.loads(capsys.readouterr().out)["recommendation"]
    assert chosen["batch_size"] > 4 and chosen["sequence_length"] < 4096
    assert main([*LLAMA_8B, "--objective", "cost", "--batch-size", "4", "--output", "json"]) == 0
    fixed = json.loads(capsys.readouterr().out)["recommendation"]
    assert fixed["batch_size"] == 4
    assert chosen["prediction"]["usd_per_million_tokens"] < fixed["prediction"]["usd_per_million_tokens"]


def test_goodput_prints_the_fleet_its_percentiles_and_utilisation(capsys):
    assert main([*LLAMA_8B, "--objective", "goodput", "--rate", "4", "--p99-ttft-ms", "1500",
                 "--p99-itl-ms", "60"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("recommended: "))
    assert "1 instance of inf2.48xlarge" in line and "predicted p99 TTFT" in line and "utilisation" in line
    assert main([*LLAMA_8B, "--objective", "goodput", "--rate", "4", "--p99-ttft-ms", "1500", "--output", "json"]) == 0
    load = json.loads(capsys.readouterr().out)["recommendation"]["load"]
    assert load["rate"] == 4.0 and load["ttft_p99_s"] <= 1.5 and 0 < load["utilisation"] < 1


@pytest.mark.parametrize(("arguments", "message"), [
    (["--objective", "goodput"], "rate (None) is needed by --objective goodput"),
    (["--objective", "cost", "--p99-ttft-ms", "300"], "p99_ttft_ms (300.0) applies only with --objective goodput"),
    (["--objective", "goodput", "--rate", "2", "--p99-ttft-ms", "10"], "rate (2.0) cannot be served as asked"),
])
def test_bad_goodput_input_exits_2_naming_it(capsys, arguments, message):
    assert main([*LLAMA_8B, *arguments]) == 2
    assert message in capsys.readouterr().err


def _trace_file(tmp_path, lines: list[dict]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_goodput_replays_a_trace_s_own_arrivals_at_its_own_rate(tmp_path, capsys):
    lines = [{"start": k * 0.25, "input_tokens": 200 + k % 7 * 100, "output_tokens": 60 + k % 5 * 30}
             for k in range(400)]
    trace = _trace_file(tmp_path, lines)
    assert main([*LLAMA_8B, "--objective", "goodput", "--trace", trace, "--p99-ttft-ms", "1500", "--output",
                 "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    load = document["recommendation"]["load"]
    assert load["rate"] == pytest.approx(4.0)  # 399 gaps over 99.75 s
    assert document["workload"]["trace"] == {"requests": 400, "replayed": True}
    # The shapes hold the largest request: 800 prompt and 180 output tokens.
    assert (document["workload"]["input_tokens"], document["workload"]["output_tokens"]) == (800, 180)
    assert load["ttft_p99_s"] <= 1.5


def test_goodput_with_a_trace_keeps_the_prefix_and_the_draft_s_acceptance(tmp_path, capsys):
    trace = _trace_file(tmp_path, [{"input_tokens": 300, "output_tokens": 100},
                                   {"input_tokens": 2000, "output_tokens": 200}])
    drafted = ["plan", "--model", "meta-llama/Meta-Llama-3-8B-Instruct", "--instance-type", "inf2.24xlarge",
               "--engine", "nxdi", "--speculative-model", "yuhuili/EAGLE-LLaMA3-Instruct-8B", "--objective",
               "goodput", "--trace", trace, "--rate", "2", "--output", "json"]
    assert main([*drafted, "--acceptance", "0.7"]) == 0
    accepted = json.loads(capsys.readouterr().out)
    assert main(drafted) == 0
    plain = json.loads(capsys.readouterr().out)
    # The trace's largest request (2000 and 200 tokens) carries the flags' acceptance into the load prediction.
    assert accepted["workload"] == {"input_tokens": 2000, "output_tokens": 200, "prefix_tokens": 0,
                                    "acceptance": 0.7, "trace": {"requests": 2000, "replayed": False}}
    assert accepted["recommendation"]["load"]["itl_p99_s"] < plain["recommendation"]["load"]["itl_p99_s"]


def test_goodput_takes_a_trace_s_requests_in_turn_at_the_rate_without_starts(tmp_path, capsys):
    trace = _trace_file(tmp_path, [{"input_tokens": 300, "output_tokens": 100},
                                   {"input_tokens": 2000, "output_tokens": 200}])
    assert main([*LLAMA_8B, "--objective", "goodput", "--trace", trace, "--rate", "3", "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["workload"]["trace"] == {"requests": 2000, "replayed": False}
    assert document["recommendation"]["load"]["rate"] == 3.0
    # The price per token counts the mean output, 150 tokens.
    load = document["recommendation"]["load"]
    assert load["usd_per_million_tokens"] == pytest.approx(load["usd_per_hour"] / (3 * 150 * 3600) * 1e6)


@pytest.mark.parametrize(("lines", "arguments", "message"), [
    (["{nope"], ["--rate", "2"], "line 1 is not JSON"),
    ([{"input_tokens": 0, "output_tokens": 5}], ["--rate", "2"],
     "line 1 needs input_tokens and output_tokens, integers of at least 1"),
    ([{"start": 0, "input_tokens": 5, "output_tokens": 5}, {"input_tokens": 5, "output_tokens": 5}], ["--rate", "2"],
     "gives start on some lines only"),
    ([{"start": 0, "input_tokens": 5, "output_tokens": 5}, {"start": 1, "input_tokens": 5, "output_tokens": 5}],
     ["--rate", "2"], "rate (2.0) cannot be combined with a trace"),
    ([{"input_tokens": 5, "output_tokens": 5}], [], "rate (None) is needed by --objective goodput with a trace"),
])
def test_a_bad_trace_exits_2_naming_its_line(tmp_path, capsys, lines, arguments, message):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    assert main([*LLAMA_8B, "--objective", "goodput", "--trace", str(path), *arguments]) == 2
    assert message in capsys.readouterr().err


def test_a_trace_needs_the_goodput_objective(tmp_path, capsys):
    trace = _trace_file(tmp_path, [{"input_tokens": 300, "output_tokens": 100}])
    assert main([*LLAMA_8B, "--objective", "cost", "--trace", trace]) == 2
    assert "applies only with --objective goodput" in capsys.readouterr().err


# -- time to serve ------------------------------------------------------------------------------------

def _time_rows(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("time to serve, predicted"))
    rows = {}
    for line in lines[start + 1:]:
        if line.startswith("first deploy when"):
            break
        rows[line.split()[0]] = line.split()[1:]
    return rows


def test_plan_predicts_the_time_to_serve_phase_by_phase_for_each_way_to_start(capsys):
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "time to serve, predicted (root volume 341 MiB/s):" in out
    rows = _time_rows(out)
    assert rows["minutes"] == ["first-deploy", "cache-hit", "warm-pool"]
    assert rows["checkpoint"] == ["1.7", "-", "-"] and rows["download"] == ["-", "0.7", "-"]
    assert rows["start"] == ["-", "-", "1.0"] and rows["pull"][2] == "-"
    first, cached, warm = map(float, rows["total"])
    assert first == pytest.approx(sum(float(r[0]) for k, r in rows.items() if k not in ("minutes", "total")
                                      and r[0] != "-"), abs=0.3)
    assert warm < cached < first
    assert "first deploy when the public compile cache misses: 62.9" in out
    assert "each figure and its source: docs/time-to-serve.md" in out


def test_plan_json_has_the_time_to_serve_of_the_chosen_layout(capsys):
    assert main([*LLAMA_8B, "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)["recommendation"]["time_to_serve"]
    assert document["throughput"] == 341
    assert set(document["scenarios"]) == {"first deploy", "first deploy, full compile", "cache hit", "warm pool"}
    warm = document["scenarios"]["warm pool"]
    assert set(warm["phases"]) == {"start", "services", "read", "load", "warm-up"}
    assert warm["total"] == pytest.approx(sum(warm["phases"].values()), abs=0.3)


def test_plan_with_the_vllm_engine_chooses_only_batches_vllm_serves(capsys):
    # optimum-neuron 0.4.5's vLLM serves continuous batching only, batch 2 and above (Engine.min_batch_size).
    assert main(["plan", "--engine", "vllm", "--objective", "latency", "--no-hub-cache", "--output", "json"]) == 0
    chosen = json.loads(capsys.readouterr().out)["recommendation"]
    assert chosen["batch_size"] >= 2
    assert main(["plan", "--engine", "vllm", "--batch-size", "1", "--no-hub-cache"]) == 2
    assert "batch_size (1) must be at least 2 with --engine vllm" in capsys.readouterr().err


def test_plan_with_an_eagle_draft_counts_its_memory_and_only_with_nxdi(capsys):
    base = ["plan", "--model", "meta-llama/Meta-Llama-3-8B-Instruct", "--instance-type", "inf2.24xlarge",
            "--no-hub-cache"]
    assert main([*base, "--engine", "nxdi"]) == 0
    plain = _rows(capsys.readouterr().out)
    assert main([*base, "--engine", "nxdi", "--speculative-model", "yuhuili/EAGLE-LLaMA3-Instruct-8B",
                 "--speculative-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(", drafted by yuhuili/EAGLE-LLaMA3-Instruct-8B (up to 4 tokens a step)")
    drafted = _rows(out)
    # Degree 2: about 1.5 GiB more on each core (the draft's layer, embeddings, LM head, fc and one layer of KV,
    # and the 20% overhead on them).
    assert 1.3 < float(drafted[2][3]) - float(plain[2][3]) < 1.7
    assert main([*base, "--speculative-model", "yuhuili/EAGLE-LLaMA3-Instruct-8B"]) == 2
    assert "speculative_model ('yuhuili/EAGLE-LLaMA3-Instruct-8B') is not served by engine tgi; engine nxdi serves " \
        "it" in capsys.readouterr().err


def test_plan_predicts_a_cached_prefixs_first_token_and_an_accepted_drafts_tokens_when_told(capsys):
    base = ["plan", "--model", "meta-llama/Meta-Llama-3-8B-Instruct", "--instance-type", "inf2.24xlarge",
            "--engine", "nxdi", "--no-hub-cache", "--input-tokens", "3072"]
    assert main(base) == 0
    plain = _rows(capsys.readouterr().out)
    assert main([*base, "--prefix-cache-block-size", "32", "--prefix-tokens", "3000"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("predicted for 3072 input and 256 output tokens per request, 3000 of them "
                                          "a cached prefix (")
    cached = _rows(out)
    # TTFT (column 6): 1120 of 4096 padded tokens prefilled; ITL (7, 8) as before.
    assert 0.25 < float(cached[2][6]) / float(plain[2][6]) < 0.3 and cached[2][7:9] == plain[2][7:9]
    draft = ["--speculative-model", "yuhuili/EAGLE-LLaMA3-Instruct-8B"]
    assert main([*base, *draft]) == 0
    assert ", speculation left out (no --acceptance) (" in capsys.readouterr().out.splitlines()[1]
    assert main([*base, *draft, "--acceptance", "0.7"]) == 0
    drafted = _rows(capsys.readouterr().out)
    assert float(drafted[2][7]) < 0.6 * float(plain[2][7])
    assert main([*base, "--acceptance", "0.7"]) == 2
    assert "acceptance (0.7) applies only with --speculative-model" in capsys.readouterr().err
    assert main([*base, "--prefix-tokens", "100"]) == 2
    assert "prefix_tokens (100) applies only with --prefix-cache-block-size" in capsys.readouterr().err
