#!/bin/bash
# neuron-serving boot script, run as root by cloud-init: meta-llama/Llama-3.1-8B-Instruct on trn1.32xlarge (16 replicas of tensor_parallel 2, batch_size 4, sequence_length 4096), bf16
# Every step is idempotent; logs and the step reached: /var/log/neuron-serving/. Explained in
# cdk-neuron-serving's userdata/*.j2, whose comments are left out here.
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
PATH=$PATH:/opt/aws/neuron/bin:/snap/bin
logs=$R/var/log/neuron-serving
mkdir -p "$logs"
exec > >(tee -a "$logs/boot.log") 2>&1
step=start why=
log() { echo "$(date -u +%FT%TZ) neuron-serving: $*"; }
die() { why=$*; log "ERROR: $*"; exit 1; }
on_exit() {
  local rc=$?
  [ "$rc" = 0 ] || { echo "failed $step" >"$logs/status"; log "FAILED in step $step (exit $rc)"; }
}
trap on_exit EXIT
trap 'why="command failed (exit $?) at line $LINENO: $BASH_COMMAND"; log "$why"' ERR
put() {
  local path=$R$1
  mkdir -p "${path%/*}"
  cat >"$path.new"
  chmod "$2" "$path.new"
  mv -f "$path.new" "$path"
}
put /etc/neuron-serving/stack.env 644 <<'EOF'
IMAGE=ghcr.io/huggingface/optimum-neuron-vllm:0.4.5
HF_TOKEN_SECRET=arn:aws:secretsmanager:eu-west-1:123456789012:secret:neuron-serving/hf-token-AbCdEf
CACHE_BUCKET='${Token[TOKEN.123]}'
CACHE_PREFIX=exports/
GROUP_NAME=NeuronLlamaStack-NeuronServingFleet
HOOK_NAME=neuron-serving-launch
SERVICE='${Token[TOKEN.200]}'
LOG_GROUP_BOOT='${Token[TOKEN.201]}'
LOG_GROUP_REPLICAS='${Token[TOKEN.202]}'
LOG_GROUP_ROUTER='${Token[TOKEN.203]}'
LOG_GROUP_METRICS='${Token[TOKEN.204]}'
PUBLISHER='s3://${Token[TOKEN.210]}/${Token[TOKEN.211]}.py'
EOF
files=$(python3 -c 'import base64,lzma,sys;sys.stdout.write(lzma.decompress(base64.b85decode(sys.stdin.read().strip())).decode())' <<'EOF'
put /opt/neuron-serving/bin/export-model 755 <<'EOF'
#!/bin/bash
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
key=v4-vllm-llama-3-1-8b-instruct-tp2-b4-s4096-bf16-3e3719aa7a47ea0b
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
fail() { echo "export-model: $*" | tee -a "$log" >&2; exit 1; }
finish() {
  "$check" "$final.tmp" >>"$log" 2>&1 || fail "$(tail -n 1 "$log")"
  mv "$final.tmp" "$final"
  echo "$1 at $(date -u +%FT%TZ)" >"$marker"
  echo "export-model: $final is complete"
}
report() { "$R/opt/neuron-serving/bin/report-phase" "$@"; }
hub() {
  retry docker run --rm --entrypoint huggingface-cli --env-file "$R"/etc/neuron-serving/hf-token.env -v "$exports:/models" "$IMAGE" \
    download "$@"
}
retry() {
  delay=10
  for attempt in $(seq 5); do
    "$@" >>"$log" 2>&1 && return
    [ "$attempt" -lt 5 ] || return
    echo "export-model: download failed (attempt $attempt of 5); retrying in ${delay}s" | tee -a "$log"
    sleep "$delay"
    delay=$((delay * 2))
  done
}
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/host.env"
export AWS_DEFAULT_REGION=$REGION
s3=s3://$CACHE_BUCKET/
cached=$CACHE_PREFIX$key
sums() {
  (cd "$1" && shopt -s globstar dotglob nullglob && set -- && cpus=$(nproc) &&
    for f in **; do
      [[ -f $f && $f != "${marker##*/}" ]] || continue
      sha256sum -- "$f" &
      set -- "$@" "$!"
      if (($# >= cpus)); then wait "$1" || exit; shift; fi
    done &&
    for job; do wait "$job" || exit; done) | LC_ALL=C sort
}
if aws s3 cp "$s3$cached/COMPLETE" "$final.from" >>"$log" 2>&1; then
  from=$(head -n 1 "$final.from")
  [[ $from == "$cached"/?* ]] || fail "COMPLETE names $from"
  from=$s3$from/
  echo "export-model: downloading $from into $final; output in $log"
  report download-export "$from"
  if ! retry aws s3 sync --only-show-errors "$from" "$final.tmp"; then
    why="could not be downloaded after 5 attempts (see $log)"
  elif bad=$(LC_ALL=C comm -3 <(tail -n +2 "$final.from" | LC_ALL=C sort) <(sums "$final.tmp")); [ -n "$bad" ]; then
    why="differs from the manifest in COMPLETE"
    printf 'export-model: %s %s; lines only in the manifest, and (indented) only in the download:\n%s\n' \
      "$from" "$why" "$bad" | tee -a "$log"
  elif "$check" "$final.tmp" >>"$log" 2>&1; then
    finish "downloaded from $from"
    exit 0
  else
    why="is not an export of this plan"
  fi
  echo "export-model: $from $why; exporting here" | tee -a "$log"
  report export-model "$from $why"
  rm -rf "$final.tmp" && mkdir "$final.tmp"
fi
model=meta-llama/Llama-3.1-8B-Instruct revision=5f0b02c75b57c5855da9ae460ce51323ea669d8a
echo "export-model: downloading $model into $final.src; output in $log"
hub "$model" --revision "$revision" --local-dir "/models/$key.src" \
  --include config.json generation_config.json 'model*.safetensors' model.safetensors.index.json tokenizer.json tokenizer_config.json special_tokens_map.json tokenizer.model --exclude 'original/*' ||
  fail "could not download $model at revision $revision after 5 attempts"
compgen -G "$final.src/*.safetensors" >/dev/null || fail "$model has no safetensors weights"
args=()
for d in $(seq 0 0); do args+=(--device "/dev/neuron$d"); done
echo "export-model: exporting into $final; output in $log"
if ! docker run --rm --entrypoint optimum-cli "${args[@]}" -e HF_HUB_OFFLINE=1 -v "$exports:/models" "$IMAGE" \
  export neuron --model "/models/$key.src" --task text-generation --batch_size 4 --sequence_length 4096 --tensor_parallel_size 2 "/models/$key.tmp" >>"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "export-model: export failed; see $log" >&2
  exit 1
fi
rm -rf "$final.src"
finish "exported"
up=$cached/$INSTANCE_ID
echo "export-model: publishing $s3$up/"
if ! { echo "$up" && sums "$final"; } >"$final.from" ||
  ! aws s3 sync --only-show-errors --exclude "${marker##*/}" "$final" "$s3$up/" >>"$log" 2>&1 ||
  ! aws s3api put-object --bucket "$CACHE_BUCKET" --key "$cached/COMPLETE" --body "$final.from" \
    --if-none-match '*' >>"$log" 2>&1; then
  err=$(tail -n 1 "$log")
  [[ $err != *PreconditionFailed* ]] || err="another host published first"
  echo "export-model: not published: $err"
  aws s3 rm --recursive --only-show-errors "$s3$up/" >>"$log" 2>&1 || true
fi
EOF
put /opt/neuron-serving/bin/check-export 755 <<'EOF'
#!/usr/bin/env python3
import json
import sys
from pathlib import Path

EXPECT = json.loads('{"compare": {"neuronxcc_version": "release"}, "config": "neuron_config.json", "fields": {"batch_size": 4, "continuous_batching": true, "neuronxcc_version": "2.21.33363.0+82129205", "optimum_neuron_version": "0.4.5", "sequence_length": 4096, "target": "trn1", "torch_dtype": "bfloat16", "tp_degree": 2}, "files": ["config.json", "neuron_config.json", "model.pt", "tokenizer_config.json", "checkpoint/weights/tp0_sharded_checkpoint.safetensors", "checkpoint/weights/tp1_sharded_checkpoint.safetensors"]}')
RULES = EXPECT.get("compare", {})


def matches(key: str, found: object, wanted: object) -> bool:
    if RULES.get(key) == "release":
        return isinstance(found, str) and found.partition("+")[0] == str(wanted).partition("+")[0]
    return found == wanted


def problems(export: Path) -> list[str]:
    missing = [name for name in EXPECT["files"] if not (export / name).is_file()]
    if missing:
        return [f"{export} lacks {', '.join(missing)}"]
    try:
        config = json.loads((export / EXPECT["config"]).read_text())
    except (OSError, ValueError) as error:
        return [f"{export}/{EXPECT['config']} cannot be read: {error}"]
    return [f"{export}/{EXPECT['config']} has {key} {config.get(key)!r}, the plan {value!r}"
            for key, value in EXPECT["fields"].items() if not matches(key, config.get(key), value)]


found = problems(Path(sys.argv[1]))
for line in found:
    print(f"check-export: {line}")
sys.exit(1 if found else 0)
EOF
put /opt/neuron-serving/bin/run-replica 755 <<'EOF'
#!/bin/bash
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
i=${1:?usage: run-replica INDEX}
key=v4-vllm-llama-3-1-8b-instruct-tp2-b4-s4096-bf16-3e3719aa7a47ea0b
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/replica-$i.conf"
args=()
for d in $DEVICES; do args+=(--device "/dev/neuron$d"); done
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/host.env"
args+=(--log-driver awslogs --log-opt "awslogs-region=$REGION" --log-opt "awslogs-group=$LOG_GROUP_REPLICAS"
  --log-opt "awslogs-stream=$INSTANCE_ID/replica-$i" --log-opt mode=non-blocking --log-opt max-buffer-size=4m)
exec docker run --rm --name "replica-$i" "${args[@]}" -p "127.0.0.1:$PORT:8080" \
  -v "$R/var/lib/neuron-serving/exports/$key:/models/$key:ro" --env-file "$R$ENV_FILE" "$IMAGE"
EOF
put /etc/systemd/system/neuron-replica@.service 644 <<'EOF'
[Unit]
Description=vLLM Neuron replica %i
Requires=docker.service
After=docker.service network-online.target
Wants=network-online.target
Before=neuron-serving-ready.service
StartLimitIntervalSec=0

[Service]
TimeoutStartSec=infinity
ExecStartPre=/opt/neuron-serving/bin/export-model
ExecStartPre=-/usr/bin/env docker rm -f replica-%i
ExecStart=/opt/neuron-serving/bin/run-replica %i
ExecStop=/usr/bin/env docker stop -t 30 replica-%i
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF
put /etc/neuron-serving/replica.env 644 <<'EOF'
SM_ON_MODEL=/models/v4-vllm-llama-3-1-8b-instruct-tp2-b4-s4096-bf16-3e3719aa7a47ea0b
SM_ON_SERVED_MODEL_NAME=meta-llama/Llama-3.1-8B-Instruct
SM_ON_TENSOR_PARALLEL_SIZE=2
SM_ON_BATCH_SIZE=4
SM_ON_SEQUENCE_LENGTH=4096
SM_ON_DISABLE_UVICORN_ACCESS_LOG=
SM_ON_DISABLE_FASTAPI_DOCS=
HF_HUB_OFFLINE=1
VLLM_NO_USAGE_STATS=1
DO_NOT_TRACK=1
VLLM_HOST_IP=127.0.0.1
EOF
put /etc/neuron-serving/replicas.table 644 <<'EOF'
0 8081 0
1 8082 1
2 8083 2
3 8084 3
4 8085 4
5 8086 5
6 8087 6
7 8088 7
8 8089 8
9 8090 9
10 8091 10
11 8092 11
12 8093 12
13 8094 13
14 8095 14
15 8096 15
EOF
put /etc/haproxy/haproxy.cfg.new 644 <<'EOF'
<render_router_config(plan) without its comment lines>
EOF
put /opt/neuron-serving/bin/wait-ready 755 <<'EOF'
#!/bin/bash
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
limit=${NEURON_SERVING_READY_SECONDS:-1500}
report() { "$R/opt/neuron-serving/bin/report-phase" "$@"; }
own=${1:-}
fail() { echo "$1"; [ -z "$own" ] || report failed "wait-ready: $1"; exit 1; }
ready() {
  curl -fsS -m 10 -o /dev/null "$1/health" && { [ -z "${2:-}" ] || curl -fsS -m 60 -o /dev/null \
    -H 'Content-Type: application/json' -d '{"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "ping", "max_tokens": 1}' "$1/v1/completions"; }
}
confs=("$R"/etc/neuron-serving/replica-*.conf)
total=${#confs[@]} n=0
[ -z "$own" ] || report wait-ready "0 of $total ready"
for conf in "${confs[@]}" router; do
  name=${conf##*/} port=8080 generate=
  [ "$name" = router ] || name=${name%.conf} port=$(sed -n 's/^PORT=//p' "$conf") generate=1
  until ready "http://127.0.0.1:$port" $generate; do
    [ "$SECONDS" -lt "$limit" ] || fail "$name not ready in ${limit}s (port $port)"
    sleep 10
  done
  echo "$name (port $port) ready"
  [ "$name" = router ] || { n=$((n + 1)); report wait-ready "$n of $total ready"; }
done
report ready "$total of $total ready"
EOF
put /opt/neuron-serving/bin/report-phase 755 <<'EOF'
#!/bin/bash
R=${NEURON_SERVING_ROOT:-}
host=$R/etc/neuron-serving/host.env
[ -f "$host" ] || { echo "report-phase: $1 not reported: no host.env yet" >&2; exit 0; }
# shellcheck source=/dev/null
. "$host"
detail=$(printf %s "${2:-}" | LC_ALL=C tr -cs 'A-Za-z0-9 +=._:/@-' ' ' | head -c 256)
detail=${detail% }
tags=$(printf '{"Key":"%s","Value":"%s"},' neuron-serving:phase "$1" neuron-serving:phase-since "$(date -u +%FT%TZ)" neuron-serving:detail "$detail")
aws ec2 create-tags --cli-connect-timeout 10 --cli-read-timeout 20 --region "$REGION" --resources "$INSTANCE_ID" \
  --tags "[${tags%,}]" >/dev/null || echo "report-phase: $1 not reported (exit $?)" >&2
exit 0
EOF
put /opt/neuron-serving/bin/complete-lifecycle 755 <<'EOF'
#!/bin/bash
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/host.env"
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
action=(complete-lifecycle-action --lifecycle-action-result "$1")
[ "$1" != HEARTBEAT ] || action=(record-lifecycle-action-heartbeat)
aws autoscaling "${action[@]}" --region "$REGION" --instance-id "$INSTANCE_ID" \
  --auto-scaling-group-name "$GROUP_NAME" --lifecycle-hook-name "$HOOK_NAME" ||
  echo "complete-lifecycle: $1 not taken"
EOF
put /etc/systemd/system/neuron-serving-ready.service 644 <<'EOF'
[Unit]
Description=Tell Auto Scaling the replicas serve
After=haproxy.service

[Service]
Type=oneshot
TimeoutStartSec=infinity
ExecStart=/opt/neuron-serving/bin/wait-ready --report
ExecStart=/opt/neuron-serving/bin/complete-lifecycle CONTINUE
StandardOutput=append:/var/log/neuron-serving/ready.log

[Install]
WantedBy=multi-user.target
EOF
put /opt/neuron-serving/bin/start-monitoring 755 <<'EOF'
#!/bin/bash
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
etc=$R/etc/neuron-serving
# shellcheck source=/dev/null
. "$etc/stack.env"
# shellcheck source=/dev/null
. "$etc/host.env"
ctl=$R/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl
if [ ! -x "$ctl" ]; then
  apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@"; }
  get() { curl -sSf --retry 4 --retry-all-errors -m 300 -o "$1" "$2"; }
  url=https://s3.$REGION.amazonaws.com/amazoncloudwatch-agent-$REGION/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb
  deb=$R/var/cache/neuron-serving/amazon-cloudwatch-agent.deb
  mkdir -p "${deb%/*}"
  get "$deb" "$url"
  asc=https://s3.amazonaws.com/amazoncloudwatch-agent/assets/amazon-cloudwatch-agent.gpg
  get "$deb.sig" "$url.sig"
  get "$deb.gpg" "$asc"
  key=937616F3450B7D806CBD9725D58167303B789C72
  refuse() { echo "CloudWatch agent not installed: $*" >&2; exit 1; }
  command -v gpg >/dev/null || { apt_get update -q && apt_get install -y -q gpg; }
  home=$(mktemp -d)
  trap 'rm -rf "$home"' EXIT
  g() { gpg --homedir "$home" --batch --no-autostart -q "$@"; }
  { g --import-options import-export --import "$deb.gpg" >"$home/k" && g --with-colons --show-keys "$home/k"; } |
    awk -F: -v k="$key" '$1=="pub"{p=1} $1=="fpr"&&p{p=0;ok=ok||$10==k} END{exit !ok}' || refuse "$asc holds no key $key"
  gpgv --homedir "$home" --keyring "$home/k" --status-fd 1 "$deb.sig" "$deb" |
    awk -v k="$key" '$2=="NEWSIG"{g=0} $2=="GOODSIG"{g=1} g&&$2=="VALIDSIG"&&$NF==k{ok=1} END{exit !ok}' ||
    refuse "$url.sig is no good signature by $key"
  apt_get install -y -q "$deb"
  rm -f "$deb"*
fi
conf=$(<"$etc/cloudwatch-agent.json.in")
for v in LOG_GROUP_BOOT LOG_GROUP_ROUTER LOG_GROUP_METRICS; do conf=${conf//@$v@/"${!v}"}; done
printf '%s\n' "$conf" >"$etc/cloudwatch-agent.json"
"$ctl" -a fetch-config -m ec2 -s -c "file:$etc/cloudwatch-agent.json"
aws s3 cp --region "$REGION" --only-show-errors "$PUBLISHER" "$R/opt/neuron-serving/bin/publish-metrics.new"
chmod 755 "$R/opt/neuron-serving/bin/publish-metrics.new"
mv -f "$R/opt/neuron-serving/bin/publish-metrics.new" "$R/opt/neuron-serving/bin/publish-metrics"
systemctl daemon-reload
if [ -n "${1:-}" ]; then
  systemctl enable neuron-serving-metrics
else
  systemctl enable --now neuron-serving-metrics
fi
EOF
put /etc/systemd/system/neuron-serving-metrics.service 644 <<'EOF'
[Unit]
Description=Publish the Neuron serving metrics
After=network-online.target docker.service
Wants=network-online.target
StartLimitIntervalSec=0

[Service]
EnvironmentFile=/etc/neuron-serving/stack.env
EnvironmentFile=/etc/neuron-serving/host.env
ExecStart=/usr/bin/env python3 /opt/neuron-serving/bin/publish-metrics /etc/neuron-serving/metrics.json
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF
put /etc/logrotate.d/neuron-serving-metrics 644 <<'EOF'
/var/log/neuron-serving/metrics.emf {
    daily
    rotate 1
    compress
    copytruncate
    missingok
    notifempty
}
EOF
put /etc/neuron-serving/metrics.json 644 <<'EOF'
{"disk_path":"/","interval_seconds":60,"metrics":{"BatchSize":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"CpuUtilization":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Percent"},"DiskUtilization":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Percent"},"EccCorrectedEvents":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Count"},"EccUncorrectedEvents":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Count"},"ExecutionErrors":{"dimensions":[["Service","ErrorType"],["Service","InstanceId","ErrorType"]],"unit":"Count"},"ExecutionLatency":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Seconds"},"ExecutionLatencyP99":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Seconds"},"GeneratedTokens":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"InFlightRequests":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"MemoryUtilization":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Percent"},"NeuronCoreUtilization":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Percent"},"NeuronDeviceMemoryUsed":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Bytes"},"QueueDuration":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Seconds"},"QueueSize":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"ReplicasUp":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Count"},"RequestDuration":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Seconds"},"RequestFailures":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"Requests":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Count"},"RouterQueue":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Count"},"TimePerOutputToken":{"dimensions":[["Service"],["Service","InstanceId"],["Service","InstanceId","Replica"]],"unit":"Seconds"},"UnauthorizedRequests":{"dimensions":[["Service"],["Service","InstanceId"]],"unit":"Count"}},"namespace":"NeuronServing","neuron_monitor":["/opt/aws/neuron/bin/neuron-monitor","-c","/etc/neuron-serving/neuron-monitor.json"],"output":"/var/log/neuron-serving/metrics.emf","replica_metrics":{"counters":{"GeneratedTokens":[{"labels":{},"name":"vllm:generation_tokens_total"}],"RequestFailures":[{"labels":{"handler":"/v1/completions","status":"4xx"},"name":"http_requests_total"},{"labels":{"handler":"/v1/completions","status":"5xx"},"name":"http_requests_total"},{"labels":{"handler":"/v1/chat/completions","status":"4xx"},"name":"http_requests_total"},{"labels":{"handler":"/v1/chat/completions","status":"5xx"},"name":"http_requests_total"}],"Requests":[{"labels":{"handler":"/v1/completions"},"name":"http_requests_total"},{"labels":{"handler":"/v1/chat/completions"},"name":"http_requests_total"}]},"histograms":{"QueueDuration":"vllm:request_queue_time_seconds","RequestDuration":"vllm:e2e_request_latency_seconds","TimePerOutputToken":"vllm:request_time_per_output_token_seconds"},"queued":[{"labels":{},"name":"vllm:num_requests_waiting"}],"running":[{"labels":{},"name":"vllm:num_requests_running"}]},"replicas":[{"name":"replica-0","port":8081},{"name":"replica-1","port":8082},{"name":"replica-2","port":8083},{"name":"replica-3","port":8084},{"name":"replica-4","port":8085},{"name":"replica-5","port":8086},{"name":"replica-6","port":8087},{"name":"replica-7","port":8088},{"name":"replica-8","port":8089},{"name":"replica-9","port":8090},{"name":"replica-10","port":8091},{"name":"replica-11","port":8092},{"name":"replica-12","port":8093},{"name":"replica-13","port":8094},{"name":"replica-14","port":8095},{"name":"replica-15","port":8096}],"router_backend":"replicas","router_frontend":"router","router_metrics_url":"http://127.0.0.1:8404/metrics"}
EOF
put /etc/neuron-serving/neuron-monitor.json 644 <<'EOF'
{"neuron_runtimes":[{"metrics":[{"type":"neuroncore_counters"},{"type":"memory_used"},{"type":"neuron_runtime_vcpu_usage"},{"type":"execution_stats"}],"tag_filter":"^replica-"}],"period":"60s","system_metrics":[{"type":"vcpu_usage"},{"type":"memory_info"},{"type":"neuron_hw_counters"}]}
EOF
put /etc/neuron-serving/cloudwatch-agent.json.in 644 <<'EOF'
{"agent":{"run_as_user":"root"},"logs":{"logs_collected":{"files":{"collect_list":[{"file_path":"/var/log/neuron-serving/boot.log","log_group_name":"@LOG_GROUP_BOOT@","log_stream_name":"{instance_id}/boot"},{"file_path":"/var/log/neuron-serving/export.log","log_group_name":"@LOG_GROUP_BOOT@","log_stream_name":"{instance_id}/export"},{"file_path":"/var/log/neuron-serving/ready.log","log_group_name":"@LOG_GROUP_BOOT@","log_stream_name":"{instance_id}/ready"},{"file_path":"/var/log/haproxy.log","log_group_name":"@LOG_GROUP_ROUTER@","log_stream_name":"{instance_id}"},{"file_path":"/var/log/neuron-serving/metrics.emf","log_group_name":"@LOG_GROUP_METRICS@","log_stream_name":"{instance_id}"}]}}}}
EOF
put /opt/neuron-serving/bin/boot-steps 644 <<'EOF'
# shellcheck shell=bash
run_step() { step=$1; echo "running $step" >"$logs/status"; log "step: $step"; "$bin/report-phase" "$1"; }
warm='' bin=$R/opt/neuron-serving/bin
signal() {
  aws cloudformation signal-resource --region "$REGION" --stack-name NeuronLlamaStack \
    --logical-resource-id NeuronServingFleet --status "$1" --unique-id "$2" || log "no $1 signal taken"
}
on_exit() {
  local rc=$?
  [ -z "${beat:-}" ] || kill "$beat" 2>/dev/null || true
  if [ "$rc" = 0 ]; then echo "done" >"$logs/status"; return; fi
  echo "failed $step" >"$logs/status"
  log "FAILED in step $step (exit $rc)"
  local lines="" full=""
  set +eu
  trap - ERR
  [ "$step" != export-model ] || lines=$(tail -n 20 "$logs/export.log") why=$(grep . <<<"$lines" | tail -n 1)
  full=$(df -P "$R/var/lib/neuron-serving" | awk 'NR==2 && $4 < 1048576 {print "disk full: " $6 " (" int($4/1024) " MiB free)"}')
  [ -z "$full" ] || why="$full; ${why:-exit $rc}"
  printf 'neuron-serving: failed in step %s: %s\n%s\n' "$step" "${why:=exit $rc}" "$lines" | tee -a "$R/dev/console"
  "$bin/report-phase" failed "$step: ${why:-exit $rc}"
  [ -n "$warm" ] || signal FAILURE "$(echo -n "$INSTANCE_ID $step: $why" |
    tr -cs '[:alnum:] ._:/()=,+-' ' ' | head -c 64)"
  [ ! -x "$bin/complete-lifecycle" ] || "$bin/complete-lifecycle" ABANDON
}
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"

run_step metadata
imds=$(curl -sSf -m 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' http://169.254.169.254/latest/api/token)
md() { curl -sSf -m 5 -H "X-aws-ec2-metadata-token: $imds" "http://169.254.169.254/latest/meta-data/$1"; }
REGION=$(md placement/region)
INSTANCE_ID=$(md instance-id)
printf 'REGION=%s\nINSTANCE_ID=%s\n' "$REGION" "$INSTANCE_ID" | put /etc/neuron-serving/host.env 644
for _ in 1 2 3 4 5 6; do state=$(md autoscaling/target-lifecycle-state) && break; sleep 5; done
log "lifecycle state: ${state:=InService}"
[[ $state != Warmed:* ]] || warm=1
heartbeats() {
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while sleep "${NEURON_SERVING_HEARTBEAT_SECONDS:-1800}" & nap=$!; wait "$nap"; do
    "$bin/complete-lifecycle" HEARTBEAT
  done
}
heartbeats &
beat=$!

run_step check-devices
neuron-ls || log "neuron-ls failed (exit $?)"
mapfile -t devs < <(ls "$R/dev" | sed -n 's/^neuron\([0-9]\+\)$/\1/p' | sort -n)
first=${devs[0]-} last=${devs[*]: -1}
if [ "$last" != 15 ] || [ ${#devs[@]} != 16 ]; then
  [ "$first" = "$last" ] || first+="..$last"
  die "expected 16 Neuron devices for trn1.32xlarge, found ${#devs[@]}${first:+ (/dev/neuron$first)}; check the instance type and the Neuron driver (neuron-ls above)"
fi
driver=$(dpkg-query -W -f '${Version}' aws-neuronx-dkms 2>/dev/null) || driver=
if [ -n "$driver" ] && dpkg --compare-versions "$driver" ge 2.29; then
  die "the Neuron driver (aws-neuronx-dkms $driver) rejects the Neuron runtime 2.28.23 of $IMAGE; launch an AMI with a driver below 2.29 (dlami_parameter, ami_id)"
fi

run_step install-tools
apt_install() {
  apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@"
}
command -v docker >/dev/null || apt_install docker.io
if ! command -v aws >/dev/null && ! snap install aws-cli --classic ||
  [[ $(aws s3api put-object --generate-cli-skeleton) != *IfNoneMatch* ]]; then
  ! command -v aws >/dev/null || log "$(aws --version) lacks --if-none-match: installing v2"
  command -v unzip >/dev/null || apt_install unzip
  awscli=$(mktemp -d)
  curl -fsSL -o "$awscli/awscliv2.zip" "https://awscli.amazonaws.com/awscli-exe-linux-$(uname -m).zip"
  unzip -q -d "$awscli" "$awscli/awscliv2.zip"
  "$awscli/aws/install" --update --bin-dir "$R/usr/local/bin" --install-dir "$R/usr/local/aws-cli"
  rm -rf "$awscli"
  PATH=$R/usr/local/bin:$PATH
fi
if ! command -v haproxy >/dev/null; then
  apt_install haproxy
  systemctl try-restart rsyslog
fi
systemctl enable --now docker

run_step monitoring
"$R/opt/neuron-serving/bin/start-monitoring" "$warm" ||
  log "WARNING: monitoring not started (exit $?): this host ships no logs or metrics"

run_step hf-token
secret=$HF_TOKEN_SECRET
region=$REGION
[[ $secret != arn:* ]] || IFS=: read -r _ _ _ region _ <<<"$secret"
token=$(aws secretsmanager get-secret-value --region "$region" --secret-id "$secret" --query SecretString --output text)
[[ -n $token && $token != *[[:space:]]* && $token != \{* ]] || die "secret $secret must hold the Hugging Face token as plain text, not JSON"
token_file=$R/etc/neuron-serving/hf-token.env
mkdir -p "${token_file%/*}"
(umask 077; printf 'HF_TOKEN=%s\n' "$token" >"$token_file.new")
chmod 600 "$token_file.new"
mv -f "$token_file.new" "$token_file"
unset token

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
systemctl enable neuron-serving-ready "${units[@]}"
[ -n "$warm" ] || systemctl start "${units[@]}"

run_step router
haproxy -c -f "$R/etc/haproxy/haproxy.cfg.new"
mv -f "$R/etc/haproxy/haproxy.cfg.new" "$R/etc/haproxy/haproxy.cfg"
systemctl enable haproxy
if [ -n "$warm" ]; then
  "$bin/report-phase" warmed
  "$bin/complete-lifecycle" CONTINUE
  log "prepared for the warm pool"
  exit 0
fi
systemctl restart haproxy

run_step wait-ready
"$bin/wait-ready" | tee -a "$logs/ready.log" || die "$(tail -n 1 "$logs/ready.log")"
signal SUCCESS "$INSTANCE_ID"
"$bin/complete-lifecycle" CONTINUE
log "boot complete: 16 replicas behind the router on port 8080"
EOF
EOF
)
eval "$files"
# shellcheck source=/dev/null
. "$R/opt/neuron-serving/bin/boot-steps"
