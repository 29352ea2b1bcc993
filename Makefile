# Stoker build. `make` builds build/stoker, build/libstoker.{a,so} and the unit
# tests; `make SAN=1` builds the same with ASan and UBSan into build-asan/;
# `make fuzz` builds the libFuzzer targets with clang into build-fuzz/.

CC ?= cc
SAN ?= 0
ifeq ($(SAN),1)
B ?= build-asan
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1
else
B ?= build
SANFLAGS :=
OPT := -O2
endif

PKGS := fuse3 liburing lmdb libisal libxxhash libmicrohttpd openssl expat
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

CFLAGS := -std=gnu11 $(OPT) -g -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow \
	-Wstrict-prototypes -Wformat=2 -Wno-format-truncation -fvisibility=hidden -fPIC -pthread \
	-D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Iinclude $(PKG_CFLAGS) $(SANFLAGS) $(EXTRA_CFLAGS)
LDFLAGS := -pthread $(SANFLAGS)
LIBS := $(PKG_LIBS) -lm
# mgmtd talks to etcd (cluster mode) with libcurl and Jansson for its JSON gateway;
# `stoker sync` talks to S3 endpoints with libcurl (src/cli/s3client.c).
MGMTD_PKGS := libcurl jansson
MGMTD_CFLAGS := $(shell pkg-config --cflags $(MGMTD_PKGS) 2>/dev/null)
MGMTD_LIBS := $(shell pkg-config --libs $(MGMTD_PKGS) 2>/dev/null)
# What libstoker (and the Python extension built from it) links: no FUSE, no HTTP
# server; CRC32C from ISA-L, xxHash for host ids, libcrypto for the cluster key's
# handshake (HMAC-SHA256, RAND_bytes; common/auth.h) and libssl for the transport's
# optional TLS (net/tls.h).
LIB_PKGS := libisal libxxhash libssl libcrypto
LIB_LIBS := $(shell pkg-config --libs $(LIB_PKGS) 2>/dev/null) -lm

# The RPC server (src/net/server.c) is the net layer's, but only server processes
# link it: libstoker carries the client side of the transport alone.
NET_SERVER_SRC := src/net/server.c src/net/loopclient.c
CORE_SRC := $(filter-out $(NET_SERVER_SRC),$(wildcard src/common/*.c src/proto/*.c src/net/*.c))
# What a server process shares: the RPC server, signals and stop, the /metrics
# HTTP endpoint.
DAEMON_SRC := $(wildcard src/daemon/*.c) $(NET_SERVER_SRC)
# Chunk files (format and reading), shared by storage and by the client, which
# reads the chunks of its own host itself (short-circuit reads, io.c).
CHUNK_SRC := $(wildcard src/chunk/*.c)
CLIENT_SRC := $(wildcard src/client/*.c) $(CHUNK_SRC)
MGMTD_SRC := $(wildcard src/mgmtd/*.c)
META_SRC := $(wildcard src/meta/*.c)
STORAGE_SRC := $(wildcard src/storage/*.c) $(CHUNK_SRC)
SERVER_SRC := $(DAEMON_SRC) $(MGMTD_SRC) $(META_SRC) $(STORAGE_SRC)
CLI_SRC := $(wildcard src/cli/*.c src/fuse/*.c src/gateway/*.c)
UNIT_SRC := $(wildcard tests/unit/test_*.c)
TOOL_SRC := $(wildcard tests/tools/*.c)

# The dashboard's page (src/mgmtd/ui/), embedded into mgmtd as byte arrays.
UI_FILES := $(sort $(wildcard src/mgmtd/ui/*))
UI_OBJ := $(B)/obj/gen/ui_assets.o

obj = $(patsubst %.c,$(B)/obj/%.o,$(1))
CORE_OBJ := $(call obj,$(CORE_SRC))
DAEMON_OBJ := $(call obj,$(DAEMON_SRC))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))
MGMTD_OBJ := $(call obj,$(MGMTD_SRC)) $(UI_OBJ)
META_OBJ := $(call obj,$(META_SRC))
STORAGE_OBJ := $(call obj,$(STORAGE_SRC))
SERVER_OBJ := $(call obj,$(SERVER_SRC)) $(UI_OBJ)
CLI_OBJ := $(call obj,$(CLI_SRC))
UNIT_BIN := $(patsubst tests/unit/%.c,$(B)/tests/%,$(UNIT_SRC))
TOOL_BIN := $(patsubst tests/tools/%.c,$(B)/tests/%,$(TOOL_SRC))

all: $(B)/stoker $(B)/libstoker.a $(B)/libstoker.so $(B)/stoker-nfs-fsid.so $(UNIT_BIN) $(TOOL_BIN) \
	python

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(MGMTD_OBJ): CFLAGS += $(MGMTD_CFLAGS)
# `stoker sync`'s S3 client is the CLI's other libcurl user (s3client.c).
$(call obj,src/cli/s3client.c): CFLAGS += $(MGMTD_CFLAGS)

$(B)/gen/ui_assets.c: $(UI_FILES) scripts/embed-ui.sh
	@mkdir -p $(dir $@)
	sh scripts/embed-ui.sh $@ $(UI_FILES)

$(UI_OBJ): $(B)/gen/ui_assets.c src/mgmtd/ui_assets.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -c $< -o $@

$(B)/stoker: $(CLI_OBJ) $(SERVER_OBJ) $(CLIENT_OBJ) $(CORE_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS) $(MGMTD_LIBS)

$(B)/libstoker.a: $(CLIENT_OBJ) $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/libstoker.so: $(CLIENT_OBJ) $(CORE_OBJ)
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libstoker.so.0 -o $@ $^ $(LIB_LIBS)

# Loaded into ganesha.nfsd by `stoker gateway nfs` (src/gateway/preload/nfs_fsid.c):
# built without the sanitizers, which a program not built with them cannot load.
$(B)/stoker-nfs-fsid.so: src/gateway/preload/nfs_fsid.c
	@mkdir -p $(dir $@)
	$(CC) $(filter-out $(SANFLAGS),$(CFLAGS)) -shared -o $@ $< -ldl
# Unit tests link only the module they test (test_meta_*: meta, test_storage_*: storage,
# test_mgmtd_*: mgmtd, test_metrics: the core and the /metrics endpoint, others: the
# core and the client library). Each includes tests/unit/check.h (found beside it, no
# -I needed) and is rebuilt when it changes.
$(UNIT_BIN): tests/unit/check.h
$(B)/tests/test_net: tests/unit/test_net.c $(DAEMON_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $(filter-out %.h,$^) $(LDFLAGS) $(LIBS)

# test_io drives the client's I/O engine against storage nodes in the process: RPC
# servers (server.c) whose handler serves a real chunk store (storage/chunk.c).
$(B)/tests/test_io: tests/unit/test_io.c $(CLIENT_OBJ) $(call obj,src/storage/chunk.c) \
		$(DAEMON_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $(filter-out %.h,$^) $(LDFLAGS) $(LIBS)

# test_mgmtaddr follows the leader over stand-in mgmtd servers (server.c).
$(B)/tests/test_mgmtaddr: tests/unit/test_mgmtaddr.c $(DAEMON_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $(filter-out %.h,$^) $(LDFLAGS) $(LIBS)

$(B)/tests/test_metrics: tests/unit/test_metrics.c $(DAEMON_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $(filter-out %.h,$^) $(LDFLAGS) $(LIBS)

# test_cli_s3conf: the S3 client of `stoker sync` (src/cli/s3client.c), with the
# gateway's parsers it signs with and libcurl.
$(B)/tests/test_cli_s3conf: tests/unit/test_cli_s3conf.c $(call obj,src/cli/s3client.c) \
		$(call obj,src/gateway/s3_parse.c) $(CLIENT_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $(filter-out %.h,$^) $(LDFLAGS) $(LIBS) $(MGMTD_LIBS)

$(B)/tests/test_meta_%: tests/unit/test_meta_%.c $(META_OBJ) $(MGMTD_OBJ) $(DAEMON_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $(filter-out %.h,$^) $(LDFLAGS) $(LIBS) $(MGMTD_LIBS)

$(B)/tests/test_storage_%: tests/unit/test_storage_%.c $(STORAGE_OBJ) $(MGMTD_OBJ) $(DAEMON_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $(filter-out %.h,$^) $(LDFLAGS) $(LIBS) $(MGMTD_LIBS)

$(B)/tests/test_mgmtd_%: tests/unit/test_mgmtd_%.c $(MGMTD_OBJ) $(DAEMON_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $(filter-out %.h,$^) $(LDFLAGS) $(LIBS) $(MGMTD_LIBS)

$(B)/tests/test_%: tests/unit/test_%.c $(CLIENT_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $(filter-out %.h,$^) $(LDFLAGS) $(LIBS)

$(B)/tests/%: tests/tools/%.c $(CLIENT_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $^ $(LDFLAGS) $(LIBS)

# The Python package (docs/python.md): the _stoker extension, with libstoker linked
# in, and the pure-Python modules, in $(B)/python (PYTHONPATH=$(B)/python). Built for
# Debian's /usr/bin/python3, whatever python3 comes first on PATH.
PY_CONFIG ?= /usr/bin/python3-config
PY_INC := $(shell $(PY_CONFIG) --includes 2>/dev/null)
PY_EXT := $(shell $(PY_CONFIG) --extension-suffix 2>/dev/null)
PY_MOD := $(patsubst python/%,$(B)/python/%,$(wildcard python/stoker/*.py))
PY_SO := $(B)/python/stoker/_stoker$(PY_EXT)

python: $(PY_SO) $(PY_MOD) csi

# The CSI driver (docs/csi.md): a Python package beside `stoker` in $(B)/python,
# with its gRPC stubs generated from csi/csi.proto by Debian's python3-grpc-tools
# at build time, so that they always match the protobuf runtime installed.
CSI_MOD := $(patsubst csi/%,$(B)/python/%,$(wildcard csi/stoker_csi/*.py))
CSI_PB := $(B)/python/stoker_csi/csi_pb2.py

csi: $(CSI_MOD) $(CSI_PB)

$(B)/python/stoker_csi/%.py: csi/stoker_csi/%.py
	@mkdir -p $(dir $@)
	cp $< $@

$(CSI_PB): csi/csi.proto
	@mkdir -p $(dir $@)
	cp $< $(B)/python/stoker_csi/csi.proto
	cd $(B)/python && /usr/bin/python3 -m grpc_tools.protoc -I. \
		-I$$(/usr/bin/python3 -c 'import grpc_tools, os; print(os.path.dirname(grpc_tools.__file__))')/_proto \
		--python_out=. --grpc_python_out=. stoker_csi/csi.proto

$(PY_SO): python/stoker/_stoker.c $(CLIENT_OBJ) $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PY_INC) -fno-strict-aliasing -shared -o $@ $^ $(LDFLAGS) $(LIB_LIBS)

$(B)/python/stoker/%.py: python/stoker/%.py
	@mkdir -p $(dir $@)
	cp $< $@

# libFuzzer targets (clang only).
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(patsubst tests/fuzz/%.c,build-fuzz/%,$(FUZZ_SRC))

fuzz: $(FUZZ_BIN)
# fuzz_s3 also takes the gateway's parsers, which need nothing beyond the core.
build-fuzz/fuzz_s3: src/gateway/s3_parse.c
build-fuzz/%: tests/fuzz/%.c $(CORE_SRC)
	@mkdir -p build-fuzz
	clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc \
		$(PKG_CFLAGS) -o $@ $^ $(PKG_LIBS) -lm

unit: $(UNIT_BIN)
	@pass=0; fail=0; skip=0; \
	for t in $(UNIT_BIN); do \
		$$t >$$t.log 2>&1; rc=$$?; \
		if [ $$rc = 0 ]; then pass=$$((pass+1)); echo "PASS $$t"; \
		elif [ $$rc = 77 ]; then skip=$$((skip+1)); echo "SKIP $$t"; \
		else fail=$$((fail+1)); echo "FAIL $$t (exit $$rc)"; tail -20 $$t.log; fi; \
	done; \
	echo "unit: $$pass passed, $$fail failed, $$skip skipped"; [ $$fail = 0 ]

# `make install PREFIX=/usr/local` (and DESTDIR for staging): the stoker binary,
# libstoker (shared and static), the public headers include/stoker/*.h and a
# stoker.pc, so that a program builds with `pkg-config --cflags --libs stoker`.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
VERSION := $(shell sed -n 's/^\#define STK_VERSION "\(.*\)"/\1/p' include/stoker/stoker.h)

install: $(B)/stoker $(B)/libstoker.a $(B)/libstoker.so $(B)/stoker-nfs-fsid.so
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)/stoker \
		$(DESTDIR)$(LIBDIR)/stoker
	install -m 644 $(B)/stoker-nfs-fsid.so $(DESTDIR)$(LIBDIR)/stoker/stoker-nfs-fsid.so
	install -m 755 $(B)/stoker $(DESTDIR)$(BINDIR)/stoker
	install -m 644 include/stoker/*.h $(DESTDIR)$(INCLUDEDIR)/stoker/
	install -m 755 $(B)/libstoker.so $(DESTDIR)$(LIBDIR)/libstoker.so.$(VERSION)
	ln -sf libstoker.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libstoker.so.0
	ln -sf libstoker.so.0 $(DESTDIR)$(LIBDIR)/libstoker.so
	install -m 644 $(B)/libstoker.a $(DESTDIR)$(LIBDIR)/libstoker.a
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' \
		-e 's|@VERSION@|$(VERSION)|' -e 's|@LIB_PKGS@|$(LIB_PKGS)|' stoker.pc.in \
		>$(DESTDIR)$(LIBDIR)/pkgconfig/stoker.pc

clean:
	rm -rf build build-asan build-fuzz

.PHONY: all unit fuzz clean python csi install
-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
