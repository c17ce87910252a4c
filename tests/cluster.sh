#!/usr/bin/env bash
# A throwaway 3-node RabbitMQ cluster for the integration tests, run beside
# (never instead of) the machine's own broker.
#
#   tests/cluster.sh start        start the cluster, or leave a running one
#                                 alone; waits for 3 running nodes and prints
#                                 the nodes' AMQP URLs, one a line
#   tests/cluster.sh stop         stop every node and remove the base dir
#   tests/cluster.sh status       each node's state and the running nodes;
#                                 exit 0 only when 3 nodes run clustered
#   tests/cluster.sh kill N       SIGKILL node N's Erlang VM (beam.smp)
#   tests/cluster.sh restart N    bring node N back (relaunch it if its VM is
#                                 gone, else stop_app + start_app) and wait
#                                 for 3 running nodes again
#
# Node N (1..3) is dlqctlN@localhost: AMQP on 127.0.0.1:568(N-1), the
# management API on 127.0.0.1:1568(N-1), Erlang distribution on
# 2568(N-1). Each node has its own directory $BASE/nodeN (BASE is
# $DLQCTL_CLUSTER_DIR, default /tmp/dlqctl-cluster) with its own
# rabbitmq.conf, enabled_plugins, env file, mnesia, logs and pid file, so
# nothing of /etc/rabbitmq (the main node's config) is read. Nodes 2 and 3
# join node 1 with stop_app / join_cluster / start_app.
#
# Erlang cookie: the nodes start through the same `rabbitmq-server` as the
# machine's broker and are driven through `rabbitmqctl`. On Debian, root's
# calls of both switch to the rabbitmq user, so nodes and CLI share that
# user's ~/.erlang.cookie (/var/lib/rabbitmq/.erlang.cookie); elsewhere both
# run as the caller and share the caller's. This script never reads or
# writes a cookie.
#
# Only processes this script identifies as its own nodes are ever stopped
# or killed: a beam.smp whose environment names one of our node names and
# our data directory. The machine's broker (rabbit@localhost, 5672) is left
# alone.
#
# Environment: DLQCTL_CLUSTER_DIR (base dir), DLQCTL_CLUSTER_HOST (host part
# of the node names, default localhost), DLQCTL_CLUSTER_TIMEOUT (seconds to
# wait for nodes and the cluster, default 180).
set -euo pipefail

BASE=${DLQCTL_CLUSTER_DIR:-/tmp/dlqctl-cluster}
BASE=${BASE%/}
HOST=${DLQCTL_CLUSTER_HOST:-localhost}
TIMEOUT=${DLQCTL_CLUSTER_TIMEOUT:-180}
NODES=3
MARKER=.dlqctl-cluster
# The lock is beside the base dir, so `stop` can remove the dir under it
# (the empty lock file stays).
LOCK="$BASE.lock"

say() { echo "cluster: $*" >&2; }
die() {
  say "$*"
  exit 1
}

node_name() { echo "dlqctl$1@$HOST"; }
amqp_port() { echo $((5679 + $1)); }
mgmt_port() { echo $((15679 + $1)); }
dist_port() { echo $((25679 + $1)); }
node_dir() { echo "$BASE/node$1"; }
amqp_url() { echo "amqp://guest:guest@127.0.0.1:$(amqp_port "$1")/%2f"; }

ctl() { rabbitmqctl "$@"; }

require_rabbitmq() {
  local missing=
  command -v rabbitmq-server >/dev/null 2>&1 || missing="rabbitmq-server"
  command -v rabbitmqctl >/dev/null 2>&1 || missing="$missing rabbitmqctl"
  [ -z "$missing" ] || die "$missing not found on PATH: install RabbitMQ (Debian/Ubuntu: \`apt-get install rabbitmq-server\`; the management plugin comes with it)"
}

lock() {
  mkdir -p "$(dirname "$BASE")"
  exec 9>"$LOCK"
  flock -w "$TIMEOUT" 9 || die "another tests/cluster.sh holds $LOCK"
}

# --------------------------------------------------------------- one node

# The state of node $1: down (no VM answers), ready (booted), stopped
# (VM up, app stopped), or the boot state while it boots.
node_state() {
  local out
  if out=$(ctl -n "$(node_name "$1")" -q eval 'rabbit_boot_state:get().' 2>/dev/null); then
    echo "$out"
  else
    echo down
  fi
}

# Writes node $1's files unless they exist. $2: extra rabbitmq.conf lines
# (new-style format), appended as given: see start_standalone.
prepare_node() {
  local i=$1 extra=${2-} dir
  dir=$(node_dir "$i")
  [ -f "$dir/rabbitmq.conf" ] && return 0
  mkdir -p "$dir/mnesia" "$dir/log"
  {
    echo "# node $i of tests/cluster.sh (generated; /etc/rabbitmq is not used)"
    echo "listeners.tcp.local = 127.0.0.1:$(amqp_port "$i")"
    echo "management.tcp.ip = 127.0.0.1"
    echo "management.tcp.port = $(mgmt_port "$i")"
    # guest may log in from loopback only (the default); every listener is
    # on 127.0.0.1 anyway.
    echo "loopback_users.guest = true"
    # Fresher management statistics (queue members, counts) for the tests.
    echo "collect_statistics_interval = 1000"
    echo "log.console = false"
    echo "log.file.level = info"
    if [ -n "$extra" ]; then
      printf '%s\n' "$extra"
    fi
  } >"$dir/rabbitmq.conf"
  echo '[rabbitmq_management].' >"$dir/enabled_plugins"
  # Replaces /etc/rabbitmq/rabbitmq-env.conf (which names the main node).
  echo "# empty on purpose: see tests/cluster.sh" >"$dir/rabbitmq-env.conf"
  own "$dir"
}

# On Debian, root's `rabbitmq-server` runs the node as the rabbitmq user.
own() {
  if [ "$(id -u)" = 0 ] && id rabbitmq >/dev/null 2>&1; then
    chown -R rabbitmq: "$@"
  fi
}

# Starts node $1's VM in its own session (it outlives this script and the
# test that ran it), output to its startup.log.
launch_node() {
  local i=$1 dir name
  dir=$(node_dir "$i")
  name=$(node_name "$i")
  [ -f "$dir/rabbitmq.conf" ] || die "node $i was never set up (run \`$0 start\`)"
  rm -f "$dir/pid"
  : >"$dir/log/startup.log"
  own "$dir/log/startup.log"
  say "starting $name (AMQP $(amqp_port "$i"), management $(mgmt_port "$i"), distribution $(dist_port "$i"))"
  (
    exec 9>&- # not the lock: the node outlives this script
    cd "$dir"
    export RABBITMQ_NODENAME="$name" \
      RABBITMQ_NODE_PORT="$(amqp_port "$i")" \
      RABBITMQ_DIST_PORT="$(dist_port "$i")" \
      RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
      RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
      RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
      RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
      RABBITMQ_MNESIA_BASE="$dir/mnesia" \
      RABBITMQ_LOG_BASE="$dir/log" \
      RABBITMQ_PID_FILE="$dir/pid" \
      RABBITMQ_MOTD_FILE="$dir/motd" \
      RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
      ERL_EPMD_ADDRESS=127.0.0.1 \
      ERL_CRASH_DUMP="$dir/log/erl_crash.dump"
    exec setsid rabbitmq-server </dev/null >>"$dir/log/startup.log" 2>&1
  ) &
}

# The pids of node $1's beam.smp: processes of that name whose environment
# has our node name and our mnesia base (so never another broker's VM).
node_pids() {
  local i=$1 name dir p env
  name=$(node_name "$i")
  dir=$(node_dir "$i")
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = beam.smp ] || continue
    env=$(tr '\0' '\n' 2>/dev/null <"$p/environ") || continue
    if grep -qxF "RABBITMQ_NODENAME=$name" <<<"$env" &&
      grep -qxF "RABBITMQ_MNESIA_BASE=$dir/mnesia" <<<"$env"; then
      echo "${p#/proc/}"
    fi
  done
}

show_logs() {
  local dir
  dir=$(node_dir "$1")
  say "last lines of $dir/log:"
  tail -n 20 "$dir/log/startup.log" "$dir/log/$(node_name "$1").log" >&2 2>/dev/null || true
}

# Waits until node $1 has booted; starts its app when the VM runs with
# the app stopped.
wait_ready() {
  local i=$1 deadline state
  deadline=$((SECONDS + TIMEOUT))
  while :; do
    state=$(node_state "$i")
    case $state in
      ready) return 0 ;;
      stopped)
        say "$(node_name "$i"): app stopped, starting it"
        ctl -n "$(node_name "$i")" -q start_app >&2 || true
        ;;
      down)
        if [ -z "$(node_pids "$i")" ] && [ $((deadline - SECONDS)) -lt $((TIMEOUT - 20)) ]; then
          show_logs "$i"
          die "$(node_name "$i") is not running (its VM exited)"
        fi
        ;;
    esac
    if [ "$SECONDS" -ge "$deadline" ]; then
      show_logs "$i"
      die "$(node_name "$i") did not boot within ${TIMEOUT}s (last state: $state)"
    fi
    sleep 1
  done
}

# `cluster_status` of node $1 as JSON ("" when it does not answer).
cluster_json() {
  ctl -n "$(node_name "$1")" -q cluster_status --formatter json 2>/dev/null || true
}

# The names in the JSON list $1 of the JSON object on stdin.
json_list() {
  sed -n "s/.*\"$1\":\[\([^]]*\)\].*/\1/p" | tr -d '"' | tr ',' ' '
}

# The running nodes as a node that answers sees them (empty when none does).
running_nodes() {
  local i json
  for i in $(seq 1 $NODES); do
    json=$(cluster_json "$i")
    if [ -n "$json" ]; then
      echo "$json" | json_list running_nodes
      return 0
    fi
  done
}

count_words() { wc -w | tr -d ' '; }

# Whether node $1 is a member of node 1's cluster.
is_member() {
  cluster_json 1 | json_list disk_nodes | tr ' ' '\n' | grep -qxF "$(node_name "$1")"
}

join_node() {
  local n out
  n=$(node_name "$1")
  say "joining $n to $(node_name 1)"
  ctl -n "$n" -q stop_app >&2
  # join_cluster logs harmless "[error] Failed to create a tracked
  # connection table" lines (3.10): shown only when the join fails.
  if ! out=$(ctl -n "$n" -q join_cluster "$(node_name 1)" 2>&1); then
    echo "$out" >&2
    die "$n could not join $(node_name 1)"
  fi
  ctl -n "$n" -q start_app >&2
}

wait_cluster() {
  local deadline running
  deadline=$((SECONDS + TIMEOUT))
  while :; do
    running=$(running_nodes)
    [ "$(echo "$running" | count_words)" = "$NODES" ] && return 0
    if [ "$SECONDS" -ge "$deadline" ]; then
      die "the cluster did not have $NODES running nodes within ${TIMEOUT}s (running: ${running:-none})"
    fi
    sleep 1
  done
}

cluster_up() {
  local i
  for i in $(seq 1 $NODES); do
    [ "$(node_state "$i")" = ready ] || return 1
  done
  [ "$(running_nodes | count_words)" = "$NODES" ]
}

print_urls() {
  local i
  for i in $(seq 1 $NODES); do
    amqp_url "$i"
  done
}

# The hook for a node outside the cluster, e.g. with a TLS listener:
# starts node $1 (4..9: dlqctlN@HOST, AMQP 5679+N, management 15679+N,
# distribution 25679+N) with the extra rabbitmq.conf lines $2, never joined
# to the cluster, waits until it has booted and prints its AMQP URL. Use
# it from a script that sources this one (sourcing runs no command):
#   . tests/cluster.sh
#   start_standalone 4 "listeners.ssl.default = 5693
#   ssl_options.cacertfile = /path/ca.pem
#   ssl_options.certfile = /path/server.pem
#   ssl_options.keyfile = /path/server.key
#   ssl_options.verify = verify_none"
# The lines are used when the node's files are first written (after a
# `stop`, or a new index). `stop`, `kill 4` and `restart 4` work on it too.
start_standalone() {
  local i=${1-} extra=${2-}
  case $i in
    [4-9]) ;;
    *) die "start_standalone: the index must be 4..9 (1..$NODES are the cluster's), got '$i'" ;;
  esac
  require_rabbitmq
  lock
  mkdir -p "$BASE"
  touch "$BASE/$MARKER"
  prepare_node "$i" "$extra"
  if [ "$(node_state "$i")" = down ] && [ -z "$(node_pids "$i")" ]; then
    launch_node "$i"
  fi
  wait_ready "$i"
  exec 9>&-
  amqp_url "$i"
}

# --------------------------------------------------------------- commands

cmd_start() {
  local i fresh=
  require_rabbitmq
  lock
  if [ -f "$BASE/$MARKER" ] && cluster_up; then
    say "already running ($BASE)"
    print_urls
    return 0
  fi
  [ -f "$BASE/$MARKER" ] || fresh=yes
  mkdir -p "$BASE"
  touch "$BASE/$MARKER"
  for i in $(seq 1 $NODES); do
    prepare_node "$i"
    if [ "$(node_state "$i")" = down ] && [ -z "$(node_pids "$i")" ]; then
      launch_node "$i"
    fi
  done
  for i in $(seq 1 $NODES); do
    wait_ready "$i"
  done
  for i in $(seq 2 $NODES); do
    is_member "$i" || join_node "$i"
  done
  wait_cluster
  say "${fresh:+started; }$NODES nodes running ($BASE)"
  print_urls
}

stop_node() {
  local i=$1 n pid deadline
  n=$(node_name "$i")
  if [ "$(node_state "$i")" != down ]; then
    ctl -n "$n" -q stop >&2 || true
  fi
  deadline=$((SECONDS + 30))
  while [ -n "$(node_pids "$i")" ] && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 1
  done
  for pid in $(node_pids "$i"); do
    say "$n did not stop: SIGKILL $pid"
    kill -KILL "$pid" 2>/dev/null || true
  done
}

cmd_stop() {
  local i dir
  lock
  if [ ! -e "$BASE" ]; then
    say "nothing to stop ($BASE does not exist)"
    return 0
  fi
  [ -f "$BASE/$MARKER" ] || die "$BASE is not a tests/cluster.sh directory (no $MARKER): not touching it"
  # Every node dir, so a node started through the hook stops too.
  for dir in "$BASE"/node*; do
    [ -d "$dir" ] || continue
    i=${dir##*/node}
    stop_node "$i" &
  done
  wait
  rm -rf "$BASE"
  say "stopped; removed $BASE"
}

cmd_status() {
  local i state running ok=0
  require_rabbitmq
  for i in $(seq 1 $NODES); do
    state=$(node_state "$i")
    printf '%-22s %-8s %s  http://127.0.0.1:%s\n' "$(node_name "$i")" "$state" "$(amqp_url "$i")" "$(mgmt_port "$i")"
    [ "$state" = ready ] || ok=1
  done
  running=$(running_nodes)
  echo "running nodes: ${running:-none}"
  [ "$(echo "$running" | count_words)" = "$NODES" ] || ok=1
  return $ok
}

node_index() {
  case ${1-} in
    [1-9]) [ -d "$(node_dir "$1")" ] || die "node $1 does not exist under $BASE" ;;
    *) die "NODE_INDEX must be 1..$NODES, got '${1-}'" ;;
  esac
}

cmd_kill() {
  local i=$1 pids deadline
  node_index "$i"
  lock
  pids=$(node_pids "$i")
  [ -n "$pids" ] || die "$(node_name "$i") has no running VM"
  say "SIGKILL $(node_name "$i") (pid $pids)"
  # shellcheck disable=SC2086 # one pid a word
  kill -KILL $pids
  deadline=$((SECONDS + 30))
  while [ -n "$(node_pids "$i")" ]; do
    [ "$SECONDS" -lt "$deadline" ] || die "$(node_name "$i") still runs after SIGKILL"
    sleep 0.2
  done
}

cmd_restart() {
  local i=$1 n
  node_index "$i"
  require_rabbitmq
  lock
  n=$(node_name "$i")
  case $(node_state "$i") in
    down)
      # A VM that does not answer yet may still be booting.
      [ -n "$(node_pids "$i")" ] || launch_node "$i"
      ;;
    ready)
      say "restarting the app of $n"
      ctl -n "$n" -q stop_app >&2
      ctl -n "$n" -q start_app >&2
      ;;
  esac
  wait_ready "$i"
  if [ "$i" -le "$NODES" ]; then
    [ "$i" = 1 ] || is_member "$i" || join_node "$i"
    wait_cluster
  fi
  say "$n is back"
}

# Sourced (for start_standalone): define the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case ${1-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  kill) cmd_kill "${2-}" ;;
  restart) cmd_restart "${2-}" ;;
  *)
    echo "usage: $0 start | stop | status | kill NODE_INDEX | restart NODE_INDEX" >&2
    exit 2
    ;;
esac
