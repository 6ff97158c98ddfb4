#!/usr/bin/env bash
# Installs (or with --uninstall removes) stallscope as a systemd service on a
# GPU host, and says what it did. What goes where:
#
#   /opt/stallscope/venv/                      the daemon: a venv made from the
#                                              system python3 (readable by the
#                                              service user; a python under /root
#                                              is not), pip install .[daemon],
#                                              Debian's bcc linked in
#   /usr/local/lib/systemd/system/stallscope.{service,socket}
#   /usr/local/lib/sysusers.d/stallscope.conf  user and group stallscope
#   /usr/local/lib/tmpfiles.d/stallscope.conf  /run/stallscope, /var/lib/stallscope
#   /etc/stallscope/stallscope.toml            config (an existing one is kept)
#   /usr/local/share/doc/stallscope/systemd.md
#
# Options:
#   --root DIR     stage everything under DIR (also: DESTDIR=DIR); paths inside
#                  the files stay as on the host. Nothing is started.
#   --venv DIR     use an existing environment whose bin/stallscope runs the
#                  daemon instead of creating /opt/stallscope/venv
#   --no-venv      install units and config only (the venv comes later)
#   --python PATH  interpreter for the venv (default /usr/bin/python3)
#   --uninstall    stop and remove all of the above; keeps the database
#                  (/var/lib/stallscope) and a config that was edited
#   --purge        with --uninstall: also remove the database and the config
#
# The user and group come from systemd-sysusers, the directories from
# systemd-tmpfiles; both run against --root when one is given.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${DESTDIR:-}
VENV=/opt/stallscope/venv
VENV_MODE=create
PYTHON=/usr/bin/python3
ACTION=install
PURGE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT=$2; shift 2 ;;
    --root=*) ROOT=${1#*=}; shift ;;
    --venv) VENV=$2; VENV_MODE=existing; shift 2 ;;
    --venv=*) VENV=${1#*=}; VENV_MODE=existing; shift ;;
    --no-venv) VENV_MODE=none; shift ;;
    --python) PYTHON=$2; shift 2 ;;
    --uninstall) ACTION=uninstall; shift ;;
    --purge) PURGE=1; shift ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
ROOT=${ROOT%/}
say() { printf 'stallscope install: %s\n' "$*"; }

UNITDIR=/usr/local/lib/systemd/system
SYSUSERS=/usr/local/lib/sysusers.d/stallscope.conf
TMPFILES=/usr/local/lib/tmpfiles.d/stallscope.conf
CONF=/etc/stallscope/stallscope.toml
DOC=/usr/local/share/doc/stallscope/systemd.md
BIN_LINK=/usr/local/bin/stallscope

# systemd is the service manager here (not just installed) and we act on this host.
live_systemd() { [ -z "$ROOT" ] && [ -d /run/systemd/system ]; }

put() {  # put SRC DEST MODE: install a file, saying so
  local from=$1 to=$ROOT$2 mode=$3
  install -D -m "$mode" "$from" "$to"
  say "installed $2"
}

if [ "$ACTION" = install ]; then
  [ -z "$ROOT" ] && [ "$(id -u)" != 0 ] && { echo "install.sh: run as root (or use --root DIR)" >&2; exit 1; }
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  sed -e "s#/opt/stallscope/venv/bin/stallscope#$VENV/bin/stallscope#" \
      -e "s#file:/usr/share/doc/stallscope/#file:/usr/local/share/doc/stallscope/#" \
      "$SRC/systemd/stallscope.service" > "$tmp/stallscope.service"
  sed -e "s#file:/usr/share/doc/stallscope/#file:/usr/local/share/doc/stallscope/#" \
      "$SRC/systemd/stallscope.socket" > "$tmp/stallscope.socket"
  put "$tmp/stallscope.service" "$UNITDIR/stallscope.service" 0644
  put "$tmp/stallscope.socket" "$UNITDIR/stallscope.socket" 0644
  put "$SRC/systemd/stallscope.sysusers.conf" "$SYSUSERS" 0644
  put "$SRC/systemd/stallscope.tmpfiles.conf" "$TMPFILES" 0644
  put "$SRC/docs/systemd.md" "$DOC" 0644
  if [ -e "$ROOT$CONF" ]; then
    if cmp -s "$SRC/systemd/stallscope.toml" "$ROOT$CONF"; then
      say "kept $CONF (unchanged)"
    else
      put "$SRC/systemd/stallscope.toml" "$CONF.new" 0644
      say "kept your edited $CONF; the shipped default is $CONF.new"
    fi
  else
    put "$SRC/systemd/stallscope.toml" "$CONF" 0644
  fi

  case "$VENV_MODE" in
    create)
      if [ ! -x "$ROOT$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$ROOT$VENV"
        say "created $VENV with $("$PYTHON" --version 2>&1) ($PYTHON)"
      fi
      "$ROOT$VENV/bin/pip" install -q --disable-pip-version-check "$SRC[daemon]"
      say "installed stallscope $("$ROOT$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("stallscope"))') and its packages into $VENV"
      site=$("$ROOT$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
      if [ -d /usr/lib/python3/dist-packages/bcc ] && [ ! -e "$site/bcc" ]; then
        ln -s /usr/lib/python3/dist-packages/bcc "$site/bcc"
        say "linked Debian's bcc package into $VENV"
      fi
      "$ROOT$VENV/bin/python" -m compileall -q "$site/stallscope" >/dev/null || true
      ;;
    existing)
      [ -x "$ROOT$VENV/bin/stallscope" ] || [ -x "$VENV/bin/stallscope" ] || {
        echo "install.sh: $VENV/bin/stallscope does not exist or is not executable" >&2; exit 1; }
      say "the service runs $VENV/bin/stallscope (existing environment)"
      ;;
    none) say "no venv installed: $VENV/bin/stallscope must exist before the service starts" ;;
  esac
  if [ "$VENV_MODE" != none ]; then
    mkdir -p "$ROOT$(dirname $BIN_LINK)"
    ln -sfn "$VENV/bin/stallscope" "$ROOT$BIN_LINK"
    say "linked $BIN_LINK -> $VENV/bin/stallscope"
  fi

  if [ -n "$ROOT" ]; then
    mkdir -p "$ROOT/etc"
    systemd-sysusers --root="$ROOT" "$ROOT$SYSUSERS" && say "created user and group stallscope under $ROOT"
    systemd-tmpfiles --root="$ROOT" --create "$ROOT$TMPFILES" && say "created /run/stallscope, /var/lib/stallscope under $ROOT"
    say "staged under $ROOT; nothing was started"
  else
    systemd-sysusers "$SYSUSERS" && say "user and group stallscope exist (systemd-sysusers)"
    systemd-tmpfiles --create "$TMPFILES" && say "directories exist (systemd-tmpfiles)"
    if live_systemd; then
      systemctl daemon-reload && say "systemctl daemon-reload"
      say "start it:  systemctl enable --now stallscope.socket stallscope.service"
    else
      say "systemd is not running here: units are in place for the next boot"
    fi
    say "let a user connect probes:  usermod -aG stallscope USER"
  fi
  exit 0
fi

# ----- uninstall --------------------------------------------------------------------
[ -z "$ROOT" ] && [ "$(id -u)" != 0 ] && { echo "install.sh: run as root (or use --root DIR)" >&2; exit 1; }
if live_systemd; then
  systemctl disable --now stallscope.service stallscope.socket 2>/dev/null \
    && say "stopped and disabled stallscope.service and stallscope.socket" || true
fi
remove() { if [ -e "$ROOT$1" ] || [ -L "$ROOT$1" ]; then rm -f "$ROOT$1"; say "removed $1"; fi; }
remove "$UNITDIR/stallscope.service"
remove "$UNITDIR/stallscope.socket"
remove "$SYSUSERS"
remove "$TMPFILES"
remove "$DOC"
rmdir "$ROOT$(dirname $DOC)" 2>/dev/null || true
if [ -L "$ROOT$BIN_LINK" ]; then remove "$BIN_LINK"; fi
if [ -d "$ROOT/opt/stallscope" ]; then rm -rf "$ROOT/opt/stallscope"; say "removed /opt/stallscope"; fi
remove "$CONF.new"
if [ -e "$ROOT$CONF" ]; then
  if [ "$PURGE" = 1 ] || cmp -s "$SRC/systemd/stallscope.toml" "$ROOT$CONF"; then
    remove "$CONF"; rmdir "$ROOT/etc/stallscope" 2>/dev/null || true
  else
    say "kept $CONF (edited; --purge removes it)"
  fi
fi
if [ "$PURGE" = 1 ]; then
  [ -d "$ROOT/var/lib/stallscope" ] && rm -rf "$ROOT/var/lib/stallscope" && say "removed /var/lib/stallscope (the database)"
  rm -rf "$ROOT/run/stallscope"
else
  [ -d "$ROOT/var/lib/stallscope" ] && say "kept /var/lib/stallscope (the database; --purge removes it)"
fi
for d in "$(dirname $DOC)" /usr/local/share/doc "$UNITDIR" /usr/local/lib/systemd \
         "$(dirname $SYSUSERS)" "$(dirname $TMPFILES)"; do
  rmdir "$ROOT$d" 2>/dev/null || true   # only if empty: other software may use them
done
if live_systemd; then systemctl daemon-reload && say "systemctl daemon-reload"; fi
say "the user and group stallscope are left in place (files may still be owned by them): userdel stallscope; groupdel stallscope"
exit 0
