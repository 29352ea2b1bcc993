/*
 * Packed shards: many samples in one large file, so that a data set of a million
 * small files costs a few opens, not a million. Written by `stoker pack`, read by
 * `stoker bench loader` and by the Python package (stoker.shards, stoker.torch).
 *
 * A shard is two files in one folder: shard-NNNNN.data, the samples' bytes one
 * after the other, and shard-NNNNN.index, which says where each sample is. The
 * index is written after its data file is durable, and renamed into place last,
 * so a shard whose index exists is complete; readers ignore a .data without one.
 *
 * The index, all integers little-endian (docs/python.md has the same table):
 *
 *   offset  size  field
 *   0       8     magic "STKSHARD"
 *   8       4     version (1)
 *   12      4     flags (0)
 *   16      8     count: samples in the shard
 *   24      8     data_size: bytes in the .data file
 *   32      8     names_size: bytes in the names blob
 *   40      32*count entries, one per sample, in data order:
 *                   u64 offset, u64 length (within the .data file),
 *                   u64 name_off, u32 name_len (within the names blob), u32 reserved (0)
 *   40+32*count names_size bytes: the samples' names (their paths relative to the
 *                   packed folder, UTF-8, '/'-separated), concatenated, no terminators
 *
 * A decoder checks every entry lies inside data_size and the names blob, so a
 * damaged index is refused (-EBADMSG), never followed.
 */
#ifndef STK_CLI_SHARD_H
#define STK_CLI_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "fsio.h"

#define CLI_SHARD_MAGIC "STKSHARD"
#define CLI_SHARD_VERSION 1
#define CLI_SHARD_HDR 40
#define CLI_SHARD_ENTRY 32
/* shard-%05u.data / shard-%05u.index */
#define CLI_SHARD_PREFIX "shard-"

struct cli_shard_entry {
	uint64_t offset, length;
	uint64_t name_off;
	uint32_t name_len;
};

struct cli_shard_index {
	uint64_t count;
	uint64_t data_size;
	struct cli_shard_entry *e; /* count */
	char *names;		   /* names_size bytes, not NUL-terminated */
	uint64_t names_size;
};

/* Encodes ix into a malloc'd buffer (*buf, *len). 0 or -ENOMEM. */
int cli_shard_index_encode(const struct cli_shard_index *ix, void **buf, size_t *len);
/* Decodes and checks an index; ix owns its arrays afterwards. 0, -EBADMSG, -ENOMEM. */
int cli_shard_index_decode(const void *buf, size_t len, struct cli_shard_index *ix);
/* Reads and decodes the index file at path. */
int cli_shard_index_load(struct cli_fs *fs, const char *path, struct cli_shard_index *ix);
void cli_shard_index_free(struct cli_shard_index *ix);

/* Names of the data and index files of shard n in dir (CLI_FS_PATH bytes each). */
void cli_shard_paths(const char *dir, unsigned n, char *data, char *index);

#endif
