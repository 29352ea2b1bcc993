/*
 * `stoker pack SRC DST [--shard-size SIZE]`: packs every regular file under SRC
 * into shards in DST (format in shard.h and docs/python.md), for loaders that
 * should not pay one open per sample.
 *
 * SRC and DST are each a Stoker address (stk://HOST:PORT/dir, or stk:///dir for
 * the default cluster) or a local folder, so a local data set can be packed into
 * Stoker, and one in Stoker packed in place. Files are taken in byte order of
 * their relative paths, so packing the same folder twice gives the same shards;
 * a shard closes before a file would take it past --shard-size (a larger file gets
 * a shard of its own), and files are never split. Each shard's data file is made
 * durable before its index is written under a temporary name and renamed into
 * place, so a shard is visible only once complete. DST must not already hold
 * shards.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/util.h"
#include "fsio.h"
#include "shard.h"

#define PACK_BUF (8u << 20)

struct names {
	char **v;
	size_t n, cap;
};

struct walk {
	struct cli_fs *fs;
	char root[CLI_FS_PATH];
	char rel[CLI_FS_PATH]; /* the folder being listed, relative to root ("" at the top) */
	struct names *out;
	int err;
};

static int add_name(struct names *ns, const char *name)
{
	if (ns->n == ns->cap) {
		size_t cap = ns->cap ? ns->cap * 2 : 1024;
		char **v = realloc(ns->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		ns->v = v;
		ns->cap = cap;
	}
	ns->v[ns->n] = strdup(name);
	if (!ns->v[ns->n])
		return -ENOMEM;
	ns->n++;
	return 0;
}

static int walk_dir(struct walk *w);

static int walk_entry(void *ctx, const char *name, int is_dir)
{
	struct walk *w = ctx;
	char rel[CLI_FS_PATH];
	int n;

	n = snprintf(rel, sizeof(rel), "%s%s%s", w->rel, w->rel[0] ? "/" : "", name);
	if (n < 0 || (size_t)n >= sizeof(rel))
		return -ENAMETOOLONG;
	if (!is_dir)
		return add_name(w->out, rel);
	/* Descend with rel as the current folder, then restore it. */
	{
		char saved[CLI_FS_PATH];
		int rc;

		memcpy(saved, w->rel, sizeof(saved));
		memcpy(w->rel, rel, sizeof(rel));
		rc = walk_dir(w);
		memcpy(w->rel, saved, sizeof(saved));
		return rc;
	}
}

static int walk_dir(struct walk *w)
{
	char dir[CLI_FS_PATH];
	int n = snprintf(dir, sizeof(dir), "%s%s%s", w->root, w->rel[0] ? "/" : "", w->rel);

	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	return cli_fs_list(w->fs, dir, walk_entry, w);
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int find_shard(void *ctx, const char *name, int is_dir)
{
	return strncmp(name, CLI_SHARD_PREFIX, strlen(CLI_SHARD_PREFIX)) == 0 ? -EEXIST : 0;
}

/* One shard being written. */
struct out {
	struct cli_fs *fs;
	const char *dir;
	unsigned n; /* its number */
	struct cli_file data;
	int open;
	struct cli_shard_index ix;
	uint64_t cap_e, cap_names;
};

static int out_start(struct out *o)
{
	char data[CLI_FS_PATH];

	cli_shard_paths(o->dir, o->n, data, NULL);
	o->ix.count = 0;
	o->ix.data_size = 0;
	o->ix.names_size = 0;
	o->open = 1;
	return cli_fs_open(o->fs, data, O_WRONLY | O_CREAT | O_TRUNC, 0644, &o->data);
}

static int out_add(struct out *o, const char *name, uint64_t len)
{
	size_t nl = strlen(name);

	if (o->ix.count == o->cap_e) {
		uint64_t cap = o->cap_e ? o->cap_e * 2 : 1024;
		struct cli_shard_entry *e = realloc(o->ix.e, sizeof(*e) * cap);
		if (!e)
			return -ENOMEM;
		o->ix.e = e;
		o->cap_e = cap;
	}
	while (o->ix.names_size + nl > o->cap_names) {
		uint64_t cap = o->cap_names ? o->cap_names * 2 : 65536;
		char *p = realloc(o->ix.names, cap);
		if (!p)
			return -ENOMEM;
		o->ix.names = p;
		o->cap_names = cap;
	}
	o->ix.e[o->ix.count] = (struct cli_shard_entry){.offset = o->ix.data_size,
							.length = len,
							.name_off = o->ix.names_size,
							.name_len = (uint32_t)nl};
	memcpy(o->ix.names + o->ix.names_size, name, nl);
	o->ix.names_size += nl;
	o->ix.data_size += len;
	o->ix.count++;
	return 0;
}

/* Makes the data durable, then writes the index under a temporary name and renames it. */
static int out_finish(struct out *o)
{
	char index[CLI_FS_PATH], tmp[CLI_FS_PATH + 8];
	struct cli_file f;
	void *buf = NULL;
	size_t len = 0;
	int rc;

	o->open = 0;
	rc = cli_fs_close(&o->data);
	if (rc)
		return rc;
	cli_shard_paths(o->dir, o->n, NULL, index);
	snprintf(tmp, sizeof(tmp), "%s.tmp", index);
	rc = cli_shard_index_encode(&o->ix, &buf, &len);
	if (rc)
		return rc;
	rc = cli_fs_open(o->fs, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f);
	if (rc)
		goto out;
	rc = cli_fs_write(&f, buf, len);
	if (rc) {
		cli_fs_close(&f);
		goto out;
	}
	rc = cli_fs_close(&f);
	if (rc == 0)
		rc = cli_fs_rename(o->fs, tmp, index);
	if (rc == 0)
		o->n++;
out:
	free(buf);
	return rc;
}

/* Appends the file src to the shard's data. 0 or -errno; *copied its length. */
static int copy_in(struct cli_fs *sfs, const char *src, struct out *o, char *buf, uint64_t *copied)
{
	struct cli_file f;
	uint64_t off = 0;
	int rc;

	rc = cli_fs_open(sfs, src, O_RDONLY, 0, &f);
	if (rc)
		return rc;
	for (;;) {
		ssize_t n = cli_fs_pread(&f, buf, PACK_BUF, off);
		if (n < 0) {
			rc = (int)n;
			break;
		}
		if (n == 0)
			break;
		rc = cli_fs_write(&o->data, buf, (size_t)n);
		if (rc)
			break;
		off += (uint64_t)n;
	}
	cli_fs_close(&f);
	*copied = off;
	return rc;
}

static const struct option pack_opts[] = {
    {"shard-size", required_argument, NULL, 's'},
    {NULL, 0, NULL, 0},
};

int cmd_pack(int argc, char **argv)
{
	char src[CLI_FS_PATH], dst[CLI_FS_PATH];
	struct cli_fs sfs, dfs;
	struct names ns = {0};
	struct walk *w = NULL;
	struct out o;
	uint64_t shard_size = 256ull << 20, total = 0, packed = 0;
	char *buf = NULL;
	int c, rc;

	memset(&o, 0, sizeof(o));
	optind = 1;
	while ((c = getopt_long(argc, argv, "", pack_opts, NULL)) != -1) {
		switch (c) {
		case 's':
			if (stk_parse_size(optarg, &shard_size) || shard_size == 0)
				return cli_usage("pack");
			break;
		default:
			return cli_usage("pack");
		}
	}
	if (argc - optind != 2)
		return cli_usage("pack");
	if (cli_fs_resolve("pack", argv[optind], &sfs, src) ||
	    cli_fs_resolve("pack", argv[optind + 1], &dfs, dst))
		return 1;

	w = calloc(1, sizeof(*w));
	buf = malloc(PACK_BUF);
	rc = -ENOMEM;
	if (!w || !buf)
		goto out;
	w->fs = &sfs;
	w->out = &ns;
	stk_strlcpy(w->root, src, sizeof(w->root));
	rc = walk_dir(w);
	if (rc) {
		cli_err("pack", "%s: %s", argv[optind], stk_strerror(rc));
		goto out_quiet;
	}
	qsort(ns.v, ns.n, sizeof(*ns.v), cmp_names);

	rc = cli_fs_mkdirs(&dfs, dst);
	if (rc == 0)
		rc = cli_fs_list(&dfs, dst, find_shard, NULL);
	if (rc) {
		cli_err("pack", "%s: %s", argv[optind + 1],
			rc == -EEXIST ? "already holds shards" : stk_strerror(rc));
		goto out_quiet;
	}
	o.fs = &dfs;
	o.dir = dst;
	for (size_t i = 0; i < ns.n; i++) {
		char path[CLI_FS_PATH];
		struct stat st;
		uint64_t copied = 0;

		snprintf(path, sizeof(path), "%s/%s", src, ns.v[i]);
		rc = cli_fs_stat(&sfs, path, &st);
		if (rc == 0 && !S_ISREG(st.st_mode))
			continue; /* sockets, fifos, devices */
		if (rc == 0 && o.open && o.ix.count &&
		    o.ix.data_size + (uint64_t)st.st_size > shard_size)
			rc = out_finish(&o);
		if (rc == 0 && !o.open)
			rc = out_start(&o);
		if (rc == 0)
			rc = copy_in(&sfs, path, &o, buf, &copied);
		if (rc == 0)
			rc = out_add(&o, ns.v[i], copied);
		if (rc) {
			cli_err("pack", "%s: %s", path, stk_strerror(rc));
			goto out_quiet;
		}
		total += copied;
		packed++;
	}
	if (o.open && (rc = out_finish(&o))) {
		cli_err("pack", "%s: %s", dst, stk_strerror(rc));
		goto out_quiet;
	}
	{
		char sz[32];
		printf("packed %llu files (%s) into %u shards in %s\n", (unsigned long long)packed,
		       stk_format_size(total, sz, sizeof(sz)), o.n, argv[optind + 1]);
	}
	rc = 0;
	goto out_quiet;
out:
	cli_err("pack", "%s", stk_strerror(rc));
out_quiet:
	if (o.open)
		cli_fs_close(&o.data);
	cli_shard_index_free(&o.ix);
	for (size_t i = 0; i < ns.n; i++)
		free(ns.v[i]);
	free(ns.v);
	free(w);
	free(buf);
	cli_disconnect_all();
	return rc ? 1 : 0;
}
