/*
 * `stoker fsck [--repair] [--json] [--grace S] [--cluster ADDR]`: the namespace
 * and the data checked against each other, on a live cluster (docs/fsck.md).
 *
 * The check itself is libstoker's (stk_fsck, stoker.h): it speaks to meta and to
 * the storage nodes. This file parses the options, shows the check's progress on
 * stderr when that is a terminal, and prints the report, as text or as JSON.
 *
 * Exit status: 0 when nothing is left to fix, 1 when problems remain (or the
 * check could not run), 2 for bad usage.
 */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/util.h"

/* The longest --grace taken: ten years. */
#define GRACE_MAX_S (10ull * 365 * 86400)

static void progress_line(void *ctx, const char *line)
{
	(void)ctx;
	fprintf(stderr, "\r\033[K%s", line);
	fflush(stderr);
}

static const char *kind_name(int k)
{
	switch (k) {
	case STK_FSCK_DANGLING_ENTRY:
		return "dangling-entry";
	case STK_FSCK_LOST_ENTRY:
		return "lost-entry";
	case STK_FSCK_LINK_COUNT:
		return "link-count";
	case STK_FSCK_UNREACHED_INODE:
		return "unreached-inode";
	case STK_FSCK_STALE_ORPHAN:
		return "stale-orphan";
	case STK_FSCK_PARENT_POINTER:
		return "parent-pointer";
	case STK_FSCK_QUOTA_BYTES:
		return "quota-bytes";
	case STK_FSCK_QUOTA_INODES:
		return "quota-inodes";
	case STK_FSCK_CORRUPT_RECORD:
		return "corrupt-record";
	case STK_FSCK_FOLDER_CYCLE:
		return "folder-cycle";
	case STK_FSCK_NAME_OFF_HOME:
		return "name-off-home";
	case STK_FSCK_STALE_NAME_RECORD:
		return "stale-name-record";
	case STK_FSCK_GARBAGE:
		return "garbage";
	case STK_FSCK_MISSING_CHUNK:
		return "missing-chunk";
	case STK_FSCK_REPLICAS_DIFFER:
		return "replicas-differ";
	}
	return "unknown";
}

static int is_data(int k)
{
	return k == STK_FSCK_GARBAGE || k == STK_FSCK_MISSING_CHUNK ||
	       k == STK_FSCK_REPLICAS_DIFFER;
}

static void line(const struct stk_fsck_problem *q)
{
	unsigned long long ino = q->ino, parent = q->parent, expect = q->expect, found = q->found;

	switch (q->kind) {
	case STK_FSCK_DANGLING_ENTRY:
		printf(
		    "  dangling entry: '%s' in folder %llu names inode %llu, which does not exist",
		    q->name, parent, ino);
		break;
	case STK_FSCK_LOST_ENTRY:
		printf("  lost entry: '%s' (inode %llu) is in %llu, which is no folder", q->name,
		       ino, parent);
		break;
	case STK_FSCK_LINK_COUNT:
		printf("  link count: inode %llu has %llu, its names say %llu", ino, found, expect);
		break;
	case STK_FSCK_UNREACHED_INODE:
		printf("  unreached inode: %llu has no name and is not open", ino);
		break;
	case STK_FSCK_STALE_ORPHAN:
		printf("  stale orphan record: inode %llu does not exist", ino);
		break;
	case STK_FSCK_PARENT_POINTER:
		printf("  parent pointer: folder %llu points at %llu, its entry is in %llu", ino,
		       found, expect);
		break;
	case STK_FSCK_QUOTA_BYTES:
	case STK_FSCK_QUOTA_INODES:
		printf("  quota usage: folder %llu counts %llu %s, its tree holds %llu", ino, found,
		       q->kind == STK_FSCK_QUOTA_BYTES ? "bytes" : "inodes", expect);
		break;
	case STK_FSCK_FOLDER_CYCLE:
		printf("  folder cycle: folder %llu ('%s' in %llu) is in a loop of %llu folders "
		       "that the root does not reach",
		       ino, q->name, parent, found);
		break;
	case STK_FSCK_NAME_OFF_HOME:
		printf("  name off home: '%s' in folder %llu names file %llu of shard %llu, %s",
		       q->name, parent, ino, found,
		       expect == 1   ? "which does not count it (no record there)"
		       : expect == 2 ? "and this folder's shard has no record of where it lives"
				     : "and neither shard has a record of that name");
		break;
	case STK_FSCK_STALE_NAME_RECORD:
		if (expect & 2)
			printf(
			    "  stale name record: a record of a name of file %llu (of shard %llu) "
			    "that no entry here has and its home does not count",
			    ino, found);
		else
			printf("  stale name record: file %llu counts a name on shard %llu, which "
			       "that shard does not have%s",
			       ino, found, expect & 1 ? " (it keeps a leftover record of it)" : "");
		break;
	case STK_FSCK_GARBAGE:
		printf("  garbage: %llu chunk copies (%llu bytes) of inode %llu, which meta does "
		       "not know",
		       (unsigned long long)q->copies, (unsigned long long)q->bytes, ino);
		break;
	case STK_FSCK_MISSING_CHUNK:
		printf("  missing chunk: chunk %u of inode %llu (chain %u) is on no replica: data "
		       "lost",
		       q->chunk, ino, q->chain);
		break;
	case STK_FSCK_REPLICAS_DIFFER:
		printf(
		    "  replicas differ: chunk %u of inode %llu (chain %u): %llu copies, not alike",
		    q->chunk, ino, q->chain, (unsigned long long)q->copies);
		break;
	default:
		printf("  corrupt record: inode %llu", ino);
	}
	if (q->repaired && q->kind == STK_FSCK_UNREACHED_INODE && q->name[0])
		printf(" (reattached as %s/%s)", "/lost+found", q->name);
	else if (q->repaired)
		printf(" (%s)", q->kind == STK_FSCK_GARBAGE	   ? "removed"
				: q->kind == STK_FSCK_FOLDER_CYCLE ? "cut: it goes to /lost+found"
								   : "repaired");
	putchar('\n');
}

static void print_json(const struct stk_fsck_report *r)
{
	printf("{\"clean\": %s, \"problems\": %llu, \"remaining\": %llu, ",
	       r->remaining ? "false" : "true", (unsigned long long)r->problems,
	       (unsigned long long)r->remaining);
	printf("\"namespace\": {\"inodes\": %llu, \"entries\": %llu, \"dirs\": %llu, "
	       "\"files\": %llu}, ",
	       (unsigned long long)r->inodes, (unsigned long long)r->entries,
	       (unsigned long long)r->dirs, (unsigned long long)r->files);
	printf("\"in_progress\": %llu, ", (unsigned long long)r->in_progress);
	printf("\"data\": {\"targets\": %u, \"targets_skipped\": %u, \"chunks\": %llu, "
	       "\"young_unknown\": %llu}, ",
	       r->targets, r->targets_skipped, (unsigned long long)r->chunks,
	       (unsigned long long)r->young_unknown);
	if (r->nshards > 1) {
		printf("\"shards\": [");
		for (uint32_t i = 0; i < r->nshards; i++) {
			const struct stk_fsck_shard *s = &r->shards[i];

			printf("%s{\"shard\": %u, \"inodes\": %llu, \"entries\": %llu, "
			       "\"dirs\": %llu, \"files\": %llu, \"problems\": %llu, "
			       "\"remaining\": %llu}",
			       i ? ", " : "", s->id, (unsigned long long)s->inodes,
			       (unsigned long long)s->entries, (unsigned long long)s->dirs,
			       (unsigned long long)s->files, (unsigned long long)s->problems,
			       (unsigned long long)s->remaining);
		}
		printf("], ");
	}
	printf("\"list\": [");
	for (size_t i = 0; i < r->nlist; i++) {
		const struct stk_fsck_problem *q = &r->list[i];

		if (is_data(q->kind)) {
			printf("%s{\"kind\": \"%s\", \"ino\": %llu, \"chunk\": %u, \"chain\": %u, "
			       "\"copies\": %llu, \"bytes\": %llu, \"repaired\": %s}",
			       i ? ", " : "", kind_name(q->kind), (unsigned long long)q->ino,
			       q->chunk, q->chain, (unsigned long long)q->copies,
			       (unsigned long long)q->bytes, q->repaired ? "true" : "false");
			continue;
		}
		printf("%s{\"kind\": \"%s\", \"ino\": %llu, \"parent\": %llu, \"expect\": %llu, "
		       "\"found\": %llu, \"name\": ",
		       i ? ", " : "", kind_name(q->kind), (unsigned long long)q->ino,
		       (unsigned long long)q->parent, (unsigned long long)q->expect,
		       (unsigned long long)q->found);
		cli_json_str(stdout, q->name);
		printf(", \"repaired\": %s}", q->repaired ? "true" : "false");
	}
	printf("]}\n");
}

static void print_text(const struct stk_fsck_report *r, int repair, int64_t grace)
{
	int data_seen = 0;

	printf("namespace: %llu inodes, %llu entries, %llu folders, %llu files\n",
	       (unsigned long long)r->inodes, (unsigned long long)r->entries,
	       (unsigned long long)r->dirs, (unsigned long long)r->files);
	/* Several shards: each one's part (one shard prints as it always has). */
	for (uint32_t i = 0; r->nshards > 1 && i < r->nshards; i++) {
		const struct stk_fsck_shard *s = &r->shards[i];

		printf("shard %u: %llu inodes, %llu entries, %llu folders, %llu files; ", s->id,
		       (unsigned long long)s->inodes, (unsigned long long)s->entries,
		       (unsigned long long)s->dirs, (unsigned long long)s->files);
		if (s->problems)
			printf("%llu problem(s), %llu left\n", (unsigned long long)s->problems,
			       (unsigned long long)s->remaining);
		else
			printf("clean\n");
	}
	printf("data: %u targets listed (%u not serving, skipped), %llu chunk copies\n", r->targets,
	       r->targets_skipped, (unsigned long long)r->chunks);
	if (r->young_unknown)
		printf("data: %llu inode(s) unknown to meta with chunks younger than %llds: left "
		       "alone (files being created)\n",
		       (unsigned long long)r->young_unknown, (long long)grace);
	for (size_t i = 0; i < r->nlist; i++) {
		/* The namespace's problems past those listed, before the data's. */
		if (!data_seen && is_data(r->list[i].kind)) {
			data_seen = 1;
			if (r->unlisted)
				printf("  ... and %llu more namespace problems\n",
				       (unsigned long long)r->unlisted);
		}
		line(&r->list[i]);
	}
	if (!data_seen && r->unlisted)
		printf("  ... and %llu more namespace problems\n", (unsigned long long)r->unlisted);
	if (r->in_progress)
		printf("in progress: %llu name(s) or folder(s) across shards under a rename, link, "
		       "mkdir or rmdir: left to its protocol\n",
		       (unsigned long long)r->in_progress);
	if (!r->problems)
		printf("clean: no problem found\n");
	else
		printf("%llu problem(s) found, %llu left%s\n", (unsigned long long)r->problems,
		       (unsigned long long)r->remaining,
		       r->remaining && !repair ? " (stoker fsck --repair fixes what is safe)" : "");
}

int cmd_fsck(int argc, char **argv)
{
	struct stk_fsck_opts o = {.size = sizeof(o)};
	struct stk_fsck_report *r = NULL;
	const char *cluster = NULL;
	int64_t grace = 600;
	int json = 0, show, rc;
	stk_client *c;

	for (int i = 1; i < argc; i++) {
		uint64_t v;

		if (strcmp(argv[i], "--repair") == 0) {
			o.repair = 1;
		} else if (strcmp(argv[i], "--json") == 0) {
			json = 1;
		} else if (strcmp(argv[i], "--grace") == 0 && i + 1 < argc) {
			if (stk_parse_u64(argv[i + 1], &v) || v > GRACE_MAX_S) {
				cli_err(argv[0], "--grace takes seconds, 0 to %llu: '%s'",
					(unsigned long long)GRACE_MAX_S, argv[i + 1]);
				return 2;
			}
			grace = (int64_t)v;
			o.grace_s = v ? (int64_t)v : -1;
			i++;
		} else if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc) {
			cluster = argv[++i];
		} else {
			return cli_usage(argv[0]);
		}
	}
	show = !json && isatty(2);
	if (show)
		o.progress = progress_line;
	c = cli_connect(argv[0], cluster);
	if (!c)
		return 1;
	rc = stk_fsck(c, &o, &r);
	if (show)
		fputs("\r\033[K", stderr);
	if (rc) {
		cli_err(argv[0], "%s", rc == -EPERM ? "only root may run fsck" : stk_strerror(rc));
		rc = 1;
	} else {
		if (json)
			print_json(r);
		else
			print_text(r, o.repair, grace);
		rc = r->remaining ? 1 : 0;
	}
	stk_fsck_report_free(r);
	return rc; /* main disconnects c */
}
