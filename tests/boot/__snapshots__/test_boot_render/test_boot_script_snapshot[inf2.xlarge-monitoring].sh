#!/bin/bash
# cdk-neuron-serving boot (userdata/bootstrap.sh.j2); logs in /var/log/neuron-serving
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
PATH=$PATH:/snap/bin
logs=$R/var/log/neuron-serving
env_file=$R/etc/neuron-serving/stack.env
mkdir -p "$logs" "${env_file%/*}"
exec > >(tee -a "$logs/boot.log") 2>&1
step=bundle why=
cat >"$env_file" <<'EOF'
STACK_REGION=us-east-1
STACK_NAME=NeuronLlamaStack
HOST_RESOURCE=ExportBuilderHost6094748D
BUNDLE=s3://cdk-hnb659fds-assets-123456789012-us-east-1/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.zip
EOF
. "$R/etc/neuron-serving/stack.env"
cfn() { aws cloudformation "$1" --region "$STACK_REGION" --stack-name "$STACK_NAME" --logical-resource-id "$2" "${@:3}"; }
on_exit() {
  local rc=$?
  [ $rc = 0 ] && return
  echo "failed $step" >"$logs/status"
  echo "neuron-serving: failed in step $step: ${why:=exit $rc}" | tee -a "$R/dev/console"
  [ -z "${SIGNAL_RESOURCE:-}" ] || cfn signal-resource "$SIGNAL_RESOURCE" --status FAILURE --unique-id \
    "$(echo -n "$(cloud-init query v1.instance_id) $step: $why" | tr -cs '[:alnum:] ._:/()=,+-' ' ' | head -c 64)"
}
trap on_exit EXIT
trap 'why="exit $? at line $LINENO: $BASH_COMMAND"' ERR
die() { why=$*; exit 1; }
command -v aws >/dev/null || snap install aws-cli --classic || die "no AWS CLI, and snap could not install one"
b=$(mktemp -d)
cd "$b"
cfn describe-stack-resource "$HOST_RESOURCE" --query StackResourceDetail.Metadata --output text >m ||
  die "cannot read the stack's values (DescribeStackResource $HOST_RESOURCE)"
python3 -c 'import json,sys;sys.stdout.write(json.load(sys.stdin)["NeuronServing"])' <m >>"$env_file"
. "$R/etc/neuron-serving/stack.env"
aws s3 cp --region "$STACK_REGION" --only-show-errors "$BUNDLE" z || die "cannot download the boot bundle $BUNDLE"
python3 -m zipfile -e z f && cd f && sha256sum -c --quiet <<<"59cab25c52da2a0a6181f16b5524a87a19d8da0d664c6ed4f2442464b4e9a66d  MANIFEST" && sha256sum -c --quiet MANIFEST ||
  die "the boot bundle $BUNDLE is not the stack's: a checksum differs"
. "./opt/neuron-serving/bin/boot-steps"
# ==> metadata NeuronServing <==
# ==> /etc/haproxy/haproxy.cfg.new <==
<left out>
# ==> /etc/logrotate.d/neuron-serving-metrics <==
# The publisher appends to its EMF file for as long as the host runs (with API keys, each failed run
# of api-keys sync to its own); the CloudWatch agent has shipped them by the time they rotate (the
# agent follows a truncated file from its start). One entry may name several files, as the httpd
# entry of logrotate(8)'s sample configuration does (logrotate/logrotate 3.19.0, Ubuntu 22.04's,
# logrotate.8.in).
/var/log/neuron-serving/metrics.emf {
    daily
    rotate 1
    compress
    copytruncate
    missingok
    notifempty
}
# ==> /etc/neuron-serving/bundle.env <==
IMAGE=ghcr.io/huggingface/text-generation-inference:3.3.5-neuron
SERVICE=NeuronLlamaStack
METRICS_NAMESPACE=NeuronServing
LOG_GROUP_BOOT='NeuronLlamaStack-BootLogs#1'
LOG_GROUP_REPLICAS=/neuron-serving/NeuronLlamaStack/replicas
LOG_GROUP_ROUTER=/neuron-serving/NeuronLlamaStack/router
LOG_GROUP_METRICS=/neuron-serving/NeuronLlamaStack/metrics
# ==> /etc/neuron-serving/cloudwatch-agent.json.in <==
{"agent":{"run_as_user":"root"},"logs":{"logs_collected":{"files":{"collect_list":[{"file_path":"/var/log/neuron-serving/boot.log","log_group_name":"@LOG_GROUP_BOOT@","log_stream_name":"{instance_id}/boot"},{"file_path":"/var/log/neuron-serving/export.log","log_group_name":"@LOG_GROUP_BOOT@","log_stream_name":"{instance_id}/export"},{"file_path":"/var/log/neuron-serving/ready.log","log_group_name":"@LOG_GROUP_BOOT@","log_stream_name":"{instance_id}/ready"},{"file_path":"/var/log/haproxy.log","log_group_name":"@LOG_GROUP_ROUTER@","log_stream_name":"{instance_id}"},{"file_path":"/var/log/neuron-serving/metrics.emf","log_group_name":"@LOG_GROUP_METRICS@","log_stream_name":"{instance_id}"}]}}}}
# ==> /etc/neuron-serving/metrics.json <==
{"disk_path":"/","interval_seconds":60,"metrics":{"BatchSize":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"CpuUtilization":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Percent"},"DiskUtilization":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Percent"},"EccCorrectedEvents":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Count"},"EccUncorrectedEvents":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Count"},"ExecutionErrors":{"dimensions":[["Service","ErrorType"],["Service","InstanceId","ErrorType"]],"unit":"Count"},"ExecutionLatency":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Seconds"},"ExecutionLatencyP99":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Seconds"},"GeneratedTokens":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"Hosts":{"dimensions":[["Service","InstanceType"],["Service","AvailabilityZone"],["Service","Capacity"]],"unit":"Count"},"InFlightRequests":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"MemoryUtilization":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Percent"},"NeuronCoreUtilization":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Percent"},"NeuronDeviceMemoryUsed":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Bytes"},"QueueDuration":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Seconds"},"QueueSize":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"ReplicasUp":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Count"},"RequestDuration":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Seconds"},"RequestFailures":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"Requests":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"RouterQueue":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Count"},"TimePerOutputToken":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Seconds"},"UnauthorizedRequests":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Count"}},"namespace":"NeuronServing","neuron_monitor":["/opt/aws/neuron/bin/neuron-monitor","-c","/etc/neuron-serving/neuron-monitor.json"],"output":"/var/log/neuron-serving/metrics.emf","replica_metrics":{"counters":{"GeneratedTokens":[{"labels":{},"name":"tgi_request_generated_tokens_sum"}],"RequestFailures":[{"labels":{},"name":"tgi_request_failure"}],"Requests":[{"labels":{},"name":"tgi_request_count"}]},"histograms":{"QueueDuration":"tgi_request_queue_duration","RequestDuration":"tgi_request_duration","TimePerOutputToken":"tgi_request_mean_time_per_token_duration"},"queued":[{"labels":{},"name":"tgi_queue_size"}],"running":[{"labels":{},"name":"tgi_batch_current_size"}]},"replicas":[{"name":"replica-0","port":8081}],"router_backend":"replicas","router_frontend":"router","router_metrics_url":"http://127.0.0.1:8404/metrics"}
# ==> /etc/neuron-serving/neuron-monitor.json <==
{"neuron_runtimes":[{"metrics":[{"type":"neuroncore_counters"},{"type":"memory_used"},{"type":"neuron_runtime_vcpu_usage"},{"type":"execution_stats"}],"tag_filter":"^replica-"}],"period":"60s","system_metrics":[{"type":"vcpu_usage"},{"type":"memory_info"},{"type":"neuron_hw_counters"}]}
# ==> /etc/neuron-serving/replica.env <==
MODEL_ID=/models/v4-tgi-llama-3-2-1b-instruct-tp2-b4-s4096-bf16-d50f7d6bc398d78d
HF_NUM_CORES=2
HF_AUTO_CAST_TYPE=bf16
MAX_BATCH_SIZE=4
MAX_TOTAL_TOKENS=4096
MAX_INPUT_TOKENS=3072
MAX_BATCH_PREFILL_TOKENS=12288
MAX_CONCURRENT_REQUESTS=128
HF_HUB_OFFLINE=1
USAGE_STATS=off
# ==> /etc/neuron-serving/replicas.table <==
0 8081 0
# ==> /etc/systemd/system/neuron-replica@.service <==
# TGI replica %i. Enabled: a crash or a reboot brings it back without a new export.
[Unit]
Description=TGI Neuron replica %i
Requires=docker.service
After=docker.service network-online.target
Wants=network-online.target
StartLimitIntervalSec=0

[Service]
# After an interrupted export, the first start redoes it: 30 to 60+ minutes.
TimeoutStartSec=infinity
# The AWS CLI that the scripts call is a snap (/snap/bin) or AWS's installer's
# (/usr/local/bin); systemd gives services /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin, without
# /snap/bin (systemd.exec(5), systemd 252 and 255, "Environment Variables in Spawned Processes", $PATH).
Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/snap/bin
ExecStartPre=/opt/neuron-serving/bin/export-model
ExecStartPre=-/usr/bin/env docker rm -f replica-%i
ExecStart=/opt/neuron-serving/bin/run-replica %i
ExecStop=/usr/bin/env docker stop -t 30 replica-%i
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
# ==> /etc/systemd/system/neuron-serving-metrics.service <==
# Publishes the host's metrics (userdata/publish_metrics.py): it runs neuron-monitor, scrapes the
# replicas and the router, and appends EMF lines that the CloudWatch agent ships. Enabled, so it
# also runs after a reboot or a start from the warm pool.
[Unit]
Description=Publish the Neuron serving metrics
After=network-online.target docker.service
Wants=network-online.target
StartLimitIntervalSec=0

[Service]
# SERVICE (stack.env) and INSTANCE_ID (host.env), the values of the Service and InstanceId
# dimensions. systemd reads the shell-quoted values of stack.env as the shell does.
EnvironmentFile=/etc/neuron-serving/stack.env
EnvironmentFile=/etc/neuron-serving/host.env
ExecStart=/usr/bin/env python3 /opt/neuron-serving/bin/publish-metrics /etc/neuron-serving/metrics.json
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
# ==> /opt/neuron-serving/bin/boot-steps <==
# The boot's steps for meta-llama/Llama-3.2-1B-Instruct on inf2.xlarge (1 replica of tensor_parallel 2, batch_size 4, sequence_length 4096), bf16
# Sourced by the boot script (userdata/bootstrap.sh.j2) from the bundle's directory once it has
# checked the bundle: they run in its shell, with its R, logs, step, why and b (the bundle's
# temporary directory), its stack.env values and its EXIT trap until they set their own. How the boot ends (run_step, signal, on_exit) is here too, to keep the
# user data small.
# shellcheck shell=bash
# The bundle's files: each replaces its old copy at once (a rename); those starting with #! are
# executable.
while read -r _ p; do
  [ "$(head -c 2 "$p")" = '#!' ] && m=755 || m=644
  install -D -m $m "$p" "$R/$p.new"
  mv -f "$R/$p.new" "$R/$p"
done <MANIFEST
cd /
rm -rf "$b"
step=start
# The stack's values known at synth, with the deploy-time ones the user data wrote: every file
# that reads stack.env (the scripts, systemd's EnvironmentFile) finds them all in one place.
cat "$R/etc/neuron-serving/bundle.env" >>"$R/etc/neuron-serving/stack.env"
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
# The Neuron tools (neuron-ls, neuron-monitor) are in the DLAMI's /opt/aws/neuron/bin.
PATH=$PATH:/opt/aws/neuron/bin
log() { echo "$(date -u +%FT%TZ) neuron-serving: $*"; }
die() { why=$*; log "ERROR: $*"; exit 1; }
trap 'why="command failed (exit $?) at line $LINENO: $BASH_COMMAND"; log "$why"' ERR
apt_install() {
  # Early in the first boot, cloud-init or unattended-upgrades may hold the dpkg lock.
  apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@"
}
# put PATH MODE <content: writes a file under the root, replacing it atomically.
put() {
  local path=$R$1
  mkdir -p "${path%/*}"
  cat >"$path.new"
  chmod "$2" "$path.new"
  mv -f "$path.new" "$path"
}
run_step() { step=$1; echo "running $step" >"$logs/status"; log "step: $step"; "$bin/report-phase" "$1"; }
# report-phase tags this instance with the phase, for `neuron-serving status`.
bin=$R/opt/neuron-serving/bin
on_exit() {
  local rc=$?
  # A boot that ends well without ready or warmed (a builder's, one that checks no readiness) ends
  # its last phase here, which puts the phases' times as metrics (report-phase).
  [ "$rc" != 0 ] || "$bin/report-phase" --end
  if [ "$rc" = 0 ]; then echo "done" >"$logs/status"; return; fi
  echo "failed $step" >"$logs/status"
  log "FAILED in step $step (exit $rc)"
  "$bin/report-phase" failed "$step: ${why:-exit $rc}"
}

run_step metadata
imds=$(curl -sSf -m 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' http://169.254.169.254/latest/api/token)
md() { curl -sSf -m 5 -H "X-aws-ec2-metadata-token: $imds" "http://169.254.169.254/latest/meta-data/$1"; }
REGION=$(md placement/region)
INSTANCE_ID=$(md instance-id)
# What the metrics count the host by ("Instance metadata categories", EC2 user guide: instance-type,
# placement/availability-zone, instance-life-cycle); never worth failing a boot for.
INSTANCE_TYPE=$(md instance-type) || INSTANCE_TYPE=
AVAILABILITY_ZONE=$(md placement/availability-zone) || AVAILABILITY_ZONE=
CAPACITY=$(md instance-life-cycle) || CAPACITY=
printf '%s=%s\n' REGION "$REGION" INSTANCE_ID "$INSTANCE_ID" INSTANCE_TYPE "$INSTANCE_TYPE" \
  AVAILABILITY_ZONE "$AVAILABILITY_ZONE" CAPACITY "$CAPACITY" | put /etc/neuron-serving/host.env 644

run_step check-devices
neuron-ls || log "neuron-ls failed (exit $?)"
# The numbers of the /dev/neuronN nodes, in order.
mapfile -t devs < <(ls "$R/dev" | sed -n 's/^neuron\([0-9]\+\)$/\1/p' | sort -n)
first=${devs[0]-} last=${devs[*]: -1}
if [ "$last" != 0 ] || [ ${#devs[@]} != 1 ]; then
  [ "$first" = "$last" ] || first+="..$last"
  die "expected 1 Neuron devices for inf2.xlarge, found ${#devs[@]}${first:+ (/dev/neuron$first)}; check the instance type and the Neuron driver (neuron-ls above)"
fi
# The Neuron runtime inside the image works with the host drivers (the DLAMI's aws-neuronx-dkms)
# below 2.29 only (Neuron release notes, runtime, Neuron 2.31.0; ServingImage.driver_below)
driver=$(dpkg-query -W -f '${Version}' aws-neuronx-dkms 2>/dev/null) || driver=
if [ -n "$driver" ] && dpkg --compare-versions "$driver" ge 2.29; then
  die "the Neuron driver (aws-neuronx-dkms $driver) rejects the Neuron runtime 2.26.42 of $IMAGE; launch an AMI with a driver below 2.29 (dlami_parameter, ami_id)"
fi

run_step install-tools
command -v docker >/dev/null || apt_install docker.io
if ! command -v haproxy >/dev/null; then
  apt_install haproxy
  # Debian's and Ubuntu's haproxy package writes /var/log/haproxy.log through the rsyslog rule
  # it installs (/etc/rsyslog.d/49-haproxy.conf), which rsyslog reads only when it starts.
  systemctl try-restart rsyslog
fi
systemctl enable --now docker

run_step monitoring
# Early, so that the rest of this log reaches CloudWatch even if the boot fails. Without it the
# host still serves.
"$R/opt/neuron-serving/bin/start-monitoring" ||
  log "WARNING: monitoring not started (exit $?): this host ships no logs or metrics"

run_step pull-image
image=$IMAGE
delay=10
for attempt in $(seq 5); do
  if docker pull "$image"; then break; fi
  [ "$attempt" -lt 5 ] || die "could not pull $image after 5 attempts"
  log "pull failed (attempt $attempt of 5); retrying in ${delay}s"
  sleep "$delay"
  delay=$((delay * 2))
done

run_step export-model
"$R/opt/neuron-serving/bin/export-model"

run_step start-replicas
units=()
# Rows of replicas.table: replica index, host port, Neuron devices, settings of its own; those
# whose value is the replica's name come from the loop. replica.env has the settings all share.
while read -r -a row; do
  i=${row[0]}
  put "/etc/neuron-serving/replica-$i.conf" 644 <<CONF
DEVICES="${row[2]//,/ }"
PORT=${row[1]}
ENV_FILE=/etc/neuron-serving/replica-$i.env
CONF
  { cat "$R/etc/neuron-serving/replica.env"; printf '%s\n' "${row[@]:3}" NEURON_PROCESS_TAG=replica-"$i"; } |
    put "/etc/neuron-serving/replica-$i.env" 644
  units+=("neuron-replica@$i")
done <"$R/etc/neuron-serving/replicas.table"
systemctl daemon-reload
for unit in "${units[@]}"; do systemctl enable --now "$unit"; done

run_step router
haproxy -c -f "$R/etc/haproxy/haproxy.cfg.new"
mv -f "$R/etc/haproxy/haproxy.cfg.new" "$R/etc/haproxy/haproxy.cfg"
systemctl enable haproxy
systemctl restart haproxy
# Without a signal or a hook nothing checks that the replicas serve: the host does not claim it.
"$bin/report-phase" router "boot complete: readiness not checked"
log "boot complete: 1 replica behind the router on port 8080"
# ==> /opt/neuron-serving/bin/check-export <==
#!/usr/bin/env python3
# check-export DIR: exits 0 when DIR is an export the plan's replicas can load, else prints why
# (its last line names the first problem) and exits 1. A replica that finds a wrong degree, shape
# or dtype fails to load, or, without the weights, downloads the checkpoint at every start.
# What an export holds is the serving image's export toolchain's to say (see
# neuron_serving.plan.engines, Engine.export_expectations).
import json
import sys
from pathlib import Path

EXPECT = json.loads('{"config": "neuron_config.json", "fields": {"batch_size": 4, "sequence_length": 4096, "torch_dtype": "bfloat16", "tp_degree": 2}, "files": ["config.json", "neuron_config.json", "model.pt", "tokenizer_config.json", "checkpoint/weights/tp0_sharded_checkpoint.safetensors", "checkpoint/weights/tp1_sharded_checkpoint.safetensors"]}')
# Fields compared by a rule of their own (neuron_serving.plan.engines.base.SAME_RELEASE): "release"
# accepts any PEP 440 local label, the part of a version after "+" that the Neuron pip repository's
# builds carry.
RULES = EXPECT.get("compare", {})


def matches(key: str, found: object, wanted: object) -> bool:
    if RULES.get(key) == "release":
        return isinstance(found, str) and found.partition("+")[0] == str(wanted).partition("+")[0]
    return found == wanted


def lookup(config: object, key: str) -> object:
    """The value at ``key`` in ``config``: a dotted key names a field of a section ("neuron_config.tp_degree")."""
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def problems(export: Path) -> list[str]:
    missing = [name for name in EXPECT["files"] if not (export / name).is_file()]
    if missing:
        return [f"{export} lacks {', '.join(missing)}"]
    try:
        config = json.loads((export / EXPECT["config"]).read_text())
    except (OSError, ValueError) as error:
        return [f"{export}/{EXPECT['config']} cannot be read: {error}"]
    return [f"{export}/{EXPECT['config']} has {key} {lookup(config, key)!r}, the plan {value!r}"
            for key, value in EXPECT["fields"].items() if not matches(key, lookup(config, key), value)]


found = problems(Path(sys.argv[1]))
for line in found:
    print(f"check-export: {line}")
sys.exit(1 if found else 0)
# ==> /opt/neuron-serving/bin/export-model <==
#!/bin/bash
# Exports (compiles) the model once, inside the serving image so the compiler is the one
# TGI runs. Called by the boot script and by each neuron-replica@ unit: the lock serializes them; the
# marker, written last, makes later calls no-ops; an export without it is redone. An export is
# marked complete only once check-export has found the plan's degree, shapes, dtype and the
# weights in it, and a complete one that no longer passes is redone.
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
# IMAGE, and PREBUILT or CACHE_BUCKET and CACHE_PREFIX, and COMPILE_CACHE, from the stack.
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
key=v4-tgi-llama-3-2-1b-instruct-tp2-b4-s4096-bf16-d50f7d6bc398d78d
exports=$R/var/lib/neuron-serving/exports
final=$exports/$key
marker=$final/.neuron-serving-complete
check=$R/opt/neuron-serving/bin/check-export
log=$R/var/log/neuron-serving/export.log
mkdir -p "$exports" "${log%/*}"
exec 9>"$exports/.lock"
flock 9
if [ -f "$marker" ] && "$check" "$final" >>"$log" 2>&1; then echo "export-model: $final is complete"; exit 0; fi
rm -rf "$final.tmp" "$final" "$final.src"
mkdir "$final.tmp"
# A failed boot reports the last line of the log: the compiler's error, or one of these.
fail() { echo "export-model: $*" | tee -a "$log" >&2; exit 1; }
finish() {
  "$check" "$final.tmp" >>"$log" 2>&1 || fail "$(tail -n 1 "$log")"
  mv "$final.tmp" "$final"
  echo "$1 at $(date -u +%FT%TZ)" >"$marker"
  echo "export-model: $final is complete"
}
# hub REPO ARGS...: huggingface-cli download inside the serving image, into the exports
# directory, with the token; besides it only the compiler may reach the Hub (its cache).
# Tags the instance with the phase, once it is known that the export is downloaded after all, or
# made here after all (report-phase).
report() { "$R/opt/neuron-serving/bin/report-phase" "$@"; }
# --max-workers files at once instead of the client's 8 (neuron_serving.plan.transfer).
hub() {
  refused=''
  retry hub_try "$@" && return
  [ -z "$refused" ] || fail "$refused"
  return 1
}
# A Hub that refuses the caller (401 or 403) refuses every try: the download ends at once, saying so.
# huggingface-cli exits 1 with the traceback of huggingface_hub's error, whose line names the class
# and the status (src/huggingface_hub/utils/_http.py hf_raise_for_status, at v0.34.4 and v0.36.2):
# "GatedRepoError: 401 Client Error." (gated, no token) or "403 Client Error." (token not granted),
# "HfHubHTTPError: 401 Client Error: Unauthorized for url: ..." with the Hub's "Invalid credentials in
# Authorization header" (an unknown token), "RepositoryNotFoundError: 401 Client Error." (private, no
# token), and for any other 403 a line "403 Forbidden: <the Hub's message>." (tried with both
# versions against tests/harness/fake_hub.py).
hub_try() {
  local from code
  from=$(wc -c <"$log")
  docker run --rm --entrypoint huggingface-cli -v "$exports:/models" "$IMAGE" \
    download --max-workers 16 "$@" && return
  code=$(tail -c +$((from + 1)) "$log" | sed -n -E 's/^(huggingface_hub\.errors\.[A-Za-z]+: )?(40[13]) (Client Error|Forbidden).*/\2/p' | head -n 1)
  [ -n "$code" ] || return 1
  refused="the Hub refused $1 without a token (HTTP $code): it is gated or private; set hf_token_secret to a secret holding a token granted access to it"
  return 1
}
# retry COMMAND...: a download, tried 5 times with waits of 10, 20, 40... s between, as
# the image pull is: one reset connection must not fail the boot. The client retries neither the first
# call of a download (huggingface_hub v0.34.4 src/huggingface_hub/hf_api.py model_info, one GET) nor
# a failed request for a file (file_download.py _request_wrapper: HTTP 429 only). Each try goes on
# from the last one, which deletes nothing: huggingface-cli download into the same --local-dir skips
# the files whose etag matches its metadata in .cache/huggingface/download/ (file_download.py
# _hf_hub_download_to_local_dir) and resumes <file>.<etag>.incomplete with a Range request, or with
# hf_transfer on (the TGI image) starts that file over (_download_to_tmp_and_move); aws s3 sync
# copies only what is missing or differs in size or time (aws/aws-cli 1.45.55
# awscli/customizations/s3/syncstrategy/base.py, SizeAndLastModifiedSync). A try that says why no
# other can succeed (hub_try's refused) is the last.
retry() {
  delay=10
  for attempt in $(seq 5); do
    "$@" >>"$log" 2>&1 && return
    [ "$attempt" -lt 5 ] && [ -z "${refused:-}" ] || return
    echo "export-model: download failed (attempt $attempt of 5); retrying in ${delay}s" | tee -a "$log"
    sleep "$delay"
    delay=$((delay * 2))
  done
}
# optimum-neuron writes the weights into an export made from a local directory only (from a Hub
# id, each replica would download the checkpoint at every start): the checkpoint's files that
# the export needs are downloaded first.
model=meta-llama/Llama-3.2-1B-Instruct
echo "export-model: downloading $model into $final.src; output in $log"
report download-checkpoint "$model"
hub "$model" --local-dir "/models/$key.src" \
  --include config.json generation_config.json 'model*.safetensors' model.safetensors.index.json tokenizer.json tokenizer_config.json special_tokens_map.json tokenizer.model --exclude 'original/*' ||
  fail "could not download $model after 5 attempts"
compgen -G "$final.src/*.safetensors" >/dev/null || fail "$model has no safetensors weights"
# The compiler sees the devices of one replica, as each replica does. The arguments are the
# engine's (neuron_serving.plan.engines, Engine.export_arguments).
args=()
for d in $(seq 0 0); do args+=(--device "/dev/neuron$d"); done
# optimum-neuron compiles inside hub_neuronx_cache, whose proxy fetches each graph that the Hub cache
# repository CUSTOM_CACHE_REPO holds instead of compiling it (optimum/neuron/cache/hub_cache.py,
# CompileCacheHfProxy.exists and download_file; utils/cache_utils.py get_hf_hub_cache_repo: at
# v0.3.0 and v0.4.5). Offline, the proxy cannot be made ("Bypassing Hub cache") and all compiles.
args+=(-e CUSTOM_CACHE_REPO=aws-neuron/optimum-neuron-cache)
echo "export-model: exporting into $final; output in $log"
report export-model "compiling"
if ! docker run --rm --entrypoint optimum-cli "${args[@]}" -v "$exports:/models" "$IMAGE" \
  export neuron --model "/models/$key.src" --task text-generation --batch_size 4 --sequence_length 4096 --num_cores 2 --auto_cast_type bf16 "/models/$key.tmp" >>"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "export-model: export failed; see $log" >&2
  exit 1
fi
rm -rf "$final.src"
finish "exported"
# ==> /opt/neuron-serving/bin/publish-metrics <==
<left out>
# ==> /opt/neuron-serving/bin/report-phase <==
#!/bin/bash
# report-phase PHASE [DETAIL]: tells the operator where the boot is, as four tags on this
# instance (neuron_serving.plan.phases), which `neuron-serving status` reads with
# ec2:DescribeInstances: the phase, when it began (UTC), the detail and how long each phase the
# host has finished took. One CreateTags call; the host's role may tag this instance only, and
# with these four keys only.
# report-phase --end: the boot ends without one of the phases that end it (ready, failed, warmed), such
# as a builder's or a boot that checks no readiness: it ends the phase it is in.
# Entering a new phase ends the one before: its seconds go to /var/log/neuron-serving/phases.tsv. A phase that
# ends a boot, and --end, then put each phase finished since the last such report as the
# CloudWatch metric BootPhaseSeconds.
# It never fails, so that reporting never stops a boot: a refused or failed call is logged (on
# stderr: boot.log, or ready.log under neuron-serving-ready.service). Before the metadata step
# has written host.env (the region and the instance id), it only records and logs.
R=${NEURON_SERVING_ROOT:-}
phases=$R/var/log/neuron-serving/phases.tsv
running=$phases.running
mkdir -p "${phases%/*}"
now=$(date -u +%FT%TZ)
# Seconds since the kernel started, with two decimals, unmoved by clock adjustments (proc(5),
# /proc/uptime), and a new random id at each start (proc(5), /proc/sys/kernel/random/boot_id): a
# phase begun before the instance stopped or rebooted has no end this start can measure.
read -r up _ </proc/uptime
up=$((10#${up/./}))
boot=$(cat /proc/sys/kernel/random/boot_id)
ended=
if IFS=$'\t' read -r was began at on 2>/dev/null <"$running" && [ "$was" != "$1" ]; then
  if [ "$on" = "$boot" ]; then
    printf '%s\t%s\t%s\t%s\n' "$was" "$began" "$now" $(((up - at + 50) / 100)) >>"$phases"
    ended=1
  fi
  rm -f "$running"
fi
case $1 in
  --end | ready | failed | warmed) ;;
  *) [ -f "$running" ] || printf '%s\t%s\t%s\t%s\n' "$1" "$now" "$up" "$boot" >"$running" ;;
esac
host=$R/etc/neuron-serving/host.env
[ -f "$host" ] || { echo "report-phase: $1 not reported: no host.env yet" >&2; exit 0; }
# REGION and INSTANCE_ID, from the boot script's metadata step.
# shellcheck source=/dev/null
. "$host"
# Each phase's seconds, all its times added up (export-model is entered again to compile once
# the checkpoint is downloaded), in the order first entered: as many pairs as fit in a tag.
seconds=$(awk -F '\t' -v limit=256 '!($1 in s) {order[n++] = $1} {s[$1] += $4}
  END {for (i = 0; i < n; i++) {p = order[i] "=" s[order[i]]; if (length(v) + length(p) + (i > 0) > limit) break
    v = v (i ? " " : "") p}; print v}' "$phases" 2>/dev/null)
# A tag value holds at most 256 letters, digits, spaces and + - = . _ : / @ (EC2 user
# guide, "Tag restrictions"): any other character becomes a space. None of those needs quoting
# in JSON. The phase names are the scripts' own (neuron_serving.plan.phases.PHASES).
tag() { printf '{"Key":"%s","Value":"%s"},' "$@"; }
tags=
if [ "$1" != --end ]; then
  detail=$(printf %s "${2:-}" | LC_ALL=C tr -cs 'A-Za-z0-9 +=._:/@-' ' ' | head -c 256)
  detail=${detail% }
  tags=$(tag neuron-serving:phase "$1" neuron-serving:phase-since "$now" neuron-serving:detail "$detail")
elif [ -z "$ended" ]; then
  # The boot ended in a phase that ends it: nothing is left to tell.
  exit 0
fi
tags+=$(tag neuron-serving:phase-seconds "$seconds")
# Short timeouts: an EC2 endpoint out of reach must not hold the boot up for minutes per phase.
aws ec2 create-tags --cli-connect-timeout 10 --cli-read-timeout 20 --region "$REGION" --resources "$INSTANCE_ID" \
  --tags "[${tags%,}]" >/dev/null || echo "report-phase: $1 not reported (exit $?)" >&2
case $1 in --end | ready | failed | warmed) ;; *) exit 0 ;; esac
# The phases finished since the last end: the lines after those already put (their count in
# $phases.put). Tried once, with the same short timeouts: a metric lost is never a failed boot.
# The stack's SERVICE and METRICS_NAMESPACE.
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
[ -f "$phases" ] || exit 0
put=$(cat "$phases.put" 2>/dev/null) || put=0
total=$(wc -l <"$phases")
[ "$total" -gt "$put" ] || exit 0
echo "$total" >"$phases.put"
service=${SERVICE//\\/\\\\}
service=${service//\"/\\\"}
# One datum per phase, its times added up as in the tag, at the time it last ended, with the
# dimensions Service and Phase (PutMetricData, MetricDatum: Amazon CloudWatch API Reference; up to
# 1000 per request). The service through the environment: awk -v would undo its escapes.
data=$(sed -n "$((put + 1)),${total}p" "$phases" | service=$service awk -F '\t' '
  !($1 in s) {order[n++] = $1} {s[$1] += $4; end[$1] = $3}
  END {for (i = 0; i < n; i++) {p = order[i]
    printf "{\"MetricName\":\"BootPhaseSeconds\",\"Dimensions\":[{\"Name\":\"Service\",\"Value\":\"%s\"},{\"Name\":\"Phase\",\"Value\":\"%s\"}],\"Value\":%d,\"Unit\":\"Seconds\",\"Timestamp\":\"%s\"},", ENVIRON["service"], p, s[p], end[p]}}')
aws cloudwatch put-metric-data --cli-connect-timeout 10 --cli-read-timeout 20 --region "$REGION" \
  --namespace "$METRICS_NAMESPACE" --metric-data "[${data%,}]" ||
  echo "report-phase: the boot's phase times not put as metrics (exit $?)" >&2
exit 0
# ==> /opt/neuron-serving/bin/run-replica <==
#!/bin/bash
# Runs TGI replica $1 for neuron-replica@$1.service. Only its own Neuron devices (never --privileged),
# so replicas cannot touch each other's cores; its port on loopback, for the router only. It
# serves the local export, which holds the weights: no Hub access and no token.
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
i=${1:?usage: run-replica INDEX}
key=v4-tgi-llama-3-2-1b-instruct-tp2-b4-s4096-bf16-d50f7d6bc398d78d
# IMAGE and LOG_GROUP_REPLICAS, from the stack.
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/replica-$i.conf"
args=()
for d in $DEVICES; do args+=(--device "/dev/neuron$d"); done
# The container's output to CloudWatch Logs, one stream per replica. Non-blocking, the driver
# creates its stream on the first line: the replica starts and serves even when CloudWatch Logs
# cannot be reached, and drops output beyond the buffer rather than wait.
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/host.env"
args+=(--log-driver awslogs --log-opt "awslogs-region=$REGION" --log-opt "awslogs-group=$LOG_GROUP_REPLICAS"
  --log-opt "awslogs-stream=$INSTANCE_ID/replica-$i" --log-opt mode=non-blocking --log-opt max-buffer-size=4m)
exec docker run --rm --name "replica-$i" "${args[@]}" -p "127.0.0.1:$PORT:80" \
  -v "$R/var/lib/neuron-serving/exports/$key:/models/$key:ro" --env-file "$R$ENV_FILE" "$IMAGE"
# ==> /opt/neuron-serving/bin/start-monitoring <==
#!/bin/bash
# Ships the host's logs and publishes its metrics, for the boot script's monitoring step, which
# goes on without them when this fails: serving matters more than its metrics. Installs the
# CloudWatch agent when missing, once AWS's signature of it verifies, and gives it its config,
# then enables the metrics publisher and starts it, unless $1 is non-empty (a host prepared for
# the warm pool: the publisher starts with the replicas, on the next boot).
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
etc=$R/etc/neuron-serving
# The log group names, from the stack.
# shellcheck source=/dev/null
. "$etc/stack.env"
# shellcheck source=/dev/null
. "$etc/host.env"
ctl=$R/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl
if [ ! -x "$ctl" ]; then
  # The package from the instance's region (Ubuntu on x86_64, as every Inferentia and Trainium
  # instance type is), installed by apt-get rather than dpkg -i: apt-get waits for the dpkg lock,
  # which unattended upgrades may hold early in the first boot.
  apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@"; }
  get() { curl -sSf --retry 4 --retry-all-errors -m 300 -o "$1" "$2"; }
  url=https://s3.$REGION.amazonaws.com/amazoncloudwatch-agent-$REGION/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb
  deb=$R/var/cache/neuron-serving/amazon-cloudwatch-agent.deb
  mkdir -p "${deb%/*}"
  get "$deb" "$url"
  # Installed only once AWS's signature verifies, as the CloudWatch user guide has it ("Verifying
  # the signature of the CloudWatch agent package"): the signature is at the package's URL plus
  # .sig; AWS's public key is where the guide gives it, in the global bucket (the guide names no
  # regional copy). The key file is a download too: what is trusted is the key's fingerprint,
  # which the guide documents and the render pins (MonitoringOptions.agent_key_fingerprint).
  asc=https://s3.amazonaws.com/amazoncloudwatch-agent/assets/amazon-cloudwatch-agent.gpg
  get "$deb.sig" "$url.sig"
  get "$deb.gpg" "$asc"
  key=937616F3450B7D806CBD9725D58167303B789C72
  refuse() { echo "CloudWatch agent not installed: $*" >&2; exit 1; }
  # Minimal Ubuntu images lack gpg (cloud-init installs it when missing, for the same reason).
  # gpgv, which Ubuntu's apt depends on (apt 2.4 of 22.04: gpgv | gpgv2 | gpgv1), verifies, but
  # reads only binary keyrings and lists no fingerprints: gpg turns the key file into one and
  # lists it.
  command -v gpg >/dev/null || { apt_get update -q && apt_get install -y -q gpg; }
  # In a directory of its own, never root's keyring; --no-autostart: no gpg-agent outlives it.
  home=$(mktemp -d)
  trap 'rm -rf "$home"' EXIT
  g() { gpg --homedir "$home" --batch --no-autostart -q "$@"; }
  # The key file through gpg's import checks into a keyring for gpgv (import-export stores
  # nothing); one of its keys (primary: the fpr record after a pub record) must be the pinned one.
  { g --import-options import-export --import "$deb.gpg" >"$home/k" && g --with-colons --show-keys "$home/k"; } |
    awk -F: -v k="$key" '$1=="pub"{p=1} $1=="fpr"&&p{p=0;ok=ok||$10==k} END{exit !ok}' || refuse "$asc holds no key $key"
  # gpgv trusts every key of the keyring it is given, and its exit status says that a signature
  # is good, not whose: its status lines must show a good signature (GOODSIG) whose VALIDSIG
  # names the pinned key as the primary key (its last field).
  gpgv --homedir "$home" --keyring "$home/k" --status-fd 1 "$deb.sig" "$deb" |
    awk -v k="$key" '$2=="NEWSIG"{g=0} $2=="GOODSIG"{g=1} g&&$2=="VALIDSIG"&&$NF==k{ok=1} END{exit !ok}' ||
    refuse "$url.sig is no good signature by $key"
  apt_get install -y -q "$deb"
  rm -f "$deb"*
fi
# The agent's config with the stack's log group names, which are deploy-time values.
conf=$(<"$etc/cloudwatch-agent.json.in")
for v in LOG_GROUP_BOOT LOG_GROUP_ROUTER LOG_GROUP_METRICS; do conf=${conf//@$v@/"${!v}"}; done
printf '%s\n' "$conf" >"$etc/cloudwatch-agent.json"
# -s (re)starts the agent and enables it: it ships this boot's logs, and starts on the next boot.
"$ctl" -a fetch-config -m ec2 -s -c "file:$etc/cloudwatch-agent.json"
systemctl daemon-reload
if [ -n "${1:-}" ]; then
  systemctl enable neuron-serving-metrics
else
  systemctl enable --now neuron-serving-metrics
fi
