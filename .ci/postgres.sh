#!/usr/bin/env bash
# Set up a local PostgreSQL for the store tests (Debian 12, run as root).
# Idempotent: safe to run again on a machine where it already ran.
# The last line printed is `export ETRAIN_TEST_POSTGRES_URL=...`; CI evals it:
#   eval "$(.ci/postgres.sh | tail -n 1)"
set -euo pipefail

PG_USER=etrain
PG_PASSWORD=etrain
PG_DB=etrain_test
PG_PORT=5432

log() { echo "postgres.sh: $*" >&2; }

if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
  log "installing postgresql"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2
  apt-get install -y postgresql >&2
fi

# Newest installed major version (Debian 12 ships 15, but do not hard-code it).
PG_VERSION=$(ls /etc/postgresql | sort -V | tail -n 1)
if [ -z "$PG_VERSION" ] || [ ! -d "/etc/postgresql/$PG_VERSION/main" ]; then
  log "no cluster under /etc/postgresql/<version>/main; creating one"
  PG_VERSION=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
  pg_createcluster "$PG_VERSION" main >&2
fi

if ! pg_ctlcluster "$PG_VERSION" main status >/dev/null 2>&1; then
  log "starting cluster $PG_VERSION/main"
  # Containers often lack a running init system, so pg_ctlcluster, not systemctl.
  pg_ctlcluster "$PG_VERSION" main start >&2
fi

# Wait for the server to accept connections (start returns before it is ready
# on slow machines).
for _ in $(seq 1 30); do
  if su postgres -c "pg_isready -q -p $PG_PORT"; then break; fi
  sleep 1
done
su postgres -c "pg_isready -p $PG_PORT" >&2

psql_admin() { su postgres -c "psql -v ON_ERROR_STOP=1 -q -p $PG_PORT -tA $*"; }

if [ "$(psql_admin "-c \"SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER'\"")" != "1" ]; then
  log "creating role $PG_USER"
  psql_admin "-c \"CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD'\""
else
  psql_admin "-c \"ALTER ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD'\""
fi

if [ "$(psql_admin "-c \"SELECT 1 FROM pg_database WHERE datname = '$PG_DB'\"")" != "1" ]; then
  log "creating database $PG_DB"
  psql_admin "-c \"CREATE DATABASE $PG_DB OWNER $PG_USER\""
fi
# Tests create and drop a schema per test, so the role needs CREATE on the database.
psql_admin "-c \"GRANT ALL PRIVILEGES ON DATABASE $PG_DB TO $PG_USER\""

echo "export ETRAIN_TEST_POSTGRES_URL=postgresql+psycopg://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB"
