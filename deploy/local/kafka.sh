#!/usr/bin/env bash
# A real, single-node Apache Kafka (KRaft: broker and controller in one JVM)
# on loopback, assembled from Maven Central artifacts. Usage:
#   deploy/local/kafka.sh start|stop|status
# Settings (environment): QM_KAFKA_DIR (data, logs and jars; default .local/kafka),
# QM_KAFKA_PORT (client port, default 9092; the controller uses the next one),
# QM_KAFKA_TLS_PORT (unset: none) a second client listener with TLS (SASL_SSL), its
# certificate from QM_KAFKA_TLS_DIR (default $QM_KAFKA_DIR/tls; made by
# deploy/local/certs.py when missing: clients trust its ca.crt).
#
# Nobody talks to it unauthenticated: clients log in with SASL SCRAM-SHA-512, the
# controller listener with SASL PLAIN, and the StandardAuthorizer refuses whatever no
# ACL allows. The first start creates the superuser `admin` (password in
# $QM_KAFKA_DIR/users/admin, readable only by its owner); `python -m libs.bus`, run
# as admin, then creates one principal per service and their ACLs (libs/bus/access.py).
# All it writes is its account's alone (umask 077): the configuration holds the admin's
# password, and the data every job's command and environment.
set -euo pipefail
umask 077

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dir="${QM_KAFKA_DIR:-$root/.local/kafka}"
port="${QM_KAFKA_PORT:-9092}"
controller_port=$((port + 1))
libs="$root/.local/kafka-libs"        # jars are shared by every data folder
pidfile="$dir/kafka.pid"
users="$dir/users"
tls_port="${QM_KAFKA_TLS_PORT:-}"
tls_dir="${QM_KAFKA_TLS_DIR:-$dir/tls}"

fetch_jars() {
  [ -f "$libs/.complete" ] && return
  echo "kafka: resolving the broker from Maven Central (pinned in deploy/local/kafka/pom.xml)"
  rm -rf "$libs"
  mkdir -p "$libs"
  if ! mvn -B -f "$here/kafka/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$libs" >"$libs/maven.log" 2>&1; then
    tail -n 40 "$libs/maven.log" >&2
    echo "kafka: could not resolve the broker; full log in $libs/maven.log" >&2
    exit 1
  fi
  touch "$libs/.complete"
}

java_args=(-Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
  -Dkafka.logs.dir="$dir/logs" -Dlog4j2.configurationFile="$here/kafka/log4j2.properties"
  -cp "$libs/*")

# The superuser's password: random, made once, kept beside the data it protects.
admin_password() {
  if [ ! -s "$users/admin" ]; then
    if [ -f "$dir/data/meta.properties" ]; then
      echo "kafka: $dir/data was made by a broker without authentication; remove $dir" \
        "(make down && rm -rf $dir) and start again" >&2
      exit 1
    fi
    (umask 077 && mkdir -p "$users" && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$users/admin")
  fi
  cat "$users/admin"
}

# The TLS listener's lines, if one is asked for: a PEM keystore (key, then certificate).
# Called by write_config, whose $scram it uses.
tls_config() {
  [ -n "$tls_port" ] || return 0
  if [ ! -f "$tls_dir/server.crt" ]; then
    "${QM_PYTHON:-$root/.venv/bin/python}" "$here/certs.py" "$tls_dir" >&2
  fi
  (umask 077 && cat "$tls_dir/server.key" "$tls_dir/server.crt" > "$dir/tls-keystore.pem")
  cat <<PROPS
listener.name.tls.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.tls.scram-sha-512.sasl.jaas.config=$scram;
listener.name.tls.ssl.keystore.type=PEM
listener.name.tls.ssl.keystore.location=$dir/tls-keystore.pem
PROPS
}

write_config() {
  mkdir -p "$dir/data" "$dir/logs"
  local password; password="$(admin_password)"
  local listeners="CLIENT://127.0.0.1:$port" protocols="CLIENT:SASL_PLAINTEXT"
  if [ -n "$tls_port" ]; then
    listeners="$listeners,TLS://127.0.0.1:$tls_port" protocols="$protocols,TLS:SASL_SSL"
  fi
  local plain="org.apache.kafka.common.security.plain.PlainLoginModule required"
  local scram="org.apache.kafka.common.security.scram.ScramLoginModule required"
  (umask 077 && cat > "$dir/server.properties") <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=$listeners,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=$listeners
controller.listener.names=CONTROLLER
listener.security.protocol.map=$protocols,CONTROLLER:SASL_PLAINTEXT
inter.broker.listener.name=CLIENT
# Clients (and the broker to itself) log in with SCRAM; the users live in the metadata log.
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.client.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.client.scram-sha-512.sasl.jaas.config=$scram username="admin" password="$password";
# The controller cannot read SCRAM users before the metadata log is up: PLAIN, one user.
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=$plain username="admin" password="$password" user_admin="$password";
# Whatever no ACL allows is refused; admin is the operator.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin
log.dirs=$dir/data
# One broker: internal topics cannot be replicated.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Placement's standby takes over within seconds of its active's death: a 3 s session.
group.min.session.timeout.ms=1000
# Quartermaster creates its topics explicitly (libs/bus/topics.py).
auto.create.topics.enable=false
num.partitions=1
PROPS
  tls_config >> "$dir/server.properties"
}

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

start() {
  if running; then echo "kafka: already running on 127.0.0.1:$port"; return; fi
  command -v java >/dev/null || { echo "kafka: java (17+) is required" >&2; exit 1; }
  fetch_jars
  write_config
  if [ ! -f "$dir/data/meta.properties" ]; then
    local cluster_id
    cluster_id="$(java "${java_args[@]}" kafka.tools.StorageTool random-uuid)"
    java "${java_args[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" \
      --add-scram "SCRAM-SHA-512=[name=admin,password=$(admin_password)]" >/dev/null
    echo "kafka: formatted KRaft storage in $dir/data (cluster $cluster_id)"
  fi
  : > "$dir/logs/server.log"
  java "${java_args[@]}" kafka.Kafka "$dir/server.properties" </dev/null >"$dir/logs/stdout.log" 2>&1 &
  echo $! > "$pidfile"
  for _ in $(seq 1 120); do
    if grep -q "Kafka Server started" "$dir/logs/server.log" 2>/dev/null \
      && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "kafka: ready on 127.0.0.1:$port (data in $dir)"
      return
    fi
    if ! running; then
      echo "kafka: the broker exited; last lines of its logs:" >&2
      tail -n 30 "$dir/logs/stdout.log" "$dir/logs/server.log" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "kafka: not ready after 60 s; see $dir/logs/server.log" >&2
  exit 1
}

stop() {
  if ! running; then rm -f "$pidfile"; echo "kafka: not running"; return; fi
  local pid; pid="$(cat "$pidfile")"
  kill -TERM "$pid"
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; echo "kafka: stopped"; return; }
    sleep 0.5
  done
  echo "kafka: did not stop in 30 s, killing" >&2
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

status() {
  if running; then echo "kafka: running (pid $(cat "$pidfile")) on 127.0.0.1:$port"
  else echo "kafka: not running"; return 1; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
