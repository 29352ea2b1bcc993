/*
 * Client keys on meta: a request of a client-key connection is checked against
 * the client's policy and rewritten (credentials squashed, the client's root
 * mapped to its subtree) before the handler sees it; see confine.h.
 *
 * Each opcode is decoded with its own generated decoder into its struct, changed
 * there and encoded again into a copy of the payload, followed by whatever the
 * struct did not cover (an xattr's value, the records of META_GETATTRS and
 * META_NAMES, rewritten one by one). The copy is never longer than the original
 * (credentials keep their number of groups; ".." may become "."), so it is sized
 * from it. Anything not listed is refused: a new opcode is served to client keys
 * only once someone has said here how.
 */
#include "confine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/auth.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../proto/wire.h"

struct confine {
	struct stk_meta_store *st;
	struct stk_meta_span *sp;
	int may_wait; /* 0 on an event loop: -EWOULDBLOCK where another shard is asked */
	const struct stk_auth_client *id;
	const struct stk_rpc_req *req;
	const struct stk_rpc_resp *resp;
	uint64_t top; /* the client's root: its subtree's folder */
};

static void squash(const struct confine *cf, struct stk_cred *c)
{
	uint32_t flags = cf->id->flags;

	if (flags & STK_CLIENT_SQUASH_ALL) {
		c->uid = cf->id->anon_uid;
		c->gid = cf->id->anon_gid;
		for (uint8_t i = 0; i < c->ngroups; i++)
			c->groups[i] = cf->id->anon_gid;
	} else if (flags & STK_CLIENT_SQUASH_ROOT) {
		if (c->uid == 0)
			c->uid = cf->id->anon_uid;
		if (c->gid == 0)
			c->gid = cf->id->anon_gid;
		for (uint8_t i = 0; i < c->ngroups; i++)
			if (c->groups[i] == 0)
				c->groups[i] = cf->id->anon_gid;
	}
}

static int refuse(const struct confine *cf, unsigned reason, int rc, uint64_t ino)
{
	static const char *const why[] = {"read-only", "outside its subtree", "an operator's"};

	stk_info("%s: client %s: %s %s (inode %llu): refused", cf->req->peer, cf->id->name,
		 why[reason], stk_opcode_name(cf->req->hdr.opcode), (unsigned long long)ino);
	return stk_rpc_client_refused(cf->resp, reason, rc);
}

/*
 * The client's root to its subtree's folder, then: under it (on whatever shards
 * its parents are, span.h), or EACCES. The root of a client whose subtree's
 * folder lives on another shard than this one (which every request about inode 1
 * comes to) is refused: the client would have to send those to that shard.
 */
static int inside(const struct confine *cf, uint64_t *ino)
{
	int rc;

	if (*ino == STK_ROOT_INO) {
		*ino = cf->top;
		if (stk_ino_shard(cf->top) != stk_meta_store_shard(cf->st)) {
			stk_warn("%s: client %s: its subtree %s is a folder of metadata shard %u: "
				 "a subtree key's folder must be on shard 1 (docs/security.md)",
				 cf->req->peer, cf->id->name, cf->id->subtree,
				 stk_ino_shard(cf->top));
			return -EOPNOTSUPP;
		}
	}
	if (cf->top == STK_ROOT_INO)
		return 0;
	rc = stk_meta_span_within(cf->sp, *ino, cf->top, cf->may_wait);
	if (rc < 0)
		return rc;
	return rc ? 0 : refuse(cf, STK_CLIENT_REFUSED_OUTSIDE, -EACCES, *ino);
}

static int read_only(const struct confine *cf)
{
	return cf->id->flags & STK_CLIENT_RO ? refuse(cf, STK_CLIENT_REFUSED_RO, -EROFS, 0) : 0;
}

/* Copies what the struct did not cover, from r's position on. */
static void rest(struct stk_wbuf *w, struct stk_rbuf *r)
{
	size_t n = r->len - r->off;
	uint8_t *q = stk_wbuf_reserve(w, n);

	if (q && n)
		memcpy(q, r->p + r->off, n);
	r->off = r->len;
}

/* One decode, change, encode step per message type. */
#define CONFINE_MSG(type, body)                                                                    \
	do {                                                                                       \
		struct stk_msg_##type q;                                                           \
		if (stk_msg_##type##_dec(&r, &q) || r.err)                                         \
			return -EBADMSG;                                                           \
		body;                                                                              \
		stk_msg_##type##_enc(&w, &q);                                                      \
	} while (0)

/* The requests that change something: EROFS for a read-only client. */
static int changes(uint16_t op)
{
	switch (op) {
	case STK_OP_META_SETATTR:
	case STK_OP_META_CREATE:
	case STK_OP_META_MKDIR:
	case STK_OP_META_UNLINK:
	case STK_OP_META_RMDIR:
	case STK_OP_META_RENAME:
	case STK_OP_META_LINK:
	case STK_OP_META_SYMLINK:
	case STK_OP_META_EXTEND:
	case STK_OP_META_SETXATTR:
	case STK_OP_META_REMOVEXATTR:
	case STK_OP_META_MKNOD:
	case STK_OP_META_INOS:
	case STK_OP_META_NAMES:
		return 1;
	}
	return 0;
}

static int rewrite(struct confine *cf, struct stk_rbuf r, struct stk_wbuf *wp)
{
	struct stk_wbuf w = *wp;
	int rc = 0, top = 0;

	switch (cf->req->hdr.opcode) {
	case STK_OP_META_LOOKUP:
	case STK_OP_META_LOOKUP_CACHE:
		CONFINE_MSG(meta_lookup_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.parent);
			/* ".." of the client's root is the root itself */
			if (rc == 0 && q.parent == cf->top && strcmp(q.name, "..") == 0)
				stk_strlcpy(q.name, ".", sizeof(q.name));
		});
		break;
	case STK_OP_META_GETATTR:
	case STK_OP_META_READLINK:
		CONFINE_MSG(meta_ino_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.ino);
		});
		break;
	case STK_OP_META_SETATTR:
		CONFINE_MSG(meta_setattr_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.ino);
		});
		break;
	case STK_OP_META_CREATE:
		CONFINE_MSG(meta_create_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.parent);
		});
		break;
	case STK_OP_META_MKDIR:
		CONFINE_MSG(meta_mkdir_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.parent);
		});
		break;
	case STK_OP_META_UNLINK:
	case STK_OP_META_RMDIR:
		CONFINE_MSG(meta_name_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.parent);
		});
		break;
	case STK_OP_META_RENAME:
		CONFINE_MSG(meta_rename_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.src_parent);
			if (rc == 0)
				rc = inside(cf, &q.dst_parent);
		});
		break;
	case STK_OP_META_LINK:
		CONFINE_MSG(meta_link_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.ino);
			if (rc == 0)
				rc = inside(cf, &q.parent);
		});
		break;
	case STK_OP_META_SYMLINK:
		CONFINE_MSG(meta_symlink_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.parent);
		});
		break;
	case STK_OP_META_READDIR:
		CONFINE_MSG(meta_readdir_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.ino);
		});
		break;
	case STK_OP_META_EXTEND:
		CONFINE_MSG(meta_extend_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.ino);
		});
		break;
	case STK_OP_META_SETXATTR:
		CONFINE_MSG(meta_setxattr_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.ino);
		});
		break;
	case STK_OP_META_GETXATTR:
		CONFINE_MSG(meta_getxattr_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.ino);
		});
		break;
	case STK_OP_META_LISTXATTR:
		CONFINE_MSG(meta_listxattr_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.ino);
		});
		break;
	case STK_OP_META_REMOVEXATTR:
		CONFINE_MSG(meta_xattr_name_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.ino);
		});
		break;
	case STK_OP_META_MKNOD:
		CONFINE_MSG(meta_mknod_req, {
			squash(cf, &q.cred);
			rc = inside(cf, &q.parent);
		});
		break;
	case STK_OP_META_QUOTA:
		CONFINE_MSG(meta_quota_req, {
			squash(cf, &q.cred);
			if (q.op == STK_QUOTA_GET)
				rc = inside(cf, &q.ino);
			else if (q.op == STK_QUOTA_RESERVE)
				rc = read_only(cf) ? read_only(cf) : inside(cf, &q.ino);
			else
				rc = refuse(cf, STK_CLIENT_REFUSED_ADMIN, -EPERM, q.ino);
		});
		break;
	case STK_OP_META_ALLOW:
	case STK_OP_META_ALLOW_BYTES:
		CONFINE_MSG(meta_allow_req, {
			rc = read_only(cf) ? read_only(cf) : inside(cf, &q.dir);
		});
		break;
	case STK_OP_META_OPEN:
	case STK_OP_META_LOCK:
		if (cf->req->hdr.opcode == STK_OP_META_OPEN)
			CONFINE_MSG(meta_open_req, rc = inside(cf, &q.ino));
		else
			CONFINE_MSG(meta_lock_req, rc = inside(cf, &q.ino));
		break;
	case STK_OP_META_CLOSE:
		/* what was opened as the root is closed as the root: no check */
		CONFINE_MSG(meta_open_req, {
			if (q.ino == STK_ROOT_INO)
				q.ino = cf->top;
		});
		break;
	case STK_OP_META_GETATTRS:
		CONFINE_MSG(meta_getattrs_req, {
			squash(cf, &q.cred);
			if (q.n > STK_GETATTRS_MAX)
				return -EBADMSG;
		});
		while (rc == 0 && r.off < r.len) {
			struct stk_msg_getattrs_rec g;

			if (stk_msg_getattrs_rec_dec(&r, &g) || r.err)
				return -EBADMSG;
			if (g.ino == STK_ROOT_INO)
				g.ino = cf->top;
			rc = stk_meta_span_within(cf->sp, g.ino, cf->top, cf->may_wait);
			if (rc == 0) {
				/* inode 0 never exists: that record alone answers ENOENT */
				refuse(cf, STK_CLIENT_REFUSED_OUTSIDE, 0, g.ino);
				g.ino = 0;
			}
			rc = rc < 0 ? rc : 0;
			stk_msg_getattrs_rec_enc(&w, &g);
		}
		break;
	case STK_OP_META_LOOKUPS:
		CONFINE_MSG(meta_lookups_req, {
			squash(cf, &q.cred);
			if (q.n > STK_LOOKUPS_MAX)
				return -EBADMSG;
			rc = inside(cf, &q.parent);
			top = q.parent == cf->top;
		});
		while (rc == 0 && r.off < r.len) {
			struct stk_msg_lookups_rec l;

			if (stk_msg_lookups_rec_dec(&r, &l) || r.err)
				return -EBADMSG;
			/* ".." of the client's root is the root itself */
			if (top && strcmp(l.name, "..") == 0)
				stk_strlcpy(l.name, ".", sizeof(l.name));
			stk_msg_lookups_rec_enc(&w, &l);
		}
		break;
	case STK_OP_META_NAMES:
		CONFINE_MSG(meta_names_req, {
			if (q.n > STK_NAMES_MAX)
				return -EBADMSG;
		});
		for (uint32_t i = 0; rc == 0 && r.off < r.len; i++) {
			struct stk_msg_name_rec n;

			if (stk_msg_name_rec_dec(&r, &n) || r.err)
				return -EBADMSG;
			squash(cf, &n.cred);
			rc = inside(cf, &n.parent);
			stk_msg_name_rec_enc(&w, &n);
		}
		break;
	case STK_OP_META_STATFS:
	case STK_OP_META_SYNC:
	case STK_OP_META_SESSION:
	case STK_OP_META_SESSION_END:
	case STK_OP_META_WATCH:
	case STK_OP_META_INOS:
	case STK_OP_META_CLOSES:
		/* about the caller's own session or the namespace as a whole: as it is */
		rest(&w, &r);
		break;
	default:
		return refuse(cf, STK_CLIENT_REFUSED_ADMIN, -EPERM, 0);
	}
	if (rc)
		return rc;
	rest(&w, &r);
	*wp = w;
	return w.err ? -EBADMSG : 0;
}

int stk_meta_confine(struct stk_meta_store *st, struct stk_meta_span *sp, int may_wait,
		     struct stk_rpc_req *req, struct stk_rpc_resp *resp, void **copy)
{
	struct confine cf = {
	    .st = st, .sp = sp, .may_wait = may_wait, .id = req->client, .req = req, .resp = resp};
	struct stk_wbuf w;
	uint8_t *buf;
	int rc;

	*copy = NULL;
	if (!req->client)
		return 0;
	if (changes(req->hdr.opcode) && (rc = read_only(&cf)))
		return rc;
	cf.top = STK_ROOT_INO;
	if (strcmp(req->client->subtree, "/") != 0) {
		rc = stk_meta_span_resolve(sp, req->client->subtree, &cf.top, may_wait);
		if (rc == -EWOULDBLOCK)
			return rc;
		if (rc) {
			stk_warn("%s: client %s: its subtree %s: %s: refused", req->peer,
				 req->client->name, req->client->subtree, strerror(-rc));
			return rc;
		}
	}
	/* +8: ".." to "." never grows it; room for a zero-length payload's copy */
	buf = malloc(req->payload.len + 8);
	if (!buf)
		return -ENOMEM;
	stk_wbuf_init(&w, buf, req->payload.len + 8);
	rc = rewrite(&cf, req->payload, &w);
	if (rc) {
		free(buf);
		return rc;
	}
	stk_rbuf_init(&req->payload, buf, w.len);
	*copy = buf;
	return 0;
}
