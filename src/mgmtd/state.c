/*
 * mgmtd's cluster state and the rules that change it (see state.h).
 *
 * The tables are plain arrays searched linearly: a cluster has at most a few
 * thousand nodes and targets, mgmtd is not on the data path, and arrays make the
 * state file and the routing reply straightforward to produce. Targets and chains
 * are stored in their wire types (stk_rt_target, stk_rt_chain) so that the routing
 * reply is encoded straight from the tables by stk_routing_encode(), the one
 * encoder of that message.
 *
 * Every mutating call first checks its input and reserves the memory it may need,
 * and only then changes anything, so an error leaves the state as it was.
 */
#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"

#define STATE_MAGIC 0x4D4B5453u /* "STKM" */
/*
 * 8: metadata shards; 7: QoS limits; 6: client identities and meta replicas both; 5
 * (two branches' formats, told apart by their lengths): client identities, or meta
 * replicas; 4: draining, moves; 3: replicas, zones; 2: namespace identities; 1 to 7
 * still read
 */
#define STATE_FORMAT 8
#define STATE_MAX_FILE (256u << 20)

#define STATE_HDR_LEN 56 /* magic through nchains */
#define STATE_NODE_IDENT 17 /* what format 2 adds to a node: refused, ns */

/* Smallest encoded size of each record in the state file: bounds counts read back. */
#define STATE_MIN_NODE 16
#define STATE_MIN_TARGET 35
#define STATE_MIN_CHAIN 9
#define STATE_MOVE 13
#define STATE_MIN_CLIENT 25 /* name len, gen, flags, anon uid, gid, subtree len, removed */

const char *stk_mgmt_role_name(uint8_t role)
{
	switch (role) {
	case STK_ROLE_MGMTD:
		return "mgmtd";
	case STK_ROLE_META:
		return "meta";
	case STK_ROLE_STORAGE:
		return "storage";
	case STK_ROLE_CLIENT:
		return "client";
	default:
		return "unknown";
	}
}

void stk_mgmt_state_init(struct stk_mgmt_state *st)
{
	int64_t sec;
	uint32_t nsec;

	memset(st, 0, sizeof(*st));
	/*
	 * A new state's version starts from the clock, not at 1: a node or client may
	 * still hold a table from a state that was lost, and if the new state counted
	 * up to the same number they would take the new table for the one they hold.
	 * 2^16 versions per millisecond leave room for any number of changes.
	 */
	stk_wall_time(&sec, &nsec);
	st->version = ((uint64_t)sec * 1000 + nsec / 1000000) << 16;
	if (st->version == 0)
		st->version = 1;
	st->next_node_id = 1;
	st->next_target_id = 1;
}

void stk_mgmt_state_free(struct stk_mgmt_state *st)
{
	free(st->nodes);
	free(st->targets);
	free(st->chains);
	free(st->moves);
	free(st->clients);
	memset(st, 0, sizeof(*st));
}

static void bump(struct stk_mgmt_state *st)
{
	st->version++;
	st->dirty = 1;
}

/* Grows *arr (of *cap elements of size sz) to hold at least want elements. */
static int reserve(void **arr, uint32_t *cap, uint32_t want, size_t sz)
{
	uint32_t ncap;
	void *n;

	if (want <= *cap)
		return 0;
	ncap = *cap ? *cap : 8;
	while (ncap < want)
		ncap *= 2;
	n = realloc(*arr, (size_t)ncap * sz);
	if (!n)
		return -ENOMEM;
	*arr = n;
	*cap = ncap;
	return 0;
}

struct stk_mgmt_node *stk_mgmt_state_node(const struct stk_mgmt_state *st, uint32_t id)
{
	for (uint32_t i = 0; i < st->nnodes; i++)
		if (st->nodes[i].id == id)
			return &st->nodes[i];
	return NULL;
}

struct stk_rt_target *stk_mgmt_state_target(const struct stk_mgmt_state *st, uint32_t id)
{
	for (uint32_t i = 0; i < st->ntargets; i++)
		if (st->targets[i].id == id)
			return &st->targets[i];
	return NULL;
}

static int target_has_chain(const struct stk_mgmt_state *st, uint32_t tid)
{
	for (uint32_t i = 0; i < st->nchains; i++)
		for (uint8_t j = 0; j < st->chains[i].ntargets; j++)
			if (st->chains[i].targets[j] == tid)
				return 1;
	return 0;
}

/*
 * Gives target tid a chain of length 1. Chains are created with their target, so
 * chain n holds target n unless ids drifted apart; when mgmtd lost its state and
 * targets come back in any order, keeping that pairing rebuilds the chain table
 * files were laid out on, instead of pointing their chain ids at other targets.
 * So: fill chain tid if it exists and is empty; if it lies at most
 * STK_MGMT_MAX_CHAIN_GAP past the end, add empty chains up to it (they are filled
 * as their targets return); otherwise append. Capacity was reserved by the caller.
 */
static void add_chain(struct stk_mgmt_state *st, uint32_t tid)
{
	struct stk_rt_chain *c;

	if (tid >= 1 && tid <= st->nchains && st->chains[tid - 1].ntargets == 0) {
		c = &st->chains[tid - 1];
		c->version++;
	} else {
		if (tid > st->nchains + 1 && tid - st->nchains <= STK_MGMT_MAX_CHAIN_GAP &&
		    tid <= st->cap_chains) {
			while (st->nchains + 1 < tid) {
				c = &st->chains[st->nchains];
				memset(c, 0, sizeof(*c));
				c->id = ++st->nchains;
				c->version = 1;
				stk_warn("chain %u is empty until target %u registers", c->id,
					 c->id);
			}
		}
		c = &st->chains[st->nchains];
		memset(c, 0, sizeof(*c));
		c->id = ++st->nchains;
		c->version = 1;
	}
	c->ntargets = 1;
	c->targets[0] = tid;
	stk_info("chain %u holds target %u", c->id, tid);
}

/* How many chains registering these targets may need (see add_chain). */
static uint32_t chains_needed(const struct stk_mgmt_state *st,
			      const struct stk_msg_target_info *tgts, uint32_t n)
{
	uint32_t want = st->nchains + n;

	for (uint32_t i = 0; i <= n; i++) {
		/* Each reported id, and the ids new targets will get from next_target_id. */
		uint32_t tid = i < n ? tgts[i].target_id : st->next_target_id + n;

		if (tid > st->nchains && tid - st->nchains <= STK_MGMT_MAX_CHAIN_GAP &&
		    tid + n > want)
			want = tid + n;
	}
	return want;
}

static void set_figures(struct stk_rt_target *t, const struct stk_msg_target_info *ti)
{
	t->capacity = ti->capacity;
	t->used = ti->used;
	t->chunks = ti->chunks;
	t->avail = ti->avail;
	t->dev = ti->dev;
	/* a resync's figures: kept only while one runs, so a finished one shows nothing */
	t->sync_permille = ti->sync_chain ? STK_MIN(ti->sync_permille, 1000u) : 0;
	t->sync_checked = ti->sync_chain ? ti->sync_checked : 0;
	t->sync_copied = ti->sync_chain ? ti->sync_copied : 0;
	t->sync_bytes = ti->sync_chain ? ti->sync_bytes : 0;
}

/*
 * Every change of a known target's state goes through here, so that it is counted
 * (stoker_cluster_target_state_changes_total: a target that keeps going offline
 * and coming back is flapping, whatever state a scrape happens to see).
 */
static void target_set_state(struct stk_rt_target *t, uint8_t state)
{
	if (t->state != state)
		t->state_changes++;
	t->state = state;
	if (state != STK_TARGET_SYNCING) {
		t->sync_permille = 0;
		t->sync_checked = t->sync_copied = t->sync_bytes = 0;
	}
}

static int check_register(const struct stk_msg_mgmt_register_req *req,
			  const struct stk_msg_target_info *tgts, uint32_t n)
{
	if (req->role != STK_ROLE_META && req->role != STK_ROLE_STORAGE)
		return -EINVAL;
	if (req->addr[0] == 0 || n > STK_MGMT_MAX_NODE_TARGETS)
		return -EINVAL;
	if (req->role != STK_ROLE_STORAGE && n > 0)
		return -EINVAL;
	if (req->role == STK_ROLE_META && req->ns_hi == 0 && req->ns_lo == 0)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		if (tgts[i].target_id == 0)
			continue;
		for (uint32_t j = i + 1; j < n; j++)
			if (tgts[j].target_id == tgts[i].target_id)
				return -EINVAL;
	}
	return 0;
}

static void target_back(struct stk_mgmt_state *st, struct stk_rt_target *t);
static void chain_lost(struct stk_mgmt_state *st, const struct stk_rt_target *t);
static unsigned moves_check(struct stk_mgmt_state *st);
static struct stk_mgmt_move *move_with(const struct stk_mgmt_state *st, uint32_t tid);

/* Whether chains may form now: no new target registered for form_settle_ns. */
static int settled(const struct stk_mgmt_state *st, uint64_t now_ns)
{
	return now_ns >= st->last_new_target_ns &&
	       now_ns - st->last_new_target_ns >= st->form_settle_ns;
}

/* Registers one target record of node `node_id`; returns its id. */
static uint32_t register_target(struct stk_mgmt_state *st, uint32_t node_id,
				const struct stk_msg_target_info *ti, uint64_t now_ns)
{
	struct stk_rt_target *t = ti->target_id ? stk_mgmt_state_target(st, ti->target_id) : NULL;
	uint32_t tid = ti->target_id;

	if (!t) {
		if (tid == 0) {
			tid = st->next_target_id++;
		} else {
			stk_warn("target %u (%s) is unknown to mgmtd: taking it as is", tid,
				 ti->path);
			if (tid >= st->next_target_id)
				st->next_target_id = tid + 1;
		}
		t = &st->targets[st->ntargets++];
		memset(t, 0, sizeof(*t));
		t->id = tid;
		t->node_id = node_id;
		t->state = STK_TARGET_SERVING;
		stk_strlcpy(t->path, ti->path, sizeof(t->path));
		set_figures(t, ti);
		stk_info("target %u (%s) on node %u is SERVING", tid, ti->path, node_id);
		st->last_new_target_ns = now_ns;
		bump(st);
	} else {
		if (t->node_id != node_id || strcmp(t->path, ti->path) != 0) {
			stk_info("target %u (%s) is on node %u", tid, ti->path, node_id);
			bump(st);
		}
		t->node_id = node_id;
		stk_strlcpy(t->path, ti->path, sizeof(t->path));
		set_figures(t, ti);
		if (!stk_mgmt_target_active(t->state) && t->state != STK_TARGET_SYNCING &&
		    (t->state != STK_TARGET_WIPING || !t->chunks))
			target_back(st, t);
	}
	if (st->replicas <= 1 && !target_has_chain(st, tid)) {
		add_chain(st, tid);
		bump(st);
	}
	return tid;
}

/*
 * Target t just left its chain's working set (OFFLINE): the chain's version is
 * bumped, so that whoever routes with the old one is told (STALE_ROUTING) and
 * sends again to the members left.
 *
 * While other members still work, t also moves to just behind the last of them:
 * they will take changes t never sees. So a chain's members stay ordered by how
 * recent their copies are, the working ones first, then the lost ones from the
 * last to go to the first; when all are lost, the first member is the one that
 * holds every acknowledged change, and only it may serve again by itself
 * (target_back).
 */
static void chain_lost(struct stk_mgmt_state *st, const struct stk_rt_target *t)
{
	for (uint32_t i = 0; i < st->nchains; i++) {
		struct stk_rt_chain *c = &st->chains[i];
		int at = -1, last_working = -1;

		for (int j = 0; j < (int)c->ntargets; j++) {
			const struct stk_rt_target *m = stk_mgmt_state_target(st, c->targets[j]);

			if (c->targets[j] == t->id)
				at = j;
			else if (m && stk_mgmt_target_active(m->state))
				last_working = j;
		}
		if (at < 0)
			continue;
		c->version++;
		if (c->ntargets > 1)
			stk_warn("chain %u goes on without target %u (version %u)", c->id, t->id,
				 c->version);
		for (int j = at; j < last_working; j++) /* t goes right behind the last working */
			c->targets[j] = c->targets[j + 1];
		if (last_working > at)
			c->targets[last_working] = t->id;
	}
}

/* The chain that holds target tid as a member, or NULL. */
static struct stk_rt_chain *chain_of(struct stk_mgmt_state *st, uint32_t tid)
{
	for (uint32_t i = 0; i < st->nchains; i++)
		for (uint8_t j = 0; j < st->chains[i].ntargets; j++)
			if (st->chains[i].targets[j] == tid)
				return &st->chains[i];
	return NULL;
}

/*
 * A target comes back (its node registers or heartbeats again). In a chain of one,
 * or as the first member of a chain whose every member is gone (the newest copy:
 * see chain_lost), it serves; in a chain that went on without it, it goes last in
 * the chain, SYNCING, until its node says it has copied what it missed
 * (stk_mgmt_state_target_synced); behind a first member still gone, it is SYNCING
 * and waits for that one. Bumps the chain's version whenever the members that
 * changes reach change.
 */
static void target_back(struct stk_mgmt_state *st, struct stk_rt_target *t)
{
	struct stk_rt_chain *c = chain_of(st, t->id);
	int others = 0;

	if (c)
		for (uint8_t j = 0; j < c->ntargets; j++) {
			const struct stk_rt_target *o = stk_mgmt_state_target(st, c->targets[j]);

			others += o && o != t && stk_mgmt_target_active(o->state);
		}
	if (c && c->ntargets > 1 && !others && c->targets[0] != t->id) {
		/* every member is lost, and one of them holds changes this one missed */
		if (t->state != STK_TARGET_SYNCING)
			stk_warn("target %u (%s) is back, but chain %u's newest copy is on target "
				 "%u, still gone: SYNCING (serving nothing) until that one is back",
				 t->id, t->path, c->id, c->targets[0]);
		target_set_state(t, STK_TARGET_SYNCING);
		c->version++;
		bump(st);
		return;
	}
	if (c && c->ntargets > 1 && others) {
		uint8_t j = 0;

		stk_warn("target %u (%s) is back, but chain %u went on without it: SYNCING, "
			 "last in the chain, until it has copied what it missed",
			 t->id, t->path, c->id);
		while (c->targets[j] != t->id)
			j++;
		for (; j + 1 < c->ntargets; j++)
			c->targets[j] = c->targets[j + 1];
		c->targets[j] = t->id;
		target_set_state(t, STK_TARGET_SYNCING);
		c->version++;
		bump(st);
		return;
	}
	if (!c && st->replicas > 1 && t->chunks) {
		/* it left its chain while away: what it holds is stale (state.h) */
		if (t->state != STK_TARGET_WIPING)
			stk_warn("target %u (%s) is back in no chain, holding %llu chunks of a "
				 "chain it left: WIPING until its node has removed them",
				 t->id, t->path, (unsigned long long)t->chunks);
		target_set_state(t, STK_TARGET_WIPING);
		bump(st);
		return;
	}
	stk_info("target %u (%s) is SERVING%s", t->id, t->path, c ? "" : " (in no chain yet)");
	target_set_state(t, STK_TARGET_SERVING);
	if (c)
		c->version++;
	bump(st);
}

int stk_mgmt_state_target_synced(struct stk_mgmt_state *st, uint32_t node_id, uint32_t target_id,
				 uint32_t chain_id, uint32_t chain_ver)
{
	struct stk_rt_target *t = stk_mgmt_state_target(st, target_id);
	struct stk_rt_chain *c = chain_of(st, target_id);

	if (!t || t->node_id != node_id || !c || c->id != chain_id)
		return -ENOENT;
	if (t->state != STK_TARGET_SYNCING || c->version != chain_ver)
		return -ESTALE; /* the chain changed meanwhile: the node syncs again */
	stk_info("target %u (%s) has caught up with chain %u: SERVING", t->id, t->path, c->id);
	target_set_state(t, STK_TARGET_SERVING);
	c->version++;
	bump(st);
	moves_check(st); /* a move's `out` leaves at once */
	return 0;
}

/*
 * With replicas R > 1: makes chains of R targets of R distinct failure domains
 * from the serving targets of online nodes that are in no chain, while there are
 * R such domains. Each chain takes one target from each of the R domains with the
 * most such targets (ties: the first met), and its head rotates over its members
 * with its id, so that heads spread over the nodes.
 */
static void form_chains(struct stk_mgmt_state *st)
{
	for (;;) {
		struct {
			const char *zone;
			uint32_t count;
			uint32_t first; /* index of its first free target */
		} z[STK_MGMT_MAX_ZONES];
		uint32_t nz = 0, pick[STK_MAX_REPLICAS];
		struct stk_rt_chain *c;

		for (uint32_t i = 0; i < st->ntargets; i++) {
			const struct stk_rt_target *t = &st->targets[i];
			const struct stk_mgmt_node *n = stk_mgmt_state_node(st, t->node_id);
			uint32_t k;

			if (t->state != STK_TARGET_SERVING || !n || n->state != STK_NODE_ONLINE ||
			    n->draining || target_has_chain(st, t->id))
				continue;
			for (k = 0; k < nz && strcmp(z[k].zone, n->zone) != 0; k++)
				;
			if (k == nz) {
				if (nz == STK_MGMT_MAX_ZONES)
					continue;
				z[nz].zone = n->zone;
				z[nz].count = 0;
				z[nz].first = i;
				nz++;
			}
			z[k].count++;
		}
		if (nz < st->replicas || st->nchains >= st->cap_chains)
			return;
		for (uint32_t r = 0; r < st->replicas; r++) {
			uint32_t best = nz;

			for (uint32_t k = 0; k < nz; k++)
				if (z[k].count && (best == nz || z[k].count > z[best].count))
					best = k;
			pick[r] = st->targets[z[best].first].id;
			z[best].count = 0; /* one target of each domain */
		}
		c = &st->chains[st->nchains];
		memset(c, 0, sizeof(*c));
		c->id = ++st->nchains;
		c->version = 1;
		c->ntargets = st->replicas;
		for (uint32_t r = 0; r < st->replicas; r++)
			c->targets[r] = pick[(r + c->id - 1) % st->replicas];
		stk_info("chain %u: %u replicas, head target %u", c->id, c->ntargets, c->targets[0]);
		bump(st);
	}
}

static void set_zone(struct stk_mgmt_state *st, struct stk_mgmt_node *node, const char *zone)
{
	if (strncmp(node->zone, zone, sizeof(node->zone)) == 0)
		return;
	stk_info("node %u (%s) is in failure domain %s", node->id, node->addr,
		 zone[0] ? zone : "(none)");
	stk_strlcpy(node->zone, zone, sizeof(node->zone));
	st->dirty = 1;
}

static void set_refused(struct stk_mgmt_state *st, struct stk_mgmt_node *node, uint8_t refused)
{
	if (node->refused != refused) {
		node->refused = refused;
		bump(st);
	}
}

/* ---- replicated metadata (state.h) ---- */

/* Shard sh's number (1 for shards[0]). */
static unsigned shard_no(const struct stk_mgmt_state *st, const struct stk_mgmt_shard *sh)
{
	return (unsigned)(sh - st->shards) + 1;
}

/* The shard meta node n registered for (shard 1 for a node of an older state). */
static struct stk_mgmt_shard *node_shard(struct stk_mgmt_state *st, const struct stk_mgmt_node *n)
{
	unsigned k = n->shard ? n->shard : 1;

	return k <= STK_MGMT_MAX_SHARDS ? &st->shards[k - 1] : &st->shards[0];
}

static int is_follower(const struct stk_mgmt_shard *sh, uint32_t id)
{
	for (uint8_t i = 0; i < sh->nfollowers; i++)
		if (sh->followers[i] == id)
			return 1;
	return 0;
}

static void new_epoch(struct stk_mgmt_state *st, struct stk_mgmt_shard *sh)
{
	bump(st);
	sh->epoch = st->version;
}

static void follower_drop(struct stk_mgmt_shard *sh, uint32_t id)
{
	uint8_t j = 0;

	for (uint8_t i = 0; i < sh->nfollowers; i++)
		if (sh->followers[i] != id)
			sh->followers[j++] = sh->followers[i];
	sh->nfollowers = j;
}

/*
 * The copies of shard sh that stay once its draining meta nodes are gone: its
 * leader unless it drains, and its followers that do not drain.
 */
static unsigned copies_kept(struct stk_mgmt_state *st, const struct stk_mgmt_shard *sh)
{
	const struct stk_mgmt_node *lead = stk_mgmt_state_node(st, sh->node);
	unsigned n = !(lead && lead->draining);

	for (uint8_t i = 0; i < sh->nfollowers; i++) {
		const struct stk_mgmt_node *f = stk_mgmt_state_node(st, sh->followers[i]);

		n += !(f && f->draining);
	}
	return n;
}

/*
 * ONLINE meta nodes in no role join as followers while the shard has room: fewer
 * than R copies that stay (a draining node's place is taken before it goes, so a
 * shard being drained has a follower more for a while). A draining node never
 * joins.
 */
/* Whether n may join shard sh as a follower: an online meta node of it in no role. */
static int is_spare(struct stk_mgmt_state *st, const struct stk_mgmt_shard *sh,
		    const struct stk_mgmt_node *n)
{
	return n->role == STK_ROLE_META && n->state == STK_NODE_ONLINE && !n->refused &&
	       !n->draining && node_shard(st, n) == sh && n->id != sh->node &&
	       !is_follower(sh, n->id);
}

static void follower_add(struct stk_mgmt_state *st, struct stk_mgmt_shard *sh,
			 struct stk_mgmt_node *n)
{
	sh->followers[sh->nfollowers++] = n->id;
	n->catch_reports = 0;
	n->catch_floor = 0;
	new_epoch(st, sh);
	stk_info("meta node %u (%s) follows shard %u (epoch %llu)%s", n->id, n->addr,
		 shard_no(st, sh), (unsigned long long)sh->epoch,
		 stk_ns_id_eq(&n->ns, &sh->ns) ? ", its store learned" : "");
}

/*
 * Spares join while the shard has fewer than R copies (drain: fewer than R that
 * stay, so a draining node's place is taken before it goes).
 */
static void fill(struct stk_mgmt_state *st, struct stk_mgmt_shard *sh, int drain)
{
	if (st->meta_replicas <= 1 || stk_ns_id_is_zero(&sh->ns))
		return;
	for (uint32_t i = 0; i < st->nnodes; i++) {
		struct stk_mgmt_node *n = &st->nodes[i];
		unsigned copies = drain ? copies_kept(st, sh) : 1u + sh->nfollowers;

		if (copies >= st->meta_replicas || sh->nfollowers >= STK_MAX_REPLICAS)
			return;
		if (is_spare(st, sh, n))
			follower_add(st, sh, n);
	}
}

static void followers_fill(struct stk_mgmt_state *st, struct stk_mgmt_shard *sh)
{
	fill(st, sh, 0);
}

/*
 * How long a drain waits for a spare that learned the shard before it takes one
 * that did not (its leader keeps no learners: a release before them).
 */
#define LEARN_WAIT_NS (60ull * 1000000000ull)

/*
 * A drain's followers_fill: the shard keeps R copies still (a draining one among
 * them), so the spare that takes a draining node's place need not join at once.
 * The leader keeps spares in step as learners (meta/repl.c) without any reply
 * waiting for them: one whose store is the shard's (learned) joins, with the
 * most changes, and the replies wait only for the log it has yet to take, not
 * for a copy of the store. One that has not learned joins after LEARN_WAIT_NS.
 */
static void drain_fill(struct stk_mgmt_state *st, struct stk_mgmt_shard *sh, uint64_t now_ns)
{
	struct stk_mgmt_node *best = NULL;
	int spares = 0;

	if (copies_kept(st, sh) >= st->meta_replicas || 1u + sh->nfollowers < st->meta_replicas) {
		sh->learn_wait_ns = 0;
		followers_fill(st, sh); /* nothing to wait for, or a copy short: at once */
		return;
	}
	if (sh->nfollowers >= STK_MAX_REPLICAS)
		return;
	for (uint32_t i = 0; i < st->nnodes; i++) {
		struct stk_mgmt_node *n = &st->nodes[i];

		if (!is_spare(st, sh, n))
			continue;
		spares++;
		if (stk_ns_id_eq(&n->ns, &sh->ns) && (!best || n->meta_seq > best->meta_seq))
			best = n;
	}
	if (!spares) {
		sh->learn_wait_ns = 0;
		return;
	}
	if (best) {
		sh->learn_wait_ns = 0;
		follower_add(st, sh, best);
		return;
	}
	if (!sh->learn_wait_ns)
		sh->learn_wait_ns = now_ns ? now_ns : 1;
	else if (now_ns >= sh->learn_wait_ns + LEARN_WAIT_NS) {
		sh->learn_wait_ns = 0;
		fill(st, sh, 1);
	}
}

/*
 * The leader is gone: the ONLINE follower of the shard's identity with the most
 * changes leads. 1 when one was promoted.
 */
static int promote(struct stk_mgmt_state *st, struct stk_mgmt_shard *sh)
{
	struct stk_mgmt_node *best = NULL;
	uint32_t old = sh->node;

	for (uint8_t i = 0; i < sh->nfollowers; i++) {
		struct stk_mgmt_node *n = stk_mgmt_state_node(st, sh->followers[i]);

		if (!n || n->state != STK_NODE_ONLINE || !stk_ns_id_eq(&n->ns, &sh->ns))
			continue;
		if (!best || n->meta_seq > best->meta_seq)
			best = n;
	}
	if (!best) {
		stk_warn("shard %u lost its leader (meta node %u) and has no follower to promote: "
			 "it waits for one",
			 shard_no(st, sh), old);
		return 0;
	}
	follower_drop(sh, best->id);
	sh->node = best->id;
	new_epoch(st, sh);
	stk_warn("meta node %u (%s) leads shard %u now (epoch %llu, change %llu), in place of "
		 "meta node %u",
		 best->id, best->addr, shard_no(st, sh), (unsigned long long)sh->epoch,
		 (unsigned long long)best->meta_seq, old);
	return 1;
}

/* A meta node went OFFLINE (R > 1): out of the followers, or replaced as leader. */
static void meta_offline(struct stk_mgmt_state *st, const struct stk_mgmt_node *node)
{
	struct stk_mgmt_shard *sh = node_shard(st, node);

	if (st->meta_replicas <= 1)
		return;
	if (is_follower(sh, node->id)) {
		follower_drop(sh, node->id);
		new_epoch(st, sh);
		stk_warn("meta node %u (%s) no longer follows shard %u (epoch %llu)", node->id,
			 node->addr, shard_no(st, sh), (unsigned long long)sh->epoch);
	} else if (node->id == sh->node) {
		promote(st, sh);
	}
	followers_fill(st, sh);
}

/* A meta node registered (R > 1): the rules of state.h, "Replicated metadata". */
static void assign_replica(struct stk_mgmt_state *st, struct stk_mgmt_shard *sh,
			   struct stk_mgmt_node *node, const struct stk_ns_id *ns)
{
	char have[STK_NS_ID_STR];

	if (!stk_ns_id_eq(&node->ns, ns)) {
		node->ns = *ns;
		bump(st);
	}
	set_refused(st, node, 0);
	stk_ns_id_str(ns, have);
	if (stk_ns_id_is_zero(&sh->ns) && sh->node == 0) {
		sh->node = node->id;
		sh->ns = *ns;
		new_epoch(st, sh);
		stk_info("shard %u is namespace %s, led by meta node %u (%s), epoch %llu",
			 shard_no(st, sh), have, node->id, node->addr,
			 (unsigned long long)sh->epoch);
		return;
	}
	if (stk_ns_id_is_zero(&sh->ns) && sh->node == node->id) {
		sh->ns = *ns; /* a state saved before identities */
		bump(st);
	}
	if (node->id == sh->node)
		return; /* the leader restarted: it holds all it acknowledged */
	if (sh->node == 0 && is_follower(sh, node->id) && stk_ns_id_eq(ns, &sh->ns)) {
		follower_drop(sh, node->id);
		sh->node = node->id;
		new_epoch(st, sh);
		stk_warn("meta node %u (%s) leads shard %u (epoch %llu)", node->id, node->addr,
			 shard_no(st, sh), (unsigned long long)sh->epoch);
		return;
	}
	followers_fill(st, sh);
}

void stk_mgmt_state_meta_report(struct stk_mgmt_state *st, uint32_t node_id,
				const struct stk_ns_id *ns, uint64_t epoch, uint64_t seq)
{
	struct stk_mgmt_node *node = stk_mgmt_state_node(st, node_id);

	if (!node || node->role != STK_ROLE_META)
		return;
	node->meta_epoch = epoch;
	node->meta_seq = seq;
	if (node->shard <= STK_MGMT_MAX_SHARDS && node_shard(st, node)->node == node->id) {
		struct stk_mgmt_shard *sh = node_shard(st, node);

		for (uint8_t i = 0; i < sh->nfollowers; i++) {
			struct stk_mgmt_node *f = stk_mgmt_state_node(st, sh->followers[i]);

			if (f && f->catch_reports < 2) {
				f->catch_reports++;
				f->catch_floor = seq;
			}
		}
	}
	/* a follower copied from its leader; zero while it is copied: no promotion then */
	if (!stk_ns_id_eq(&node->ns, ns)) {
		node->ns = *ns;
		st->dirty = 1;
	}
}

/*
 * Shard 1 and the meta node that just registered with store identity `ns` (the
 * rules are in state.h). The shard only ever goes to the store that holds it: the
 * bug this prevents is an empty store given the shard when its owner was away,
 * which lost the namespace and let clients of the empty one remove chunks of
 * files whose inode numbers it handed out again.
 */
static void assign_shard(struct stk_mgmt_state *st, struct stk_mgmt_node *node,
			 const struct stk_ns_id *ns, unsigned shard)
{
	char have[STK_NS_ID_STR], want[STK_NS_ID_STR];
	struct stk_mgmt_shard *sh, *was;
	struct stk_mgmt_node *owner;
	unsigned nshards = st->meta_shards ? st->meta_shards : 1;
	unsigned k;

	unsigned req_shard;

	if (shard == 0)
		shard = 1; /* a meta of a release before shards */
	req_shard = shard;
	was = node->shard ? node_shard(st, node) : NULL;
	if (shard > nshards) {
		stk_warn("meta node %u (%s) refused: it registers for shard %u, but the cluster "
			 "has %u metadata shard%s (mgmtd --meta-shards); it serves nothing",
			 node->id, node->addr, shard, nshards, nshards == 1 ? "" : "s");
		set_refused(st, node, 1);
		shard = 0;
	}
	if (was && (shard == 0 || was != &st->shards[shard - 1])) {
		/* the node's store serves another shard now (or none): out of its old one */
		if (is_follower(was, node->id)) {
			follower_drop(was, node->id);
			new_epoch(st, was);
		}
		if (was->node == node->id) {
			stk_warn("shard %u has no meta node: its meta node %u registers for "
				 "another shard",
				 shard_no(st, was), node->id);
			was->node = 0;
			bump(st);
		}
	}
	if (shard == 0) {
		/* kept for `stoker status`, which says which shard it asked for */
		node->shard = (uint8_t)(req_shard > 255 ? 255 : req_shard);
		return;
	}
	if (node->shard != shard) {
		node->shard = (uint8_t)shard;
		bump(st);
	}
	sh = &st->shards[shard - 1];
	k = shard;
	if (st->meta_replicas > 1) {
		assign_replica(st, sh, node, ns);
		return;
	}
	if (!stk_ns_id_eq(&node->ns, ns)) {
		node->ns = *ns;
		bump(st);
	}
	stk_ns_id_str(ns, have);
	if (stk_ns_id_is_zero(&sh->ns)) {
		if (sh->node == 0) {
			stk_info("shard %u is namespace %s, served by meta node %u (%s)", k, have,
				 node->id, node->addr);
		} else if (sh->node == node->id) {
			stk_info("shard %u's meta node %u (%s) reports its namespace: %s", k,
				 node->id, node->addr, have);
		} else {
			/* A state saved before identities: only the owner knows which store it is. */
			stk_warn("meta node %u (%s) waits: shard %u stays with meta node %u until "
				 "that node registers again",
				 node->id, node->addr, k, sh->node);
			set_refused(st, node, 0);
			return;
		}
		sh->node = node->id;
		sh->ns = *ns;
		set_refused(st, node, 0);
		bump(st);
		return;
	}
	stk_ns_id_str(&sh->ns, want);
	if (stk_ns_id_eq(&sh->ns, ns)) {
		set_refused(st, node, 0);
		if (sh->node == node->id)
			return;
		if (sh->epoch && sh->node) {
			/*
			 * The shard was replicated (--meta-replicas went back to 1): other
			 * stores of its identity are copies, maybe behind its owner's, and
			 * never stand in for it.
			 */
			stk_warn("meta node %u (%s) refused: its store is a copy of shard %u made "
				 "while it was replicated; shard %u stays with meta node %u",
				 node->id, node->addr, k, k, sh->node);
			set_refused(st, node, 1);
			return;
		}
		owner = sh->node ? stk_mgmt_state_node(st, sh->node) : NULL;
		if (owner && owner->state == STK_NODE_ONLINE)
			stk_warn("meta node %u (%s) registers with shard %u's store while meta "
				 "node %u (%s) still counts as ONLINE: taking it as the same store "
				 "restarted (never run two copies of one store)",
				 node->id, node->addr, k, owner->id, owner->addr);
		stk_info("shard %u (namespace %s) is now served by meta node %u (%s)", k, want,
			 node->id, node->addr);
		sh->node = node->id;
		bump(st);
		return;
	}
	stk_warn("meta node %u (%s) refused: its store is namespace %s, not shard %u's "
		 "namespace %s; it serves nothing (start it on shard %u's data folder, or "
		 "give it its own cluster)",
		 node->id, node->addr, have, k, want, k);
	set_refused(st, node, 1);
	if (sh->node == node->id) {
		stk_warn("shard %u (namespace %s) has no meta node until its store registers "
			 "again",
			 k, want);
		sh->node = 0;
		bump(st);
	}
}

int stk_mgmt_state_register(struct stk_mgmt_state *st, const struct stk_msg_mgmt_register_req *req,
			    const struct stk_msg_target_info *tgts, uint32_t n, uint64_t now_ns,
			    uint32_t *node_id, uint32_t *ids)
{
	struct stk_mgmt_node *node = NULL;
	uint32_t nid = 0;
	int64_t sec;
	uint32_t nsec;
	int rc;

	rc = check_register(req, tgts, n);
	if (rc)
		return rc;
	if (reserve((void **)&st->nodes, &st->cap_nodes, st->nnodes + 1, sizeof(*st->nodes)) ||
	    reserve((void **)&st->targets, &st->cap_targets, st->ntargets + n,
		    sizeof(*st->targets)) ||
	    reserve((void **)&st->chains, &st->cap_chains, chains_needed(st, tgts, n),
		    sizeof(*st->chains)))
		return -ENOMEM;

	if (req->node_id)
		node = stk_mgmt_state_node(st, req->node_id);
	if (node && node->role != req->role) {
		stk_warn("node %u registers as %s but was %s: giving it a new id", req->node_id,
			 stk_mgmt_role_name(req->role), stk_mgmt_role_name(node->role));
		node = NULL;
	}
	if (!node) {
		node = &st->nodes[st->nnodes++];
		memset(node, 0, sizeof(*node));
		if (req->node_id && !stk_mgmt_state_node(st, req->node_id)) {
			/*
			 * mgmtd lost its state and the node kept its id: keep it too. Handing
			 * out a new id instead would let the next node that re-registers with
			 * that id take over this node's entry and targets.
			 */
			node->id = req->node_id;
			if (node->id >= st->next_node_id)
				st->next_node_id = node->id + 1;
			stk_warn("node %u (%s, %s) is unknown to mgmtd: taking its id as is",
				 node->id, stk_mgmt_role_name(req->role), req->addr);
		} else {
			node->id = st->next_node_id++;
			stk_info("node %u (%s, %s) registered as a new node", node->id,
				 stk_mgmt_role_name(req->role), req->addr);
		}
		node->role = req->role;
		node->state = STK_NODE_ONLINE;
		stk_strlcpy(node->addr, req->addr, sizeof(node->addr));
		bump(st);
	} else {
		if (node->state != STK_NODE_ONLINE || strcmp(node->addr, req->addr) != 0) {
			stk_info("node %u (%s, %s) registered again: ONLINE", node->id,
				 stk_mgmt_role_name(node->role), req->addr);
			bump(st);
		}
		node->state = STK_NODE_ONLINE;
		stk_strlcpy(node->addr, req->addr, sizeof(node->addr));
	}
	stk_mgmt_state_set_host(st, node->id, req->host_id);
	set_zone(st, node, req->zone[0] ? req->zone : req->host_id);
	node->last_hb_ns = now_ns;
	stk_wall_time(&sec, &nsec);
	node->last_hb_wall_ms = sec * 1000 + nsec / 1000000;
	nid = node->id;

	for (uint32_t i = 0; i < n; i++)
		ids[i] = register_target(st, nid, &tgts[i], now_ns);

	/* The node declares all its targets: any it no longer reports is gone. */
	for (uint32_t i = 0; i < st->ntargets; i++) {
		struct stk_rt_target *t = &st->targets[i];
		int listed = 0;

		if (t->node_id != nid || t->state == STK_TARGET_OFFLINE)
			continue;
		for (uint32_t j = 0; j < n && !listed; j++)
			listed = ids[j] == t->id;
		if (!listed) {
			stk_warn("target %u (%s) is no longer reported by node %u: OFFLINE", t->id,
				 t->path, nid);
			target_set_state(t, STK_TARGET_OFFLINE);
			chain_lost(st, t);
			bump(st);
		}
	}

	if (req->role == STK_ROLE_META)
		assign_shard(st, node, &(struct stk_ns_id){.hi = req->ns_hi, .lo = req->ns_lo},
			     req->shard);
	if (st->replicas > 1 && settled(st, now_ns))
		form_chains(st);
	*node_id = nid;
	return 0;
}

int stk_mgmt_state_heartbeat(struct stk_mgmt_state *st, uint32_t node_id,
			     const struct stk_msg_target_info *tgts, uint32_t n, uint64_t now_ns)
{
	struct stk_mgmt_node *node = stk_mgmt_state_node(st, node_id);
	int back;
	int64_t sec;
	uint32_t nsec;

	if (!node)
		return -ENOENT;
	back = node->state != STK_NODE_ONLINE;
	if (back) {
		stk_info("node %u (%s, %s) is back: ONLINE", node->id,
			 stk_mgmt_role_name(node->role), node->addr);
		node->state = STK_NODE_ONLINE;
		bump(st);
		if (node->role == STK_ROLE_META && !node->refused)
			followers_fill(st, node_shard(st, node));
	}
	node->last_hb_ns = now_ns;
	stk_wall_time(&sec, &nsec);
	node->last_hb_wall_ms = sec * 1000 + nsec / 1000000;
	for (uint32_t i = 0; i < n; i++) {
		struct stk_rt_target *t = stk_mgmt_state_target(st, tgts[i].target_id);

		if (!t || t->node_id != node_id)
			continue;
		set_figures(t, &tgts[i]);
		if (back && t->state == STK_TARGET_OFFLINE)
			target_back(st, t);
	}
	return 0;
}

void stk_mgmt_state_set_host(struct stk_mgmt_state *st, uint32_t node_id, const char *host_id)
{
	struct stk_mgmt_node *node = stk_mgmt_state_node(st, node_id);

	if (!node || strncmp(node->host_id, host_id, sizeof(node->host_id)) == 0)
		return;
	stk_info("node %u (%s, %s) is on host %s", node->id, stk_mgmt_role_name(node->role),
		 node->addr, host_id[0] ? host_id : "(none)");
	stk_strlcpy(node->host_id, host_id, sizeof(node->host_id));
	bump(st);
}

unsigned stk_mgmt_state_expire(struct stk_mgmt_state *st, uint64_t now_ns, uint64_t timeout_ns)
{
	unsigned count = 0;

	for (uint32_t i = 0; i < st->nnodes; i++) {
		struct stk_mgmt_node *node = &st->nodes[i];

		if (node->state != STK_NODE_ONLINE || now_ns < node->last_hb_ns ||
		    now_ns - node->last_hb_ns <= timeout_ns)
			continue;
		stk_warn("node %u (%s, %s) sent no heartbeat for %llu ms: OFFLINE", node->id,
			 stk_mgmt_role_name(node->role), node->addr,
			 (unsigned long long)((now_ns - node->last_hb_ns) / 1000000));
		node->state = STK_NODE_OFFLINE;
		for (uint32_t j = 0; j < st->ntargets; j++) {
			struct stk_rt_target *t = &st->targets[j];
			if (t->node_id == node->id && t->state != STK_TARGET_OFFLINE) {
				stk_warn("target %u (%s) is OFFLINE", t->id, t->path);
				target_set_state(t, STK_TARGET_OFFLINE);
				chain_lost(st, t);
			}
		}
		bump(st);
		if (node->role == STK_ROLE_META)
			meta_offline(st, node);
		count++;
	}
	return count;
}

/* A serving target of an online node in no chain, of a domain none of c's members but `out` is in. */
static struct stk_rt_target *spare_for(struct stk_mgmt_state *st, const struct stk_rt_chain *c,
				       uint32_t out)
{
	for (uint32_t i = 0; i < st->ntargets; i++) {
		struct stk_rt_target *t = &st->targets[i];
		const struct stk_mgmt_node *n = stk_mgmt_state_node(st, t->node_id);
		int clash = 0;

		if (t->state != STK_TARGET_SERVING || !n || n->state != STK_NODE_ONLINE ||
		    n->draining || target_has_chain(st, t->id))
			continue;
		for (uint8_t j = 0; j < c->ntargets && !clash; j++) {
			const struct stk_rt_target *m = stk_mgmt_state_target(st, c->targets[j]);
			const struct stk_mgmt_node *mn = m ? stk_mgmt_state_node(st, m->node_id) : NULL;

			clash = c->targets[j] != out && mn && strcmp(mn->zone, n->zone) == 0;
		}
		if (!clash)
			return t;
	}
	return NULL;
}

unsigned stk_mgmt_state_replace(struct stk_mgmt_state *st, uint64_t now_ns, uint64_t after_ns,
				uint32_t force_node)
{
	unsigned count = 0;

	for (uint32_t i = 0; i < st->nchains; i++) {
		struct stk_rt_chain *c = &st->chains[i];
		int working = 0;

		if (c->ntargets < 2)
			continue; /* a chain of one has nothing to copy from */
		for (uint8_t j = 0; j < c->ntargets; j++) {
			const struct stk_rt_target *m = stk_mgmt_state_target(st, c->targets[j]);

			working += m && stk_mgmt_target_active(m->state);
		}
		for (int j = 0; j < (int)c->ntargets && working; j++) {
			struct stk_rt_target *old = stk_mgmt_state_target(st, c->targets[j]);
			const struct stk_mgmt_node *n = old ? stk_mgmt_state_node(st, old->node_id) : NULL;
			struct stk_rt_target *nt;
			int k;

			if (!old || !n || move_with(st, old->id))
				continue; /* a move's own round finishes or abandons it */
			if (force_node ? n->id != force_node
				       : old->state != STK_TARGET_OFFLINE ||
					     n->state != STK_NODE_OFFLINE || after_ns == 0 ||
					     now_ns < n->last_hb_ns || now_ns - n->last_hb_ns <= after_ns)
				continue;
			nt = spare_for(st, c, old->id);
			if (!nt) {
				stk_warn("chain %u: target %u (node %u) is gone, but no serving target "
					 "of another failure domain is free to replace it",
					 c->id, old->id, n->id);
				continue;
			}
			stk_warn("chain %u: target %u (node %u, %s) is replaced by target %u (node %u): "
				 "SYNCING, last in the chain, until it holds the chain's chunks",
				 c->id, old->id, n->id, force_node ? "removed" : "gone too long", nt->id,
				 nt->node_id);
			if (stk_mgmt_target_active(old->state))
				working--;
			for (k = j; k + 1 < (int)c->ntargets; k++)
				c->targets[k] = c->targets[k + 1];
			c->targets[k] = nt->id;
			target_set_state(nt, STK_TARGET_SYNCING);
			if (force_node && stk_mgmt_target_active(old->state))
				target_set_state(old, STK_TARGET_OFFLINE);
			c->version++;
			bump(st);
			count++;
			j--; /* the member now at j is the next one */
		}
	}
	return count;
}

/* ---- moves: rebalance and drains (state.h, stk_mgmt_state_rebalance) ---- */

static int chain_pos(const struct stk_rt_chain *c, uint32_t tid)
{
	for (int j = 0; j < (int)c->ntargets; j++)
		if (c->targets[j] == tid)
			return j;
	return -1;
}

static struct stk_rt_chain *chain_by_id(struct stk_mgmt_state *st, uint32_t id)
{
	return id >= 1 && id <= st->nchains ? &st->chains[id - 1] : NULL;
}

/* The move that target tid is the `in` or the `out` of, or NULL. */
static struct stk_mgmt_move *move_with(const struct stk_mgmt_state *st, uint32_t tid)
{
	for (uint32_t i = 0; i < st->nmoves; i++)
		if (st->moves[i].in == tid || st->moves[i].out == tid)
			return &st->moves[i];
	return NULL;
}

const struct stk_mgmt_move *stk_mgmt_state_chain_move(const struct stk_mgmt_state *st,
						      uint32_t chain_id)
{
	for (uint32_t i = 0; i < st->nmoves; i++)
		if (st->moves[i].chain_id == chain_id)
			return &st->moves[i];
	return NULL;
}

int stk_mgmt_state_chain_health(const struct stk_mgmt_state *st, const struct stk_rt_chain *c)
{
	const struct stk_mgmt_move *mv = stk_mgmt_state_chain_move(st, c->id);
	unsigned working = 0, need = c->ntargets;

	for (uint8_t j = 0; j < c->ntargets; j++) {
		const struct stk_rt_target *t = stk_mgmt_state_target(st, c->targets[j]);
		int active = t && stk_mgmt_target_active(t->state);

		if (mv && c->targets[j] == mv->in && !active)
			need--;
		else
			working += active;
	}
	return working == 0 ? STK_MGMT_CHAIN_UNAVAILABLE
	       : working < need ? STK_MGMT_CHAIN_DEGRADED
				: STK_MGMT_CHAIN_HEALTHY;
}

uint32_t stk_mgmt_state_node_members(const struct stk_mgmt_state *st, uint32_t node_id)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < st->nchains; i++)
		for (uint8_t j = 0; j < st->chains[i].ntargets; j++) {
			const struct stk_rt_target *t =
			    stk_mgmt_state_target(st, st->chains[i].targets[j]);

			n += t && t->node_id == node_id;
		}
	return n;
}

/*
 * Target tid leaves chain c: the chain goes on without it (a new version), and
 * the target's chunks are stale from now on, so it is WIPING; one that is offline
 * stays so and is WIPING when it comes back holding chunks (target_back).
 */
static void chain_drop(struct stk_mgmt_state *st, struct stk_rt_chain *c, uint32_t tid)
{
	struct stk_rt_target *t = stk_mgmt_state_target(st, tid);
	int at = chain_pos(c, tid);

	if (at < 0)
		return;
	for (int j = at; j + 1 < (int)c->ntargets; j++)
		c->targets[j] = c->targets[j + 1];
	c->ntargets--;
	c->version++;
	if (t && t->state != STK_TARGET_OFFLINE)
		target_set_state(t, STK_TARGET_WIPING);
	bump(st);
}

static void move_forget(struct stk_mgmt_state *st, struct stk_mgmt_move *m)
{
	uint32_t i = (uint32_t)(m - st->moves);

	memmove(&st->moves[i], &st->moves[i + 1], (st->nmoves - i - 1) * sizeof(*m));
	st->nmoves--;
	st->dirty = 1;
}

/* Gives a move up: its `in` leaves the chain (the copy it began is stale). */
static void move_abandon(struct stk_mgmt_state *st, struct stk_mgmt_move *m, const char *why)
{
	struct stk_rt_chain *c = chain_by_id(st, m->chain_id);

	stk_warn("chain %u: the move of target %u to target %u is abandoned: %s", m->chain_id,
		 m->out, m->in, why);
	if (c)
		chain_drop(st, c, m->in);
	st->moves_abandoned++;
	move_forget(st, m);
}

/* Finishes or abandons each move in flight as its targets stand. Returns how many. */
static unsigned moves_check(struct stk_mgmt_state *st)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < st->nmoves;) {
		struct stk_mgmt_move *m = &st->moves[i];
		struct stk_rt_chain *c = chain_by_id(st, m->chain_id);
		const struct stk_rt_target *in = stk_mgmt_state_target(st, m->in);

		if (!c || !in || chain_pos(c, m->in) < 0) {
			move_abandon(st, m, "the new member left the chain");
		} else if (in->state == STK_TARGET_OFFLINE) {
			move_abandon(st, m, "the new member went offline");
		} else if (chain_pos(c, m->out) < 0) {
			move_abandon(st, m, "the old member left the chain otherwise");
		} else if (stk_mgmt_target_active(in->state)) {
			stk_info("chain %u: target %u serves, target %u leaves the chain (WIPING)",
				 c->id, m->in, m->out);
			chain_drop(st, c, m->out);
			st->moves_finished++;
			move_forget(st, m);
		} else {
			i++; /* still copying */
			continue;
		}
		n++; /* the move was forgotten: the next one is at i now */
	}
	return n;
}

/* A node's load as the planner counts it (state.h). */
struct load {
	const struct stk_mgmt_node *node;
	uint32_t t, m;
	uint32_t free_idx; /* index in st->targets of a free target it may take, or UINT32_MAX */
};

/* Whether target index i of st may join a chain now. */
static int target_free(const struct stk_mgmt_state *st, uint32_t i,
		       const struct stk_mgmt_node *n)
{
	const struct stk_rt_target *t = &st->targets[i];

	return t->state == STK_TARGET_SERVING && n && n->state == STK_NODE_ONLINE &&
	       !n->draining && n->role == STK_ROLE_STORAGE && !target_has_chain(st, t->id);
}

/* The loads of every storage node into l (st->nnodes entries). Returns how many. */
static uint32_t loads(const struct stk_mgmt_state *st, struct load *l)
{
	uint32_t nl = 0;

	for (uint32_t i = 0; i < st->nnodes; i++) {
		const struct stk_mgmt_node *n = &st->nodes[i];

		if (n->role != STK_ROLE_STORAGE)
			continue;
		l[nl].node = n;
		l[nl].t = l[nl].m = 0;
		l[nl].free_idx = UINT32_MAX;
		for (uint32_t k = 0; k < st->ntargets; k++) {
			const struct stk_rt_target *t = &st->targets[k];
			const struct stk_mgmt_move *mv;

			if (t->node_id != n->id)
				continue;
			l[nl].t += t->state != STK_TARGET_OFFLINE;
			mv = move_with(st, t->id);
			if (mv && mv->out == t->id)
				continue; /* leaving */
			if (target_has_chain(st, t->id))
				l[nl].m++;
			else if (l[nl].free_idx == UINT32_MAX && target_free(st, k, n))
				l[nl].free_idx = k;
		}
		nl++;
	}
	return nl;
}

/* Whether a target of zone `zone` may join c in place of member `out`. */
static int zone_fits(const struct stk_mgmt_state *st, const struct stk_rt_chain *c, uint32_t out,
		     const char *zone)
{
	for (uint8_t j = 0; j < c->ntargets; j++) {
		const struct stk_rt_target *m = stk_mgmt_state_target(st, c->targets[j]);
		const struct stk_mgmt_node *mn = m ? stk_mgmt_state_node(st, m->node_id) : NULL;

		if (c->targets[j] != out && mn && strcmp(mn->zone, zone) == 0)
			return 0;
	}
	return 1;
}

/* Whether every member of c works (a move only starts on such a chain). */
static int chain_healthy(const struct stk_mgmt_state *st, const struct stk_rt_chain *c)
{
	for (uint8_t j = 0; j < c->ntargets; j++) {
		const struct stk_rt_target *m = stk_mgmt_state_target(st, c->targets[j]);

		if (!m || !stk_mgmt_target_active(m->state))
			return 0;
	}
	return c->ntargets > 0;
}

/* Starts moving c's member `out` to target `in` (free, checked by the caller). */
static int move_start(struct stk_mgmt_state *st, struct stk_rt_chain *c, uint32_t out,
		      struct stk_rt_target *in, int drain)
{
	struct stk_mgmt_move *m;

	if (c->ntargets >= STK_MAX_REPLICAS ||
	    reserve((void **)&st->moves, &st->cap_moves, st->nmoves + 1, sizeof(*st->moves)))
		return 0;
	m = &st->moves[st->nmoves++];
	m->chain_id = c->id;
	m->out = out;
	m->in = in->id;
	m->drain = (uint8_t)drain;
	c->targets[c->ntargets++] = in->id;
	c->version++;
	target_set_state(in, STK_TARGET_SYNCING);
	st->moves_started++;
	stk_info("chain %u: moving target %u (node %u) to target %u (node %u)%s: SYNCING, last "
		 "in the chain, until it holds the chain's chunks",
		 c->id, out, stk_mgmt_state_target(st, out)->node_id, in->id, in->node_id,
		 drain ? ", draining" : "");
	bump(st);
	return 1;
}

/*
 * (2m+1)/t against (2m-1)/t, the potential's change of taking one membership on
 * and giving one up (state.h), compared without division.
 */
static int evens_out(const struct load *from, const struct load *to)
{
	return (uint64_t)(2 * to->m + 1) * from->t < (uint64_t)(2 * from->m - 1) * to->t;
}

/* Less loaded: a lower (2m+1)/t. */
static int lighter(const struct load *a, const struct load *b)
{
	return (uint64_t)(2 * a->m + 1) * b->t < (uint64_t)(2 * b->m + 1) * a->t;
}

/*
 * One move for the first chain with a member on a draining node: to the least
 * loaded node with a free target whose domain fits. Returns 1 if one started.
 */
static int plan_drain(struct stk_mgmt_state *st, struct load *l, uint32_t nl)
{
	for (uint32_t i = 0; i < st->nchains; i++) {
		struct stk_rt_chain *c = &st->chains[i];

		if (c->ntargets < 2 || stk_mgmt_state_chain_move(st, c->id))
			continue;
		for (uint8_t j = 0; j < c->ntargets; j++) {
			const struct stk_rt_target *o = stk_mgmt_state_target(st, c->targets[j]);
			const struct stk_mgmt_node *on = o ? stk_mgmt_state_node(st, o->node_id) : NULL;
			const struct load *best = NULL;

			if (!on || !on->draining)
				continue;
			for (uint32_t k = 0; k < nl; k++)
				if (l[k].free_idx != UINT32_MAX && l[k].t &&
				    zone_fits(st, c, o->id, l[k].node->zone) &&
				    (!best || lighter(&l[k], best)))
					best = &l[k];
			if (best)
				return move_start(st, c, o->id, &st->targets[best->free_idx], 1);
		}
	}
	return 0;
}

/*
 * The move that evens the loads out most (state.h): from a healthy chain's member
 * on node a to a free target of node b. Returns 1 if one started.
 */
static int plan_balance(struct stk_mgmt_state *st, struct load *l, uint32_t nl)
{
	struct stk_rt_chain *bc = NULL;
	uint32_t bout = 0;
	const struct load *bto = NULL;
	double bgain = 0;

	for (uint32_t i = 0; i < st->nchains; i++) {
		struct stk_rt_chain *c = &st->chains[i];

		if (c->ntargets < 2 || stk_mgmt_state_chain_move(st, c->id) ||
		    !chain_healthy(st, c))
			continue;
		for (uint8_t j = 0; j < c->ntargets; j++) {
			const struct stk_rt_target *o = stk_mgmt_state_target(st, c->targets[j]);
			const struct load *from = NULL;

			for (uint32_t k = 0; k < nl && !from; k++)
				if (l[k].node->id == o->node_id)
					from = &l[k];
			if (!from || from->node->draining || !from->t || !from->m)
				continue;
			for (uint32_t k = 0; k < nl; k++) {
				const struct load *to = &l[k];
				double gain;

				if (to == from || to->free_idx == UINT32_MAX || !to->t ||
				    !evens_out(from, to) || !zone_fits(st, c, o->id, to->node->zone))
					continue;
				gain = (2.0 * from->m - 1) / from->t - (2.0 * to->m + 1) / to->t;
				if (gain > bgain) {
					bgain = gain;
					bc = c;
					bout = o->id;
					bto = to;
				}
			}
		}
	}
	return bc ? move_start(st, bc, bout, &st->targets[bto->free_idx], 0) : 0;
}

int stk_mgmt_state_accept_loss(struct stk_mgmt_state *st, uint32_t chain_id,
			       uint32_t *promoted, uint32_t *dropped, uint32_t *added)
{
	struct stk_rt_chain *c = chain_by_id(st, chain_id);
	struct stk_rt_target *best = NULL;
	struct stk_mgmt_move *m;
	uint8_t want;

	if (!c)
		return -ENOENT;
	if (c->ntargets < 2)
		return -EINVAL; /* one copy: nothing else to serve from */
	for (uint8_t j = 0; j < c->ntargets; j++) {
		struct stk_rt_target *t = stk_mgmt_state_target(st, c->targets[j]);
		const struct stk_mgmt_node *n = t ? stk_mgmt_state_node(st, t->node_id) : NULL;

		if (t && stk_mgmt_target_active(t->state))
			return -EBUSY; /* a member works: nothing is lost */
		/*
		 * The members are ordered newest copy first (chain_lost): the first one
		 * back, unless it is a move's new member, whose copy is unfinished.
		 */
		m = t ? move_with(st, t->id) : NULL;
		if (!best && t && t->state == STK_TARGET_SYNCING && n && n->state == STK_NODE_ONLINE &&
		    !(m && m->in == t->id))
			best = t;
	}
	if (!best)
		return -EAGAIN;
	/* as many members as before, less a move's extra one */
	want = c->ntargets;
	/* a move in flight on it cannot finish: its copy's source is gone */
	for (uint32_t i = 0; i < st->nmoves;) {
		if (st->moves[i].chain_id == c->id) {
			move_abandon(st, &st->moves[i], "every member of its chain was lost");
			want--;
		} else {
			i++;
		}
	}
	*dropped = 0;
	/*
	 * Every other member goes, not only those newer than best: one behind it may
	 * hold chunks newer than best's (a spare that began copying from a member now
	 * lost), which a resync from best (newer_only) would keep. They are WIPING, or
	 * will be when they come back (target_back), and spares copy best's chunks.
	 */
	for (int j = (int)c->ntargets - 1; j >= 0; j--) {
		if (c->targets[j] == best->id)
			continue;
		stk_warn("chain %u: target %u leaves the chain: its copy is given up", c->id,
			 c->targets[j]);
		chain_drop(st, c, c->targets[j]);
		(*dropped)++;
	}
	stk_warn("chain %u: the loss is accepted: target %u serves what it holds; changes "
		 "only the dropped members had are gone",
		 c->id, best->id);
	target_set_state(best, STK_TARGET_SERVING);
	*promoted = best->id;
	*added = 0;
	while (c->ntargets < want) {
		struct stk_rt_target *nt = spare_for(st, c, 0);

		if (!nt)
			break;
		c->targets[c->ntargets++] = nt->id;
		target_set_state(nt, STK_TARGET_SYNCING);
		(*added)++;
	}
	c->version++;
	bump(st);
	return 0;
}

/*
 * Whether follower f of shard sh holds the shard: ONLINE, of the shard's identity
 * (zero while it is copied), and caught up with what was acknowledged before it
 * followed (catch_floor, state.h); what was acknowledged since, it acknowledged.
 */
static int follower_ready(const struct stk_mgmt_shard *sh, const struct stk_mgmt_node *f)
{
	return f && f->state == STK_NODE_ONLINE && stk_ns_id_eq(&f->ns, &sh->ns) &&
	       f->catch_reports >= 2 && f->meta_seq >= f->catch_floor;
}

/*
 * One round of meta drains (`stoker admin drain-node` of a meta node): for each
 * replicated shard, spares join in place of its draining nodes (followers_fill);
 * a draining follower leaves once R - 1 followers that stay hold the shard (with
 * the leader, R copies); a draining leader hands the shard to the follower that
 * stays with the most changes once R followers that stay hold it (so R copies
 * remain after it goes). So a drain never lowers a shard's copies, and waits for
 * a meta node to take its place where none is free. Returns the changes made.
 */
static unsigned meta_drains(struct stk_mgmt_state *st, uint64_t now_ns)
{
	unsigned changes = 0;

	if (st->meta_replicas <= 1)
		return 0;
	for (unsigned k = 0; k < STK_MGMT_MAX_SHARDS; k++) {
		struct stk_mgmt_shard *sh = &st->shards[k];
		struct stk_mgmt_node *lead = stk_mgmt_state_node(st, sh->node), *best = NULL;
		unsigned ready = 0;

		if (stk_ns_id_is_zero(&sh->ns))
			continue;
		drain_fill(st, sh, now_ns);
		for (uint8_t i = 0; i < sh->nfollowers; i++) {
			struct stk_mgmt_node *f = stk_mgmt_state_node(st, sh->followers[i]);

			if (f && !f->draining && follower_ready(sh, f)) {
				ready++;
				if (!best || f->meta_seq > best->meta_seq)
					best = f;
			}
		}
		for (uint8_t i = 0; i < sh->nfollowers;) {
			struct stk_mgmt_node *f = stk_mgmt_state_node(st, sh->followers[i]);

			if (!f || !f->draining || ready + 1 < st->meta_replicas) {
				i++;
				continue;
			}
			follower_drop(sh, f->id);
			new_epoch(st, sh);
			changes++;
			stk_warn("meta node %u (%s) drained: it no longer follows shard %u (epoch "
				 "%llu); %u other copies hold it",
				 f->id, f->addr, k + 1, (unsigned long long)sh->epoch, ready + 1);
		}
		if (lead && lead->draining && best && ready >= st->meta_replicas &&
		    lead->state == STK_NODE_ONLINE) {
			follower_drop(sh, best->id);
			sh->node = best->id;
			new_epoch(st, sh);
			changes++;
			stk_warn("meta node %u (%s) drained: meta node %u (%s) leads shard %u now "
				 "(epoch %llu, change %llu)",
				 lead->id, lead->addr, best->id, best->addr, k + 1,
				 (unsigned long long)sh->epoch, (unsigned long long)best->meta_seq);
		}
	}
	return changes;
}

int stk_mgmt_state_meta_role(const struct stk_mgmt_state *st, uint32_t node_id)
{
	const struct stk_mgmt_node *n = stk_mgmt_state_node((struct stk_mgmt_state *)st, node_id);
	const struct stk_mgmt_shard *sh;

	if (!n || n->role != STK_ROLE_META)
		return 0;
	sh = node_shard((struct stk_mgmt_state *)st, n);
	return sh->node == node_id ? 2 : is_follower(sh, node_id) ? 1 : 0;
}

unsigned stk_mgmt_state_rebalance(struct stk_mgmt_state *st, uint64_t now_ns, unsigned max_moves)
{
	unsigned n = moves_check(st) + meta_drains(st, now_ns);
	struct load *l;
	uint32_t nl;

	if (st->replicas > 1 && settled(st, now_ns) &&
	    reserve((void **)&st->chains, &st->cap_chains,
		    st->nchains + st->ntargets / st->replicas + 1, sizeof(*st->chains)) == 0) {
		uint32_t before = st->nchains;

		form_chains(st);
		n += st->nchains - before;
	}
	if (!st->nnodes)
		return n;
	l = calloc(st->nnodes, sizeof(*l));
	if (!l)
		return n;
	for (;;) {
		int started = 0;

		nl = loads(st, l);
		if (st->nmoves < STK_MAX(max_moves, 1u))
			started = plan_drain(st, l, nl);
		if (!started && st->nmoves < max_moves)
			started = plan_balance(st, l, nl);
		if (!started)
			break;
		n++;
	}
	free(l);
	return n;
}

int stk_mgmt_state_drain(struct stk_mgmt_state *st, uint32_t node_id, int drain)
{
	struct stk_mgmt_node *n = stk_mgmt_state_node(st, node_id);

	if (!n || (n->role != STK_ROLE_STORAGE && n->role != STK_ROLE_META))
		return -ENOENT;
	if (n->role == STK_ROLE_META && drain && st->meta_replicas <= 1)
		return -EOPNOTSUPP; /* one copy: nothing can take its place */
	if (n->draining == !!drain)
		return 0;
	n->draining = (uint8_t)!!drain;
	bump(st);
	if (n->role == STK_ROLE_META) {
		if (drain)
			stk_warn("meta node %u (%s) is draining: another meta node takes its place "
				 "in shard %u",
				 n->id, n->addr, n->shard ? n->shard : 1);
		else
			stk_info("meta node %u (%s) is no longer draining", n->id, n->addr);
		return 0;
	}
	if (drain) {
		stk_warn("node %u (%s) is draining: its chain memberships move to other nodes",
			 n->id, n->addr);
		return 0;
	}
	stk_info("node %u (%s) is no longer draining", n->id, n->addr);
	for (uint32_t i = 0; i < st->nmoves;) {
		struct stk_mgmt_move *m = &st->moves[i];
		const struct stk_rt_target *o = stk_mgmt_state_target(st, m->out);

		if (m->drain && o && o->node_id == node_id)
			move_abandon(st, m, "the drain was cancelled");
		else
			i++;
	}
	return 0;
}

int stk_mgmt_state_target_wiped(struct stk_mgmt_state *st, uint32_t node_id, uint32_t target_id)
{
	struct stk_rt_target *t = stk_mgmt_state_target(st, target_id);

	if (!t || t->node_id != node_id)
		return -ENOENT;
	if (target_has_chain(st, target_id))
		return -ESTALE;
	if (t->state != STK_TARGET_WIPING)
		return 0;
	stk_info("target %u (%s) holds no stale chunk any more: SERVING, free", t->id, t->path);
	target_set_state(t, STK_TARGET_SERVING);
	bump(st);
	return 0;
}

int stk_mgmt_state_encode_routing(const struct stk_mgmt_state *st, uint64_t known_version,
				  uint64_t now_ns, struct stk_wbuf *w)
{
	struct stk_rt_shard shards[STK_MGMT_MAX_SHARDS];
	unsigned nshards = st->meta_shards ? st->meta_shards : 1;
	struct stk_routing rt;
	int rc;

	memset(&rt, 0, sizeof(rt));
	rt.version = st->version;
	if (known_version == st->version)
		return stk_routing_encode(w, &rt);
	rt.nodes = calloc(st->nnodes ? st->nnodes : 1, sizeof(*rt.nodes));
	if (!rt.nodes)
		return -ENOMEM;
	rt.nnodes = st->nnodes;
	for (uint32_t i = 0; i < st->nnodes; i++) {
		const struct stk_mgmt_node *n = &st->nodes[i];
		struct stk_rt_node *o = &rt.nodes[i];

		o->id = n->id;
		o->role = n->role;
		o->state = n->state;
		memcpy(o->addr, n->addr, sizeof(o->addr));
		memcpy(o->host_id, n->host_id, sizeof(o->host_id));
		o->last_seen_ms = now_ns > n->last_hb_ns ? (now_ns - n->last_hb_ns) / 1000000 : 0;
		o->refused = n->refused;
		o->ns = n->ns;
		o->meta_epoch = n->meta_epoch;
		o->meta_seq = n->meta_seq;
		o->shard = n->role == STK_ROLE_META ? (n->shard ? n->shard : 1) : 0;
	}
	/* The tables are kept in their wire types, so they are encoded in place. */
	rt.targets = st->targets;
	rt.ntargets = st->ntargets;
	rt.chains = st->chains;
	rt.nchains = st->nchains;
	rt.shards = shards;
	rt.nshards = 0;
	for (unsigned k = 0; k < nshards; k++) {
		const struct stk_mgmt_shard *sh = &st->shards[k];
		struct stk_rt_shard *o = &shards[rt.nshards];

		/* A shard with an identity is listed also when it has no node: it waits for one. */
		if (!sh->node && stk_ns_id_is_zero(&sh->ns))
			continue;
		memset(o, 0, sizeof(*o));
		o->id = k + 1;
		o->node_id = sh->node;
		o->ns = sh->ns;
		o->epoch = sh->epoch;
		o->replicas = st->meta_replicas;
		o->nfollowers = sh->nfollowers;
		memcpy(o->followers, sh->followers, sizeof(o->followers));
		rt.nshards++;
	}
	rc = stk_routing_encode(w, &rt);
	free(rt.nodes);
	return rc;
}

/* ---- persistence ---- */

static size_t state_size(const struct stk_mgmt_state *st)
{
	size_t sz = STATE_HDR_LEN + 4; /* header fields and the trailing CRC */

	for (uint32_t i = 0; i < st->nnodes; i++)
		sz += STATE_MIN_NODE + STATE_NODE_IDENT + strlen(st->nodes[i].addr);
	for (uint32_t i = 0; i < st->ntargets; i++)
		sz += STATE_MIN_TARGET + strlen(st->targets[i].path);
	for (uint32_t i = 0; i < st->nchains; i++)
		sz += STATE_MIN_CHAIN + 4u * st->chains[i].ntargets;
	sz += 1; /* format 3: replicas, zones */
	for (uint32_t i = 0; i < st->nnodes; i++)
		sz += 2 + strlen(st->nodes[i].zone);
	sz += st->nnodes + 4 + (size_t)st->nmoves * STATE_MOVE; /* format 4 */
	sz += 12; /* format 5/6: next_client_gen, nclients */
	for (uint32_t i = 0; i < st->nclients; i++)
		sz += STATE_MIN_CLIENT + strlen(st->clients[i].id.name) +
		      strlen(st->clients[i].id.subtree);
	sz += 1 + 8 + 1 + 4u * STK_MAX_REPLICAS; /* format 6: meta replicas */
	sz += 4 + (size_t)st->nqos * (2 + STK_CLIENT_NAME_MAX + 20); /* format 7: QoS limits */
	sz += 1 + st->nnodes + /* format 8: the other shards */
	      (size_t)STK_MGMT_MAX_SHARDS * (4 + 16 + 8 + 1 + 4u * STK_MAX_REPLICAS);
	return sz;
}

int stk_mgmt_state_encode(const struct stk_mgmt_state *st, uint8_t **out, size_t *len)
{
	size_t cap = state_size(st);
	struct stk_wbuf w;
	uint8_t *buf;
	int rc;

	buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	stk_wbuf_init(&w, buf, cap);
	stk_put_u32(&w, STATE_MAGIC);
	stk_put_u32(&w, STATE_FORMAT);
	stk_put_u64(&w, st->version);
	stk_put_u32(&w, st->next_node_id);
	stk_put_u32(&w, st->next_target_id);
	stk_put_u32(&w, st->shards[0].node);
	stk_put_u64(&w, st->shards[0].ns.hi);
	stk_put_u64(&w, st->shards[0].ns.lo);
	stk_put_u32(&w, st->nnodes);
	stk_put_u32(&w, st->ntargets);
	stk_put_u32(&w, st->nchains);
	for (uint32_t i = 0; i < st->nnodes; i++) {
		const struct stk_mgmt_node *n = &st->nodes[i];
		stk_put_u32(&w, n->id);
		stk_put_u8(&w, n->role);
		stk_put_u8(&w, n->state);
		stk_put_str(&w, n->addr);
		stk_put_i64(&w, n->last_hb_wall_ms);
		stk_put_u8(&w, n->refused);
		stk_put_u64(&w, n->ns.hi);
		stk_put_u64(&w, n->ns.lo);
	}
	for (uint32_t i = 0; i < st->ntargets; i++) {
		const struct stk_rt_target *t = &st->targets[i];
		stk_put_u32(&w, t->id);
		stk_put_u32(&w, t->node_id);
		stk_put_u8(&w, t->state);
		stk_put_u64(&w, t->capacity);
		stk_put_u64(&w, t->used);
		stk_put_u64(&w, t->chunks);
		stk_put_str(&w, t->path);
	}
	for (uint32_t i = 0; i < st->nchains; i++) {
		const struct stk_rt_chain *c = &st->chains[i];
		stk_put_u32(&w, c->id);
		stk_put_u32(&w, c->version);
		stk_put_u8(&w, c->ntargets);
		for (uint8_t j = 0; j < c->ntargets; j++)
			stk_put_u32(&w, c->targets[j]);
	}
	stk_put_u8(&w, st->replicas);
	for (uint32_t i = 0; i < st->nnodes; i++)
		stk_put_str(&w, st->nodes[i].zone);
	for (uint32_t i = 0; i < st->nnodes; i++)
		stk_put_u8(&w, st->nodes[i].draining);
	stk_put_u32(&w, st->nmoves);
	for (uint32_t i = 0; i < st->nmoves; i++) {
		const struct stk_mgmt_move *m = &st->moves[i];

		stk_put_u32(&w, m->chain_id);
		stk_put_u32(&w, m->out);
		stk_put_u32(&w, m->in);
		stk_put_u8(&w, m->drain);
	}
	stk_put_u64(&w, st->next_client_gen);
	stk_put_u32(&w, st->nclients);
	for (uint32_t i = 0; i < st->nclients; i++) {
		const struct stk_mgmt_client *c = &st->clients[i];

		stk_put_str(&w, c->id.name);
		stk_put_u64(&w, c->id.gen);
		stk_put_u32(&w, c->id.flags);
		stk_put_u32(&w, c->id.anon_uid);
		stk_put_u32(&w, c->id.anon_gid);
		stk_put_str(&w, c->id.subtree);
		stk_put_u8(&w, c->removed);
	}
	stk_put_u8(&w, st->meta_replicas);
	stk_put_u64(&w, st->shards[0].epoch);
	stk_put_u8(&w, st->shards[0].nfollowers);
	for (uint8_t i = 0; i < st->shards[0].nfollowers; i++)
		stk_put_u32(&w, st->shards[0].followers[i]);
	stk_put_u32(&w, st->nqos);
	for (uint32_t i = 0; i < st->nqos; i++)
		stk_msg_qos_rec_enc(&w, &st->qos[i]);
	stk_put_u8(&w, st->meta_shards);
	for (uint32_t i = 0; i < st->nnodes; i++)
		stk_put_u8(&w, st->nodes[i].shard);
	for (unsigned k = 1; k < st->meta_shards && k < STK_MGMT_MAX_SHARDS; k++) {
		const struct stk_mgmt_shard *sh = &st->shards[k];

		stk_put_u32(&w, sh->node);
		stk_put_u64(&w, sh->ns.hi);
		stk_put_u64(&w, sh->ns.lo);
		stk_put_u64(&w, sh->epoch);
		stk_put_u8(&w, sh->nfollowers);
		for (uint8_t i = 0; i < sh->nfollowers; i++)
			stk_put_u32(&w, sh->followers[i]);
	}
	stk_put_u32(&w, stk_crc32c(0, buf, w.len));
	rc = w.err;
	if (rc) {
		free(buf);
		return rc;
	}
	*out = buf;
	*len = w.len;
	return 0;
}

int stk_mgmt_state_save(struct stk_mgmt_state *st, const char *path)
{
	uint8_t *buf;
	size_t len;
	int rc;

	rc = stk_mgmt_state_encode(st, &buf, &len);
	if (rc)
		return rc;
	rc = stk_write_file_atomic(path, buf, len);
	if (rc == 0)
		st->dirty = 0;
	free(buf);
	return rc;
}

/* Reads the whole file into a new buffer. */
static int read_file(const char *path, uint8_t **out, size_t *len)
{
	struct stat sb;
	uint8_t *buf = NULL;
	long got;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) < 0) {
		rc = -errno;
		goto out;
	}
	rc = -EBADMSG;
	if (sb.st_size < 8 || (uint64_t)sb.st_size > STATE_MAX_FILE)
		goto out;
	rc = -ENOMEM;
	buf = malloc((size_t)sb.st_size);
	if (!buf)
		goto out;
	got = stk_read_full(fd, buf, (size_t)sb.st_size);
	if (got < 0) {
		rc = (int)got;
		goto out;
	}
	rc = -EBADMSG;
	if ((size_t)got != (size_t)sb.st_size)
		goto out;
	*out = buf;
	*len = (size_t)got;
	buf = NULL;
	rc = 0;
out:
	free(buf);
	close(fd);
	return rc;
}

/* Format 5 (main's) and 6: the client list. 0, -EBADMSG or -ENOMEM. */
static int decode_clients(struct stk_rbuf *r, struct stk_mgmt_state *st)
{
	uint32_t ncl;

	st->next_client_gen = stk_get_u64(r);
	ncl = stk_get_u32(r);
	if (r->err || (uint64_t)ncl * STATE_MIN_CLIENT > r->len - r->off)
		return -EBADMSG;
	if (reserve((void **)&st->clients, &st->cap_clients, ncl, sizeof(*st->clients)))
		return -ENOMEM;
	for (uint32_t i = 0; i < ncl; i++) {
		struct stk_mgmt_client *c = &st->clients[i];

		memset(c, 0, sizeof(*c));
		stk_get_str(r, c->id.name, sizeof(c->id.name));
		c->id.gen = stk_get_u64(r);
		c->id.flags = stk_get_u32(r);
		c->id.anon_uid = stk_get_u32(r);
		c->id.anon_gid = stk_get_u32(r);
		stk_get_str(r, c->id.subtree, sizeof(c->id.subtree));
		c->removed = stk_get_u8(r) != 0;
	}
	st->nclients = ncl;
	return r->err;
}

/* Format 5 (metarepl's) and 6: the meta shard's replicas. 0 or -EBADMSG. */
static int decode_meta_repl(struct stk_rbuf *r, struct stk_mgmt_state *st)
{
	st->meta_replicas = stk_get_u8(r);
	st->shards[0].epoch = stk_get_u64(r);
	st->shards[0].nfollowers = stk_get_u8(r);
	if (r->err || st->shards[0].nfollowers > STK_MAX_REPLICAS)
		return -EBADMSG;
	for (uint8_t i = 0; i < st->shards[0].nfollowers; i++)
		st->shards[0].followers[i] = stk_get_u32(r);
	return r->err;
}

static int decode_state(struct stk_rbuf *r, struct stk_mgmt_state *st, uint64_t now_ns)
{
	uint32_t nn, nt, nc, format;
	int rc;

	if (stk_get_u32(r) != STATE_MAGIC)
		return -EBADMSG;
	format = stk_get_u32(r);
	if (format < 1 || format > STATE_FORMAT)
		return -EBADMSG;
	st->version = stk_get_u64(r);
	st->next_node_id = stk_get_u32(r);
	st->next_target_id = stk_get_u32(r);
	st->shards[0].node = stk_get_u32(r);
	/* Format 1 knew no identities: the owner gives the shard its own when it registers. */
	if (format >= 2) {
		st->shards[0].ns.hi = stk_get_u64(r);
		st->shards[0].ns.lo = stk_get_u64(r);
	}
	nn = stk_get_u32(r);
	nt = stk_get_u32(r);
	nc = stk_get_u32(r);
	if (r->err)
		return -EBADMSG;
	if ((uint64_t)nn * STATE_MIN_NODE + (uint64_t)nt * STATE_MIN_TARGET +
		(uint64_t)nc * STATE_MIN_CHAIN >
	    r->len - r->off)
		return -EBADMSG;
	if (reserve((void **)&st->nodes, &st->cap_nodes, nn, sizeof(*st->nodes)) ||
	    reserve((void **)&st->targets, &st->cap_targets, nt, sizeof(*st->targets)) ||
	    reserve((void **)&st->chains, &st->cap_chains, nc, sizeof(*st->chains)))
		return -ENOMEM;
	for (uint32_t i = 0; i < nn; i++) {
		struct stk_mgmt_node *n = &st->nodes[i];
		memset(n, 0, sizeof(*n));
		n->id = stk_get_u32(r);
		n->role = stk_get_u8(r);
		n->state = stk_get_u8(r);
		stk_get_str(r, n->addr, sizeof(n->addr));
		n->last_hb_wall_ms = stk_get_i64(r);
		if (format >= 2) {
			n->refused = stk_get_u8(r);
			n->ns.hi = stk_get_u64(r);
			n->ns.lo = stk_get_u64(r);
		}
		n->last_hb_ns = now_ns;
		if (n->state != STK_NODE_ONLINE && n->state != STK_NODE_OFFLINE)
			return -EBADMSG;
	}
	st->nnodes = nn;
	for (uint32_t i = 0; i < nt; i++) {
		struct stk_rt_target *t = &st->targets[i];
		memset(t, 0, sizeof(*t));
		t->id = stk_get_u32(r);
		t->node_id = stk_get_u32(r);
		t->state = stk_get_u8(r);
		t->capacity = stk_get_u64(r);
		t->used = stk_get_u64(r);
		t->chunks = stk_get_u64(r);
		stk_get_str(r, t->path, sizeof(t->path));
	}
	st->ntargets = nt;
	for (uint32_t i = 0; i < nc; i++) {
		struct stk_rt_chain *c = &st->chains[i];
		memset(c, 0, sizeof(*c));
		c->id = stk_get_u32(r);
		c->version = stk_get_u32(r);
		c->ntargets = stk_get_u8(r);
		/* Chains are numbered densely from 1; lookups rely on chains[i].id == i + 1. */
		if (c->ntargets > STK_MAX_REPLICAS || c->id != i + 1)
			return -EBADMSG;
		for (uint8_t j = 0; j < c->ntargets; j++)
			c->targets[j] = stk_get_u32(r);
	}
	st->nchains = nc;
	if (format >= 3) {
		st->replicas = stk_get_u8(r);
		for (uint32_t i = 0; i < nn; i++)
			stk_get_str(r, st->nodes[i].zone, sizeof(st->nodes[i].zone));
	}
	if (format >= 4) {
		uint32_t nm;

		for (uint32_t i = 0; i < nn; i++)
			st->nodes[i].draining = stk_get_u8(r) != 0;
		nm = stk_get_u32(r);
		if (r->err || (uint64_t)nm * STATE_MOVE > r->len - r->off)
			return -EBADMSG;
		if (reserve((void **)&st->moves, &st->cap_moves, nm, sizeof(*st->moves)))
			return -ENOMEM;
		/* a move that no longer fits its chain is abandoned by the next round */
		for (uint32_t i = 0; i < nm; i++) {
			struct stk_mgmt_move *m = &st->moves[i];

			m->chain_id = stk_get_u32(r);
			m->out = stk_get_u32(r);
			m->in = stk_get_u32(r);
			m->drain = stk_get_u8(r);
		}
		st->nmoves = nm;
	}
	if (format >= 5) {
		/*
		 * Format 5 was written by two branches: the client list (main's) or
		 * the meta replicas (metarepl's), each the file's last field. The
		 * other's layout does not end exactly at the file's end, so try the
		 * client list and fall back on the replicas.
		 */
		size_t at = r->off;

		rc = decode_clients(r, st);
		if (rc == -ENOMEM)
			return rc;
		if (format == 5 && (rc || r->off != r->len)) {
			r->off = at;
			r->err = 0;
			st->nclients = 0;
			st->next_client_gen = 0;
			rc = decode_meta_repl(r, st);
		} else if (format >= 6 && rc == 0) {
			rc = decode_meta_repl(r, st);
		}
		if (rc)
			return rc;
	}
	if (format >= 7) {
		uint32_t nq = stk_get_u32(r);

		if (r->err || nq > STK_QOS_MAX)
			return -EBADMSG;
		for (uint32_t i = 0; i < nq; i++)
			if (stk_msg_qos_rec_dec(r, &st->qos[i]))
				return -EBADMSG;
		st->nqos = nq;
	}
	if (format >= 8) {
		st->meta_shards = stk_get_u8(r);
		if (r->err || st->meta_shards > STK_MGMT_MAX_SHARDS)
			return -EBADMSG;
		for (uint32_t i = 0; i < nn; i++) {
			st->nodes[i].shard = stk_get_u8(r);
			if (st->nodes[i].shard > STK_MGMT_MAX_SHARDS)
				return -EBADMSG;
		}
		for (unsigned k = 1; k < st->meta_shards; k++) {
			struct stk_mgmt_shard *sh = &st->shards[k];

			sh->node = stk_get_u32(r);
			sh->ns.hi = stk_get_u64(r);
			sh->ns.lo = stk_get_u64(r);
			sh->epoch = stk_get_u64(r);
			sh->nfollowers = stk_get_u8(r);
			if (r->err || sh->nfollowers > STK_MAX_REPLICAS)
				return -EBADMSG;
			for (uint8_t i = 0; i < sh->nfollowers; i++)
				sh->followers[i] = stk_get_u32(r);
		}
	}
	if (r->err || st->version == 0 || st->next_node_id == 0 || st->next_target_id == 0)
		return -EBADMSG;
	return 0;
}

int stk_mgmt_state_decode(struct stk_mgmt_state *st, const uint8_t *buf, size_t len,
			  uint64_t now_ns)
{
	struct stk_mgmt_state fresh;
	struct stk_rbuf r;
	uint32_t crc;
	int rc;

	if (len < 8 || len > STATE_MAX_FILE)
		return -EBADMSG;
	stk_mgmt_state_init(&fresh);
	rc = -EBADMSG;
	stk_rbuf_init(&r, buf + len - 4, 4);
	crc = stk_get_u32(&r);
	if (crc != stk_crc32c(0, buf, len - 4))
		goto out;
	stk_rbuf_init(&r, buf, len - 4);
	rc = decode_state(&r, &fresh, now_ns);
	if (rc == 0)
		rc = stk_rbuf_finish(&r);
	if (rc)
		goto out;
	stk_mgmt_state_free(st);
	*st = fresh;
	stk_mgmt_state_init(&fresh);
out:
	stk_mgmt_state_free(&fresh);
	return rc;
}

int stk_mgmt_state_load(struct stk_mgmt_state *st, const char *path, uint64_t now_ns)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	rc = read_file(path, &buf, &len);
	if (rc)
		return rc;
	rc = stk_mgmt_state_decode(st, buf, len, now_ns);
	free(buf);
	return rc;
}

/* ---- client identities ---- */

int stk_mgmt_state_client_add(struct stk_mgmt_state *st, struct stk_auth_client *c)
{
	char err[256];

	if (stk_auth_client_valid(c, err, sizeof(err)))
		return -EINVAL;
	for (uint32_t i = 0; i < st->nclients; i++)
		if (!st->clients[i].removed && strcmp(st->clients[i].id.name, c->name) == 0)
			return -EEXIST;
	if (reserve((void **)&st->clients, &st->cap_clients, st->nclients + 1,
		    sizeof(*st->clients)))
		return -ENOMEM;
	if (st->next_client_gen == 0)
		st->next_client_gen = 1;
	c->gen = st->next_client_gen++;
	memset(&st->clients[st->nclients], 0, sizeof(st->clients[0]));
	st->clients[st->nclients++].id = *c;
	bump(st);
	return 0;
}

int stk_mgmt_state_client_rm(struct stk_mgmt_state *st, const char *name, uint64_t *gen)
{
	for (uint32_t i = 0; i < st->nclients; i++) {
		struct stk_mgmt_client *c = &st->clients[i];

		if (!c->removed && strcmp(c->id.name, name) == 0) {
			c->removed = 1;
			*gen = c->id.gen;
			bump(st);
			return 0;
		}
	}
	return -ENOENT;
}

/* ---- QoS limits ---- */

int stk_mgmt_state_qos_set(struct stk_mgmt_state *st, const struct stk_msg_qos_rec *q)
{
	struct stk_auth_client c;
	char err[256];
	uint32_t i;

	/*
	 * A tenant is named as a client key is (a name is checked by its rules); a
	 * class's own limits are "@default" and "@checkpoint", capped by nothing.
	 */
	memset(&c, 0, sizeof(c));
	if (strlen(q->tenant) > STK_CLIENT_NAME_MAX)
		return -EINVAL;
	if (q->tenant[0] == '@') {
		if ((strcmp(q->tenant, "@default") && strcmp(q->tenant, "@checkpoint")) ||
		    q->max_class != STK_QOS_CLASS_ANY)
			return -EINVAL;
	} else {
		stk_strlcpy(c.name, q->tenant, sizeof(c.name));
		c.subtree[0] = '/';
		if (stk_auth_client_valid(&c, err, sizeof(err)))
			return -EINVAL;
		if (q->max_class > STK_QOS_CLASS_LOWEST && q->max_class != STK_QOS_CLASS_ANY)
			return -EINVAL;
	}
	for (i = 0; i < st->nqos; i++)
		if (strcmp(st->qos[i].tenant, q->tenant) == 0)
			break;
	if (i == st->nqos) {
		if (st->nqos >= STK_QOS_MAX)
			return -ENOSPC;
		st->nqos++;
	}
	st->qos[i] = *q;
	bump(st);
	return 0;
}

int stk_mgmt_state_qos_rm(struct stk_mgmt_state *st, const char *tenant)
{
	for (uint32_t i = 0; i < st->nqos; i++) {
		if (strcmp(st->qos[i].tenant, tenant) == 0) {
			st->qos[i] = st->qos[--st->nqos];
			bump(st);
			return 0;
		}
	}
	return -ENOENT;
}

int stk_mgmt_state_clients_revoked(const struct stk_mgmt_state *st, struct stk_auth_client **out,
				   uint32_t *n)
{
	struct stk_auth_client *a = NULL;
	uint32_t k = 0;

	for (uint32_t i = 0; i < st->nclients; i++)
		k += st->clients[i].removed;
	if (k && !(a = malloc((size_t)k * sizeof(*a))))
		return -ENOMEM;
	k = 0;
	for (uint32_t i = 0; i < st->nclients; i++)
		if (st->clients[i].removed)
			a[k++] = st->clients[i].id;
	*out = a;
	*n = k;
	return 0;
}
