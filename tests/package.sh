#!/usr/bin/env bash
# The Debian package and the release archive, checked on this machine:
#
#   tests/package.sh [BINARY]
#
# BINARY: the dlqctl to package, by default the one the test suite built
# (${CARGO_TARGET_DIR:-target}/debug/dlqctl), so nothing is built again.
# It runs packaging/build, then installs the package with apt-get into the
# machine's own /usr (so it runs as root, once, after the suite: .ci/run
# calls it), uses what it installed (dlqctl --version, provision --dry-run
# of an example, man --warnings, bash completion, systemd-analyze verify),
# purges it and checks that nothing of it is left. lintian must report no
# error. The archive must verify with sha256sum -c and unpack to the layout
# docs/install.md shows. Whatever happens, the package is purged at the end.
# Needs root, dpkg-dev, lintian, man-db, bash-completion and systemd
# (.ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-target}
bin=${1:-$target/debug/dlqctl}
out=$target/package-test
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
started=$(date +%s)

fail() {
  echo "package test: FAILED: $*" >&2
  exit 1
}
step() { echo "package test: $*" >&2; }

[ "$(id -u)" = 0 ] || fail "needs root: it installs the package into /usr"
if dpkg-query -W -f '${Status}' dlqctl 2>/dev/null | grep -q installed; then
  fail "dlqctl is installed on this machine already; the test would remove it: apt-get purge dlqctl first"
fi
for tool in lintian man systemd-analyze dpkg-shlibdeps; do
  command -v "$tool" >/dev/null || fail "$tool is missing (.ci/run installs it)"
done
[ -r /usr/share/bash-completion/bash_completion ] ||
  fail "bash-completion is missing (.ci/run installs it)"

rm -rf "$out"
mkdir -p "$out"
scratch=$(mktemp -d)
etc_before=$(find /etc -path '*dlqctl*' | sort)
purge() {
  if dpkg-query -W -f '${Status}' dlqctl 2>/dev/null | grep -q installed; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -q dlqctl >/dev/null 2>&1 || true
  fi
  rm -rf "$scratch"
}
trap purge EXIT

step "packaging $bin"
packaging/build "$bin" "$out" >"$scratch/built"
deb=$(grep '\.deb$' "$scratch/built")
tarball=$(grep '\.tar\.gz$' "$scratch/built")

step "lintian $(basename "$deb")"
# Every tag down to the informational ones is shown; an error fails.
lintian_rc=0
lintian --fail-on error --display-info "$deb" >"$scratch/lintian" 2>&1 || lintian_rc=$?
grep -v 'root privileges' "$scratch/lintian" >&2 || true
if [ "$lintian_rc" != 0 ] || grep -q '^E:' "$scratch/lintian"; then
  fail "lintian reported an error (exit $lintian_rc)"
fi

step "apt-get install $deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$(realpath "$deb")" >"$scratch/apt" 2>&1 ||
  fail "apt-get install: $(cat "$scratch/apt")"
dpkg -L dlqctl >"$scratch/listed"

check_installed() {
  local v
  v=$(/usr/bin/dlqctl --version)
  [[ $v == "dlqctl $version "* ]] || fail "dlqctl --version says: $v"
  /usr/bin/dlqctl provision --dry-run /usr/share/doc/dlqctl/examples/orders.yaml >"$scratch/plan" ||
    fail "provision --dry-run of the installed example failed"
  grep -q 'orders.dlq' "$scratch/plan" || fail "the plan names no orders.dlq: $(cat "$scratch/plan")"
  MANWIDTH=80 MANPAGER=cat PAGER=cat man --warnings dlqctl-dlq-replay >"$scratch/man" 2>"$scratch/man.err" ||
    fail "man dlqctl-dlq-replay: $(cat "$scratch/man.err")"
  [ ! -s "$scratch/man.err" ] || fail "man --warnings dlqctl-dlq-replay warned: $(cat "$scratch/man.err")"
  grep -q 'dlqctl-dlq-replay' "$scratch/man" || fail "man dlqctl-dlq-replay shows another page"
  # Every page the package lists renders without a warning.
  grep '^/usr/share/man/man1/.*\.1\.gz$' "$scratch/listed" | while read -r page; do
    man --warnings -l "$page" 2>&1 >/dev/null | grep . && fail "man --warnings -l $page warned"
    true
  done
}

# What bash offers for `dlqctl dlq re<TAB>`, the installed script found by
# bash-completion's own loader, by the command's name, as in a shell.
check_completion() {
  local offered
  offered=$(bash --norc --noprofile -c '
    . /usr/share/bash-completion/bash_completion
    _completion_loader dlqctl
    fn=$(complete -p dlqctl | sed -E "s/.*-F ([^ ]+).*/\1/")
    COMP_WORDS=(dlqctl dlq re); COMP_CWORD=2; COMP_LINE="dlqctl dlq re"; COMP_POINT=${#COMP_LINE}
    "$fn" dlqctl re dlq
    printf "%s\n" "${COMPREPLY[@]}"' | sort | tr '\n' ' ')
  [ "$offered" = "redrive replay " ] || fail "dlqctl dlq re<TAB> offers: '$offered'"
  [ -s /usr/share/zsh/vendor-completions/_dlqctl ] || fail "no zsh completion"
  [ -s /usr/share/fish/vendor_completions.d/dlqctl.fish ] || fail "no fish completion"
}

check_units() {
  local unit said
  for unit in /lib/systemd/system/dlqctl-work@.service /lib/systemd/system/dlqctl-serve.service; do
    grep -q '^ExecStart=/usr/bin/dlqctl ' "$unit" || fail "$unit does not start /usr/bin/dlqctl"
    said=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify $unit: $said"
    [ -z "$said" ] || fail "systemd-analyze verify $unit said: $said"
  done
  grep -q '^StateDirectory=dlqctl/%i$' /lib/systemd/system/dlqctl-work@.service ||
    fail "the worker unit has no StateDirectory=dlqctl/%i"
}

# Nothing in /etc, no unit enabled: the same as before the install.
check_etc() {
  local now
  now=$(find /etc -path '*dlqctl*' | sort)
  [ "$now" = "$etc_before" ] || fail "$1, /etc holds: $now (before: $etc_before)"
}

step "using what it installed"
check_installed
check_completion
check_units
check_etc "after the install"

step "apt-get purge dlqctl"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q dlqctl >"$scratch/apt" 2>&1 ||
  fail "apt-get purge: $(cat "$scratch/apt")"
left=()
while read -r path; do
  [ -e "$path" ] || [ -L "$path" ] || continue
  # A folder another package owns too (/usr/bin, /usr/share/man/man1...)
  # stays, and so does one that holds other files.
  if [ -d "$path" ] && { dpkg -S "$path" >/dev/null 2>&1 || [ -n "$(ls -A "$path")" ]; }; then
    continue
  fi
  left+=("$path")
done <"$scratch/listed"
[ ${#left[@]} = 0 ] || fail "left after the purge: ${left[*]}"
[ "$(wc -l <"$scratch/listed")" -gt 40 ] || fail "dpkg -L listed only: $(cat "$scratch/listed")"
check_etc "after the purge"

step "the archive $(basename "$tarball")"
(cd "$(dirname "$tarball")" && sha256sum -c --quiet "$(basename "$tarball").sha256") ||
  fail "sha256sum -c failed"
cp "$tarball" "$scratch/tampered.tar.gz"
printf 'x' >>"$scratch/tampered.tar.gz"
sed "s|$(basename "$tarball")|tampered.tar.gz|" "$tarball.sha256" >"$scratch/tampered.sha256"
if (cd "$scratch" && sha256sum -c --quiet tampered.sha256 >/dev/null 2>&1); then
  fail "sha256sum -c accepted a changed archive"
fi
top=dlqctl-$version-x86_64-unknown-linux-gnu
# The layout docs/install.md shows, every file of it, and nothing else.
expected="$top/LICENSE-APACHE
$top/LICENSE-MIT
$top/README.md
$top/bin/dlqctl
$top/lib/systemd/system/dlqctl-serve.service
$top/lib/systemd/system/dlqctl-work@.service
$top/share/bash-completion/completions/dlqctl
$(cd topology && for f in *; do echo "$top/share/doc/dlqctl/examples/$f"; done)
$(cd examples/handlers && for f in *; do echo "$top/share/doc/dlqctl/examples/handlers/$f"; done)
$top/share/fish/vendor_completions.d/dlqctl.fish
$(grep '^/usr/share/man/man1/' "$scratch/listed" | sed "s|^/usr|$top|")
$top/share/zsh/site-functions/_dlqctl"
tar -tzf "$tarball" | grep -v '/$' | sort >"$scratch/files"
diff <(sort <<<"$expected") "$scratch/files" >&2 || fail "the archive's files differ from the layout (< expected, > found)"
mkdir "$scratch/unpacked"
tar -xzf "$tarball" -C "$scratch/unpacked"
v=$("$scratch/unpacked/$top/bin/dlqctl" --version)
[[ $v == "dlqctl $version "* ]] || fail "the archive's dlqctl --version says: $v"
grep -q '^ExecStart=/usr/local/bin/dlqctl ' "$scratch/unpacked/$top/lib/systemd/system/dlqctl-serve.service" ||
  fail "the archive's units do not start /usr/local/bin/dlqctl"

step "passed in $(($(date +%s) - started)) s"
