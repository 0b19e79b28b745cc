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
python3 -m zipfile -e z f && cd f && sha256sum -c --quiet <<<"de5fcdb4264e126250bacfe56867d3293c0e3c32b84b46f71c375b37f53e1f6c  MANIFEST" && sha256sum -c --quiet MANIFEST ||
  die "the boot bundle $BUNDLE is not the stack's: a checksum differs"
. "./opt/neuron-serving/bin/boot-steps"
# ==> metadata NeuronServing <==
# ==> /etc/haproxy/haproxy.cfg.new <==
<left out>
# ==> /etc/neuron-serving/bundle.env <==
IMAGE=ghcr.io/huggingface/text-generation-inference:3.3.5-neuron
HF_TOKEN_SECRET=neuron-serving/hf-token
# ==> /etc/neuron-serving/replica.env <==
MODEL_ID=/models/v4-tgi-llama-3-1-8b-instruct-tp8-b4-s4096-bf16-14fbd21259d2a125
HF_NUM_CORES=8
HF_AUTO_CAST_TYPE=bf16
MAX_BATCH_SIZE=4
MAX_TOTAL_TOKENS=4096
MAX_INPUT_TOKENS=3072
MAX_BATCH_PREFILL_TOKENS=12288
MAX_CONCURRENT_REQUESTS=128
HF_HUB_OFFLINE=1
USAGE_STATS=off
# ==> /etc/neuron-serving/replicas.table <==
0 8081 0,1,2,3
1 8082 4,5,6,7
2 8083 8,9,10,11
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
# ==> /opt/neuron-serving/bin/boot-steps <==
# The boot's steps for meta-llama/Llama-3.1-8B-Instruct on inf2.48xlarge (3 replicas of tensor_parallel 8, batch_size 4, sequence_length 4096), bf16
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
run_step() { step=$1; echo "running $step" >"$logs/status"; log "step: $step"; }
on_exit() {
  local rc=$?
  if [ "$rc" = 0 ]; then echo "done" >"$logs/status"; return; fi
  echo "failed $step" >"$logs/status"
  log "FAILED in step $step (exit $rc)"
}

run_step check-devices
neuron-ls || log "neuron-ls failed (exit $?)"
# The numbers of the /dev/neuronN nodes, in order.
mapfile -t devs < <(ls "$R/dev" | sed -n 's/^neuron\([0-9]\+\)$/\1/p' | sort -n)
first=${devs[0]-} last=${devs[*]: -1}
if [ "$last" != 11 ] || [ ${#devs[@]} != 12 ]; then
  [ "$first" = "$last" ] || first+="..$last"
  die "expected 12 Neuron devices for inf2.48xlarge, found ${#devs[@]}${first:+ (/dev/neuron$first)}; check the instance type and the Neuron driver (neuron-ls above)"
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

run_step hf-token
# The token only passes through shell builtins: never in an argument list or a log.
secret=$HF_TOKEN_SECRET
if [[ $secret == arn:* ]]; then
  # A secret is read in its own region, which its ARN names; a name is in the instance's (IMDSv2).
  IFS=: read -r _ _ _ region _ <<<"$secret"
else
  imds=$(curl -sSf -m 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' http://169.254.169.254/latest/api/token)
  region=$(curl -sSf -m 5 -H "X-aws-ec2-metadata-token: $imds" http://169.254.169.254/latest/meta-data/placement/region)
fi
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
log "boot complete: 3 replicas behind the router on port 8080"
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

EXPECT = json.loads('{"config": "neuron_config.json", "fields": {"batch_size": 4, "sequence_length": 4096, "torch_dtype": "bfloat16", "tp_degree": 8}, "files": ["config.json", "neuron_config.json", "model.pt", "tokenizer_config.json", "checkpoint/weights/tp0_sharded_checkpoint.safetensors", "checkpoint/weights/tp1_sharded_checkpoint.safetensors", "checkpoint/weights/tp2_sharded_checkpoint.safetensors", "checkpoint/weights/tp3_sharded_checkpoint.safetensors", "checkpoint/weights/tp4_sharded_checkpoint.safetensors", "checkpoint/weights/tp5_sharded_checkpoint.safetensors", "checkpoint/weights/tp6_sharded_checkpoint.safetensors", "checkpoint/weights/tp7_sharded_checkpoint.safetensors"]}')
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
key=v4-tgi-llama-3-1-8b-instruct-tp8-b4-s4096-bf16-14fbd21259d2a125
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
report() { :; }
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
  docker run --rm --entrypoint huggingface-cli --env-file "$R"/etc/neuron-serving/hf-token.env -v "$exports:/models" "$IMAGE" \
    download --max-workers 16 "$@" && return
  code=$(tail -c +$((from + 1)) "$log" | sed -n -E 's/^(huggingface_hub\.errors\.[A-Za-z]+: )?(40[13]) (Client Error|Forbidden).*/\2/p' | head -n 1)
  [ -n "$code" ] || return 1
  refused="the Hub refused the token of hf_token_secret $HF_TOKEN_SECRET for $1 (HTTP $code): put a valid token in the secret, of an account granted access to $1"
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
model=meta-llama/Llama-3.1-8B-Instruct
echo "export-model: downloading $model into $final.src; output in $log"
report download-checkpoint "$model"
hub "$model" --local-dir "/models/$key.src" \
  --include config.json generation_config.json 'model*.safetensors' model.safetensors.index.json tokenizer.json tokenizer_config.json special_tokens_map.json tokenizer.model --exclude 'original/*' ||
  fail "could not download $model after 5 attempts"
compgen -G "$final.src/*.safetensors" >/dev/null || fail "$model has no safetensors weights"
# The compiler sees the devices of one replica, as each replica does. The arguments are the
# engine's (neuron_serving.plan.engines, Engine.export_arguments).
args=()
for d in $(seq 0 3); do args+=(--device "/dev/neuron$d"); done
# optimum-neuron compiles inside hub_neuronx_cache, whose proxy fetches each graph that the Hub cache
# repository CUSTOM_CACHE_REPO holds instead of compiling it (optimum/neuron/cache/hub_cache.py,
# CompileCacheHfProxy.exists and download_file; utils/cache_utils.py get_hf_hub_cache_repo: at
# v0.3.0 and v0.4.5). Offline, the proxy cannot be made ("Bypassing Hub cache") and all compiles.
args+=(-e CUSTOM_CACHE_REPO=aws-neuron/optimum-neuron-cache)
echo "export-model: exporting into $final; output in $log"
report export-model "compiling"
if ! docker run --rm --entrypoint optimum-cli "${args[@]}" -v "$exports:/models" "$IMAGE" \
  export neuron --model "/models/$key.src" --task text-generation --batch_size 4 --sequence_length 4096 --num_cores 8 --auto_cast_type bf16 "/models/$key.tmp" >>"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "export-model: export failed; see $log" >&2
  exit 1
fi
rm -rf "$final.src"
finish "exported"
# ==> /opt/neuron-serving/bin/run-replica <==
#!/bin/bash
# Runs TGI replica $1 for neuron-replica@$1.service. Only its own Neuron devices (never --privileged),
# so replicas cannot touch each other's cores; its port on loopback, for the router only. It
# serves the local export, which holds the weights: no Hub access and no token.
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
i=${1:?usage: run-replica INDEX}
key=v4-tgi-llama-3-1-8b-instruct-tp8-b4-s4096-bf16-14fbd21259d2a125
# IMAGE, from the stack.
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/replica-$i.conf"
args=()
for d in $DEVICES; do args+=(--device "/dev/neuron$d"); done
exec docker run --rm --name "replica-$i" "${args[@]}" -p "127.0.0.1:$PORT:80" \
  -v "$R/var/lib/neuron-serving/exports/$key:/models/$key:ro" --env-file "$R$ENV_FILE" "$IMAGE"
