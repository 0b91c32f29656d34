#!/bin/sh
# A throwaway Postgres 15 cluster on 127.0.0.1:PORT for benchmarks that need settings the shared
# server must keep (autovacuum, shared_preload_libraries): the shared server is never touched.
# Same settings as the shared one (fsync on, shared_buffers 128MB, 100 connections), plus the
# -c settings given. As root it runs as the postgres user. Stop and remove it with:
#   runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D DIR/data -m fast stop; rm -rf DIR
# usage: bench/throwaway_postgres.sh PORT DIR [-c name=value ...]
set -eu
port=$1 dir=$2
shift 2
bin=/usr/lib/postgresql/15/bin
as_pg=""
[ "$(id -u)" = 0 ] && as_pg="runuser -u postgres --"
mkdir -p "$dir"
[ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
$as_pg "$bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
opts="-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$dir -c fsync=on"
opts="$opts -c shared_buffers=128MB -c max_connections=100 $*"
$as_pg "$bin/pg_ctl" -D "$dir/data" -o "$opts" -l "$dir/log" -w -t 30 start >/dev/null
$as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -tAc "CREATE ROLE root SUPERUSER LOGIN"
echo "postgresql://postgres@127.0.0.1:$port/postgres"
