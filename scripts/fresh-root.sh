#!/usr/bin/env bash
# Proves that `make setup` installs everything the build and the tests use:
# bootstraps a new Debian bookworm (minbase) root, puts in it only the
# prerequisites (Go, bind-mounted read-only from this host; git, make and
# ca-certificates, which cloning and running make take), a fresh clone of
# this checkout's HEAD (committed files only), then runs, inside it:
#   make setup, go build ./..., go vet ./..., the fast test tier
#   and, with FRESH_TIER=real (or all), the real-sandbox tier too
#   (FRESH_TIER=none: setup and build only). FRESH_CMD: one more command
#   to run in the checkout afterwards; FRESH_REV: check that revision
#   instead of HEAD.
# Anything the Makefile forgot to install fails here, whatever this host has.
#
# Everything runs in private mount and PID namespaces: every mount and every
# process dies with the check, even on failure or ^C; the root is deleted.
# Cache (reruns are fast, the root is still new each run): the debootstrap
# package tarball in /var/cache/spore/fresh-root, one per ISO week.
# The Debian mirror is the one this host's apt uses (/etc/apt/sources.list*).
# Log of the chroot commands: /var/cache/spore/fresh-root/last.log.
set -euo pipefail

SUITE=bookworm
PREREQS=make,git,ca-certificates
FRESH_TIER=${FRESH_TIER:-fast}     # fast | real | all | none
FRESH_CMD=${FRESH_CMD:-}
FRESH_REV=${FRESH_REV:-HEAD}
CACHE=${FRESH_CACHE:-/var/cache/spore/fresh-root}
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG=$CACHE/last.log
T0=${T0:-$(date +%s)}

step() { printf '[fresh-root %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { printf 'fresh-root: %s\n' "$*" >&2; exit 1; }

# apt_sources prints "URI SUITE" for every enabled deb source of this host.
apt_sources() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } print $i, $(i+1) }' "$f"
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk 'BEGIN { RS = ""; FS = "\n" } {
			types = ""; uris = ""; suites = ""; enabled = "yes"
			for (i = 1; i <= NF; i++) {
				if ($i ~ /^#/) continue
				split($i, kv, ":"); k = tolower(kv[1]); v = substr($i, length(kv[1]) + 2); gsub(/^[ \t]+|[ \t]+$/, "", v)
				if (k == "types") types = v; else if (k == "uris") uris = v
				else if (k == "suites") suites = v; else if (k == "enabled") enabled = tolower(v)
			}
			if (enabled == "no" || (" " types " ") !~ / deb /) next
			nu = split(uris, u, " "); ns = split(suites, s, " ")
			for (a = 1; a <= nu; a++) for (b = 1; b <= ns; b++) print u[a], s[b]
		}' "$f"
	done
}

# ---- inside the namespaces: build the root, run the checks --------------
if [ "${1:-}" = --inside ]; then
	WORK=$2
	ROOT=$WORK/root
	MIRROR=$3
	SECURITY=$4
	TARBALL=$5
	mounts=()
	teardown() {
		local i
		for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
			umount -R "${mounts[i]}" 2>/dev/null || umount -R -l "${mounts[i]}" 2>/dev/null || true
		done
	}
	trap teardown EXIT
	bindmount() { # src dst [ro]
		mkdir -p "$2"
		mount --rbind "$1" "$2"
		mounts+=("$2")
		if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
	}

	step "debootstrap $SUITE minbase (+$PREREQS) from $MIRROR"
	debootstrap --variant=minbase --include="$PREREQS" --unpack-tarball="$TARBALL" \
		"$SUITE" "$ROOT" "$MIRROR" >>"$LOG" 2>&1 || die "debootstrap failed (see $LOG)"

	# A fresh Debian install's apt sources: the host's mirror for the suite,
	# its updates, and security when the host has it.
	{
		echo "deb $MIRROR $SUITE main"
		echo "deb $MIRROR $SUITE-updates main"
		if [ -n "$SECURITY" ]; then echo "deb $SECURITY $SUITE-security main"; fi
	} >"$ROOT/etc/apt/sources.list"
	# The network's settings are the machine's, not the project's: its DNS,
	# and the certificate authorities local to this site (an egress proxy
	# that re-signs TLS, say), which a fresh machine on this network has too.
	cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
	if compgen -G '/usr/local/share/ca-certificates/*' >/dev/null; then
		cp -a /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/"
		chroot "$ROOT" update-ca-certificates >>"$LOG" 2>&1
	fi

	GOROOT_HOST=$(go env GOROOT)
	MODCACHE=$(go env GOMODCACHE)
	# The root must be a mount point: `ip netns exec` (the network tests)
	# remounts / as a slave, which fails on a plain directory.
	bindmount "$ROOT" "$ROOT"
	mkdir -p "$ROOT/proc"
	mount -t proc proc "$ROOT/proc"
	mounts+=("$ROOT/proc")
	bindmount /sys "$ROOT/sys"
	bindmount /dev "$ROOT/dev"
	bindmount "$GOROOT_HOST" "$ROOT/usr/local/go" ro
	# The host's module downloads as a read-only file:// proxy in front of
	# the real one: the modules are the same bytes (go.sum checks them),
	# only faster; the Debian packages, runsc and the root filesystems are
	# downloaded and built inside, from nothing.
	GOPROXY_CHAIN=https://proxy.golang.org
	if [ -d "$MODCACHE/cache/download" ]; then
		bindmount "$MODCACHE/cache/download" "$ROOT/var/cache/host-goproxy" ro
		GOPROXY_CHAIN=file:///var/cache/host-goproxy,$GOPROXY_CHAIN
	fi
	# The host's Go build and staticcheck caches as read-only lower layers
	# of overlays (writes go to the check's own upper layers, deleted with
	# it): compiled Go packages are keyed by their exact inputs (sources,
	# toolchain, flags, the C compiler when cgo is on), so a hit is the
	# same object a fresh build would make, and a missing package, a
	# missing C compiler or header still fails the build. It saves the
	# cold compiles of every dependency, runsc and the race runtime.
	overlay() { # lower, target
		[ -d "$1" ] || return 0
		local n
		n=$(basename "$2")
		mkdir -p "$WORK/ovl/$n/upper" "$WORK/ovl/$n/work" "$2"
		mount -t overlay "ovl-$n" -o "lowerdir=$1,upperdir=$WORK/ovl/$n/upper,workdir=$WORK/ovl/$n/work" "$2"
		mounts+=("$2")
	}
	overlay "$(go env GOCACHE)" "$ROOT/root/.cache/go-build"
	overlay "$HOME/.cache/staticcheck" "$ROOT/root/.cache/staticcheck"

	rev=$(git -C "$REPO" rev-parse "$FRESH_REV^{commit}")
	step "clone $FRESH_REV ($(git -C "$REPO" rev-parse --short "$rev")) into the root"
	git clone --quiet --no-local --no-checkout "$REPO" "$ROOT/src/spore"
	git -C "$ROOT/src/spore" fetch --quiet "$REPO" "$rev"
	git -C "$ROOT/src/spore" checkout --quiet --detach "$rev"

	# The machine's network environment (proxies, CA bundle paths), if any.
	netenv=()
	for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY SSL_CERT_FILE SSL_CERT_DIR \
		NODE_EXTRA_CA_CERTS GIT_SSL_CAINFO CURL_CA_BUNDLE; do
		if [ -n "${!v:-}" ]; then netenv+=("$v=${!v}"); fi
	done
	# Enter the root by pivot_root in a mount namespace of its own, not by
	# chroot: the kernel refuses a new user namespace to a chrooted
	# process, and runsc's gofer needs one (seen: "fork/exec /proc/self/exe:
	# operation not permitted"). Afterwards / is the root, as on a machine.
	# shellcheck disable=SC2016
	enter='cd "$1" && mkdir -p .oldroot && pivot_root . .oldroot && cd / && umount -l /.oldroot && rmdir /.oldroot && shift && exec "$@"'
	inroot() { # name, shell command: run in the chroot with a clean environment
		local name=$1 t
		shift
		t=$(date +%s)
		step "$name: $*"
		echo "==== $name: $*" >>"$LOG"
		if ! env -i HOME=/root TERM=dumb LANG=C.UTF-8 CI="${CI:-}" "${netenv[@]}" \
			PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			GOPROXY="$GOPROXY_CHAIN" GOTOOLCHAIN=local GOFLAGS=-buildvcs=false \
			unshare --mount --propagation private /bin/sh -c "$enter" sh "$ROOT" \
			/bin/bash -c "cd /src/spore && $*" >>"$LOG" 2>&1; then
			step "FAILED: $name after $(($(date +%s) - t)) s; last lines of $LOG:"
			tail -n 60 "$LOG" | sed 's/^/    /'
			exit 1
		fi
		step "ok: $name in $(($(date +%s) - t)) s"
	}
	inroot "setup" make setup
	inroot "build" 'go build ./... && go vet ./...'
	# The tests run in a network namespace of their own (loopback only):
	# they need no network once set up, and the namespaces, bridges and
	# nftables tables they make can never meet this host's.
	isolated() { echo "unshare --net sh -c 'ip link set lo up && $*'"; }
	case "$FRESH_TIER" in
	fast | all) inroot "fast tier" "$(isolated make test-fast)" ;;
	esac
	case "$FRESH_TIER" in
	fast | real | all)
		# The real tier's E2B SDK tests need npm and a Node.js the SDK
		# accepts: cheap to prove even when the real tier does not run.
		inroot "sdk deps" make sdk-deps
		inroot "E2B SDK loads" "cd test/sdk && node -e \"import('@e2b/code-interpreter').then(() => console.log('ok, node', process.version))\""
		;;
	esac
	case "$FRESH_TIER" in
	real | all) inroot "real tier" "$(isolated SPORE_TEST_TIERS=real scripts/test.sh)" ;;
	esac
	if [ -n "$FRESH_CMD" ]; then inroot "FRESH_CMD" "$FRESH_CMD"; fi
	exit 0
fi

# ---- outside: checks, the cached tarball, the namespaces, the clean-up ----
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"
command -v debootstrap >/dev/null || die "debootstrap missing (make setup installs it)"
command -v go >/dev/null || die "go missing (the documented prerequisite)"
mkdir -p "$CACHE"
if ! git -C "$REPO" diff --quiet HEAD 2>/dev/null; then
	step "note: uncommitted changes in $REPO are not part of the check (it clones HEAD)"
fi

sources=$(apt_sources)
MIRROR=$(awk -v s="$SUITE" '$2 == s { print $1; exit }' <<<"$sources")
[ -n "$MIRROR" ] || MIRROR=$(awk '$2 !~ /-/ && $1 !~ /security/ { print $1; exit }' <<<"$sources")
[ -n "$MIRROR" ] || die "no Debian mirror in /etc/apt/sources.list*"
SECURITY=$(awk -v s="$SUITE-security" '$2 == s { print $1; exit }' <<<"$sources")

# The package tarball is cached per ISO week: reruns skip the downloads,
# and a week-old set of packages is still what a new machine would get.
TARBALL=$CACHE/$SUITE-minbase-$(date -u +%G-W%V).tgz
if [ ! -s "$TARBALL" ]; then
	step "download the $SUITE minbase packages into $TARBALL"
	tmp=$(mktemp -d /var/tmp/spore-fresh-dl.XXXXXX)
	if ! debootstrap --variant=minbase --include="$PREREQS" --make-tarball="$TARBALL.part" \
		"$SUITE" "$tmp" "$MIRROR" >"$LOG" 2>&1; then
		rm -rf --one-file-system "$tmp" "$TARBALL.part"
		tail -n 30 "$LOG"
		die "debootstrap --make-tarball failed"
	fi
	rm -rf --one-file-system "$tmp"
	mv "$TARBALL.part" "$TARBALL"
	find "$CACHE" -maxdepth 1 -name "$SUITE-minbase-*.tgz" ! -path "$TARBALL" -delete
else
	: >"$LOG"
fi

WORK=$(mktemp -d /var/tmp/spore-fresh.XXXXXX)
cleanup() {
	local rc=$?
	# --kill-child: ending unshare ends the namespace's first process,
	# and with it every process in the namespace. (unshare blocks SIGTERM
	# and SIGINT while it waits: only SIGKILL ends it.)
	if [ -n "${child:-}" ]; then { kill -KILL "$child"; wait "$child"; } 2>/dev/null || true; fi
	# The mounts lived in the private mount namespace, gone with it; refuse
	# to delete anything still mounted here (a bind of /dev, say).
	if findmnt -rn -o TARGET | grep -q "^$WORK"; then
		echo "fresh-root: mounts left under $WORK, not deleting it" >&2
		exit 1
	fi
	rm -rf --one-file-system "$WORK"
	step "done in $(($(date +%s) - T0)) s (exit $rc)"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export T0 LOG REPO FRESH_TIER FRESH_CMD FRESH_REV CACHE
child=
unshare --mount --propagation private --pid --fork --kill-child --mount-proc \
	bash "$0" --inside "$WORK" "$MIRROR" "$SECURITY" "$TARBALL" &
child=$!
rc=0
wait "$child" || rc=$?
child=
exit "$rc"
