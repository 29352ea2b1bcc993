/*
 * The shard index format (shard.h): encoding with the wire codec's bounds-checked
 * little-endian helpers, decoding with every field checked before it is used.
 */
#include "shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../proto/codec.h"

#define SHARD_INDEX_MAX (1ull << 34) /* 16 GiB: far past any sane index */

int cli_shard_index_encode(const struct cli_shard_index *ix, void **buf, size_t *len)
{
	size_t n = CLI_SHARD_HDR + CLI_SHARD_ENTRY * (size_t)ix->count + (size_t)ix->names_size;
	struct stk_wbuf w;
	void *b = malloc(n);

	if (!b)
		return -ENOMEM;
	stk_wbuf_init(&w, b, n);
	stk_put_bytes(&w, CLI_SHARD_MAGIC, 8);
	stk_put_u32(&w, CLI_SHARD_VERSION);
	stk_put_u32(&w, 0);
	stk_put_u64(&w, ix->count);
	stk_put_u64(&w, ix->data_size);
	stk_put_u64(&w, ix->names_size);
	for (uint64_t i = 0; i < ix->count; i++) {
		stk_put_u64(&w, ix->e[i].offset);
		stk_put_u64(&w, ix->e[i].length);
		stk_put_u64(&w, ix->e[i].name_off);
		stk_put_u32(&w, ix->e[i].name_len);
		stk_put_u32(&w, 0);
	}
	stk_put_bytes(&w, ix->names, (size_t)ix->names_size);
	if (w.err || w.len != n) {
		free(b);
		return -ENOMEM;
	}
	*buf = b;
	*len = n;
	return 0;
}

int cli_shard_index_decode(const void *buf, size_t len, struct cli_shard_index *ix)
{
	char magic[8];
	struct stk_rbuf r;
	uint32_t version;
	int rc = -EBADMSG;

	memset(ix, 0, sizeof(*ix));
	stk_rbuf_init(&r, buf, len);
	stk_get_bytes(&r, magic, 8);
	version = stk_get_u32(&r);
	(void)stk_get_u32(&r); /* flags: none defined */
	ix->count = stk_get_u64(&r);
	ix->data_size = stk_get_u64(&r);
	ix->names_size = stk_get_u64(&r);
	if (r.err || memcmp(magic, CLI_SHARD_MAGIC, 8) != 0 || version != CLI_SHARD_VERSION)
		return -EBADMSG;
	/* The sizes must account for the buffer exactly before anything is allocated. */
	if (ix->count > (len - CLI_SHARD_HDR) / CLI_SHARD_ENTRY ||
	    ix->names_size != len - CLI_SHARD_HDR - CLI_SHARD_ENTRY * ix->count)
		return -EBADMSG;
	ix->e = malloc(sizeof(*ix->e) * (ix->count ? ix->count : 1));
	ix->names = malloc(ix->names_size ? ix->names_size : 1);
	if (!ix->e || !ix->names) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint64_t i = 0; i < ix->count; i++) {
		struct cli_shard_entry *e = &ix->e[i];
		e->offset = stk_get_u64(&r);
		e->length = stk_get_u64(&r);
		e->name_off = stk_get_u64(&r);
		e->name_len = stk_get_u32(&r);
		(void)stk_get_u32(&r);
		if (r.err || e->offset > ix->data_size || e->length > ix->data_size - e->offset ||
		    e->name_off > ix->names_size || e->name_len > ix->names_size - e->name_off)
			goto out;
	}
	stk_get_bytes(&r, ix->names, (size_t)ix->names_size);
	if (r.err || stk_rbuf_finish(&r))
		goto out;
	return 0;
out:
	cli_shard_index_free(ix);
	return rc;
}

int cli_shard_index_load(struct cli_fs *fs, const char *path, struct cli_shard_index *ix)
{
	struct cli_file f;
	uint64_t size = 0;
	void *buf = NULL;
	ssize_t n;
	int rc;

	rc = cli_fs_open(fs, path, O_RDONLY, 0, &f);
	if (rc)
		return rc;
	rc = cli_fs_size(&f, &size);
	if (rc)
		goto out;
	rc = -EBADMSG;
	if (size < CLI_SHARD_HDR || size > SHARD_INDEX_MAX)
		goto out;
	rc = -ENOMEM;
	buf = malloc((size_t)size);
	if (!buf)
		goto out;
	n = cli_fs_pread(&f, buf, (size_t)size, 0);
	rc = n < 0 ? (int)n : (uint64_t)n != size ? -EBADMSG : 0;
	if (rc == 0)
		rc = cli_shard_index_decode(buf, (size_t)size, ix);
out:
	free(buf);
	cli_fs_close(&f);
	return rc;
}

void cli_shard_index_free(struct cli_shard_index *ix)
{
	free(ix->e);
	free(ix->names);
	ix->e = NULL;
	ix->names = NULL;
}

void cli_shard_paths(const char *dir, unsigned n, char *data, char *index)
{
	if (data)
		snprintf(data, CLI_FS_PATH, "%s/" CLI_SHARD_PREFIX "%05u.data", dir, n);
	if (index)
		snprintf(index, CLI_FS_PATH, "%s/" CLI_SHARD_PREFIX "%05u.index", dir, n);
}
