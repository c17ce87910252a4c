#!/usr/bin/env bash
# RabbitMQ 4.3 for the test suite, beside (never instead of) the machine's
# own broker: Debian sid's rabbitmq-server in a chroot of the project's.
#
#   tests/rabbitmq-4.sh start     build the chroot when missing, start the
#                                 node or leave a running one alone, wait
#                                 until AMQP and the management API answer,
#                                 then print the environment for the suite
#                                 (AMQP_URL=…, DLQCTL_MANAGEMENT_URL=…)
#   tests/rabbitmq-4.sh env       the same lines, without starting anything
#   tests/rabbitmq-4.sh status    exit 0 when the node answers; prints its version
#   tests/rabbitmq-4.sh stop      stop the node, unmount the chroot's /proc
#   tests/rabbitmq-4.sh ctl ARGS  rabbitmqctl ARGS against the node
#   tests/rabbitmq-4.sh destroy   stop, then remove the whole chroot
#
# Use it to run the suite against 4.3, as .ci/run does:
#
#   eval "$(tests/rabbitmq-4.sh start)" && cargo nextest run && cargo test --doc
#
# Ports, all on 127.0.0.1: AMQP 5675, management API 15675, AMQPS 5676
# (a certificate signed by a CA made here: $DIR/root/etc/rabbitmq/tls/ca.pem),
# Erlang distribution 25675, and an epmd of its own on 4375, so nothing is
# shared with the machine's broker (5672, 15672, 25672, epmd 4369) or with
# the other test nodes (tests/cluster.sh: 5680-5682; tests/tls-node.sh:
# 5688-5689).
#
# The chroot is $DLQCTL_RABBITMQ4_DIR, default target/rabbitmq-4.3 in the
# repository (ignored by git; under target/ because `cargo package` walks
# every other folder of the crate, and fails on the chroot's mounted /proc;
# `cargo clean` removes it). It is built from nothing by `start`:
# debootstrap (installed with apt-get when missing) of Debian sid, checked
# with the machine's Debian archive keyring, then `apt-get install
# rabbitmq-server` inside it. About 2 to 5 minutes and 400 MB the first
# time; a later `start` of a stopped node takes 10 to 30 s, of a running
# one a few seconds. The node keeps its data (mnesia) across stops; `destroy`
# starts over. Needs root (chroot, mount).
#
# Debian sid's archive here carries rabbitmq-server 4.3.6. Its Release file
# is past its Valid-Until date, so apt inside the chroot is told not to
# check that date (the signature is still checked).
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
DIR=${DLQCTL_RABBITMQ4_DIR:-$HERE/target/rabbitmq-4.3}
DIR=${DIR%/}
ROOT=$DIR/root
MIRROR=${DLQCTL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=sid
NODE=rabbit43@localhost
AMQP_PORT=5675
AMQPS_PORT=5676
MGMT_PORT=15675
DIST_PORT=25675
EPMD_PORT=4375
TIMEOUT=${DLQCTL_RABBITMQ4_TIMEOUT:-120}
LOCK="$DIR.lock"

say() { echo "rabbitmq-4: $*" >&2; }
die() {
  say "$*"
  exit 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Runs a command inside the chroot with a clean environment.
in_root() {
  chroot "$ROOT" /usr/bin/env -i \
    PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/rabbitmq LANG=C.UTF-8 \
    ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 "$@"
}

ctl() { in_root rabbitmqctl -n "$NODE" "$@"; }

print_env() {
  echo "export AMQP_URL='amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f'"
  echo "export DLQCTL_MANAGEMENT_URL='http://127.0.0.1:$MGMT_PORT'"
  echo "export DLQCTL_AMQPS_URL='amqps://guest:guest@localhost:$AMQPS_PORT/%2f'"
  echo "export DLQCTL_TLS_CA='$ROOT/etc/rabbitmq/tls/ca.pem'"
}

lock() {
  mkdir -p "$(dirname "$DIR")"
  exec 9>"$LOCK"
  flock -w 600 9 || die "another tests/rabbitmq-4.sh holds $LOCK"
}

apt_host() {
  apt-get update -q >&2 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2
}

# ------------------------------------------------------------- the chroot

build_root() {
  [ "$(id -u)" = 0 ] || die "building the chroot needs root (debootstrap, chroot)"
  command -v debootstrap >/dev/null 2>&1 || {
    say "installing debootstrap"
    apt_host debootstrap
  }
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [ -f "$keyring" ] || apt_host debian-archive-keyring
  say "debootstrap of Debian $SUITE into $ROOT (about a minute)"
  rm -rf "$ROOT"
  mkdir -p "$DIR"
  debootstrap --variant=minbase --keyring="$keyring" "$SUITE" "$ROOT" "$MIRROR" >"$DIR/debootstrap.log" 2>&1 ||
    die "debootstrap failed; see $DIR/debootstrap.log"
  echo 'Acquire::Check-Valid-Until "false";' >"$ROOT/etc/apt/apt.conf.d/99dlqctl-no-valid-until"
  # No service starts at install time: the node is started by this script.
  printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
  chmod +x "$ROOT/usr/sbin/policy-rc.d"
  printf '127.0.0.1 localhost\n::1 localhost ip6-localhost\n' >"$ROOT/etc/hosts"
  say "installing rabbitmq-server in the chroot"
  in_root apt-get update -q >"$DIR/apt.log" 2>&1 || die "apt-get update in the chroot failed; see $DIR/apt.log"
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    rabbitmq-server openssl >>"$DIR/apt.log" 2>&1 ||
    die "installing rabbitmq-server in the chroot failed; see $DIR/apt.log"
  in_root apt-get clean >/dev/null 2>&1 || true
  configure
  touch "$DIR/.built"
}

# The node's configuration: listeners on loopback only, fresh statistics.
configure() {
  local etc=$ROOT/etc/rabbitmq
  mkdir -p "$etc/tls"
  if [ ! -f "$etc/tls/server.pem" ]; then
    (
      cd "$etc/tls"
      openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 3650 \
        -subj "/CN=dlqctl rabbitmq-4 test CA" >/dev/null 2>&1
      printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext
      openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" >/dev/null 2>&1
      openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
        -days 3650 -extfile server.ext >/dev/null 2>&1
      chmod 644 ./*.pem ./*.key
    ) || die "openssl could not make the test certificates"
  fi
  cat >"$etc/rabbitmq.conf" <<CONF
# Written by tests/rabbitmq-4.sh (the test suite's RabbitMQ 4.3).
listeners.tcp.1 = 127.0.0.1:$AMQP_PORT
listeners.ssl.1 = 127.0.0.1:$AMQPS_PORT
ssl_options.cacertfile = /etc/rabbitmq/tls/ca.pem
ssl_options.certfile = /etc/rabbitmq/tls/server.pem
ssl_options.keyfile = /etc/rabbitmq/tls/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
management.tcp.ip = 127.0.0.1
management.tcp.port = $MGMT_PORT
collect_statistics_interval = 1000
log.console = false
CONF
  cat >"$etc/rabbitmq-env.conf" <<CONF
# Written by tests/rabbitmq-4.sh.
NODENAME=$NODE
DIST_PORT=$DIST_PORT
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
CONF
  echo '[rabbitmq_management].' >"$etc/enabled_plugins"
}

mount_proc() {
  # The node reads its memory use and the machine's from /proc.
  mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
}

unmount_proc() {
  if [ -d "$ROOT/proc" ] && mountpoint -q "$ROOT/proc"; then
    umount "$ROOT/proc" || umount -l "$ROOT/proc"
  fi
}

# ------------------------------------------------------------- the node

answers() {
  port_open $AMQP_PORT && port_open $MGMT_PORT && ctl -q await_startup --timeout 5 >/dev/null 2>&1
}

start_node() {
  mount_proc
  if answers; then
    return 0
  fi
  # A node that is half up (VM alive, app down) is stopped first.
  ctl -q stop >/dev/null 2>&1 || true
  say "starting RabbitMQ 4.3 ($NODE) on 127.0.0.1:$AMQP_PORT"
  # The lock's descriptor must not be inherited by the node.
  in_root rabbitmq-server -detached 9>&- >/dev/null 2>&1 || true
  local waited=0
  until answers; do
    waited=$((waited + 1))
    [ $waited -lt "$TIMEOUT" ] || die "the node did not answer within $TIMEOUT s; see $ROOT/var/log/rabbitmq/"
    sleep 1
  done
  say "up: $(ctl -q eval 'rabbit_misc:version().' 2>/dev/null | tr -d '"')"
}

# Stops the node (and epmd) when the root was built, and unmounts /proc.
stop_node() {
  if [ -f "$DIR/.built" ]; then
    ctl -q stop >/dev/null 2>&1 || true
    in_root epmd -kill >/dev/null 2>&1 || true
  fi
  unmount_proc
}

case ${1:-} in
  start)
    lock
    [ -f "$DIR/.built" ] || build_root
    configure
    start_node
    print_env
    ;;
  env)
    print_env
    ;;
  status)
    [ -f "$DIR/.built" ] || die "not built: run tests/rabbitmq-4.sh start"
    answers || die "not running"
    ctl -q eval 'rabbit_misc:version().' | tr -d '"'
    ;;
  stop)
    lock
    stop_node
    ;;
  ctl)
    shift
    ctl "$@"
    ;;
  destroy)
    lock
    stop_node
    rm -rf "$DIR"
    ;;
  *)
    sed -n '2,15p' "$0" >&2
    exit 2
    ;;
esac
