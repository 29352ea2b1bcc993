/*
 * stoker shard: where new folders go among the metadata shards
 * (docs/meta-shards.md, "Placement").
 *
 *   shard pin PATH N        folders made in PATH from now on go to shard N
 *   shard pin PATH spread   ... to the shard a hash of each one's name picks
 *   shard unpin PATH        ... to PATH's own shard again (the default)
 *   shard show PATH...      the shard each folder lives on, and its setting
 *
 * The setting is the folder's extended attribute trusted.stoker.shard (so only
 * root sets it), checked by meta: a shard the cluster has, or "spread". It
 * places what is made after it; nothing already made moves. Errors print
 * "stoker shard: PATH: reason" and exit 1; a usage error exits 2.
 */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/util.h"

#define SPATH 4097
#define PIN_XATTR "trusted.stoker.shard"
#define INO_SHARD_SHIFT 48 /* proto/msg.h: an inode number carries its shard */

static stk_client *connect_arg(const char *arg, char *path)
{
	char cluster[128];
	int rc = cli_split(arg, cluster, sizeof(cluster), path, SPATH);

	if (rc) {
		cli_err("shard", "%s: %s", arg,
			rc == -EINVAL ? "malformed stk:// address" : stk_strerror(rc));
		return NULL;
	}
	return cli_connect("shard", cluster[0] ? cluster : NULL);
}

static int shard_pin(const char *arg, const char *value)
{
	char path[SPATH];
	stk_client *c = connect_arg(arg, path);
	uint64_t n;
	int rc;

	if (!c)
		return 1;
	if (value[0] && strcmp(value, "spread") != 0 &&
	    (stk_parse_u64(value, &n) || n < 1 || n > 65535)) {
		cli_err("shard",
			"%s: bad shard '%s': give a shard number (stoker status lists "
			"them) or spread",
			arg, value);
		return 2;
	}
	rc = value[0] ? stk_setxattr(c, path, PIN_XATTR, value, strlen(value), 0)
		      : stk_removexattr(c, path, PIN_XATTR);
	if (rc == -ENODATA && !value[0])
		rc = 0; /* not pinned: nothing to undo */
	if (rc) {
		cli_err("shard", "%s: %s", arg,
			rc == -EINVAL	 ? "the cluster has no such shard"
			: rc == -EPERM	 ? "only root sets a folder's shard"
			: rc == -ENOTDIR ? "not a folder"
					 : stk_strerror(rc));
		return 1;
	}
	if (value[0] && strcmp(value, "spread") == 0)
		printf("%s: folders made in it are spread over the shards\n", path);
	else if (value[0])
		printf("%s: folders made in it go to shard %s\n", path, value);
	else
		printf("%s: folders made in it stay on its shard\n", path);
	return 0;
}

static int shard_show(const char *arg)
{
	char path[SPATH], val[32];
	stk_client *c = connect_arg(arg, path);
	struct stat sb;
	ssize_t n;
	int rc;

	if (!c)
		return 1;
	rc = stk_stat(c, path, &sb);
	if (rc) {
		cli_err("shard", "%s: %s", arg, stk_strerror(rc));
		return 1;
	}
	printf("%s: on shard %llu", path,
	       (unsigned long long)((uint64_t)sb.st_ino >> INO_SHARD_SHIFT) + 1);
	if (!S_ISDIR(sb.st_mode)) {
		printf("\n");
		return 0;
	}
	n = stk_getxattr(c, path, PIN_XATTR, val, sizeof(val) - 1);
	if (n > 0) {
		val[n] = 0;
		if (strcmp(val, "spread") == 0)
			printf("; new folders in it: spread over the shards\n");
		else
			printf("; new folders in it: on shard %s\n", val);
	} else {
		printf("; new folders in it: on its shard\n");
	}
	return 0;
}

int cmd_shard(int argc, char **argv)
{
	int rc = 0;

	if (argc == 4 && strcmp(argv[1], "pin") == 0)
		return shard_pin(argv[2], argv[3]);
	if (argc == 3 && strcmp(argv[1], "unpin") == 0)
		return shard_pin(argv[2], "");
	if (argc >= 3 && strcmp(argv[1], "show") == 0) {
		for (int i = 2; i < argc; i++)
			rc |= shard_show(argv[i]);
		return rc;
	}
	return cli_usage("shard");
}
