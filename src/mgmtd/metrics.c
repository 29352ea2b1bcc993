/*
 * mgmtd's cluster metrics (see metrics.h).
 *
 * Everything here is read, not counted: at each scrape the collector walks the
 * node, target and chain tables under mgmtd's lock and sets gauges. Per-node and
 * per-target series are registered as nodes and targets appear (they are never
 * removed from mgmtd's state, so neither are their series), and named by id, not
 * address, so that a node that moves keeps its series.
 *
 * Capacity totals: the sums of what the targets report, each device counted once
 * (stk_host_space_sum), however many targets of however many nodes share it.
 *
 * The routing version is a clock-derived 64-bit number that a Prometheus float
 * cannot hold exactly, so bumps are also counted (stoker_cluster_routing_changes_total),
 * which changes() and increase() handle.
 */
#include "metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/host.h"
#include "../common/metrics.h"

#define NROLES 2  /* meta, storage */
#define NSTATES 5 /* serving, offline, full, syncing, wiping */
#define NHEALTH 3 /* chains: healthy, degraded, unavailable */

struct stk_mgmtd_metrics {
	pthread_mutex_t *lock;
	const struct stk_mgmt_state *st;
	stk_metric_t nodes[NROLES][2]; /* [role][online, offline] */
	stk_metric_t targets[NSTATES];
	stk_metric_t chain_health[NHEALTH];
	stk_metric_t chains, version, changes, capacity, used, avail;
	stk_metric_t moves[3], in_flight, wiped_chunks, wiped_bytes; /* moves: started, finished, abandoned */
	uint64_t last_version; /* under the scrape serialisation of the registry */
	uint64_t nchanges;
};

static const uint8_t roles[NROLES] = {STK_ROLE_META, STK_ROLE_STORAGE};
static const uint8_t tstates[NSTATES] = {STK_TARGET_SERVING, STK_TARGET_OFFLINE, STK_TARGET_FULL,
					   STK_TARGET_SYNCING, STK_TARGET_WIPING};
static const char *const tstate_names[NSTATES] = {"serving", "offline", "full", "syncing",
						    "wiping"};
static const char *const health_names[NHEALTH] = {"healthy", "degraded", "unavailable"};

static int role_index(uint8_t role)
{
	for (int i = 0; i < NROLES; i++)
		if (roles[i] == role)
			return i;
	return -1;
}

static void collect(void *ctx)
{
	struct stk_mgmtd_metrics *mm = ctx;
	const struct stk_mgmt_state *st = mm->st;
	int64_t nodes[NROLES][2] = {{0}}, targets[NSTATES] = {0}, health[NHEALTH] = {0};
	struct stk_space sp;
	int have_space;

	pthread_mutex_lock(mm->lock);
	have_space = stk_host_space_sum(st->targets, st->ntargets, &sp) == 0;
	for (uint32_t i = 0; i < st->nnodes; i++) {
		const struct stk_mgmt_node *n = &st->nodes[i];
		int r = role_index(n->role), online = n->state == STK_NODE_ONLINE;
		char id[16];
		const char *v[2] = {id, stk_mgmt_role_name(n->role)};
		stk_metric_t s;

		if (r >= 0)
			nodes[r][online ? 0 : 1]++;
		snprintf(id, sizeof(id), "%u", n->id);
		if (stk_metric_series(STK_M_CLUSTER_NODE_ONLINE, v, &s) == 0)
			stk_metric_set_int(s, online);
		if (n->role != STK_ROLE_STORAGE)
			continue;
		if (stk_metric_series(STK_M_CLUSTER_NODE_MEMBERS, v, &s) == 0)
			stk_metric_set_int(s, stk_mgmt_state_node_members(st, n->id));
		if (stk_metric_series(STK_M_CLUSTER_NODE_DRAINING, v, &s) == 0)
			stk_metric_set_int(s, n->draining);
	}
	for (uint32_t i = 0; i < st->ntargets; i++) {
		const struct stk_rt_target *t = &st->targets[i];
		char id[16], node[16];
		const char *v[2] = {id, node};
		stk_metric_t s;

		for (int k = 0; k < NSTATES; k++)
			if (tstates[k] == t->state)
				targets[k]++;
		snprintf(id, sizeof(id), "%u", t->id);
		snprintf(node, sizeof(node), "%u", t->node_id);
		if (stk_metric_series(STK_M_CLUSTER_TARGET_SERVING, v, &s) == 0)
			stk_metric_set_int(s, t->state == STK_TARGET_SERVING);
		/*
		 * Every state, 1 for the one it is in: "offline" alerts must not fire for a
		 * target that is only full, which target_serving cannot tell apart.
		 */
		for (int k = 0; k < NSTATES; k++) {
			const char *sv[3] = {id, node, tstate_names[k]};

			if (stk_metric_series(STK_M_CLUSTER_TARGET_STATE, sv, &s) == 0)
				stk_metric_set_int(s, t->state == tstates[k]);
		}
		if (stk_metric_series(STK_M_CLUSTER_TARGET_STATE_CHANGES, v, &s) == 0)
			stk_metric_set_int(s, t->state_changes);
		if (stk_metric_series(STK_M_CLUSTER_TARGET_RESYNC_PROGRESS, v, &s) == 0)
			stk_metric_set(s, t->state == STK_TARGET_SYNCING ? t->sync_permille / 1000.0
									 : 0);
		if (stk_metric_series(STK_M_CLUSTER_TARGET_RESYNC_CHECKED, v, &s) == 0)
			stk_metric_set_int(s, t->state == STK_TARGET_SYNCING
						      ? (int64_t)t->sync_checked
						      : 0);
	}
	for (uint32_t i = 0; i < st->nchains; i++)
		if (st->chains[i].ntargets)
			health[stk_mgmt_state_chain_health(st, &st->chains[i])]++;
	if (st->version > mm->last_version) {
		mm->nchanges += st->version - mm->last_version;
		mm->last_version = st->version;
	}
	stk_metric_set_int(mm->moves[0], (int64_t)st->moves_started);
	stk_metric_set_int(mm->moves[1], (int64_t)st->moves_finished);
	stk_metric_set_int(mm->moves[2], (int64_t)st->moves_abandoned);
	stk_metric_set_int(mm->in_flight, st->nmoves);
	stk_metric_set_int(mm->wiped_chunks, (int64_t)st->wiped_chunks);
	stk_metric_set_int(mm->wiped_bytes, (int64_t)st->wiped_bytes);
	stk_metric_set_int(mm->chains, st->nchains);
	stk_metric_set_int(mm->version, (int64_t)st->version);
	pthread_mutex_unlock(mm->lock);
	stk_metric_set_int(mm->changes, (int64_t)mm->nchanges);
	if (have_space) {
		stk_metric_set_int(mm->capacity, (int64_t)sp.capacity);
		stk_metric_set_int(mm->used, (int64_t)sp.used);
		stk_metric_set_int(mm->avail, (int64_t)sp.avail);
	}
	for (int r = 0; r < NROLES; r++)
		for (int o = 0; o < 2; o++)
			stk_metric_set_int(mm->nodes[r][o], nodes[r][o]);
	for (int k = 0; k < NSTATES; k++)
		stk_metric_set_int(mm->targets[k], targets[k]);
	for (int k = 0; k < NHEALTH; k++)
		stk_metric_set_int(mm->chain_health[k], health[k]);
}

int stk_mgmtd_metrics_create(pthread_mutex_t *lock, const struct stk_mgmt_state *st,
			     struct stk_mgmtd_metrics **out)
{
	struct stk_mgmtd_metrics *mm = calloc(1, sizeof(*mm));
	int rc = 0;

	*out = NULL;
	if (!mm)
		return -ENOMEM;
	mm->lock = lock;
	mm->st = st;
	/* Every role and state from the start, at zero: "no node offline" is a 0, not a gap. */
	for (int r = 0; r < NROLES && !rc; r++) {
		const char *on[2] = {stk_mgmt_role_name(roles[r]), "online"};
		const char *off[2] = {stk_mgmt_role_name(roles[r]), "offline"};
		rc = stk_metric_series(STK_M_CLUSTER_NODES, on, &mm->nodes[r][0]);
		rc = rc ? rc : stk_metric_series(STK_M_CLUSTER_NODES, off, &mm->nodes[r][1]);
	}
	for (int k = 0; k < NSTATES && !rc; k++) {
		const char *v[1] = {tstate_names[k]};
		rc = stk_metric_series(STK_M_CLUSTER_TARGETS, v, &mm->targets[k]);
	}
	for (int k = 0; k < NHEALTH && !rc; k++) {
		const char *v[1] = {health_names[k]};
		rc = stk_metric_series(STK_M_CLUSTER_CHAINS_BY_STATE, v, &mm->chain_health[k]);
	}
	for (int k = 0; k < 3 && !rc; k++) {
		static const char *const events[3] = {"started", "finished", "abandoned"};
		const char *v[1] = {events[k]};

		rc = stk_metric_series(STK_M_CLUSTER_MOVES, v, &mm->moves[k]);
	}
	rc = rc ? rc : stk_metric_series(STK_M_CLUSTER_MOVES_IN_FLIGHT, NULL, &mm->in_flight);
	rc = rc ? rc : stk_metric_series(STK_M_CLUSTER_WIPED_CHUNKS, NULL, &mm->wiped_chunks);
	rc = rc ? rc : stk_metric_series(STK_M_CLUSTER_WIPED_BYTES, NULL, &mm->wiped_bytes);
	rc = rc ? rc : stk_metric_series(STK_M_CLUSTER_CHAINS, NULL, &mm->chains);
	rc = rc ? rc : stk_metric_series(STK_M_CLUSTER_ROUTING_VERSION, NULL, &mm->version);
	rc = rc ? rc : stk_metric_series(STK_M_CLUSTER_ROUTING_CHANGES, NULL, &mm->changes);
	rc = rc ? rc : stk_metric_series(STK_M_CLUSTER_CAPACITY, NULL, &mm->capacity);
	rc = rc ? rc : stk_metric_series(STK_M_CLUSTER_USED, NULL, &mm->used);
	rc = rc ? rc : stk_metric_series(STK_M_CLUSTER_AVAILABLE, NULL, &mm->avail);
	if (rc)
		goto out;
	pthread_mutex_lock(lock);
	mm->last_version = st->version;
	pthread_mutex_unlock(lock);
	rc = stk_metrics_collector_add(collect, mm);
	if (rc)
		goto out;
	*out = mm;
	return 0;
out:
	free(mm);
	return rc;
}

void stk_mgmtd_metrics_destroy(struct stk_mgmtd_metrics *mm)
{
	if (!mm)
		return;
	stk_metrics_collector_remove(collect, mm);
	free(mm);
}
