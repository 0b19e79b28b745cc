"""Benchmarks of the serving path on this machine: the real router (Debian's HAProxy running the
config that ``neuron_serving.render.router`` renders) in front of fake replicas that batch
continuously like TGI Neuron (:mod:`benchmarks.batching_replica`), whose batching decisions and
costs are the planner's own model (:mod:`neuron_serving.plan.queueing`).

``python -m benchmarks`` runs every scenario in about seven minutes on two cores, writes
``benchmarks/results/figures.json`` and three plots next to it, and prints its targets with PASS or
MISS. Each figure is a ratio measured within the run:

- overhead: a request's time to first token (TTFT) and inter-token latency (ITL), p50 and p99,
  through the router over straight to the replica, with 1 and 64 streams;
- mixed: p99 TTFT and end-to-end latency of 80% chat and 20% 8k-token prompts at 70% of the
  capacity of 6 replicas of batch 4, with the shipped router over round robin, replaying one
  trace against both (``--mixed-requests`` and ``--seeds`` replay longer traces, or several,
  pooled: a p99 of 450 requests moves a lot from one trace to the next); each router's p99s over
  the floor (each request alone on an idle replica, which no router beats); and the planner's
  prediction of the same traces (``neuron_serving.plan.queueing.simulate`` with the fakes' costs)
  over the shipped router's measurement, whose targets are within 20% of 1. Issue 12's targets
  for this scenario (0.3 and 0.8 of round robin) are withdrawn, being below the floor, and
  reported without a verdict;
- failover: requests lost when a replica is killed under load, against those in flight on it,
  and seconds until the router marks it down and until the restarted replica takes traffic;
- overload: what clients get while every replica answers TGI's overloaded error;
- layouts: on one instance, the layout the planner's ``goodput`` objective picks against the
  default layout (degree 2, 6 replicas of batch 4), each with fakes of the planner's costs for it
  (``performance.replica_costs``), on one trace of the mixed workload with 3072-token long prompts
  (the longest the default layout takes) at 70% of the default layout's capacity: p99 TTFT and
  end-to-end of each through the shipped router, the goodput layout's over the default's (target:
  below 1), and the planner's prediction of each over the measurement (within 20% of 1).

Round robin, the baseline, is the shipped config with ``balance roundrobin`` and each replica
sent up to TGI's ``MAX_CONCURRENT_REQUESTS`` (128) at once, so that requests queue inside the
replicas in the order they were dealt: a router that knows nothing of the replicas' load.

These are benchmarks, not tests: timings depend on the machine. ``tests/benchmarks`` runs the
same code at a tiny scale so that it keeps working.
"""
