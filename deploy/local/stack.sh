#!/usr/bin/env bash
# The whole Quartermaster stack on this machine: Kafka, the five services, the
# ticker, simulated nodes and the web console, each its own process; and Prometheus
# scraping them, if installed. Usage: deploy/local/stack.sh up|down|status
# Each service runs under deploy/local/supervise.py, which starts it again with
# backoff when it exits (as Kubernetes would); .local/run/<service>.pid is the
# supervisor's pid, <service>.child.pid the service's while it runs.
# Logs: .local/logs/<service>.log (restarts included). Task output: .local/logs/tasks/.
# .local is this account's alone (0700, and nothing the stack writes there is readable by
# others: umask 077): it holds the token keys, the broker's passwords, tokens and every
# service's log, and tasks run as other accounts (deploy/local/sandbox.yaml). What tasks
# must reach lies outside it: their scratch folders (the sandbox file's scratch.root).
set -euo pipefail
umask 077

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
py="${QM_PYTHON:-$root/.venv/bin/python}"
run="$root/.local/run"
logs="$root/.local/logs"
services=(budget projector placement ticker node_agent admission console)

export QM_KAFKA_BOOTSTRAP="${QM_KAFKA_BOOTSTRAP:-127.0.0.1:${QM_KAFKA_PORT:-9092}}"
# The broker authenticates (deploy/local/kafka.sh): each service logs in as its own
# principal, with a password file only this user reads (.local/kafka/users/).
export QM_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT QM_KAFKA_SASL_MECHANISM=SCRAM-SHA-512
users="${QM_KAFKA_DIR:-$root/.local/kafka}/users"
# Token keys (python -m libs.auth keygen, kept in .local/auth): every service checks
# tokens with the public ones; admission and the console sign their own with keys that
# sign only their identities; qm token and qm login sign users' with issuer.key.
auth="$root/.local/auth"
export QM_AUTH_PUBLIC_KEYS_FILE="$auth/public-keys.yaml"
unset QM_AUTH_SIGNING_KEY_FILE
# Every writer of the event log signs what it writes with its own key; placement and the
# auditor check each record against the trust file (python -m libs.trust init, kept in
# .local/trust). Each node agent makes its nodes' keys on first start (.local/run/keys).
trust="$root/.local/trust"
export QM_TRUST_FILE="$trust/trust.yaml"
export QM_TASK_LOG_DIR="${QM_TASK_LOG_DIR:-$logs/tasks}"
export QM_SANDBOX="${QM_SANDBOX:-$root/deploy/local/sandbox.yaml}"
# The node agents' secret store (qm secret set USER NAME; qm submit --secret NAME).
export QM_SECRETS_DIR="${QM_SECRETS_DIR:-$root/.local/secrets}"
# gRPC over TLS: a local CA and a certificate for 127.0.0.1 (deploy/local/certs.py);
# qm verifies the services against the CA (.local/tls/ca.crt).
tls="$root/.local/tls"
export QM_TLS_CERT="$tls/server.crt" QM_TLS_KEY="$tls/server.key" QM_TLS_CA="$tls/ca.crt"
export PYTHONUNBUFFERED=1

start_service() {
  local name="$1"; shift
  if [ -f "$run/$name.pid" ] && kill -0 "$(cat "$run/$name.pid")" 2>/dev/null; then
    echo "$name: already running"; return
  fi
  local principal="${name//_/-}" signing=()
  [ -f "$trust/$name.key" ] && signing=("QM_EVENTS_KEY_FILE=$trust/$name.key")
  env "${signing[@]}" QM_KAFKA_SASL_USERNAME="$principal" QM_KAFKA_SASL_PASSWORD_FILE="$users/$principal" \
    nohup "$py" deploy/local/supervise.py --name "$name" --child-pidfile "$run/$name.child.pid" \
    -- "$py" -m "services.$name" "$@" </dev/null >>"$logs/$name.log" 2>&1 &
  echo $! > "$run/$name.pid"
}

wait_for() {
  "$py" deploy/local/wait_ready.py --timeout 90 "$@" || {
    echo "stack: a service did not come up; see $logs/ (their supervisors keep" \
      "restarting them: stop everything with make down)" >&2
    tail -n 20 "$logs"/*.log >&2
    exit 1
  }
}

# .local is this account's only: no other account reaches anything in it (not even what
# an earlier version left readable), and what the stack writes there is private (umask).
private_state() {
  mkdir -p "$root/.local"
  chmod 700 "$root/.local"
}

up() {
  private_state
  mkdir -p "$run" "$logs" "$QM_TASK_LOG_DIR"
  # The sandbox file's dataset volume (deploy/local/sandbox.yaml), with a file to read,
  # and the example image for --image (with podman: make example-image; docs/containers.md).
  mkdir -p /var/tmp/qm-datasets
  [ -e /var/tmp/qm-datasets/hello ] || echo "hello from the dataset" > /var/tmp/qm-datasets/hello
  chmod 755 /var/tmp/qm-datasets && chmod 644 /var/tmp/qm-datasets/hello
  if command -v podman >/dev/null && [ "$(id -u)" = 0 ]; then
    deploy/images/example.sh "$root/.local/podman" overlay
  fi
  "$py" deploy/local/certs.py "$tls"
  # Its TLS listener (9094) uses the same CA; the services here use the loopback one.
  QM_KAFKA_TLS_PORT="${QM_KAFKA_TLS_PORT:-9094}" QM_KAFKA_TLS_DIR="$tls" deploy/local/kafka.sh start
  # As the broker's admin: topics, then one principal per service and its ACLs.
  QM_KAFKA_SASL_USERNAME=admin QM_KAFKA_SASL_PASSWORD_FILE="$users/admin" \
    QM_KAFKA_USERS_DIR="$users" "$py" -m libs.bus
  auditor_env
  "$py" -m libs.auth keygen "$auth"
  "$py" -m libs.trust init "$trust" >/dev/null
  start_service budget
  start_service projector
  wait_for grpc:127.0.0.1:50052 http://127.0.0.1:6066/ready
  start_service placement
  start_service ticker
  # Killed, it leaves its tasks to their keepers for the agent its supervisor starts
  # again; stopped (make down), it stops them: nothing make up started outlives it.
  start_service node_agent --nodes deploy/local/nodes.yaml --stop-tasks-on-exit
  QM_AUTH_SIGNING_KEY_FILE="$auth/admission.key" start_service admission
  # Their /readyz: placement and the agent are in their consumer groups.
  wait_for grpc:127.0.0.1:50051 http://127.0.0.1:9462/readyz http://127.0.0.1:9463/readyz \
    http://127.0.0.1:9464/readyz
  approve_nodes
  # The web console reads the projector, the budget service and admission (services/console).
  QM_AUTH_SIGNING_KEY_FILE="$auth/console.key" start_service console
  wait_for http://127.0.0.1:8080/readyz
  sign_in
  start_prometheus
  cat <<MSG

Quartermaster is up (deploy/local/nodes.yaml): 4 nodes of 8 H100 that run tasks as
processes, and 2 simulated serving nodes of 4 T4 for workflows.
  source .venv/bin/activate
  qm submit --gpus 2 -- python3 -c 'print(42)'
  qm logs -f JOB       # its output: 42
  qm status            # then: qm status JOB, qm why JOB, qm nodes, qm budget tree
Console: http://127.0.0.1:8080/ (sign in with the token that this prints: qm token issue alice)
gRPC is TLS (CA: .local/tls/ca.crt, which qm uses when run from here).
Logs in .local/logs/, task output in .local/logs/tasks/. Stop everything with: make down
MSG
}

# Each service's /healthz, /readyz (open) and /metrics (a token of svc-prometheus):
# services/metrics_http.py; the projector's /metrics is on its web port.
metrics_ports=(admission:9460 budget:9461 placement:9462 ticker:9463 node_agent:9464 projector:6066)
prometheus_dir="$root/.local/prometheus"

# Prometheus (Debian package `prometheus`), if installed, scrapes them all with a token
# issued here; without it the stack runs the same.
start_prometheus() {
  mkdir -p "$prometheus_dir"
  (umask 077 && "$py" -m cli token issue svc-prometheus --ttl 30d >"$prometheus_dir/token")
  echo
  echo "Metrics (Authorization: Bearer \$(cat .local/prometheus/token)):"
  local entry
  for entry in "${metrics_ports[@]}"; do
    printf '  %-11s http://127.0.0.1:%s/metrics\n' "${entry%%:*}" "${entry##*:}"
  done
  if ! command -v prometheus >/dev/null; then
    echo "Prometheus is not installed: apt-get install prometheus, then make up again"
    return
  fi
  if [ -f "$run/prometheus.pid" ] && kill -0 "$(cat "$run/prometheus.pid")" 2>/dev/null; then
    echo "Prometheus: already running at http://127.0.0.1:9090/"; return
  fi
  nohup prometheus --config.file="$root/deploy/local/prometheus/prometheus.yml" \
    --storage.tsdb.path="$prometheus_dir/data" --web.listen-address=127.0.0.1:9090 \
    </dev/null >>"$logs/prometheus.log" 2>&1 &
  echo $! > "$run/prometheus.pid"
  if "$py" deploy/local/wait_ready.py --timeout 30 http://127.0.0.1:9090/-/ready; then
    echo "Prometheus: http://127.0.0.1:9090/ (alerts: http://127.0.0.1:9090/alerts)"
  else
    echo "Prometheus did not come up; see $logs/prometheus.log" >&2
  fi
}

# `qm audit verify` reads the log as the auditor: `source .local/auditor.env` first.
auditor_env() {
  (umask 077 && cat > "$root/.local/auditor.env") <<ENV
export QM_KAFKA_BOOTSTRAP=$QM_KAFKA_BOOTSTRAP QM_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT
export QM_KAFKA_SASL_MECHANISM=SCRAM-SHA-512 QM_KAFKA_SASL_USERNAME=auditor
export QM_KAFKA_SASL_PASSWORD_FILE=$users/auditor
export QM_TRUST_FILE=$QM_TRUST_FILE
ENV
}

# Placement refuses what a node says until an operator approves its key. make up approves
# the nodes its own agent runs, as carol (the budget root's manager) would; on a real
# cluster an operator compares `qm node pending` with each node's
# `python -m services.node_agent --show-keys` and runs `qm node approve NODE`.
approve_nodes() {
  local token nodes node
  token="$("$py" -m cli token issue carol --ttl 10m)"
  for _ in 1 2 3; do
    sleep 1
    nodes="$(QM_TOKEN="$token" "$py" -m cli node pending -o json |
      "$py" -c 'import json, sys; print(" ".join(n["node_id"] for n in json.load(sys.stdin)["nodes"]))')"
    for node in $nodes; do
      QM_TOKEN="$token" "$py" -m cli node approve "$node"
    done
  done
}

# The local user is alice (deploy/local/budget.yaml); qm reads ~/.config/qm/token.
sign_in() {
  "$py" -m cli login "${QM_LOCAL_USER:-alice}"
}

stop_pid() {
  local name="$1" pidfile="$run/$1.pid"
  [ -f "$pidfile" ] || return 0
  local pid; pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    # The supervisor stops the service (SIGKILL after its 15 s grace), then itself.
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 80); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "$name: did not stop in 20 s, killing" >&2
      pkill -KILL -P "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile" "$run/$name.child.pid"
  echo "$name: stopped"
}

down() {
  local i
  stop_pid prometheus
  for ((i = ${#services[@]} - 1; i >= 0; i--)); do stop_pid "${services[$i]}"; done
  forget_agent_state
  deploy/local/kafka.sh stop
}

# A node agent's records of its running tasks (.local/run/node-agent-NAME:
# services/node_agent/orphans.py) are gone once it has stopped its tasks, and its folder
# goes; one that still names a task is kept, for the next agent to take it back (or
# kill it).
forget_agent_state() {
  local state left
  for state in "$run"/node-agent-*/; do
    [ -d "$state" ] || continue
    left="$(find "$state" -name '*.json' -path '*/tasks/*' | wc -l)"
    if [ "$left" -eq 0 ]; then
      rm -rf "$state"
    else
      echo "node agent: kept ${state%/}: $left tasks on record that may still run;" \
        "the next agent takes them back" >&2
    fi
  done
}

status() {
  for name in "${services[@]}"; do
    if [ -f "$run/$name.pid" ] && kill -0 "$(cat "$run/$name.pid")" 2>/dev/null; then
      local supervisor; supervisor="$(cat "$run/$name.pid")"
      if [ -f "$run/$name.child.pid" ] && kill -0 "$(cat "$run/$name.child.pid")" 2>/dev/null; then
        echo "$name: running (pid $(cat "$run/$name.child.pid"), supervisor $supervisor)"
      else
        echo "$name: restarting (supervisor $supervisor; see $logs/$name.log)"
      fi
    else
      echo "$name: not running"
    fi
  done
  if [ -f "$run/prometheus.pid" ] && kill -0 "$(cat "$run/prometheus.pid")" 2>/dev/null; then
    echo "prometheus: running (pid $(cat "$run/prometheus.pid"))"
  fi
  deploy/local/kafka.sh status || true
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
