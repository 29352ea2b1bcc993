/*
 * stoker quota: quotas per folder (docs/quotas.md).
 *
 *   quota set PATH [--bytes SIZE] [--inodes N]   set limits (0 or "none": no limit)
 *   quota ls [PATH] [--json]                     every quota, or the one PATH counts in
 *   quota rm PATH                                remove PATH's quota
 *   quota recount [PATH]                         count usage again and fix it
 *
 * SIZE takes binary units (10T, 512G); N decimal ones (1M is a million inodes,
 * as people say it). Errors print "stoker quota: PATH: reason" and exit 1; a
 * usage error exits 2.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/util.h"

#define QPATH 4097

/* "none" or "0" is no limit; else a size in binary units. */
static int parse_bytes(const char *s, uint64_t *out)
{
	if (strcmp(s, "none") == 0) {
		*out = 0;
		return 0;
	}
	return stk_parse_size(s, out);
}

/* A count with decimal units: "5000", "10k", "1M", "2G"; "none" is no limit. */
static int parse_count(const char *s, uint64_t *out)
{
	uint64_t v, mul = 1;
	char num[32];
	size_t n = strlen(s);
	int rc;

	if (strcmp(s, "none") == 0) {
		*out = 0;
		return 0;
	}
	if (n == 0 || n >= sizeof(num))
		return -EINVAL;
	memcpy(num, s, n + 1);
	switch (tolower((unsigned char)num[n - 1])) {
	case 'k':
		mul = 1000ull;
		break;
	case 'm':
		mul = 1000000ull;
		break;
	case 'g':
		mul = 1000000000ull;
		break;
	}
	if (mul != 1)
		num[--n] = 0;
	rc = stk_parse_u64(num, &v);
	if (rc)
		return rc;
	if (v > UINT64_MAX / mul)
		return -ERANGE;
	*out = v * mul;
	return 0;
}

static stk_client *connect_arg(const char *arg, char *path)
{
	char cluster[128];
	int rc = cli_split(arg, cluster, sizeof(cluster), path, QPATH);

	if (rc) {
		cli_err("quota", "%s: %s", arg,
			rc == -EINVAL ? "malformed stk:// address" : stk_strerror(rc));
		return NULL;
	}
	return cli_connect("quota", cluster[0] ? cluster : NULL);
}

static void pct(uint64_t used, uint64_t limit, char *buf, size_t len)
{
	if (!limit)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.0f%%", 100.0 * (double)used / (double)limit);
}

static void print_head(void)
{
	printf("%-32s %12s %12s %6s %12s %12s %6s %12s\n", "QUOTA", "BYTES", "LIMIT", "USE%",
	       "INODES", "LIMIT", "USE%", "RESERVED");
}

static void print_quota(const struct stk_quota *q)
{
	char used[32], lim[32], res[32], p1[16], p2[16], ilim[32], where[64];
	const char *path = q->path;

	if (!path[0]) {
		snprintf(where, sizeof(where), "(inode %llu)", (unsigned long long)q->ino);
		path = where;
	}
	stk_format_size(q->used_bytes, used, sizeof(used));
	if (q->limit_bytes)
		stk_format_size(q->limit_bytes, lim, sizeof(lim));
	else
		snprintf(lim, sizeof(lim), "none");
	stk_format_size(q->reserved_bytes, res, sizeof(res));
	pct(q->used_bytes, q->limit_bytes, p1, sizeof(p1));
	pct(q->used_inodes, q->limit_inodes, p2, sizeof(p2));
	if (q->limit_inodes)
		snprintf(ilim, sizeof(ilim), "%llu", (unsigned long long)q->limit_inodes);
	else
		snprintf(ilim, sizeof(ilim), "none");
	printf("%-32s %12s %12s %6s %12llu %12s %6s %12s\n", path, used, lim, p1,
	       (unsigned long long)q->used_inodes, ilim, p2, res);
}

static void print_json(const struct stk_quota *q, size_t n)
{
	printf("[");
	for (size_t i = 0; i < n; i++) {
		printf("%s{\"path\": ", i ? ", " : "");
		cli_json_str(stdout, q[i].path);
		printf(", \"ino\": %llu, \"parent\": %llu, \"limit_bytes\": %llu, "
		       "\"used_bytes\": %llu, \"reserved_bytes\": %llu, \"limit_inodes\": %llu, "
		       "\"used_inodes\": %llu}",
		       (unsigned long long)q[i].ino, (unsigned long long)q[i].parent,
		       (unsigned long long)q[i].limit_bytes, (unsigned long long)q[i].used_bytes,
		       (unsigned long long)q[i].reserved_bytes,
		       (unsigned long long)q[i].limit_inodes, (unsigned long long)q[i].used_inodes);
	}
	printf("]\n");
}

static int quota_set(int argc, char **argv)
{
	uint64_t bytes = 0, inodes = 0;
	unsigned which = 0;
	const char *arg = NULL;
	char path[QPATH];
	struct stk_quota q;
	stk_client *c;
	int rc;

	for (int i = 2; i < argc; i++) {
		if ((strcmp(argv[i], "--bytes") == 0 || strcmp(argv[i], "--inodes") == 0) &&
		    i + 1 < argc) {
			int is_bytes = argv[i][2] == 'b';

			rc = is_bytes ? parse_bytes(argv[i + 1], &bytes)
				      : parse_count(argv[i + 1], &inodes);
			if (rc) {
				cli_err("quota", "%s %s: not a %s (examples: %s)", argv[i],
					argv[i + 1], is_bytes ? "size" : "count",
					is_bytes ? "10T, 512G, 1048576, none" : "1M, 50000, none");
				return 2;
			}
			which |= is_bytes ? STK_QUOTA_BYTES : STK_QUOTA_INODES;
			i++;
		} else if (argv[i][0] != '-' && !arg) {
			arg = argv[i];
		} else {
			return cli_usage("quota");
		}
	}
	if (!arg || !which) {
		cli_err("quota", "set needs a PATH and --bytes SIZE, --inodes N or both");
		return 2;
	}
	c = connect_arg(arg, path);
	if (!c)
		return 1;
	printf("setting the quota of %s (a new quota counts what the folder holds)...\n", path);
	fflush(stdout);
	rc = stk_quota_set(c, path, bytes, inodes, which, &q);
	if (rc) {
		cli_err("quota", "%s: %s", arg,
			rc == -ENOTDIR ? "not a folder (a quota is set on a folder)"
			: rc == -EPERM ? "only root may set quotas"
				       : stk_strerror(rc));
		return 1;
	}
	print_head();
	print_quota(&q);
	return 0;
}

static int quota_ls(int argc, char **argv)
{
	struct stk_quota *all = NULL, one;
	char path[QPATH];
	stk_client *c;
	size_t n = 0;
	int json = 0, rc;

	if (argc > 2 && strcmp(argv[argc - 1], "--json") == 0) {
		json = 1;
		argc--;
	}
	if (argc > 3)
		return cli_usage("quota");
	c = connect_arg(argc == 3 ? argv[2] : "/", path);
	if (!c)
		return 1;
	if (argc == 3) {
		rc = stk_quota_get(c, path, &one);
		if (rc == -ENOENT) {
			struct stat st;

			/* Say which: the path, or a quota for it. */
			if (stk_stat(c, path, &st) == 0) {
				if (json)
					printf("[]\n");
				else
					printf("%s counts in no quota\n", path);
				return 0;
			}
		}
		if (rc) {
			cli_err("quota", "%s: %s", argv[2], stk_strerror(rc));
			return 1;
		}
		if (json) {
			print_json(&one, 1);
			return 0;
		}
		print_head();
		print_quota(&one);
		return 0;
	}
	rc = stk_quota_list(c, &all, &n);
	if (rc) {
		cli_err("quota", "%s", stk_strerror(rc));
		return 1;
	}
	if (json)
		print_json(all, n);
	else if (n == 0)
		printf("no quotas\n");
	else
		print_head();
	for (size_t i = 0; !json && i < n; i++)
		print_quota(&all[i]);
	free(all);
	return 0;
}

static int quota_rm(int argc, char **argv)
{
	char path[QPATH];
	stk_client *c;
	int rc;

	if (argc != 3)
		return cli_usage("quota");
	c = connect_arg(argv[2], path);
	if (!c)
		return 1;
	rc = stk_quota_rm(c, path);
	if (rc) {
		cli_err("quota", "%s: %s", argv[2],
			rc == -ENOENT ? "no quota on this folder (stoker quota ls lists them)"
				      : stk_strerror(rc));
		return 1;
	}
	printf("removed the quota of %s\n", path);
	return 0;
}

static int quota_recount(int argc, char **argv)
{
	struct stk_quota *q = NULL;
	char path[QPATH];
	size_t n = 0, fixed = 0;
	stk_client *c;
	int rc;

	if (argc > 3)
		return cli_usage("quota");
	c = connect_arg(argc == 3 ? argv[2] : "/", path);
	if (!c)
		return 1;
	printf("recounting %s (meta walks the tree; its log shows progress)...\n",
	       argc == 3 ? path : "every quota");
	fflush(stdout);
	rc = stk_quota_recount(c, argc == 3 ? path : NULL, &q, &n);
	if (rc) {
		cli_err("quota", "%s: %s", argc == 3 ? argv[2] : "recount",
			rc == -ENOENT ? "no quota on this folder" : stk_strerror(rc));
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		const char *p = q[i].path[0] ? q[i].path : "(a folder without a path)";

		if (!q[i].fixed) {
			printf("%s: correct (%llu inodes, %llu bytes)\n", p,
			       (unsigned long long)q[i].used_inodes,
			       (unsigned long long)q[i].used_bytes);
			continue;
		}
		fixed++;
		printf("%s: fixed: inodes %llu -> %llu, bytes %llu -> %llu\n", p,
		       (unsigned long long)q[i].old_inodes, (unsigned long long)q[i].used_inodes,
		       (unsigned long long)q[i].old_bytes, (unsigned long long)q[i].used_bytes);
	}
	printf("%zu quota(s) recounted, %zu fixed\n", n, fixed);
	free(q);
	return 0;
}

int cmd_quota(int argc, char **argv)
{
	if (argc < 2)
		return cli_usage("quota");
	if (strcmp(argv[1], "set") == 0)
		return quota_set(argc, argv);
	if (strcmp(argv[1], "ls") == 0)
		return quota_ls(argc, argv);
	if (strcmp(argv[1], "rm") == 0)
		return quota_rm(argc, argv);
	if (strcmp(argv[1], "recount") == 0)
		return quota_recount(argc, argv);
	return cli_usage("quota");
}
