/*
 * The S3 gateway: the Stoker namespace served over the S3 API.
 *
 * gateway.c   `stoker gateway s3`: options, access keys, TLS files, run until a signal
 * s3_http.c   the HTTP server (libmicrohttpd): request life, SigV4, bodies, errors
 * s3_ops.c    the S3 operations: what each request does and the XML it answers
 * s3_store.c  how buckets and objects map onto files, on libstoker
 * s3_parse.c  parsers and encoders with no I/O (fuzzed: tests/fuzz/fuzz_s3.c)
 *
 * The mapping (docs/s3.md says it for users): buckets are the directories of the
 * gateway's root ("/" or --root); object key "a/b/c" is the file BUCKET/a/b/c. In
 * each bucket three hidden directories, never listed and never reachable by a key
 * (keys may not start with ".stoker-"):
 *   .stoker-upload/     temporary files of PUTs, copies and Completes in flight;
 *                       each is renamed over its key when whole and durable
 *   .stoker-meta/KEY    records of objects written by gateways before records
 *                       moved into extended attributes (symlink targets); read
 *                       only as a fallback, removed with their objects.
 *   .stoker-multipart/ID/  one directory per multipart upload: "info" (a record
 *                       with the key and headers) and part files "pNNNNN" (older
 *                       gateways left part records "pNNNNN.m" beside them).
 *
 * An object's metadata record (ETag, Content-Type, x-amz-meta-*) is the extended
 * attribute STK_S3_XATTR of its file, set on the temporary file before the rename
 * that publishes it: the rename makes the bytes and the record visible together,
 * so a reader, a failed rename or two racing PUTs can never pair one PUT's bytes
 * with another's record. It lives in the metadata service (no storage I/O). The
 * record names the inode, size and mtime of the file it describes; a file changed
 * through the mount or libstoker no longer matches and is served with a fallback
 * ETag instead of a wrong one.
 *
 * Threads: requests run on libmicrohttpd's thread pool and call libstoker, which
 * is safe from any thread; the only shared mutable state is the table of files
 * open for reading (struct stk_s3_open_table), under its own mutex.
 */
#ifndef STK_GATEWAY_S3_H
#define STK_GATEWAY_S3_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "stoker/stoker.h"

#include "stoker/stoker_ll.h"
#include "s3_parse.h"

#define STK_S3_UPLOAD_DIR ".stoker-upload"
#define STK_S3_META_DIR ".stoker-meta"
#define STK_S3_MPU_DIR ".stoker-multipart"
#define STK_S3_MIN_PART_SIZE (5ull << 20)   /* every part but the last, as S3 */
#define STK_S3_MAX_OBJECT_SIZE (5ull << 40) /* 5 TiB, as S3 */
#define STK_S3_EMPTY_MD5 "d41d8cd98f00b204e9800998ecf8427e"
#define STK_S3_DOMAINS_MAX 8 /* --domain options */

/* An object's record, in its file's extended attributes (see above). */
#define STK_S3_XATTR "user.stoker.s3"
/* In the root: the hidden folders of a bucket being deleted (stk_s3_bucket_delete). */
#define STK_S3_TRASH_PREFIX ".stoker-deleted-"

/*
 * Every S3 error the gateway answers, declared once: the enum, the codes, the
 * HTTP statuses and the default messages come from this table.
 */
#define STK_S3_ERRORS(X)                                                                           \
	X(ACCESS_DENIED, "AccessDenied", 403, "Access Denied.")                                    \
	X(EXPIRED, "AccessDenied", 403, "Request has expired.")                                    \
	X(AUTH_MALFORMED, "AuthorizationHeaderMalformed", 400,                                     \
	  "The authorization header is malformed.")                                                \
	X(BAD_DIGEST, "BadDigest", 400,                                                            \
	  "The Content-MD5 you specified did not match what we received.")                         \
	X(BUCKET_EXISTS, "BucketAlreadyOwnedByYou", 409,                                           \
	  "Your previous request to create the named bucket succeeded and you already own it.")    \
	X(BUCKET_NOT_EMPTY, "BucketNotEmpty", 409, "The bucket you tried to delete is not empty.") \
	X(ENTITY_TOO_SMALL, "EntityTooSmall", 400,                                                 \
	  "Your proposed upload is smaller than the minimum allowed object size.")                 \
	X(ENTITY_TOO_LARGE, "EntityTooLarge", 400,                                                 \
	  "Your proposed upload exceeds the maximum allowed object size.")                         \
	X(INCOMPLETE_BODY, "IncompleteBody", 400,                                                  \
	  "You did not provide the number of bytes specified by the Content-Length HTTP header.")  \
	X(INTERNAL, "InternalError", 500, "We encountered an internal error. Please try again.")   \
	X(INVALID_ACCESS_KEY, "InvalidAccessKeyId", 403,                                           \
	  "The AWS access key ID you provided does not exist in our records.")                     \
	X(INVALID_ARGUMENT, "InvalidArgument", 400, "Invalid Argument.")                           \
	X(INVALID_BUCKET_NAME, "InvalidBucketName", 400, "The specified bucket is not valid.")     \
	X(INVALID_DIGEST, "InvalidDigest", 400, "The Content-MD5 you specified is not valid.")     \
	X(INVALID_KEY, "InvalidArgument", 400,                                                     \
	  "Object keys may not hold empty, \".\" or \"..\" segments, NUL bytes or segments over "  \
	  "255 bytes, or start with \".stoker-\".")                                                \
	X(INVALID_PART, "InvalidPart", 400,                                                        \
	  "One or more of the specified parts could not be found. The part might not have been "   \
	  "uploaded, or the specified entity tag might not have matched the part's entity tag.")   \
	X(INVALID_PART_ORDER, "InvalidPartOrder", 400,                                             \
	  "The list of parts was not in ascending order. Parts must be ordered by part number.")   \
	X(INVALID_RANGE, "InvalidRange", 416, "The requested range is not satisfiable")            \
	X(INVALID_REQUEST, "InvalidRequest", 400, "Invalid Request.")                              \
	X(INVALID_URI, "InvalidURI", 400, "Couldn't parse the specified URI.")                     \
	X(NUL_IN_NAME, "InvalidArgument", 400,                                                     \
	  "Object keys, bucket names and parameters may not contain a NUL character.")             \
	X(KEY_CONFLICT, "KeyConflict", 409,                                                        \
	  "The key names a folder, or a folder in it names an object: on Stoker a key cannot be "  \
	  "both.")                                                                                 \
	X(KEY_TOO_LONG, "KeyTooLongError", 400, "Your key is too long.")                           \
	X(MALFORMED_XML, "MalformedXML", 400,                                                      \
	  "The XML you provided was not well-formed or did not validate against our published "    \
	  "schema.")                                                                               \
	X(MAX_MESSAGE_LENGTH, "MaxMessageLengthExceeded", 400, "Your request was too big.")        \
	X(METADATA_TOO_LARGE, "MetadataTooLarge", 400,                                             \
	  "Your metadata headers exceed the maximum allowed metadata size.")                       \
	X(METHOD_NOT_ALLOWED, "MethodNotAllowed", 405,                                             \
	  "The specified method is not allowed against this resource.")                            \
	X(MISSING_SECURITY_HEADER, "MissingSecurityHeader", 400,                                   \
	  "Your request is missing the x-amz-content-sha256 header.")                              \
	X(NO_SUCH_BUCKET, "NoSuchBucket", 404, "The specified bucket does not exist.")             \
	X(NO_SUCH_KEY, "NoSuchKey", 404, "The specified key does not exist.")                      \
	X(NO_SUCH_UPLOAD, "NoSuchUpload", 404,                                                     \
	  "The specified multipart upload does not exist. The upload ID might be invalid, or the " \
	  "multipart upload might have been aborted or completed.")                                \
	X(NOT_IMPLEMENTED, "NotImplemented", 501,                                                  \
	  "A header or parameter you provided implies functionality that is not implemented.")     \
	X(NOT_MODIFIED, "NotModified", 304, "Not Modified")                                        \
	X(PRECONDITION_FAILED, "PreconditionFailed", 412,                                          \
	  "At least one of the pre-conditions you specified did not hold.")                        \
	X(TIME_SKEWED, "RequestTimeTooSkewed", 403,                                                \
	  "The difference between the request time and the server's time is too large.")           \
	X(SHA256_MISMATCH, "XAmzContentSHA256Mismatch", 400,                                       \
	  "The provided 'x-amz-content-sha256' header does not match what was computed.")          \
	X(SIGNATURE_MISMATCH, "SignatureDoesNotMatch", 403,                                        \
	  "The request signature we calculated does not match the signature you provided. "        \
	  "Check your key and signing method.")                                                    \
	X(SLOW_DOWN, "SlowDown", 503, "Please reduce your request rate.")                          \
	X(STORAGE_FULL, "InsufficientStorage", 507, "The cluster has no space left for the object.") \
	/* A folder quota (docs/quotas.md); code and status as Ceph RGW answers a quota. */  \
	X(QUOTA_EXCEEDED, "QuotaExceeded", 403, "The bucket's quota has no room for the object.")

enum stk_s3_err {
	STK_S3_OK = 0,
#define STK_S3_ERR_ENUM(name, code, status, msg) STK_S3_ERR_##name,
	STK_S3_ERRORS(STK_S3_ERR_ENUM)
#undef STK_S3_ERR_ENUM
	    STK_S3_ERR__COUNT
};

const char *stk_s3_err_code(enum stk_s3_err e);
unsigned stk_s3_err_status(enum stk_s3_err e);
const char *stk_s3_err_message(enum stk_s3_err e);
/* The error a libstoker -errno stands for when no operation-specific one fits. */
enum stk_s3_err stk_s3_err_from_errno(int err);

/*
 * One access key: its keys-file line (id, secret, and a user's name, ids and
 * buckets), and the credentials a user's requests act with (line.has_ids).
 */
struct stk_s3_key {
	struct stk_s3_keyline line;
	struct stk_ll_cred cred;
};

/* Files open for reading by GETs, so that an overwrite or delete of their object
 * leaves the bytes readable until the last GET on them ends (POSIX's unlinked but
 * open). Keyed by inode number. */
struct stk_s3_open_ent {
	uint64_t ino;
	unsigned refs;
	int doomed;	      /* unlinked: remove the data when refs drops to 0 */
	struct stk_ll_attr attr; /* for removing the data */
	struct stk_s3_open_ent *next;
};

struct stk_s3_open_table {
	pthread_mutex_t lock; /* protects every field and entry */
	struct stk_s3_open_ent *slots[256];
};

/*
 * Recently looked-up buckets: the bucket folder's inode and its .stoker-upload
 * and .stoker-meta inodes, kept STK_S3_BCACHE_TTL_MS so that a request does not pay
 * three metadata round trips to find them. A bucket removed and made again
 * through another client is seen at most that long late (as a missing key or
 * bucket); this gateway's own DeleteBucket forgets the entry at once.
 */
#define STK_S3_BCACHE_SLOTS 64
#define STK_S3_BCACHE_TTL_MS 2000
enum { STK_S3_DIR_UPLOAD, STK_S3_DIR_META, STK_S3_DIR_COUNT };

struct stk_s3_bcache_ent {
	char name[STK_S3_BUCKET_MAX + 1];
	uint64_t ino;
	uint64_t dirs[STK_S3_DIR_COUNT]; /* 0: not known yet */
	uint64_t expires_ns;
};

struct stk_s3_bcache {
	pthread_mutex_t lock; /* protects e */
	struct stk_s3_bcache_ent e[STK_S3_BCACHE_SLOTS];
};

/* The gateway: set up by gateway.c, read-only once serving (but for `open`, `bcache`). */
struct stk_s3_gw {
	stk_client *c;
	char root[STK_LL_PATH_MAX + 1]; /* "" for the cluster's root, else "/dir" */
	uint64_t root_ino;
	char region[65];
	struct stk_s3_key *keys;
	unsigned nkeys;
	size_t io_size;	 /* bytes per storage read or write of a streamed body */
	unsigned skew_s; /* allowed clock difference for signed requests */
	struct stk_s3_open_table open;
	struct stk_s3_bcache bcache;
	const char *domains[STK_S3_DOMAINS_MAX]; /* --domain: virtual-hosted style under these */
	unsigned ndomains;
};

/* The access key's secret, or NULL. */
const struct stk_s3_key *stk_s3_key_find(const struct stk_s3_gw *gw, const char *id);

/*
 * The credentials the namespace calls of this thread act with from now on: a
 * user's (its key's cred), or NULL for the gateway's own. The HTTP layer sets it
 * for each request's callbacks; background work (the sweep) runs as the gateway.
 * Buckets are made and removed as the gateway (the root folder is its), a new
 * bucket then given to the user.
 */
void stk_s3_store_as(const struct stk_ll_cred *cred);

/* ---- store: buckets ---- */

/* A bucket directory by name: 0, -ENOENT (missing or not a directory). */
int stk_s3_bucket_lookup(struct stk_s3_gw *gw, const char *bucket, struct stk_ll_attr *out);
int stk_s3_bucket_create(struct stk_s3_gw *gw, const char *bucket);
/* -ENOENT, -ENOTEMPTY (objects remain; hidden folders alone do not count). */
int stk_s3_bucket_delete(struct stk_s3_gw *gw, const char *bucket);

struct stk_s3_bucket_ent {
	char name[STK_S3_BUCKET_MAX + 1];
	int64_t ctime;
};
/* Every directory of the root with a valid bucket name, sorted; *out malloc'ed. */
int stk_s3_bucket_list(struct stk_s3_gw *gw, struct stk_s3_bucket_ent **out, unsigned *n);

/* ---- store: objects ---- */

/* What the gateway knows of one object. */
struct stk_s3_obj {
	struct stk_ll_attr attr;
	uint64_t parent_ino;	     /* the directory holding it */
	char name[STK_LL_NAME_MAX + 1]; /* its name there */
	int dir_marker;		     /* a key ending in '/': an (empty) folder, served as 0 bytes */
	int have_rec;		     /* rec is valid and matches attr */
	struct stk_s3_record rec;
	char etag[STK_S3_ETAG_MAX + 1]; /* quoted: from rec, else the fallback */
};

/*
 * Looks an object up: 0, -ENOENT (no such key, or a folder named without its
 * trailing '/'), -EINVAL (a key that is not valid).
 */
int stk_s3_obj_stat(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key,
		    struct stk_s3_obj *o);
/* The fallback ETag of a file with no (valid) record: "HEX-1", from inode, size, mtime. */
void stk_s3_fallback_etag(const struct stk_ll_attr *a, char *out, size_t len);

/*
 * Opens an object's file for reading and registers it in the open table; release
 * it with stk_s3_obj_release (which may remove an overwritten file's data). After
 * registering, the name is looked up again: -ESTALE when it no longer names the
 * same file (replaced or deleted since stk_s3_obj_stat, perhaps with its data already
 * gone), and the caller stats again. Once this returns 0 the bytes stay readable
 * whatever happens to the key.
 */
int stk_s3_obj_open(struct stk_s3_gw *gw, const struct stk_s3_obj *o, stk_file **out);
void stk_s3_obj_release(struct stk_s3_gw *gw, stk_file *f);

/*
 * Removes an object (and its record, and folders it leaves empty). 0 also when
 * it did not exist, as S3. A key ending in '/' removes the folder if empty.
 */
int stk_s3_obj_delete(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key);

/* A temporary file being written, to become an object or a part when whole. */
struct stk_s3_tmp {
	stk_file *f;
	uint64_t dir_ino; /* the directory the temporary file is in */
	char name[48];
	struct stk_ll_attr attr; /* after stk_s3_tmp_finish */
	uint64_t written;
};

/* Creates a temporary file in BUCKET/.stoker-upload (dir_ino 0) or in dir_ino. */
int stk_s3_tmp_create(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, uint64_t dir_ino,
		      struct stk_s3_tmp *t);
int stk_s3_tmp_write(struct stk_s3_tmp *t, const void *p, size_t n);
/* Closes (the data is durable after this) and fetches the attributes. */
int stk_s3_tmp_finish(struct stk_s3_gw *gw, struct stk_s3_tmp *t);
/* Closes if open and removes the file; safe on a zeroed or committed stk_s3_tmp. */
void stk_s3_tmp_discard(struct stk_s3_gw *gw, struct stk_s3_tmp *t);
/*
 * Makes a finished temporary file the object `key`: makes the key's folders,
 * stores rec (its ino/size/mtime filled in here) and renames the file over the
 * key, atomically replacing an older object. -EISDIR / -ENOTDIR when the key
 * conflicts with a folder; on error the temporary file is left for the caller.
 */
int stk_s3_tmp_commit(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, struct stk_s3_tmp *t,
		      const char *key, struct stk_s3_record *rec);
/* Replaces the record of an existing object (file a) with rec: a metadata-only change. */
int stk_s3_obj_put_record(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key,
			  const struct stk_ll_attr *a, struct stk_s3_record *rec);
/* Makes the folder a key "a/b/" names (with its parents). */
int stk_s3_mkdir_marker(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key);

/*
 * Copies len bytes at off of src into t, adding them to md5 (an EVP_MD_CTX, may
 * be NULL). buf is io_size bytes.
 */
int stk_s3_copy_data(struct stk_s3_gw *gw, stk_file *src, uint64_t off, uint64_t len,
		     struct stk_s3_tmp *t, void *md5, char *buf);

/*
 * Removes what is older than max_age_s in every bucket's .stoker-upload: the
 * temporary files of PUTs whose gateway died before it could remove them. Returns
 * how many entries went, or -errno when the buckets could not be listed.
 */
int stk_s3_sweep(struct stk_s3_gw *gw, int64_t max_age_s);

/* ---- store: listing ---- */

struct stk_s3_list_opts {
	const char *prefix;
	const char *delimiter; /* NULL or "" for none */
	const char *after;     /* list keys greater than this ("" for all) */
	unsigned max;
	int want_etag; /* fill etag (a record lookup per object) */
};

struct stk_s3_list_item {
	char *key;     /* malloc'ed */
	int is_prefix; /* a common prefix, not an object */
	uint64_t size;
	int64_t mtime;
	char etag[STK_S3_ETAG_MAX + 1];
};

struct stk_s3_list {
	struct stk_s3_list_item *items;
	unsigned n, cap;
	int truncated;
};

/*
 * Lists up to o->max keys and common prefixes of the bucket in S3's order (bytes,
 * lexicographic), walking folders from the deepest one the prefix names and
 * sorting each folder's entries as S3 keys sort. Stops after max, with truncated
 * set when more follow. Free with stk_s3_list_free.
 */
int stk_s3_list(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket,
		const struct stk_s3_list_opts *o, struct stk_s3_list *out);
void stk_s3_list_free(struct stk_s3_list *l);

/* ---- store: multipart uploads ---- */

/* Creates BUCKET/.stoker-multipart/ID with its info record; id gets 32 hex + NUL. */
int stk_s3_mpu_create(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key,
		      const struct stk_s3_record *info, char *id);
/* The upload's directory and info record: 0 or -ENOENT. */
int stk_s3_mpu_open(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *id,
		    struct stk_ll_attr *dir, struct stk_s3_record *info);
/* Makes the finished temporary file t part `number` with the given md5 (32 hex). */
int stk_s3_mpu_put_part(struct stk_s3_gw *gw, const struct stk_ll_attr *dir, struct stk_s3_tmp *t,
			unsigned number, const char *md5_hex);

struct stk_s3_part {
	unsigned number;
	uint64_t dir_ino; /* the upload's directory */
	uint64_t size;
	int64_t mtime;
	struct stk_ll_attr attr;
	char etag[STK_S3_ETAG_MAX + 1]; /* quoted */
};
/* One part by number: 0, -ENOENT (missing, or its record does not match it). */
int stk_s3_mpu_part(struct stk_s3_gw *gw, const struct stk_ll_attr *dir, unsigned number,
		    struct stk_s3_part *out);
/* The parts with numbers > after, ascending, at most max; *out malloc'ed. */
int stk_s3_mpu_parts(struct stk_s3_gw *gw, const struct stk_ll_attr *dir, unsigned after, unsigned max,
		     struct stk_s3_part **out, unsigned *n, int *truncated);
/* Removes the upload's directory and everything in it. */
int stk_s3_mpu_remove(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *id);

struct stk_s3_upload_ent {
	char id[STK_S3_UPLOAD_ID_LEN + 1];
	char *key; /* malloc'ed */
	int64_t initiated;
};
/* Every upload of the bucket, sorted by key, then initiation, then id. */
int stk_s3_mpu_list(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket,
		    struct stk_s3_upload_ent **out, unsigned *n);
void stk_s3_mpu_list_free(struct stk_s3_upload_ent *u, unsigned n);

/* Random bytes as lower-case hex (2n digits + NUL). */
void stk_s3_random_hex(char *out, size_t nbytes);

/* ---- requests and operations ---- */

/*
 * Every operation, declared once: its name (for logs) and what its body is.
 * NONE: the body is ignored (the operation runs as soon as the headers are in);
 * XML: collected in memory up to a limit; FILE: streamed into a temporary file.
 */
#define STK_S3_OPS(X)                                                                              \
	X(LIST_BUCKETS, "ListBuckets", NONE)                                                       \
	X(CREATE_BUCKET, "CreateBucket", XML)                                                      \
	X(DELETE_BUCKET, "DeleteBucket", NONE)                                                     \
	X(HEAD_BUCKET, "HeadBucket", NONE)                                                         \
	X(GET_LOCATION, "GetBucketLocation", NONE)                                                 \
	X(GET_VERSIONING, "GetBucketVersioning", NONE)                                             \
	X(GET_ACL, "GetAcl", NONE)                                                                 \
	X(LIST_OBJECTS, "ListObjects", NONE)                                                       \
	X(LIST_OBJECTS_V2, "ListObjectsV2", NONE)                                                  \
	X(LIST_UPLOADS, "ListMultipartUploads", NONE)                                              \
	X(DELETE_OBJECTS, "DeleteObjects", XML)                                                    \
	X(PUT_OBJECT, "PutObject", FILE)                                                           \
	X(PUT_MARKER, "PutObject", NONE)                                                           \
	X(COPY_OBJECT, "CopyObject", NONE)                                                         \
	X(GET_OBJECT, "GetObject", NONE)                                                           \
	X(HEAD_OBJECT, "HeadObject", NONE)                                                         \
	X(DELETE_OBJECT, "DeleteObject", NONE)                                                     \
	X(CREATE_UPLOAD, "CreateMultipartUpload", NONE)                                            \
	X(UPLOAD_PART, "UploadPart", FILE)                                                         \
	X(UPLOAD_PART_COPY, "UploadPartCopy", NONE)                                                \
	X(COMPLETE_UPLOAD, "CompleteMultipartUpload", XML)                                         \
	X(ABORT_UPLOAD, "AbortMultipartUpload", NONE)                                              \
	X(LIST_PARTS, "ListParts", NONE)

enum stk_s3_op {
	STK_S3_OP_NONE = 0,
#define STK_S3_OP_ENUM(name, str, body) STK_S3_OP_##name,
	STK_S3_OPS(STK_S3_OP_ENUM)
#undef STK_S3_OP_ENUM
	    STK_S3_OP__COUNT
};

enum stk_s3_body { STK_S3_BODY_NONE, STK_S3_BODY_XML, STK_S3_BODY_FILE };

const char *stk_s3_op_name(enum stk_s3_op op);
enum stk_s3_body stk_s3_op_body(enum stk_s3_op op);

/*
 * One request, from its first header to its response. s3_http.c owns it and
 * fills the request half; s3_ops.c reads that and fills the response half. The
 * fields below `http:` are the HTTP layer's alone.
 */
struct stk_s3_req {
	struct stk_s3_gw *gw;
	void *conn; /* the libmicrohttpd connection */
	const char *method;
	struct stk_s3_target t;
	enum stk_s3_op op;
	struct stk_ll_attr bucket; /* looked up by stk_s3_op_begin for bucket operations */
	const struct stk_s3_key *key; /* the access key that signed it, once authenticated */
	char reqid[17];

	/* the body, once received */
	struct stk_s3_buf xml; /* STK_S3_BODY_XML */
	struct stk_s3_tmp tmp; /* STK_S3_BODY_FILE: where it was written */
	uint64_t body_len;     /* decoded bytes */
	char body_md5[33];     /* hex MD5 of the decoded body (FILE and XML bodies) */

	/* kept by stk_s3_op_begin for stk_s3_op_finish */
	unsigned part_number;
	struct stk_ll_attr mpu_dir;
	struct stk_s3_record rec; /* the record a PUT stores */

	/* the response */
	unsigned status;
	struct stk_s3_buf out;	/* body (XML) */
	struct stk_s3_buf hdrs; /* "name\0value\0" pairs */
	stk_file *file;		/* a GET's body: file_len bytes at file_off; owned by the request */
	uint64_t file_off, file_len;
	uint64_t head_len; /* HEAD of an object: the Content-Length to announce */
	char err_msg[256]; /* overrides the error's default message when set */

	/* http: */
	int target_rc; /* stk_s3_target_parse's result */
	int phase;
	int payload; /* how the body is signed: enum in s3_http.c */
	enum stk_s3_err body_err;
	struct stk_s3_auth auth;
	uint8_t skey[32];
	char amz_date[17];
	char prev_sig[65];
	char chunk_sig[65];
	char want_sha[65];
	void *sha;	 /* EVP_MD_CTX over the raw body (signed payloads) */
	void *chunk_sha; /* EVP_MD_CTX over one aws-chunked chunk */
	void *md5;	 /* EVP_MD_CTX over the decoded body */
	struct stk_s3_chunked ch;
	uint64_t raw_len;
	uint64_t decoded_len; /* x-amz-decoded-content-length, or UINT64_MAX */
	int ck;		      /* the x-amz-checksum-* to verify: enum in s3_http.c */
	uint32_t ck_crc;
	void *ck_md;	   /* EVP_MD_CTX for the SHA checksums */
	char ck_want[100]; /* base64, from a header or a trailer */
	uint64_t started_ns;
	uint64_t sent_len;	 /* bytes of a buffered response body handed over */
	enum stk_s3_err resp_err; /* what was answered, for the metrics */
};

/* A request header by name (case-insensitive), or NULL. */
const char *stk_s3_req_header(struct stk_s3_req *r, const char *name);
/* Calls fn for every request header. */
void stk_s3_req_each_header(struct stk_s3_req *r,
			    void (*fn)(void *ctx, const char *name, const char *value), void *ctx);
/* Adds a response header; copies both strings. */
void stk_s3_resp_header(struct stk_s3_req *r, const char *name, const char *value);

/*
 * Picks the operation of a parsed, authenticated request and checks its names:
 * STK_S3_OK with r->op set, or the error to answer.
 */
enum stk_s3_err stk_s3_op_route(struct stk_s3_req *r);
/*
 * Prepares an operation that has a body (looks the bucket up, makes the
 * temporary file...) or, for one without, runs it whole. STK_S3_OK or an error.
 */
enum stk_s3_err stk_s3_op_begin(struct stk_s3_req *r);
/* Finishes an operation with a body once the body is in and verified. */
enum stk_s3_err stk_s3_op_finish(struct stk_s3_req *r);

/* ---- the server ---- */

struct stk_s3_server;
struct stk_s3_server_opts {
	const char *listen;			/* "ADDR:PORT" */
	const char *tls_cert_pem, *tls_key_pem; /* contents, both or neither */
	unsigned threads;
	unsigned max_conns;
	unsigned timeout_s;
	int metrics; /* count requests in the stoker_client_* families (frontend "s3") */
};
int stk_s3_server_start(struct stk_s3_gw *gw, const struct stk_s3_server_opts *o,
			struct stk_s3_server **out);
/* The port it listens on (useful with port 0). */
unsigned stk_s3_server_port(const struct stk_s3_server *s);
void stk_s3_server_stop(struct stk_s3_server *s);

#endif
