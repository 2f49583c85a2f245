#!/usr/bin/env bash
# Make sure what the tests need outside Python is there: a JVM for Spark, a
# reachable PostgreSQL server with a `test` database, Maven, headless Chromium and Prometheus's promtool.
# Idempotent; installs with apt only what is missing (CI and new machines start bare).
set -euo pipefail

log() { echo "[ensure-services] $*" >&2; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then $SUDO apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

# --- Java (Spark 4 needs 17 or newer) -------------------------------------
if ! command -v java >/dev/null 2>&1; then
  log "no java: installing openjdk-17-jre-headless"
  apt_install openjdk-17-jre-headless
fi

# --- Maven (scripts/jars.py fetches the JVM peers' jars with it: jars/pom.xml) ---------
if ! command -v mvn >/dev/null 2>&1; then
  log "no mvn: installing maven"
  apt_install maven
fi

# --- PostgreSQL (and Chromium and promtool, for the HTML report's and the alert rules' tests) ---
if [ "${1:-}" = "--java-only" ]; then
  exit 0
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  log "no chromium: installing it (tests/cli/test_report.py renders the HTML report headless)"
  apt_install chromium
fi
if ! command -v promtool >/dev/null 2>&1; then
  # Debian's prometheus package ships promtool. Installing the package would also install (and,
  # under systemd, start) a Prometheus server and ~200 MB of web assets: unpack promtool alone.
  log "no promtool: unpacking it from Debian's prometheus package (tests/serve/test_dashboards.py checks docs/prometheus with it)"
  if [ "$apt_updated" = 0 ]; then $SUDO apt-get update -qq; apt_updated=1; fi
  tmp=$(mktemp -d) && chmod a+rwx "$tmp"  # apt downloads as its own user
  (cd "$tmp" && apt-get download -qq prometheus >/dev/null && dpkg-deb -x prometheus_*.deb x)
  $SUDO install -m 0755 "$tmp/x/usr/bin/promtool" /usr/local/bin/promtool
  rm -rf "$tmp"
fi
if [ -n "${LAKESTEP_TEST_PG_URL:-}" ]; then
  log "using LAKESTEP_TEST_PG_URL"
  exit 0
fi
port_open() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }

if ! port_open; then
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    log "no PostgreSQL: installing it"
    apt_install postgresql
  fi
  version=$(ls /etc/postgresql | sort -V | tail -1)
  hba=/etc/postgresql/$version/main/pg_hba.conf
  if ! grep -q "lakestep-tests" "$hba"; then
    # Test machines only: trust loopback connections, as the preinstalled server does.
    log "allowing trusted loopback connections in $hba"
    $SUDO sed -i '1i host all all 127.0.0.1/32 trust # lakestep-tests\nhost all all ::1/128 trust # lakestep-tests' "$hba"
  fi
  log "starting PostgreSQL $version"
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 60); do port_open && break; sleep 0.5; done
  port_open || { log "PostgreSQL did not come up on 127.0.0.1:5432"; exit 1; }
fi

# The `test` database the suite uses (each test works in a schema of its own).
if command -v psql >/dev/null 2>&1; then
  if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc "select 1 from pg_database where datname='test'" | grep -q 1; then
    log "creating database test"
    psql -h 127.0.0.1 -U postgres -d postgres -qc "create database test"
  fi
fi
log "java, maven, chromium, promtool and PostgreSQL ready"
