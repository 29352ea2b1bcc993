#!/usr/bin/env bash
# Installs Stoker into a temporary prefix (make install PREFIX=...) and builds a
# program against it the way an outside project would: only the installed
# headers, `pkg-config --cflags --libs stoker`, the shared library and, again,
# the static one. Also checks what libstoker.so links: no HTTP server, no TLS.
# Exits 0 (pass), 1 (fail) or 77 (skip: no C compiler or pkg-config).
# Usage: tests/install/test_install.sh [BUILD_DIR]   (default build; run after make)
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
command -v pkg-config >/dev/null && command -v cc >/dev/null || exit 77
[ -x "$B/stoker" ] && [ -f "$B/libstoker.so" ] || { echo "build $B first"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

make -s install B="$B" PREFIX="$tmp/prefix" >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log"; fail "make install"; }
for f in bin/stoker lib/libstoker.so lib/libstoker.so.0 lib/libstoker.a \
	lib/pkgconfig/stoker.pc include/stoker/stoker.h include/stoker/stoker_ll.h; do
	[ -e "$tmp/prefix/$f" ] || fail "not installed: $f"
done

export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
want=$(sed -n 's/^#define STK_VERSION "\(.*\)"/\1/p' include/stoker/stoker.h)
[ "$(pkg-config --modversion stoker)" = "$want" ] || fail "stoker.pc version is not $want"

cat >"$tmp/prog.c" <<'PROG'
/* An outside program: the public headers only, every call linked. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <stoker/stoker.h>
#include <stoker/stoker_ll.h>

int main(void)
{
	struct stk_ll_attr a = {.ino = STK_LL_ROOT_INO, .mode = 040755};
	struct stk_client_opts o = {.size = sizeof(o), .retry_ms = 1};
	struct stat st;
	stk_client *c = NULL;
	stk_cluster_status *cs = NULL;
	char addr[STK_CLUSTER_ADDR_MAX];
	int rc;

	stk_ll_attr_to_stat(&a, &st);
	if (st.st_ino != STK_LL_ROOT_INO || strcmp(stk_strerror(-ENOENT), "") == 0)
		return 1;
	/* Nothing listens there: the connect must fail cleanly, not crash. */
	rc = stk_connect("stk://127.0.0.1:1", &o, &c);
	if (rc >= 0 || c)
		return 1;
	if (stk_cluster_resolve("stk://127.0.0.1:1/x", addr, sizeof(addr)) ||
	    strcmp(addr, "127.0.0.1:1") != 0)
		return 1;
	if (stk_cluster_status_fetch(addr, &cs) >= 0 || cs)
		return 1;
	stk_cluster_status_free(cs);
	/* Every group of the low-level API resolves at link time. */
	void (*volatile fns[])(void) = {(void (*)(void))stk_ll_lookup,
					(void (*)(void))stk_ll_leases_start,
					(void (*)(void))stk_ll_names_flush,
					(void (*)(void))stk_cluster_status_node};
	for (unsigned i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
		if (!fns[i])
			return 1;
	printf("stoker %s: %s\n", STK_VERSION, stk_strerror(rc));
	return 0;
}
PROG
cflags=$(pkg-config --cflags stoker) && libs=$(pkg-config --libs stoker) ||
	fail "pkg-config stoker"
cc -std=c11 -Wall -Wextra -Werror $cflags -o "$tmp/prog" "$tmp/prog.c" $libs ||
	fail "build against the shared library"
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/prog" || fail "run against the shared library"
cc -std=c11 -Wall -Wextra -Werror $cflags -o "$tmp/prog-static" "$tmp/prog.c" \
	"$tmp/prefix/lib/libstoker.a" $(pkg-config --static --libs-only-l stoker | sed 's/-lstoker//') ||
	fail "build against the static library"
"$tmp/prog-static" >/dev/null || fail "run against the static library"

# libstoker links no HTTP server and at most one TLS/crypto library: OpenSSL
# (libssl and its libcrypto count as one), for the transport's TLS.
deps=$(ldd "$tmp/prefix/lib/libstoker.so")
if echo "$deps" | grep -Eq 'libmicrohttpd|libgnutls|libfuse|libexpat|libcurl'; then
	echo "$deps"
	fail "libstoker.so links a server-side library"
fi
[ "$(echo "$deps" | grep -Eo 'libssl|libcrypto|libgnutls|libnettle|libgcrypt' |
	sed 's/libssl/libcrypto/' | sort -u | wc -l)" -le 1 ] ||
	fail "libstoker.so links more than one crypto library"
# Only the public API is exported.
nm -D --defined-only "$tmp/prefix/lib/libstoker.so" | awk '$2 == "T" && $3 !~ /^stk_/ {print; bad=1}
	END {exit bad}' || fail "libstoker.so exports symbols outside stk_*"
echo "install: ok"
