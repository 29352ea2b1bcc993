/*
 * The meta daemon: the namespace store (store.h) behind the RPC server.
 *
 * stk_meta_run() opens the store in data_dir/meta/, binds the listening socket,
 * joins the cluster through the node agent (which registers with mgmtd and keeps
 * the routing table fresh), and serves until SIGINT/SIGTERM. The server runs each
 * connection on its own thread; the store is safe for that, so a handler is
 * nothing but decode, one store call, encode.
 *
 * Every handler follows the same shape: decode the request with its generated
 * stk_msg_*_dec(), insist that it consumed the whole payload (a malformed request
 * is -EBADMSG to the client and a warning in the log, and the connection stays
 * open), call the store with the caller's credentials, and encode the reply. An
 * error is returned as -errno; the server turns it into a wire status.
 *
 * Durability: the store commits without fsync, so an acknowledged change is in
 * the page cache and survives kill -9 of this process; a background thread
 * flushes to disk every second, and META_SYNC (and shutdown) flush at once.
 *
 * New files get their layout here, not in the store: the number of chains comes
 * from the current routing table, which only this layer knows.
 */
#include "meta.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../daemon/daemon.h"
#include "../common/auth.h"
#include "../common/layout.h"
#include "../common/log.h"
#include "../common/metrics.h"
#include "../common/util.h"
#include "../mgmtd/agent.h"
#include "../net/net.h"
#include "../proto/msg.h"
#include "../proto/status.h"
#include "leases.h"
#include "moves.h"
#include "repl.h"
#include "purge.h"
#include "session.h"
#include "confine.h"
#include "store.h"
#include "span.h"
#include "xshard.h"

#define SYNC_INTERVAL_MS 1000
/* A client retrying creates on a cluster without storage must not flood the log. */
#define NO_STORAGE_LOG_INTERVAL_NS (10ull * 1000000000ull)
#define DEFAULT_MAX_STRIPE 16

struct meta {
	struct stk_meta_store *store;
	struct stk_agent *agent; /* set before the server starts serving */
	uint32_t chunk_size;
	uint32_t stripe; /* 0: min(nchains, DEFAULT_MAX_STRIPE) */
	struct stk_metrics_ops *rpc_metrics; /* NULL without --metrics */
	struct stk_meta_sessions *sessions; /* open files, locks, orphans (session.c) */
	struct stk_meta_leases *leases; /* clients' cached lookups (leases.c) */
	struct stk_meta_repl *repl;	/* the shard's replication (repl.c) */
	struct stk_meta_xshard *xshard; /* folders across shards (xshard.c) */
	struct stk_meta_span *span;	/* client keys' subtrees across shards (span.c) */
	uint32_t node_id;		/* as mgmtd knows this node */
	int sessions_started;		/* atomic: the reaper runs (this node served) */
	struct stk_meta_purger *purger; /* removes freed files' chunks (purge.c) */
	stk_metric_t purge_series[4]; /* collect_purge's */
	stk_metric_t lease_series[6]; /* the lease table's counts (collect_leases) */
	struct quota_series *quota_series; /* collect_quotas' (one scrape at a time) */
	size_t nquota_series;
	/* Start-up's, on stk_meta_run's thread only. */
	const struct stk_meta_opts *opts;
	const char *dir; /* data_dir/meta */
	pthread_t syncer;
	int syncing;
	/*
	 * Vouchers (vouch_append, docs/security.md "Vouchers"): the vouch key (set at
	 * start when the daemon holds the cluster key; vouching 0 otherwise) and the
	 * epoch with its log of what renames moved (moves.h).
	 */
	int vouching;
	uint8_t vouch_key[STK_AUTH_MAC];
	struct stk_meta_moves *moves;
};

typedef int (*meta_op_fn)(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp);

/* ---- request helpers ---- */

/* The decoder's verdict, plus the rule that a request must end where its fields do. */
static int decoded(struct stk_rpc_req *req, int rc)
{
	if (rc == 0)
		rc = stk_rbuf_finish(&req->payload);
	if (rc) {
		stk_warn("%s from %s: malformed request (%u bytes)",
			 stk_opcode_name(req->hdr.opcode), req->peer, req->hdr.payload_len);
		return -EBADMSG;
	}
	return 0;
}

static int reply_attr(struct stk_rpc_resp *resp, const struct stk_attr *a)
{
	struct stk_msg_meta_attr_resp r;

	memset(&r, 0, sizeof(r));
	r.attr = *a;
	return stk_msg_meta_attr_resp_enc(&resp->payload, &r);
}

/*
 * A change to the names or attributes of up to four inodes (0: none): between
 * change_begin and change_end no lease on them is granted, and change_begin
 * returns once every other client's cached answers about them are gone, so the
 * commit in between is never seen next to an answer from before it (leases.h).
 * change_begin must not be called with the sessions mutex or a store transaction
 * held: it waits for other clients.
 */
struct change {
	uint64_t inos[4];
	size_t n;
};

static void change_add(struct change *ch, uint64_t ino)
{
	for (size_t i = 0; i < ch->n; i++)
		if (ch->inos[i] == ino)
			return;
	if (ino)
		ch->inos[ch->n++] = ino;
}

static void change_begin(struct meta *m, const struct stk_rpc_req *req, struct change *ch,
			 uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
	ch->n = 0;
	change_add(ch, a);
	change_add(ch, b);
	change_add(ch, c);
	change_add(ch, d);
	stk_meta_leases_begin(m->leases, req->hdr.origin, ch->inos, ch->n);
}

static void change_end(struct meta *m, const struct change *ch)
{
	stk_meta_leases_end(m->leases, ch->inos, ch->n);
}

/* An inode found changed only after the commit (a name raced to another inode). */
static void changed_late(struct meta *m, const struct stk_rpc_req *req, uint64_t ino)
{
	if (ino)
		stk_meta_leases_changed(m->leases, req->hdr.origin, &ino, 1);
}

/*
 * Before a read for the origin of what inos name (a folder's names or an inode's
 * attributes): folders delegated to another client are recalled, so the store
 * holds what that client did in them (leases.h). Returns how many were; the
 * caller reads again what it read before such a recall. Costs nothing while no
 * folder is delegated.
 */
/*
 * Set while a handler runs on an event loop (meta_loop_handle): a recall there
 * would wait for a holder's acknowledgement, so it only notes that one is needed
 * (on_loop_blocked) and the request goes to a worker, which starts it afresh.
 */
static __thread int on_loop, on_loop_blocked;

/*
 * The delegation counters a read saw before its recalls (stk_meta_leases_deleg_gen),
 * while meta_run tracks one: if one moved by the time the read is done, a folder it
 * read may have been delegated between its recall and its read (docs/leases.md),
 * and it is made again.
 */
#define TRACK_MAX 8
static __thread struct {
	int on;
	unsigned n;
	int all; /* more inodes than kept: the counter of all delegations instead */
	uint64_t all_gen;
	uint64_t ino[TRACK_MAX], gen[TRACK_MAX];
} tracked;

static void track(struct meta *m, const uint64_t *inos, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (tracked.n < TRACK_MAX) {
			tracked.ino[tracked.n] = inos[i];
			tracked.gen[tracked.n++] = stk_meta_leases_deleg_gen(m->leases, inos[i]);
		} else if (!tracked.all) {
			tracked.all = 1;
			tracked.all_gen = stk_meta_leases_deleg_gen(m->leases, 0);
		}
	}
}

static int track_moved(struct meta *m)
{
	for (unsigned i = 0; i < tracked.n; i++)
		if (stk_meta_leases_deleg_gen(m->leases, tracked.ino[i]) != tracked.gen[i])
			return 1;
	return tracked.all && stk_meta_leases_deleg_gen(m->leases, 0) != tracked.all_gen;
}

static int recall(struct meta *m, const struct stk_rpc_req *req, const uint64_t *inos, size_t n)
{
	if (tracked.on)
		track(m, inos, n);
	if (on_loop) {
		if (stk_meta_leases_delegated_elsewhere(m->leases, req->hdr.origin, inos, n))
			on_loop_blocked = 1;
		return 0;
	}
	return stk_meta_leases_recall(m->leases, req->hdr.origin, inos, n);
}

/* named, and whether it names a folder (*dir 1) or not (0; also when missing). */
static uint64_t named_kind(struct meta *m, uint64_t parent, const char *name, int *dir)
{
	const struct stk_cred root = {0};
	struct stk_attr a;

	int rc = stk_meta_store_lookup(m->store, &root, parent, name, &a);

	*dir = rc == -EREMOTE || (rc == 0 && S_ISDIR(a.mode)); /* another shard's: a folder */
	return rc == 0 || rc == -EREMOTE ? a.ino : 0;
}

/*
 * How often rmdir and rename look a name up again when it changed between the
 * look and the commit; past that (names changing without pause) they fail EAGAIN.
 */
#define NAME_RACE_TRIES 100

/* The inode parent's name names now (0: none), read as root. */
static uint64_t named(struct meta *m, uint64_t parent, const char *name)
{
	int dir;

	return named_kind(m, parent, name, &dir);
}

/*
 * After a lookup: a name of a folder of another shard (-EREMOTE, only its number
 * in *a) gets its attributes from that shard's leader, off the event loop, for the
 * asking client's session. *remote: 0 a local answer, 1 a remote one that shard
 * did not lease to the client (unleased here too: that shard's changes revoke
 * nothing here), 2 one it leased to the client's holder there before reading it
 * (its changes revoke it there; the name may be leased here).
 */
static int remote_attr(struct meta *m, const struct stk_rpc_req *req, int rc, struct stk_attr *a,
		       int *remote)
{
	int leased = 0;

	if (rc != -EREMOTE)
		return rc;
	if (remote)
		*remote = 1;
	if (on_loop) {
		on_loop_blocked = 1;
		return -EAGAIN;
	}
	/* For the asking client's session: its own delegation of the folder there stays. */
	rc = stk_meta_xshard_getattr_for(
	    m->xshard, a->ino, stk_meta_leases_session_of(m->leases, req->hdr.origin), a, &leased);
	if (rc == 0 && leased && remote)
		*remote = 2;
	return rc;
}

/*
 * After a change that may have removed folder ino: if it is gone, so is any
 * delegation of it (its holder's, which a change by the holder itself leaves).
 */
static void forget_if_gone(struct meta *m, uint64_t ino)
{
	const struct stk_cred root = {0};
	struct stk_attr a;

	if (ino && stk_meta_store_getattr(m->store, &root, ino, &a) == -ENOENT)
		stk_meta_leases_undelegate(m->leases, ino);
}

/*
 * At each scrape (with --metrics): every quota's limits and usage, a series per
 * quota root path. Series are never removed: one whose quota went (or whose
 * folder moved) is hidden.
 */
#define QUOTA_SERIES_MAX 256
#define XSHARD_COUNT_MAX 4096u /* releases counted at most (META_XSHARD COUNT) */
struct quota_series {
	uint64_t qid;
	char path[256];
	stk_metric_t s[6];
	int seen;
};

static void collect_quotas(void *ctx)
{
	static const enum stk_metric_family f[6] = {
	    STK_M_QUOTA_LIMIT_BYTES,  STK_M_QUOTA_USED_BYTES,  STK_M_QUOTA_RESERVED_BYTES,
	    STK_M_QUOTA_LIMIT_INODES, STK_M_QUOTA_USED_INODES, STK_M_QUOTA_RESERVED_INODES};
	struct meta *m = ctx;
	struct stk_meta_quota *q = calloc(QUOTA_SERIES_MAX, sizeof(*q));
	size_t n = 0;
	int more;

	if (!q || stk_meta_store_quota_list(m->store, 0, q, QUOTA_SERIES_MAX, &n, &more))
		n = 0;
	for (size_t i = 0; i < m->nquota_series; i++)
		m->quota_series[i].seen = 0;
	for (size_t i = 0; i < n; i++) {
		struct quota_series *qs = NULL;
		char path[256];
		const char *label[1] = {path};
		int64_t v[6] = {(int64_t)q[i].limit_bytes,    (int64_t)q[i].used_bytes,
				(int64_t)q[i].reserved_bytes, (int64_t)q[i].limit_inodes,
				(int64_t)q[i].used_inodes,    (int64_t)q[i].reserved_inodes};

		if (stk_meta_store_path_of(m->store, q[i].qid, path, sizeof(path)))
			snprintf(path, sizeof(path), "inode %llu", (unsigned long long)q[i].qid);
		for (size_t j = 0; j < m->nquota_series && !qs; j++)
			if (m->quota_series[j].qid == q[i].qid &&
			    strcmp(m->quota_series[j].path, path) == 0)
				qs = &m->quota_series[j];
		if (!qs && m->nquota_series < QUOTA_SERIES_MAX) {
			qs = &m->quota_series[m->nquota_series];
			memset(qs, 0, sizeof(*qs));
			qs->qid = q[i].qid;
			snprintf(qs->path, sizeof(qs->path), "%s", path);
			for (int k = 0; k < 6; k++)
				if (stk_metric_series(f[k], label, &qs->s[k]))
					qs->s[k] = 0;
			m->nquota_series++;
		}
		if (!qs)
			continue;
		qs->seen = 1;
		for (int k = 0; k < 6; k++) {
			stk_metric_set_int(qs->s[k], v[k]);
			stk_metric_hide(qs->s[k], 0);
		}
	}
	for (size_t i = 0; i < m->nquota_series; i++)
		for (int k = 0; !m->quota_series[i].seen && k < 6; k++)
			stk_metric_hide(m->quota_series[i].s[k], 1);
	free(q);
}

/* At each scrape (with --metrics): the lease table's counts. */
static void collect_leases(void *ctx)
{
	struct meta *m = ctx;
	struct stk_meta_leases_stats st;

	stk_meta_leases_stats(m->leases, &st);
	stk_metric_set_int(m->lease_series[0], (int64_t)st.holders);
	stk_metric_set_int(m->lease_series[1], (int64_t)st.grants);
	stk_metric_set_int(m->lease_series[2], (int64_t)st.revokes);
	stk_metric_set_int(m->lease_series[3], (int64_t)st.resets);
	stk_metric_set_int(m->lease_series[4], (int64_t)st.delegations);
	stk_metric_set_int(m->lease_series[5], (int64_t)st.recalls);
}

/*
 * At each scrape: the purge table's length and what the purger removed, and the
 * store's inodes (`stoker status` shows them as each shard's load).
 */
static void collect_purge(void *ctx)
{
	struct meta *m = ctx;
	struct stk_meta_purge_stats ps = {0};
	uint64_t queued = 0, inodes = 0;

	if (stk_meta_store_purge_count(m->store, &queued))
		queued = 0;
	if (m->purger)
		stk_meta_purger_stats(m->purger, &ps);
	stk_metric_set_int(m->purge_series[0], (int64_t)queued);
	stk_metric_set_int(m->purge_series[1], (int64_t)ps.inodes);
	stk_metric_set_int(m->purge_series[2], (int64_t)ps.bytes);
	if (stk_meta_store_statfs(m->store, &inodes) == 0)
		stk_metric_set_int(m->purge_series[3], (int64_t)inodes);
}

static int purge_metrics(struct meta *m)
{
	static const enum stk_metric_family f[] = {STK_M_META_PURGE_QUEUE, STK_M_META_PURGED_FILES,
						   STK_M_META_PURGED_BYTES, STK_M_META_INODES};
	int rc = 0;

	_Static_assert(STK_ARRAY_SIZE(f) == STK_ARRAY_SIZE(((struct meta *)0)->purge_series),
		       "a series per family");
	for (size_t i = 0; i < STK_ARRAY_SIZE(f) && !rc; i++)
		rc = stk_metric_series(f[i], NULL, &m->purge_series[i]);
	return rc ? rc : stk_metrics_collector_add(collect_purge, m);
}

static int leases_metrics(struct meta *m)
{
	/* In lease_series' order, as collect_leases sets them. */
	static const enum stk_metric_family f[] = {
	    STK_M_META_LEASE_HOLDERS, STK_M_META_LEASES,      STK_M_META_LEASE_REVOCATIONS,
	    STK_M_META_LEASE_RESETS,  STK_M_META_DELEGATIONS, STK_M_META_DELEGATION_RECALLS,
	};
	int rc = 0;

	_Static_assert(STK_ARRAY_SIZE(f) == STK_ARRAY_SIZE(((struct meta *)0)->lease_series),
		       "a series per family");
	for (size_t i = 0; i < STK_ARRAY_SIZE(f) && !rc; i++)
		rc = stk_metric_series(f[i], NULL, &m->lease_series[i]);
	if (rc == 0)
		rc = stk_metrics_collector_add(collect_leases, m);
	if (rc == 0) {
		m->quota_series = calloc(QUOTA_SERIES_MAX, sizeof(*m->quota_series));
		rc = m->quota_series ? stk_metrics_collector_add(collect_quotas, m) : -ENOMEM;
	}
	return rc;
}

/* Default placement for new files, from the newest routing table. */
static void placement_get(struct meta *m, struct stk_meta_placement *pl)
{
	struct stk_routing_ref *ref = m->agent ? stk_agent_routing_get(m->agent) : NULL;

	memset(pl, 0, sizeof(*pl));
	pl->nchains = ref ? ref->rt.nchains : 0;
	for (uint32_t i = 0; ref && i < ref->rt.nchains; i++) {
		const struct stk_rt_chain *c = &ref->rt.chains[i];
		const struct stk_rt_target *t =
			c->ntargets ? stk_routing_target(&ref->rt, c->targets[0]) : NULL;

		if (c->id < 1 || c->id > STK_PLACEMENT_DOWN_MAX ||
		    (t && t->state == STK_TARGET_SERVING))
			continue;
		pl->down[(c->id - 1) / 64] |= 1ull << ((c->id - 1) % 64);
		pl->ndown++;
	}
	if (ref)
		stk_agent_routing_put(m->agent, ref);
	pl->chunk_size = m->chunk_size;
	pl->stripe = m->stripe ? m->stripe : STK_MIN(pl->nchains, DEFAULT_MAX_STRIPE);
}

static void warn_no_storage(const char *name)
{
	static _Atomic uint64_t last_ns;
	uint64_t now = stk_now_ns(), last = last_ns;

	if (last && now - last < NO_STORAGE_LOG_INTERVAL_NS)
		return;
	if (atomic_compare_exchange_strong(&last_ns, &last, now))
		stk_warn("cannot create '%s': no storage targets registered", name);
}

/* ---- handlers, one per opcode ---- */

static int op_lookup(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_lookup_req q;
	struct stk_attr a;
	int rc;

	rc = decoded(req, stk_msg_meta_lookup_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	recall(m, req, &q.parent, 1);
	rc = remote_attr(m, req, stk_meta_store_lookup(m->store, &q.cred, q.parent, q.name, &a),
			 &a, NULL);
	/* The inode found may be a folder delegated elsewhere: its attributes too. */
	if (rc == 0 && recall(m, req, &a.ino, 1))
		rc = remote_attr(m, req,
				 stk_meta_store_lookup(m->store, &q.cred, q.parent, q.name, &a), &a,
				 NULL);
	return rc ? rc : reply_attr(resp, &a);
}

/*
 * A lookup whose answer the origin may cache. The leases come before the reads they
 * cover: the folder's before the name is looked up, the inode's before it is read
 * again for the reply, so a change committed after a read always finds its lease.
 * Recalls come before the leases (no lease is granted on a folder delegated to
 * someone else).
 */
static int op_lookup_cache(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_lookup_req q;
	struct stk_msg_meta_lookup_cache_resp r;
	uint32_t holder = req->hdr.origin;
	int dots, rc, remote = 0;

	rc = decoded(req, stk_msg_meta_lookup_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	memset(&r, 0, sizeof(r));
	dots = strcmp(q.name, ".") == 0 || strcmp(q.name, "..") == 0;
	recall(m, req, &q.parent, 1);
	r.leased = holder && !dots && stk_meta_leases_grant(m->leases, holder, q.parent);
	rc = remote_attr(m, req,
			 stk_meta_store_lookup(m->store, &q.cred, q.parent, q.name, &r.attr),
			 &r.attr, &remote);
	if (rc == 0 && remote == 1) {
		r.leased = 0; /* another shard's, not leased there: its changes revoke nothing */
	} else if (rc == 0 && remote == 2) {
		/* Leased there; the name here, under the folder's lease granted above
		 * (a rename or removal of it revokes that). */
	} else if (rc == 0) {
		uint64_t ino = r.attr.ino;
		int again = recall(m, req, &ino, 1);

		if (r.leased) {
			r.leased = stk_meta_leases_grant(m->leases, holder, ino);
			again = 1;
		}
		if (again)
			rc = stk_meta_store_lookup(m->store, &q.cred, q.parent, q.name, &r.attr);
		if (rc == 0 && r.attr.ino != ino)
			r.leased = 0; /* renamed over in between: answer, but not for keeps */
	}
	if (rc == -ENOENT) {
		memset(&r.attr, 0, sizeof(r.attr));
		rc = 0;
	} else if (rc == 0) {
		r.found = 1;
	}
	if (rc)
		return rc;
	if (r.leased && stk_meta_store_getattr(m->store, &q.cred, q.parent, &r.dir))
		r.leased = 0;
	return stk_msg_meta_lookup_cache_resp_enc(&resp->payload, &r);
}

/*
 * META_LOOKUP_CACHE for a batch of names of one folder (a listing's, for a mount's
 * readdirplus). As there, the leases come before the reads they cover: the
 * folder's first, then each inode found, and the names are read again after
 * those grants; a name that names another inode by then (renamed over in
 * between) or a grant refused makes the whole answer unleased (still answered).
 */
static int op_lookups(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_lookups_req q;
	struct stk_msg_meta_lookups_resp r;
	struct stk_msg_lookups_rec g;
	struct stk_msg_attr_rec rec;
	struct stk_msg_lookups_rec *names = NULL;
	struct stk_attr *attrs = NULL;
	uint32_t holder = req->hdr.origin;
	int *rcs = NULL, rc;

	memset(&r, 0, sizeof(r));
	rc = stk_msg_meta_lookups_req_dec(&req->payload, &q);
	if (rc == 0 && (q.n == 0 || q.n > STK_LOOKUPS_MAX))
		rc = -EBADMSG;
	if (rc == 0) {
		names = calloc(q.n, sizeof(*names));
		attrs = calloc(q.n, sizeof(*attrs));
		rcs = calloc(q.n, sizeof(*rcs));
		if (!names || !attrs || !rcs) {
			rc = -ENOMEM;
			goto out;
		}
	}
	for (uint32_t i = 0; rc == 0 && i < q.n; i++) {
		rc = stk_msg_lookups_rec_dec(&req->payload, &g);
		if (rc == 0)
			names[i] = g;
	}
	rc = decoded(req, rc);
	if (rc)
		goto out;
	recall(m, req, &q.parent, 1);
	r.leased = holder && stk_meta_leases_grant(m->leases, holder, q.parent);
	for (uint32_t i = 0; i < q.n; i++) {
		if (strcmp(names[i].name, ".") == 0 || strcmp(names[i].name, "..") == 0)
			r.leased = 0;
		rcs[i] =
		    stk_meta_store_lookup(m->store, &q.cred, q.parent, names[i].name, &attrs[i]);
		if (rcs[i] == -EREMOTE) {
			rcs[i] = 0; /* another shard's: asked there below, leased there or not */
		} else if (rcs[i] == 0) {
			recall(m, req, &attrs[i].ino, 1);
			if (r.leased && !stk_meta_leases_grant(m->leases, holder, attrs[i].ino))
				r.leased = 0;
		}
	}
	for (uint32_t i = 0; i < q.n; i++) {
		uint64_t was = rcs[i] == 0 ? attrs[i].ino : 0;
		int remote = 0;

		rcs[i] = remote_attr(
		    m, req,
		    stk_meta_store_lookup(m->store, &q.cred, q.parent, names[i].name, &attrs[i]),
		    &attrs[i], &remote);
		if (rcs[i] == -EAGAIN && on_loop_blocked)
			goto out; /* started afresh on a worker */
		if (remote == 1)
			r.leased = 0; /* another shard's, not leased there */
		if ((rcs[i] == 0 ? attrs[i].ino : 0) != was)
			r.leased = 0; /* renamed over in between: answer, but not for keeps */
		if (rcs[i] && rcs[i] != -ENOENT) {
			rc = rcs[i]; /* no search permission, or worse: the call's error */
			goto out;
		}
	}
	if (r.leased && stk_meta_store_getattr(m->store, &q.cred, q.parent, &r.dir))
		r.leased = 0;
	r.n = q.n;
	rc = stk_msg_meta_lookups_resp_enc(&resp->payload, &r);
	for (uint32_t i = 0; rc == 0 && i < q.n; i++) {
		memset(&rec, 0, sizeof(rec));
		rec.status = stk_status_from_errno(rcs[i]);
		if (rcs[i] == 0)
			rec.attr = attrs[i];
		rc = stk_msg_attr_rec_enc(&resp->payload, &rec);
	}
out:
	free(names);
	free(attrs);
	free(rcs);
	return rc;
}

static int op_getattr(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_ino_req q;
	struct stk_attr a;
	int rc;

	rc = decoded(req, stk_msg_meta_ino_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	recall(m, req, &q.ino, 1);
	rc = stk_meta_store_getattr(m->store, &q.cred, q.ino, &a);
	return rc ? rc : reply_attr(resp, &a);
}

/* Several inodes' attributes, each with its own status, in the request's order. */
static int op_getattrs(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_getattrs_req q;
	struct stk_msg_meta_getattrs_resp r;
	struct stk_msg_getattrs_rec g;
	struct stk_msg_attr_rec rec;
	struct stk_attr *attrs = NULL;
	uint64_t *inos = NULL;
	int *rcs = NULL, rc;

	rc = stk_msg_meta_getattrs_req_dec(&req->payload, &q);
	if (rc == 0 && (q.n == 0 || q.n > STK_GETATTRS_MAX))
		rc = -EBADMSG;
	if (rc == 0) {
		inos = calloc(q.n, sizeof(*inos));
		attrs = calloc(q.n, sizeof(*attrs));
		rcs = calloc(q.n, sizeof(*rcs));
		if (!inos || !attrs || !rcs) {
			rc = -ENOMEM;
			goto out;
		}
	}
	for (uint32_t i = 0; rc == 0 && i < q.n; i++) {
		rc = stk_msg_getattrs_rec_dec(&req->payload, &g);
		if (rc == 0)
			inos[i] = g.ino;
	}
	rc = decoded(req, rc);
	if (rc == 0) {
		recall(m, req, inos, q.n); /* all first, then one read of all */
		rc = stk_meta_store_getattrs(m->store, &q.cred, inos, q.n, attrs, rcs);
	}
	/*
	 * another shard's inode is that shard's to answer (wrong_shard checks the first);
	 * inode 0, which no shard has, is missing (confine.c's answer to a client key
	 * for an inode outside its subtree)
	 */
	for (uint32_t i = 0; rc == 0 && i < q.n; i++)
		if (inos[i] && stk_ino_shard(inos[i]) != stk_meta_store_shard(m->store))
			rcs[i] = -EREMCHG;
	if (rc)
		goto out;
	r.n = q.n;
	rc = stk_msg_meta_getattrs_resp_enc(&resp->payload, &r);
	for (uint32_t i = 0; rc == 0 && i < q.n; i++) {
		memset(&rec, 0, sizeof(rec));
		rec.status = stk_status_from_errno(rcs[i]);
		if (rcs[i] == 0)
			rec.attr = attrs[i];
		rc = stk_msg_attr_rec_enc(&resp->payload, &rec);
	}
out:
	free(inos);
	free(attrs);
	free(rcs);
	return rc;
}

static int op_setattr(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_setattr_req q;
	struct stk_meta_sattr sa;
	struct stk_attr a;
	struct change ch;
	int rc;

	rc = decoded(req, stk_msg_meta_setattr_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	sa.valid = q.valid;
	sa.mode = q.mode;
	sa.uid = q.uid;
	sa.gid = q.gid;
	sa.size = q.size;
	sa.atime_sec = q.atime_sec;
	sa.atime_nsec = q.atime_nsec;
	sa.mtime_sec = q.mtime_sec;
	sa.mtime_nsec = q.mtime_nsec;
	change_begin(m, req, &ch, q.ino, 0, 0, 0);
	rc = stk_meta_store_setattr(m->store, &q.cred, q.ino, &sa, &a);
	change_end(m, &ch);
	return rc ? rc : reply_attr(resp, &a);
}

/*
 * The attributes of folder `dir` after a change in it, for the reply (see
 * META_CREATE in msg.h): read in a transaction of their own, so they may be newer
 * than the change, never older. Left zero (ino 0) if they cannot be read.
 */
static void dir_after(struct meta *m, const struct stk_cred *cred, uint64_t dir,
		      struct stk_attr *out)
{
	if (stk_meta_store_getattr(m->store, cred, dir, out))
		memset(out, 0, sizeof(*out));
}

/*
 * The store's create and, for a session, the open reference on the file it returns,
 * under the sessions mutex as unlink takes it, so that no unlink falls between the
 * two. A reference that cannot be added leaves opened 0: the client then sends
 * META_OPEN itself.
 */
static int create_open(struct meta *m, const struct stk_msg_meta_create_req *q,
		       const struct stk_meta_placement *pl, struct stk_msg_meta_create_resp *r)
{
	int created = 0, rc;

	if (q->session)
		stk_meta_sessions_hold(m->sessions);
	rc = stk_meta_store_create(m->store, &q->cred, q->parent, q->name, q->mode, q->flags,
				   &q->layout, pl, &r->attr, &created);
	r->created = (uint8_t)created;
	if (rc == 0 && q->session && S_ISREG(r->attr.mode))
		r->opened = stk_meta_sessions_open_held(m->sessions, q->session, r->attr.ino) == 0;
	if (q->session)
		stk_meta_sessions_release(m->sessions);
	return rc;
}

/*
 * META_CREATE's change: the store's create as the change of the parent, the layout
 * from the routing table. *r's attr, created and opened are filled.
 */
static int create_file(struct meta *m, const struct stk_rpc_req *req,
		       const struct stk_msg_meta_create_req *q, struct stk_msg_meta_create_resp *r)
{
	struct stk_meta_placement pl;
	struct change ch;
	int rc;

	change_begin(m, req, &ch, q->parent, 0, 0, 0);
	placement_get(m, &pl);
	rc = create_open(m, q, &pl, r);
	/* Storage may have registered since the agent's last refresh: ask mgmtd once. */
	if (rc == -ENOSPC && pl.nchains == 0 && stk_agent_routing_refresh(m->agent) == 0) {
		placement_get(m, &pl);
		if (pl.nchains)
			rc = create_open(m, q, &pl, r);
	}
	change_end(m, &ch);
	if (rc == -ENOSPC && pl.nchains == 0)
		warn_no_storage(q->name);
	return rc;
}

static int op_create(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_create_req q;
	struct stk_msg_meta_create_resp r;
	int rc;

	rc = decoded(req, stk_msg_meta_create_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	memset(&r, 0, sizeof(r));
	/* Leased to the origin as a lookup would be: the folder before the change. */
	r.leased = req->hdr.origin && stk_meta_leases_grant(m->leases, req->hdr.origin, q.parent);
	rc = create_file(m, req, &q, &r);
	if (rc == -EREMOTE) {
		/* the name of a file of another shard (renamed here): the client opens it there */
		r.leased = 0;
		r.opened = 0;
		rc = stk_meta_xshard_getattr(m->xshard, r.attr.ino, &r.attr);
		if (rc)
			return rc;
		dir_after(m, &q.cred, q.parent, &r.dir);
		return stk_msg_meta_create_resp_enc(&resp->payload, &r);
	}
	if (rc)
		return rc;
	if (r.leased) {
		/* The inode's lease, then its attributes read again under it. */
		struct stk_attr a;

		r.leased = stk_meta_leases_grant(m->leases, req->hdr.origin, r.attr.ino) &&
			   stk_meta_store_getattr(m->store, &q.cred, r.attr.ino, &a) == 0;
		if (r.leased)
			r.attr = a;
	}
	dir_after(m, &q.cred, q.parent, &r.dir);
	r.leased = r.leased && r.dir.ino;
	return stk_msg_meta_create_resp_enc(&resp->payload, &r);
}

static int count_entry(void *ctx, const struct stk_msg_dirent *d)
{
	(void)d;
	++*(int *)ctx;
	return 0;
}

/* Whether folder ino has no names (read as root: existence, not permission). */
static int dir_empty(struct meta *m, uint64_t ino)
{
	const struct stk_cred root = {0};
	int n = 0, eof = 0;

	return stk_meta_store_readdir(m->store, &root, ino, 0, 1, count_entry, &n, &eof) == 0 &&
	       n == 0 && eof;
}

/*
 * Quotas do not span shards (docs/quotas.md, "Several shards"): an inode counts
 * in the quota of the shard it lives on, so a folder made in a folder that
 * counts in a quota stays on its parent's shard whatever its setting, and a file
 * renamed or linked across shards must count in the same quota on both sides
 * (none included): else EXDEV, nothing changes, and mv copies, counting each
 * byte where it lands.
 */
static uint64_t qid_of(struct meta *m, uint64_t ino, int *rc)
{
	const struct stk_cred root = {0};
	struct stk_attr a;

	if (stk_ino_shard(ino) == stk_meta_store_shard(m->store))
		*rc = stk_meta_store_getattr(m->store, &root, ino, &a);
	else
		*rc = stk_meta_xshard_getattr(m->xshard, ino, &a);
	return *rc ? 0 : a.qid;
}

static int same_quota(struct meta *m, uint64_t file, uint64_t dir)
{
	int rc = 0, drc = 0;
	uint64_t fq = file ? qid_of(m, file, &rc) : 0, dq = qid_of(m, dir, &drc);

	if (rc == -ENOENT || drc == -ENOENT)
		return 0; /* gone: the operation answers for it */
	if (rc || drc)
		return rc ? rc : drc;
	if (fq == dq)
		return 0;
	stk_debug("inode %llu (quota %llu) to folder %llu (quota %llu) across shards: EXDEV",
		  (unsigned long long)file, (unsigned long long)fq, (unsigned long long)dir,
		  (unsigned long long)dq);
	return -EXDEV;
}

static int op_mkdir(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_mkdir_req q;
	struct stk_msg_meta_mkdir_resp r;
	uint32_t origin = req->hdr.origin;
	struct change ch;
	unsigned to;
	int rc;

	rc = decoded(req, stk_msg_meta_mkdir_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	memset(&r, 0, sizeof(r));
	to = stk_meta_xshard_place(m->xshard, q.parent, q.name);
	if (to != stk_meta_store_shard(m->store) && qid_of(m, q.parent, &rc) != 0)
		to = stk_meta_store_shard(m->store); /* under a quota: stays (same_quota) */
	if (to != stk_meta_store_shard(m->store)) {
		/* on another shard (docs/meta-shards.md): neither leased nor delegated */
		change_begin(m, req, &ch, q.parent, 0, 0, 0);
		rc = stk_meta_xshard_mkdir(m->xshard, &q.cred, q.parent, q.name, q.mode, to,
					   &r.attr);
		change_end(m, &ch);
		if (rc)
			return rc;
		dir_after(m, &q.cred, q.parent, &r.dir);
		return stk_msg_meta_mkdir_resp_enc(&resp->payload, &r);
	}
	/* Leased as a create is; the new folder too, then read again under its lease. */
	r.leased = origin && stk_meta_leases_grant(m->leases, origin, q.parent);
	change_begin(m, req, &ch, q.parent, 0, 0, 0);
	rc = stk_meta_store_mkdir(m->store, &q.cred, q.parent, q.name, q.mode, &r.attr);
	change_end(m, &ch);
	if (rc)
		return rc;
	if (r.leased) {
		struct stk_attr a;

		r.leased = stk_meta_leases_grant(m->leases, origin, r.attr.ino) &&
			   stk_meta_store_getattr(m->store, &q.cred, r.attr.ino, &a) == 0;
		if (r.leased) {
			r.attr = a;
			r.empty = (uint8_t)dir_empty(m, a.ino);
		}
	}
	dir_after(m, &q.cred, q.parent, &r.dir);
	r.leased = r.leased && r.dir.ino;
	/*
	 * Only a folder the origin holds leased and saw empty: what it then answers by
	 * itself starts from the truth. The table refuses while another holder has a
	 * lease on it or a change to it is in progress; once delegated, a change by
	 * anyone else recalls it. A change committed between the look above and the
	 * delegation is what is left: the folder is looked at again, and a delegation
	 * its holder has not been told of yet simply goes.
	 */
	/*
	 * A folder under a quota is delegated only to a holder that asks for inode
	 * allowances (META_ALLOW) before it answers creates itself: the room is set
	 * aside in the quota first, so none is passed (docs/quotas.md). An older
	 * client would answer creates nothing was set aside for.
	 */
	if ((q.flags & STK_MKDIR_DELEGATE) && origin && r.leased && r.empty &&
	    (!r.attr.qid || (q.flags & STK_MKDIR_DELEGATE_QUOTA)) &&
	    stk_meta_leases_delegate(m->leases, origin, r.attr.ino)) {
		r.delegated = (uint8_t)dir_empty(m, r.attr.ino);
		if (!r.delegated)
			stk_meta_leases_undelegate(m->leases, r.attr.ino);
	}
	return stk_msg_meta_mkdir_resp_enc(&resp->payload, &r);
}

/* Whether a file that just lost its last name became an orphan (sessions held). */
static uint8_t orphaned(struct meta *m, const struct stk_attr *a)
{
	return a->ino && a->nlink == 0 && S_ISREG(a->mode) &&
	       stk_meta_sessions_is_open(m->sessions, a->ino);
}

/*
 * META_UNLINK's change: `name` in parent goes, as the change of the parent and of
 * the inode; *attr is the inode after and *orph whether it became an orphan.
 */
static int unlink_name(struct meta *m, const struct stk_rpc_req *req, const struct stk_cred *cred,
		       uint64_t parent, const char *name, struct stk_attr *attr, uint8_t *orph)
{
	struct change ch;
	uint64_t victim;
	int rc;

	victim = named(m, parent, name); /* its link count changes too */
	change_begin(m, req, &ch, parent, victim, 0, 0);
	stk_meta_sessions_hold(m->sessions);
	rc = stk_meta_store_unlink(m->store, cred, parent, name, attr);
	if (rc == 0)
		*orph = orphaned(m, attr);
	stk_meta_sessions_release(m->sessions);
	change_end(m, &ch);
	if (rc == 0 && stk_ino_shard(attr->ino) != stk_meta_store_shard(m->store))
		stk_meta_xshard_kick(m->xshard); /* a file of another shard: its home is told */
	if (rc == 0 && attr->ino != victim)
		changed_late(m, req, attr->ino);
	return rc;
}

static int op_unlink(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_name_req q;
	struct stk_msg_meta_unlink_resp r;
	int rc;

	rc = decoded(req, stk_msg_meta_name_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	memset(&r, 0, sizeof(r));
	rc = unlink_name(m, req, &q.cred, q.parent, q.name, &r.attr, &r.orphaned);
	if (rc)
		return rc;
	dir_after(m, &q.cred, q.parent, &r.dir);
	return stk_msg_meta_unlink_resp_enc(&resp->payload, &r);
}

static int op_rmdir(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_name_req q;
	struct change ch;
	uint64_t victim;
	int rc;

	rc = decoded(req, stk_msg_meta_name_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	/*
	 * The folder removed too: whether it is empty is its names' business, and a
	 * client it is delegated to may have names in it meta has not seen yet. The
	 * name must still hold the folder recalled when it goes (-EAGAIN: look again).
	 */
	for (unsigned tries = 0;; tries++) {
		victim = named(m, q.parent, q.name);
		change_begin(m, req, &ch, q.parent, victim, 0, 0);
		rc = stk_meta_store_rmdir_ino(m->store, &q.cred, q.parent, q.name, victim);
		if (rc == -EREMOTE) /* a folder of another shard: four steps (xshard.h) */
			rc = stk_meta_xshard_rmdir(m->xshard, &q.cred, q.parent, q.name, victim);
		change_end(m, &ch);
		if (rc != -EAGAIN || tries == NAME_RACE_TRIES)
			break;
	}
	if (rc == 0)
		forget_if_gone(m, victim);
	return rc;
}

static int op_rename(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_rename_req q;
	struct stk_msg_meta_rename_resp r;
	uint64_t moved, over, files[2], token = 0;
	struct change ch;
	int replaced, rc, moved_dir = 0, over_dir = 0, wide;
	unsigned mine = stk_meta_store_shard(m->store);
	unsigned nfiles = 0;

	rc = decoded(req, stk_msg_meta_rename_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	memset(&r, 0, sizeof(r));
	if (stk_ino_shard(q.dst_parent) != stk_meta_store_shard(m->store)) {
		/* to a folder of another shard: a file or a folder moves in four steps
		 * (xshard.h), within one quota (or none) on both sides */
		moved = named_kind(m, q.src_parent, q.src_name, &moved_dir);
		rc = moved ? same_quota(m, moved, q.dst_parent) : 0;
		if (rc)
			return rc;
		change_begin(m, req, &ch, q.src_parent, moved, 0, 0);
		rc = -EXDEV;
		if (moved_dir)
			rc = stk_meta_xshard_fmove(m->xshard, &q.cred, q.src_parent, q.src_name,
						   q.dst_parent, q.dst_name, q.flags);
		if (rc == -EXDEV) /* a file (or an exchange): the file's four steps */
			rc = stk_meta_xshard_rename(m->xshard, &q.cred, q.src_parent, q.src_name,
						    q.dst_parent, q.dst_name, q.flags);
		change_end(m, &ch);
		/* the file left this shard's folder: its vouchers end (moves.h); a
		 * failure, a folder, or a name that named nothing, ends all, to be safe */
		files[0] = moved;
		stk_meta_moves_rename(m->moves, rc || !moved || moved_dir, files, 1);
		return rc ? rc : stk_msg_meta_rename_resp_enc(&resp->payload, &r);
	}
	/*
	 * A folder of this shard to another parent (either of an exchange), on a
	 * cluster of shards: under the folder-move lock, after the walk up to the root
	 * (no cycle across shards).
	 */
	if (q.src_parent != q.dst_parent && stk_meta_xshard_sharded(m->xshard)) {
		uint64_t a, b;

		moved = named_kind(m, q.src_parent, q.src_name, &moved_dir);
		over = named_kind(m, q.dst_parent, q.dst_name, &over_dir);
		a = moved && moved_dir && stk_ino_shard(moved) == mine ? moved : 0;
		b = (q.flags & STK_RENAME_EXCHANGE) && over && over_dir &&
			    stk_ino_shard(over) == mine
			? over
			: 0;
		if (a || b) {
			rc = stk_meta_xshard_dirmove_begin(m->xshard, a, q.dst_parent, b,
							   q.src_parent, &token);
			if (rc)
				return rc;
		}
	}
	/*
	 * Both folders, the inode moved (its ctime, a folder's ".."), the one replaced.
	 * Both names must still hold what was recalled when the rename commits: a
	 * folder replaced may be delegated, with names in it meta has not seen yet.
	 */
	for (unsigned tries = 0;; tries++) {
		moved = named_kind(m, q.src_parent, q.src_name, &moved_dir);
		over = named_kind(m, q.dst_parent, q.dst_name, &over_dir);
		int lockable = (moved_dir && stk_ino_shard(moved) == mine) ||
			       ((q.flags & STK_RENAME_EXCHANGE) && over_dir &&
				stk_ino_shard(over) == mine);

		if (!token && lockable && q.src_parent != q.dst_parent &&
		    stk_meta_xshard_sharded(m->xshard)) {
			rc = -EAGAIN; /* a folder now, not walked under the lock: ask again */
			break;
		}
		change_begin(m, req, &ch, q.src_parent, q.dst_parent, moved, over);
		stk_meta_sessions_hold(m->sessions);
		rc = stk_meta_store_rename_ino(m->store, &q.cred, q.src_parent, q.src_name,
					       q.dst_parent, q.dst_name, q.flags, moved, over,
					       &replaced, &r.attr);
		if (rc == 0 && replaced)
			r.orphaned = orphaned(m, &r.attr);
		stk_meta_sessions_release(m->sessions);
		change_end(m, &ch);
		if (rc != -EAGAIN || tries == NAME_RACE_TRIES)
			break;
	}
	stk_meta_xshard_dirmove_end(m->xshard, token);
	if (rc == -EXDEV && moved && moved_dir && stk_ino_shard(moved) != mine &&
	    !(q.flags & STK_RENAME_EXCHANGE)) {
		/* a folder of another shard named here, moved or replacing: its shard's
		 * parent pointer changes with the entry (xshard.h) */
		change_begin(m, req, &ch, q.src_parent, q.dst_parent, moved, over);
		rc = stk_meta_xshard_fmove(m->xshard, &q.cred, q.src_parent, q.src_name,
					   q.dst_parent, q.dst_name, q.flags);
		change_end(m, &ch);
	}
	/*
	 * What moved may have left a subtree (moves.h): a folder, every voucher given
	 * before; a file, its own (both of an exchange), even within one folder: it
	 * now counts in the folder it was renamed into, which for a file with another
	 * name elsewhere may not be the one it counted in. The commit held both names
	 * to what was looked up, so the kinds are the committed ones; a failure ends
	 * all, to be safe. A voucher reads the epoch before it checks the inode.
	 */
	wide = rc || !moved || moved_dir || ((q.flags & STK_RENAME_EXCHANGE) && over_dir);
	if (!wide) {
		files[nfiles++] = moved;
		if ((q.flags & STK_RENAME_EXCHANGE) && over)
			files[nfiles++] = over;
	}
	stk_meta_moves_rename(m->moves, wide, files, nfiles);
	if (rc)
		return rc;
	if (over && stk_ino_shard(over) != stk_meta_store_shard(m->store))
		stk_meta_xshard_kick(m->xshard); /* a file of another shard replaced */
	r.replaced = (uint8_t)replaced;
	if (over != moved && !(q.flags & STK_RENAME_EXCHANGE))
		forget_if_gone(m, over); /* an empty folder renamed over */
	/* Names that raced to other inodes between the look and the commit. */
	if (replaced && r.attr.ino != over && r.attr.ino != moved)
		changed_late(m, req, r.attr.ino);
	{
		uint64_t now = named(m, q.dst_parent, q.dst_name);

		if (now != moved && now != over)
			changed_late(m, req, now);
	}
	return stk_msg_meta_rename_resp_enc(&resp->payload, &r);
}

static int op_link(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_link_req q;
	struct stk_attr a;
	struct change ch;
	int rc;

	rc = decoded(req, stk_msg_meta_link_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	if (stk_ino_shard(q.ino) != stk_meta_store_shard(m->store)) {
		rc = same_quota(m, q.ino, q.parent);
		if (rc)
			return rc;
	}
	change_begin(m, req, &ch, q.parent, q.ino, 0, 0);
	if (stk_ino_shard(q.ino) != stk_meta_store_shard(m->store))
		/* a file of another shard: four steps (xshard.h) */
		rc = stk_meta_xshard_link(m->xshard, &q.cred, q.ino, q.parent, q.name, &a);
	else
		rc = stk_meta_store_link(m->store, &q.cred, q.ino, q.parent, q.name, &a);
	change_end(m, &ch);
	return rc ? rc : reply_attr(resp, &a);
}

static int op_symlink(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_symlink_req q;
	struct stk_attr a;
	struct change ch;
	int rc;

	rc = decoded(req, stk_msg_meta_symlink_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	change_begin(m, req, &ch, q.parent, 0, 0, 0);
	rc = stk_meta_store_symlink(m->store, &q.cred, q.parent, q.name, q.target, &a);
	change_end(m, &ch);
	return rc ? rc : reply_attr(resp, &a);
}

static int op_mknod(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_mknod_req q;
	struct stk_attr a;
	struct change ch;
	int rc;

	rc = decoded(req, stk_msg_meta_mknod_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	change_begin(m, req, &ch, q.parent, 0, 0, 0);
	rc = stk_meta_store_mknod(m->store, &q.cred, q.parent, q.name, q.mode, q.rdev, &a);
	change_end(m, &ch);
	return rc ? rc : reply_attr(resp, &a);
}

static int op_readlink(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_ino_req q;
	struct stk_msg_meta_readlink_resp r;
	int rc;

	rc = decoded(req, stk_msg_meta_ino_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	memset(&r, 0, sizeof(r));
	rc = stk_meta_store_readlink(m->store, &q.cred, q.ino, r.target, sizeof(r.target));
	return rc ? rc : stk_msg_meta_readlink_resp_enc(&resp->payload, &r);
}

/* Encodes directory entries into the reply until it is full. */
struct dirent_sink {
	struct stk_wbuf *w;
	uint32_t n;
};

static int dirent_put(void *ctx, const struct stk_msg_dirent *d)
{
	struct dirent_sink *s = ctx;
	/* ino, mode, next_cookie, then the name as u16 length + bytes */
	size_t need = 8 + 4 + 8 + 2 + strlen(d->name);

	if (need > s->w->cap - s->w->len)
		return 1; /* the reply is full: the client resumes from the last cookie */
	s->n++;
	return stk_msg_dirent_enc(s->w, d);
}

/*
 * The reply header (eof, n) precedes the entries but is known only after them:
 * it is encoded once as a placeholder to reserve its bytes, then again over them.
 */
static int op_readdir(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_readdir_req q;
	struct stk_msg_meta_readdir_resp r;
	struct dirent_sink sink = {&resp->payload, 0};
	struct stk_wbuf hdr;
	size_t at = resp->payload.len, hdr_len;
	int eof, rc;

	rc = decoded(req, stk_msg_meta_readdir_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	recall(m, req, &q.ino, 1);
	memset(&r, 0, sizeof(r));
	rc = stk_msg_meta_readdir_resp_enc(&resp->payload, &r);
	if (rc)
		return rc;
	hdr_len = resp->payload.len - at;
	rc = stk_meta_store_readdir(m->store, &q.cred, q.ino, q.cookie, q.max_entries, dirent_put,
				    &sink, &eof);
	if (rc)
		return rc;
	if (sink.n == 0 && !eof)
		return -EMSGSIZE; /* cannot happen: one entry always fits in an empty reply */
	r.eof = (uint8_t)eof;
	r.n = sink.n;
	stk_wbuf_init(&hdr, resp->payload.p + at, hdr_len);
	return stk_msg_meta_readdir_resp_enc(&hdr, &r);
}

static int op_statfs(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_statfs_ext x = {.flags = STK_STATFS_PURGES};
	struct stk_msg_meta_statfs_resp r;
	struct stk_ns_id ns;
	int rc;

	rc = decoded(req, 0);
	if (rc)
		return rc;
	memset(&r, 0, sizeof(r));
	stk_meta_store_ns_id(m->store, &ns);
	r.ns_hi = ns.hi;
	r.ns_lo = ns.lo;
	rc = stk_meta_store_statfs(m->store, &r.files);
	if (rc == 0)
		rc = stk_msg_meta_statfs_resp_enc(&resp->payload, &r);
	return rc ? rc : stk_msg_meta_statfs_ext_enc(&resp->payload, &x);
}

static int op_extend(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_extend_req q;
	struct stk_meta_extend x;
	struct stk_attr a;
	struct change ch;
	int rc;

	struct stk_msg_meta_extend_ext e = {0};

	rc = stk_msg_meta_extend_req_dec(&req->payload, &q);
	/* An older client's request ends here: it spent no byte allowance. */
	if (rc == 0 && req->payload.off < req->payload.len)
		rc = stk_msg_meta_extend_ext_dec(&req->payload, &e);
	rc = decoded(req, rc);
	if (rc)
		return rc;
	/* A reset holder's allowance went with it: nothing of it to spend. */
	if (e.session && stk_meta_leases_session_of(m->leases, req->hdr.origin) != e.session)
		e.session = 0;
	x = (struct stk_meta_extend){.size = q.size,
				     .mtime_sec = q.mtime_sec,
				     .mtime_nsec = q.mtime_nsec,
				     .alloc_first = q.alloc_first,
				     .alloc_end = q.alloc_end,
				     .punch_first = q.punch_first,
				     .punch_end = q.punch_end,
				     .allow_session = e.session,
				     .allow_spent = e.session ? e.spent : 0};
	change_begin(m, req, &ch, q.ino, 0, 0, 0);
	rc = stk_meta_store_extend_alloc(m->store, &q.cred, q.ino, &x, &a);
	change_end(m, &ch);
	return rc ? rc : reply_attr(resp, &a);
}

static int op_sync(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	int rc = decoded(req, 0);

	if (rc == 0)
		rc = stk_meta_store_sync(m->store);
	/* durable on every replica: the followers flush what they hold too */
	return rc ? rc : stk_meta_repl_sync(m->repl);
}

/* ---- extended attributes ---- */

static int op_setxattr(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_setxattr_req q;
	const uint8_t *value = NULL;
	struct change ch;
	int rc;

	(void)resp;
	rc = stk_msg_meta_setxattr_req_dec(&req->payload, &q);
	if (rc == 0 && q.size > STK_XATTR_SIZE_MAX)
		return -E2BIG;
	if (rc == 0 && q.size)
		value = stk_rbuf_take(&req->payload, q.size);
	rc = decoded(req, rc ? rc : req->payload.err);
	if (rc)
		return rc;
	/* a folder's placement setting (xshard.h): a shard the cluster has, or "spread" */
	if (strcmp(q.name, STK_XSHARD_PIN_XATTR) == 0) {
		struct stk_attr a;

		rc = stk_meta_xshard_pin_check(m->xshard, value, q.size);
		if (rc == 0 && stk_meta_store_getattr(m->store, &q.cred, q.ino, &a) == 0 &&
		    !S_ISDIR(a.mode))
			rc = -ENOTDIR;
		if (rc)
			return rc;
	}
	change_begin(m, req, &ch, q.ino, 0, 0, 0); /* its ctime */
	rc = stk_meta_store_setxattr(m->store, &q.cred, q.ino, q.name, value, q.size, q.flags);
	change_end(m, &ch);
	return rc;
}

/* The reply of GETXATTR and LISTXATTR: the length, then the bytes unless only it was asked. */
static int reply_xattr(struct stk_rpc_resp *resp, const uint8_t *buf, size_t len, int with_bytes)
{
	struct stk_msg_meta_xattr_resp r = {.size = (uint32_t)len};
	int rc = stk_msg_meta_xattr_resp_enc(&resp->payload, &r);

	if (rc == 0 && with_bytes)
		stk_put_bytes(&resp->payload, buf, len);
	return resp->payload.err;
}

static int op_getxattr(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_getxattr_req q;
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	rc = decoded(req, stk_msg_meta_getxattr_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	if (q.size > STK_XATTR_SIZE_MAX)
		q.size = STK_XATTR_SIZE_MAX; /* as Linux: no value is longer */
	if (q.size && !(buf = malloc(q.size)))
		return -ENOMEM;
	recall(m, req, &q.ino, 1);
	rc = stk_meta_store_getxattr(m->store, &q.cred, q.ino, q.name, buf, q.size, &len);
	if (rc == 0)
		rc = reply_xattr(resp, buf, len, q.size != 0);
	free(buf);
	return rc;
}

static int op_listxattr(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_listxattr_req q;
	char *buf = NULL;
	size_t len = 0;
	int rc;

	rc = decoded(req, stk_msg_meta_listxattr_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	if (q.size > STK_XATTR_SIZE_MAX)
		q.size = STK_XATTR_SIZE_MAX;
	if (q.size && !(buf = malloc(q.size)))
		return -ENOMEM;
	recall(m, req, &q.ino, 1);
	rc = stk_meta_store_listxattr(m->store, &q.cred, q.ino, buf, q.size, &len);
	if (rc == -ERANGE && q.size == STK_XATTR_SIZE_MAX)
		rc = -E2BIG; /* no buffer could hold the list */
	if (rc == 0)
		rc = reply_xattr(resp, (const uint8_t *)buf, len, q.size != 0);
	free(buf);
	return rc;
}

static int op_removexattr(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_xattr_name_req q;
	struct change ch;
	int rc;

	(void)resp;
	rc = decoded(req, stk_msg_meta_xattr_name_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	change_begin(m, req, &ch, q.ino, 0, 0, 0);
	rc = stk_meta_store_removexattr(m->store, &q.cred, q.ino, q.name);
	change_end(m, &ch);
	return rc;
}

/* ---- sessions, open references and locks (session.c, locks.c) ---- */

static int op_session(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_session_req q;
	struct stk_msg_meta_session_resp r;
	int known = 0, rc;

	rc = decoded(req, stk_msg_meta_session_req_dec(&req->payload, &q));
	if (rc == 0)
		rc = stk_meta_sessions_renew(m->sessions, q.session, &known);
	if (rc)
		return rc;
	memset(&r, 0, sizeof(r));
	r.lease_ms = stk_meta_sessions_lease_ms(m->sessions);
	r.known = (uint8_t)known;
	if (!known)
		stk_debug("session %016llx from %s (pid %u) opened", (unsigned long long)q.session,
			  req->peer, q.pid);
	return stk_msg_meta_session_resp_enc(&resp->payload, &r);
}

static int op_session_end(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_session_req q;
	int rc;

	(void)resp;
	rc = decoded(req, stk_msg_meta_session_req_dec(&req->payload, &q));
	if (rc == 0 && q.session == 0)
		rc = -EINVAL;
	if (rc == 0) {
		stk_meta_sessions_end(m->sessions, q.session);
		stk_meta_leases_end_session(m->leases, q.session);
	}
	return rc;
}

/* The reply carries the attributes read with the registration (what an open needs). */
static int op_open(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_open_req q;
	struct stk_attr a;
	int rc;

	rc = decoded(req, stk_msg_meta_open_req_dec(&req->payload, &q));
	if (rc == 0)
		rc = stk_meta_sessions_open(m->sessions, q.session, q.ino, q.count, q.set, &a);
	return rc ? rc : reply_attr(resp, &a);
}

static int op_close(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_open_req q;
	int rc;

	(void)resp;
	rc = decoded(req, stk_msg_meta_open_req_dec(&req->payload, &q));
	return rc ? rc : stk_meta_sessions_close(m->sessions, q.session, q.ino, q.count);
}

/* The inodes of the reads to record among a META_CLOSES's records: *k of them, or NULL. */
static uint64_t *reads_of(const struct stk_msg_open_ref *refs, uint32_t n, size_t *k)
{
	uint64_t *inos = malloc((n ? n : 1) * sizeof(*inos));

	*k = 0;
	for (uint32_t i = 0; inos && i < n; i++)
		if (refs[i].flags & STK_REF_READ)
			inos[(*k)++] = refs[i].ino;
	return inos;
}

static int op_closes(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	/* ATIME_READ checks no permission (a read was allowed at open); any will do. */
	const struct stk_cred anyone = {0};
	struct stk_msg_meta_closes_req q;
	struct stk_msg_meta_closes_resp out = {0};
	struct stk_msg_open_ref *refs;
	struct stk_attr *attrs = NULL;
	uint64_t *reads = NULL;
	size_t nreads = 0, k = 0;
	int first = 0, want = 0, batch, rc, *rcs = NULL;

	rc = stk_msg_meta_closes_req_dec(&req->payload, &q);
	if (rc == 0 && q.n > STK_CLOSES_MAX)
		rc = -EBADMSG;
	refs = rc == 0 && q.n ? calloc(q.n, sizeof(*refs)) : NULL;
	if (rc == 0 && q.n && !refs)
		return -ENOMEM;
	for (uint32_t i = 0; rc == 0 && i < q.n; i++)
		rc = stk_msg_open_ref_dec(&req->payload, &refs[i]);
	/* All of it decoded before anything is dropped: a malformed request drops none. */
	rc = decoded(req, rc);
	/*
	 * The reads first (atimes: a change of their attributes, leases.h), all in one
	 * transaction (before the closes, which may remove an orphan; a file gone misses
	 * nothing); if that fails, one by one below.
	 */
	if (rc == 0) {
		reads = reads_of(refs, q.n, &nreads);
		if (!reads) {
			free(refs);
			return -ENOMEM;
		}
		stk_meta_leases_begin(m->leases, req->hdr.origin, reads, nreads);
	}
	batch = rc == 0 && nreads ? stk_meta_store_record_reads(m->store, reads, nreads)
				  : rc == 0 ? 0 : -EINVAL;
	/* What the reads left, for the client's cache (it forgets its own changes):
	 * read after the commit, so never older than it. None if memory is short. */
	for (uint32_t i = 0; rc == 0 && i < q.n; i++)
		want |= (refs[i].flags & STK_REF_ATTR) != 0;
	if (rc == 0 && nreads && want) {
		attrs = calloc(nreads, sizeof(*attrs));
		rcs = calloc(nreads, sizeof(*rcs));
		if (attrs && rcs && batch == 0 &&
		    stk_meta_store_getattrs(m->store, &anyone, reads, (uint32_t)nreads, attrs, rcs))
			for (size_t i = 0; i < nreads; i++)
				rcs[i] = -EIO;
	}
	for (uint32_t i = 0; rc == 0 && i < q.n; i++) {
		const struct stk_meta_sattr read = {.valid = STK_SETATTR_ATIME_READ};
		struct stk_attr a;
		int r = 0, c = 0;

		if (batch && (refs[i].flags & STK_REF_READ)) {
			r = stk_meta_store_setattr(m->store, &anyone, refs[i].ino, &read, &a);
			if (attrs && rcs) {
				rcs[k] = r;
				if (r == 0)
					attrs[k] = a;
			}
			r = r == -ENOENT ? 0 : r;
		}
		if (refs[i].flags & STK_REF_READ)
			k++;
		if (refs[i].count)
			c = stk_meta_sessions_close(m->sessions, q.session, refs[i].ino,
						    refs[i].count);
		if (!first)
			first = r ? r : c;
	}
	if (reads)
		stk_meta_leases_end(m->leases, reads, nreads);
	if (rc == 0 && first == 0 && want) {
		out.n = attrs && rcs ? (uint32_t)nreads : 0;
		rc = stk_msg_meta_closes_resp_enc(&resp->payload, &out);
		for (uint32_t i = 0; rc == 0 && i < out.n; i++) {
			struct stk_msg_attr_rec rec;

			memset(&rec, 0, sizeof(rec));
			rec.status = stk_status_from_errno(rcs[i]);
			if (rcs[i] == 0)
				rec.attr = attrs[i];
			rc = stk_msg_attr_rec_enc(&resp->payload, &rec);
		}
	}
	free(attrs);
	free(rcs);
	free(reads);
	free(refs);
	return rc ? rc : first;
}

/* The long poll of a cache holder (leases.h). */
static int op_watch(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_watch_req q;
	struct stk_msg_meta_watch_resp r;
	uint64_t *inos;
	uint32_t n = 0;
	int reset = 0, rc;

	rc = decoded(req, stk_msg_meta_watch_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	inos = malloc(STK_WATCH_RECS_MAX * sizeof(*inos));
	if (!inos)
		return -ENOMEM;
	memset(&r, 0, sizeof(r));
	r.holder = q.holder;
	rc = stk_meta_leases_watch(m->leases, q.session, &r.holder, q.acked, q.wait_ms, inos,
				   STK_WATCH_RECS_MAX, &n, &r.seq, &reset);
	if (rc == 0) {
		r.reset = (uint8_t)reset;
		r.n = n;
		rc = stk_msg_meta_watch_resp_enc(&resp->payload, &r);
		for (uint32_t i = 0; rc == 0 && i < n; i++) {
			struct stk_msg_watch_rec rec = {.ino = inos[i]};

			rc = stk_msg_watch_rec_enc(&resp->payload, &rec);
		}
	}
	free(inos);
	return rc;
}

/* ---- delegated folders (leases.h): what their holders answered themselves ---- */

static int op_inos(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_inos_req q;
	struct stk_msg_meta_inos_resp r;
	struct stk_meta_placement pl;
	int rc;

	rc = decoded(req, stk_msg_meta_inos_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	if (q.count == 0 || q.count > STK_INOS_MAX)
		return -EINVAL;
	memset(&r, 0, sizeof(r));
	rc = stk_meta_store_reserve_inos(m->store, q.count, &r.first);
	if (rc)
		return rc;
	r.count = q.count;
	/* How new files are laid out now, for the caller's own creates (storage may
	 * have registered since the agent's last refresh, as in create_file). */
	placement_get(m, &pl);
	if (pl.nchains == 0 && stk_agent_routing_refresh(m->agent) == 0)
		placement_get(m, &pl);
	r.chunk_size = pl.chunk_size ? pl.chunk_size : STK_DEFAULT_CHUNK_SIZE;
	r.stripe = pl.stripe;
	r.nchains = pl.nchains;
	return stk_msg_meta_inos_resp_enc(&resp->payload, &r);
}

/*
 * A delegated folder's holder sends the creates and unlinks it answered itself, each
 * applied as META_CREATE (EXCL, no session: the holder registers its opens itself)
 * or META_UNLINK would apply it, in order, as the origin's change (its leases
 * stay); a record's failure is its status alone. The records are all decoded
 * before any is applied: a malformed request applies none.
 *
 * All of them go in one transaction (stk_meta_store_batch_begin), each record a
 * child of it, so a batch costs one commit instead of one per record: first every
 * record's revocations (change_begin waits for other clients, so it comes before
 * anything is held), then the sessions' mutex if there are unlinks (an unlink's
 * orphan check needs it, and it is taken before the store everywhere), the batch,
 * and the ends of the changes only after the commit, so that no lease is granted
 * on what the batch changed before it is visible.
 */
struct name_job {
	struct change ch;
	uint64_t victim;
	int began, rc;
	int done; /* applied already (replayed): res holds what it left */
	struct stk_msg_name_res res;
};

/*
 * Whether record rec was applied already: a batch applied here whose reply was
 * lost (the leader died, the connection broke) is sent again, perhaps to the
 * promoted follower, which has it. A create of a number the holder reserved
 * that its name already names was applied (numbers are never given twice); an
 * unlink whose name names nothing of that number any more and whose file has no
 * name left was too. Either answers what it left, not EEXIST or ENOENT: the
 * holder's application was told it happened, and it did.
 */
static int names_replayed(struct meta *m, const struct stk_msg_name_rec *rec,
			  struct stk_msg_name_res *res)
{
	const struct stk_cred root = {0};
	struct stk_attr a;
	uint64_t now = named(m, rec->parent, rec->name);
	int rc;

	if (rec->op == STK_NAME_CREATE) {
		if (now != rec->ino || stk_meta_store_getattr(m->store, &root, rec->ino, &a))
			return 0;
		res->attr = a;
		return 1;
	}
	if (now == rec->ino)
		return 0;
	rc = stk_meta_store_getattr(m->store, &root, rec->ino, &a);
	if (rc == -ENOENT || (rc == 0 && a.nlink == 0 && S_ISREG(a.mode))) {
		memset(&res->attr, 0, sizeof(res->attr)); /* its data went, or goes, as it did */
		return 1;
	}
	return 0;
}

static void names_apply(struct meta *m, const struct stk_msg_name_rec *recs, struct name_job *jobs,
			uint32_t n, const struct stk_meta_placement *pl, uint64_t session)
{
	int brc = stk_meta_store_batch_begin(m->store);

	for (uint32_t i = 0; i < n; i++) {
		const struct stk_msg_name_rec *rec = &recs[i];
		struct name_job *j = &jobs[i];
		struct stk_meta_create_as as = {.ino = rec->ino,
						.time_sec = rec->time_sec,
						.time_nsec = rec->time_nsec,
						.session = session};
		int created = 0;

		if (j->rc || j->done)
			continue;
		if (brc)
			j->rc = brc;
		else if (rec->op == STK_NAME_CREATE)
			/* The holder's own layout: it may have written by it (checked there). */
			j->rc = stk_meta_store_create_as(m->store, &rec->cred, rec->parent, rec->name,
							 rec->mode, STK_CREATE_EXCL, &rec->layout, pl,
							 &as, &j->res.attr, &created);
		else
			j->rc = stk_meta_store_unlink_ino(m->store, &rec->cred, rec->parent,
							  rec->name, rec->ino, &j->res.attr);
		if (j->rc == 0 && rec->op == STK_NAME_UNLINK)
			j->res.orphaned = orphaned(m, &j->res.attr);
	}
	if (brc)
		return;
	brc = stk_meta_store_batch_end(m->store, 0);
	for (uint32_t i = 0; brc && i < n; i++)
		if (jobs[i].rc == 0)
			jobs[i].rc = brc; /* the commit failed: none of them happened */
}

/* Whether a record before recs[i] creates parent's `name` as inode ino. */
static int made_before(const struct stk_msg_name_rec *recs, uint32_t i, uint64_t parent,
		       const char *name, uint64_t ino)
{
	while (i--)
		if (recs[i].op == STK_NAME_CREATE && recs[i].ino == ino && recs[i].parent == parent &&
		    strcmp(recs[i].name, name) == 0)
			return 1;
	return 0;
}

static int op_names(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_names_req q;
	struct stk_msg_meta_names_resp r;
	struct stk_msg_name_rec *recs = NULL;
	struct stk_meta_placement pl;
	struct name_job *jobs = NULL;
	uint32_t unlinks = 0;
	int rc;

	rc = stk_msg_meta_names_req_dec(&req->payload, &q);
	if (rc == 0 && q.n > STK_NAMES_MAX)
		return -EINVAL;
	if (rc == 0 && q.n &&
	    (!(recs = calloc(q.n, sizeof(*recs))) || !(jobs = calloc(q.n, sizeof(*jobs))))) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; rc == 0 && i < q.n; i++)
		rc = stk_msg_name_rec_dec(&req->payload, &recs[i]);
	rc = decoded(req, rc);
	if (rc)
		goto out;
	/* Whoever waits for this holder's acknowledgement waits for these records. */
	stk_meta_leases_alive(m->leases, req->hdr.origin);
	placement_get(m, &pl);
	/* Storage may have registered since the agent's last refresh (as in create_file). */
	if (pl.nchains == 0 && stk_agent_routing_refresh(m->agent) == 0)
		placement_get(m, &pl);
	for (uint32_t i = 0; i < q.n; i++) {
		struct name_job *j = &jobs[i];

		if ((recs[i].op == STK_NAME_CREATE || recs[i].op == STK_NAME_UNLINK) &&
		    !made_before(recs, i, recs[i].parent, recs[i].name, recs[i].ino) &&
		    names_replayed(m, &recs[i], &j->res)) {
			j->done = 1;
			continue;
		}
		if (recs[i].op == STK_NAME_UNLINK) {
			j->victim = named(m, recs[i].parent, recs[i].name); /* its links change */
			if (j->victim != recs[i].ino &&
			    made_before(recs, i, recs[i].parent, recs[i].name, recs[i].ino))
				j->victim = recs[i].ino; /* new: nobody else has seen it */
			if (j->victim != recs[i].ino) {
				j->rc = -ENOENT; /* checked again in the store's transaction */
				continue;
			}
			unlinks++;
		} else if (recs[i].op != STK_NAME_CREATE) {
			j->rc = -EINVAL;
			continue;
		}
		change_begin(m, req, &j->ch, recs[i].parent, j->victim, 0, 0);
		j->began = 1;
	}
	if (unlinks)
		stk_meta_sessions_hold(m->sessions);
	/* Creates spend the holder's session's inode allowance, if it holds one. */
	names_apply(m, recs, jobs, q.n, &pl,
		    stk_meta_leases_session_of(m->leases, req->hdr.origin));
	if (unlinks)
		stk_meta_sessions_release(m->sessions);
	stk_meta_leases_alive(m->leases, req->hdr.origin);
	for (uint32_t i = 0; i < q.n; i++) {
		struct name_job *j = &jobs[i];

		if (j->began)
			change_end(m, &j->ch);
		if (j->rc == 0 && recs[i].op == STK_NAME_UNLINK && j->res.attr.ino != j->victim)
			changed_late(m, req, j->res.attr.ino);
	}
	memset(&r, 0, sizeof(r));
	r.n = q.n;
	rc = stk_msg_meta_names_resp_enc(&resp->payload, &r);
	for (uint32_t i = 0; rc == 0 && i < q.n; i++) {
		struct stk_msg_name_res *res = &jobs[i].res;

		res->status = stk_status_from_errno(jobs[i].rc);
		if (jobs[i].rc)
			memset(&res->attr, 0, sizeof(res->attr));
		rc = stk_msg_name_res_enc(&resp->payload, res);
	}
out:
	free(recs);
	free(jobs);
	return rc;
}

/*
 * META_ALLOW (msg.h): an inode allowance for the origin holder's session, which
 * must be the request's, else AGAIN (a holder being reset gets none: it is to
 * forget what it holds). Given back (want 0) or taken when the holder goes (holder_dropped).
 */
static int op_allow(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_allow_req q;
	struct stk_msg_meta_allow_resp r;
	int rc;

	rc = decoded(req, stk_msg_meta_allow_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	if (!q.session || q.want > STK_ALLOW_MAX || (!q.want && !q.give))
		return -EINVAL;
	if (stk_meta_leases_session_of(m->leases, req->hdr.origin) != q.session)
		return -EAGAIN; /* not a live holder of that session: none to hold it */
	memset(&r, 0, sizeof(r));
	if (q.give) {
		struct stk_meta_quota qu;

		/* NOENT: dir is gone or in no quota (the client then names the quota root) */
		rc = stk_meta_store_quota_get(m->store, q.dir, &qu);
		if (rc)
			return rc;
		stk_meta_store_quota_disallow(m->store, q.session, qu.qid, q.give);
		r.qid = qu.qid;
	}
	if (q.want) {
		rc = stk_meta_store_quota_allow(m->store, q.session, q.dir, q.want, &r.granted,
						&r.qid);
		if (rc)
			return rc;
	}
	return stk_msg_meta_allow_resp_enc(&resp->payload, &r);
}

/*
 * META_ALLOW_BYTES (msg.h): a byte allowance, as op_allow's of inodes, for the
 * origin holder's session in the quota the inode `dir` (any inode) counts in.
 */
static int op_allow_bytes(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_allow_req q;
	struct stk_msg_meta_allow_resp r;
	int rc;

	rc = decoded(req, stk_msg_meta_allow_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	if (!q.session || q.want > STK_ALLOW_BYTES_MAX || (!q.want && !q.give))
		return -EINVAL;
	if (stk_meta_leases_session_of(m->leases, req->hdr.origin) != q.session)
		return -EAGAIN; /* not a live holder of that session: none to hold it */
	memset(&r, 0, sizeof(r));
	if (q.give) {
		struct stk_meta_quota qu;

		/* NOENT: the inode is gone or in no quota (the client then names the root) */
		rc = stk_meta_store_quota_get(m->store, q.dir, &qu);
		if (rc)
			return rc;
		stk_meta_store_quota_disallow_bytes(m->store, q.session, qu.qid,
						    q.give == UINT32_MAX ? UINT64_MAX : q.give);
		r.qid = qu.qid;
	}
	if (q.want) {
		rc = stk_meta_store_quota_allow_bytes(m->store, q.session, q.dir, q.want,
						      &r.granted, &r.qid);
		if (rc)
			return rc;
	}
	return stk_msg_meta_allow_resp_enc(&resp->payload, &r);
}

/* A lease holder was reset or went: its session's allowances go with it. */
static void holder_dropped(void *ctx, uint64_t session)
{
	stk_meta_store_quota_disallow(ctx, session, 0, UINT32_MAX);
	stk_meta_store_quota_disallow_bytes(ctx, session, 0, UINT64_MAX);
}

static int op_lock(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_lock_req q;
	struct stk_msg_meta_lock_resp r;
	struct stk_lock want, c;
	int rc;

	rc = decoded(req, stk_msg_meta_lock_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	if (q.session == 0 || q.start > q.end ||
	    (q.kind != STK_LOCK_POSIX && q.kind != STK_LOCK_FLOCK) ||
	    (q.type != STK_LOCK_RD && q.type != STK_LOCK_WR && q.type != STK_LOCK_UN) ||
	    (q.test && q.type == STK_LOCK_UN))
		return -EINVAL;
	memset(&want, 0, sizeof(want));
	want.session = q.session;
	want.owner = q.owner;
	want.kind = q.kind;
	want.type = q.type;
	want.start = q.start;
	want.end = q.end;
	want.pid = q.pid;
	memset(&c, 0, sizeof(c));
	rc = stk_meta_sessions_lock(m->sessions, q.ino, &want, q.test, &c);
	if (rc < 0)
		return rc;
	memset(&r, 0, sizeof(r));
	r.type = STK_LOCK_UN;
	if (q.test && rc == 1) {
		r.type = c.type;
		r.start = c.start;
		r.end = c.end;
		r.pid = c.pid;
	}
	return stk_msg_meta_lock_resp_enc(&resp->payload, &r);
}

/*
 * The folder path of quota root ino, for people: found by walking up the parent
 * pointers (stk_meta_store_path_of); "" when it cannot be found.
 */
static void quota_rec_of(struct meta *m, const struct stk_meta_quota *q,
			 struct stk_msg_quota_rec *r)
{
	memset(r, 0, sizeof(*r));
	r->qid = q->qid;
	r->parent = q->parent;
	r->limit_bytes = q->limit_bytes;
	r->limit_inodes = q->limit_inodes;
	r->used_bytes = q->used_bytes;
	r->used_inodes = q->used_inodes;
	r->reserved_bytes = q->reserved_bytes;
	if (stk_meta_store_path_of(m->store, q->qid, r->path, sizeof(r->path)))
		r->path[0] = 0;
}

struct recounted {
	struct meta *m;
	struct stk_msg_quota_rec *recs;
	uint32_t n, cap;
	int err;
};

/* Inside recount's transaction: one quota recounted, kept for the reply. */
static void recounted_one(void *ctx, const struct stk_meta_quota *before,
			  const struct stk_meta_quota *after)
{
	struct recounted *rc = ctx;
	struct stk_msg_quota_rec *r;

	if (rc->n == rc->cap) {
		uint32_t cap = rc->cap ? 2 * rc->cap : 16;
		struct stk_msg_quota_rec *p = realloc(rc->recs, cap * sizeof(*p));

		if (!p || cap > STK_QUOTA_LIST_MAX) {
			free(p == rc->recs ? NULL : p);
			rc->err = -ENOMEM;
			return;
		}
		rc->recs = p;
		rc->cap = cap;
	}
	r = &rc->recs[rc->n++];
	quota_rec_of(rc->m, after, r);
	r->fixed = before->used_bytes != after->used_bytes ||
		   before->used_inodes != after->used_inodes;
	r->old_bytes = before->used_bytes;
	r->old_inodes = before->used_inodes;
	if (r->fixed)
		stk_info("quota recount on %s (%llu): inodes %llu -> %llu, bytes %llu -> %llu",
			 r->path, (unsigned long long)r->qid,
			 (unsigned long long)before->used_inodes,
			 (unsigned long long)after->used_inodes,
			 (unsigned long long)before->used_bytes,
			 (unsigned long long)after->used_bytes);
}

/*
 * META_QUOTA (msg.h): quota administration and reservations. Setting or removing
 * a quota retags inodes other clients may cache (their attr.qid); they see it
 * when their leases on those inodes end (docs/quotas.md, "Limits").
 */
static int op_quota(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_quota_req q;
	struct stk_msg_meta_quota_resp r;
	struct stk_meta_quota one, *list = NULL;
	struct recounted rec = {.m = m};
	size_t n = 0;
	int more = 0, rc;

	rc = decoded(req, stk_msg_meta_quota_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	memset(&r, 0, sizeof(r));
	switch (q.op) {
	case STK_QUOTA_SET:
		rc = stk_meta_store_quota_set(m->store, &q.cred, q.ino, q.limit_bytes,
					      q.limit_inodes, q.flags, &one);
		n = 1;
		if (rc == 0)
			stk_info("quota on folder %llu set: bytes %llu, inodes %llu (0: none)",
				 (unsigned long long)q.ino, (unsigned long long)one.limit_bytes,
				 (unsigned long long)one.limit_inodes);
		break;
	case STK_QUOTA_RM:
		rc = stk_meta_store_quota_rm(m->store, &q.cred, q.ino);
		if (rc == 0)
			stk_info("quota on folder %llu removed", (unsigned long long)q.ino);
		break;
	case STK_QUOTA_GET:
		rc = stk_meta_store_quota_get(m->store, q.ino, &one);
		n = 1;
		break;
	case STK_QUOTA_LIST:
		list = calloc(STK_QUOTA_LIST_MAX, sizeof(*list));
		rc = list ? stk_meta_store_quota_list(m->store, q.ino, list, STK_QUOTA_LIST_MAX,
						      &n, &more)
			  : -ENOMEM;
		break;
	case STK_QUOTA_RECOUNT:
		rc = stk_meta_store_quota_recount(m->store, &q.cred, q.ino, recounted_one, &rec);
		if (rc == 0)
			rc = rec.err;
		break;
	case STK_QUOTA_RESERVE:
		rc = stk_meta_store_quota_reserve(m->store, q.session, q.ino, q.size, q.want,
						  &r.granted);
		break;
	default:
		rc = -EINVAL;
	}
	if (rc)
		goto out;
	r.more = (uint8_t)more;
	r.n = q.op == STK_QUOTA_RECOUNT ? rec.n : (uint32_t)n;
	rc = stk_msg_meta_quota_resp_enc(&resp->payload, &r);
	for (uint32_t i = 0; rc == 0 && i < r.n; i++) {
		struct stk_msg_quota_rec qr;

		if (q.op == STK_QUOTA_RECOUNT)
			qr = rec.recs[i];
		else
			quota_rec_of(m, list ? &list[i] : &one, &qr);
		rc = stk_msg_quota_rec_enc(&resp->payload, &qr);
	}
out:
	free(list);
	free(rec.recs);
	return rc;
}

static int op_repl(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	return stk_meta_repl_handle(m->repl, req, resp);
}

/* ---- stoker fsck (docs/fsck.md) ---- */

struct fsck_out {
	struct stk_msg_fsck_problem *p;
	uint32_t n, max;
	uint64_t *changed; /* inodes and folders a repair changed: their leases go */
	size_t nchanged, capchanged;
};

static void fsck_changed(struct fsck_out *o, uint64_t ino)
{
	if (!ino)
		return;
	if (o->nchanged == o->capchanged) {
		size_t cap = o->capchanged ? 2 * o->capchanged : 64;
		uint64_t *v = realloc(o->changed, cap * sizeof(*v));

		if (!v)
			return; /* leases then run out by themselves (leases.h) */
		o->changed = v;
		o->capchanged = cap;
	}
	o->changed[o->nchanged++] = ino;
}

static int fsck_keep(void *ctx, const struct stk_meta_fsck_problem *p)
{
	struct fsck_out *o = ctx;

	if (p->repaired) {
		fsck_changed(o, p->ino);
		fsck_changed(o, p->parent);
		/* reattached: lost+found may be new in the root */
		if (p->kind == STK_FSCK_KIND_UNREACHED)
			fsck_changed(o, STK_ROOT_INO);
	}
	if (o->n < o->max) {
		struct stk_msg_fsck_problem *q = &o->p[o->n++];

		q->kind = p->kind;
		q->repaired = p->repaired;
		q->ino = p->ino;
		q->parent = p->parent;
		q->expect = p->expect;
		q->found = p->found;
		memcpy(q->name, p->name, sizeof(q->name));
	}
	return 0;
}

static int fsck_check(struct meta *m, const struct stk_msg_meta_fsck_req *q,
		      struct stk_msg_meta_fsck_resp *r, struct stk_rpc_resp *resp)
{
	struct fsck_out o = {.max = STK_MIN(q->max, STK_FSCK_PROBLEMS_MAX)};
	struct stk_meta_fsck_stats fs;
	int rc;

	o.p = o.max ? calloc(o.max, sizeof(*o.p)) : NULL;
	if (o.max && !o.p)
		return -ENOMEM;
	rc = stk_meta_store_fsck(m->store, (q->flags & STK_FSCK_REPAIR) != 0, fsck_keep, &o, &fs);
	if (rc == 0) {
		r->n = o.n;
		r->done = 1;
		r->total = fs.problems;
		r->repaired = fs.repaired;
		r->inodes = fs.inodes;
		r->entries = fs.entries;
		r->dirs = fs.dirs;
		r->files = fs.files;
		r->next_ino = fs.next_ino;
		stk_msg_meta_fsck_resp_enc(&resp->payload, r);
		for (uint32_t i = 0; i < o.n; i++)
			stk_msg_fsck_problem_enc(&resp->payload, &o.p[i]);
		rc = resp->payload.err;
	}
	/* Repairs changed names and attributes that clients may hold leases on. */
	if (o.nchanged)
		stk_meta_leases_changed(m->leases, 0, o.changed, o.nchanged);
	if (rc == 0 && fs.repaired)
		stk_info("fsck from a client: %llu problem(s), %llu repaired",
			 (unsigned long long)fs.problems, (unsigned long long)fs.repaired);
	free(o.changed);
	free(o.p);
	return rc;
}

static int fsck_files(struct meta *m, const struct stk_msg_meta_fsck_req *q,
		      struct stk_msg_meta_fsck_resp *r, struct stk_rpc_resp *resp)
{
	size_t max = STK_MIN(q->max, STK_FSCK_FILES_MAX), n = 0;
	struct stk_meta_file *fl;
	int rc;

	if (max == 0)
		return -EINVAL;
	fl = calloc(max, sizeof(*fl));
	if (!fl)
		return -ENOMEM;
	rc = stk_meta_store_files(m->store, q->from, fl, max, &n);
	if (rc == 0) {
		r->n = (uint32_t)n;
		r->done = n < max;
		r->next = n ? fl[n - 1].attr.ino + 1 : q->from;
		stk_msg_meta_fsck_resp_enc(&resp->payload, r);
		for (size_t i = 0; i < n; i++) {
			struct stk_msg_fsck_file f = {.attr = fl[i].attr, .exact = fl[i].exact,
						      .orphan = fl[i].orphan,
						      .nalloc = fl[i].nalloc};

			stk_msg_fsck_file_enc(&resp->payload, &f);
			for (uint32_t k = 0; k < fl[i].nalloc; k++) {
				struct stk_msg_fsck_range g = {.first = fl[i].alloc[k][0],
							       .end = fl[i].alloc[k][1]};

				stk_msg_fsck_range_enc(&resp->payload, &g);
			}
		}
		rc = resp->payload.err;
	}
	free(fl);
	return rc;
}

static int fsck_purges(struct meta *m, const struct stk_msg_meta_fsck_req *q,
		       struct stk_msg_meta_fsck_resp *r, struct stk_rpc_resp *resp)
{
	size_t max = STK_MIN(q->max, STK_SYNC_LIST_MAX), n = 0;
	struct stk_meta_purge *pl;
	int rc;

	if (max == 0)
		return -EINVAL;
	pl = calloc(max, sizeof(*pl));
	if (!pl)
		return -ENOMEM;
	rc = stk_meta_store_purges(m->store, q->from, pl, max, &n);
	if (rc == 0) {
		r->n = (uint32_t)n;
		r->done = n < max;
		r->next = n ? pl[n - 1].ino + 1 : q->from;
		stk_msg_meta_fsck_resp_enc(&resp->payload, r);
		for (size_t i = 0; i < n; i++)
			stk_put_u64(&resp->payload, pl[i].ino);
		rc = resp->payload.err;
	}
	free(pl);
	return rc;
}

#define FSCK_XREFS_MAX 1024u

/* A page of a cross-shard listing: room for the records q asks (*max of size each). */
static void *fsck_page_alloc(const struct stk_msg_meta_fsck_req *q, size_t size, size_t *max)
{
	*max = STK_MIN(q->max, FSCK_XREFS_MAX);
	return *max ? calloc(*max, size) : NULL;
}

/* The reply's head before a page's n records: done, and where the next page starts. */
static void fsck_page_head(struct stk_msg_meta_fsck_resp *r, struct stk_rpc_resp *resp,
			   size_t n, int done, uint64_t next)
{
	r->n = (uint32_t)n;
	r->done = (uint8_t)done;
	r->next = next;
	stk_msg_meta_fsck_resp_enc(&resp->payload, r);
}

static int fsck_xrefs(struct meta *m, const struct stk_msg_meta_fsck_req *q,
		      const struct stk_msg_fsck_xref *after, struct stk_msg_meta_fsck_resp *r,
		      struct stk_rpc_resp *resp)
{
	size_t max, n = 0;
	struct stk_meta_xref *v = fsck_page_alloc(q, sizeof(*v), &max), a = {0};
	uint64_t next = 0;
	int rc, done = 0;

	if (!v)
		return max ? -ENOMEM : -EINVAL;
	if (q->op == STK_FSCK_XENTRIES || q->op == STK_FSCK_XNAMES) {
		a.parent = after->parent;
		a.hash = after->hash;
		memcpy(a.name, after->name, sizeof(a.name));
		if (q->op == STK_FSCK_XNAMES)
			rc = stk_meta_store_fsck_xnames(m->store, after->parent ? &a : NULL, v, max,
							&n, &done);
		else
			rc = stk_meta_store_fsck_xentries(m->store, after->parent ? &a : NULL, v,
							  max, &n, &done);
	} else {
		rc = stk_meta_store_fsck_xdirs(m->store, q->from, v, max, &n, &next, &done);
	}
	if (rc == 0) {
		fsck_page_head(r, resp, n, done, next);
		for (size_t i = 0; i < n; i++) {
			struct stk_msg_fsck_xref x = {.ino = v[i].ino,
						      .parent = v[i].parent,
						      .hash = v[i].hash,
						      .covered = v[i].covered};

			memcpy(x.name, v[i].name, sizeof(x.name));
			stk_msg_fsck_xref_enc(&resp->payload, &x);
		}
		rc = resp->payload.err;
	}
	free(v);
	return rc;
}

static int fsck_xrecs(struct meta *m, const struct stk_msg_meta_fsck_req *q,
		      struct stk_msg_meta_fsck_resp *r, struct stk_rpc_resp *resp)
{
	size_t max, n = 0;
	struct stk_meta_xrec *v = fsck_page_alloc(q, sizeof(*v), &max);
	uint64_t next = 0;
	int rc, done = 0;

	if (!v)
		return max ? -ENOMEM : -EINVAL;
	rc = stk_meta_store_fsck_xrecs(m->store, q->from, v, max, &n, &next, &done);
	if (rc == 0) {
		fsck_page_head(r, resp, n, done, next);
		for (size_t i = 0; i < n; i++) {
			struct stk_msg_fsck_xrec x = {.kind = (uint8_t)v[i].kind,
						      .covered = v[i].covered,
						      .ino = v[i].ino,
						      .shard = v[i].shard,
						      .id = v[i].id};

			stk_msg_fsck_xrec_enc(&resp->payload, &x);
		}
		rc = resp->payload.err;
	}
	free(v);
	return rc;
}

/* XUNNAME and XRESTORE (msg.h): a record of a name off home dropped or written again. */
static int fsck_xname_fix(struct meta *m, const struct stk_msg_meta_fsck_req *q, uint64_t other,
			  uint64_t id, struct stk_msg_meta_fsck_resp *r, struct stk_rpc_resp *resp)
{
	uint64_t changed[1] = {q->from};
	struct stk_attr a;
	int rc;

	if (other == 0 || other > STK_MAX_SHARDS)
		return -EINVAL;
	if (q->op == STK_FSCK_XUNNAME)
		rc = stk_meta_store_fsck_xunname(m->store, q->from, (uint32_t)other, id, &a);
	else
		rc = stk_meta_store_fsck_xrestore(m->store, q->from, (uint32_t)other, id);
	if (rc)
		return rc;
	/* its link count changed */
	stk_meta_leases_changed(m->leases, 0, changed, 1);
	if (q->op == STK_FSCK_XUNNAME)
		stk_warn("fsck: file %llu counted a name on shard %llu, which that shard does not "
			 "have: its record and link dropped (%u link(s) left)",
			 (unsigned long long)q->from, (unsigned long long)other, a.nlink);
	else
		stk_warn("fsck: file %llu's name off its home: the record here of it written "
			 "again (the other shard: %llu)",
			 (unsigned long long)q->from, (unsigned long long)other);
	return stk_msg_meta_fsck_resp_enc(&resp->payload, r);
}

static int fsck_xdrop(struct meta *m, const struct stk_msg_meta_fsck_req *q, uint64_t ino,
		      struct stk_msg_meta_fsck_resp *r, struct stk_rpc_resp *resp)
{
	struct stk_msg_fsck_xref x = {.ino = ino, .parent = q->from};
	uint64_t changed[1] = {q->from};
	int rc;

	rc = stk_meta_store_fsck_xdrop(m->store, q->from, ino, x.name);
	if (rc)
		return rc;
	/* The folder's name and link count changed: their leases go. */
	stk_meta_leases_changed(m->leases, 0, changed, 1);
	stk_warn("fsck: entry '%s' in folder %llu named folder %llu, which its shard does not "
		 "have: removed",
		 x.name, (unsigned long long)q->from, (unsigned long long)ino);
	r->n = 1;
	r->done = 1;
	stk_msg_meta_fsck_resp_enc(&resp->payload, r);
	stk_msg_fsck_xref_enc(&resp->payload, &x);
	return resp->payload.err;
}

static int fsck_xparent(struct meta *m, const struct stk_msg_meta_fsck_req *q, uint64_t seen,
			uint64_t parent, struct stk_msg_meta_fsck_resp *r,
			struct stk_rpc_resp *resp)
{
	uint64_t changed[1] = {q->from};
	int rc = stk_meta_store_fsck_xparent(m->store, q->from, seen, parent);

	if (rc)
		return rc;
	/* its ".." changed */
	stk_meta_leases_changed(m->leases, 0, changed, 1);
	if (seen != parent)
		stk_warn("fsck: folder %llu pointed at folder %llu as its parent, not at %llu, "
			 "whose entry names it: set",
			 (unsigned long long)q->from, (unsigned long long)seen,
			 (unsigned long long)parent);
	return stk_msg_meta_fsck_resp_enc(&resp->payload, r);
}

static int fsck_adopt(struct meta *m, const struct stk_msg_meta_fsck_req *q, uint64_t seen,
		      struct stk_msg_meta_fsck_resp *r, struct stk_rpc_resp *resp)
{
	struct stk_msg_fsck_xref x = {.ino = q->from};
	uint64_t changed[3] = {STK_ROOT_INO, 0, q->from};
	int rc = stk_meta_store_fsck_adopt(m->store, q->from, seen, &x.parent, x.name);

	if (rc)
		return rc;
	changed[1] = x.parent;
	stk_meta_leases_changed(m->leases, 0, changed, q->from ? 3 : 2);
	if (q->from)
		stk_warn("fsck: folder %llu, reached by no name, reattached as lost+found/%s",
			 (unsigned long long)q->from, x.name);
	r->n = 1;
	r->done = 1;
	stk_msg_meta_fsck_resp_enc(&resp->payload, r);
	stk_msg_fsck_xref_enc(&resp->payload, &x);
	return resp->payload.err;
}

static int fsck_gather(struct meta *m, const struct stk_msg_meta_fsck_req *q,
		       struct stk_rpc_req *req, struct stk_msg_meta_fsck_resp *r,
		       struct stk_rpc_resp *resp)
{
	uint64_t *inos = NULL;
	uint8_t *done = NULL;
	int rc = 0;

	if (q->max == 0 || q->max > STK_FSCK_PROBLEMS_MAX)
		return decoded(req, -EINVAL);
	inos = calloc(q->max, sizeof(*inos));
	done = calloc(q->max, 1);
	if (!inos || !done) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < q->max; i++)
		inos[i] = stk_get_u64(&req->payload);
	rc = decoded(req, req->payload.err ? -EBADMSG : 0);
	if (rc == 0 && q->cred.uid != 0)
		rc = -EPERM;
	if (rc == 0)
		rc = stk_meta_store_fsck_gather(m->store, q->from, inos, q->max, done, &r->next);
	if (rc)
		goto out;
	for (uint32_t i = 0; i < q->max; i++)
		if (done[i])
			inos[r->n++] = inos[i];
	/* their link counts and parents changed */
	if (r->n)
		stk_meta_leases_changed(m->leases, 0, inos, r->n);
	r->done = 1;
	stk_msg_meta_fsck_resp_enc(&resp->payload, r);
	for (uint32_t i = 0; i < r->n; i++)
		stk_put_u64(&resp->payload, inos[i]);
	rc = resp->payload.err;
	if (r->n)
		stk_warn("fsck: %u file(s) reached by no name gathered in folder %llu, for "
			 "lost+found",
			 r->n, (unsigned long long)r->next);
out:
	free(inos);
	free(done);
	return rc;
}

/* META_FSCK (msg.h): root only; the namespace check or a listing for the data check. */
static int op_fsck(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_fsck_req q;
	struct stk_msg_meta_fsck_resp r;
	int rc;

	struct stk_msg_fsck_xref after = {0};
	uint64_t ino = 0, seen = 0;

	rc = stk_msg_meta_fsck_req_dec(&req->payload, &q);
	if (rc == 0 && q.op == STK_FSCK_GATHER) {
		memset(&r, 0, sizeof(r));
		return fsck_gather(m, &q, req, &r, resp);
	}
	if (rc == 0 && (q.op == STK_FSCK_XDROP || q.op == STK_FSCK_XPARENT ||
			q.op == STK_FSCK_ADOPT)) {
		/* XDROP: the inode; XPARENT: seen and the parent; ADOPT: seen */
		if (q.op == STK_FSCK_XPARENT || q.op == STK_FSCK_ADOPT)
			seen = stk_get_u64(&req->payload);
		if (q.op != STK_FSCK_ADOPT)
			ino = stk_get_u64(&req->payload);
		rc = req->payload.err ? -EBADMSG : 0;
	}
	if (rc == 0 && (q.op == STK_FSCK_XUNNAME || q.op == STK_FSCK_XRESTORE)) {
		/* the other shard, then the id */
		seen = stk_get_u64(&req->payload);
		ino = stk_get_u64(&req->payload);
		rc = req->payload.err ? -EBADMSG : 0;
	}
	if (rc == 0 && (q.op == STK_FSCK_XENTRIES || q.op == STK_FSCK_XNAMES))
		rc = stk_msg_fsck_xref_dec(&req->payload, &after);
	rc = decoded(req, rc);
	if (rc)
		return rc;
	if (q.cred.uid != 0)
		return -EPERM;
	memset(&r, 0, sizeof(r));
	switch (q.op) {
	case STK_FSCK_XENTRIES:
	case STK_FSCK_XDIRS:
	case STK_FSCK_XNAMES:
		return fsck_xrefs(m, &q, &after, &r, resp);
	case STK_FSCK_XRECS:
		return fsck_xrecs(m, &q, &r, resp);
	case STK_FSCK_XUNNAME:
	case STK_FSCK_XRESTORE:
		return fsck_xname_fix(m, &q, seen, ino, &r, resp);
	case STK_FSCK_XDROP:
		return fsck_xdrop(m, &q, ino, &r, resp);
	case STK_FSCK_XPARENT:
		return fsck_xparent(m, &q, seen, ino, &r, resp);
	case STK_FSCK_ADOPT:
		return fsck_adopt(m, &q, seen, &r, resp);
	case STK_FSCK_CHECK:
		return fsck_check(m, &q, &r, resp);
	case STK_FSCK_FILES:
		return fsck_files(m, &q, &r, resp);
	case STK_FSCK_PURGES:
		return fsck_purges(m, &q, &r, resp);
	}
	return -EINVAL;
}

/*
 * Handlers by opcode; the opcodes themselves are declared once, in proto/wire.h.
 * Kept out of clang-format, which would pack two entries to a line.
 */
/* clang-format off */
/*
 * META_WITHIN, for storage (a client key's connection is refused it by confine.c):
 * whether ino lies under the folder the path names. A path that names no folder
 * has nothing under it.
 */
static int op_within(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_within_req q;
	struct stk_msg_meta_within_resp r = {0};
	uint64_t top = STK_ROOT_INO;
	int rc;

	rc = decoded(req, stk_msg_meta_within_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	/* on whatever shards the path and ino's parents lie (span.h) */
	rc = stk_meta_span_resolve(m->span, q.subtree, &top, 1);
	if (rc == 0)
		rc = stk_meta_span_within(m->span, q.ino, top, 1);
	else if (rc == -ENOENT || rc == -ENOTDIR)
		rc = 0;
	if (rc < 0)
		return rc;
	r.within = rc == 1;
	return stk_msg_meta_within_resp_enc(&resp->payload, &r);
}

/* META_EPOCH, for storage (refused to a client key's connection by confine.c). */
static int op_epoch(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_epoch_resp r = {.epoch = stk_meta_moves_epoch(m->moves)};
	struct stk_msg_meta_epoch_req q;
	int rc;

	if (req->payload.len == req->payload.off) /* a storage node from before moves */
		return stk_msg_meta_epoch_resp_enc(&resp->payload, &r);
	rc = decoded(req, stk_msg_meta_epoch_req_dec(&req->payload, &q));
	return rc ? rc : stk_meta_moves_enc(m->moves, q.since, &resp->payload);
}

/* META_XSHARD: a step of a cross-shard mkdir or rmdir another shard asks (xshard.h). */
/*
 * META_XSHARD ATTR (msg.h): folder ino's attributes for a lookup of its name on
 * another shard, recalling its delegation unless it is to the asking client
 * (session q->intent), whose lookup at that shard came after it sent here what
 * it answered in the folder.
 */
static int xshard_attr(struct meta *m, const struct stk_msg_meta_xshard_req *q,
		       struct stk_msg_meta_xshard_resp *r)
{
	const struct stk_cred root = {0};
	uint32_t holder = stk_meta_leases_holder_of(m->leases, q->intent);
	int rc;

	memset(r, 0, sizeof(*r));
	if (tracked.on)
		track(m, &q->ino, 1); /* a delegation made meanwhile: read again (meta_run) */
	if (on_loop) {
		if (stk_meta_leases_delegated_elsewhere(m->leases, holder, &q->ino, 1)) {
			on_loop_blocked = 1;
			return -EAGAIN;
		}
	} else {
		stk_meta_leases_recall(m->leases, holder, &q->ino, 1);
	}
	/* Leased before it is read: a change committed after the read finds the lease. */
	if (holder && stk_meta_leases_grant(m->leases, holder, q->ino))
		r->state = STK_XATTR_LEASED;
	rc = stk_meta_store_getattr(m->store, &root, q->ino, &r->attr);
	if (rc)
		r->state = 0;
	return rc;
}

/* Whether a cross-shard mark (pending, dying, renamed here) is on folder ino; 1 when not known. */
static int xmarked(struct meta *m, uint64_t ino)
{
	enum { MARKS = 256 };
	struct stk_meta_xmark *v = calloc(MARKS, sizeof(*v));
	size_t n = 0;
	int rc = 1;

	if (v && stk_meta_store_xmarks(m->store, v, MARKS, &n) == 0 && n < MARKS) {
		rc = 0;
		for (size_t i = 0; i < n && !rc; i++)
			rc = v[i].ino == ino;
	}
	free(v);
	return rc;
}

/*
 * META_XSHARD DELEGATE (msg.h): a folder made here by a mkdir on another shard,
 * delegated as op_mkdir delegates the folders it makes: leased to the origin, read
 * empty under that lease, delegated if nobody else holds it, then read empty (and
 * unmarked: a rmdir's dying mark takes nothing new) once more.
 */
static int xshard_delegate(struct meta *m, struct stk_rpc_req *req,
			   const struct stk_msg_meta_xshard_req *q, struct stk_msg_meta_xshard_resp *r)
{
	struct stk_cred root = {0};
	uint32_t origin = req->hdr.origin;
	struct stk_attr a;
	int rc;

	memset(r, 0, sizeof(*r));
	if (!origin || !stk_meta_leases_grant(m->leases, origin, q->ino))
		return 0;
	rc = stk_meta_store_getattr(m->store, &root, q->ino, &a);
	if (rc)
		return rc;
	if (!S_ISDIR(a.mode))
		return -ENOTDIR;
	r->attr = a;
	r->state = STK_XDELEG_LEASED;
	if (!dir_empty(m, a.ino))
		return 0;
	r->state |= STK_XDELEG_EMPTY;
	/* Its creates are answered by the client before meta checks them: only for one
	 * who may make names in it. */
	if (q->uid != 0 && (q->uid != a.uid || (a.mode & (S_IWUSR | S_IXUSR)) !=
						       (S_IWUSR | S_IXUSR)))
		return 0;
	if (xmarked(m, a.ino) || !stk_meta_leases_delegate(m->leases, origin, a.ino))
		return 0;
	if (dir_empty(m, a.ino) && !xmarked(m, a.ino))
		r->state |= STK_XDELEG_DELEGATED;
	else
		stk_meta_leases_undelegate(m->leases, a.ino);
	return 0;
}

static int op_xshard(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_xshard_req q;
	struct stk_msg_meta_xshard_resp r;
	int rc;

	rc = decoded(req, stk_msg_meta_xshard_req_dec(&req->payload, &q));
	if (rc)
		return rc;
	if (q.op == STK_XSHARD_UP) { /* a walk up for a client key's subtree (span.h) */
		rc = stk_meta_span_up(m->span, q.ino, q.parent, &r);
	} else if (q.op == STK_XSHARD_DELEGATE) {
		rc = xshard_delegate(m, req, &q, &r);
	} else if (q.op == STK_XSHARD_ATTR) {
		rc = xshard_attr(m, &q, &r);
		if (rc == -EAGAIN && on_loop_blocked)
			return rc; /* started afresh on a worker */
	} else if (q.op == STK_XSHARD_DYING) {
		struct change ch;

		/* whether it is empty is its names' business: a delegation of it is recalled */
		change_begin(m, req, &ch, q.ino, 0, 0, 0);
		rc = stk_meta_xshard_serve(m->xshard, &q, &r);
		change_end(m, &ch);
	} else if (q.op == STK_XSHARD_RENAME || q.op == STK_XSHARD_RELEASE ||
		   q.op == STK_XSHARD_LINK || q.op == STK_XSHARD_FMOVE || q.op == STK_XSHARD_FPTR) {
		struct change ch;

		/* a name here changes (the folder, what it named), or a file's links, or
		 * a folder's ".." (a folder moved across shards) */
		if (q.op == STK_XSHARD_RENAME || q.op == STK_XSHARD_FMOVE)
			change_begin(m, req, &ch, q.parent, named(m, q.parent, q.name), q.ino, 0);
		else
			change_begin(m, req, &ch, q.ino, 0, 0, 0);
		rc = stk_meta_xshard_serve(m->xshard, &q, &r);
		change_end(m, &ch);
	} else {
		rc = stk_meta_xshard_serve(m->xshard, &q, &r);
	}
	if (rc == 0)
		rc = stk_msg_meta_xshard_resp_enc(&resp->payload, &r);
	if (rc == 0 && q.op == STK_XSHARD_COUNT) {
		/* COUNT's reply ends with the releases waiting (msg.h); older readers stop before */
		struct stk_meta_xrelease *v = calloc(XSHARD_COUNT_MAX, sizeof(*v));
		size_t n = 0;

		rc = v ? stk_meta_store_xreleases(m->store, v, XSHARD_COUNT_MAX, &n) : -ENOMEM;
		if (rc == 0) {
			stk_put_u32(&resp->payload, (uint32_t)n);
			rc = resp->payload.err;
		}
		free(v);
	}
	return rc;
}

static const meta_op_fn meta_ops[] = {
	[STK_OP_META_XSHARD] = op_xshard,
	[STK_OP_META_WITHIN] = op_within,
	[STK_OP_META_EPOCH] = op_epoch,
	[STK_OP_META_LOOKUP] = op_lookup,
	[STK_OP_META_GETATTR] = op_getattr,
	[STK_OP_META_SETATTR] = op_setattr,
	[STK_OP_META_CREATE] = op_create,
	[STK_OP_META_MKDIR] = op_mkdir,
	[STK_OP_META_UNLINK] = op_unlink,
	[STK_OP_META_RMDIR] = op_rmdir,
	[STK_OP_META_RENAME] = op_rename,
	[STK_OP_META_LINK] = op_link,
	[STK_OP_META_SYMLINK] = op_symlink,
	[STK_OP_META_MKNOD] = op_mknod,
	[STK_OP_META_READLINK] = op_readlink,
	[STK_OP_META_READDIR] = op_readdir,
	[STK_OP_META_STATFS] = op_statfs,
	[STK_OP_META_EXTEND] = op_extend,
	[STK_OP_META_SYNC] = op_sync,
	[STK_OP_META_SETXATTR] = op_setxattr,
	[STK_OP_META_GETXATTR] = op_getxattr,
	[STK_OP_META_LISTXATTR] = op_listxattr,
	[STK_OP_META_REMOVEXATTR] = op_removexattr,
	[STK_OP_META_SESSION] = op_session,
	[STK_OP_META_SESSION_END] = op_session_end,
	[STK_OP_META_OPEN] = op_open,
	[STK_OP_META_CLOSE] = op_close,
	[STK_OP_META_LOCK] = op_lock,
	[STK_OP_META_CLOSES] = op_closes,
	[STK_OP_META_WATCH] = op_watch,
	[STK_OP_META_LOOKUP_CACHE] = op_lookup_cache,
	[STK_OP_META_GETATTRS] = op_getattrs,
	[STK_OP_META_LOOKUPS] = op_lookups,
	[STK_OP_META_INOS] = op_inos,
	[STK_OP_META_NAMES] = op_names,
	[STK_OP_META_QUOTA] = op_quota,
	[STK_OP_META_ALLOW] = op_allow,
	[STK_OP_META_ALLOW_BYTES] = op_allow_bytes,
	[STK_OP_META_REPL] = op_repl,
	[STK_OP_META_FSCK] = op_fsck,
};
/* clang-format on */

/* Counts an answered request per client. Sizes as net.c counts them: a failed
 * request is answered with a bare header. */
static void meta_count(struct meta *m, const struct stk_rpc_req *req,
		       const struct stk_rpc_resp *resp, int rc)
{
	stk_metrics_ops_client(m->rpc_metrics, req->peer,
			       STK_FRAME_HDR_LEN + (uint64_t)req->hdr.payload_len + req->bulk_len,
			       STK_FRAME_HDR_LEN +
				   (rc ? 0 : (uint64_t)resp->payload.len + resp->bulk_len));
}

/* A read that recalls, then reads: the ones meta_run makes again when a folder it
 * read was delegated in between. */
static int is_read(uint16_t opcode)
{
	switch (opcode) {
	case STK_OP_META_LOOKUP:
	case STK_OP_META_LOOKUP_CACHE:
	case STK_OP_META_GETATTR:
	case STK_OP_META_GETATTRS:
	case STK_OP_META_LOOKUPS:
	case STK_OP_META_READDIR:
	case STK_OP_META_GETXATTR:
	case STK_OP_META_LISTXATTR:
		return 1;
	}
	return 0;
}

#define READ_AGAIN_MAX 8

static int meta_serve(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp);

/*
 * Vouchers (wire.h STK_FRAME_VOUCH, docs/security.md "Vouchers"). A reply to a
 * subtree client key that names a regular file under its subtree (LOOKUP,
 * LOOKUP_CACHE, LOOKUPS, GETATTR, OPEN, CREATE), or the inode numbers
 * it reserved for its creates (INOS), carries meta's voucher for them, so that
 * storage serves their chunks without asking META_WITHIN. The file is checked as
 * META_WITHIN checks it (by the folder it was made in or last renamed into),
 * after the epoch is read: a rename between the two moves the epoch past the
 * voucher's (moves.h says which renames end which vouchers).
 */
#define VOUCH_TTL_MS 60000ull

/* One voucher for [ino, ino + count) onto the reply; 0 or -ENOSPC (no room). */
static int vouch_put(struct meta *m, const struct stk_auth_client *c, uint64_t epoch,
		     uint64_t ino, uint64_t count, struct stk_wbuf *w)
{
	struct stk_auth_vouch v = {
	    .ino = ino, .count = count, .expires_ms = stk_wall_ms() + VOUCH_TTL_MS, .epoch = epoch};
	struct stk_msg_vouch_rec rec;

	if (stk_auth_vouch_sign(m->vouch_key, c, &v))
		return -EIO;
	rec.ino = v.ino;
	rec.count = v.count;
	rec.expires_ms = v.expires_ms;
	rec.epoch = v.epoch;
	memcpy(rec.mac, v.mac, sizeof(rec.mac));
	stk_msg_vouch_rec_enc(w, &rec);
	return w->err ? -ENOSPC : 0;
}

/* 1 when a is a regular file under the folder top (as META_WITHIN tells), else 0. */
static int vouchable(struct meta *m, const struct stk_attr *a, uint64_t top)
{
	return S_ISREG(a->mode) && a->ino && stk_meta_store_within(m->store, a->ino, top) == 1;
}

static void vouch_append(struct meta *m, const struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	const struct stk_auth_client *c = req->client;
	struct stk_wbuf *w = &resp->payload;
	size_t at = w->len;
	struct stk_rbuf r;
	struct stk_attr a = {0};
	uint64_t top, epoch;
	unsigned n = 0;

	/*
	 * Storage learns the epoch and moves of shard 1's meta alone: another shard's
	 * vouchers would be judged by a log that is not theirs (docs/security.md).
	 */
	if (!m->vouching || !c || strcmp(c->subtree, "/") == 0 || resp->bulk_len ||
	    resp->frame_flags || w->err || stk_meta_store_shard(m->store) != 1)
		return;
	/* read first: a rename from here on moves it past the vouchers below */
	epoch = stk_meta_moves_epoch(m->moves);
	stk_rbuf_init(&r, w->p, w->len);
	switch (req->hdr.opcode) {
	case STK_OP_META_LOOKUP:
	case STK_OP_META_GETATTR:
	case STK_OP_META_OPEN: {
		struct stk_msg_meta_attr_resp q;

		if (stk_msg_meta_attr_resp_dec(&r, &q))
			return;
		a = q.attr;
		break;
	}
	case STK_OP_META_LOOKUP_CACHE: {
		struct stk_msg_meta_lookup_cache_resp q;

		if (stk_msg_meta_lookup_cache_resp_dec(&r, &q) || !q.found)
			return;
		a = q.attr;
		break;
	}
	case STK_OP_META_CREATE: {
		struct stk_msg_meta_create_resp q;

		if (stk_msg_meta_create_resp_dec(&r, &q))
			return;
		a = q.attr;
		break;
	}
	case STK_OP_META_INOS: {
		struct stk_msg_meta_inos_resp q;

		/* numbers no other file will get: whatever the client makes with them is
		 * made where confine.c lets it, under its subtree */
		if (stk_msg_meta_inos_resp_dec(&r, &q) || !q.count ||
		    vouch_put(m, c, epoch, q.first, q.count, w))
			goto undo;
		n = 1;
		goto done;
	}
	case STK_OP_META_LOOKUPS: {
		struct stk_msg_meta_lookups_resp q;
		struct stk_msg_attr_rec rec;

		if (stk_msg_meta_lookups_resp_dec(&r, &q) || q.n > STK_VOUCH_MAX ||
		    stk_meta_store_resolve(m->store, c->subtree, &top))
			return;
		for (uint32_t i = 0; i < q.n; i++) {
			if (stk_msg_attr_rec_dec(&r, &rec))
				goto undo;
			if (rec.status == STK_ST_OK && vouchable(m, &rec.attr, top)) {
				if (vouch_put(m, c, epoch, rec.attr.ino, 1, w))
					goto undo;
				n++;
			}
		}
		goto done;
	}
	default:
		return;
	}
	if (stk_meta_store_resolve(m->store, c->subtree, &top) || !vouchable(m, &a, top))
		return;
	if (vouch_put(m, c, epoch, a.ino, 1, w))
		goto undo;
	n = 1;
done:
	if (!n)
		return;
	stk_put_u16(w, (uint16_t)n);
	if (w->err)
		goto undo;
	resp->frame_flags |= STK_FRAME_VOUCH;
	return;
undo:
	/* no room (or a reply not as expected): it goes without them, storage asks meta */
	w->len = at;
	w->err = 0;
}

/*
 * 0 when this shard serves what the request names, -EREMCHG (NOT_LEADER) when
 * another shard does (a rename or hard link between two shards is op_rename's and
 * op_link's). A request too short to say is left to its handler, which refuses it.
 */
static int wrong_shard(struct meta *m, uint16_t opcode, const struct stk_rbuf *payload)
{
	unsigned mine = stk_meta_store_shard(m->store);
	uint64_t ino, other;

	if (stk_msg_meta_route(opcode, payload->p + payload->off, payload->len - payload->off,
			       &ino, &other) != 1)
		return 0;
	if (stk_ino_shard(ino) != mine)
		return -EREMCHG;
	if (opcode == STK_OP_META_RENAME || opcode == STK_OP_META_LINK)
		return 0; /* across shards: op_rename's and op_link's (a file's, xshard.h) */
	return other && stk_ino_shard(other) != mine ? -EXDEV : 0;
}

static int meta_run(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct meta *m = ctx;
	uint16_t opcode = req->hdr.opcode;
	void *copy = NULL;
	int rc;

	if (opcode >= STK_ARRAY_SIZE(meta_ops) || !meta_ops[opcode]) {
		stk_debug("opcode %u (%s) from %s: not served here", opcode,
			  stk_opcode_name(opcode), req->peer);
		return -ENOSYS;
	}
	/* A follower (or a leader cut off from mgmtd) serves no client: NOT_LEADER. */
	if (opcode != STK_OP_META_REPL && !stk_meta_repl_serving(m->repl))
		return -EREMCHG;
	/*
	 * Each shard serves the requests on its own inodes (docs/meta-shards.md):
	 * one about another shard's (a client with an old routing table, or one
	 * that knows no shards) is answered NOT_LEADER, so that its sender asks
	 * the routing table again.
	 */
	if (opcode != STK_OP_META_REPL) {
		rc = wrong_shard(m, opcode, &req->payload);
		if (rc)
			return rc;
	}
	/* a client key's request, checked and rewritten by its policy (confine.h) */
	rc = stk_meta_confine(m->store, m->span, !on_loop, req, resp, &copy);
	if (rc == -EWOULDBLOCK) {
		on_loop_blocked = 1; /* another shard must be asked: on a worker */
		return -EAGAIN;
	}
	if (rc == 0) {
		rc = meta_serve(m, req, resp);
		if (rc == 0 && req->client)
			vouch_append(m, req, resp);
	} else {
		stk_debug("%s from %s: %s", stk_opcode_name(opcode), req->peer, strerror(-rc));
	}
	free(copy);
	return rc;
}

static int meta_serve(struct meta *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	uint16_t opcode = req->hdr.opcode;
	struct stk_rbuf payload = req->payload;
	size_t at = resp->payload.len;
	int rc;

	if (!is_read(opcode)) {
		rc = meta_ops[opcode](m, req, resp);
		/* the store turned follower's under this request: it never reached it */
		if (rc == -EROFS && !stk_meta_repl_serving(m->repl))
			rc = -EREMCHG;
		goto out;
	}
	/*
	 * A folder delegated after the read's recall and before its read may hold
	 * creates or unlinks its holder answered already: read again, recalling first
	 * (on a loop, a worker does). Bounded: past that, delegations of the folders read
	 * are being made without pause, and the last read stands.
	 */
	for (int tries = 0;; tries++) {
		tracked.on = 1;
		tracked.n = 0;
		tracked.all = 0;
		rc = meta_ops[opcode](m, req, resp);
		tracked.on = 0;
		if (!track_moved(m))
			break;
		if (on_loop) {
			on_loop_blocked = 1;
			break;
		}
		if (tries == READ_AGAIN_MAX)
			break;
		req->payload = payload;
		resp->payload.len = at;
		resp->payload.err = 0;
	}
out:
	stk_debug("%s from %s: %s", stk_opcode_name(opcode), req->peer, rc ? strerror(-rc) : "ok");
	return rc;
}

/* A reply that waits for the followers, away from its worker (meta_handle). */
struct held_reply {
	struct stk_rpc_pending *p;
	int rc;
	size_t len;
	uint8_t payload[];
};

/* The followers hold the change (rc 0), or this node leads no more: the reply goes. */
static void held_reply_send(void *arg, int wrc)
{
	struct held_reply *h = arg;
	int rc = wrc && h->rc == 0 ? wrc : h->rc;

	stk_rpc_pending_answer(h->p, rc, h->payload, rc ? 0 : h->len);
	free(h);
}

/*
 * The reply of a request whose change seq is not yet on every follower leaves the
 * worker: the replication thread that hears the last follower's acknowledgement
 * sends it (repl.h, stk_meta_repl_wait_async), so the worker goes on at once and
 * no thread sleeps per request. 1 when the reply was taken so (the handler returns
 * STK_RPC_PENDING), 0 when the caller must wait itself.
 */
static int reply_when_held(struct meta *m, struct stk_rpc_resp *resp, uint64_t seq, int rc)
{
	struct held_reply *h;
	int qrc;

	/* a reply with bulk data points into the request's buffers: it waits here */
	if (resp->bulk_len || resp->frame_flags || resp->payload.err)
		return 0;
	h = malloc(sizeof(*h) + resp->payload.len);
	if (!h)
		return 0;
	h->rc = rc;
	h->len = resp->payload.len;
	memcpy(h->payload, resp->payload.p, h->len);
	h->p = stk_rpc_pending_take(resp);
	qrc = stk_meta_repl_wait_async(m->repl, seq, held_reply_send, h);
	if (qrc == 1)
		return 1;
	if (qrc == -EAGAIN || qrc == -ENOMEM) /* closed: wait on this worker */
		qrc = stk_meta_repl_wait(m->repl, seq);
	held_reply_send(h, qrc);
	return 1;
}

/*
 * A request that changed the store is answered once every follower holds the
 * change (repl.h): the reply waits, the store does not, so concurrent requests
 * share both the commit and the round trip to the followers.
 */
static int meta_handle(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct meta *m = ctx;
	uint64_t seq;
	int rc, wrc;

	stk_meta_store_thread_seq(1);
	rc = meta_run(ctx, req, resp);
	seq = stk_meta_store_thread_seq(1);
	if (seq) {
		meta_count(ctx, req, resp, rc);
		if (reply_when_held(m, resp, seq, rc))
			return STK_RPC_PENDING;
		wrc = stk_meta_repl_wait(m->repl, seq);
		if (wrc && rc == 0)
			rc = wrc; /* not acknowledged: the client asks the new leader */
		return rc;
	}
	meta_count(ctx, req, resp, rc);
	return rc;
}

/*
 * Reads answered on the event loop that read them (net.h, stk_server_loop_ops):
 * lookups, attributes, links and xattrs read the store (an LMDB read transaction,
 * which never waits for a writer) and answer at once, with no hand-off to a worker.
 * What would wait goes to a worker as before: a read of a folder delegated to
 * another client (the recall waits for that client), and every change (a write
 * transaction, and the acknowledgements of the leases it revokes). The store's map
 * is expected to be in memory: a loop that faults a page of it in waits for the
 * disk meanwhile. STOKER_LOOP_READS=0 turns this off.
 */
static int meta_loop_handle(void *ctx, void *state, struct stk_rpc_req *req,
			    struct stk_rpc_resp *resp, struct stk_rpc_pending *p)
{
	uint16_t opcode = req->hdr.opcode;
	int rc;

	switch (opcode) {
	case STK_OP_META_LOOKUP:
	case STK_OP_META_LOOKUP_CACHE:
	case STK_OP_META_GETATTR:
	case STK_OP_META_GETATTRS:
	case STK_OP_META_LOOKUPS:
	case STK_OP_META_READLINK:
	case STK_OP_META_GETXATTR:
	case STK_OP_META_LISTXATTR:
		break;
	case STK_OP_META_XSHARD:
		/*
		 * A walk up for another shard (span.h) reads this store alone: on the
		 * loop, so that shards' workers asking each other never wait on a worker
		 */
		if (req->payload.len > req->payload.off &&
		    req->payload.p[req->payload.off] == STK_XSHARD_UP)
			break;
		return STK_RPC_TO_WORKER;
	default:
		return STK_RPC_TO_WORKER;
	}
	on_loop = 1;
	on_loop_blocked = 0;
	rc = meta_run(ctx, req, resp);
	on_loop = 0;
	if (on_loop_blocked)
		return STK_RPC_TO_WORKER;
	meta_count(ctx, req, resp, rc);
	return rc;
}

static int meta_loop_attach(void *ctx, unsigned loop, void **state, int *fd)
{
	*state = ctx; /* nothing of its own: the store and the leases are shared */
	*fd = -1;
	return 0;
}

static void meta_loop_detach(void *ctx, void *state)
{
}

static const struct stk_server_loop_ops meta_loop_ops = {
	.attach = meta_loop_attach,
	.handle = meta_loop_handle,
	.detach = meta_loop_detach,
};

/* ---- the daemon ---- */

/* The node id this meta node had before, from dir/node.id; 0 for a new node. */
static uint32_t node_id_load(const char *dir)
{
	char path[PATH_MAX], buf[32];
	uint64_t v;
	long n;
	int fd;

	if (snprintf(path, sizeof(path), "%s/node.id", dir) >= (int)sizeof(path))
		return 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = stk_read_full(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		n = 0;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		n--;
	buf[n] = 0;
	if (stk_parse_u64(buf, &v) || v == 0 || v > UINT32_MAX) {
		stk_warn("ignoring malformed %s", path);
		return 0;
	}
	return (uint32_t)v;
}

/* Writes dir/node.id atomically: a crash leaves the old file or the new one. */
static int node_id_save(const char *dir, uint32_t id)
{
	char path[PATH_MAX], tmp[PATH_MAX], buf[16];
	int fd, len, rc;

	if (snprintf(path, sizeof(path), "%s/node.id", dir) >= (int)sizeof(path) ||
	    snprintf(tmp, sizeof(tmp), "%s/node.id.tmp", dir) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	len = snprintf(buf, sizeof(buf), "%u\n", id);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	rc = stk_write_all(fd, buf, (size_t)len);
	if (rc == 0 && fsync(fd) < 0)
		rc = -errno;
	close(fd);
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc)
		unlink(tmp);
	return rc;
}

static void *syncer_main(void *arg)
{
	struct meta *m = arg;

	while (!stk_daemon_sleep_ms(SYNC_INTERVAL_MS))
		stk_meta_store_sync(m->store);
	return NULL;
}

static void server_opts(struct meta *m, const char *listen, struct stk_server_opts *so)
{
	memset(so, 0, sizeof(*so));
	so->size = sizeof(*so);
	so->listen = listen;
	so->handler = meta_handle;
	so->loop_ops = &meta_loop_ops;
	so->ctx = m;
	/*
	 * A change may wait for cache holders' acknowledgements, which come as requests
	 * (META_WATCH, META_NAMES) and a long poll holds its worker until it answers:
	 * the pool grows while requests wait, as far as there could be connections.
	 */
	so->workers = 16;
	so->max_workers = 1024;
}

static int agent_open(struct meta *m, const struct stk_meta_opts *opts, const char *dir,
		      const char *addr)
{
	char mine[STK_NS_ID_STR], theirs[STK_NS_ID_STR];
	struct stk_agent_opts ao;
	struct stk_ns_id shard_ns;
	uint32_t node_id = 0;
	int rc;

	memset(&ao, 0, sizeof(ao));
	ao.size = sizeof(ao);
	ao.mgmtd = opts->mgmtd;
	ao.role = STK_ROLE_META;
	ao.addr = addr;
	ao.node_id = node_id_load(dir);
	ao.host_id = opts->host_id;
	stk_meta_store_ns_id(m->store, &ao.ns);
	ao.state = stk_meta_repl_routing;
	ao.meta_pos = stk_meta_repl_pos;
	ao.ctx = m->repl;
	ao.shard = opts->shard ? opts->shard : 1;
	rc = stk_agent_start(&ao, &m->agent, &node_id, NULL, 0);
	if (rc) {
		if (rc != -EINTR)
			stk_error("cannot join the cluster through mgmtd at %s: %s", opts->mgmtd,
				  strerror(-rc));
		return rc;
	}
	m->node_id = node_id;
	if (node_id != ao.node_id) {
		rc = node_id_save(dir, node_id);
		if (rc)
			stk_warn("cannot save the node id in %s: %s", dir, strerror(-rc));
	}
	if (stk_agent_refused(m->agent, &shard_ns)) {
		/*
		 * Exit rather than wait: a store's identity never changes, so waiting could
		 * only end by someone moving the right store here, and a daemon that stays
		 * up looks healthy to whoever started it. The node id is kept, so starting
		 * it again names the same refused node in `stoker status`.
		 */
		stk_error("mgmtd refused this meta node (node %u) for shard %u: the cluster has "
			  "no such shard (mgmtd --meta-shards), or its store in %s is namespace "
			  "%s, but shard %u is namespace %s. It serves nothing; start meta on "
			  "shard %u's data folder, or this folder with its own cluster",
			  node_id, ao.shard, dir, stk_ns_id_str(&ao.ns, mine), ao.shard,
			  stk_ns_id_str(&shard_ns, theirs), ao.shard);
		return -EPERM;
	}
	stk_info("serving namespace %s on %s as node %u", stk_ns_id_str(&ao.ns, mine), addr,
		 node_id);
	return 0;
}

static int check_opts(const struct stk_meta_opts *opts)
{
	struct stk_layout l = {.stripe = 1, .nchains = 1};

	if (!opts || opts->size < sizeof(*opts) || !opts->listen || !opts->mgmtd || !opts->data_dir)
		return -EINVAL;
	l.chunk_size = opts->default_chunk_size ? opts->default_chunk_size : STK_DEFAULT_CHUNK_SIZE;
	if (stk_layout_check(&l)) {
		stk_error("chunk size %u is not a power of two from 64 KiB to 64 MiB",
			  opts->default_chunk_size);
		return -EINVAL;
	}
	if (opts->default_stripe > STK_MAX_STRIPE) {
		stk_error("stripe %u is over the limit of %u", opts->default_stripe,
			  STK_MAX_STRIPE);
		return -EINVAL;
	}
	return 0;
}

/* stk_daemon_run's hooks. */

static int meta_metrics(void *ctx, struct stk_daemon *d)
{
	struct meta *m = ctx;

	int rc;

	m->rpc_metrics = stk_daemon_rpc_metrics(d);
	rc = leases_metrics(m);
	return rc ? rc : purge_metrics(m);
}

static void meta_metrics_stop(void *ctx)
{
	stk_metrics_collector_remove(collect_leases, ctx);
	stk_metrics_collector_remove(collect_quotas, ctx);
	stk_metrics_collector_remove(collect_purge, ctx);
	free(((struct meta *)ctx)->quota_series);
	((struct meta *)ctx)->quota_series = NULL;
}

/* The session reaper, once: when this node first serves. */
static int sessions_start(struct meta *m)
{
	if (__atomic_exchange_n(&m->sessions_started, 1, __ATOMIC_ACQ_REL))
		return 0;
	return stk_meta_sessions_start(m->sessions, m->agent);
}

static int may_reap(void *ctx)
{
	return stk_meta_repl_serving(((struct meta *)ctx)->repl);
}

/*
 * The purger's gate (purge.h): only the serving node sends removals (a follower
 * never does; a new leader drains the purge table it got from its leader), and
 * only once every follower holds the store as it is now, so the purges just read
 * included: a freeing that a failover could still lose must not remove a file's
 * chunks, which the next leader would then serve without them.
 */
static int may_purge(void *ctx)
{
	struct meta *m = ctx;
	uint64_t seq;

	if (!stk_meta_repl_serving(m->repl))
		return 0;
	stk_meta_store_repl_pos(m->store, NULL, &seq);
	/* bounded: the purger is stopped at shutdown, and retries a second later */
	return stk_meta_repl_wait_ms(m->repl, seq, 1000) == 0 && stk_meta_repl_serving(m->repl);
}

/*
 * This node leads the shard now (repl.h). After a failover, clients of the leader
 * before may trust what it told them for a lease: changes wait that out, as after
 * a restart; and the reaper starts here, on the leader only.
 */
static void on_promoted(void *ctx, int failover)
{
	struct meta *m = ctx;
	int rc;

	/*
	 * An epoch no leader before used (they count up from their start, at most one
	 * a rename): the vouchers they gave are worth nothing here (docs/security.md).
	 */
	stk_meta_moves_restart(m->moves, stk_wall_ms() << 16);
	if (failover) {
		/* counted from the old leader's last heartbeat, not from now (leases.h) */
		unsigned ms =
		    stk_meta_leases_failover_ms(m->agent ? stk_agent_timeout_ms(m->agent) : 0);

		stk_meta_leases_grace_ms(m->leases, ms);
		stk_info("meta: leads after a failover: changes wait %u ms for what clients of "
			 "the leader before may still trust (docs/leases.md)",
			 ms);
	}
	if (m->agent) {
		rc = sessions_start(m);
		if (rc)
			stk_error("meta: cannot start the session reaper: %s", strerror(-rc));
	}
}

/*
 * Joins the cluster, then starts replication, the session reaper (on the leader),
 * the purger (which sends only from the leader) and the syncer.
 */
static int meta_start(void *ctx, struct stk_daemon *d)
{
	struct meta *m = ctx;
	int rc;

	rc = agent_open(m, m->opts, m->dir, stk_daemon_addr(d));
	if (rc)
		return rc;
	stk_meta_sessions_set_gate(m->sessions, may_reap, m);
	rc = stk_meta_repl_start(m->repl, m->agent, m->node_id, m->rpc_metrics != NULL);
	if (rc == 0)
		rc = stk_meta_xshard_start(m->xshard, m->agent);
	if (rc)
		return rc;
	if (stk_meta_repl_role(m->repl) == STK_META_ROLE_OFF)
		rc = sessions_start(m);
	if (rc)
		return rc;
	rc = stk_meta_purger_start(m->store, m->agent, may_purge, m, &m->purger);
	if (rc)
		return rc;
	rc = -pthread_create(&m->syncer, NULL, syncer_main, m);
	if (rc)
		return rc;
	m->syncing = 1;
	return 0;
}

static void meta_stop(void *ctx)
{
	struct meta *m = ctx;

	/* the replies that wait for the followers go before the server does */
	stk_meta_repl_close_async(m->repl);
	if (!m->syncing)
		return;
	stk_daemon_request_stop(); /* also when the server failed: the syncer must end */
	pthread_join(m->syncer, NULL);
}

int stk_meta_run(const struct stk_meta_opts *opts)
{
	struct stk_meta_store_opts so;
	struct stk_server_opts sopts;
	struct stk_daemon_spec spec;
	struct meta m;
	char dir[PATH_MAX];
	int rc;

	stk_daemon_init("meta");
	rc = check_opts(opts);
	if (rc)
		return rc;
	memset(&m, 0, sizeof(m));
	m.chunk_size = opts->default_chunk_size ? opts->default_chunk_size : STK_DEFAULT_CHUNK_SIZE;
	m.stripe = opts->default_stripe;
	m.opts = opts;
	m.dir = dir;
	{
		uint8_t key[STK_AUTH_KEY_MAX];
		size_t klen = stk_daemon_key(key);

		m.vouching = klen && stk_auth_vouch_key(key, klen, m.vouch_key) == 0;
		memset(key, 0, sizeof(key));
	}
	if (snprintf(dir, sizeof(dir), "%s/meta", opts->data_dir) >= (int)sizeof(dir))
		return -ENAMETOOLONG;
	memset(&so, 0, sizeof(so));
	so.size = sizeof(so);
	so.dir = dir;
	so.map_size = opts->map_size;
	so.shard = opts->shard;
	rc = stk_meta_store_open(&so, &m.store);
	if (rc)
		return rc;
	rc = stk_meta_sessions_create(m.store, 0, &m.sessions);
	/* another epoch on every start, so that no voucher outlives this process */
	if (rc == 0)
		rc = stk_meta_moves_create(stk_wall_ms() << 16, &m.moves);
	if (rc == 0)
		rc = stk_meta_leases_create(&m.leases);
	if (rc == 0)
		stk_meta_leases_on_drop(m.leases, holder_dropped, m.store);
	if (rc == 0)
		rc = stk_meta_repl_create(m.store, on_promoted, &m, &m.repl);
	if (rc == 0)
		rc = stk_meta_xshard_create(m.store, m.repl, dir, &m.xshard);
	if (rc == 0)
		stk_meta_xshard_leases(m.xshard, m.leases);
	if (rc == 0)
		rc = stk_meta_span_create(m.store, m.xshard, &m.span);
	if (rc)
		goto out;
	/* Served before: clients cut off from the meta before may trust what it said. */
	if (node_id_load(dir)) {
		stk_meta_leases_grace(m.leases);
		stk_info("meta: changes wait %u ms for what clients of the meta before may still "
			 "trust (docs/leases.md)",
			 STK_LEASE_VALID_MS + STK_LEASE_MARGIN_MS);
	}

	server_opts(&m, opts->listen, &sopts);
	memset(&spec, 0, sizeof(spec));
	spec.size = sizeof(spec);
	spec.role = "meta";
	spec.server = &sopts;
	spec.metrics_listen = opts->metrics_listen;
	spec.rpc_lo = 32;
	spec.rpc_hi = 63;
	spec.quiet_stop = 1; /* "stopped", below, once the store is closed */
	spec.ctx = &m;
	spec.metrics = meta_metrics;
	spec.metrics_stop = meta_metrics_stop;
	spec.start = meta_start;
	spec.stop = meta_stop;
	rc = stk_daemon_run(&spec);
	/* Served (start got to its end) and stopped: refused on registering again? */
	if (rc == 0 && m.syncing && stk_agent_refused(m.agent, NULL))
		rc = -EPERM; /* the agent asked to stop */
out:
	/*
	 * The server is gone (stk_daemon_run destroyed it), and with it the handlers that
	 * read the agent's routing table. The reaper and the purger read it too: they go
	 * before the agent.
	 */
	stk_meta_sessions_destroy(m.sessions);
	stk_meta_purger_destroy(m.purger);
	stk_meta_span_destroy(m.span);
	stk_meta_xshard_destroy(m.xshard);
	stk_meta_leases_destroy(m.leases);
	/* its threads use the agent, and the agent's hooks use it */
	stk_meta_repl_stop(m.repl);
	if (m.agent)
		stk_agent_stop(m.agent);
	stk_meta_repl_destroy(m.repl);
	stk_meta_store_sync(m.store);
	stk_meta_store_close(m.store);
	stk_meta_moves_destroy(m.moves);
	stk_info("stopped");
	return rc;
}
