/*
 * Message layouts: one field list per message, from which the C struct, its
 * encoder and its decoder are generated, so the layout on the wire, the struct a
 * handler sees and this documentation can never disagree.
 *
 * Field types and their wire form:
 *   u8 u16 u32 u64 i64   little-endian integers
 *   name                  string of at most STK_NAME_MAX (255) bytes   (u16 len + bytes)
 *   path                  string of at most STK_PATH_MAX (4095) bytes  (u16 len + bytes)
 *   addr                  string of at most 63 bytes, "HOST:PORT"
 *   b32                   32 bytes, as they are (a nonce, a MAC)
 *   cred                  u32 uid, u32 gid, u8 ngroups, ngroups x u32 (at most 32)
 *   layout                u32 chunk_size, u32 stripe, u32 nchains, u32 start, u64 seed
 *   attr                  u64 ino, u32 mode, u32 nlink, u32 uid, u32 gid, u64 size,
 *                         i64+u32 atime, mtime, ctime (sec, nsec), u64 blocks, layout,
 *                         u64 rdev, u64 qid
 *
 * stk_msg_X_enc() appends the fields to a writer; stk_msg_X_dec() reads them from a
 * reader. Both return 0 or the codec's latched error; a decoder does not require the
 * payload to end after its fields (variable-length arrays may follow, see wire.h):
 * the handler calls stk_rbuf_finish() when it has read everything.
 */
#ifndef STK_PROTO_MSG_H
#define STK_PROTO_MSG_H

#include <stdint.h>

#include "codec.h"

#define STK_NAME_MAX 255
#define STK_PATH_MAX 4095
#define STK_ADDR_MAX 64
#define STK_HOST_ID_MAX 64 /* a host id (common/host.h), with its NUL; an addr on the wire */
#define STK_MAX_GROUPS 32
#define STK_MAX_REPLICAS 8
/*
 * Metadata shards (docs/meta-shards.md): at most STK_MAX_SHARDS, numbered from 1.
 * An inode number carries its shard in its top bits: shard k hands out numbers
 * from (k - 1) << STK_INO_SHARD_SHIFT on, so shard 1's are today's and any node
 * finds an inode's shard from its number alone.
 */
#define STK_MAX_SHARDS 16
#define STK_INO_SHARD_SHIFT 48
static inline unsigned stk_ino_shard(uint64_t ino)
{
	return (unsigned)(ino >> STK_INO_SHARD_SHIFT) + 1;
}

#define STK_ROOT_INO 1ull

/*
 * The inode whose shard serves a metadata request (docs/meta-shards.md): the
 * folder for a request on a name in it (lookup, create, mkdir, unlink, rmdir,
 * readdir, ...), the inode itself otherwise (getattr, setattr, open, lock, ...).
 * req/len: the encoded request of opcode (wire.h). *other: a second inode the
 * request names that must live on the same shard (rename's destination folder,
 * link's file), else 0. Returns 1 with *ino set (never 0), 0 for a request about
 * no inode in particular (statfs, sessions, watches, sync, fsck: the caller
 * picks the shard), -EBADMSG for a request too short to say.
 */
int stk_msg_meta_route(uint16_t opcode, const void *req, size_t len, uint64_t *ino,
		       uint64_t *other);

enum stk_role { STK_ROLE_MGMTD = 1, STK_ROLE_META = 2, STK_ROLE_STORAGE = 3, STK_ROLE_CLIENT = 4 };

struct stk_cred {
	uint32_t uid;
	uint32_t gid;
	uint8_t ngroups;
	uint32_t groups[STK_MAX_GROUPS];
};

/*
 * File layout: chunks of chunk_size bytes striped round-robin over `stripe` chains
 * chosen among the first `nchains` chains of the chain table (the count when the
 * file was created, so that adding chains never moves old files' chunks), starting
 * at `start` in the permutation that `seed` gives. See common/layout.h.
 */
struct stk_layout {
	uint32_t chunk_size;
	uint32_t stripe;
	uint32_t nchains;
	uint32_t start;
	uint64_t seed;
};

struct stk_attr {
	uint64_t ino;
	uint32_t mode; /* S_IFMT type bits and permission bits */
	uint32_t nlink;
	uint32_t uid;
	uint32_t gid;
	uint64_t size;
	int64_t atime_sec;
	uint32_t atime_nsec;
	int64_t mtime_sec;
	uint32_t mtime_nsec;
	int64_t ctime_sec;
	uint32_t ctime_nsec;
	/*
	 * 512-byte blocks stored: for a regular file, each chunk that was written
	 * (and not punched or cut off since) counts up to the file's end, so a
	 * sparse file's holes of whole chunks count nothing (meta/store.h).
	 */
	uint64_t blocks;
	struct stk_layout layout; /* zero for non-files */
	uint64_t rdev; /* a character or block device's number (makedev), else 0 */
	/*
	 * The quota root the inode is counted in (docs/quotas.md): the inode number of
	 * the nearest folder above it, or itself, that has a quota; 0 for none. A
	 * writer of a file with a quota asks meta for room (META_QUOTA, RESERVE)
	 * before its bytes go past the size meta granted.
	 */
	uint64_t qid;
};

/*
 * relatime (Linux's rule): would a read at now_sec move a's atime? Only when atime
 * is not after mtime or ctime (the first read since a change), or is a day old. Meta
 * applies it when it records a read; the mount checks it first to skip the call.
 */
static inline int stk_attr_atime_due(const struct stk_attr *a, int64_t now_sec)
{
	return a->atime_sec < a->mtime_sec ||
	       (a->atime_sec == a->mtime_sec && a->atime_nsec <= a->mtime_nsec) ||
	       a->atime_sec < a->ctime_sec ||
	       (a->atime_sec == a->ctime_sec && a->atime_nsec <= a->ctime_nsec) ||
	       now_sec - a->atime_sec >= 24 * 3600;
}

/* Flags and masks carried in messages. */
#define STK_CREATE_EXCL 0x1u

#define STK_RENAME_NOREPLACE 0x1u /* same values as RENAME_NOREPLACE / RENAME_EXCHANGE */
#define STK_RENAME_EXCHANGE 0x2u

#define STK_SETATTR_MODE 0x1u
#define STK_SETATTR_UID 0x2u
#define STK_SETATTR_GID 0x4u
#define STK_SETATTR_SIZE 0x8u
#define STK_SETATTR_ATIME 0x10u
#define STK_SETATTR_MTIME 0x20u
#define STK_SETATTR_ATIME_NOW 0x40u
#define STK_SETATTR_MTIME_NOW 0x80u
/*
 * Alone, never with another bit: the file was read, so atime moves to now if
 * relatime's rule says it is due (atime not after mtime or ctime, or a day old);
 * ctime does not move. The mount sends it once per open that reads.
 */
#define STK_SETATTR_ATIME_READ 0x100u

#define STK_WRITE_SYNC 0x1u
/* The bulk replaces the whole chunk (offset 0): a replica's copy of another's. */
#define STK_WRITE_FULL 0x2u

#define STK_XATTR_CREATE 0x1u /* same values as XATTR_CREATE / XATTR_REPLACE */
#define STK_XATTR_REPLACE 0x2u
#define STK_XATTR_SIZE_MAX 65536u /* a value, and the list of one inode's names */

/* Data is checksummed in blocks of this size, on the wire and on disk. */
#define STK_CRC_BLOCK 4096u
static inline uint32_t stk_crc_blocks(uint64_t len)
{
	return (uint32_t)((len + STK_CRC_BLOCK - 1) / STK_CRC_BLOCK);
}

/*
 * A namespace's identity: 128 random bits made when a meta store is first created
 * (or first opened by a release that knows them), kept in that store and, once a
 * meta node serving it has registered, in mgmtd's state for the shard. mgmtd gives
 * a shard only to a meta whose store carries the shard's identity, and storage
 * removes chunks only for a request carrying it (see docs/architecture.md). All
 * zero: none (a storage node, or a shard no meta has claimed yet).
 */
struct stk_ns_id {
	uint64_t hi;
	uint64_t lo;
};
#define STK_NS_ID_STR 33 /* 32 hex digits and the NUL */

static inline int stk_ns_id_is_zero(const struct stk_ns_id *id)
{
	return id->hi == 0 && id->lo == 0;
}

static inline int stk_ns_id_eq(const struct stk_ns_id *a, const struct stk_ns_id *b)
{
	return a->hi == b->hi && a->lo == b->lo;
}

/* Writes the id as 32 lowercase hex digits into out[STK_NS_ID_STR]; returns out. */
static inline char *stk_ns_id_str(const struct stk_ns_id *id, char *out)
{
	static const char hex[] = "0123456789abcdef";

	for (int i = 0; i < 16; i++) {
		out[i] = hex[(id->hi >> (60 - 4 * i)) & 0xf];
		out[16 + i] = hex[(id->lo >> (60 - 4 * i)) & 0xf];
	}
	out[32] = 0;
	return out;
}

enum stk_node_state { STK_NODE_ONLINE = 1, STK_NODE_OFFLINE = 2 };
/*
 * SYNCING: back after its chain went on without it, last in the chain: it is sent
 * every change (forwarded to it) and copies what it missed from its predecessor
 * (STOR_SYNC_LIST, STOR_SYNC_READ), but serves no read, until mgmtd hears it is
 * done (MGMT_TARGET_SYNCED) and makes it SERVING.
 * WIPING: in no chain, it left one (a move, a replacement): its node removes the
 * chunk files it still holds, which no chain keeps up to date any more, and says
 * so (MGMT_TARGET_WIPED); then it is SERVING, free to join a chain.
 * A chain's working members are those SERVING or FULL, in the chain's order; its
 * members that changes reach are those and the SYNCING one.
 */
enum stk_target_state {
	STK_TARGET_SERVING = 1,
	STK_TARGET_OFFLINE = 2,
	STK_TARGET_FULL = 3,
	STK_TARGET_SYNCING = 4,
	STK_TARGET_WIPING = 5
};

/* ---- field lists ---- */

#define STK_MSG_NONE(F)

/*
 * One storage target, as a node reports it (follows mgmt_register_req / heartbeat):
 * the statvfs figures of its folder's file system (capacity, used, avail; targets
 * sharing a file system each report all of it) and that file system's device id
 * (common/host.h), by which the adders count it once.
 * A target being resynced (SYNCING) also reports how far its copy is: sync_chain,
 * the chain it catches up with (0: no copy runs), sync_permille (0..1000, an
 * estimate: chunks listed of the predecessor's chunk count), sync_checked (chunks
 * of the predecessor's list compared so far), sync_copied and sync_bytes (chunks
 * and bytes copied), all of the copy in progress (a new round starts from 0).
 */
#define STK_MSG_TARGET_INFO(F)                                                           \
	F(u32, target_id) F(u64, capacity) F(u64, used) F(u64, chunks) F(path, path)      \
	F(u64, avail) F(u64, dev) F(u32, sync_chain) F(u32, sync_permille)                 \
	F(u64, sync_checked) F(u64, sync_copied) F(u64, sync_bytes)

/*
 * host_id: the node's host id (common/host.h), which decides short-circuit reads.
 * ns_hi/ns_lo: a meta node's store identity (stk_ns_id; zero from storage). The
 * reply's `refused` 1: the node is registered (node_id is its id) but serves no
 * shard, because its store is not the namespace its shard holds (shard_ns_hi/lo, the
 * shard's identity) or the cluster has no such shard; a meta node refused exits
 * (src/meta/service.c). shard: the metadata shard a meta node serves (1 to the
 * cluster's --meta-shards; 0 means 1; docs/meta-shards.md), 0 from storage.
 */
#define STK_MSG_MGMT_REGISTER_REQ(F)                                                      \
	F(u32, node_id) F(u8, role) F(addr, addr) F(u32, ntargets) F(addr, host_id)       \
	F(u64, ns_hi) F(u64, ns_lo) F(addr, zone) F(u8, shard)
#define STK_MSG_MGMT_REGISTER_RESP(F) \
	F(u32, node_id) F(u32, ntargets) F(u8, refused) F(u64, shard_ns_hi) F(u64, shard_ns_lo)
/*
 * A meta node's heartbeat also says what its store holds: the namespace identity
 * (ns_hi/ns_lo: a follower's changes when it is copied) and the last change
 * (meta_epoch, meta_seq; docs/meta-replication.md), by which mgmtd promotes the
 * follower that holds the most. Zero from storage.
 */
#define STK_MSG_MGMT_HEARTBEAT_REQ(F)                                                              \
	F(u32, node_id)                                                                            \
	F(u32, ntargets) F(addr, host_id) F(u64, ns_hi) F(u64, ns_lo) F(u64, meta_epoch)           \
	    F(u64, meta_seq)
/*
 * timeout_ms: mgmtd's heartbeat timeout; a node unheard of that long from the
 * heartbeat's sending is taken out of its chains (a storage node fences itself
 * before then: stk_agent_fenced).
 */
#define STK_MSG_MGMT_HEARTBEAT_RESP(F) F(u64, routing_version) F(u32, timeout_ms)
#define STK_MSG_MGMT_GET_ROUTING_REQ(F) F(u64, known_version)
/* MGMT_REMOVE_NODE: an offline storage node's targets replaced in their chains now. */
#define STK_MSG_MGMT_REMOVE_NODE_REQ(F) F(u32, node_id)
#define STK_MSG_MGMT_REMOVE_NODE_RESP(F) F(u32, replaced) F(u32, kept)
#define STK_MSG_MGMT_TARGET_SYNCED_REQ(F) \
	F(u32, node_id) F(u32, target_id) F(u32, chain_id) F(u32, chain_ver)
/* MGMT_TARGET_WIPED: chunks and bytes: what the node removed (for mgmtd's log). */
#define STK_MSG_MGMT_TARGET_WIPED_REQ(F) \
	F(u32, node_id) F(u32, target_id) F(u64, chunks) F(u64, bytes)
/* MGMT_DRAIN_NODE: drain 1 to drain, 0 to cancel; members: its memberships left. */
#define STK_MSG_MGMT_DRAIN_NODE_REQ(F) F(u32, node_id) F(u8, drain)
#define STK_MSG_MGMT_DRAIN_NODE_RESP(F) F(u32, members)
/* MGMT_ACCEPT_LOSS: the chain's member kept, members that left, spares that joined. */
#define STK_MSG_MGMT_ACCEPT_LOSS_REQ(F) F(u32, chain_id)
#define STK_MSG_MGMT_ACCEPT_LOSS_RESP(F) F(u32, promoted) F(u32, dropped) F(u32, added)
/*
 * MGMT_REBALANCE's reply: max_moves (mgmtd's --rebalance-moves), the moves started,
 * finished and abandoned since it leads, then nmoves move_rec records (the moves
 * in flight) and nnodes node_load records (every storage node).
 */
#define STK_MSG_MGMT_REBALANCE_RESP(F)                                                    \
	F(u32, max_moves) F(u64, started) F(u64, finished) F(u64, abandoned) F(u32, nmoves) \
	F(u32, nnodes)
#define STK_MSG_MOVE_REC(F) F(u32, chain_id) F(u32, out) F(u32, in) F(u8, drain)
/* members: its targets in chains; targets: its targets not offline. */
#define STK_MSG_NODE_LOAD(F) F(u32, node_id) F(u8, draining) F(u32, members) F(u32, targets)
/*
 * MGMT_LEADER's reply: leader 1 when the mgmtd that answers leads; etcd 1 in cluster
 * mode (several mgmtd, state in etcd), 0 for an embedded mgmtd, which always leads;
 * addr: the leading mgmtd's address, "" while none leads (an election is under way).
 */
#define STK_MSG_MGMT_LEADER_RESP(F) F(u8, leader) F(u8, etcd) F(addr, addr)

#define STK_MSG_META_LOOKUP_REQ(F) F(cred, cred) F(u64, parent) F(name, name)
#define STK_MSG_META_INO_REQ(F) F(cred, cred) F(u64, ino)
#define STK_MSG_META_NAME_REQ(F) F(cred, cred) F(u64, parent) F(name, name)
#define STK_MSG_META_ATTR_RESP(F) F(attr, attr)
#define STK_MSG_META_SETATTR_REQ(F)                                                        \
	F(cred, cred) F(u64, ino) F(u32, valid) F(u32, mode) F(u32, uid) F(u32, gid)       \
	F(u64, size) F(i64, atime_sec) F(u32, atime_nsec) F(i64, mtime_sec)                \
	F(u32, mtime_nsec)
/*
 * session: the caller's session (0 = none), which then holds one open reference on
 * the file returned, as after META_OPEN; the reply's `opened` says whether it does
 * (never for a non-file, nor without a session). The replies of create and unlink
 * carry `dir`, the parent folder's attributes just after the change (ino 0 when
 * meta could not read them), so that a client need not ask for them again. With an
 * origin in the frame, `leased` 1 says that the name's entry (attr) and the folder
 * are leased to it as after META_LOOKUP_CACHE (meta/leases.h).
 */
#define STK_MSG_META_CREATE_REQ(F)                                                         \
	F(cred, cred) F(u64, parent) F(name, name) F(u32, mode) F(u32, flags) F(layout, layout) \
	F(u64, session)
#define STK_MSG_META_CREATE_RESP(F) \
	F(attr, attr) F(u8, created) F(u8, opened) F(attr, dir) F(u8, leased)
/* flags: STK_MKDIR_DELEGATE asks for the new folder to be delegated to the origin. */
#define STK_MSG_META_MKDIR_REQ(F) \
	F(cred, cred) F(u64, parent) F(name, name) F(u32, mode) F(u32, flags)
#define STK_MKDIR_DELEGATE 0x1u
/* With STK_MKDIR_DELEGATE: a folder under a quota may be delegated too; the origin
 * asks for an inode allowance (META_ALLOW) before it answers creates in it. */
#define STK_MKDIR_DELEGATE_QUOTA 0x2u
/*
 * attr: the new folder. With an origin in the frame, leased 1 as for META_CREATE (the
 * name's entry and the new folder leased to it), and empty 1 when the folder had
 * no names when read under its lease; dir: the parent's attributes. delegated 1: the
 * folder is delegated to the origin (meta/leases.h): until a revocation of it reaches
 * the origin's watch, no one else reads or changes it, and the origin may answer
 * creates and unlinks of files in it itself, sending them later with META_NAMES.
 */
#define STK_MSG_META_MKDIR_RESP(F) \
	F(attr, attr) F(u8, leased) F(u8, empty) F(attr, dir) F(u8, delegated)
#define STK_MSG_META_RENAME_REQ(F)                                                        \
	F(cred, cred) F(u64, src_parent) F(name, src_name) F(u64, dst_parent)              \
	F(name, dst_name) F(u32, flags)
#define STK_MSG_META_RENAME_RESP(F) F(u8, replaced) F(attr, attr) F(u8, orphaned)
#define STK_MSG_META_UNLINK_RESP(F) F(attr, attr) F(u8, orphaned) F(attr, dir)
#define STK_MSG_META_LINK_REQ(F) F(cred, cred) F(u64, ino) F(u64, parent) F(name, name)
#define STK_MSG_META_SYMLINK_REQ(F) F(cred, cred) F(u64, parent) F(name, name) F(path, target)
#define STK_MSG_META_READLINK_RESP(F) F(path, target)
#define STK_MSG_META_READDIR_REQ(F) F(cred, cred) F(u64, ino) F(u64, cookie) F(u32, max_entries)
#define STK_MSG_META_READDIR_RESP(F) F(u8, eof) F(u32, n)
/* One directory entry (follows meta_readdir_resp). mode carries only the type bits. */
#define STK_MSG_DIRENT(F) F(u64, ino) F(u32, mode) F(u64, next_cookie) F(name, name)
/*
 * ns_hi/ns_lo: the namespace's identity, which a client's chunk removals carry.
 * Then meta_statfs_ext, appended (an older meta's reply ends before it: flags 0):
 * STK_STATFS_PURGES says that meta removes the chunks of the files it frees
 * itself (meta/purge.h), so that its clients leave them alone.
 */
#define STK_MSG_META_STATFS_RESP(F) F(u64, files) F(u64, ns_hi) F(u64, ns_lo)
#define STK_MSG_META_STATFS_EXT(F) F(u32, flags)
#define STK_STATFS_PURGES 0x1u
/*
 * META_EXTEND: [alloc_first, alloc_end) are the chunks the writer stored data in
 * since its last report, [punch_first, punch_end) whole chunks it removed
 * (fallocate); meta counts the first, then forgets the second, for st_blocks.
 * first == end: none.
 */
#define STK_MSG_META_EXTEND_REQ(F)                                                        \
	F(cred, cred) F(u64, ino) F(u64, size) F(i64, mtime_sec) F(u32, mtime_nsec)        \
	F(u32, alloc_first) F(u32, alloc_end) F(u32, punch_first) F(u32, punch_end)
/*
 * Then, from a writer that spent a byte allowance (META_ALLOW_BYTES) on this
 * file, meta_extend_ext, appended (an older client's request ends before it:
 * nothing spent): `spent` bytes of `session`'s byte allowance in the file's quota
 * become used with this report. Meta takes them only when the frame's origin is
 * a live holder of that session (its allowance went with a reset holder).
 */
#define STK_MSG_META_EXTEND_EXT(F) F(u64, session) F(u64, spent)
/*
 * META_MKNOD: a special file (mode's type S_IFIFO, S_IFCHR, S_IFBLK or S_IFSOCK,
 * permission bits mode & 07777); rdev is a device's number, else ignored.
 */
#define STK_MSG_META_MKNOD_REQ(F) \
	F(cred, cred) F(u64, parent) F(name, name) F(u32, mode) F(u64, rdev)
/* Extended attributes: value bytes follow setxattr_req and xattr_resp (wire.h). */
#define STK_MSG_META_SETXATTR_REQ(F) \
	F(cred, cred) F(u64, ino) F(name, name) F(u32, flags) F(u32, size)
#define STK_MSG_META_GETXATTR_REQ(F) F(cred, cred) F(u64, ino) F(name, name) F(u32, size)
#define STK_MSG_META_LISTXATTR_REQ(F) F(cred, cred) F(u64, ino) F(u32, size)
#define STK_MSG_META_XATTR_NAME_REQ(F) F(cred, cred) F(u64, ino) F(name, name)
#define STK_MSG_META_XATTR_RESP(F) F(u32, size)
/* Sessions and locks (see src/meta/session.h and locks.h). pid: the client process. */
#define STK_MSG_META_SESSION_REQ(F) F(u64, session) F(u32, pid)
#define STK_MSG_META_SESSION_RESP(F) F(u32, lease_ms) F(u8, known)
/*
 * set 1 (META_OPEN only): the session holds exactly count references (re-registration).
 * META_OPEN replies with meta_attr_resp, the inode as of the registration.
 */
#define STK_MSG_META_OPEN_REQ(F) F(u64, session) F(u64, ino) F(u32, count) F(u8, set)
/*
 * META_CLOSES: n open_ref records follow (n <= STK_CLOSES_MAX). Each drops `count`
 * references (0: none) and, with STK_REF_READ in flags, first records a read of the
 * file as META_SETATTR with STK_SETATTR_ATIME_READ does (relatime). When a record
 * has STK_REF_ATTR too, the reply is n attr_rec, the attributes each recorded read
 * left, in the order of the records with STK_REF_READ (n 0, or the empty reply of
 * an older meta: none given), so that the client's lookup cache keeps them
 * instead of asking again; else it is empty (what older clients expect).
 */
#define STK_MSG_META_CLOSES_REQ(F) F(u64, session) F(u32, n)
#define STK_MSG_META_CLOSES_RESP(F) F(u32, n)
/*
 * Cache leases (src/meta/leases.h). META_WATCH: holder 0 registers; records up to
 * `acked` are done; meta holds the request up to wait_ms for records. The reply:
 * the holder's id (a new one with reset 1: forget everything cached), seq (the
 * next `acked`), then n watch_rec records, each an inode whose names and
 * attributes must be looked up again.
 */
#define STK_MSG_META_WATCH_REQ(F) F(u64, session) F(u32, holder) F(u64, acked) F(u32, wait_ms)
#define STK_MSG_META_WATCH_RESP(F) F(u32, holder) F(u64, seq) F(u8, reset) F(u32, n)
#define STK_MSG_WATCH_REC(F) F(u64, ino)
#define STK_WATCH_RECS_MAX 4096u /* records in one META_WATCH reply */
/*
 * META_LOOKUP_CACHE's reply: found 0 (no such name: attr is zero), leased 1 when the
 * answer (found or not) may be cached until a record names the folder or the inode,
 * dir the folder's attributes (for the search permission of cached answers).
 */
#define STK_MSG_META_LOOKUP_CACHE_RESP(F) F(u8, found) F(u8, leased) F(attr, attr) F(attr, dir)
/* META_GETATTRS: n getattrs_rec follow the request, n attr_rec the reply (wire.h). */
#define STK_MSG_META_GETATTRS_REQ(F) F(cred, cred) F(u32, n)
#define STK_MSG_META_GETATTRS_RESP(F) F(u32, n)
#define STK_MSG_GETATTRS_REC(F) F(u64, ino)
#define STK_MSG_ATTR_REC(F) F(u32, status) F(attr, attr)
#define STK_GETATTRS_MAX 1024u
/*
 * META_LOOKUPS: META_LOOKUP_CACHE for n names of one folder (1 to STK_LOOKUPS_MAX),
 * what a mount's readdirplus asks for a listing's batch of names: n lookups_rec
 * follow the request, n attr_rec the reply, in the request's order (NOENT: no such
 * name). leased 1: the folder's names and every inode found are leased to the
 * origin holder, as after META_LOOKUP_CACHE; dir: the folder's attributes then.
 */
#define STK_MSG_META_LOOKUPS_REQ(F) F(cred, cred) F(u64, parent) F(u32, n)
#define STK_MSG_META_LOOKUPS_RESP(F) F(u8, leased) F(attr, dir) F(u32, n)
#define STK_MSG_LOOKUPS_REC(F) F(name, name)
#define STK_LOOKUPS_MAX 256u
/*
 * META_INOS: count numbers reserved from first on, and the placement meta gives new
 * files now (chunk_size, stripe, nchains as stk_layout_make takes them), so that
 * the caller can lay its creates out itself.
 */
#define STK_MSG_META_INOS_REQ(F) F(u32, count)
#define STK_MSG_META_INOS_RESP(F) \
	F(u64, first) F(u32, count) F(u32, chunk_size) F(u32, stripe) F(u32, nchains)
#define STK_INOS_MAX 65536u
/*
 * META_NAMES: n name_rec follow the request (n <= STK_NAMES_MAX), n name_res the
 * reply. Each record is applied on its own, in order, as the origin's change (its
 * leases stay, as for META_CREATE): a failed one fails alone.
 *   op STK_NAME_CREATE: a regular file `name` in `parent` as META_CREATE with
 *     STK_CREATE_EXCL would make it (permission bits mode & 07777, owner from cred,
 *     the group of a setgid parent), but numbered `ino`, a number META_INOS
 *     reserved, laid out as `layout` (which the client may have written data by:
 *     one that fails stk_layout_check or names more chains than there are is
 *     INVAL, never replaced), and with atime, mtime and ctime at time_sec/nsec
 *     (what the client told its callers). A number already in use is EXIST.
 *   op STK_NAME_UNLINK: META_UNLINK of `name` in `parent`, only if the name holds
 *     inode `ino` (else NOENT, nothing removed; 0 is no wildcard: it never matches).
 * name_res: the status of the record and, for a create, the new file's attributes;
 * for an unlink, the inode's after it, with orphaned as META_UNLINK's (the caller
 * removes the chunks of an inode left with nlink 0 and orphaned 0).
 */
#define STK_MSG_META_NAMES_REQ(F) F(u32, n)
#define STK_MSG_META_NAMES_RESP(F) F(u32, n)
#define STK_MSG_NAME_REC(F)                                                                \
	F(u8, op) F(cred, cred) F(u64, parent) F(name, name) F(u64, ino) F(u32, mode)      \
	F(i64, time_sec) F(u32, time_nsec) F(layout, layout)
#define STK_MSG_NAME_RES(F) F(u32, status) F(attr, attr) F(u8, orphaned)
#define STK_NAMES_MAX 256u
#define STK_NAME_CREATE 1u
#define STK_NAME_UNLINK 2u
#define STK_MSG_OPEN_REF(F) F(u64, ino) F(u32, count) F(u8, flags)
#define STK_CLOSES_MAX 1024u
#define STK_REF_READ 1u
#define STK_REF_ATTR 2u
/*
 * kind: 0 POSIX record lock, 1 flock (whole file); type: 1 read (shared), 2 write
 * (exclusive), 3 unlock; [start, end] inclusive, end 2^64-1 = to the end of file.
 * The reply: the conflicting lock of a test (type 3 when none), with its holder's pid.
 */
#define STK_MSG_META_LOCK_REQ(F)                                                           \
	F(u64, session) F(u64, ino) F(u64, owner) F(u8, kind) F(u8, type) F(u8, test)      \
	F(u64, start) F(u64, end) F(u32, pid)
#define STK_MSG_META_LOCK_RESP(F) F(u8, type) F(u64, start) F(u64, end) F(u32, pid)

/*
 * META_QUOTA (docs/quotas.md): `op` is one of STK_QUOTA_*; the fields each uses:
 *   SET      ino (a folder), limit_bytes, limit_inodes (0: no limit of that kind),
 *            flags STK_QUOTA_KEEP_BYTES / _KEEP_INODES (leave that limit as it is);
 *            root only (PERM). Counts what the folder holds already.
 *   RM       ino, a quota root (NOENT: it has none); root only.
 *   GET      ino: the quota ino is counted in, the nearest first (NOENT: none);
 *            reply n = 1.
 *   LIST     ino = the first quota root to list (0: from the start); reply n
 *            records in order of their ids, at most STK_QUOTA_LIST_MAX, and
 *            `more` when others follow.
 *   RECOUNT  ino, a quota root (0: all): usage counted again from the tree and
 *            fixed; reply n records, each as it is now, with `fixed` 1 for those
 *            that changed (their old usage in old_*); root only.
 *   RESERVE  session, ino (a regular file), size = what the caller needs to be
 *            able to write up to, want = what it would like (>= size): meta
 *            grants want, or less but at least size, or answers DQUOT; reply
 *            granted (UINT64_MAX: the file has no quota, write freely).
 * The request is `quota_req`; the reply `quota_resp` followed by n quota_rec, each
 * with the quota root's path as meta finds it ("" if it cannot).
 */
#define STK_MSG_META_QUOTA_REQ(F)                                                          \
	F(cred, cred) F(u8, op) F(u64, ino) F(u64, session) F(u64, limit_bytes)            \
	F(u64, limit_inodes) F(u32, flags) F(u64, size) F(u64, want)
#define STK_MSG_META_QUOTA_RESP(F) F(u64, granted) F(u8, more) F(u32, n)
/*
 * META_REPL (leader to follower; src/meta/repl.c), with `len` bytes of bulk. kind:
 * PROBE (what do you hold), LOG (the bulk is a log: entries u64 epoch, u64 seq,
 * u32 length, redo record, as meta/store.h describes), SNAP (the bulk is a part of
 * a copy of the store; `first` on the first part, which empties the follower
 * first; on a LOG, `first` asks the follower to flush its store to stable storage
 * before it answers: a client's fsync), SNAP_DONE (the copy is complete as of snap_epoch, snap_seq). epoch: the shard epoch the leader
 * leads in; leader: its node id. The reply: the follower's position after, and its
 * store's identity (a store of another namespace is copied whatever it holds).
 */
#define STK_REPL_PROBE 0
#define STK_REPL_LOG 1
#define STK_REPL_SNAP 2
#define STK_REPL_SNAP_DONE 3
#define STK_MSG_META_REPL_REQ(F)                                                                   \
	F(u64, epoch)                                                                              \
	F(u32, leader) F(u8, kind) F(u8, first) F(u64, snap_epoch) F(u64, snap_seq) F(u32, len)
#define STK_MSG_META_REPL_RESP(F) F(u64, pos_epoch) F(u64, pos_seq) F(u64, ns_hi) F(u64, ns_lo)
/*
 * META_ALLOW (docs/quotas.md, "Creates a mount answers itself"): session's inode
 * allowance in the quota folder `dir` counts in. First `give` inodes of it are
 * given back (at most what it holds; UINT32_MAX: all of it; NOENT when dir is
 * gone or in no quota). Then, with want > 0,
 * up to want more are set aside (granted, at least 1; DQUOT when none is left);
 * with no inode limit on dir, granted is want and nothing is set aside. qid: the
 * quota root dir counts in, 0: none. want and give both 0: INVAL. AGAIN: the
 * frame's origin is not a live lease holder of `session` (it was reset).
 */
/*
 * META_XSHARD (meta/xshard.c): op is one of STK_XSHARD_*, from the shard asking, intent
 * its intent's id (both shards name the operation by (from, intent)).
 * MKDIR (to B): a folder whose parent is `parent` on A, `name` there, mode, uid,
 *   gid, marked pending; the reply's attr is it. Asked again: the same folder.
 * DYING (to B): folder ino, empty, marked dying (NOTEMPTY, BUSY, NOENT).
 * SETTLE (to B): the mark of (from, intent) settled, done 1 (A named the folder,
 *   or removed its name) or 0 (A gave up); kind: the intent's (STK_XINTENT_*).
 * QUERY (to A, from B's recovery): state STK_XSTATE_* of intent, else of `name`
 *   in parent naming ino.
 * COUNT (to any, for tests and operators): the intents (with folder moves not
 *   settled yet and, on shard 1, a held folder-move lock) and marks it holds now
 *   (intents, marks; the other replies leave them 0), the reply followed by a u32:
 *   the releases waiting (a reply without it is from a node before them).
 * A file renamed from a folder of S to one of D (docs/meta-shards.md):
 * RENAME (to D, step 2): `name` in parent (D's) names file ino (mode: its type),
 *   replacing what it named, marked for (from, intent); uid, gid: the caller's;
 *   done 1: RENAME_NOREPLACE. The reply's attr: what it replaced (ino 0: none);
 *   its state NAMED: the name names that file already, nothing was done.
 * SETTLE with kind STK_XINTENT_RENAME: step 4 (done 1) or the undo (0).
 * QUERY with kind STK_XINTENT_RENAME (to S): state INTENT, MOVED or STAYED of
 *   intent, moving file ino.
 * RELEASE (to the file's home H): shard `from` no longer names file ino (intent:
 *   the id of that name); the reply's attr: the file after.
 * A hard link of a file of H into a folder of D:
 * LINK (to H, step 2): file ino's link counted for `name` in parent (D's), marked
 *   for (from, intent); the reply's attr: the file after.
 * SETTLE and QUERY (to D) with kind STK_XINTENT_LINK: as for a rename.
 * DELEGATE (from a client, to the folder's shard, with its holder there as the
 *   frame's origin): folder ino, made a moment ago on this shard by a mkdir in a
 *   folder of another (which delegates nothing), leased to the origin and, when
 *   uid owns it with write and search permission (or is root), empty, unmarked
 *   and nobody else's, delegated to it as META_MKDIR with STK_MKDIR_DELEGATE and
 *   STK_MKDIR_DELEGATE_QUOTA would have (docs/leases.md). The reply's attr: the
 *   folder as read under the lease; state: STK_XDELEG_* bits. A meta from before
 *   it answers INVAL: nothing is delegated.
 * ATTR (from a shard A, to the shard of inode ino, for a lookup of a name on A
 *   that names it: a folder placed here, a file renamed off home): its
 *   attributes, as META_GETATTR, read on behalf of the client of session
 *   `intent` (0: none): a delegation of it to that client's holder here is not
 *   recalled (the client sent what it answered in it before its lookup reached
 *   A), another's is; and it is leased to that holder first (state
 *   STK_XATTR_LEASED), so that A may lease the name: the client's entry then
 *   rests on A's lease of the name and this shard's of the attributes. A meta
 *   from before it answers INVAL: A asks META_GETATTR, which recalls any, and
 *   leases nothing.
 * A folder ino moved from a folder of A (from) to `parent` (docs/meta-shards.md,
 * "Folders moved across shards"):
 * FMOVE (to B, step 2): `name` in parent names folder ino, replacing an empty
 *   folder of B, marked for (from, intent); uid, gid: the caller's; done 1:
 *   RENAME_NOREPLACE.
 * FPTR (to C, the folder's shard, step 2): folder ino marked, its parent pointer
 *   to become `parent` at step 4.
 * SETTLE with kind STK_XINTENT_FMOVE: step 4 (done 1) or the undo (0).
 * QUERY with kind STK_XINTENT_FMOVE (to A): INTENT, MOVED or STAYED of intent.
 * LOCK (to shard 1): the cluster's folder-move lock for (from, intent), done 1
 *   taken (BUSY: another holds it), done 0 released.
 * QUERY with kind STK_XQUERY_LOCK (to the lock's holder, from shard 1's
 *   recovery): state INTENT while the holder still works under lock id intent,
 *   STAYED once it does not.
 * PARENT (to the shard of folder ino): its parent pointer, in the reply's
 *   attr.ino (NOENT, NOTDIR).
 * An older meta answers these INVAL: the move fails with nothing changed.
 */
#define STK_MSG_META_XSHARD_REQ(F)                                                        \
	F(u8, op) F(u32, from) F(u64, intent) F(u64, ino) F(u64, parent) F(name, name)     \
	F(u32, mode) F(u32, uid) F(u32, gid) F(u8, done) F(u8, kind)
#define STK_MSG_META_XSHARD_RESP(F) F(u8, state) F(attr, attr) F(u32, intents) F(u32, marks)
enum {
	STK_XSHARD_MKDIR = 1,
	STK_XSHARD_DYING = 2,
	STK_XSHARD_SETTLE = 3,
	STK_XSHARD_QUERY = 4,
	STK_XSHARD_COUNT = 5,
	STK_XSHARD_RENAME = 6,
	STK_XSHARD_RELEASE = 7,
	STK_XSHARD_LINK = 8,
	STK_XSHARD_DELEGATE = 9,
	STK_XSHARD_ATTR = 10,
	STK_XSHARD_FMOVE = 11,
	STK_XSHARD_FPTR = 12,
	STK_XSHARD_LOCK = 13,
	STK_XSHARD_PARENT = 14
};
/*
 * UP (to any shard; a client key's subtree, meta/span.c): the walk up the parent
 * pointers from ino towards folder `parent` (the subtree's) on the shard asked,
 * with nothing asked of others: state STK_XUP_*; with STK_XUP_LEFT, attr.ino is the
 * inode of another shard where the walk goes on. Numbered apart from the steps
 * above, which other sub-ops may follow.
 */
enum { STK_XSHARD_UP = 20 };
enum { STK_XUP_OUTSIDE = 0, STK_XUP_INSIDE = 1, STK_XUP_LEFT = 2 };
enum { STK_XDELEG_LEASED = 1, STK_XDELEG_EMPTY = 2, STK_XDELEG_DELEGATED = 4 };
enum { STK_XATTR_LEASED = 1 };
#define STK_MSG_META_ALLOW_REQ(F) F(u64, session) F(u64, dir) F(u32, want) F(u32, give)
#define STK_MSG_META_ALLOW_RESP(F) F(u64, granted) F(u64, qid)
#define STK_ALLOW_MAX 65536u /* inodes asked for at a time, at most */
/*
 * META_ALLOW_BYTES: the same request and reply for a byte allowance, for the
 * session's writes to files (not only folders: `dir` may name any inode counted
 * in the quota) under a byte limit; want and give in bytes (give UINT32_MAX:
 * all of it). Spent by the writes of files past their size, reported with
 * META_EXTEND's meta_extend_ext (docs/quotas.md, "Bytes a mount writes").
 */
#define STK_ALLOW_BYTES_MAX (1u << 30) /* bytes asked for at a time, at most */
#define STK_MSG_QUOTA_REC(F)                                                               \
	F(u64, qid) F(u64, parent) F(u64, limit_bytes) F(u64, limit_inodes)               \
	F(u64, used_bytes) F(u64, used_inodes) F(u64, reserved_bytes) F(u8, fixed)         \
	F(u64, old_bytes) F(u64, old_inodes) F(path, path)
enum stk_quota_op {
	STK_QUOTA_SET = 1,
	STK_QUOTA_RM = 2,
	STK_QUOTA_GET = 3,
	STK_QUOTA_LIST = 4,
	STK_QUOTA_RECOUNT = 5,
	STK_QUOTA_RESERVE = 6,
};
#define STK_QUOTA_KEEP_BYTES 0x1u
#define STK_QUOTA_KEEP_INODES 0x2u
#define STK_QUOTA_LIST_MAX 128u /* records of up to 4 KiB in a 1 MiB payload */

/*
 * chain_ver lets storage answer STALE_ROUTING to a client with an old chain table.
 * Data checksums: the frame of a STOR_WRITE request and of a STOR_READ reply carries
 * STK_FRAME_BULK_SELF (its checksum covers the payload only) and the message is
 * followed by `ncrcs` u32 values, the CRC32C of each STK_CRC_BLOCK-byte piece of the
 * bulk from its first byte (the last piece may be shorter); ncrcs must equal
 * stk_crc_blocks(length). The bytes are checksummed once by whoever produced them
 * and verified by whoever receives them, and the same values become the chunk's
 * stored block checksums when the write is block-aligned.
 */
#define STK_MSG_STOR_WRITE_REQ(F)                                                          \
	F(u32, chain_id) F(u32, chain_ver) F(u64, ino) F(u32, chunk_idx) F(u32, chunk_size) \
	F(u32, offset) F(u32, length) F(u32, flags) F(u32, ncrcs) F(u64, base_ver)         \
	F(u64, set_ver)
#define STK_MSG_STOR_WRITE_RESP(F) F(u32, chunk_len)
#define STK_MSG_STOR_READ_REQ(F)                                                           \
	F(u32, chain_id) F(u32, chain_ver) F(u64, ino) F(u32, chunk_idx) F(u32, offset)    \
	F(u32, length)
/* Followed by ncrcs block checksums of the bulk (see STOR_WRITE). */
#define STK_MSG_STOR_READ_RESP(F) F(u32, ncrcs)
/*
 * ns_hi/ns_lo (the fence on chunk removal): the identity of the namespace that told
 * the sender about the inode (meta's store; a client asks meta with META_STATFS).
 * Storage refuses (PERM) a truncation whose identity is not that of shard 1 in its
 * routing table, so that a meta serving some other store, and its clients, cannot
 * remove chunks of files they never knew.
 */
#define STK_MSG_STOR_TRUNCATE_REQ(F)                                                      \
	F(u32, chain_id) F(u32, chain_ver) F(u64, ino) F(u64, size) F(u32, chunk_size)     \
	F(u64, ns_hi) F(u64, ns_lo)
/*
 * STOR_TRUNCATES: n trunc_rec records follow (n <= STK_TRUNCATES_MAX), each done as
 * a STOR_TRUNCATE of that inode on this chain; ns as for STOR_TRUNCATE.
 */
#define STK_MSG_STOR_TRUNCATES_REQ(F) \
	F(u32, chain_id) F(u32, chain_ver) F(u32, n) F(u64, ns_hi) F(u64, ns_lo)
#define STK_MSG_TRUNC_REC(F) F(u64, ino) F(u64, size) F(u32, chunk_size)
#define STK_TRUNCATES_MAX 256u
#define STK_MSG_STOR_SYNC_REQ(F) F(u32, chain_id)
/* STOR_PUNCH: drops the inode's chunks [first, end) held on this chain's target. */
#define STK_MSG_STOR_PUNCH_REQ(F) \
	F(u32, chain_id) F(u32, chain_ver) F(u64, ino) F(u32, first) F(u32, end)
#define STK_MSG_STOR_PREFETCH_REQ(F) \
	F(u32, chain_id) F(u32, chain_ver) F(u64, ino) F(u32, chunk_idx)
/*
 * STOR_SYNC_LIST's cursor: chunks of bucket `bucket` (ino % 256) after (ino, idx),
 * or from its first with from_start, then the buckets after it. The reply holds n
 * sync_rec records (n <= max, <= STK_SYNC_LIST_MAX) and the next page's cursor;
 * done once bucket 255 has been listed.
 */
#define STK_MSG_STOR_SYNC_LIST_REQ(F)                                                      \
	F(u32, chain_id) F(u32, chain_ver) F(u32, bucket) F(u64, ino) F(u32, idx)          \
	F(u8, from_start) F(u32, max)
#define STK_MSG_STOR_SYNC_LIST_RESP(F)                                                     \
	F(u32, n) F(u8, done) F(u32, bucket) F(u64, ino) F(u32, idx) F(u8, from_start)
#define STK_MSG_SYNC_REC(F) F(u64, ino) F(u32, idx) F(u64, version)
#define STK_SYNC_LIST_MAX 4096u
#define STK_MSG_STOR_SYNC_READ_REQ(F) F(u32, chain_id) F(u32, chain_ver) F(u64, ino) F(u32, idx)
/*
 * STOR_FSCK_LIST (stoker fsck, docs/fsck.md): a page of the chunks target
 * target_id of this node holds, whatever its chains, with the cursor of
 * STOR_SYNC_LIST. The reply: the cursor of the next page (done once bucket 255
 * is listed), the node's clock (now_sec, for the chunks' ages), then n fsck_chunk
 * (n <= max, <= STK_SYNC_LIST_MAX): version, length, digest (the CRC32C of the
 * chunk's block CRCs, seeded with its length: equal bytes, equal digests) and the
 * time its file was last written. NOENT: no such target on this node.
 */
#define STK_MSG_STOR_FSCK_LIST_REQ(F)                                                       \
	F(u32, target_id) F(u32, bucket) F(u64, ino) F(u32, idx) F(u8, from_start) F(u32, max)
#define STK_MSG_STOR_FSCK_LIST_RESP(F)                                                      \
	F(u32, n) F(u8, done) F(u32, bucket) F(u64, ino) F(u32, idx) F(u8, from_start)      \
	F(i64, now_sec)
#define STK_MSG_FSCK_CHUNK(F)                                                               \
	F(u64, ino) F(u32, idx) F(u64, version) F(u32, len) F(u32, digest) F(i64, mtime_sec)
/* Followed by ncrcs block checksums of the bulk (see STOR_WRITE). */
#define STK_MSG_STOR_SYNC_READ_RESP(F) F(u64, version) F(u32, ncrcs)

/*
 * META_FSCK (stoker fsck, docs/fsck.md), root only (PERM), by op:
 *   STK_FSCK_CHECK   checks the namespace in one transaction (meta/store.h
 *                    stk_meta_store_fsck); flags STK_FSCK_REPAIR repairs what is
 *                    safe. The reply: the counts, then n fsck_problem (at most
 *                    max, at most STK_FSCK_PROBLEMS_MAX; total says how many were
 *                    found).
 *   STK_FSCK_FILES   a page of regular files from inode `from`: n fsck_file, each
 *                    followed by its nalloc fsck_range; next is the next page's
 *                    `from`, done 1 at the end (n <= max, <= STK_FSCK_FILES_MAX).
 *   STK_FSCK_PURGES  a page of the inodes whose chunks wait for meta's purge
 *                    (meta/purge.h) from `from`: n u64, then next and done as above.
 *   STK_FSCK_XENTRIES a page of the entries naming a folder of another shard, in
 *                    key order: n fsck_xref (covered: an intent is about a name in
 *                    its parent; hash: its key's), done 1 at the end. The request
 *                    is followed by a fsck_xref, the last entry of the page before
 *                    (the first page: one of parent 0, name "").
 *   STK_FSCK_XDIRS   a page of the folders whose parent is on another shard, from
 *                    inode `from`: n fsck_xref (name "", covered: a pending or
 *                    dying mark is on it); next and done as above.
 *   STK_FSCK_XDROP   the request followed by a u64, the inode: the entry in folder
 *                    `from` naming that folder of another shard goes (the other
 *                    shard has no such inode); EBUSY while an intent is about a
 *                    name in the folder, ENOENT when no entry names it. The reply:
 *                    the head (n 1) and the fsck_xref dropped.
 *   STK_FSCK_XPARENT the request followed by two u64, seen and parent: folder
 *                    `from`'s parent pointer becomes parent if it is still seen
 *                    (ESTALE) and no cross-shard mark is on it (EBUSY); ENOTDIR,
 *                    EINVAL (the root, or another shard's). The reply: the head.
 *   STK_FSCK_ADOPT   shard 1 only (EXDEV): the request followed by a u64, seen:
 *                    inode `from` reattached in lost+found as "#INO", lost+found
 *                    made if needed (from 0: only that). A folder of shard 1 whose
 *                    parent pointer is still seen, or a folder of another shard
 *                    whose pointer that shard has set to lost+found already
 *                    (XPARENT first); ESTALE, EBUSY as XPARENT's, ENOTDIR for a
 *                    file of shard 1 (its check reattaches those). The reply: the
 *                    head (n 1) and a fsck_xref (parent: lost+found, name: the
 *                    entry's).
 *   STK_FSCK_GATHER  shard 2.. only (EINVAL on 1): the request followed by max u64
 *                    (at most STK_FSCK_PROBLEMS_MAX), inodes its check found
 *                    unreached: those still files no name reaches go, as "#INO",
 *                    into a new folder whose parent pointer is `from` (shard 1's
 *                    lost+found) and that ADOPT names next. The reply: the head (n
 *                    those gone, next the folder, 0 for none) and their n u64.
 *   STK_FSCK_XNAMES  as XENTRIES, the entries naming a file (no folder) of another
 *                    shard; covered: STK_FSCK_XCOVERED, STK_FSCK_XHAS_R.
 *   STK_FSCK_XRECS   a page of the records of names off home ('X', 'R', 'L'; meta/
 *                    store.h stk_meta_store_fsck_xrecs) from cursor `from`: n
 *                    fsck_xrec; next and done as XDIRS.
 *   STK_FSCK_XUNNAME the request followed by two u64, the other shard and id: at
 *                    file `from`'s home its 'X' record of that name goes, and its
 *                    link; at the name's shard a leftover 'R' (no entry names the
 *                    file: else EEXIST) (ESTALE, EBUSY). The reply: the head.
 *   STK_FSCK_XRESTORE the request followed by two u64, the other shard and id: the
 *                    record of the name off home of file `from` written again (its
 *                    home's 'X', or the name's shard's 'R'; EEXIST, EBUSY).
 *                    The reply: the head.
 * A node from before XNAMES answers those four INVAL.
 */
#define STK_MSG_META_FSCK_REQ(F) F(cred, cred) F(u32, op) F(u32, flags) F(u64, from) F(u32, max)
#define STK_MSG_META_FSCK_RESP(F)                                                            \
	F(u32, n) F(u8, done) F(u64, next) F(u64, total) F(u64, repaired) F(u64, inodes)      \
	F(u64, entries) F(u64, dirs) F(u64, files) F(u64, next_ino)
#define STK_MSG_FSCK_PROBLEM(F)                                                              \
	F(u32, kind) F(u8, repaired) F(u64, ino) F(u64, parent) F(u64, expect) F(u64, found)  \
	F(name, name)
#define STK_MSG_FSCK_FILE(F) F(attr, attr) F(u8, exact) F(u8, orphan) F(u32, nalloc)
#define STK_MSG_FSCK_RANGE(F) F(u32, first) F(u32, end)
#define STK_MSG_FSCK_XREF(F)                                                                 \
	F(u64, ino) F(u64, parent) F(u64, hash) F(u8, covered) F(name, name)
#define STK_MSG_FSCK_XREC(F) F(u8, kind) F(u8, covered) F(u64, ino) F(u32, shard) F(u64, id)
/* fsck_problem's kind: what meta/store.h stk_meta_store_fsck checks. */
enum stk_fsck_kind {
	STK_FSCK_KIND_DANGLING = 1,
	STK_FSCK_KIND_LOST_ENTRY = 2,
	STK_FSCK_KIND_NLINK = 3,
	STK_FSCK_KIND_UNREACHED = 4,
	STK_FSCK_KIND_STALE_ORPHAN = 5,
	STK_FSCK_KIND_PARENT = 6,
	STK_FSCK_KIND_QUOTA_BYTES = 7,
	STK_FSCK_KIND_QUOTA_INODES = 8,
	STK_FSCK_KIND_CORRUPT = 9,
	STK_FSCK_KIND_CYCLE = 10,
};
#define STK_FSCK_CHECK 1u
#define STK_FSCK_FILES 2u
#define STK_FSCK_PURGES 3u
#define STK_FSCK_XENTRIES 4u
#define STK_FSCK_XDIRS 5u
#define STK_FSCK_XDROP 6u
#define STK_FSCK_XPARENT 7u
#define STK_FSCK_ADOPT 8u
#define STK_FSCK_GATHER 9u
#define STK_FSCK_XNAMES 10u
#define STK_FSCK_XRECS 11u
#define STK_FSCK_XUNNAME 12u
#define STK_FSCK_XRESTORE 13u
#define STK_FSCK_XCOVERED 0x1u /* XNAMES, XRECS: an intent or a mark is about the file */
#define STK_FSCK_XHAS_R 0x2u   /* XNAMES: the shard's 'R' record names the file's home */
#define STK_FSCK_REPAIR 0x1u
#define STK_FSCK_PROBLEMS_MAX 2000u
#define STK_FSCK_FILES_MAX 1024u

/* The key handshake (wire.h AUTH_HELLO, common/auth.h): nonces and HMAC-SHA256 MACs. */
#define STK_MSG_AUTH_HELLO_REQ(F) F(b32, nonce)
#define STK_MSG_AUTH_HELLO_RESP(F) F(b32, nonce) F(b32, mac)
#define STK_MSG_AUTH_PROOF_REQ(F) F(b32, mac)
#define STK_MSG_AUTH_HELLO_CLIENT_REQ(F)                                            \
	F(b32, nonce) F(name, client) F(u64, gen) F(u32, flags) F(u32, anon_uid)    \
	F(u32, anon_gid) F(path, subtree)
/* A client identity (common/auth.h, struct stk_auth_client); removed: revoked. */
#define STK_MSG_CLIENT_REC(F)                                                        \
	F(name, name) F(u64, gen) F(u32, flags) F(u32, anon_uid) F(u32, anon_gid)   \
	F(path, subtree) F(u8, removed)
/* META_WITHIN: within 1 when ino lies under the folder subtree names, else 0. */
#define STK_MSG_META_WITHIN_REQ(F) F(u64, ino) F(path, subtree)
#define STK_MSG_META_WITHIN_RESP(F) F(u8, within)
/*
 * A voucher (wire.h, STK_FRAME_VOUCH; common/auth.h): inodes [ino, ino + count) lie
 * under the client's subtree as of meta's epoch, until expires_ms (Unix time);
 * mac: HMAC under the vouch key, which no client holds.
 */
#define STK_MSG_VOUCH_REC(F) F(u64, ino) F(u64, count) F(u64, expires_ms) F(u64, epoch) F(b32, mac)
#define STK_VOUCH_REC_LEN 64u
/*
 * META_EPOCH's reply. A request with `since` (version 10 storage nodes that know
 * moves; an empty request is as before) gets the epoch then a meta_moves_resp: the
 * epoch meta started counting from (base), the last epoch that ended every
 * voucher (wide: a folder renamed, a rename that failed), the last epoch of a file
 * move not listed (lost: dropped from meta's log, or past STK_MOVED_MAX), then n
 * moved_rec: each file moved to another folder after `since`, with the epoch of
 * its move (docs/security.md, "How long one is good for").
 */
#define STK_MSG_META_EPOCH_RESP(F) F(u64, epoch)
#define STK_MSG_META_EPOCH_REQ(F) F(u64, since)
#define STK_MSG_META_MOVES_RESP(F) F(u64, base) F(u64, wide) F(u64, lost) F(u32, n)
#define STK_MSG_MOVED_REC(F) F(u64, ino) F(u64, at)
#define STK_MOVED_MAX 1024u
#define STK_MSG_MGMT_CLIENT_NAME(F) F(name, name)
#define STK_MSG_MGMT_CLIENT_GEN(F) F(u64, gen)
/*
 * A tenant's QoS limits (docs/qos.md): bytes per second read and written, and
 * requests per second, each per storage node; 0 is no limit; max_class, the
 * highest class its requests count as (STK_QOS_CLASS_*, 255: as marked). A
 * tenant is a client key's name, or "@default" / "@checkpoint": a class's own
 * limits, which hold while a higher class is served.
 */
#define STK_MSG_QOS_REC(F)                                                                         \
	F(name, tenant) F(u64, read_bw) F(u64, write_bw) F(u32, iops) F(u8, max_class)
#define STK_QOS_MAX 64u /* tenants with limits, cluster-wide */
#define STK_QOS_CLASS_LOWEST 2u /* classes are 0 to 2: default, training-read, checkpoint */
#define STK_QOS_CLASS_ANY 255u	/* max_class: no cap */

/* Every message: (struct name, field list). */
#define STK_MSG_LIST(X)                                           \
	X(target_info, STK_MSG_TARGET_INFO)                       \
	X(mgmt_register_req, STK_MSG_MGMT_REGISTER_REQ)           \
	X(mgmt_register_resp, STK_MSG_MGMT_REGISTER_RESP)         \
	X(mgmt_heartbeat_req, STK_MSG_MGMT_HEARTBEAT_REQ)         \
	X(mgmt_heartbeat_resp, STK_MSG_MGMT_HEARTBEAT_RESP)       \
	X(mgmt_get_routing_req, STK_MSG_MGMT_GET_ROUTING_REQ)     \
	X(mgmt_leader_resp, STK_MSG_MGMT_LEADER_RESP)             \
	X(meta_lookup_req, STK_MSG_META_LOOKUP_REQ)               \
	X(meta_ino_req, STK_MSG_META_INO_REQ)                     \
	X(meta_name_req, STK_MSG_META_NAME_REQ)                   \
	X(meta_attr_resp, STK_MSG_META_ATTR_RESP)                 \
	X(meta_setattr_req, STK_MSG_META_SETATTR_REQ)             \
	X(meta_create_req, STK_MSG_META_CREATE_REQ)               \
	X(meta_create_resp, STK_MSG_META_CREATE_RESP)             \
	X(meta_mkdir_req, STK_MSG_META_MKDIR_REQ)                 \
	X(meta_mkdir_resp, STK_MSG_META_MKDIR_RESP)               \
	X(meta_rename_req, STK_MSG_META_RENAME_REQ)               \
	X(meta_rename_resp, STK_MSG_META_RENAME_RESP)             \
	X(meta_unlink_resp, STK_MSG_META_UNLINK_RESP)             \
	X(meta_link_req, STK_MSG_META_LINK_REQ)                   \
	X(meta_symlink_req, STK_MSG_META_SYMLINK_REQ)             \
	X(meta_readlink_resp, STK_MSG_META_READLINK_RESP)         \
	X(meta_readdir_req, STK_MSG_META_READDIR_REQ)             \
	X(meta_readdir_resp, STK_MSG_META_READDIR_RESP)           \
	X(dirent, STK_MSG_DIRENT)                                 \
	X(meta_statfs_resp, STK_MSG_META_STATFS_RESP)             \
	X(meta_statfs_ext, STK_MSG_META_STATFS_EXT)               \
	X(meta_extend_req, STK_MSG_META_EXTEND_REQ)               \
	X(meta_extend_ext, STK_MSG_META_EXTEND_EXT)               \
	X(meta_mknod_req, STK_MSG_META_MKNOD_REQ)                 \
	X(meta_setxattr_req, STK_MSG_META_SETXATTR_REQ)           \
	X(meta_getxattr_req, STK_MSG_META_GETXATTR_REQ)           \
	X(meta_listxattr_req, STK_MSG_META_LISTXATTR_REQ)         \
	X(meta_xattr_name_req, STK_MSG_META_XATTR_NAME_REQ)       \
	X(meta_xattr_resp, STK_MSG_META_XATTR_RESP)               \
	X(meta_session_req, STK_MSG_META_SESSION_REQ)             \
	X(meta_session_resp, STK_MSG_META_SESSION_RESP)           \
	X(meta_open_req, STK_MSG_META_OPEN_REQ)                   \
	X(meta_closes_req, STK_MSG_META_CLOSES_REQ)               \
	X(meta_closes_resp, STK_MSG_META_CLOSES_RESP)             \
	X(open_ref, STK_MSG_OPEN_REF)                             \
	X(meta_watch_req, STK_MSG_META_WATCH_REQ)                 \
	X(meta_watch_resp, STK_MSG_META_WATCH_RESP)               \
	X(watch_rec, STK_MSG_WATCH_REC)                           \
	X(meta_lookup_cache_resp, STK_MSG_META_LOOKUP_CACHE_RESP) \
	X(meta_getattrs_req, STK_MSG_META_GETATTRS_REQ)           \
	X(meta_getattrs_resp, STK_MSG_META_GETATTRS_RESP)         \
	X(getattrs_rec, STK_MSG_GETATTRS_REC)                     \
	X(attr_rec, STK_MSG_ATTR_REC)                             \
	X(meta_lookups_req, STK_MSG_META_LOOKUPS_REQ)             \
	X(meta_lookups_resp, STK_MSG_META_LOOKUPS_RESP)           \
	X(lookups_rec, STK_MSG_LOOKUPS_REC)                       \
	X(meta_inos_req, STK_MSG_META_INOS_REQ)                   \
	X(meta_inos_resp, STK_MSG_META_INOS_RESP)                 \
	X(meta_names_req, STK_MSG_META_NAMES_REQ)                 \
	X(meta_names_resp, STK_MSG_META_NAMES_RESP)               \
	X(name_rec, STK_MSG_NAME_REC)                             \
	X(name_res, STK_MSG_NAME_RES)                             \
	X(meta_lock_req, STK_MSG_META_LOCK_REQ)                   \
	X(meta_lock_resp, STK_MSG_META_LOCK_RESP)                 \
	X(meta_quota_req, STK_MSG_META_QUOTA_REQ)                 \
	X(meta_allow_req, STK_MSG_META_ALLOW_REQ)                 \
	X(meta_allow_resp, STK_MSG_META_ALLOW_RESP)               \
	X(meta_xshard_req, STK_MSG_META_XSHARD_REQ)               \
	X(meta_xshard_resp, STK_MSG_META_XSHARD_RESP)             \
	X(meta_quota_resp, STK_MSG_META_QUOTA_RESP)               \
	X(meta_repl_req, STK_MSG_META_REPL_REQ)                                                    \
	X(meta_repl_resp, STK_MSG_META_REPL_RESP)                                                  \
	X(quota_rec, STK_MSG_QUOTA_REC)                           \
	X(stor_write_req, STK_MSG_STOR_WRITE_REQ)                 \
	X(stor_write_resp, STK_MSG_STOR_WRITE_RESP)               \
	X(stor_read_req, STK_MSG_STOR_READ_REQ)                   \
	X(stor_read_resp, STK_MSG_STOR_READ_RESP)                 \
	X(stor_truncate_req, STK_MSG_STOR_TRUNCATE_REQ)           \
	X(stor_truncates_req, STK_MSG_STOR_TRUNCATES_REQ)         \
	X(trunc_rec, STK_MSG_TRUNC_REC)                           \
	X(stor_sync_req, STK_MSG_STOR_SYNC_REQ)                   \
	X(stor_punch_req, STK_MSG_STOR_PUNCH_REQ)                 \
	X(stor_prefetch_req, STK_MSG_STOR_PREFETCH_REQ)           \
	X(stor_sync_list_req, STK_MSG_STOR_SYNC_LIST_REQ)         \
	X(stor_sync_list_resp, STK_MSG_STOR_SYNC_LIST_RESP)       \
	X(sync_rec, STK_MSG_SYNC_REC)                             \
	X(stor_sync_read_req, STK_MSG_STOR_SYNC_READ_REQ)         \
	X(stor_fsck_list_req, STK_MSG_STOR_FSCK_LIST_REQ)         \
	X(stor_fsck_list_resp, STK_MSG_STOR_FSCK_LIST_RESP)       \
	X(fsck_chunk, STK_MSG_FSCK_CHUNK)                         \
	X(meta_fsck_req, STK_MSG_META_FSCK_REQ)                   \
	X(meta_fsck_resp, STK_MSG_META_FSCK_RESP)                 \
	X(fsck_problem, STK_MSG_FSCK_PROBLEM)                     \
	X(fsck_file, STK_MSG_FSCK_FILE)                           \
	X(fsck_range, STK_MSG_FSCK_RANGE)                         \
	X(fsck_xref, STK_MSG_FSCK_XREF)                           \
	X(fsck_xrec, STK_MSG_FSCK_XREC)                           \
	X(stor_sync_read_resp, STK_MSG_STOR_SYNC_READ_RESP)       \
	X(mgmt_target_synced_req, STK_MSG_MGMT_TARGET_SYNCED_REQ) \
	X(mgmt_remove_node_req, STK_MSG_MGMT_REMOVE_NODE_REQ)     \
	X(mgmt_remove_node_resp, STK_MSG_MGMT_REMOVE_NODE_RESP)   \
	X(mgmt_target_wiped_req, STK_MSG_MGMT_TARGET_WIPED_REQ)   \
	X(mgmt_drain_node_req, STK_MSG_MGMT_DRAIN_NODE_REQ)       \
	X(mgmt_drain_node_resp, STK_MSG_MGMT_DRAIN_NODE_RESP)     \
	X(mgmt_accept_loss_req, STK_MSG_MGMT_ACCEPT_LOSS_REQ)     \
	X(mgmt_accept_loss_resp, STK_MSG_MGMT_ACCEPT_LOSS_RESP)   \
	X(mgmt_rebalance_resp, STK_MSG_MGMT_REBALANCE_RESP)       \
	X(move_rec, STK_MSG_MOVE_REC)                             \
	X(node_load, STK_MSG_NODE_LOAD)                           \
	X(auth_hello_req, STK_MSG_AUTH_HELLO_REQ)                 \
	X(auth_hello_resp, STK_MSG_AUTH_HELLO_RESP)               \
	X(auth_proof_req, STK_MSG_AUTH_PROOF_REQ)                 \
	X(auth_hello_client_req, STK_MSG_AUTH_HELLO_CLIENT_REQ)   \
	X(client_rec, STK_MSG_CLIENT_REC)                         \
	X(meta_within_req, STK_MSG_META_WITHIN_REQ)               \
	X(meta_within_resp, STK_MSG_META_WITHIN_RESP)             \
	X(vouch_rec, STK_MSG_VOUCH_REC)                           \
	X(meta_epoch_resp, STK_MSG_META_EPOCH_RESP)               \
	X(meta_epoch_req, STK_MSG_META_EPOCH_REQ)                 \
	X(meta_moves_resp, STK_MSG_META_MOVES_RESP)               \
	X(moved_rec, STK_MSG_MOVED_REC)                           \
	X(mgmt_client_name, STK_MSG_MGMT_CLIENT_NAME)             \
	X(mgmt_client_gen, STK_MSG_MGMT_CLIENT_GEN)                                                \
	X(qos_rec, STK_MSG_QOS_REC)

/* ---- generated structs and codecs ---- */

#define STK_FDECL_u8(n) uint8_t n;
#define STK_FDECL_u16(n) uint16_t n;
#define STK_FDECL_u32(n) uint32_t n;
#define STK_FDECL_u64(n) uint64_t n;
#define STK_FDECL_i64(n) int64_t n;
#define STK_FDECL_name(n) char n[STK_NAME_MAX + 1];
#define STK_FDECL_path(n) char n[STK_PATH_MAX + 1];
#define STK_FDECL_addr(n) char n[STK_ADDR_MAX];
#define STK_FDECL_cred(n) struct stk_cred n;
#define STK_FDECL_layout(n) struct stk_layout n;
#define STK_FDECL_attr(n) struct stk_attr n;
#define STK_FDECL_b32(n) uint8_t n[32];
#define STK_FDECL(type, n) STK_FDECL_##type(n)

#define STK_MSG_STRUCT(sname, LIST) \
	struct stk_msg_##sname {    \
		char unused_;       \
		LIST(STK_FDECL)     \
	};
STK_MSG_LIST(STK_MSG_STRUCT)
#undef STK_MSG_STRUCT

#define STK_MSG_PROTOS(sname, LIST)                                              \
	int stk_msg_##sname##_enc(struct stk_wbuf *w, const struct stk_msg_##sname *m); \
	int stk_msg_##sname##_dec(struct stk_rbuf *r, struct stk_msg_##sname *m);
STK_MSG_LIST(STK_MSG_PROTOS)
#undef STK_MSG_PROTOS

void stk_cred_enc(struct stk_wbuf *w, const struct stk_cred *c);
void stk_cred_dec(struct stk_rbuf *r, struct stk_cred *c);
void stk_layout_enc(struct stk_wbuf *w, const struct stk_layout *l);
void stk_layout_dec(struct stk_rbuf *r, struct stk_layout *l);
void stk_attr_enc(struct stk_wbuf *w, const struct stk_attr *a);
void stk_attr_dec(struct stk_rbuf *r, struct stk_attr *a);
/* The attributes without qid, as wire version 6 had them: the meta store's records. */
void stk_attr_enc_base(struct stk_wbuf *w, const struct stk_attr *a);
void stk_attr_dec_base(struct stk_rbuf *r, struct stk_attr *a);

/* ---- the routing table (reply of MGMT_GET_ROUTING) ---- */

struct stk_rt_node {
	uint32_t id;
	uint8_t role; /* enum stk_role */
	uint8_t state; /* enum stk_node_state */
	char addr[STK_ADDR_MAX];
	uint64_t last_seen_ms; /* milliseconds since the node's last heartbeat */
	char host_id[STK_HOST_ID_MAX]; /* "" until the node reported one */
	uint8_t refused; /* a meta node whose store is not its shard's: it serves nothing */
	struct stk_ns_id ns; /* a meta node's store identity as it last reported it */
	/* a meta node's last change held, as it last reported it (meta/store.h) */
	uint64_t meta_epoch;
	uint64_t meta_seq;
	uint8_t shard; /* a meta node's metadata shard (1..); 0 for storage */
};

struct stk_rt_target {
	uint32_t id;
	uint32_t node_id;
	uint8_t state; /* enum stk_target_state */
	uint64_t capacity;
	uint64_t used;
	uint64_t chunks;
	char path[STK_PATH_MAX + 1];
	uint64_t avail; /* bytes an unprivileged writer can still use on its file system */
	uint64_t dev; /* its file system's device id (common/host.h), 0 if not known yet */
	/*
	 * A SYNCING target's copy, as its node last reported it (stk_msg_target_info):
	 * progress 0..1000 and chunks compared, chunks and bytes copied. 0 otherwise.
	 */
	uint32_t sync_permille;
	uint64_t sync_checked;
	uint64_t sync_copied;
	uint64_t sync_bytes;
	/* mgmtd only, never on the wire: state changes since this mgmtd started */
	uint32_t state_changes;
};

struct stk_rt_chain {
	uint32_t id; /* chains are numbered 1..n; a file's layout uses ids 1..layout.nchains */
	uint32_t version; /* bumped whenever the chain's target list changes */
	uint8_t ntargets; /* head first */
	uint32_t targets[STK_MAX_REPLICAS];
};

struct stk_rt_shard {
	uint32_t id;
	uint32_t node_id;    /* the meta node that serves the shard (its leader); 0: none may now */
	struct stk_ns_id ns; /* the namespace the shard holds (zero: not known yet) */
	/*
	 * Replication (docs/meta-replication.md): replicas, the copies the shard keeps
	 * (0 or 1: none but the leader's); the followers that hold every change the
	 * leader acknowledges, and none other; epoch, bumped whenever the leader or the
	 * followers change (a routing version, so never reused): a follower refuses
	 * changes from a leader of an older epoch.
	 */
	uint64_t epoch;
	uint8_t replicas;
	uint8_t nfollowers;
	uint32_t followers[STK_MAX_REPLICAS];
};

/*
 * Wire form: u64 version, u32 nnodes, u32 ntargets, u32 nchains, u32 nshards, then
 * each array in that order; node: u32 id, u8 role, u8 state, addr, u64 last_seen_ms,
 * host_id (an addr), u8 refused, u64 ns hi, u64 ns lo, u64 meta_epoch, u64 meta_seq, u8 shard;
 * target: u32
 * id, u32 node_id, u8 state, u64 capacity, u64 used, u64 chunks, path, u64 avail, u64 dev, u32
 * sync_permille, u64 sync_checked, u64 sync_copied, u64 sync_bytes; chain: u32 id, u32 version, u8
 * ntargets, ntargets x u32; shard: u32 id, u32 node_id, u64 ns hi, u64 ns lo, u64 epoch, u8
 * replicas, u8 nfollowers, nfollowers x u32. When the requester's known_version equals version all
 * counts are 0.
 */
struct stk_routing {
	uint64_t version;
	uint32_t nnodes, ntargets, nchains, nshards;
	struct stk_rt_node *nodes;
	struct stk_rt_target *targets;
	struct stk_rt_chain *chains;
	struct stk_rt_shard *shards;
};

/* 0 or -EMSGSIZE. */
int stk_routing_encode(struct stk_wbuf *w, const struct stk_routing *rt);
/* Allocates the arrays (free with stk_routing_free). 0, -EBADMSG or -ENOMEM. */
int stk_routing_decode(struct stk_rbuf *r, struct stk_routing *rt);
void stk_routing_free(struct stk_routing *rt);
/* Lookups by id; NULL if absent. */
const struct stk_rt_node *stk_routing_node(const struct stk_routing *rt, uint32_t id);
const struct stk_rt_target *stk_routing_target(const struct stk_routing *rt, uint32_t id);
const struct stk_rt_chain *stk_routing_chain(const struct stk_routing *rt, uint32_t id);

#endif
