#!/usr/bin/env bash
# A one-node Slurm cluster on this machine (Debian/Ubuntu, root, no systemd or cgroups needed),
# for the tests marked `slurm` and for trying sweeps with hydra/launcher=slurm_cpu.
#
#   scripts/slurm-single-node.sh                  install what is missing, configure, start, wait until idle
#   scripts/slurm-single-node.sh --no-accounting  the same without slurmdbd/MariaDB (no sacct)
#   scripts/slurm-single-node.sh status           which daemons run, and sinfo
#   scripts/slurm-single-node.sh stop             stop the daemons by their pid files
#
# Idempotent: a second `start` with everything running does nothing. Exit status 3: this machine
# cannot run the cluster (not root, no apt-get, a daemon did not come up); the reason is printed.
set -euo pipefail

ACCOUNTING=1
ACTION=start
for arg in "$@"; do
  case "$arg" in
    --no-accounting) ACCOUNTING=0 ;;
    start|status|stop) ACTION=$arg ;;
    *) echo "usage: $0 [start|status|stop] [--no-accounting]" >&2; exit 2 ;;
  esac
done

RUN=/run/slurm
CONF=/etc/slurm/slurm.conf
DB_PID=/run/mysqld/mysqld.pid
DAEMONS="slurmd slurmctld slurmdbd"   # stop order: node, controller, accounting

cannot() { echo "slurm-single-node: cannot run Slurm here: $*" >&2; exit 3; }

alive() {  # alive PIDFILE: the process named in PIDFILE runs
  [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE: SIGTERM, wait up to 30 s
  local pid
  alive "$2" || { rm -f "$2"; return 0; }
  pid=$(cat "$2")
  kill "$pid"
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && { echo "$1 ($pid) did not stop" >&2; return 1; }
  rm -f "$2"
  echo "stopped $1"
}

do_status() {
  local name
  for name in $DAEMONS; do
    if alive "$RUN/$name.pid"; then echo "$name: running ($(cat "$RUN/$name.pid"))"; else echo "$name: stopped"; fi
  done
  if alive "$DB_PID"; then echo "mariadbd: running"; else echo "mariadbd: stopped"; fi
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then echo "munged: running"; else echo "munged: stopped"; fi
  alive "$RUN/slurmctld.pid" && sinfo || true
}

do_stop() {
  local name
  for name in $DAEMONS; do stop_pidfile "$name" "$RUN/$name.pid"; done
  stop_pidfile mariadbd "$DB_PID"
  stop_pidfile munged /run/munge/munged.pid
}

install_missing() {
  local wanted=(slurmctld slurmd slurm-client munge) missing=() pkg
  ((ACCOUNTING)) && wanted+=(slurmdbd mariadb-server)
  for pkg in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null || cannot "no apt-get to install ${missing[*]}"
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || cannot "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || cannot "apt-get install ${missing[*]} failed"
}

start_munge() {
  [[ -s /etc/munge/munge.key ]] || mungekey --create >/dev/null
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
  runuser -u munge -- munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0; sleep 0.1; done
  cannot "munged did not start"
}

write_conf() {  # prints "changed" when slurm.conf was (re)written
  local node cpus mem host new
  node=$(slurmd -C | head -1)
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")
  mem=$(( $(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node") * 9 / 10 ))
  host=$(hostname -s)
  new=$(cat <<EOF
# Written by scripts/slurm-single-node.sh: one node, no systemd, no cgroups.
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
ReturnToService=2
MinJobAge=3600
KillWait=5
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
$(if ((ACCOUNTING)); then
    echo "AccountingStorageType=accounting_storage/slurmdbd"
    echo "AccountingStorageHost=127.0.0.1"
    echo "JobAcctGatherType=jobacct_gather/linux"
  else
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
  fi)
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
  if [[ ! -f $CONF ]] || [[ "$(cat "$CONF")" != "$new" ]]; then
    printf '%s\n' "$new" >"$CONF"
    echo changed
  fi
}

start_accounting() {
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  if ! mariadb-admin ping >/dev/null 2>&1; then
    setsid mariadbd --user=mysql --pid-file="$DB_PID" >/var/log/slurm/mariadbd.log 2>&1 </dev/null &
    for _ in $(seq 100); do mariadb-admin ping >/dev/null 2>&1 && break; sleep 0.1; done
    mariadb-admin ping >/dev/null 2>&1 || cannot "mariadbd did not start (see /var/log/slurm/mariadbd.log)"
  fi
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
              CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  cat >/etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
  if ! alive "$RUN/slurmdbd.pid"; then
    slurmdbd
    for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.1; done
    sacctmgr -n list cluster >/dev/null 2>&1 || cannot "slurmdbd did not start (see /var/log/slurm/slurmdbd.log)"
  fi
  sacctmgr -n list cluster format=cluster | grep -qw local || sacctmgr -i add cluster local >/dev/null
}

do_start() {
  [[ $(id -u) == 0 ]] || cannot "not root (the daemons run as root here)"
  install_missing
  mkdir -p "$RUN" /var/log/slurm /var/spool/slurmctld /var/spool/slurmd
  start_munge
  if [[ -n "$(write_conf)" ]]; then  # a new configuration: restart what runs
    for name in slurmd slurmctld; do stop_pidfile "$name" "$RUN/$name.pid" >/dev/null; done
  fi
  ((ACCOUNTING)) && start_accounting
  alive "$RUN/slurmctld.pid" || slurmctld || cannot "slurmctld did not start (see /var/log/slurm/slurmctld.log)"
  alive "$RUN/slurmd.pid" || slurmd || cannot "slurmd did not start (see /var/log/slurm/slurmd.log)"
  local state=""
  for _ in $(seq 300); do
    state=$(sinfo -h -N -o %T 2>/dev/null | head -1)
    case "$state" in
      idle|mixed|allocated) break ;;
      down*|drain*) scontrol update NodeName="$(hostname -s)" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.1
  done
  [[ $state == idle || $state == mixed || $state == allocated ]] || cannot "the node is '${state:-unknown}', not idle"
  srun -t 1 true || cannot "srun -t 1 true failed"
  echo "Slurm is up: partition 'debug', node $(hostname -s) ($(sinfo -h -o '%c CPUs, %m MB')); stop it with: $0 stop"
}

case "$ACTION" in
  start) do_start ;;
  status) do_status ;;
  stop) do_stop ;;
esac
