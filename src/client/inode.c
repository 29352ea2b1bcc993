/*
 * Metadata calls by inode number: encode the request, call meta (with the
 * client's retries), decode the reply. The path operations (namespace.c) and the
 * FUSE daemon are both built on these.
 */
#include "inode.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/util.h"
#include "../proto/status.h"
#include "behind.h"
#include "client.h"
#include "lcache.h"
#include "session.h"

#define CRED(c, cred) ((cred) ? *(cred) : (c)->cred)

static int name_ok(const char *name, char *dst)
{
	return stk_strlcpy_name(dst, name);
}

/*
 * The lookup as META_LOOKUP_CACHE, its answer kept in the lookup cache when meta
 * leased it. -ENOSYS: not asked (no trusted watch, or a meta without leases): the
 * caller sends a plain META_LOOKUP.
 */
static int lookup_cached(stk_client *c, uint64_t parent, const char *name, const void *req,
			 size_t req_len, struct stk_attr *out)
{
	struct stk_lcache_tok tok = stk_lcache_begin_at(c, stk_ino_shard(parent));
	struct stk_msg_meta_lookup_cache_resp rm;
	uint8_t resp[1024];
	struct stk_rbuf r;
	size_t len = 0;
	int rc;

	if (!tok.holder)
		return -ENOSYS;
	rc = stk_client_meta_call_from(c, tok.holder, STK_OP_META_LOOKUP_CACHE, req, req_len, resp,
				       sizeof(resp), &len);
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, len);
	if (stk_msg_meta_lookup_cache_resp_dec(&r, &rm) || stk_rbuf_finish(&r))
		return -EIO;
	if (rm.leased)
		stk_lcache_put(c, tok, parent, name, rm.found, &rm.attr, &rm.dir);
	if (!rm.found)
		return -ENOENT;
	*out = rm.attr;
	return 0;
}

int stk_ino_lookup(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		   struct stk_attr *out)
{
	struct stk_msg_meta_lookup_req m = {.cred = CRED(c, cred), .parent = parent};
	uint8_t req[512];
	struct stk_wbuf w;
	int rc = name_ok(name, m.name);

	if (rc)
		return rc;
	if (stk_lcache_get(c, cred, parent, name, out, &rc))
		return rc;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_lookup_req_enc(&w, &m);
	rc = lookup_cached(c, parent, name, req, w.len, out);
	if (rc != -ENOSYS)
		return rc;
	return stk_client_meta_attr_call(c, STK_OP_META_LOOKUP, req, w.len, out);
}

int stk_ino_lookup_parent(stk_client *c, const struct stk_cred *cred, uint64_t dir,
			  struct stk_attr *out)
{
	struct stk_msg_meta_lookup_req m = {.cred = CRED(c, cred), .parent = dir};
	uint8_t req[512];
	struct stk_wbuf w;

	/* name_ok refuses "..": clients name children; only this call names the parent. */
	memcpy(m.name, "..", 3);
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_lookup_req_enc(&w, &m);
	return stk_client_meta_attr_call(c, STK_OP_META_LOOKUP, req, w.len, out);
}

int stk_ino_getattr(stk_client *c, const struct stk_cred *cred, uint64_t ino, struct stk_attr *out)
{
	struct stk_msg_meta_ino_req m = {.cred = CRED(c, cred), .ino = ino};
	uint8_t req[256];
	struct stk_wbuf w;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_ino_req_enc(&w, &m);
	return stk_client_meta_attr_read_call(c, STK_OP_META_GETATTR, req, w.len, out);
}

/* META_GETATTRS of inodes of one shard. */
static int getattrs_one(stk_client *c, const struct stk_cred *cred, const uint64_t *inos,
			uint32_t n, struct stk_attr *out, int *rcs)
{
	struct stk_msg_meta_getattrs_req m = {.cred = CRED(c, cred), .n = n};
	struct stk_msg_meta_getattrs_resp rm;
	size_t req_cap = 512 + (size_t)n * 8, resp_cap = 64 + (size_t)n * 160, len = 0;
	uint8_t *req, *resp;
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	if (n == 0)
		return 0;
	if (n > STK_GETATTRS_MAX)
		return -EINVAL;
	req = malloc(req_cap);
	resp = malloc(resp_cap);
	if (!req || !resp) {
		rc = -ENOMEM;
		goto out;
	}
	stk_wbuf_init(&w, req, req_cap);
	stk_msg_meta_getattrs_req_enc(&w, &m);
	for (uint32_t i = 0; i < n; i++) {
		struct stk_msg_getattrs_rec g = {.ino = inos[i]};
		stk_msg_getattrs_rec_enc(&w, &g);
	}
	if (w.err) {
		rc = -EINVAL;
		goto out;
	}
	rc = stk_client_meta_read_call(c, STK_OP_META_GETATTRS, req, w.len, resp, resp_cap, &len);
	if (rc)
		goto out;
	stk_rbuf_init(&r, resp, len);
	stk_msg_meta_getattrs_resp_dec(&r, &rm);
	if (r.err || rm.n != n) {
		rc = -EIO;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct stk_msg_attr_rec rec;
		stk_msg_attr_rec_dec(&r, &rec);
		rcs[i] = stk_status_to_errno(rec.status);
		if (rcs[i] == 0 && rec.attr.ino != inos[i])
			rcs[i] = -EIO; /* an answer for another inode: trust none of it */
		if (rcs[i] == 0)
			out[i] = rec.attr;
	}
	if (stk_rbuf_finish(&r))
		rc = -EIO;
out:
	free(req);
	free(resp);
	return rc;
}

/*
 * Each shard answers for its own inodes (docs/meta-shards.md): a batch that
 * names several shards' goes as one META_GETATTRS per shard.
 */
int stk_ino_getattrs(stk_client *c, const struct stk_cred *cred, const uint64_t *inos, uint32_t n,
		     struct stk_attr *out, int *rcs)
{
	uint64_t *sub = NULL;
	uint32_t *idx = NULL;
	struct stk_attr *sattr = NULL;
	int *src = NULL, rc = 0;
	uint32_t mixed = 0;

	for (uint32_t i = 1; i < n; i++)
		mixed |= stk_ino_shard(inos[i]) != stk_ino_shard(inos[0]);
	if (!mixed)
		return getattrs_one(c, cred, inos, n, out, rcs);
	if (n > STK_GETATTRS_MAX)
		return -EINVAL;
	sub = malloc(n * sizeof(*sub));
	idx = malloc(n * sizeof(*idx));
	sattr = malloc(n * sizeof(*sattr));
	src = malloc(n * sizeof(*src));
	if (!sub || !idx || !sattr || !src) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned shard = 1; rc == 0 && shard <= STK_MAX_SHARDS + 1; shard++) {
		uint32_t k = 0;

		for (uint32_t i = 0; i < n; i++)
			if (stk_ino_shard(inos[i]) == shard ||
			    (shard == STK_MAX_SHARDS + 1 && stk_ino_shard(inos[i]) > STK_MAX_SHARDS)) {
				idx[k] = i;
				sub[k++] = inos[i];
			}
		if (!k)
			continue;
		rc = getattrs_one(c, cred, sub, k, sattr, src);
		for (uint32_t j = 0; rc == 0 && j < k; j++) {
			rcs[idx[j]] = src[j];
			if (src[j] == 0)
				out[idx[j]] = sattr[j];
		}
	}
out:
	free(sub);
	free(idx);
	free(sattr);
	free(src);
	return rc;
}

int stk_ino_lookups(stk_client *c, const struct stk_cred *cred, uint64_t parent,
		    const char *const *names, uint32_t n, struct stk_attr *out, int *rcs)
{
	struct stk_msg_meta_lookups_req m = {.cred = CRED(c, cred), .parent = parent, .n = n};
	struct stk_lcache_tok tok = stk_lcache_begin_at(c, stk_ino_shard(parent));
	struct stk_msg_meta_lookups_resp rm;
	size_t req_cap = 512 + (size_t)n * (STK_NAME_MAX + 8);
	size_t resp_cap = 256 + (size_t)n * (160 + STK_VOUCH_REC_LEN); /* and vouchers */
	size_t len = 0;
	uint8_t *req, *resp;
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	if (n == 0)
		return 0;
	if (n > STK_LOOKUPS_MAX)
		return -EINVAL;
	req = malloc(req_cap);
	resp = malloc(resp_cap);
	if (!req || !resp) {
		rc = -ENOMEM;
		goto out;
	}
	stk_wbuf_init(&w, req, req_cap);
	stk_msg_meta_lookups_req_enc(&w, &m);
	for (uint32_t i = 0; i < n; i++) {
		struct stk_msg_lookups_rec g;

		rc = name_ok(names[i], g.name);
		if (rc)
			goto out;
		stk_msg_lookups_rec_enc(&w, &g);
	}
	if (w.err) {
		rc = -EINVAL;
		goto out;
	}
	/* With the holder's origin: leased as lookups are, and a folder delegated here
	 * stays so (stk_client_meta_read_call). */
	rc = stk_client_meta_call_from(c, tok.holder, STK_OP_META_LOOKUPS, req, w.len, resp,
				       resp_cap, &len);
	if (rc)
		goto out;
	stk_rbuf_init(&r, resp, len);
	stk_msg_meta_lookups_resp_dec(&r, &rm);
	if (r.err || rm.n != n) {
		rc = -EIO;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct stk_msg_attr_rec rec;

		stk_msg_attr_rec_dec(&r, &rec);
		rcs[i] = r.err ? -EIO : stk_status_to_errno(rec.status);
		if (rcs[i] == 0)
			out[i] = rec.attr;
	}
	if (stk_rbuf_finish(&r)) {
		rc = -EIO;
		goto out;
	}
	/* Kept when meta leased them, as lookup_cached keeps one. */
	for (uint32_t i = 0; rm.leased && tok.holder && i < n; i++) {
		static const struct stk_attr none;

		if (rcs[i] == 0 || rcs[i] == -ENOENT)
			stk_lcache_put(c, tok, parent, names[i], rcs[i] == 0,
				       rcs[i] ? &none : &out[i], &rm.dir);
	}
out:
	free(req);
	free(resp);
	return rc;
}

int stk_ino_setattr(stk_client *c, const struct stk_cred *cred, uint64_t ino, uint32_t valid,
		    const struct stk_attr *v, struct stk_attr *out)
{
	struct stk_msg_meta_setattr_req m = {.cred = CRED(c, cred), .ino = ino, .valid = valid};
	struct stk_attr before, after;
	uint8_t req[512];
	struct stk_wbuf w;
	int rc;

	if (v) {
		m.mode = v->mode & 07777;
		m.uid = v->uid;
		m.gid = v->gid;
		m.size = v->size;
		m.atime_sec = v->atime_sec;
		m.atime_nsec = v->atime_nsec;
		m.mtime_sec = v->mtime_sec;
		m.mtime_nsec = v->mtime_nsec;
	}
	if (valid & STK_SETATTR_SIZE) {
		rc = stk_ino_getattr(c, cred, ino, &before);
		if (rc)
			return rc;
		if (S_ISDIR(before.mode))
			return -EISDIR;
		if (!S_ISREG(before.mode))
			return -EINVAL;
	}
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_setattr_req_enc(&w, &m);
	rc = stk_client_meta_attr_call_own(c, ino, STK_OP_META_SETATTR, req, w.len, &after);
	if (rc)
		return rc;
	if ((valid & STK_SETATTR_SIZE) && m.size < before.size) {
		rc = stk_client_truncate_data(c, &after, m.size);
		if (rc)
			return rc;
	}
	if (out)
		*out = after;
	return 0;
}

/* META_CREATE naming `session` (0: none); *opened: meta registered the file for it. */
static int create_call(stk_client *c, const struct stk_cred *cred, uint64_t parent,
		       const char *name, uint32_t mode, int excl, uint64_t session,
		       struct stk_attr *out, int *created, int *opened, struct stk_attr *dir)
{
	struct stk_msg_meta_create_req m = {
	    .cred = CRED(c, cred), .parent = parent, .session = session};
	struct stk_msg_meta_create_resp rm = {0};
	struct stk_lcache_tok tok;
	uint8_t req[512], resp[512];
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t rlen = 0;
	int rc = name_ok(name, m.name);

	*opened = 0;
	if (rc)
		return rc;
	m.mode = (mode & 07777) | S_IFREG;
	m.flags = excl ? STK_CREATE_EXCL : 0;
	stk_client_new_layout(c, parent, &m.layout);
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_create_req_enc(&w, &m);
	/*
	 * The name changes: this client forgets it itself after the reply (a lookup that
	 * raced with the create then loses its answer), so meta need not tell it; the
	 * new entry is kept as a lookup's answer would be. Until the reply, answering
	 * from before the create is right: it has not happened yet for anyone.
	 */
	tok = stk_lcache_begin_change(c, parent, m.name, 0);
	rc = stk_client_meta_call_from(c, tok.holder, STK_OP_META_CREATE, req, w.len, resp,
				       sizeof(resp), &rlen);
	if (rc == 0) {
		stk_rbuf_init(&r, resp, rlen);
		if (stk_msg_meta_create_resp_dec(&r, &rm) || stk_rbuf_finish(&r))
			rc = -EIO; /* with the session: meta registered the file, and keeps it
				      until the session ends, as with a reply lost on the way */
	}
	stk_lcache_changed(c, tok, parent, name, rc == 0 && rm.leased, &rm.attr, &rm.dir);
	if (rc)
		return rc;
	*out = rm.attr;
	*created = rm.created;
	*opened = rm.opened && session && S_ISREG(rm.attr.mode);
	if (dir)
		*dir = rm.dir;
	return 0;
}

int stk_ino_create(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		   uint32_t mode, int excl, struct stk_attr *out, int *created)
{
	struct stk_attr a;
	int cr = 0, opened, rc;

	rc = create_call(c, cred, parent, name, mode, excl, 0, &a, &cr, &opened, NULL);
	if (rc)
		return rc;
	if (out)
		*out = a;
	if (created)
		*created = cr;
	return 0;
}

int stk_ino_create_open(stk_client *c, const struct stk_cred *cred, uint64_t parent,
			const char *name, uint32_t mode, int excl, struct stk_attr *out,
			int *created, struct stk_attr *dir)
{
	uint64_t id = stk_session_reg_begin(c);
	int opened = 0, rc;

	if (dir)
		dir->ino = 0;
	rc = create_call(c, cred, parent, name, mode, excl, id, out, created, &opened, dir);
	if (rc == -EBADMSG && id) {
		/* A meta from before META_CREATE carried a session: register apart. */
		id = 0;
		rc = create_call(c, cred, parent, name, mode, excl, 0, out, created, &opened, dir);
	}
	if (rc) {
		stk_session_reg_end(c, 0, 0);
		return rc;
	}
	rc = stk_session_reg_end(c, id, opened ? out->ino : 0);
	if (rc || opened || !S_ISREG(out->mode))
		return rc;
	/* Not registered with the create (sessions off, meta out of memory, an older
	 * meta): register now, which is a no-op when sessions are off. */
	rc = stk_session_open(c, out->ino, NULL);
	return rc < 0 ? rc : 0;
}

/*
 * A folder the mkdir made on another shard than its parent's (placed there,
 * docs/meta-shards.md): the parent's shard delegates nothing of it, so its own
 * shard is asked to (META_XSHARD DELEGATE, with this client's holder there), as
 * the mkdir of a folder on its parent's shard asks with STK_MKDIR_DELEGATE. The
 * first such folder of a shard waits a moment for the client's watch of that
 * shard to be answered (once per shard). Nothing comes of it when meta refuses
 * (an older one: INVAL) or the folder is no longer empty and this client's alone.
 */
static void delegate_placed(stk_client *c, const struct stk_cred *cred, uint64_t ino)
{
	unsigned shard = stk_ino_shard(ino);
	struct stk_msg_meta_xshard_req q = {
	    .op = STK_XSHARD_DELEGATE, .ino = ino, .uid = cred->uid, .gid = cred->gid};
	struct stk_msg_meta_xshard_resp r;
	struct stk_lcache_tok tok;
	uint8_t req[512], resp[512];
	struct stk_wbuf w;
	struct stk_rbuf rb;
	size_t rlen = 0;

	if (shard < 2 || shard > STK_MAX_SHARDS || !stk_lcache_wait_holder(c, shard, 1000))
		return;
	tok = stk_lcache_begin_at(c, shard);
	if (!tok.holder)
		return;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_xshard_req_enc(&w, &q);
	if (w.err || stk_client_meta_call_shard(c, shard, tok.holder, STK_OP_META_XSHARD, req,
						w.len, resp, sizeof(resp), &rlen))
		return;
	stk_rbuf_init(&rb, resp, rlen);
	if (stk_msg_meta_xshard_resp_dec(&rb, &r) || stk_rbuf_finish(&rb) || r.attr.ino != ino)
		return;
	if ((r.state & STK_XDELEG_LEASED) && (r.state & STK_XDELEG_EMPTY))
		stk_lcache_complete(c, tok, &r.attr, (r.state & STK_XDELEG_DELEGATED) != 0);
	if (r.state & STK_XDELEG_DELEGATED)
		stk_behind_prepare(c, shard);
}

int stk_ino_mkdir(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		  uint32_t mode, struct stk_attr *out)
{
	struct stk_msg_meta_mkdir_req m = {.cred = CRED(c, cred), .parent = parent};
	struct stk_msg_meta_mkdir_resp rm = {0};
	struct stk_lcache_tok tok;
	uint8_t req[512], resp[1024];
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t rlen = 0;
	int rc = name_ok(name, m.name);

	if (rc)
		return rc;
	m.mode = (mode & 07777) | S_IFDIR;
	/* As in create_call; a new folder is empty, so its names are all known here. */
	tok = stk_lcache_begin_change(c, parent, m.name, 0);
	/* ... and with write-behind on, its creates and unlinks may be answered here
	 * (delegated by the shard that makes it, to this client's holder there: the
	 * token's, of parent's shard; a folder placed on another shard is not). */
	if (tok.holder && c->behind)
		m.flags = STK_MKDIR_DELEGATE | STK_MKDIR_DELEGATE_QUOTA;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_mkdir_req_enc(&w, &m);
	rc = stk_client_meta_call_from(c, tok.holder, STK_OP_META_MKDIR, req, w.len, resp,
				       sizeof(resp), &rlen);
	if (rc == 0) {
		stk_rbuf_init(&r, resp, rlen);
		if (stk_msg_meta_mkdir_resp_dec(&r, &rm) || stk_rbuf_finish(&r))
			rc = -EIO;
	}
	stk_lcache_changed(c, tok, parent, name, rc == 0 && rm.leased, &rm.attr, &rm.dir);
	if (rc)
		return rc;
	if (rm.leased && rm.empty)
		stk_lcache_complete(c, tok, &rm.attr, rm.delegated);
	if (rm.leased && rm.empty && rm.delegated)
		stk_behind_prepare(c, stk_ino_shard(rm.attr.ino));
	else if (tok.holder && c->behind && stk_ino_shard(rm.attr.ino) != stk_ino_shard(parent))
		delegate_placed(c, &m.cred, rm.attr.ino);
	if (out)
		*out = rm.attr;
	return 0;
}

static int name_req(stk_client *c, const struct stk_cred *cred, uint16_t op, uint64_t parent,
		    const char *name, struct stk_attr *after)
{
	struct stk_msg_meta_name_req m = {.cred = CRED(c, cred), .parent = parent};
	uint8_t req[512];
	struct stk_wbuf w;
	int rc = name_ok(name, m.name);

	if (rc)
		return rc;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_name_req_enc(&w, &m);
	if (!after)
		return stk_client_meta_call(c, op, req, w.len, NULL, 0, NULL);
	return stk_client_meta_attr_call(c, op, req, w.len, after);
}

int stk_ino_unlink_keep(stk_client *c, const struct stk_cred *cred, uint64_t parent,
			const char *name, struct stk_attr *after, struct stk_attr *dir)
{
	struct stk_msg_meta_name_req m = {.cred = CRED(c, cred), .parent = parent};
	struct stk_msg_meta_unlink_resp rm;
	struct stk_lcache_tok tok;
	uint8_t req[512], resp[1024];
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t rlen = 0;
	int rc = name_ok(name, m.name);

	if (rc)
		return rc;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_name_req_enc(&w, &m);
	/* The last name may go: meta must know of every open here first. */
	stk_session_sync_opens(c);
	tok = stk_lcache_begin_change(c, parent, m.name, 0);
	rc = stk_client_meta_call_from(c, tok.holder, STK_OP_META_UNLINK, req, w.len, resp,
				       sizeof(resp), &rlen);
	if (rc == 0) {
		stk_rbuf_init(&r, resp, rlen);
		if (stk_msg_meta_unlink_resp_dec(&r, &rm) || stk_rbuf_finish(&r))
			rc = -EIO;
	}
	/* As in create_call; and the inode's link count, under its other names. */
	stk_lcache_forget_name(c, tok, parent, m.name, rc == 0 ? rm.attr.ino : 0, rc != 0);
	if (rc)
		return rc;
	*after = rm.attr;
	/* Open somewhere: meta keeps the file and removes its data at the last close. */
	if (rm.orphaned)
		after->ino = 0;
	if (dir)
		*dir = rm.dir;
	return 0;
}

int stk_ino_unlink(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name)
{
	struct stk_attr after;
	int rc = stk_ino_unlink_keep(c, cred, parent, name, &after, NULL);

	if (rc == 0 && after.ino && after.nlink == 0 && S_ISREG(after.mode))
		stk_client_remove_data(c, &after);
	return rc;
}

int stk_ino_rmdir(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name)
{
	return name_req(c, cred, STK_OP_META_RMDIR, parent, name, NULL);
}

int stk_ino_rename(stk_client *c, const struct stk_cred *cred, uint64_t src_parent,
		   const char *src_name, uint64_t dst_parent, const char *dst_name, uint32_t flags)
{
	struct stk_attr replaced;
	int rc = stk_ino_rename_keep(c, cred, src_parent, src_name, dst_parent, dst_name, flags,
				     &replaced);

	if (rc == 0 && replaced.ino && replaced.nlink == 0 && S_ISREG(replaced.mode))
		stk_client_remove_data(c, &replaced);
	return rc;
}

int stk_ino_rename_keep(stk_client *c, const struct stk_cred *cred, uint64_t src_parent,
			const char *src_name, uint64_t dst_parent, const char *dst_name,
			uint32_t flags, struct stk_attr *replaced)
{
	struct stk_msg_meta_rename_req m = {.cred = CRED(c, cred),
					    .src_parent = src_parent,
					    .dst_parent = dst_parent,
					    .flags = flags};
	struct stk_msg_meta_rename_resp rm;
	uint8_t req[1024], resp[1024];
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t rlen = 0;
	int rc;

	memset(replaced, 0, sizeof(*replaced));
	if ((rc = name_ok(src_name, m.src_name)) || (rc = name_ok(dst_name, m.dst_name)))
		return rc;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_rename_req_enc(&w, &m);
	stk_session_sync_opens(c); /* as in an unlink: the name replaced may be the last */
	rc = stk_client_meta_call(c, STK_OP_META_RENAME, req, w.len, resp, sizeof(resp), &rlen);
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, rlen);
	if (stk_msg_meta_rename_resp_dec(&r, &rm) || stk_rbuf_finish(&r))
		return -EIO;
	if (rm.replaced && !rm.orphaned)
		*replaced = rm.attr;
	return 0;
}

int stk_ino_link(stk_client *c, const struct stk_cred *cred, uint64_t ino, uint64_t parent,
		 const char *name, struct stk_attr *out)
{
	struct stk_msg_meta_link_req m = {.cred = CRED(c, cred), .ino = ino, .parent = parent};
	uint8_t req[512];
	struct stk_wbuf w;
	int rc = name_ok(name, m.name);

	if (rc)
		return rc;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_link_req_enc(&w, &m);
	return stk_client_meta_attr_call(c, STK_OP_META_LINK, req, w.len, out);
}

int stk_ino_symlink(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		    const char *target, struct stk_attr *out)
{
	struct stk_msg_meta_symlink_req *m;
	uint8_t *req;
	struct stk_wbuf w;
	int rc;

	if (!*target)
		return -ENOENT;
	if (strlen(target) > STK_PATH_MAX)
		return -ENAMETOOLONG;
	m = calloc(1, sizeof(*m));
	req = malloc(STK_PATH_MAX + 1024);
	rc = (!m || !req) ? -ENOMEM : name_ok(name, m->name);
	if (rc)
		goto out;
	m->cred = CRED(c, cred);
	m->parent = parent;
	memcpy(m->target, target, strlen(target) + 1);
	stk_wbuf_init(&w, req, STK_PATH_MAX + 1024);
	stk_msg_meta_symlink_req_enc(&w, m);
	rc = stk_client_meta_attr_call(c, STK_OP_META_SYMLINK, req, w.len, out);
out:
	free(m);
	free(req);
	return rc;
}

int stk_ino_mknod(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		  uint32_t mode, uint64_t rdev, struct stk_attr *out)
{
	struct stk_msg_meta_mknod_req m = {.cred = CRED(c, cred), .parent = parent, .mode = mode,
					   .rdev = rdev};
	uint8_t req[512];
	struct stk_wbuf w;
	int rc = name_ok(name, m.name);

	if (rc)
		return rc;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_mknod_req_enc(&w, &m);
	return stk_client_meta_attr_call(c, STK_OP_META_MKNOD, req, w.len, out);
}

int stk_ino_readlink(stk_client *c, const struct stk_cred *cred, uint64_t ino, char *buf,
		     size_t len)
{
	struct stk_msg_meta_ino_req m = {.cred = CRED(c, cred), .ino = ino};
	struct stk_msg_meta_readlink_resp *rm;
	uint8_t req[256], resp[STK_PATH_MAX + 64];
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t rlen = 0;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_ino_req_enc(&w, &m);
	rc = stk_client_meta_call(c, STK_OP_META_READLINK, req, w.len, resp, sizeof(resp), &rlen);
	if (rc)
		return rc;
	rm = malloc(sizeof(*rm));
	if (!rm)
		return -ENOMEM;
	stk_rbuf_init(&r, resp, rlen);
	if (stk_msg_meta_readlink_resp_dec(&r, rm) || stk_rbuf_finish(&r))
		rc = -EIO;
	else
		rc = stk_strlcpy(buf, rm->target, len);
	free(rm);
	return rc;
}

int stk_ino_readdir(stk_client *c, const struct stk_cred *cred, uint64_t ino, uint64_t cookie,
		    uint32_t max, struct stk_msg_dirent *ents, uint32_t *n, int *eof)
{
	struct stk_msg_meta_readdir_req m = {.cred = CRED(c, cred),
					     .ino = ino,
					     .cookie = cookie,
					     .max_entries = max};
	struct stk_msg_meta_readdir_resp rm;
	uint8_t req[256], *resp;
	size_t cap = STK_MAX_PAYLOAD, len = 0;
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	resp = malloc(cap);
	if (!resp)
		return -ENOMEM;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_readdir_req_enc(&w, &m);
	rc = stk_client_meta_read_call(c, STK_OP_META_READDIR, req, w.len, resp, cap, &len);
	if (rc)
		goto out;
	stk_rbuf_init(&r, resp, len);
	stk_msg_meta_readdir_resp_dec(&r, &rm);
	if (r.err || rm.n > max) {
		rc = -EIO;
		goto out;
	}
	for (uint32_t i = 0; i < rm.n; i++)
		stk_msg_dirent_dec(&r, &ents[i]);
	if (stk_rbuf_finish(&r)) {
		rc = -EIO;
		goto out;
	}
	*n = rm.n;
	*eof = rm.eof || rm.n == 0;
out:
	free(resp);
	return rc;
}

/* ---- extended attributes ---- */

static int xattr_name_ok(const char *name, char *dst)
{
	size_t n = strlen(name);

	if (n == 0 || n > STK_NAME_MAX)
		return -ERANGE;
	memcpy(dst, name, n + 1);
	return 0;
}

int stk_ino_setxattr(stk_client *c, const struct stk_cred *cred, uint64_t ino, const char *name,
		     const void *value, size_t size, uint32_t flags)
{
	struct stk_msg_meta_setxattr_req m = {.cred = CRED(c, cred), .ino = ino, .flags = flags};
	size_t cap = 1024 + size;
	struct stk_wbuf w;
	uint8_t *req;
	int rc = xattr_name_ok(name, m.name);

	if (rc)
		return rc;
	if (size > STK_XATTR_SIZE_MAX)
		return -E2BIG;
	if (size && !value)
		return -EFAULT;
	req = malloc(cap);
	if (!req)
		return -ENOMEM;
	m.size = (uint32_t)size;
	stk_wbuf_init(&w, req, cap);
	stk_msg_meta_setxattr_req_enc(&w, &m);
	if (size)
		stk_put_bytes(&w, value, size);
	rc = w.err ? -EIO : stk_client_meta_call(c, STK_OP_META_SETXATTR, req, w.len, NULL, 0,
						   NULL);
	free(req);
	return rc;
}

/* The GETXATTR / LISTXATTR reply: the length, and the bytes when size > 0. */
static long xattr_reply(stk_client *c, uint16_t op, const void *req, size_t req_len, void *buf,
			size_t size)
{
	struct stk_msg_meta_xattr_resp rm;
	size_t cap = 64 + size, rlen = 0;
	struct stk_rbuf r;
	uint8_t *resp;
	long rc;

	resp = malloc(cap);
	if (!resp)
		return -ENOMEM;
	rc = stk_client_meta_call(c, op, req, req_len, resp, cap, &rlen);
	if (rc)
		goto out;
	stk_rbuf_init(&r, resp, rlen);
	rc = -EIO;
	if (stk_msg_meta_xattr_resp_dec(&r, &rm))
		goto out;
	if (size) {
		const uint8_t *p = rm.size <= size ? stk_rbuf_take(&r, rm.size) : NULL;

		if (!p)
			goto out;
		memcpy(buf, p, rm.size);
	}
	if (stk_rbuf_finish(&r))
		goto out;
	rc = (long)rm.size;
out:
	free(resp);
	return rc;
}

long stk_ino_getxattr(stk_client *c, const struct stk_cred *cred, uint64_t ino, const char *name,
		      void *buf, size_t size)
{
	struct stk_msg_meta_getxattr_req m = {.cred = CRED(c, cred), .ino = ino};
	uint8_t req[512];
	struct stk_wbuf w;
	int rc = xattr_name_ok(name, m.name);

	if (rc)
		return rc;
	if (size > STK_XATTR_SIZE_MAX)
		size = STK_XATTR_SIZE_MAX;
	m.size = (uint32_t)size;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_getxattr_req_enc(&w, &m);
	return xattr_reply(c, STK_OP_META_GETXATTR, req, w.len, buf, size);
}

long stk_ino_listxattr(stk_client *c, const struct stk_cred *cred, uint64_t ino, char *buf,
		       size_t size)
{
	struct stk_msg_meta_listxattr_req m = {.cred = CRED(c, cred), .ino = ino};
	uint8_t req[256];
	struct stk_wbuf w;

	if (size > STK_XATTR_SIZE_MAX)
		size = STK_XATTR_SIZE_MAX;
	m.size = (uint32_t)size;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_listxattr_req_enc(&w, &m);
	return xattr_reply(c, STK_OP_META_LISTXATTR, req, w.len, buf, size);
}

int stk_ino_removexattr(stk_client *c, const struct stk_cred *cred, uint64_t ino,
			const char *name)
{
	struct stk_msg_meta_xattr_name_req m = {.cred = CRED(c, cred), .ino = ino};
	uint8_t req[512];
	struct stk_wbuf w;
	int rc = xattr_name_ok(name, m.name);

	if (rc)
		return rc;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_xattr_name_req_enc(&w, &m);
	return stk_client_meta_call(c, STK_OP_META_REMOVEXATTR, req, w.len, NULL, 0, NULL);
}

/* ---- the path-level calls of stoker.h (symlinks followed, as setxattr(2)) ---- */

int stk_setxattr(stk_client *c, const char *path, const char *name, const void *value,
		 size_t size, int flags)
{
	struct stk_attr a;
	int rc;

	if (flags & ~(int)(STK_XATTR_CREATE | STK_XATTR_REPLACE))
		return -EINVAL;
	rc = stk_client_resolve(c, path, 1, &a);
	return rc ? rc : stk_ino_setxattr(c, NULL, a.ino, name, value, size, (uint32_t)flags);
}

ssize_t stk_getxattr(stk_client *c, const char *path, const char *name, void *value, size_t size)
{
	struct stk_attr a;
	int rc = stk_client_resolve(c, path, 1, &a);

	return rc ? rc : stk_ino_getxattr(c, NULL, a.ino, name, value, size);
}

ssize_t stk_listxattr(stk_client *c, const char *path, char *list, size_t size)
{
	struct stk_attr a;
	int rc = stk_client_resolve(c, path, 1, &a);

	return rc ? rc : stk_ino_listxattr(c, NULL, a.ino, list, size);
}

int stk_removexattr(stk_client *c, const char *path, const char *name)
{
	struct stk_attr a;
	int rc = stk_client_resolve(c, path, 1, &a);

	return rc ? rc : stk_ino_removexattr(c, NULL, a.ino, name);
}
