/*
 * Encoders and decoders generated from the field lists in msg.h, plus the nested
 * types (cred, layout, attr) and the routing table, which has arrays.
 */
#include "msg.h"
#include "wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void stk_cred_enc(struct stk_wbuf *w, const struct stk_cred *c)
{
	uint8_t n = c->ngroups > STK_MAX_GROUPS ? STK_MAX_GROUPS : c->ngroups;

	stk_put_u32(w, c->uid);
	stk_put_u32(w, c->gid);
	stk_put_u8(w, n);
	for (uint8_t i = 0; i < n; i++)
		stk_put_u32(w, c->groups[i]);
}

void stk_cred_dec(struct stk_rbuf *r, struct stk_cred *c)
{
	c->uid = stk_get_u32(r);
	c->gid = stk_get_u32(r);
	c->ngroups = stk_get_u8(r);
	if (c->ngroups > STK_MAX_GROUPS) {
		r->err = -EBADMSG;
		c->ngroups = 0;
		return;
	}
	for (uint8_t i = 0; i < c->ngroups; i++)
		c->groups[i] = stk_get_u32(r);
}

void stk_layout_enc(struct stk_wbuf *w, const struct stk_layout *l)
{
	stk_put_u32(w, l->chunk_size);
	stk_put_u32(w, l->stripe);
	stk_put_u32(w, l->nchains);
	stk_put_u32(w, l->start);
	stk_put_u64(w, l->seed);
}

void stk_layout_dec(struct stk_rbuf *r, struct stk_layout *l)
{
	l->chunk_size = stk_get_u32(r);
	l->stripe = stk_get_u32(r);
	l->nchains = stk_get_u32(r);
	l->start = stk_get_u32(r);
	l->seed = stk_get_u64(r);
}

void stk_attr_enc_base(struct stk_wbuf *w, const struct stk_attr *a)
{
	stk_put_u64(w, a->ino);
	stk_put_u32(w, a->mode);
	stk_put_u32(w, a->nlink);
	stk_put_u32(w, a->uid);
	stk_put_u32(w, a->gid);
	stk_put_u64(w, a->size);
	stk_put_i64(w, a->atime_sec);
	stk_put_u32(w, a->atime_nsec);
	stk_put_i64(w, a->mtime_sec);
	stk_put_u32(w, a->mtime_nsec);
	stk_put_i64(w, a->ctime_sec);
	stk_put_u32(w, a->ctime_nsec);
	stk_put_u64(w, a->blocks);
	stk_layout_enc(w, &a->layout);
	stk_put_u64(w, a->rdev);
}

void stk_attr_enc(struct stk_wbuf *w, const struct stk_attr *a)
{
	stk_attr_enc_base(w, a);
	stk_put_u64(w, a->qid);
}

void stk_attr_dec_base(struct stk_rbuf *r, struct stk_attr *a)
{
	a->ino = stk_get_u64(r);
	a->mode = stk_get_u32(r);
	a->nlink = stk_get_u32(r);
	a->uid = stk_get_u32(r);
	a->gid = stk_get_u32(r);
	a->size = stk_get_u64(r);
	a->atime_sec = stk_get_i64(r);
	a->atime_nsec = stk_get_u32(r);
	a->mtime_sec = stk_get_i64(r);
	a->mtime_nsec = stk_get_u32(r);
	a->ctime_sec = stk_get_i64(r);
	a->ctime_nsec = stk_get_u32(r);
	a->blocks = stk_get_u64(r);
	stk_layout_dec(r, &a->layout);
	a->rdev = stk_get_u64(r);
	a->qid = 0;
}

void stk_attr_dec(struct stk_rbuf *r, struct stk_attr *a)
{
	stk_attr_dec_base(r, a);
	a->qid = stk_get_u64(r);
}

#define STK_FENC_u8(w, v) stk_put_u8(w, v)
#define STK_FENC_u16(w, v) stk_put_u16(w, v)
#define STK_FENC_u32(w, v) stk_put_u32(w, v)
#define STK_FENC_u64(w, v) stk_put_u64(w, v)
#define STK_FENC_i64(w, v) stk_put_i64(w, v)
#define STK_FENC_name(w, v) stk_put_str(w, v)
#define STK_FENC_path(w, v) stk_put_str(w, v)
#define STK_FENC_addr(w, v) stk_put_str(w, v)
#define STK_FENC_cred(w, v) stk_cred_enc(w, &(v))
#define STK_FENC_layout(w, v) stk_layout_enc(w, &(v))
#define STK_FENC_attr(w, v) stk_attr_enc(w, &(v))
#define STK_FENC_b32(w, v) stk_put_bytes(w, v, 32)
#define STK_FENC(type, n) STK_FENC_##type(w, m->n);

#define STK_FDEC_u8(r, v) v = stk_get_u8(r)
#define STK_FDEC_u16(r, v) v = stk_get_u16(r)
#define STK_FDEC_u32(r, v) v = stk_get_u32(r)
#define STK_FDEC_u64(r, v) v = stk_get_u64(r)
#define STK_FDEC_i64(r, v) v = stk_get_i64(r)
#define STK_FDEC_name(r, v) stk_get_str(r, v, sizeof(v))
#define STK_FDEC_path(r, v) stk_get_str(r, v, sizeof(v))
#define STK_FDEC_addr(r, v) stk_get_str(r, v, sizeof(v))
#define STK_FDEC_cred(r, v) stk_cred_dec(r, &(v))
#define STK_FDEC_layout(r, v) stk_layout_dec(r, &(v))
#define STK_FDEC_attr(r, v) stk_attr_dec(r, &(v))
#define STK_FDEC_b32(r, v) stk_get_bytes(r, v, 32)
#define STK_FDEC(type, n) STK_FDEC_##type(r, m->n);

#define STK_MSG_IMPL(sname, LIST)                                                     \
	int stk_msg_##sname##_enc(struct stk_wbuf *w, const struct stk_msg_##sname *m) \
	{                                                                              \
		(void)m;                                                               \
		LIST(STK_FENC)                                                         \
		return w->err;                                                         \
	}                                                                              \
	int stk_msg_##sname##_dec(struct stk_rbuf *r, struct stk_msg_##sname *m)       \
	{                                                                              \
		memset(m, 0, sizeof(*m));                                              \
		LIST(STK_FDEC)                                                         \
		return r->err;                                                         \
	}
STK_MSG_LIST(STK_MSG_IMPL)
#undef STK_MSG_IMPL

int stk_routing_encode(struct stk_wbuf *w, const struct stk_routing *rt)
{
	stk_put_u64(w, rt->version);
	stk_put_u32(w, rt->nnodes);
	stk_put_u32(w, rt->ntargets);
	stk_put_u32(w, rt->nchains);
	stk_put_u32(w, rt->nshards);
	for (uint32_t i = 0; i < rt->nnodes; i++) {
		const struct stk_rt_node *n = &rt->nodes[i];
		stk_put_u32(w, n->id);
		stk_put_u8(w, n->role);
		stk_put_u8(w, n->state);
		stk_put_str(w, n->addr);
		stk_put_u64(w, n->last_seen_ms);
		stk_put_str(w, n->host_id);
		stk_put_u8(w, n->refused);
		stk_put_u64(w, n->ns.hi);
		stk_put_u64(w, n->ns.lo);
		stk_put_u64(w, n->meta_epoch);
		stk_put_u64(w, n->meta_seq);
		stk_put_u8(w, n->shard);
	}
	for (uint32_t i = 0; i < rt->ntargets; i++) {
		const struct stk_rt_target *t = &rt->targets[i];
		stk_put_u32(w, t->id);
		stk_put_u32(w, t->node_id);
		stk_put_u8(w, t->state);
		stk_put_u64(w, t->capacity);
		stk_put_u64(w, t->used);
		stk_put_u64(w, t->chunks);
		stk_put_str(w, t->path);
		stk_put_u64(w, t->avail);
		stk_put_u64(w, t->dev);
		stk_put_u32(w, t->sync_permille);
		stk_put_u64(w, t->sync_checked);
		stk_put_u64(w, t->sync_copied);
		stk_put_u64(w, t->sync_bytes);
	}
	for (uint32_t i = 0; i < rt->nchains; i++) {
		const struct stk_rt_chain *c = &rt->chains[i];
		uint8_t n = c->ntargets > STK_MAX_REPLICAS ? STK_MAX_REPLICAS : c->ntargets;
		stk_put_u32(w, c->id);
		stk_put_u32(w, c->version);
		stk_put_u8(w, n);
		for (uint8_t j = 0; j < n; j++)
			stk_put_u32(w, c->targets[j]);
	}
	for (uint32_t i = 0; i < rt->nshards; i++) {
		const struct stk_rt_shard *sh = &rt->shards[i];
		uint8_t n = sh->nfollowers > STK_MAX_REPLICAS ? STK_MAX_REPLICAS : sh->nfollowers;

		stk_put_u32(w, sh->id);
		stk_put_u32(w, sh->node_id);
		stk_put_u64(w, sh->ns.hi);
		stk_put_u64(w, sh->ns.lo);
		stk_put_u64(w, sh->epoch);
		stk_put_u8(w, sh->replicas);
		stk_put_u8(w, n);
		for (uint8_t j = 0; j < n; j++)
			stk_put_u32(w, sh->followers[j]);
	}
	return w->err;
}

void stk_routing_free(struct stk_routing *rt)
{
	free(rt->nodes);
	free(rt->targets);
	free(rt->chains);
	free(rt->shards);
	memset(rt, 0, sizeof(*rt));
}

/* Each array element needs at least this many payload bytes: bounds allocation. */
#define STK_RT_MIN_NODE 52
#define STK_RT_MIN_TARGET 79
#define STK_RT_MIN_CHAIN 9
#define STK_RT_MIN_SHARD 34

int stk_routing_decode(struct stk_rbuf *r, struct stk_routing *rt)
{
	size_t left;

	memset(rt, 0, sizeof(*rt));
	rt->version = stk_get_u64(r);
	rt->nnodes = stk_get_u32(r);
	rt->ntargets = stk_get_u32(r);
	rt->nchains = stk_get_u32(r);
	rt->nshards = stk_get_u32(r);
	if (r->err)
		goto bad;
	left = r->len - r->off;
	/* Refuse counts the payload could not possibly hold before allocating. */
	if ((uint64_t)rt->nnodes * STK_RT_MIN_NODE + (uint64_t)rt->ntargets * STK_RT_MIN_TARGET +
		    (uint64_t)rt->nchains * STK_RT_MIN_CHAIN +
		    (uint64_t)rt->nshards * STK_RT_MIN_SHARD >
	    left)
		goto bad;
	rt->nodes = calloc(rt->nnodes ? rt->nnodes : 1, sizeof(*rt->nodes));
	rt->targets = calloc(rt->ntargets ? rt->ntargets : 1, sizeof(*rt->targets));
	rt->chains = calloc(rt->nchains ? rt->nchains : 1, sizeof(*rt->chains));
	rt->shards = calloc(rt->nshards ? rt->nshards : 1, sizeof(*rt->shards));
	if (!rt->nodes || !rt->targets || !rt->chains || !rt->shards) {
		stk_routing_free(rt);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < rt->nnodes; i++) {
		struct stk_rt_node *n = &rt->nodes[i];
		n->id = stk_get_u32(r);
		n->role = stk_get_u8(r);
		n->state = stk_get_u8(r);
		stk_get_str(r, n->addr, sizeof(n->addr));
		n->last_seen_ms = stk_get_u64(r);
		stk_get_str(r, n->host_id, sizeof(n->host_id));
		n->refused = stk_get_u8(r);
		n->ns.hi = stk_get_u64(r);
		n->ns.lo = stk_get_u64(r);
		n->meta_epoch = stk_get_u64(r);
		n->meta_seq = stk_get_u64(r);
		n->shard = stk_get_u8(r);
	}
	for (uint32_t i = 0; i < rt->ntargets; i++) {
		struct stk_rt_target *t = &rt->targets[i];
		t->id = stk_get_u32(r);
		t->node_id = stk_get_u32(r);
		t->state = stk_get_u8(r);
		t->capacity = stk_get_u64(r);
		t->used = stk_get_u64(r);
		t->chunks = stk_get_u64(r);
		stk_get_str(r, t->path, sizeof(t->path));
		t->avail = stk_get_u64(r);
		t->dev = stk_get_u64(r);
		t->sync_permille = stk_get_u32(r);
		t->sync_checked = stk_get_u64(r);
		t->sync_copied = stk_get_u64(r);
		t->sync_bytes = stk_get_u64(r);
	}
	for (uint32_t i = 0; i < rt->nchains; i++) {
		struct stk_rt_chain *c = &rt->chains[i];
		c->id = stk_get_u32(r);
		c->version = stk_get_u32(r);
		c->ntargets = stk_get_u8(r);
		if (c->ntargets > STK_MAX_REPLICAS) {
			r->err = -EBADMSG;
			break;
		}
		for (uint8_t j = 0; j < c->ntargets; j++)
			c->targets[j] = stk_get_u32(r);
	}
	for (uint32_t i = 0; i < rt->nshards && !r->err; i++) {
		struct stk_rt_shard *sh = &rt->shards[i];

		sh->id = stk_get_u32(r);
		sh->node_id = stk_get_u32(r);
		sh->ns.hi = stk_get_u64(r);
		sh->ns.lo = stk_get_u64(r);
		sh->epoch = stk_get_u64(r);
		sh->replicas = stk_get_u8(r);
		sh->nfollowers = stk_get_u8(r);
		if (sh->nfollowers > STK_MAX_REPLICAS) {
			r->err = -EBADMSG;
			break;
		}
		for (uint8_t j = 0; j < sh->nfollowers; j++)
			sh->followers[j] = stk_get_u32(r);
	}
	if (r->err) {
		stk_routing_free(rt);
		goto bad;
	}
	return 0;
bad:
	memset(rt, 0, sizeof(*rt));
	r->err = -EBADMSG;
	return -EBADMSG;
}

const struct stk_rt_node *stk_routing_node(const struct stk_routing *rt, uint32_t id)
{
	for (uint32_t i = 0; i < rt->nnodes; i++)
		if (rt->nodes[i].id == id)
			return &rt->nodes[i];
	return NULL;
}

const struct stk_rt_target *stk_routing_target(const struct stk_routing *rt, uint32_t id)
{
	for (uint32_t i = 0; i < rt->ntargets; i++)
		if (rt->targets[i].id == id)
			return &rt->targets[i];
	return NULL;
}

const struct stk_rt_chain *stk_routing_chain(const struct stk_routing *rt, uint32_t id)
{
	/* Chains are kept sorted and numbered from 1, so this is usually a direct hit. */
	if (id >= 1 && id <= rt->nchains && rt->chains[id - 1].id == id)
		return &rt->chains[id - 1];
	for (uint32_t i = 0; i < rt->nchains; i++)
		if (rt->chains[i].id == id)
			return &rt->chains[i];
	return NULL;
}

/*
 * Every request of meta's that names an inode starts with (cred, u64), (session,
 * u64) or (cred, u8, u64) (msg.h); those are read here, the rest of the request
 * is left to its handler.
 */
int stk_msg_meta_route(uint16_t opcode, const void *req, size_t len, uint64_t *ino,
		       uint64_t *other)
{
	struct stk_msg_meta_rename_req rn;
	struct stk_msg_meta_link_req lk;
	struct stk_cred cred;
	struct stk_rbuf r;

	*ino = 0;
	*other = 0;
	stk_rbuf_init(&r, req, len);
	switch (opcode) {
	case STK_OP_META_LOOKUP:
	case STK_OP_META_LOOKUP_CACHE:
	case STK_OP_META_LOOKUPS:
	case STK_OP_META_GETATTR:
	case STK_OP_META_SETATTR:
	case STK_OP_META_CREATE:
	case STK_OP_META_MKDIR:
	case STK_OP_META_UNLINK:
	case STK_OP_META_RMDIR:
	case STK_OP_META_SYMLINK:
	case STK_OP_META_READLINK:
	case STK_OP_META_READDIR:
	case STK_OP_META_EXTEND:
	case STK_OP_META_SETXATTR:
	case STK_OP_META_GETXATTR:
	case STK_OP_META_LISTXATTR:
	case STK_OP_META_REMOVEXATTR:
	case STK_OP_META_MKNOD:
		stk_cred_dec(&r, &cred);
		*ino = stk_get_u64(&r);
		break;
	case STK_OP_META_GETATTRS:
		stk_cred_dec(&r, &cred);
		if (stk_get_u32(&r) == 0)
			return r.err ? -EBADMSG : 0;
		*ino = stk_get_u64(&r); /* the first: a caller asks one shard at a time */
		break;
	case STK_OP_META_QUOTA:
		stk_cred_dec(&r, &cred);
		(void)stk_get_u8(&r);
		*ino = stk_get_u64(&r);
		break;
	case STK_OP_META_OPEN:
	case STK_OP_META_CLOSE:
	case STK_OP_META_LOCK:
	case STK_OP_META_ALLOW:
	case STK_OP_META_ALLOW_BYTES:
		(void)stk_get_u64(&r);
		*ino = stk_get_u64(&r);
		break;
	case STK_OP_META_RENAME:
		if (stk_msg_meta_rename_req_dec(&r, &rn))
			return -EBADMSG;
		*ino = rn.src_parent;
		*other = rn.dst_parent;
		break;
	case STK_OP_META_LINK:
		if (stk_msg_meta_link_req_dec(&r, &lk))
			return -EBADMSG;
		*ino = lk.parent;
		*other = lk.ino;
		break;
	default:
		return 0;
	}
	if (r.err)
		return -EBADMSG;
	return *ino ? 1 : 0;
}
