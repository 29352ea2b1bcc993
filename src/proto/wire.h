/*
 * The Stoker wire protocol: frames, opcodes and the layout of every message.
 *
 * A frame is a fixed 40-byte header, then `payload_len` bytes of payload (the
 * message fields, encoded with codec.h), then `bulk_len` bytes of bulk data (file
 * bytes, moved straight between the socket and the caller's buffer). All integers
 * are little-endian.
 *
 *   offset size field
 *        0    4 magic        0x314B5453 ("STK1")
 *        4    2 version      STK_WIRE_VERSION; a peer answers a newer one with NOTSUP
 *        6    2 opcode       enum stk_opcode
 *        8    4 flags        STK_FRAME_REPLY on replies; STK_FRAME_BULK_SELF when
 *                            the message checksums its own bulk (STOR_WRITE, STOR_READ);
 *                            a storage request's QoS class (STK_FRAME_CLASS_MASK)
 *       12    4 status       enum stk_status on replies, 0 on requests
 *       16    8 request id   chosen by the sender of a request, echoed by the reply
 *       24    4 payload_len  at most STK_MAX_PAYLOAD
 *       28    4 bulk_len     at most STK_MAX_BULK
 *       32    4 checksum     CRC32C of payload then bulk (payload only with BULK_SELF)
 *       36    4 origin       requests to meta: the sender's cache holder id
 *                            (src/meta/leases.h), 0 for none; 0 otherwise
 *
 * Vouchers (STK_FRAME_VOUCH, docs/security.md "Vouchers"): meta's word that inodes
 * lie under a subtree client key's root, so that storage need not ask (META_WITHIN).
 * The flag on a meta reply to such a client: its payload ends with n vouch records
 * (msg.h, STK_VOUCH_REC_LEN bytes each) then u16 n (1 to STK_VOUCH_MAX), after the
 * message's own fields; the client takes them off before it decodes the message.
 * On a storage request (READ, WRITE, TRUNCATE, PUNCH, PREFETCH): its payload ends
 * with one vouch record for the inode it names; storage takes it off first. A
 * trailer too short, or a count out of range, makes the frame malformed. Only a
 * client key's connection sends or gets them; a request to meta never carries one.
 *
 * A connection carries many requests at once: a sender may send requests without
 * waiting for replies, and a server answers each when it is done, so replies come
 * in any order; the request id matches each to its request (ids are the sender's
 * to choose; the client library never reuses one on a connection).
 *
 * A frame whose magic, version, lengths or checksum are wrong is malformed: the
 * receiver logs it and closes that connection, and nothing else. A reply whose
 * status is not OK carries an empty payload and no bulk unless the message says
 * otherwise.
 *
 * The message layouts are the field lists in msg.h; the opcode table below names
 * each request and reply message and says what it does.
 */
#ifndef STK_PROTO_WIRE_H
#define STK_PROTO_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define STK_WIRE_MAGIC 0x314B5453u
/*
 * 2: META_CREATE and META_UNLINK replies carry the folder's attributes, META_OPEN's
 * reply the inode's, META_CLOSES. 3: cache leases (the header's origin, META_WATCH,
 * META_LOOKUP_CACHE, META_CREATE's `leased`). 4: delegated folders (META_MKDIR's flags
 * and `delegated`, META_INOS, META_NAMES). 5: host, device and namespace identity
 * (MGMT_REGISTER's and MGMT_HEARTBEAT's host_id, a target's avail and dev, in reports
 * and the routing table, common/host.h; MGMT_REGISTER's ns and refused, the routing
 * table's node and shard ns, STOR_TRUNCATE(S)' ns), special files (attr's rdev,
 * META_MKNOD), allocated chunks in META_EXTEND, STOR_PUNCH. 6: a resync's progress
 * (the sync_* fields of a target's record, in reports and the routing table).
 * 7: quotas (attr's qid, META_QUOTA). 8: replicated metadata (the routing table's
 * shard epoch, replica count and followers and each node's replication position,
 * MGMT_HEARTBEAT's meta position and identity, META_REPL). 9: a storage request's
 * QoS class in the frame's flags (STK_FRAME_CLASS_MASK; sent by version 8 builds
 * that had QoS without saying so: a daemon of 8 without it closed their
 * connections as malformed). 10: vouchers (STK_FRAME_VOUCH, a trailer after the
 * payload's fields; META_EPOCH): a daemon of 9 would read the trailer as part of the
 * message, so the flag cannot be sent to it, and the version says so.
 * Daemons and clients of another version refuse each other's requests (NOTSUP)
 * rather than misread them. The flags' meaning depends on the version, so a frame
 * of another version is never refused for its flags: its version is what is
 * answered, NOTSUP, and the peer hears why. Any new flag bit bumps the version.
 */
#define STK_WIRE_VERSION 10
#define STK_FRAME_HDR_LEN 40
#define STK_MAX_PAYLOAD (1u << 20)
#define STK_MAX_BULK ((64u << 20) + 4096)
#define STK_FRAME_REPLY 0x1u
/* The checksum covers the payload only; the message carries the bulk's checksums. */
#define STK_FRAME_BULK_SELF 0x2u
/*
 * Storage requests: the QoS class the client marked them with (docs/qos.md), in
 * bits 8-9: 0 default, 1 training-read, 2 checkpoint (STK_QOS_CLASS_* in
 * stoker.h); 3 is refused (INVAL). Senders of older versions leave them 0.
 */
#define STK_FRAME_CLASS_SHIFT 8
/* The payload ends with vouchers (above, "Vouchers"). */
#define STK_FRAME_VOUCH 0x4u
#define STK_VOUCH_MAX 256u /* STK_LOOKUPS_MAX: one per name */
#define STK_FRAME_CLASS_MASK 0x300u

/*
 * The opcode table: X(NAME, code, request message, reply message, what it does).
 * Message names refer to the field lists in msg.h ("none" is an empty payload).
 * Mgmtd opcodes are 1-31, meta 32-63, storage 64-95, every daemon's 96-127.
 */
#define STK_OPCODE_TABLE(X)                                                                        \
	/* A node announces itself and its targets; mgmtd assigns ids to new ones and places    \
	 * new targets in the chain table. Followed in the request by `ntargets` target       \
	 * records (stk_msg_target_info); the reply is followed by `ntargets` u32 ids, in the  \
	 * request's order. */                                                                  \
	X(MGMT_REGISTER, 1, mgmt_register_req, mgmt_register_resp, "register a node")             \
	/* Liveness and capacity, every second. The request is followed by `ntargets` target    \
	 * records. NOENT means mgmtd does not know the node: register again. */                \
	X(MGMT_HEARTBEAT, 2, mgmt_heartbeat_req, mgmt_heartbeat_resp, "node heartbeat")            \
	/* The routing table (nodes, targets, chains, shards); see stk_routing_encode(). If     \
	 * the caller's known_version is current the reply has only the header fields. */       \
	X(MGMT_GET_ROUTING, 3, mgmt_get_routing_req, routing, "fetch routing table")              \
	/* A storage node's SYNCING target has copied what its chain holds (msg.h,       \
	 * stk_target_state): mgmtd makes it SERVING. STALE when the chain's version is  \
	 * another now (the node syncs again). */                                         \
	X(MGMT_TARGET_SYNCED, 8, mgmt_target_synced_req, none, "a target caught up")             \
	/* An operator gives up on an offline storage node: each of its targets is replaced \
	 * in its chain now, as after --replace-after (mgmtd/state.h). NOENT: no such     \
	 * storage node; BUSY: it is online. */                                          \
	X(MGMT_REMOVE_NODE, 9, mgmt_remove_node_req, mgmt_remove_node_resp,                 \
	  "replace an offline node's targets now")                                          \
	/* A storage node's WIPING target holds no chunk any more (msg.h, stk_target_state): \
	 * mgmtd makes it SERVING, free to join a chain. STALE if it is in a chain. */     \
	X(MGMT_TARGET_WIPED, 10, mgmt_target_wiped_req, none, "a target left its chunks")   \
	/* An operator drains a storage node (drain 1: its chain memberships move to other  \
	 * nodes, mgmtd/state.h stk_mgmt_state_rebalance) or cancels it (0). NOENT: no   \
	 * such storage node. */                                                          \
	X(MGMT_DRAIN_NODE, 11, mgmt_drain_node_req, mgmt_drain_node_resp,                   \
	  "drain a storage node, or cancel it")                                            \
	/* The rebalancer: its moves in flight and every storage node's load. */            \
	X(MGMT_REBALANCE, 12, none, mgmt_rebalance_resp, "moves in flight, node loads")    \
	/* An operator gives up a chain's lost newest copy: the first member back serves  \
	 * (mgmtd/state.h stk_mgmt_state_accept_loss). NOENT: no such chain; INVAL: a   \
	 * chain of one; BUSY: a member works; AGAIN: no member is back. */             \
	X(MGMT_ACCEPT_LOSS, 13, mgmt_accept_loss_req, mgmt_accept_loss_resp,                \
	  "serve a chain again from the copy that is left")                                \
	/* Who leads: any mgmtd answers it, leader or not. In cluster mode (--etcd) only the   \
	 * leader answers the other requests; a follower answers them NOT_LEADER, and the    \
	 * sender asks this to learn where to go (src/net/mgmtaddr.h). */                     \
	X(MGMT_LEADER, 4, none, mgmt_leader_resp, "which mgmtd leads")                             \
	/* Client identities (docs/security.md): add issues the next generation for   \
	 * the name (EXIST: the name is held; remove it first); rm revokes it (NOENT:  \
	 * no such client); CLIENTS lists every client, removed ones too. A connection  \
	 * made with a client key gets PERM for all three. Each bumps the routing      \
	 * version, so that nodes fetch the list again (mgmtd/agent.c). */             \
	X(MGMT_CLIENT_ADD, 14, client_rec, mgmt_client_gen, "issue a client identity")      \
	X(MGMT_CLIENT_RM, 15, mgmt_client_name, mgmt_client_gen, "revoke a client identity") \
	/* Reply: u32 n, then n client_rec. */                                          \
	X(MGMT_CLIENTS, 16, none, none, "list client identities")                       \
	/* QoS limits per tenant (docs/qos.md): set replaces the tenant's limits                   \
	 * (INVAL: a bad name; NOSPC: STK_QOS_MAX tenants have limits), rm drops them              \
	 * (NOENT: none set), QOS_LIST replies u32 n, then n qos_rec. A client key                 \
	 * gets PERM. Set and rm bump the routing version: storage fetches the list. */            \
	X(MGMT_QOS_SET, 17, qos_rec, none, "set a tenant's QoS limits")                            \
	X(MGMT_QOS_RM, 18, mgmt_client_name, none, "drop a tenant's QoS limits")                   \
	X(MGMT_QOS_LIST, 19, none, none, "list QoS limits")                                        \
	X(META_LOOKUP, 32, meta_lookup_req, meta_attr_resp, "look a name up in a directory")       \
	X(META_GETATTR, 33, meta_ino_req, meta_attr_resp, "attributes of an inode")                \
	/* Changes the fields named in `valid` (STK_SETATTR_*). A size change is recorded   \
	 * here; the client truncates the chunks on storage itself. STK_SETATTR_ATIME_READ  \
	 * alone records a read (relatime). */                                              \
	X(META_SETATTR, 34, meta_setattr_req, meta_attr_resp, "change attributes")                 \
	/* Creates a regular file, or with STK_CREATE_EXCL unset returns the existing one    \
	 * (created = 0). A zero layout takes the parent directory's defaults. With a        \
	 * session, a regular file returned is also open for it as after META_OPEN          \
	 * (opened = 1), in the same step: no unlink comes between the two. */              \
	X(META_CREATE, 35, meta_create_req, meta_create_resp, "create a file")                     \
	/* With an origin in the frame, leased as META_CREATE is (msg.h). */                     \
	X(META_MKDIR, 36, meta_mkdir_req, meta_mkdir_resp, "create a directory")                   \
	/* Removes a name. The reply is the inode's attributes after the unlink: when nlink  \
	 * is 0 and orphaned is 0 the caller removes the file's chunks from storage; with    \
	 * orphaned 1 a session still has it open and meta removes them at the last close. */ \
	X(META_UNLINK, 37, meta_name_req, meta_unlink_resp, "remove a file name")                  \
	X(META_RMDIR, 38, meta_name_req, none, "remove an empty directory")                        \
	/* Atomic rename with STK_RENAME_NOREPLACE / STK_RENAME_EXCHANGE. When a file was    \
	 * replaced, `replaced` is 1 and `attr` is its attributes after losing the name;     \
	 * `orphaned` as for META_UNLINK. */                                                   \
	X(META_RENAME, 39, meta_rename_req, meta_rename_resp, "rename")                            \
	X(META_LINK, 40, meta_link_req, meta_attr_resp, "hard link")                               \
	X(META_SYMLINK, 41, meta_symlink_req, meta_attr_resp, "create a symlink")                  \
	X(META_READLINK, 42, meta_ino_req, meta_readlink_resp, "read a symlink")                   \
	/* Entries after `cookie` (0 = from the start), at most max_entries. The reply is    \
	 * followed by `n` stk_dirent records (stk_dirent_encode). Cookies stay valid while   \
	 * entries are added and removed. */                                                    \
	X(META_READDIR, 43, meta_readdir_req, meta_readdir_resp, "list a directory")               \
	X(META_STATFS, 44, none, meta_statfs_resp, "namespace totals")                             \
	/* size = max(size, new size), mtime/ctime set: what a writer reports on flush. */  \
	X(META_EXTEND, 45, meta_extend_req, meta_attr_resp, "grow a file after writes")            \
	/* Everything acknowledged so far is on stable storage when this returns. */             \
	X(META_SYNC, 46, none, none, "flush the namespace to disk")                                \
	/* Extended attributes (47-50). `name` carries its namespace prefix ("user.",      \
	 * "trusted.", "security."; "system." gives NOTSUP). SETXATTR: the request is       \
	 * followed by `size` bytes of value (at most 64 KiB); flags XATTR_CREATE (1: EXIST  \
	 * if present) or XATTR_REPLACE (2: NODATA if absent). */                             \
	X(META_SETXATTR, 47, meta_setxattr_req, none, "set an extended attribute")             \
	/* `size`: the caller's buffer; 0 asks only for the length. The reply's `size` is    \
	 * the value's length, followed by the value unless the request's size was 0.      \
	 * RANGE when the value is longer than a non-zero size; NODATA when absent. */       \
	X(META_GETXATTR, 48, meta_getxattr_req, meta_xattr_resp, "read an extended attribute") \
	/* The names, each NUL-terminated, as the reply's `size` bytes after it (the same    \
	 * rules for `size` as GETXATTR). trusted.* names are listed to root only. */        \
	X(META_LISTXATTR, 49, meta_listxattr_req, meta_xattr_resp, "list extended attributes") \
	X(META_REMOVEXATTR, 50, meta_xattr_name_req, none, "remove an extended attribute")     \
	/* A fifo, socket or device node (msg.h). Devices need uid 0 (PERM). */              \
	X(META_MKNOD, 51, meta_mknod_req, meta_attr_resp, "create a special file")             \
	/* Quotas per folder (msg.h, docs/quotas.md): set, remove, read, list and recount    \
	 * them, and reserve room for a file's writes. One opcode for all, as 52 was the     \
	 * last free one of meta's range; `op` says which. */                                \
	X(META_QUOTA, 52, meta_quota_req, meta_quota_resp, "quotas, and room to write")      \
	/* Client sessions (53-63). A client names its session with a random id; this       \
	 * creates or renews it. Its open files and locks last while it is renewed within   \
	 * lease_ms (the reply); known 0: meta did not know it (new, or meta restarted,    \
	 * also when another request named it first), and the client registers its open  \
	 * files again (META_OPEN with their counts). */                                     \
	X(META_SESSION, 53, meta_session_req, meta_session_resp, "open or renew a session")       \
	/* The client goes away: its open references and locks are dropped at once. */        \
	X(META_SESSION_END, 54, meta_session_req, none, "end a session")                       \
	/* `count` more references of the session on a file, which then outlives its last     \
	 * name (an orphan) until the last reference goes. The reply is the inode's          \
	 * attributes as of the registration (no unlink comes between them), so an open     \
	 * needs no META_GETATTR. NOENT: no such inode (or an orphan no one holds any        \
	 * more), and nothing is registered. */                                                \
	X(META_OPEN, 55, meta_open_req, meta_attr_resp, "register open references")            \
	/* Drops `count` references; the last one of an orphan removes it and its data. */     \
	X(META_CLOSE, 56, meta_open_req, none, "drop open references")                         \
	/* Tests (test = 1), sets or removes (type STK_LOCK_UN) an flock or POSIX lock of      \
	 * (session, owner). A conflict gives AGAIN on a set; a test replies with the first \
	 * conflicting lock, or type UN when there is none. Blocking sets are the client's  \
	 * retries. */                                                                         \
	X(META_LOCK, 57, meta_lock_req, meta_lock_resp, "advisory lock")                       \
	/* META_CLOSE for several files at once (`n` open_ref records follow), and the     \
	 * reads to record (relatime): what a client's queue holds. The reads go first, in \
	 * one transaction (each as META_SETATTR ATIME_READ; one by one if that fails),    \
	 * then each META_CLOSE; the first error is the reply, after all were tried. */     \
	X(META_CLOSES, 58, meta_closes_req, none, "drop open references, record reads")       \
	/* The revocations of a cache holder's leases: a long poll (msg.h, meta/leases.h). \
	 * AGAIN: no holder slot free (the client then caches nothing). */                  \
	X(META_WATCH, 59, meta_watch_req, meta_watch_resp, "wait for cache revocations")     \
	/* META_LOOKUP that also leases the answer to the header's origin holder, found or \
	 * not (NOENT is a reply with found 0, not a status). */                            \
	X(META_LOOKUP_CACHE, 60, meta_lookup_req, meta_lookup_cache_resp,                    \
	  "look a name up, leased for the client's cache")                                   \
	/* META_GETATTR for up to STK_GETATTRS_MAX inodes, in one read transaction: the     \
	 * request is followed by `n` getattrs_rec (inode numbers), the reply by `n`        \
	 * attr_rec in the same order, each with its own status (NOENT for one gone). What  \
	 * a mount's readdirplus asks for a listing's batch of names. */                    \
	X(META_GETATTRS, 61, meta_getattrs_req, meta_getattrs_resp, "attributes of several inodes") \
	/* Reserves `count` inode numbers (at most STK_INOS_MAX) for the caller's creates in \
	 * META_NAMES: [first, first + count) is never given to another file. */              \
	X(META_INOS, 62, meta_inos_req, meta_inos_resp, "reserve inode numbers")              \
	/* A delegated folder's holder sends what it answered itself: n name_rec follow the \
	 * request, n name_res the reply, in order, each applied alone (msg.h). */            \
	X(META_NAMES, 63, meta_names_req, meta_names_resp, "apply a client's creates and unlinks") \
	/* Whether inode ino lies under the folder at path subtree (a client key's root, \
	 * docs/security.md): storage asks it before serving such a client that inode's \
	 * chunks. PERM for a client key's connection. */                              \
	X(META_WITHIN, 88, meta_within_req, meta_within_resp,                           \
	  "is an inode under a client's subtree")                                       \
	/* Meta's vouch epoch (docs/security.md, "Vouchers"): a voucher older than a     \
	 * rename that may have moved its file out of a subtree is worth nothing. Storage \
	 * asks it at most once a second while it is shown vouchers. The request is empty \
	 * (the reply: the epoch) or meta_epoch_req (the reply goes on with the renames   \
	 * since: meta_moves_resp, msg.h); a meta from before moves refuses the second    \
	 * (BADMSG), and storage asks the first. PERM for a client key's connection. */   \
	X(META_EPOCH, 92, meta_epoch_req, meta_epoch_resp, "meta's vouch epoch")           \
	/* META_LOOKUP_CACHE for up to STK_LOOKUPS_MAX names of one folder, in one read:  \
	 * n lookups_rec follow the request, n attr_rec the reply (msg.h); what a mount's \
	 * readdirplus asks, so that the files of a listed folder are then opened with   \
	 * no lookup at meta each. */                                                     \
	X(META_LOOKUPS, 89, meta_lookups_req, meta_lookups_resp, "look names up, leased")   \
	/* An inode allowance (docs/quotas.md): room set aside in the quota a folder     \
	 * counts in for the session's creates answered by its holder (META_NAMES); want \
	 * 0 gives back what the session holds there. DQUOT: nothing left (msg.h). */     \
	X(META_ALLOW, 90, meta_allow_req, meta_allow_resp, "set inodes aside in a quota")    \
	/* A byte allowance, as META_ALLOW's of inodes: room set aside in the quota an    \
	 * inode counts in for the session's writes past files' sizes, spent as they are \
	 * reported (META_EXTEND's meta_extend_ext). DQUOT: nothing left (msg.h). */     \
	X(META_ALLOW_BYTES, 91, meta_allow_req, meta_allow_resp, "set bytes aside in a quota") \
	/* Meta to meta: a step of a cross-shard mkdir or rmdir, or a recovery's question \
	 * (msg.h, docs/meta-shards.md). A client key's connection gets PERM. */        \
	X(META_XSHARD, 93, meta_xshard_req, meta_xshard_resp, "cross-shard folder step")    \
	/* Writes `length` bytes of bulk at `offset` in a chunk; the request carries the     \
	 * bulk's block checksums (msg.h). STK_WRITE_SYNC: durable before the reply. */         \
	X(STOR_WRITE, 64, stor_write_req, stor_write_resp, "write into a chunk")                   \
	/* Reads up to `length` bytes; the bulk of the reply is shorter where the chunk ends  \
	 * (a missing chunk reads as 0 bytes: the client knows the file size and fills    \
	 * zeros). A block whose checksum fails gives IO, never data. */                      \
	X(STOR_READ, 65, stor_read_req, stor_read_resp, "read from a chunk")                       \
	/* Drops the inode's chunks past `size` on this chain's target, cutting the last     \
	 * one; size 0 removes them all. */                                                    \
	X(STOR_TRUNCATE, 66, stor_truncate_req, none, "truncate a file's chunks")                  \
	/* Everything written to the chain's target so far is on stable storage. */             \
	X(STOR_SYNC, 67, stor_sync_req, none, "flush a target")                                    \
	/* A hint: start reading the chunk into the node's cache and reply at once (a    \
	 * sequential reader asks for the chunks it will want next). Always OK. */        \
	X(STOR_PREFETCH, 68, stor_prefetch_req, none, "warm a chunk into cache")                  \
	/* STOR_TRUNCATE for several files of one chain at once (the client's reaper   \
	 * removing many unlinked files): each record is tried; the first error is the  \
	 * reply. A malformed request truncates nothing. */                                   \
	X(STOR_TRUNCATES, 69, stor_truncates_req, none, "truncate several files' chunks")     \
	/* Removes whole chunks of a file (fallocate's punch-hole): they read as zeros after.  \
	 * Chunks that are not there are no error. Durable when it replies. */               \
	X(STOR_PUNCH, 70, stor_punch_req, none, "remove chunks of a file")                        \
	/* Node to node, for a SYNCING successor: a page of the chunks this chain's      \
	 * target holds, in (ino % 256, ino, index) order from the request's cursor,     \
	 * with their versions; the reply gives the cursor of the next page. */            \
	X(STOR_SYNC_LIST, 71, stor_sync_list_req, stor_sync_list_resp, "list a target's chunks")  \
	/* Node to node: a whole chunk and its version, read from one version of its file  \
	 * (bulk and block CRCs as STOR_READ's reply; version 0 and no bytes: missing). */ \
	X(STOR_SYNC_READ, 72, stor_sync_read_req, stor_sync_read_resp, "copy a whole chunk")   \
	/* Meta leader to follower (msg.h, docs/meta-replication.md): `len` bytes of bulk     \
	 * (a log of changes, LOG, or a part of a copy of the store, SNAP) follow; the          \
	 * reply is what the follower holds after. STALE_ROUTING: the follower knows a             \
	 * newer epoch than the request's (the sender no longer leads). */                         \
	X(META_REPL, 80, meta_repl_req, meta_repl_resp, "replicate metadata changes")              \
	/* stoker fsck: a page of the chunks one target of this node holds, with their     \
	 * versions, digests and ages (msg.h). NOENT: no such target here. */              \
	X(STOR_FSCK_LIST, 73, stor_fsck_list_req, stor_fsck_list_resp,                      \
	  "list a target's chunks for fsck")                                               \
	/* The handshake that opens every connection to a daemon run with a cluster key    \
	 * (common/auth.h, docs/security.md): the client's nonce; the reply is the          \
	 * server's nonce and its MAC of both. Until AUTH_PROOF passes, any other request   \
	 * is answered AUTH and the connection closes. A daemon without a key answers      \
	 * NOSYS (no handshake needed). */                                                  \
	X(AUTH_HELLO, 96, auth_hello_req, auth_hello_resp, "open the key handshake")          \
	/* The client's MAC of both nonces. OK, or AUTH and the connection closes. */         \
	X(AUTH_PROOF, 97, auth_proof_req, none, "prove the cluster key")                    \
	/* Served by meta (its 32-63 are all taken): stoker fsck's namespace check and the  \
	 * listings its data check compares with storage's (msg.h). */                      \
	X(META_FSCK, 98, meta_fsck_req, meta_fsck_resp, "check the namespace (fsck)")          \
	/* AUTH_HELLO for a client key (common/auth.h): the nonce and the client's        \
	 * policy; the server keys the handshake by HMAC(cluster key, policy). AUTH when \
	 * the policy is malformed or revoked. */                                         \
	X(AUTH_HELLO_CLIENT, 99, auth_hello_client_req, auth_hello_resp,                  \
	  "open the key handshake with a client key")

enum stk_opcode {
#define STK_OPCODE_ENUM(name, code, req, resp, what) STK_OP_##name = code,
	STK_OPCODE_TABLE(STK_OPCODE_ENUM)
#undef STK_OPCODE_ENUM
};

struct stk_frame_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t opcode;
	uint32_t flags;
	uint32_t status;
	uint64_t req_id;
	uint32_t payload_len;
	uint32_t bulk_len;
	uint32_t checksum;
	uint32_t origin;
};

/* Writes the header into out[STK_FRAME_HDR_LEN]. */
void stk_hdr_encode(const struct stk_frame_hdr *h, uint8_t *out);
/*
 * Parses and checks a header: magic, lengths within limits, and for a frame of
 * STK_WIRE_VERSION no flag bits it does not know. A frame of another version is
 * returned as parsed, whatever its flags (the caller answers NOTSUP). 0 or -EBADMSG.
 */
int stk_hdr_decode(const uint8_t *in, struct stk_frame_hdr *h);
/* "META_LOOKUP", or "UNKNOWN" for a code not in the table. */
const char *stk_opcode_name(uint16_t opcode);

#endif
