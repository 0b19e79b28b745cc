#!/bin/bash
# neuron-serving boot script, run as root by cloud-init: meta-llama/Llama-3.1-8B-Instruct on inf2.48xlarge (3 replicas of tensor_parallel 8, batch_size 4, sequence_length 4096), bf16
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
run_step() { step=$1; echo "running $step" >"$logs/status"; log "step: $step"; }
on_exit() {
  local rc=$?
  if [ "$rc" = 0 ]; then echo "done" >"$logs/status"; return; fi
  echo "failed $step" >"$logs/status"
  log "FAILED in step $step (exit $rc)"
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
files=$(base64 -d <<'EOF' | gunzip
put /opt/neuron-serving/bin/export-model 755 <<'EOF'
#!/bin/bash
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
key=llama-3-1-8b-instruct-tp8-b4-s4096-bf16-6b0ca4aab7f4240e
exports=$R/var/lib/neuron-serving/exports
final=$exports/$key
marker=$final/.neuron-serving-complete
log=$R/var/log/neuron-serving/export.log
mkdir -p "$exports" "${log%/*}"
exec 9>"$exports/.lock"
flock 9
if [ -f "$marker" ]; then echo "export-model: $final is complete"; exit 0; fi
rm -rf "$final.tmp" "$final"
mkdir "$final.tmp"
fail() { echo "export-model: $*" | tee -a "$log" >&2; exit 1; }
finish() {
  [ -f "$final.tmp/config.json" ] || fail "no config.json in $final.tmp"
  mv "$final.tmp" "$final"
  echo "$1 at $(date -u +%FT%TZ)" >"$marker"
  echo "export-model: $final is complete"
}
help=$(docker run --rm --entrypoint optimum-cli "$IMAGE" export neuron --help 2>&1 || true)
cores_flag=--num_cores
if [[ $help == *--tensor_parallel_size* ]]; then cores_flag=--tensor_parallel_size; fi
args=()
for d in $(seq 0 11); do args+=(--device "/dev/neuron$d"); done
args+=(--env-file "$R"/etc/neuron-serving/hf-token.env)
model=meta-llama/Llama-3.1-8B-Instruct
echo "export-model: exporting into $final with $cores_flag; output in $log"
if ! docker run --rm --entrypoint optimum-cli "${args[@]}" -v "$exports:/models" "$IMAGE" \
  export neuron --model "$model" --batch_size 4 --sequence_length 4096 \
  "$cores_flag" 8 --auto_cast_type bf16 "/models/$key.tmp" >>"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "export-model: export failed; see $log" >&2
  exit 1
fi
finish "exported with $cores_flag"
EOF
put /opt/neuron-serving/bin/run-replica 755 <<'EOF'
#!/bin/bash
set -euo pipefail
R=${NEURON_SERVING_ROOT:-}
i=${1:?usage: run-replica INDEX}
key=llama-3-1-8b-instruct-tp8-b4-s4096-bf16-6b0ca4aab7f4240e
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/stack.env"
# shellcheck source=/dev/null
. "$R/etc/neuron-serving/replica-$i.conf"
args=()
for d in $DEVICES; do args+=(--device "/dev/neuron$d"); done
args+=(--env-file "$R"/etc/neuron-serving/hf-token.env)
exec docker run --rm --name "tgi-replica-$i" "${args[@]}" -p "127.0.0.1:$PORT:80" \
  -v "$R/var/lib/neuron-serving/exports/$key:/models/$key:ro" --env-file "$R$ENV_FILE" "$IMAGE"
EOF
put /etc/systemd/system/neuron-tgi@.service 644 <<'EOF'
[Unit]
Description=TGI Neuron replica %i
Requires=docker.service
After=docker.service network-online.target
Wants=network-online.target
StartLimitIntervalSec=0

[Service]
TimeoutStartSec=infinity
ExecStartPre=/opt/neuron-serving/bin/export-model
ExecStartPre=-/usr/bin/env docker rm -f tgi-replica-%i
ExecStart=/opt/neuron-serving/bin/run-replica %i
ExecStop=/usr/bin/env docker stop -t 30 tgi-replica-%i
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF
put /etc/neuron-serving/tgi.env 644 <<'EOF'
MODEL_ID=/models/llama-3-1-8b-instruct-tp8-b4-s4096-bf16-6b0ca4aab7f4240e
HF_NUM_CORES=8
HF_AUTO_CAST_TYPE=bf16
MAX_BATCH_SIZE=4
MAX_TOTAL_TOKENS=4096
MAX_INPUT_TOKENS=3072
MAX_BATCH_PREFILL_TOKENS=12288
MAX_CONCURRENT_REQUESTS=128
EOF
put /etc/neuron-serving/replicas.table 644 <<'EOF'
0 8081 0,1,2,3
1 8082 4,5,6,7
2 8083 8,9,10,11
EOF
put /etc/haproxy/haproxy.cfg.new 644 <<'EOF'
<render_router_config(plan) without its comment lines>
EOF
EOF
)
eval "$files"

run_step check-devices
neuron-ls || log "neuron-ls failed (exit $?)"
mapfile -t devs < <(ls "$R/dev" | sed -n 's/^neuron\([0-9]\+\)$/\1/p' | sort -n)
first=${devs[0]-} last=${devs[*]: -1}
if [ "$last" != 11 ] || [ ${#devs[@]} != 12 ]; then
  [ "$first" = "$last" ] || first+="..$last"
  die "expected 12 Neuron devices for inf2.48xlarge, found ${#devs[@]}${first:+ (/dev/neuron$first)}; check the instance type and the Neuron driver (neuron-ls above)"
fi

run_step install-tools
apt_install() {
  apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$@"
}
command -v docker >/dev/null || apt_install docker.io
command -v aws >/dev/null || snap install aws-cli --classic || apt_install awscli
command -v haproxy >/dev/null || apt_install haproxy
systemctl enable --now docker

run_step hf-token
secret=neuron-serving/hf-token
if [[ $secret == arn:* ]]; then
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
image=ghcr.io/huggingface/text-generation-inference:3.3.5-neuron
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
  { cat "$R/etc/neuron-serving/tgi.env"; printf '%s\n' "${row[@]:3}" NEURON_PROCESS_TAG=replica-"$i"; } |
    put "/etc/neuron-serving/replica-$i.env" 644
  units+=("neuron-tgi@$i")
done <"$R/etc/neuron-serving/replicas.table"
systemctl daemon-reload
for unit in "${units[@]}"; do systemctl enable --now "$unit"; done

run_step router
haproxy -c -f "$R/etc/haproxy/haproxy.cfg.new"
mv -f "$R/etc/haproxy/haproxy.cfg.new" "$R/etc/haproxy/haproxy.cfg"
systemctl enable haproxy
systemctl restart haproxy
log "boot complete: 3 replicas behind the router on port 8080"
