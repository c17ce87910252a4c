#!/usr/bin/env bash
# A standalone RabbitMQ node with TLS listeners, for the TLS tests; the
# machine's main broker is never touched.
#
#   tests/tls-node.sh start   # certificates + node; prints nothing on success
#   tests/tls-node.sh stop    # stops the node, removes its directory
#
# Node `dlqctltls@localhost`: plain AMQP on 5688, AMQPS on 5689 (the server
# certificate signed by a CA made here; clients may present a certificate,
# which the EXTERNAL mechanism maps to its CN), management over https on
# 15689. Everything lives in $DLQCTL_TLS_DIR (default /tmp/dlqctl-tls):
# ca.pem, server.pem, server.key, client.pem, client.key (CN=guest),
# expired.pem/expired.key (a server certificate that expired), other-ca.pem
# (a CA that signed nothing here).
set -euo pipefail
DIR=${DLQCTL_TLS_DIR:-/tmp/dlqctl-tls}
NODE=dlqctltls@localhost
export RABBITMQ_NODENAME=$NODE

env_for_node() {
  export RABBITMQ_NODE_PORT=5688
  export RABBITMQ_DIST_PORT=25688
  export RABBITMQ_CONFIG_FILE=$DIR/rabbitmq        # .conf is appended
  export RABBITMQ_ENABLED_PLUGINS_FILE=$DIR/enabled_plugins
  export RABBITMQ_MNESIA_BASE=$DIR/mnesia
  export RABBITMQ_LOG_BASE=$DIR/log
  export RABBITMQ_PID_FILE=$DIR/node.pid
  export RABBITMQ_ADVANCED_CONFIG_FILE=$DIR/advanced.config
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

certs() {
  cd "$DIR"
  local days=30
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days $days \
    -subj "/CN=dlqctl test CA" >/dev/null 2>&1
  openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days $days \
    -subj "/CN=another CA" >/dev/null 2>&1
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
  openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" >/dev/null 2>&1
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
    -days $days -extfile server.ext >/dev/null 2>&1
  printf 'extendedKeyUsage=clientAuth\n' > client.ext
  openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=guest" >/dev/null 2>&1
  openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem \
    -days $days -extfile client.ext >/dev/null 2>&1
  # A server certificate valid from 2020-01-01 to 2020-01-02, by a minimal CA.
  mkdir -p expired-ca/newcerts && : > expired-ca/index.txt && echo 01 > expired-ca/serial
  cat > expired-ca/ca.cnf <<CNF
[ca]
default_ca = c
[c]
dir = $DIR/expired-ca
database = \$dir/index.txt
new_certs_dir = \$dir/newcerts
serial = \$dir/serial
default_md = sha256
policy = p
copy_extensions = copy
[p]
commonName = supplied
CNF
  openssl req -newkey rsa:2048 -nodes -keyout expired.key -out expired.csr -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" >/dev/null 2>&1
  openssl ca -batch -config expired-ca/ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr \
    -out expired.pem -startdate 20200101000000Z -enddate 20200102000000Z -notext >/dev/null 2>&1
  chmod 644 ./*.pem ./*.key
}

config() {
  local cert=$1 key=$2
  cat > "$DIR/rabbitmq.conf" <<CONF
loopback_users = none
listeners.tcp.default = 5688
listeners.ssl.default = 5689
ssl_options.cacertfile = $DIR/ca.pem
ssl_options.certfile = $DIR/$cert
ssl_options.keyfile = $DIR/$key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
ssl_cert_login_from = common_name
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
management.ssl.port = 15689
management.ssl.cacertfile = $DIR/ca.pem
management.ssl.certfile = $DIR/$cert
management.ssl.keyfile = $DIR/$key
CONF
  echo '[rabbitmq_management,rabbitmq_auth_mechanism_ssl].' > "$DIR/enabled_plugins"
  echo '[].' > "$DIR/advanced.config"
}

wait_up() {
  for _ in $(seq 1 90); do
    if port_open 5689 && port_open 15689 && rabbitmqctl -n $NODE await_startup >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  echo "tls-node: the node did not start within 90 s; see $DIR/log" >&2
  return 1
}

case ${1:-} in
  start)
    # Test processes start it concurrently: one at a time.
    exec 9>"/tmp/dlqctl-tls-node.lock"
    flock 9
    if port_open 5689 && rabbitmqctl -n $NODE status >/dev/null 2>&1; then exit 0; fi
    mkdir -p "$DIR"
    [ -f "$DIR/ca.pem" ] || certs
    config server.pem server.key
    # Debian's wrapper runs the node as the rabbitmq user.
    if id rabbitmq >/dev/null 2>&1; then chown -R rabbitmq: "$DIR"; fi
    env_for_node
    # The lock fd must not be inherited by the node: it would hold the lock
    # for as long as the node runs.
    rabbitmq-server -detached 9>&- >/dev/null 2>&1 || true
    wait_up
    ;;
  stop)
    rabbitmqctl -n $NODE stop >/dev/null 2>&1 || true
    rm -rf "$DIR"
    ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
