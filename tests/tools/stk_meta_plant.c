/*
 * stk_meta_plant: plants a namespace problem in a stopped meta's store, for the
 * tests of `stoker fsck` (tests/integration/test_fsck.py). It edits the LMDB
 * records directly, as a crash or a bug might have left them, without going
 * through the store's rules (which would never allow it):
 *
 *   stk_meta_plant DIR drop-inode INO          the inode record goes, its entries
 *                                              stay (they dangle)
 *   stk_meta_plant DIR drop-entry PARENT NAME  the entry goes, its inode stays
 *                                              (unreached)
 *   stk_meta_plant DIR set-nlink INO N         the inode's link count becomes N
 *   stk_meta_plant DIR set-parent INO P        the inode's parent pointer becomes P
 *                                              (a record of format 3, today's)
 *   stk_meta_plant DIR move-entry PARENT NAME TO  the entry moves to folder TO, same
 *                                              name and inode (nothing else changes)
 *   stk_meta_plant DIR drop-xrec KIND INO      the cross-shard record KIND ('X', 'R'
 *                                              or 'L') of inode INO goes
 *
 * DIR is the store's folder (DATA/meta/meta). The record layouts are
 * src/meta/store.h's: keys big-endian, an inode record's nlink the little-endian
 * u32 at byte 13 (after the format byte, ino and mode), its parent the
 * little-endian u64 at byte 109 (after the format byte and the 108 bytes of
 * attributes). Exit 0, or 1 with a message.
 */
#include <errno.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define NLINK_AT 13
#define PARENT_AT 109
#define INODE_FORMAT 3

static void be64_put(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static int parse(const char *s, uint64_t *out)
{
	char *end;

	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || end == s || *end ? -1 : 0;
}

static int fail(const char *what, int rc)
{
	fprintf(stderr, "stk_meta_plant: %s: %s\n", what, mdb_strerror(rc));
	return 1;
}

int main(int argc, char **argv)
{
	MDB_env *env = NULL;
	MDB_txn *txn = NULL;
	MDB_dbi dbi;
	uint8_t k[16 + 256], rec[512];
	MDB_val key = {8, k}, val;
	uint64_t a = 0, b = 0;
	int rc;

	if (argc < 4 || (strcmp(argv[2], "drop-xrec") != 0 && parse(argv[3], &a)) ||
	    (strcmp(argv[2], "set-nlink") == 0 && (argc != 5 || parse(argv[4], &b))) ||
	    (strcmp(argv[2], "set-parent") == 0 && (argc != 5 || parse(argv[4], &b))) ||
	    (strcmp(argv[2], "drop-entry") == 0 && (argc != 5 || strlen(argv[4]) > 255)) ||
	    (strcmp(argv[2], "move-entry") == 0 &&
	     (argc != 6 || strlen(argv[4]) > 255 || parse(argv[5], &b))) ||
	    (strcmp(argv[2], "drop-xrec") == 0 &&
	     (argc != 5 || strlen(argv[3]) != 1 || !strchr("XRL", argv[3][0]) ||
	      parse(argv[4], &b)))) {
		fprintf(stderr, "usage: stk_meta_plant DIR drop-inode INO | drop-entry PARENT NAME "
				"| set-nlink INO N | set-parent INO P | move-entry PARENT NAME TO "
				"| drop-xrec X|R|L INO\n");
		return 2;
	}
	rc = mdb_env_create(&env);
	if (rc == 0)
		rc = mdb_env_set_maxdbs(env, 16);
	if (rc == 0)
		rc = mdb_env_open(env, argv[1], 0, 0600);
	if (rc)
		return fail("open", rc);
	rc = mdb_txn_begin(env, NULL, 0, &txn);
	if (rc)
		return fail("begin", rc);
	be64_put(k, a);
	if (strcmp(argv[2], "drop-inode") == 0) {
		rc = mdb_dbi_open(txn, "inodes", 0, &dbi);
		if (rc == 0)
			rc = mdb_del(txn, dbi, &key, NULL);
	} else if (strcmp(argv[2], "drop-entry") == 0) {
		size_t len = strlen(argv[4]);
		uint64_t h = XXH64(argv[4], len, 0);

		be64_put(k + 8, h == UINT64_MAX ? h - 1 : h);
		memcpy(k + 16, argv[4], len);
		key.mv_size = 16 + len;
		rc = mdb_dbi_open(txn, "dentries", 0, &dbi);
		if (rc == 0)
			rc = mdb_del(txn, dbi, &key, NULL);
	} else if (strcmp(argv[2], "move-entry") == 0) {
		size_t len = strlen(argv[4]);
		uint64_t h = XXH64(argv[4], len, 0);
		uint8_t k2[16 + 256];
		MDB_val key2 = {16 + len, k2};

		be64_put(k + 8, h == UINT64_MAX ? h - 1 : h);
		memcpy(k + 16, argv[4], len);
		key.mv_size = 16 + len;
		memcpy(k2, k, key.mv_size);
		be64_put(k2, b);
		rc = mdb_dbi_open(txn, "dentries", 0, &dbi);
		if (rc == 0)
			rc = mdb_get(txn, dbi, &key, &val);
		if (rc == 0 && val.mv_size > sizeof(rec))
			rc = MDB_CORRUPTED;
		if (rc == 0) {
			memcpy(rec, val.mv_data, val.mv_size);
			val.mv_data = rec;
			rc = mdb_put(txn, dbi, &key2, &val, MDB_NOOVERWRITE);
		}
		if (rc == 0)
			rc = mdb_del(txn, dbi, &key, NULL);
	} else if (strcmp(argv[2], "drop-xrec") == 0) {
		k[0] = (uint8_t)argv[3][0];
		be64_put(k + 1, b);
		key.mv_size = 9;
		rc = mdb_dbi_open(txn, "xshard", 0, &dbi);
		if (rc == 0)
			rc = mdb_del(txn, dbi, &key, NULL);
	} else if (strcmp(argv[2], "set-nlink") == 0) {
		rc = mdb_dbi_open(txn, "inodes", 0, &dbi);
		if (rc == 0)
			rc = mdb_get(txn, dbi, &key, &val);
		if (rc == 0 && (val.mv_size > sizeof(rec) || val.mv_size < NLINK_AT + 4))
			rc = MDB_CORRUPTED;
		if (rc == 0) {
			memcpy(rec, val.mv_data, val.mv_size);
			for (int i = 0; i < 4; i++)
				rec[NLINK_AT + i] = (uint8_t)(b >> (8 * i));
			val.mv_data = rec;
			rc = mdb_put(txn, dbi, &key, &val, 0);
		}
	} else if (strcmp(argv[2], "set-parent") == 0) {
		rc = mdb_dbi_open(txn, "inodes", 0, &dbi);
		if (rc == 0)
			rc = mdb_get(txn, dbi, &key, &val);
		if (rc == 0 && (val.mv_size > sizeof(rec) || val.mv_size < PARENT_AT + 8 ||
				((const uint8_t *)val.mv_data)[0] != INODE_FORMAT))
			rc = MDB_CORRUPTED;
		if (rc == 0) {
			memcpy(rec, val.mv_data, val.mv_size);
			for (int i = 0; i < 8; i++)
				rec[PARENT_AT + i] = (uint8_t)(b >> (8 * i));
			val.mv_data = rec;
			rc = mdb_put(txn, dbi, &key, &val, 0);
		}
	} else {
		fprintf(stderr, "stk_meta_plant: unknown change %s\n", argv[2]);
		rc = MDB_INVALID;
	}
	if (rc) {
		mdb_txn_abort(txn);
		mdb_env_close(env);
		return fail(argv[2], rc);
	}
	rc = mdb_txn_commit(txn);
	if (rc == 0)
		rc = mdb_env_sync(env, 1);
	mdb_env_close(env);
	return rc ? fail("commit", rc) : 0;
}
