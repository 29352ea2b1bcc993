/*
 * A small S3 client for `stoker sync`: the calls a tree copy needs (ListObjectsV2,
 * HeadObject, ranged GetObject, PutObject, multipart uploads, DeleteObject) against
 * any endpoint, path-style, signed with SigV4 by the gateway's own signing code
 * (gateway/s3_parse.h), over libcurl.
 *
 * struct cli_s3_conf says where and who: it is filled from the command line and
 * the usual AWS sources (cli_s3_conf_load). A struct cli_s3 is one connection:
 * it keeps its HTTP connection alive between calls and is used by one thread at a
 * time; `stoker sync` gives each worker its own.
 *
 * Every call returns 0 or -errno, and on failure leaves a message for a person in
 * the connection (cli_s3_error): the HTTP status with S3's error code and message,
 * or libcurl's reason when no answer came. The errno says what kind of failure it
 * was: -ECONNREFUSED / -EHOSTUNREACH / -ETIMEDOUT (no answer), -EACCES (403: bad
 * keys, a wrong signature, access denied), -ENOENT (404), -EAGAIN (412: the object
 * changed, a GET's If-Match failed), -EEXIST (409), -EIO (anything else).
 */
#ifndef STK_CLI_S3CLIENT_H
#define STK_CLI_S3CLIENT_H

#include <stddef.h>
#include <stdint.h>

#define CLI_S3_ETAG 96 /* with quotes */

struct cli_s3_conf {
	char endpoint[512]; /* "http(s)://host[:port]", no trailing '/' */
	char host[300];	    /* host[:port] as the Host header sends it */
	char region[64];
	char access_key[129];
	char secret_key[129];
	char token[4096]; /* AWS_SESSION_TOKEN, "" when none */
};

/*
 * Fills conf: endpoint from endpoint (NULL: $AWS_ENDPOINT_URL, else AWS's
 * https://s3.REGION.amazonaws.com), keys from $AWS_ACCESS_KEY_ID and
 * $AWS_SECRET_ACCESS_KEY (and $AWS_SESSION_TOKEN), else from the profile
 * ($AWS_PROFILE, else "default"; profile overrides both) of the credentials file
 * ($AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials); region from
 * $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1. Returns 0, or -EINVAL with a
 * message in err (a malformed endpoint, no keys found).
 */
int cli_s3_conf_load(const char *endpoint, const char *profile, struct cli_s3_conf *conf, char *err,
		     size_t errlen);

struct cli_s3;

/* Makes a connection (nothing is sent yet). conf is copied. 0 or -ENOMEM. */
int cli_s3_create(const struct cli_s3_conf *conf, struct cli_s3 **out);
void cli_s3_destroy(struct cli_s3 *s);
/* The last failure's message; valid until the next call on s. */
const char *cli_s3_error(const struct cli_s3 *s);

/* An object as a listing or a HEAD gives it. */
struct cli_s3_obj {
	const char *key; /* listing: valid during the callback */
	uint64_t size;
	int64_t mtime; /* Last-Modified, seconds since the epoch */
	char etag[CLI_S3_ETAG];
};

/*
 * Every object whose key starts with prefix, in key order, page by page; fn
 * returning non-zero stops the listing with that value.
 */
typedef int (*cli_s3_list_fn)(void *ctx, const struct cli_s3_obj *o);
int cli_s3_list(struct cli_s3 *s, const char *bucket, const char *prefix, cli_s3_list_fn fn,
		void *ctx);
/* HeadBucket: 0 when the bucket exists and the keys may use it. */
int cli_s3_head_bucket(struct cli_s3 *s, const char *bucket);
int cli_s3_head(struct cli_s3 *s, const char *bucket, const char *key, struct cli_s3_obj *o);
/*
 * Reads len bytes at off into buf (all of them, or -EIO: the object is shorter).
 * With if_match (an ETag with its quotes), a changed object gives -EAGAIN.
 */
int cli_s3_get(struct cli_s3 *s, const char *bucket, const char *key, uint64_t off, size_t len,
	       const char *if_match, void *buf);
/* PutObject of len bytes; the ETag the endpoint answered goes to etag. */
int cli_s3_put(struct cli_s3 *s, const char *bucket, const char *key, const void *buf, size_t len,
	       char etag[CLI_S3_ETAG]);
int cli_s3_delete(struct cli_s3 *s, const char *bucket, const char *key);

/* Multipart upload: create, parts numbered from 1, complete (or abort). */
int cli_s3_mpu_create(struct cli_s3 *s, const char *bucket, const char *key, char *id,
		      size_t idlen);
int cli_s3_mpu_part(struct cli_s3 *s, const char *bucket, const char *key, const char *id,
		    unsigned part, const void *buf, size_t len, char etag[CLI_S3_ETAG]);
int cli_s3_mpu_complete(struct cli_s3 *s, const char *bucket, const char *key, const char *id,
			unsigned nparts, char (*etags)[CLI_S3_ETAG], char etag[CLI_S3_ETAG]);
int cli_s3_mpu_abort(struct cli_s3 *s, const char *bucket, const char *key, const char *id);

#endif
