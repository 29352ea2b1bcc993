/*
 * mgmtd's cluster state: the registry of nodes and targets, the chain table, the
 * metadata shard map and the routing version, with the rules that change them.
 *
 * This module is pure bookkeeping: no sockets, no threads, no clock of its own
 * (callers pass the monotonic time), so the unit test drives it directly and
 * mgmtd.c stays a thin RPC layer. It is not thread-safe: mgmtd holds one mutex
 * around every call.
 *
 * The routing version is bumped on every change a server or client must see (a
 * node or target appearing, changing address or state, a chain created, a shard
 * moved); capacity figures are refreshed by heartbeats without a bump. Every
 * change that must survive a restart sets `dirty`; the caller then saves the state
 * with stk_mgmt_state_save(), which replaces the file atomically.
 *
 * Shard 1 and its namespace identity (msg.h, struct stk_ns_id; every other shard
 * alike, among the meta nodes registered for it): the first meta
 * node to register gives the shard its identity, that of its store; from then on
 * the shard goes only to a meta whose store has that identity (the same store
 * restarted, at any address or node id). Any other meta is registered but
 * refused: it serves nothing and the routing table says so. A shard whose meta is
 * OFFLINE stays with it: until metadata is replicated, no other store holds the
 * namespace, and an empty one in its place would lose it and let its clients
 * delete the chunks of files it never knew.
 *
 * Replicated metadata (meta_replicas R > 1; docs/meta-replication.md): shard 1
 * has a leader (shards[0].node) and up to R - 1 followers, which hold every change
 * the leader acknowledges. A meta node that registers when the shard has no
 * identity leads it; one that registers later, whatever its store, follows while
 * there is room (the leader copies its store to it); others wait as spares. Every
 * change of leader or followers takes a new epoch. A follower that goes OFFLINE
 * leaves the followers (the leader stops waiting for it) and a spare takes its
 * place; back, it follows again when there is room. A leader that goes OFFLINE is
 * replaced by the ONLINE follower of the shard's identity that reported the
 * highest change number; with none, it keeps the shard, as with R = 1. Only a
 * follower in the list is promoted: it holds whatever was acknowledged. A
 * draining meta node (`stoker admin drain-node`) joins no shard, counts as no
 * copy that stays, and leaves its role once others hold the shard (meta_drains
 * in state.c). Once
 * replicated (an epoch was taken), a shard whose R goes back to 1 stays with its
 * leader: other stores of its identity are copies, and are refused.
 *
 * State file format (little-endian, written with the codec helpers):
 *   u32 magic "STKM", u32 format version (8; 1 to 7 are still read), u64 routing version,
 *   u32 next_node_id, u32 next_target_id, u32 shard1_node,
 *   (format 2) u64 shard 1 ns hi, u64 ns lo,
 *   u32 nnodes, u32 ntargets, u32 nchains,
 *   node:   u32 id, u8 role, u8 state, str addr, i64 last heartbeat (wall-clock ms),
 *           (format 2) u8 refused, u64 ns hi, u64 ns lo
 *   target: u32 id, u32 node_id, u8 state, u64 capacity, u64 used, u64 chunks, str path
 * (A target's avail and dev, and a node's host id, are not saved: heartbeats bring
 * them within a second of a restart.)
 *   chain:  u32 id, u32 version, u8 ntargets, ntargets x u32
 *   (format 3) u8 replicas, then each node's zone (str), in the nodes' order
 *   (format 4) each node's u8 draining, in the nodes' order; u32 nmoves, then each
 *   move: u32 chain_id, u32 out, u32 in, u8 drain
 *   (format 5) u8 meta_replicas, u64 shard 1 epoch, u8 nfollowers, nfollowers x u32
 *   (format 5/6, main's) u64 next_client_gen, u32 nclients, clients; (format 7) QoS
 *   (format 8) u8 meta_shards, each node's u8 shard in the nodes' order, then for
 *   shards 2 to meta_shards: u32 node, u64 ns hi, u64 ns lo, u64 epoch,
 *   u8 nfollowers, nfollowers x u32
 *   u32 CRC32C of everything before it.
 *
 * Replicated chains (replicas > 1): a chain keeps its members in order, head
 * first; a member's target state says whether it takes part. When a node goes
 * OFFLINE its targets leave their chains' working set (the chain version is
 * bumped: storage nodes and clients with the old one are told, refresh, and send
 * again), and the chain goes on with the others. A target that returns to a chain
 * that went on without it goes last in it, SYNCING: changes reach it, reads do
 * not, until its node has copied what it missed and says so. One
 * that returns to a chain that had no member left serves again (no copy is
 * newer than the last one standing).
 */
#ifndef STK_MGMTD_STATE_H
#define STK_MGMTD_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/auth.h"
#include "../proto/msg.h"

/* Most targets one node may report (a bound on what a request may make mgmtd allocate). */
#define STK_MGMT_MAX_NODE_TARGETS 1024
/* Most empty chains one returning target may make mgmtd add (see register). */
#define STK_MGMT_MAX_CHAIN_GAP 4096
/* Most failure domains chains are formed over. */
#define STK_MGMT_MAX_ZONES 256
/* Most metadata shards (mgmtd --meta-shards); shard numbers run from 1. */
#define STK_MGMT_MAX_SHARDS STK_MAX_SHARDS

struct stk_mgmt_node {
	uint32_t id;
	uint8_t role;  /* enum stk_role */
	uint8_t state; /* enum stk_node_state */
	char addr[STK_ADDR_MAX];
	uint64_t last_hb_ns;	 /* monotonic time of the last register or heartbeat */
	int64_t last_hb_wall_ms; /* the same instant in wall-clock ms, for the state file */
	/*
	 * The node's host id (common/host.h), from its registration and heartbeats. Not
	 * in the state file: after a restart it is "" (no short-circuit reads to the
	 * node) until the node's first heartbeat.
	 */
	char host_id[STK_HOST_ID_MAX];
	uint8_t refused; /* meta: its store is not its shard's, it serves nothing */
	/*
	 * meta: the shard it registered for (1 to meta_shards; docs/meta-shards.md),
	 * saved with the state (format 8; older states: 1).
	 */
	uint8_t shard;
	struct stk_ns_id ns;	 /* meta: its store's identity at its last register */
	/* Its failure domain: --zone, or its host id. No chain holds two targets of one. */
	char zone[STK_HOST_ID_MAX];
	/*
	 * `stoker admin drain-node`: its chain memberships are moved to other nodes
	 * (stk_mgmt_state_rebalance) and none of its targets joins a chain.
	 */
	uint8_t draining;
	/*
	 * A meta node's last change held, as its heartbeats report it (memory only:
	 * the next heartbeat brings it after a restart). See "Replicated metadata".
	 */
	uint64_t meta_epoch;
	uint64_t meta_seq;
	/*
	 * A follower's catching up (memory only): the leader's change numbers in its
	 * first two reports since this node began to follow (catch_reports of them
	 * heard; catch_floor the last). Changes acknowledged before it followed are at
	 * most the second's, which the leader sent after mgmtd heard the first; those
	 * after, it acknowledged itself. So once its own report reaches catch_floor it
	 * holds everything acknowledged (meta_drains).
	 */
	uint8_t catch_reports;
	uint64_t catch_floor;
};

/*
 * A chain membership moving from one target to another (a rebalance or a drain):
 * `in` joined the chain last, SYNCING; once it serves, `out` leaves the chain. Until
 * then the chain has one member more than it keeps, so it never has fewer working
 * copies than before the move.
 */
struct stk_mgmt_move {
	uint32_t chain_id;
	uint32_t out; /* the member that leaves once `in` serves */
	uint32_t in;  /* the target that copies the chain's chunks */
	uint8_t drain; /* started to empty a draining node (out's) */
};

struct stk_mgmt_client {
	struct stk_auth_client id;
	uint8_t removed;
};

/*
 * One metadata shard (docs/meta-shards.md): the meta node that serves (leads) it,
 * its namespace identity, and with meta_replicas R > 1 its followers and epoch.
 * Every shard follows the rules above on its own, among the meta nodes that
 * registered for it.
 */
struct stk_mgmt_shard {
	uint32_t node;	     /* the meta node serving the shard, 0 if none (yet, or now) */
	struct stk_ns_id ns; /* the shard's namespace identity, zero until known */
	uint8_t nfollowers;
	uint32_t followers[STK_MAX_REPLICAS];
	uint64_t epoch; /* a routing version, taken whenever leader or followers change */
	/* memory only: since when a drain waits for a spare that learned the shard */
	uint64_t learn_wait_ns;
};

struct stk_mgmt_state {
	uint64_t version; /* routing version, never 0 */
	uint32_t next_node_id;
	uint32_t next_target_id;
	/*
	 * Targets per chain, a cluster setting (0 or 1: one copy, each target its own
	 * chain, as registered). With R > 1 a chain is made of R targets of R failure
	 * domains once that many have targets in no chain (stk_mgmt_state_register).
	 */
	uint8_t replicas;
	/*
	 * Replicated metadata (see below): copies of each shard (0 or 1: the leader's
	 * alone, the rules above).
	 */
	uint8_t meta_replicas;
	/*
	 * Metadata shards (0 or 1: one, today's namespace; at most STK_MGMT_MAX_SHARDS):
	 * shards[k - 1] is shard k. Only ever grows (a shard holds part of the
	 * namespace). Saved with the state (format 8).
	 */
	uint8_t meta_shards;
	struct stk_mgmt_shard shards[STK_MGMT_MAX_SHARDS];
	uint32_t nnodes, ntargets, nchains;
	uint32_t cap_nodes, cap_targets, cap_chains;
	struct stk_mgmt_node *nodes;
	struct stk_rt_target *targets;
	struct stk_rt_chain *chains; /* chains[i].id == i + 1 */
	int dirty;		     /* something changed since the last save */
	/* Moves in flight (stk_mgmt_state_rebalance), saved with the state. */
	struct stk_mgmt_move *moves;
	uint32_t nmoves, cap_moves;
	/* Moves started, finished and abandoned since this state was loaded (metrics). */
	uint64_t moves_started, moves_finished, moves_abandoned;
	/* Stale chunks and bytes nodes removed (MGMT_TARGET_WIPED; metrics, set by mgmtd). */
	uint64_t wiped_chunks, wiped_bytes;
	/*
	 * Chains of R form only once no new target registered for form_settle_ns (0,
	 * the default: at once): nodes started together all register before the first
	 * chain forms, so that a new cluster starts balanced instead of filling the
	 * first nodes' targets and moving chains at once. Set by mgmtd.
	 */
	uint64_t form_settle_ns;
	uint64_t last_new_target_ns; /* monotonic time a new target last registered */
	/*
	 * Client identities (docs/security.md), removed ones too (removed set): the
	 * daemons refuse a removed (name, gen). next_client_gen: the generation the
	 * next `client add` issues (never reused, so a name added again gets a key of
	 * its own). Saved with the state (format 5).
	 */
	struct stk_mgmt_client *clients;
	uint32_t nclients, cap_clients;
	uint64_t next_client_gen;
	/* QoS limits per tenant (docs/qos.md), saved with the state (format 6). */
	struct stk_msg_qos_rec qos[STK_QOS_MAX];
	uint32_t nqos;
};

/*
 * Client identities. add: records c under a new generation (set in c->gen);
 * -EEXIST when an identity of that name is held (not removed), -EINVAL (malformed
 * policy), -ENOMEM. rm: marks the name's held identity removed, *gen its
 * generation; -ENOENT when none is held. revoked: the removed identities, in a
 * new array (*out; free it; NULL when none). Each change bumps the version.
 */
int stk_mgmt_state_client_add(struct stk_mgmt_state *st, struct stk_auth_client *c);
int stk_mgmt_state_client_rm(struct stk_mgmt_state *st, const char *name, uint64_t *gen);
int stk_mgmt_state_clients_revoked(const struct stk_mgmt_state *st, struct stk_auth_client **out,
				   uint32_t *n);
/*
 * QoS limits. set: records q (replacing the tenant's limits); -EINVAL (a tenant
 * name as a client name must be, common/auth.h), -ENOSPC (STK_QOS_MAX tenants).
 * rm: -ENOENT when the tenant has none. Each change bumps the version.
 */
int stk_mgmt_state_qos_set(struct stk_mgmt_state *st, const struct stk_msg_qos_rec *q);
int stk_mgmt_state_qos_rm(struct stk_mgmt_state *st, const char *tenant);

/* A fresh, empty state. Its version comes from the clock, so never repeats an old one. */
void stk_mgmt_state_init(struct stk_mgmt_state *st);
void stk_mgmt_state_free(struct stk_mgmt_state *st);

/*
 * MGMT_REGISTER. req names the node (node_id 0 for a new one) and `n` target
 * records (storage only). On success *node_id is the node's id and ids[i] the id of
 * tgts[i] (ids must hold n entries). Rules:
 * - node_id 0, or a known id under another role, gets a new id; a known id keeps
 *   it and comes back ONLINE; an unknown non-zero id (mgmtd lost its state) is
 *   taken as is, so that nodes re-registering after a loss keep distinct ids.
 * - a target with id 0 gets a new id and a new chain of length 1; a known id comes
 *   back SERVING; an unknown non-zero id (mgmtd lost its state) is taken as is and
 *   given a chain if none holds it: chain number `id` where possible, since chains
 *   are created with their targets and files name chains by number (empty chains
 *   may be added to get there). The node's targets not in the list go OFFLINE.
 * - a meta node (req->ns_hi/ns_lo: its store's identity) and shard 1:
 *   - shard 1 has no identity and no owner (a new cluster): the node takes it and
 *     the shard takes the node's identity;
 *   - shard 1 has no identity but an owner (a state saved by an older release): the
 *     owner, registering again under its id, gives the shard its identity; another
 *     node waits, neither serving nor refused;
 *   - shard 1 has an identity: a node with the same identity takes the shard (the
 *     same store, restarted at any address or id, also while the old entry is
 *     still ONLINE: one store cannot run twice); a node with another identity is
 *     refused (node->refused, a warning logged) and, if it owned the shard, the
 *     shard is left with no node until its store returns.
 *   An OFFLINE owner keeps the shard: no other store may stand in for it.
 * 0, -EINVAL (bad role, empty address, targets on a meta node, a meta node without
 * an identity, a target id twice, too many targets) or -ENOMEM. On error nothing is
 * changed. The caller reads node->refused for the reply.
 */
int stk_mgmt_state_register(struct stk_mgmt_state *st, const struct stk_msg_mgmt_register_req *req,
			    const struct stk_msg_target_info *tgts, uint32_t n, uint64_t now_ns,
			    uint32_t *node_id, uint32_t *ids);

/*
 * MGMT_HEARTBEAT: refreshes the node's last heartbeat and the figures of the
 * targets it reports (unknown target ids and targets of other nodes are ignored).
 * A node that was OFFLINE comes back ONLINE, and the targets it reports SERVING.
 * 0 or -ENOENT (node unknown: it must register again).
 */
int stk_mgmt_state_heartbeat(struct stk_mgmt_state *st, uint32_t node_id,
			     const struct stk_msg_target_info *tgts, uint32_t n, uint64_t now_ns);

/*
 * What a meta node's heartbeat reports of its store (identity, last change):
 * kept for promotions and `stoker status`, with no routing bump. A zero identity
 * (a follower in the middle of a copy) makes the node unfit for promotion. Unknown nodes
 * and non-meta nodes are ignored.
 */
void stk_mgmt_state_meta_report(struct stk_mgmt_state *st, uint32_t node_id,
				const struct stk_ns_id *ns, uint64_t epoch, uint64_t seq);

/*
 * Records the host id a node reported (MGMT_REGISTER does it itself; MGMT_HEARTBEAT
 * calls this after stk_mgmt_state_heartbeat), bumping the routing version when it
 * changed: clients decide short-circuit reads by it. Unknown nodes are ignored.
 */
void stk_mgmt_state_set_host(struct stk_mgmt_state *st, uint32_t node_id, const char *host_id);

/*
 * Marks ONLINE nodes silent for more than timeout_ns OFFLINE, with their targets,
 * logging each. Returns how many nodes went OFFLINE.
 */
unsigned stk_mgmt_state_expire(struct stk_mgmt_state *st, uint64_t now_ns, uint64_t timeout_ns);
/*
 * Replaces in its chain every target whose node has been OFFLINE longer than
 * after_ns (and, with force_node, every target of that node at once) by a serving
 * target in no chain, of a failure domain none of the chain's other members is in:
 * the new one goes last, SYNCING, and copies the chain's chunks from its
 * predecessor. A chain with no working member left, or no such target free, keeps
 * its member, and so does a member of a move in flight (the move's own round
 * finishes or abandons it: stk_mgmt_state_rebalance). Returns how many were
 * replaced.
 */
unsigned stk_mgmt_state_replace(struct stk_mgmt_state *st, uint64_t now_ns, uint64_t after_ns,
				uint32_t force_node);

/*
 * Node node_id says its target target_id, SYNCING in chain chain_id at version
 * chain_ver, has copied everything: it becomes SERVING. 0, -ENOENT (no such
 * target of that node in that chain) or -ESTALE (not syncing, or the chain has
 * another version now: the node syncs again).
 */
int stk_mgmt_state_target_synced(struct stk_mgmt_state *st, uint32_t node_id, uint32_t target_id,
				 uint32_t chain_id, uint32_t chain_ver);

/* Whether a target of this state takes part in its chain (serving, or full). */
static inline int stk_mgmt_target_active(uint8_t state)
{
	return state == STK_TARGET_SERVING || state == STK_TARGET_FULL;
}

/*
 * The rebalancer's round, run by the leader every second or so:
 * - moves in flight: one whose `in` serves finishes (`out` leaves its chain and is
 *   WIPING); one whose `in` is gone (offline, or out of the chain) or whose `out`
 *   left the chain otherwise is abandoned (`in` leaves the chain, WIPING);
 * - chains of R form from free targets (see form_settle_ns);
 * - draining meta nodes give their place in their shards to others (meta_drains);
 * - a draining node's memberships are moved to other nodes, while fewer than
 *   max(max_moves, 1) moves are in flight: a drain asked for by hand goes on
 *   when the balancing is off;
 * - while fewer than max_moves are in flight, one membership moves from the most
 *   loaded node to the least loaded one, if that evens them out (below).
 * A node's load is m/t: m its targets in chains (a move's `in` counted, its `out`
 * not), t its targets not offline. A move from node a to node b is made only if it
 * lowers the sum over nodes of m*m/t, that is if (2*m_b + 1) * t_a < (2*m_a - 1) * t_b:
 * each move lowers that sum and nothing raises it but a new chain, so a plan
 * always ends (never a move back and forth). Only healthy chains (every member
 * working) with no move in flight move; `in` is a SERVING target in no chain, of an
 * ONLINE node that is not draining, of a failure domain no other member of the
 * chain is in (out's own domain allowed). Returns how many changes it made.
 */
unsigned stk_mgmt_state_rebalance(struct stk_mgmt_state *st, uint64_t now_ns, unsigned max_moves);

/* A meta node's role in its shard: 2 leader, 1 follower, 0 none (or not a meta node). */
int stk_mgmt_state_meta_role(const struct stk_mgmt_state *st, uint32_t node_id);

/*
 * `stoker admin drain-node` (drain 1) and `undrain-node` (drain 0): marks a
 * storage or meta node draining or not. Undraining a storage node abandons the
 * drain's moves in flight (their `in` leaves the chain), leaving the node's
 * memberships as they are. A draining meta node's place in its shard is taken by
 * a spare before it leaves (meta_drains, each stk_mgmt_state_rebalance round);
 * undrained, it keeps the role it still has. 0, -ENOENT (no such storage or meta
 * node) or -EOPNOTSUPP (a meta node of a cluster whose shards keep one copy).
 */
int stk_mgmt_state_drain(struct stk_mgmt_state *st, uint32_t node_id, int drain);

/*
 * `stoker admin accept-loss CHAIN`: chain chain_id, whose every member is lost,
 * serves again from the first member that is back (SYNCING, waiting for the
 * newest copy: target_back), giving up what only the others held. Every other
 * member leaves the chain (WIPING, now or when it comes back: it may hold chunks
 * newer than the one kept) and free targets of other failure domains take their
 * places, SYNCING. *promoted is the member kept, *dropped and *added the members
 * that left and the spares that joined. 0, -ENOENT (no such chain), -EINVAL (a
 * chain of one), -EBUSY (a member works: nothing is lost) or -EAGAIN (no member
 * is back).
 */
int stk_mgmt_state_accept_loss(struct stk_mgmt_state *st, uint32_t chain_id,
			       uint32_t *promoted, uint32_t *dropped, uint32_t *added);

/*
 * Node node_id says its target target_id, WIPING, holds no chunk any more: it is
 * SERVING, free to join a chain. 0 (also when it was not WIPING: nothing to do),
 * -ENOENT (no such target of that node) or -ESTALE (it is in a chain).
 */
int stk_mgmt_state_target_wiped(struct stk_mgmt_state *st, uint32_t node_id, uint32_t target_id);

/* How many of node_id's targets are members of a chain. */
uint32_t stk_mgmt_state_node_members(const struct stk_mgmt_state *st, uint32_t node_id);

/* A chain's health, as stk_mgmt_state_chain_health judges it. */
enum stk_mgmt_chain_health {
	STK_MGMT_CHAIN_HEALTHY,	    /* every member works (serving or full) */
	STK_MGMT_CHAIN_DEGRADED,    /* some member offline or syncing, at least one works */
	STK_MGMT_CHAIN_UNAVAILABLE, /* no member works: its files can be neither read nor written */
};

/*
 * Chain c's health (enum stk_mgmt_chain_health). A move's new member, copying
 * beside the members it is to relieve, is not missed. An empty chain (no member)
 * is UNAVAILABLE; callers that count chains skip those. `stoker status` judges
 * chains the same way (src/cli/status.c).
 */
int stk_mgmt_state_chain_health(const struct stk_mgmt_state *st, const struct stk_rt_chain *c);

/* The move in flight on chain chain_id, or NULL. */
const struct stk_mgmt_move *stk_mgmt_state_chain_move(const struct stk_mgmt_state *st,
						      uint32_t chain_id);

/*
 * Encodes the MGMT_GET_ROUTING reply: only the header (all counts 0) if
 * known_version is current, else the whole table with last_seen_ms relative to
 * now_ns. 0, -EMSGSIZE (table larger than the writer) or -ENOMEM.
 */
int stk_mgmt_state_encode_routing(const struct stk_mgmt_state *st, uint64_t known_version,
				  uint64_t now_ns, struct stk_wbuf *w);

/* Lookups; NULL if absent. Pointers stay valid until the next change. */
struct stk_mgmt_node *stk_mgmt_state_node(const struct stk_mgmt_state *st, uint32_t id);
struct stk_rt_target *stk_mgmt_state_target(const struct stk_mgmt_state *st, uint32_t id);

/*
 * The state's bytes (the format above, CRC included) into a new buffer *out of
 * *len bytes, freed with free(): what stk_mgmt_state_save writes to a file and
 * cluster mode writes to its etcd key. dirty is left as is. 0, -ENOMEM or
 * -EMSGSIZE.
 */
int stk_mgmt_state_encode(const struct stk_mgmt_state *st, uint8_t **out, size_t *len);

/*
 * Replaces st (initialised) with the state encoded in buf, as
 * stk_mgmt_state_load does with a file's bytes. 0, -EBADMSG (corrupt or unknown
 * format: st unchanged) or -ENOMEM.
 */
int stk_mgmt_state_decode(struct stk_mgmt_state *st, const uint8_t *buf, size_t len,
			  uint64_t now_ns);

/*
 * Writes the state to path atomically: path.tmp, fsync, rename, fsync of the
 * folder. Clears dirty on success. 0 or -errno (the old file is then intact).
 */
int stk_mgmt_state_save(struct stk_mgmt_state *st, const char *path);

/*
 * Loads a state saved by stk_mgmt_state_save into st (which must be initialised;
 * it is replaced). Every node gets a fresh heartbeat at now_ns, so that nodes have
 * a full timeout to report after mgmtd restarts. 0, -ENOENT (no file: st is left
 * fresh), -EBADMSG (corrupt or unknown format), -ENOMEM or -errno from reading.
 */
int stk_mgmt_state_load(struct stk_mgmt_state *st, const char *path, uint64_t now_ns);

const char *stk_mgmt_role_name(uint8_t role);

#endif
