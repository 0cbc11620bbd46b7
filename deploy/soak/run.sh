#!/bin/sh
# Runs `llmq soak` against a private RabbitMQ node and a private Postgres
# cluster that this script starts, so the soak's restarts touch nothing
# else on the machine; both are stopped at the end. Run it from the
# repository root, as root or as a user that can run rabbitmq-server and
# initdb (as root, RabbitMQ runs as user rabbitmq and Postgres as postgres).
#
#   deploy/soak/run.sh [llmq soak flags]      e.g. --duration 30m (the default)
#
# Environment: SOAK_DIR (default /tmp/llmq-soak-services), SOAK_PG_PORT
# (5433), SOAK_AMQP_PORT (5673), SOAK_DIST_PORT (25673), SOAK_NODE
# (soak@localhost).
set -eu

dir=${SOAK_DIR:-/tmp/llmq-soak-services}
pg_port=${SOAK_PG_PORT:-5433}
amqp_port=${SOAK_AMQP_PORT:-5673}
dist_port=${SOAK_DIST_PORT:-25673}
node=${SOAK_NODE:-soak@localhost}
vhost=soak-$(date +%s)

as() { # as <user> <command>: run a command as user when we are root
	if [ "$(id -u)" = 0 ]; then su "$1" -s /bin/sh -c "$2"; else sh -c "$2"; fi
}
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$pgbin" ] || pgbin=$(dirname "$(command -v initdb)")
rmqbin=/usr/lib/rabbitmq/bin
[ -x "$rmqbin/rabbitmq-server" ] || rmqbin=$(dirname "$(command -v rabbitmq-server)")

mkdir -p "$dir/rmq" "$dir/pg"
if [ "$(id -u)" = 0 ]; then chown rabbitmq "$dir/rmq"; chown postgres "$dir/pg"; fi

# A second RabbitMQ node: its own name, ports, data and config (the
# machine's rabbitmq.conf may pin the default listener).
cat > "$dir/rmq/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$amqp_port
loopback_users = none
CONF
rmqenv="HOME=\${HOME:-/var/lib/rabbitmq} RABBITMQ_NODENAME=$node RABBITMQ_NODE_PORT=$amqp_port RABBITMQ_DIST_PORT=$dist_port \
RABBITMQ_CONFIG_FILE=$dir/rmq/rabbitmq RABBITMQ_MNESIA_BASE=$dir/rmq/mnesia RABBITMQ_LOG_BASE=$dir/rmq/log \
RABBITMQ_ENABLED_PLUGINS_FILE=$dir/rmq/enabled_plugins"
ctl="rabbitmqctl -n $node"
if ! $ctl status >/dev/null 2>&1; then
	as rabbitmq "cd /tmp && $rmqenv $rmqbin/rabbitmq-server -detached"
	$ctl wait --timeout 120 "$dir/rmq/mnesia/$node.pid" >/dev/null 2>&1 || $ctl await_startup --timeout 120
fi
$ctl add_vhost "$vhost" >/dev/null
$ctl set_permissions -p "$vhost" guest ".*" ".*" ".*" >/dev/null

# A private Postgres cluster.
pgdata=$dir/pg/data
if [ ! -f "$pgdata/PG_VERSION" ]; then
	as postgres "$pgbin/initdb -D $pgdata -U postgres --auth=trust -E UTF8 >/dev/null"
fi
if ! as postgres "$pgbin/pg_ctl -D $pgdata status" >/dev/null 2>&1; then
	as postgres "$pgbin/pg_ctl -D $pgdata -l $dir/pg/server.log -w -o '-p $pg_port -k $dir/pg -c listen_addresses=127.0.0.1' start" >/dev/null
fi

stop() {
	$ctl delete_vhost "$vhost" >/dev/null 2>&1 || true
	$ctl stop >/dev/null 2>&1 || true
	as postgres "$pgbin/pg_ctl -D $pgdata -m fast stop" >/dev/null 2>&1 || true
}
trap stop EXIT

# Fresh binaries side by side: llmq soak runs the consumer and producer
# next to it.
mkdir -p "$dir/bin"
go build -o "$dir/bin/" ./cmd/llmq ./cmd/consumer ./cmd/producer
"$dir/bin/llmq" soak \
	--postgres-url "postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable" \
	--amqp-url "amqp://guest:guest@127.0.0.1:$amqp_port/$vhost" \
	--restart-rabbitmq-cmd "$ctl stop_app && $ctl start_app" \
	--restart-postgres-cmd "$(if [ "$(id -u)" = 0 ]; then echo "su postgres -s /bin/sh -c '$pgbin/pg_ctl -D $pgdata -l $dir/pg/server.log -m fast -w restart'"; else echo "$pgbin/pg_ctl -D $pgdata -l $dir/pg/server.log -m fast -w restart"; fi)" \
	"$@"
