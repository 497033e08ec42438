#!/usr/bin/env bash
# A one-node SLURM cluster on localhost, with accounting, for tests and for trying the SLURM launcher.
#
#   sudo slurm/local_cluster.sh up      # install (apt, first time only) and start; safe to run twice
#   sudo slurm/local_cluster.sh status  # which daemons run; sinfo
#   sudo slurm/local_cluster.sh down    # stop what `up` started, by PID; safe to run twice
#
# Debian/Ubuntu, as root (CI runs it on a fresh machine). Daemons: munged (as user munge), mariadbd (as
# mysql, 127.0.0.1 and a unix socket only), slurmdbd, slurmctld, and `slurmd -N localhost`, all as root.
# Accounting (slurmdbd) is not optional: submitit asks `sacct` for a job's state, and without it a job
# killed hard (SIGKILL, OOM) is never reported and the sweep waits forever.
# There is deliberately no cgroup.conf: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none
# (SLURM 22.05's slurmd dies on CgroupPlugin=disabled).
# Config: /etc/slurm/{slurm,slurmdbd}.conf (rewritten by `up`). Logs: /var/log/specdepth-slurm/.
set -euo pipefail

CLUSTER=${SPECDEPTH_SLURM_CLUSTER:-specdepth}
PARTITION=${SPECDEPTH_SLURM_PARTITION:-local}
ETC=/etc/slurm
RUN=/run/specdepth-slurm
LOG=/var/log/specdepth-slurm
LIB=/var/lib/specdepth-slurm
MYSQL_SOCK=/run/mysqld/mysqld.sock
MUNGE_PID=/run/munge/munged.pid
MARIADB_PID=/run/mysqld/specdepth-mariadb.pid   # mariadbd runs as mysql: its files live where mysql may write
PACKAGES=(munge mariadb-server slurmdbd slurmctld slurmd slurm-client)

say() { echo "local_cluster: $*"; }
die() { echo "local_cluster: error: $*" >&2; exit 1; }

# alive PIDFILE NAME: the process in PIDFILE exists and is NAME (guards against a recycled PID)
alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ -n $pid && -r /proc/$pid/comm ]] || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2"* ]] || return 1
  # a zombie (killed, not yet reaped) is not running
  [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}

# wait_for SECONDS WHAT CMD...: poll CMD every 0.25 s
wait_for() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || { say "timed out after ${limit}s waiting for $what"; return 1; }
    sleep 0.25
  done
}

install() {
  local missing=()
  command -v munged >/dev/null || missing+=(munge)
  command -v mariadbd >/dev/null || missing+=(mariadb-server)
  command -v slurmdbd >/dev/null || missing+=(slurmdbd)
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null && command -v sacctmgr >/dev/null || missing+=(slurm-client)
  ((${#missing[@]} == 0)) && return 0
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get: install SLURM yourself"
  say "installing ${PACKAGES[*]} (apt)"
  # no service may start during the install: this script starts the daemons itself
  local policy=/usr/sbin/policy-rc.d created=
  if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; created=1; fi
  local rc=0
  {
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >"$LOG/apt.log" 2>&1
  } || rc=$?
  [[ -n $created ]] && rm -f "$policy"
  ((rc == 0)) || { tail -n 30 "$LOG/apt.log" >&2 || true; die "apt-get install failed (log: $LOG/apt.log)"; }
}

write_if_changed() {  # write_if_changed FILE MODE < content
  local tmp; tmp=$(mktemp "$1.XXXXXX")
  cat >"$tmp"; chmod "$2" "$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

configure() {
  mkdir -p "$ETC" "$RUN" "$LOG" "$LIB/slurmctld" "$LIB/slurmd"
  local cpus mem
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  write_if_changed "$ETC/slurm.conf" 644 <<CONF
# Written by specdepth slurm/local_cluster.sh: a one-node cluster on localhost.
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$LIB/slurmctld
SlurmdSpoolDir=$LIB/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
MinJobAge=300
InactiveLimit=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  if [[ ! -s $LIB/dbpass ]]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$LIB/dbpass")
  fi
  write_if_changed "$ETC/slurmdbd.conf" 600 <<CONF
# Written by specdepth slurm/local_cluster.sh.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$(cat "$LIB/dbpass")
StorageLoc=slurm_acct_db
CONF
}

start_munge() {
  if [[ ! -s /etc/munge/munge.key ]]; then
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
  fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
  chmod 400 /etc/munge/munge.key; chmod 755 /run/munge; chmod 700 /etc/munge
  chown munge:munge /etc/munge
  if ! alive "$MUNGE_PID" munged; then
    runuser -u munge -- /usr/sbin/munged --force
  fi
  wait_for 15 munged bash -c 'munge -n | unmunge'
}

start_mariadb() {
  mkdir -p /run/mysqld "$LOG/mariadb"; chown mysql:mysql /run/mysqld "$LOG/mariadb"
  if [[ ! -d /var/lib/mysql/mysql ]]; then
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >"$LOG/mariadb-install.log" 2>&1
  fi
  if ! alive "$MARIADB_PID" mariadbd; then
    # unix socket only: no TCP port to collide with another database on this machine
    setsid -f mariadbd --user=mysql --datadir=/var/lib/mysql --socket="$MYSQL_SOCK" --skip-networking \
      --pid-file="$MARIADB_PID" --log-error="$LOG/mariadb/error.log" </dev/null >/dev/null 2>&1
  fi
  wait_for 30 mariadb mariadb-admin --socket="$MYSQL_SOCK" ping ||
    { tail -n 20 "$LOG/mariadb/error.log" >&2; die "mariadb did not start"; }
  local pass; pass=$(cat "$LIB/dbpass")
  mariadb --socket="$MYSQL_SOCK" <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
}

start_slurm() {
  if ! alive "$RUN/slurmdbd.pid" slurmdbd; then slurmdbd; fi
  wait_for 30 slurmdbd sacctmgr -n list cluster ||
    { tail -n 20 "$LOG/slurmdbd.log" >&2; die "slurmdbd did not start"; }
  if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
  if ! alive "$RUN/slurmctld.pid" slurmctld; then slurmctld; fi
  wait_for 30 slurmctld scontrol ping ||
    { tail -n 20 "$LOG/slurmctld.log" >&2; die "slurmctld did not start"; }
  if ! alive "$RUN/slurmd.pid" slurmd; then slurmd -N localhost; fi
  # a node left down or drained by an earlier run comes back
  local end=$((SECONDS + 45)) state
  while :; do
    state=$(sinfo -h -N -n localhost -o %T 2>/dev/null || true)
    case $state in
      idle*|mixed*|allocated*|completing*) break ;;
      down*|drain*|fail*) scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true ;;
    esac
    ((SECONDS < end)) || { tail -n 20 "$LOG/slurmd.log" >&2; die "node localhost is '$state', not idle"; }
    sleep 0.5
  done
}

up() {
  [[ $(id -u) == 0 ]] || die "run as root (it installs packages and starts system daemons)"
  local t0=$SECONDS
  mkdir -p "$LOG"
  install
  configure
  start_munge
  start_mariadb
  start_slurm
  say "up in $((SECONDS - t0)) s: cluster $CLUSTER, partition $PARTITION, node localhost ($(nproc) CPUs)"
  sinfo
}

stop() {  # stop PIDFILE NAME
  alive "$1" "$2" || { rm -f "$1"; return 0; }
  local pid; pid=$(cat "$1")
  kill "$pid" 2>/dev/null || true
  local end=$((SECONDS + 20)) killed=
  while alive "$1" "$2"; do
    if ((SECONDS >= end)) && [[ -z $killed ]]; then
      say "$2 ($pid) ignored SIGTERM for 20 s; SIGKILL"; kill -9 "$pid" 2>/dev/null || true; killed=1
    fi
    ((SECONDS < end + 10)) || { say "$2 ($pid) still there after SIGKILL; giving up"; break; }
    sleep 0.2
  done
  rm -f "$1"
  say "stopped $2 ($pid)"
}

down() {
  [[ $(id -u) == 0 ]] || die "run as root"
  if alive "$RUN/slurmctld.pid" slurmctld && command -v squeue >/dev/null; then
    # jobs die with the cluster: cancel them so that no slurmstepd outlives slurmd
    local jobs; jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      scancel $jobs 2>/dev/null || true
      wait_for 15 "jobs to end" bash -c '[[ -z $(squeue -h -t R,CG -o %i) ]]' || true
    fi
  fi
  stop "$RUN/slurmd.pid" slurmd
  stop "$RUN/slurmctld.pid" slurmctld
  stop "$RUN/slurmdbd.pid" slurmdbd
  stop "$MARIADB_PID" mariadbd
  stop "$MUNGE_PID" munged
}

status() {
  local f
  for f in "$MUNGE_PID:munged" "$MARIADB_PID:mariadbd" "$RUN/slurmdbd.pid:slurmdbd" \
           "$RUN/slurmctld.pid:slurmctld" "$RUN/slurmd.pid:slurmd"; do
    if alive "${f%%:*}" "${f##*:}"; then echo "${f##*:}: running ($(cat "${f%%:*}"))"; else echo "${f##*:}: stopped"; fi
  done
  command -v sinfo >/dev/null && sinfo 2>/dev/null || true
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
