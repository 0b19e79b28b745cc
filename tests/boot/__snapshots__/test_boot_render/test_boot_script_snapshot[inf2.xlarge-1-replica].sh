#!/bin/bash
# neuron-serving boot script, run as root by cloud-init: meta-llama/Llama-3.2-1B-Instruct on inf2.xlarge (1 replica of tensor_parallel 2, batch_size 4, sequence_length 4096), bf16
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
IMAGE=ghcr.io/huggingface/text-generation-inference:3.3.5-neuron
EOF
files=$(python3 -c 'import base64,lzma,sys;sys.stdout.write(lzma.decompress(base64.b85decode(sys.stdin.read().strip())).decode())' <<'EOF'
put /opt/neuron-serving/bin/export-model 755 <<'EOF'
#!/bin/bash
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
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
fail() { echo "export-model: $*" | tee -a "$log" >&2; exit 1; }
finish() {
  "$check" "$final.tmp" >>"$log" 2>&1 || fail "$(tail -n 1 "$log")"
  mv "$final.tmp" "$final"
  echo "$1 at $(date -u +%FT%TZ)" >"$marker"
  echo "export-model: $final is complete"
}
report() { :; }
hub() {
  retry docker run --rm --entrypoint huggingface-cli -v "$exports:/models" "$IMAGE" \
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
model=meta-llama/Llama-3.2-1B-Instruct
echo "export-model: downloading $model into $final.src; output in $log"
hub "$model" --local-dir "/models/$key.src" \
  --include config.json generation_config.json 'model*.safetensors' model.safetensors.index.json tokenizer.json tokenizer_config.json special_tokens_map.json tokenizer.model --exclude 'original/*' ||
  fail "could not download $model after 5 attempts"
compgen -G "$final.src/*.safetensors" >/dev/null || fail "$model has no safetensors weights"
args=()
for d in $(seq 0 0); do args+=(--device "/dev/neuron$d"); done
echo "export-model: exporting into $final; output in $log"
if ! docker run --rm --entrypoint optimum-cli "${args[@]}" -e HF_HUB_OFFLINE=1 -v "$exports:/models" "$IMAGE" \
  export neuron --model "/models/$key.src" --task text-generation --batch_size 4 --sequence_length 4096 --num_cores 2 --auto_cast_type bf16 "/models/$key.tmp" >>"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "export-model: export failed; see $log" >&2
  exit 1
fi
rm -rf "$final.src"
finish "exported"
EOF
put /opt/neuron-serving/bin/check-export 755 <<'EOF'
#!/usr/bin/env python3
import json
import sys
from pathlib import Path

EXPECT = json.loads('{"config": "neuron_config.json", "fields": {"batch_size": 4, "sequence_length": 4096, "torch_dtype": "bfloat16", "tp_degree": 2}, "files": ["config.json", "neuron_config.json", "model.pt", "tokenizer_config.json", "checkpoint/weights/tp0_sharded_checkpoint.safetensors", "checkpoint/weights/tp1_sharded_checkpoint.safetensors"]}')
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
key=v4-tgi-llama-3-2-1b-instruct-tp2-b4-s4096-bf16-d50f7d6bc398d78d
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/replica-$i.conf"
args=()
for d in $DEVICES; do args+=(--device "/dev/neuron$d"); done
exec docker run --rm --name "replica-$i" "${args[@]}" -p "127.0.0.1:$PORT:80" \
  -v "$R/var/lib/neuron-serving/exports/$key:/models/$key:ro" --env-file "$R$ENV_FILE" "$IMAGE"
EOF
put /etc/systemd/system/neuron-replica@.service 644 <<'EOF'
[Unit]
Description=TGI Neuron replica %i
Requires=docker.service
After=docker.service network-online.target
Wants=network-online.target
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
EOF
put /etc/neuron-serving/replicas.table 644 <<'EOF'
0 8081 0
EOF
put /etc/haproxy/haproxy.cfg.new 644 <<'EOF'
<render_router_config(plan) without its comment lines>
EOF
put /opt/neuron-serving/bin/boot-steps 644 <<'EOF'
# shellcheck shell=bash
run_step() { step=$1; echo "running $step" >"$logs/status"; log "step: $step"; }
on_exit() {
  local rc=$?
  if [ "$rc" = 0 ]; then echo "done" >"$logs/status"; return; fi
  echo "failed $step" >"$logs/status"
  log "FAILED in step $step (exit $rc)"
}
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"

run_step check-devices
neuron-ls || log "neuron-ls failed (exit $?)"
mapfile -t devs < <(ls "$R/dev" | sed -n 's/^neuron\([0-9]\+\)$/\1/p' | sort -n)
first=${devs[0]-} last=${devs[*]: -1}
if [ "$last" != 0 ] || [ ${#devs[@]} != 1 ]; then
  [ "$first" = "$last" ] || first+="..$last"
  die "expected 1 Neuron devices for inf2.xlarge, found ${#devs[@]}${first:+ (/dev/neuron$first)}; check the instance type and the Neuron driver (neuron-ls above)"
fi
driver=$(dpkg-query -W -f '${Version}' aws-neuronx-dkms 2>/dev/null) || driver=
if [ -n "$driver" ] && dpkg --compare-versions "$driver" ge 2.29; then
  die "the Neuron driver (aws-neuronx-dkms $driver) rejects the Neuron runtime 2.26.42 of $IMAGE; launch an AMI with a driver below 2.29 (dlami_parameter, ami_id)"
fi

run_step install-tools
apt_install() {
  apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@"
}
command -v docker >/dev/null || apt_install docker.io
if ! command -v aws >/dev/null && ! snap install aws-cli --classic; then
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
for unit in "${units[@]}"; do systemctl enable --now "$unit"; done

run_step router
haproxy -c -f "$R/etc/haproxy/haproxy.cfg.new"
mv -f "$R/etc/haproxy/haproxy.cfg.new" "$R/etc/haproxy/haproxy.cfg"
systemctl enable haproxy
systemctl restart haproxy
log "boot complete: 1 replica behind the router on port 8080"
EOF
EOF
)
eval "$files"
# shellcheck source=/dev/null
. "$R/opt/neuron-serving/bin/boot-steps"
