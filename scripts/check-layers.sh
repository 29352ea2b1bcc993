#!/usr/bin/env bash
# Checks that every #include "..." points down the layers (docs/architecture.md,
# "Layers and the public API"):
#
#   proto <- common <- net <- daemon (server plumbing) <- mgmtd, meta, storage
#   common <- chunk (chunk files) <- storage, client
#   net <- client (libstoker) <- include/stoker/*.h <- frontends (fuse, gateway, cli, python)
#
# A frontend reaches libstoker only through include/stoker/ (stoker.h, stoker_ll.h),
# never through src/client/, src/proto/ or src/net/. Prints each violation as
# "FILE: includes TARGET (rule)" and exits 1 if there is any.
set -uo pipefail
cd "$(dirname "$0")/.."

# Allowed targets per layer: src folders, or single headers as folder/file.h.
allowed() {
	case $1 in
	proto) echo "proto" ;;
	common) echo "common proto" ;;
	net) echo "net common proto" ;;
	chunk) echo "chunk common proto" ;;
	daemon) echo "daemon net common proto" ;;
	# The client reads chunk files and the node's serve maps of its own host
	# (short-circuit reads) through the chunk module's two shared headers.
	client) echo "client chunk/chunkfile.h chunk/servemap.h net common proto" ;;
	mgmtd) echo "mgmtd daemon net common proto" ;;
	meta) echo "meta mgmtd/agent.h daemon net common proto" ;;
	storage) echo "storage chunk mgmtd/agent.h daemon net common proto" ;;
	fuse) echo "fuse cli/cli.h daemon common" ;;
	gateway) echo "gateway cli/cli.h daemon common" ;;
	# The CLI is a frontend; `stoker up` and the role commands run the daemons in
	# this process, so it may include their entry points (and the node agent's
	# routing fetch). proto/codec.h is the bounds-checked encoder of pack's shards;
	# gateway/s3_parse.h reads and writes the S3 gateway's keys file (admin s3-user).
	cli) echo "cli fuse/fs.h gateway/s3_parse.h daemon common proto/codec.h mgmtd/mgmtd.h mgmtd/agent.h meta/meta.h storage/storage.h" ;;
	*) echo "" ;;
	esac
}

# Files that still break a rule, each with what is left to do. Keep this short:
# none now.
exception() {
	case $1 in
	esac
	return 1
}

bad=0
report() {
	echo "$1: includes $2 ($3)"
	bad=1
}

# src/: each file's quoted includes, resolved against its folder.
while IFS= read -r f; do
	layer=${f#src/}
	layer=${layer%%/*}
	ok=$(allowed "$layer")
	while IFS= read -r inc; do
		case $inc in
		stoker/*) continue ;; # the public headers: anyone may
		../*) target=${inc#../} ;;
		*/*) target=$inc ;;
		*) target=$layer/$inc ;;
		esac
		tdir=${target%%/*}
		[ "$tdir" = "$layer" ] && [ "$target" != chunk/chunkfile_priv.h ] && continue
		pass=0
		for a in $ok; do
			if [ "$a" = "$tdir" ] || [ "$a" = "$target" ]; then
				pass=1
				break
			fi
		done
		# The chunk files' inside view is the chunk store's alone.
		if [ "$target" = chunk/chunkfile_priv.h ]; then
			case $layer in chunk | storage) pass=1 ;; *) pass=0 ;; esac
		fi
		[ $pass = 1 ] && continue
		exception "$f:$target" && continue
		report "$f" "src/$target" "$layer may include: $ok"
	done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done < <(find src -name '*.[ch]' | sort)

# The public headers and the Python extension: public headers and the system only.
while IFS= read -r f; do
	while IFS= read -r inc; do
		case $inc in
		stoker/*) ;;
		*) report "$f" "$inc" "public headers and python/ may include only stoker/*.h" ;;
		esac
	done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done < <(find include python -name '*.[ch]' | sort)

if [ $bad = 0 ]; then
	echo "layers: ok"
fi
exit $bad
