/*
 * The S3 operations: which one a request is, what it does to the store, and the
 * XML it answers.
 *
 * The HTTP layer (s3_http.c) has parsed and authenticated the request before any
 * of this runs, and turns what an operation leaves in the request (status,
 * headers, an XML body or a file to stream) into the response. Operations with
 * a body are split in two: stk_s3_op_begin checks everything that can be checked
 * from the headers (bucket, upload, names, metadata) and makes the temporary file
 * before the client sends a byte, so that a doomed upload is refused before its
 * body; stk_s3_op_finish runs once the body is in and verified.
 *
 * Errors are the S3 error table (s3.h); an operation returns one and may set
 * r->err_msg for a more precise message.
 */
#include "s3.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "../common/log.h"
#include "../common/util.h"

#define XML_HEAD "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
#define STK_S3_NS "http://s3.amazonaws.com/doc/2006-03-01/"
#define STK_S3_OWNER "<Owner><ID>stoker</ID><DisplayName>stoker</DisplayName></Owner>"
#define STK_S3_DEFAULT_TYPE "binary/octet-stream"
#define STK_S3_LIST_MAX 1000
#define STK_S3_XML_LIMIT_COMPLETE (4u << 20)
#define STK_S3_XML_LIMIT_DELETE (2u << 20)

/* ---- tables ---- */

struct err_info {
	const char *code;
	unsigned status;
	const char *msg;
};

static const struct err_info g_errs[] = {[STK_S3_OK] = {"OK", 200, ""},
#define STK_S3_ERR_INFO(name, code, status, msg) [STK_S3_ERR_##name] = {code, status, msg},
					 STK_S3_ERRORS(STK_S3_ERR_INFO)
#undef STK_S3_ERR_INFO
};

const char *stk_s3_err_code(enum stk_s3_err e)
{
	return g_errs[e].code;
}

unsigned stk_s3_err_status(enum stk_s3_err e)
{
	return g_errs[e].status;
}

const char *stk_s3_err_message(enum stk_s3_err e)
{
	return g_errs[e].msg;
}

enum stk_s3_err stk_s3_err_from_errno(int err)
{
	switch (err) {
	case 0:
		return STK_S3_OK;
	case -ENOENT:
		return STK_S3_ERR_NO_SUCH_KEY;
	case -EACCES:
	case -EPERM:
		return STK_S3_ERR_ACCESS_DENIED;
	case -ENOSPC:
		return STK_S3_ERR_STORAGE_FULL;
	case -EDQUOT:
		return STK_S3_ERR_QUOTA_EXCEEDED;
	case -ENAMETOOLONG:
		return STK_S3_ERR_KEY_TOO_LONG;
	case -EISDIR:
	case -ENOTDIR:
	case -EEXIST:
	case -ENOTEMPTY:
		return STK_S3_ERR_KEY_CONFLICT;
	case -EINVAL:
		return STK_S3_ERR_INVALID_ARGUMENT;
	case -EFBIG:
	case -E2BIG:
		return STK_S3_ERR_ENTITY_TOO_LARGE;
	case -ENOMEM:
	case -EAGAIN:
		return STK_S3_ERR_SLOW_DOWN;
	default:
		return STK_S3_ERR_INTERNAL;
	}
}

struct op_info {
	const char *name;
	enum stk_s3_body body;
};

static const struct op_info g_ops[] = {[STK_S3_OP_NONE] = {"-", STK_S3_BODY_NONE},
#define STK_S3_OP_INFO(name, str, body) [STK_S3_OP_##name] = {str, STK_S3_BODY_##body},
				       STK_S3_OPS(STK_S3_OP_INFO)
#undef STK_S3_OP_INFO
};

const char *stk_s3_op_name(enum stk_s3_op op)
{
	return g_ops[op].name;
}

enum stk_s3_body stk_s3_op_body(enum stk_s3_op op)
{
	return g_ops[op].body;
}

/* ---- helpers ---- */

static enum stk_s3_err fail(struct stk_s3_req *r, enum stk_s3_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static enum stk_s3_err fail(struct stk_s3_req *r, enum stk_s3_err e, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->err_msg, sizeof(r->err_msg), fmt, ap);
	va_end(ap);
	return e;
}

/* A storage error while serving: logged, as the client sees only its code. */
static enum stk_s3_err store_err(struct stk_s3_req *r, const char *what, int rc)
{
	enum stk_s3_err e = stk_s3_err_from_errno(rc);

	if (e == STK_S3_ERR_INTERNAL || e == STK_S3_ERR_SLOW_DOWN)
		stk_warn("s3 %s %s: %s: %s", r->reqid, stk_s3_op_name(r->op), what,
			 stk_strerror(rc));
	return e;
}

static void xml_open(struct stk_s3_req *r, const char *root)
{
	stk_s3_buf_fmt(&r->out, XML_HEAD "<%s xmlns=\"" STK_S3_NS "\">", root);
}

/* A key in a listing: URL-encoded when the client asked for encoding-type=url. */
static void put_key(struct stk_s3_buf *b, const char *tag, const char *key, int enc)
{
	if (!enc) {
		stk_s3_buf_elem(b, tag, key);
		return;
	}
	stk_s3_buf_fmt(b, "<%s>", tag);
	stk_s3_buf_uri(b, key, strlen(key), 1);
	stk_s3_buf_fmt(b, "</%s>", tag);
}

static void put_date(struct stk_s3_buf *b, const char *tag, int64_t t)
{
	char d[40];

	stk_s3_iso_date(t, d, sizeof(d));
	stk_s3_buf_elem(b, tag, d);
}

/* Decimal 0..max from a query parameter; def when absent. -1 when malformed. */
static long param_uint(struct stk_s3_req *r, const char *name, long def, long max)
{
	const char *v = stk_s3_param(&r->t, name);
	long n = 0;

	if (!v)
		return def;
	if (!*v || strlen(v) > 9)
		return -1;
	for (const char *c = v; *c; c++) {
		if (*c < '0' || *c > '9')
			return -1;
		n = n * 10 + (*c - '0');
	}
	return n > max ? max : n;
}

static int encoding_url(struct stk_s3_req *r, enum stk_s3_err *e)
{
	const char *v = stk_s3_param(&r->t, "encoding-type");

	*e = STK_S3_OK;
	if (!v || !*v)
		return 0;
	if (strcmp(v, "url") == 0)
		return 1;
	*e = fail(r, STK_S3_ERR_INVALID_ARGUMENT, "Invalid Encoding Method specified in Request");
	return 0;
}

static int same_etag(const char *a, const char *b)
{
	size_t an = strlen(a), bn = strlen(b);

	if (an >= 2 && a[0] == '"' && a[an - 1] == '"') {
		a++;
		an -= 2;
	}
	if (bn >= 2 && b[0] == '"' && b[bn - 1] == '"') {
		b++;
		bn -= 2;
	}
	return an == bn && memcmp(a, b, an) == 0;
}

/* ---- metadata from request headers ---- */

static const char *const g_stored_headers[] = {
    "content-encoding", "content-disposition", "content-language", "cache-control", "expires",
};

struct meta_ctx {
	struct stk_s3_record *rec;
	size_t user;
	enum stk_s3_err err;
};

/* Content-Encoding without the "aws-chunked" the transfer added. */
static void strip_aws_chunked(const char *v, char *out, size_t len)
{
	size_t o = 0;

	out[0] = 0;
	while (*v) {
		const char *s, *e;
		while (*v == ' ' || *v == ',')
			v++;
		s = v;
		while (*v && *v != ',')
			v++;
		e = v;
		while (e > s && e[-1] == ' ')
			e--;
		if (e == s || ((size_t)(e - s) == 11 && strncasecmp(s, "aws-chunked", 11) == 0))
			continue;
		if (o && o + 1 < len)
			out[o++] = ',';
		for (; s < e && o + 1 < len; s++)
			out[o++] = *s;
		out[o] = 0;
	}
}

static void meta_header(void *ctx, const char *name, const char *value)
{
	struct meta_ctx *m = ctx;
	char lname[128], buf[512];
	size_t n = strlen(name);
	int rc;

	if (m->err || n >= sizeof(lname))
		return;
	for (size_t i = 0; i <= n; i++)
		lname[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] + 32 : name[i]);
	if (strncmp(lname, "x-amz-meta-", 11) == 0) {
		m->user += n - 11 + strlen(value);
		if (m->user > STK_S3_USER_META_MAX) {
			m->err = STK_S3_ERR_METADATA_TOO_LARGE;
			return;
		}
		rc = stk_s3_record_add_header(m->rec, lname, value);
		if (rc)
			m->err = rc == -E2BIG ? STK_S3_ERR_METADATA_TOO_LARGE
					      : STK_S3_ERR_INVALID_ARGUMENT;
		return;
	}
	if (strcmp(lname, "content-type") == 0) {
		if (strlen(value) >= sizeof(m->rec->content_type))
			m->err = STK_S3_ERR_INVALID_ARGUMENT;
		else
			snprintf(m->rec->content_type, sizeof(m->rec->content_type), "%s", value);
		return;
	}
	for (size_t i = 0; i < STK_ARRAY_SIZE(g_stored_headers); i++) {
		if (strcmp(lname, g_stored_headers[i]) != 0)
			continue;
		if (i == 0) {
			strip_aws_chunked(value, buf, sizeof(buf));
			value = buf;
			if (!*value)
				return;
		}
		rc = stk_s3_record_add_header(m->rec, lname, value);
		if (rc)
			m->err = STK_S3_ERR_METADATA_TOO_LARGE;
	}
}

/* Fills rec's Content-Type and stored headers from the request. */
static enum stk_s3_err collect_meta(struct stk_s3_req *r, struct stk_s3_record *rec)
{
	struct meta_ctx m = {rec, 0, STK_S3_OK};

	memset(rec, 0, sizeof(*rec));
	stk_s3_req_each_header(r, meta_header, &m);
	if (!rec->content_type[0])
		snprintf(rec->content_type, sizeof(rec->content_type), "%s", STK_S3_DEFAULT_TYPE);
	return m.err;
}

/* Emits the stored "name: value" lines of a record as response headers. */
/*
 * Whether a header name read back from a record is one the gateway stores. The
 * record is an extended attribute that anyone who may write the file through the
 * mount can also write: a forged one must not add Content-Length, Set-Cookie or
 * any other header to a response.
 */
static int stored_name(const char *name)
{
	if (strncmp(name, "x-amz-meta-", 11) == 0)
		return 1;
	for (size_t i = 0; i < STK_ARRAY_SIZE(g_stored_headers); i++)
		if (strcmp(name, g_stored_headers[i]) == 0)
			return 1;
	return 0;
}

static void emit_stored(struct stk_s3_req *r, const struct stk_s3_record *rec, int skip_overridden)
{
	const char *p = rec->headers, *end = rec->headers + rec->headers_len;

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *colon = memchr(p, ':', (size_t)((nl ? nl : end) - p));
		char name[128], value[STK_S3_USER_META_MAX + 1];
		size_t nn, vn;

		if (!nl || !colon)
			break;
		nn = (size_t)(colon - p);
		vn = (size_t)(nl - colon - 1);
		if (vn && colon[1] == ' ') {
			colon++;
			vn--;
		}
		if (nn < sizeof(name) && vn < sizeof(value)) {
			char q[160];
			memcpy(name, p, nn);
			name[nn] = 0;
			memcpy(value, colon + 1, vn);
			value[vn] = 0;
			snprintf(q, sizeof(q), "response-%s", name);
			if (stored_name(name) && (!skip_overridden || !stk_s3_param(&r->t, q)))
				stk_s3_resp_header(r, name, value);
		}
		p = nl + 1;
	}
}

/* ---- routing ---- */

/* Sub-resources S3 has and the gateway does not. */
static const char *const g_unsupported[] = {
    "tagging",
    "policy",
    "cors",
    "lifecycle",
    "website",
    "encryption",
    "replication",
    "logging",
    "notification",
    "accelerate",
    "requestPayment",
    "object-lock",
    "ownershipControls",
    "publicAccessBlock",
    "retention",
    "legal-hold",
    "torrent",
    "restore",
    "select",
    "analytics",
    "inventory",
    "metrics",
    "intelligent-tiering",
    "versions",
    "attributes",
    "policyStatus",
};

enum stk_s3_err stk_s3_op_route(struct stk_s3_req *r)
{
	const struct stk_s3_target *t = &r->t;
	const char *m = r->method;
	int get = !strcmp(m, "GET"), head = !strcmp(m, "HEAD"), put = !strcmp(m, "PUT");
	int del = !strcmp(m, "DELETE"), post = !strcmp(m, "POST");
	int rc;

	for (size_t i = 0; i < STK_ARRAY_SIZE(g_unsupported); i++)
		if (stk_s3_param(t, g_unsupported[i]))
			return fail(r, STK_S3_ERR_NOT_IMPLEMENTED,
				    "The ?%s sub-resource is not implemented.", g_unsupported[i]);
	if (!t->bucket[0]) {
		if (get) {
			r->op = STK_S3_OP_LIST_BUCKETS;
			return STK_S3_OK;
		}
		return STK_S3_ERR_METHOD_NOT_ALLOWED;
	}
	if (!*t->key) {
		if (get && stk_s3_param(t, "location"))
			r->op = STK_S3_OP_GET_LOCATION;
		else if (get && stk_s3_param(t, "versioning"))
			r->op = STK_S3_OP_GET_VERSIONING;
		else if (get && stk_s3_param(t, "acl"))
			r->op = STK_S3_OP_GET_ACL;
		else if (get && stk_s3_param(t, "uploads"))
			r->op = STK_S3_OP_LIST_UPLOADS;
		else if (get && stk_s3_param(t, "list-type")) {
			if (strcmp(stk_s3_param(t, "list-type"), "2") != 0)
				return fail(r, STK_S3_ERR_INVALID_ARGUMENT, "Invalid list-type.");
			r->op = STK_S3_OP_LIST_OBJECTS_V2;
		} else if (get)
			r->op = STK_S3_OP_LIST_OBJECTS;
		else if (head)
			r->op = STK_S3_OP_HEAD_BUCKET;
		else if (put && t->nparams == 0)
			r->op = STK_S3_OP_CREATE_BUCKET;
		else if (del)
			r->op = STK_S3_OP_DELETE_BUCKET;
		else if (post && stk_s3_param(t, "delete"))
			r->op = STK_S3_OP_DELETE_OBJECTS;
		else
			return put ? STK_S3_ERR_NOT_IMPLEMENTED : STK_S3_ERR_METHOD_NOT_ALLOWED;
		if (r->op == STK_S3_OP_CREATE_BUCKET) {
			if (t->bucket_too_long || stk_s3_bucket_check(t->bucket))
				return STK_S3_ERR_INVALID_BUCKET_NAME;
		} else if (t->bucket_too_long || stk_s3_bucket_check(t->bucket)) {
			return STK_S3_ERR_NO_SUCH_BUCKET;
		}
		return STK_S3_OK;
	}
	if (t->bucket_too_long || stk_s3_bucket_check(t->bucket))
		return STK_S3_ERR_NO_SUCH_BUCKET;
	rc = stk_s3_key_check(t->key);
	if (rc == -ENAMETOOLONG && strlen(t->key) > STK_S3_KEY_MAX)
		return STK_S3_ERR_KEY_TOO_LONG;
	if (rc)
		return STK_S3_ERR_INVALID_KEY;
	if (get && stk_s3_param(t, "acl"))
		r->op = STK_S3_OP_GET_ACL;
	else if (get && stk_s3_param(t, "uploadId"))
		r->op = STK_S3_OP_LIST_PARTS;
	else if (get)
		r->op = STK_S3_OP_GET_OBJECT;
	else if (head)
		r->op = STK_S3_OP_HEAD_OBJECT;
	else if (put && stk_s3_param(t, "uploadId") && stk_s3_param(t, "partNumber"))
		r->op = stk_s3_req_header(r, "x-amz-copy-source") ? STK_S3_OP_UPLOAD_PART_COPY
								  : STK_S3_OP_UPLOAD_PART;
	else if (put && stk_s3_param(t, "acl"))
		return STK_S3_ERR_NOT_IMPLEMENTED;
	else if (put && stk_s3_req_header(r, "x-amz-copy-source"))
		r->op = STK_S3_OP_COPY_OBJECT;
	else if (put)
		r->op =
		    t->key[strlen(t->key) - 1] == '/' ? STK_S3_OP_PUT_MARKER : STK_S3_OP_PUT_OBJECT;
	else if (del && stk_s3_param(t, "uploadId"))
		r->op = STK_S3_OP_ABORT_UPLOAD;
	else if (del)
		r->op = STK_S3_OP_DELETE_OBJECT;
	else if (post && stk_s3_param(t, "uploads"))
		r->op = STK_S3_OP_CREATE_UPLOAD;
	else if (post && stk_s3_param(t, "uploadId"))
		r->op = STK_S3_OP_COMPLETE_UPLOAD;
	else
		return STK_S3_ERR_METHOD_NOT_ALLOWED;
	return STK_S3_OK;
}

/* ---- buckets ---- */

static enum stk_s3_err op_list_buckets(struct stk_s3_req *r)
{
	struct stk_s3_bucket_ent *b;
	unsigned n;
	int rc;

	rc = stk_s3_bucket_list(r->gw, &b, &n);
	if (rc)
		return store_err(r, "list buckets", rc);
	xml_open(r, "ListAllMyBucketsResult");
	stk_s3_buf_str(&r->out, STK_S3_OWNER "<Buckets>");
	for (unsigned i = 0; i < n; i++) {
		if (!r->key || stk_s3_keyline_access(&r->key->line, b[i].name) < 1)
			continue; /* another user's */
		stk_s3_buf_str(&r->out, "<Bucket>");
		stk_s3_buf_elem(&r->out, "Name", b[i].name);
		put_date(&r->out, "CreationDate", b[i].ctime);
		stk_s3_buf_str(&r->out, "</Bucket>");
	}
	stk_s3_buf_str(&r->out, "</Buckets></ListAllMyBucketsResult>");
	free(b);
	return STK_S3_OK;
}

static enum stk_s3_err op_create_bucket(struct stk_s3_req *r)
{
	char region[64], loc[80];
	int rc;

	rc = stk_s3_xml_create_bucket(r->xml.p ? r->xml.p : "", r->xml.len, region, sizeof(region));
	if (rc)
		return STK_S3_ERR_MALFORMED_XML;
	rc = stk_s3_bucket_create(r->gw, r->t.bucket);
	if (rc == -EEXIST)
		return STK_S3_ERR_BUCKET_EXISTS;
	if (rc == -EINVAL)
		return STK_S3_ERR_INVALID_BUCKET_NAME;
	if (rc)
		return store_err(r, "create bucket", rc);
	snprintf(loc, sizeof(loc), "/%s", r->t.bucket);
	stk_s3_resp_header(r, "Location", loc);
	return STK_S3_OK;
}

static enum stk_s3_err op_delete_bucket(struct stk_s3_req *r)
{
	int rc = stk_s3_bucket_delete(r->gw, r->t.bucket);

	if (rc == -ENOENT)
		return STK_S3_ERR_NO_SUCH_BUCKET;
	if (rc == -ENOTEMPTY)
		return STK_S3_ERR_BUCKET_NOT_EMPTY;
	if (rc)
		return store_err(r, "delete bucket", rc);
	r->status = 204;
	return STK_S3_OK;
}

static enum stk_s3_err op_get_location(struct stk_s3_req *r)
{
	/* us-east-1 is S3's empty LocationConstraint */
	stk_s3_buf_str(&r->out, XML_HEAD "<LocationConstraint xmlns=\"" STK_S3_NS "\">");
	if (strcmp(r->gw->region, "us-east-1") != 0)
		stk_s3_buf_xml(&r->out, r->gw->region);
	stk_s3_buf_str(&r->out, "</LocationConstraint>");
	return STK_S3_OK;
}

static enum stk_s3_err op_get_acl(struct stk_s3_req *r)
{
	if (*r->t.key) {
		struct stk_s3_obj *o = malloc(sizeof(*o));
		int rc;
		if (!o)
			return STK_S3_ERR_SLOW_DOWN;
		rc = stk_s3_obj_stat(r->gw, &r->bucket, r->t.key, o);
		free(o);
		if (rc == -ENOENT)
			return STK_S3_ERR_NO_SUCH_KEY;
		if (rc)
			return store_err(r, "stat", rc);
	}
	/* Stoker has no ACLs: whoever holds a key has full control. */
	xml_open(r, "AccessControlPolicy");
	stk_s3_buf_str(&r->out,
		       STK_S3_OWNER "<AccessControlList><Grant><Grantee "
				    "xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" "
				    "xsi:type=\"CanonicalUser\"><ID>stoker</ID><DisplayName>stoker"
				    "</DisplayName></Grantee><Permission>FULL_CONTROL</Permission>"
				    "</Grant></AccessControlList></AccessControlPolicy>");
	return STK_S3_OK;
}

/* ---- listing ---- */

static enum stk_s3_err op_list_objects(struct stk_s3_req *r, int v2)
{
	const char *prefix = stk_s3_param(&r->t, "prefix");
	const char *delim = stk_s3_param(&r->t, "delimiter");
	const char *token = v2 ? stk_s3_param(&r->t, "continuation-token") : NULL;
	const char *start = stk_s3_param(&r->t, v2 ? "start-after" : "marker");
	const char *fetch_owner = stk_s3_param(&r->t, "fetch-owner");
	char after[STK_S3_KEY_MAX + 1], tok[2 * STK_S3_KEY_MAX];
	struct stk_s3_list_opts o;
	struct stk_s3_list l;
	struct stk_s3_buf *b = &r->out;
	long max = param_uint(r, "max-keys", STK_S3_LIST_MAX, STK_S3_LIST_MAX);
	unsigned keys = 0;
	enum stk_s3_err e;
	int enc = encoding_url(r, &e), owner = !v2 || (fetch_owner && !strcmp(fetch_owner, "true"));
	int rc;

	if (e)
		return e;
	if (max < 0)
		return fail(r, STK_S3_ERR_INVALID_ARGUMENT,
			    "Provided max-keys not an integer or within "
			    "integer range");
	if (!prefix)
		prefix = "";
	if (delim && !*delim)
		delim = NULL;
	after[0] = 0;
	if (token) {
		rc = stk_s3_base64_decode(token, after, sizeof(after) - 1);
		if (rc <= 0 || memchr(after, 0, (size_t)rc))
			return fail(r, STK_S3_ERR_INVALID_ARGUMENT,
				    "The continuation token provided is incorrect");
		after[rc] = 0;
	} else if (start) {
		snprintf(after, sizeof(after), "%s", start);
	}
	memset(&o, 0, sizeof(o));
	o.prefix = prefix;
	o.delimiter = delim;
	o.after = after;
	o.max = (unsigned)max;
	o.want_etag = 1;
	rc = stk_s3_list(r->gw, &r->bucket, &o, &l);
	if (rc)
		return store_err(r, "list", rc);

	xml_open(r, "ListBucketResult");
	stk_s3_buf_elem(b, "Name", r->t.bucket);
	put_key(b, "Prefix", prefix, enc);
	if (v2) {
		if (token)
			stk_s3_buf_elem(b, "ContinuationToken", token);
		if (start)
			put_key(b, "StartAfter", start, enc);
	} else {
		put_key(b, "Marker", start ? start : "", enc);
	}
	if (delim)
		put_key(b, "Delimiter", delim, enc);
	stk_s3_buf_fmt(b, "<MaxKeys>%ld</MaxKeys>", max);
	if (enc)
		stk_s3_buf_str(b, "<EncodingType>url</EncodingType>");
	stk_s3_buf_fmt(b, "<IsTruncated>%s</IsTruncated>", l.truncated ? "true" : "false");
	if (l.truncated && l.n) {
		const char *last = l.items[l.n - 1].key;
		if (v2) {
			if (stk_s3_base64_encode(last, strlen(last), tok, sizeof(tok)) > 0)
				stk_s3_buf_elem(b, "NextContinuationToken", tok);
		} else {
			put_key(b, "NextMarker", last, enc);
		}
	}
	for (unsigned i = 0; i < l.n; i++) {
		const struct stk_s3_list_item *it = &l.items[i];
		if (it->is_prefix)
			continue;
		keys++;
		stk_s3_buf_str(b, "<Contents>");
		put_key(b, "Key", it->key, enc);
		put_date(b, "LastModified", it->mtime);
		stk_s3_buf_elem(b, "ETag", it->etag);
		stk_s3_buf_fmt(b, "<Size>%llu</Size>", (unsigned long long)it->size);
		if (owner)
			stk_s3_buf_str(b, STK_S3_OWNER);
		stk_s3_buf_str(b, "<StorageClass>STANDARD</StorageClass></Contents>");
	}
	for (unsigned i = 0; i < l.n; i++) {
		if (!l.items[i].is_prefix)
			continue;
		keys++;
		stk_s3_buf_str(b, "<CommonPrefixes>");
		put_key(b, "Prefix", l.items[i].key, enc);
		stk_s3_buf_str(b, "</CommonPrefixes>");
	}
	if (v2)
		stk_s3_buf_fmt(b, "<KeyCount>%u</KeyCount>", keys);
	stk_s3_buf_str(b, "</ListBucketResult>");
	stk_s3_list_free(&l);
	return STK_S3_OK;
}

/* ---- objects: read ---- */

static int64_t header_date(struct stk_s3_req *r, const char *name, int *have)
{
	const char *v = stk_s3_req_header(r, name);
	int64_t t;

	*have = 0;
	if (!v || stk_s3_http_date_parse(v, &t))
		return 0; /* an unparsable date is ignored, as RFC 9110 says */
	*have = 1;
	return t;
}

/*
 * The conditional headers of RFC 9110 13.2.2, in its order; names carries the
 * four header names (GET's, or CopyObject's x-amz-copy-source-if-*). A failed
 * If-None-Match or If-Modified-Since is 304 for GET and 412 for a copy.
 */
static enum stk_s3_err conditions(struct stk_s3_req *r, const char *const names[4],
				  const char *etag, int64_t mtime, int copy)
{
	const char *im = stk_s3_req_header(r, names[0]), *inm = stk_s3_req_header(r, names[1]);
	int have;
	int64_t t;

	if (im) {
		if (!stk_s3_etag_match(im, etag))
			return STK_S3_ERR_PRECONDITION_FAILED;
	} else {
		t = header_date(r, names[2], &have);
		if (have && mtime > t)
			return STK_S3_ERR_PRECONDITION_FAILED;
	}
	if (inm) {
		if (stk_s3_etag_match(inm, etag))
			return copy ? STK_S3_ERR_PRECONDITION_FAILED : STK_S3_ERR_NOT_MODIFIED;
	} else {
		t = header_date(r, names[3], &have);
		if (have && mtime <= t)
			return copy ? STK_S3_ERR_PRECONDITION_FAILED : STK_S3_ERR_NOT_MODIFIED;
	}
	return STK_S3_OK;
}

#define STK_S3_OPEN_TRIES 8 /* a key replaced again and again while we open it */

/*
 * Looks an object up and, when f is not NULL, opens it (a folder marker or an
 * empty object gets no file): retried while the key keeps naming another file
 * by the time the open is registered (see stk_s3_obj_open).
 */
static int stat_open(struct stk_s3_req *r, const struct stk_ll_attr *bucket, const char *key,
		     struct stk_s3_obj *o, stk_file **f)
{
	int rc = -ESTALE;

	for (int i = 0; i < STK_S3_OPEN_TRIES && rc == -ESTALE; i++) {
		rc = stk_s3_obj_stat(r->gw, bucket, key, o);
		if (rc || !f || o->dir_marker || o->attr.size == 0)
			break;
		rc = stk_s3_obj_open(r->gw, o, f);
	}
	return rc == -ESTALE ? -EAGAIN : rc;
}

static const char *const g_get_conds[4] = {"if-match", "if-none-match", "if-unmodified-since",
					   "if-modified-since"};
static const char *const g_copy_conds[4] = {
    "x-amz-copy-source-if-match", "x-amz-copy-source-if-none-match",
    "x-amz-copy-source-if-unmodified-since", "x-amz-copy-source-if-modified-since"};

static const char *const g_overrides[][2] = {
    {"response-content-type", "Content-Type"},
    {"response-content-language", "Content-Language"},
    {"response-expires", "Expires"},
    {"response-cache-control", "Cache-Control"},
    {"response-content-disposition", "Content-Disposition"},
    {"response-content-encoding", "Content-Encoding"},
};

static void object_headers(struct stk_s3_req *r, const struct stk_s3_obj *o)
{
	char d[40];

	stk_s3_http_date(o->attr.mtime_sec, d, sizeof(d));
	stk_s3_resp_header(r, "Last-Modified", d);
	stk_s3_resp_header(r, "ETag", o->etag);
}

static enum stk_s3_err op_get_object(struct stk_s3_req *r, int head)
{
	struct stk_s3_obj *o;
	const char *range = stk_s3_req_header(r, "range"), *ctype;
	uint64_t size, off = 0, len;
	char cr[96];
	int partial = 0, rc;
	enum stk_s3_err e = STK_S3_OK;

	o = malloc(sizeof(*o));
	if (!o)
		return STK_S3_ERR_SLOW_DOWN;
	rc = stat_open(r, &r->bucket, r->t.key, o, head ? NULL : &r->file);
	if (rc) {
		e = rc == -ENOENT ? STK_S3_ERR_NO_SUCH_KEY : store_err(r, "stat", rc);
		goto out;
	}
	e = conditions(r, g_get_conds, o->etag, o->attr.mtime_sec, 0);
	if (e == STK_S3_ERR_NOT_MODIFIED)
		object_headers(r, o);
	if (e)
		goto out;
	size = o->dir_marker ? 0 : o->attr.size;
	len = size;
	if (range) {
		rc = stk_s3_range_parse(range, size, &off, &len);
		if (rc == -ERANGE) {
			snprintf(cr, sizeof(cr), "bytes */%llu", (unsigned long long)size);
			stk_s3_resp_header(r, "Content-Range", cr);
			e = STK_S3_ERR_INVALID_RANGE;
			goto out;
		}
		if (rc == 0) {
			partial = 1;
			snprintf(cr, sizeof(cr), "bytes %llu-%llu/%llu", (unsigned long long)off,
				 (unsigned long long)(off + len - 1), (unsigned long long)size);
		} else {
			off = 0;
			len = size;
		}
	}
	object_headers(r, o);
	ctype = o->dir_marker ? "application/x-directory"
		: o->have_rec ? o->rec.content_type
			      : STK_S3_DEFAULT_TYPE;
	for (size_t i = 0; i < STK_ARRAY_SIZE(g_overrides); i++) {
		const char *v = stk_s3_param(&r->t, g_overrides[i][0]);
		if (v)
			stk_s3_resp_header(r, g_overrides[i][1], v);
	}
	if (!stk_s3_param(&r->t, "response-content-type"))
		stk_s3_resp_header(r, "Content-Type", ctype);
	stk_s3_resp_header(r, "Accept-Ranges", "bytes");
	if (o->have_rec)
		emit_stored(r, &o->rec, 1);
	if (partial) {
		stk_s3_resp_header(r, "Content-Range", cr);
		r->status = 206;
	}
	if (head || len == 0) {
		r->head_len = len;
		stk_s3_obj_release(r->gw, r->file);
		r->file = NULL;
	} else {
		r->file_off = off;
		r->file_len = len;
	}
out:
	free(o);
	return e;
}

/* ---- objects: write ---- */

static enum stk_s3_err commit_err(struct stk_s3_req *r, int rc)
{
	struct stk_ll_attr gone;

	if (rc == -EISDIR)
		return fail(r, STK_S3_ERR_KEY_CONFLICT,
			    "The key names a folder that holds objects.");
	if (rc == -ENOTDIR)
		return fail(r, STK_S3_ERR_KEY_CONFLICT, "A folder of the key is an object.");
	if (rc == -ENOENT && stk_s3_bucket_lookup(r->gw, r->t.bucket, &gone) == -ENOENT)
		return fail(r, STK_S3_ERR_NO_SUCH_BUCKET,
			    "The bucket was deleted while the object was being written.");
	return store_err(r, "commit", rc);
}

static enum stk_s3_err begin_put(struct stk_s3_req *r)
{
	enum stk_s3_err e = collect_meta(r, &r->rec);
	int rc;

	if (e)
		return e;
	rc = stk_s3_tmp_create(r->gw, &r->bucket, 0, &r->tmp);
	if (rc)
		return store_err(r, "create temporary file", rc);
	return STK_S3_OK;
}

static enum stk_s3_err finish_put(struct stk_s3_req *r)
{
	int rc;

	rc = stk_s3_tmp_finish(r->gw, &r->tmp);
	if (rc)
		return rc == -ENOENT ? commit_err(r, rc) : store_err(r, "close", rc);
	snprintf(r->rec.etag, sizeof(r->rec.etag), "\"%s\"", r->body_md5);
	rc = stk_s3_tmp_commit(r->gw, &r->bucket, &r->tmp, r->t.key, &r->rec);
	if (rc)
		return commit_err(r, rc);
	stk_s3_resp_header(r, "ETag", r->rec.etag);
	return STK_S3_OK;
}

static enum stk_s3_err op_put_marker(struct stk_s3_req *r)
{
	const char *cl = stk_s3_req_header(r, "content-length");
	const char *dl = stk_s3_req_header(r, "x-amz-decoded-content-length");
	int rc;

	/* A key ending in '/' is a folder here and cannot hold bytes. */
	if ((dl && strcmp(dl, "0") != 0) || (!dl && cl && strcmp(cl, "0") != 0))
		return fail(r, STK_S3_ERR_KEY_CONFLICT,
			    "A key ending in '/' is a folder and holds no "
			    "data on Stoker.");
	rc = stk_s3_mkdir_marker(r->gw, &r->bucket, r->t.key);
	if (rc)
		return commit_err(r, rc);
	stk_s3_resp_header(r, "ETag", "\"" STK_S3_EMPTY_MD5 "\"");
	return STK_S3_OK;
}

static enum stk_s3_err op_delete_object(struct stk_s3_req *r)
{
	int rc = stk_s3_obj_delete(r->gw, &r->bucket, r->t.key);

	if (rc)
		return store_err(r, "delete", rc);
	r->status = 204;
	return STK_S3_OK;
}

static enum stk_s3_err op_delete_objects(struct stk_s3_req *r)
{
	struct stk_s3_delete_req d;
	struct stk_s3_buf *b = &r->out;
	int rc;

	rc = stk_s3_xml_delete(r->xml.p ? r->xml.p : "", r->xml.len, &d);
	if (rc)
		return STK_S3_ERR_MALFORMED_XML;
	xml_open(r, "DeleteResult");
	for (unsigned i = 0; i < d.n; i++) {
		const char *k = d.keys[i];
		enum stk_s3_err e = STK_S3_OK;

		rc = stk_s3_key_check(k);
		if (rc)
			e = rc == -ENAMETOOLONG ? STK_S3_ERR_KEY_TOO_LONG : STK_S3_ERR_INVALID_KEY;
		else if ((rc = stk_s3_obj_delete(r->gw, &r->bucket, k)) != 0)
			e = store_err(r, "delete", rc);
		if (e) {
			stk_s3_buf_str(b, "<Error>");
			stk_s3_buf_elem(b, "Key", k);
			stk_s3_buf_elem(b, "Code", stk_s3_err_code(e));
			stk_s3_buf_elem(b, "Message", stk_s3_err_message(e));
			stk_s3_buf_str(b, "</Error>");
		} else if (!d.quiet) {
			stk_s3_buf_str(b, "<Deleted>");
			stk_s3_buf_elem(b, "Key", k);
			stk_s3_buf_str(b, "</Deleted>");
		}
	}
	stk_s3_buf_str(b, "</DeleteResult>");
	stk_s3_delete_req_free(&d);
	return STK_S3_OK;
}

/* The bucket and key of x-amz-copy-source ("[/]bucket/key[?versionId=V]"). */
static enum stk_s3_err copy_source(struct stk_s3_req *r, char *bucket, char *key)
{
	const char *v = stk_s3_req_header(r, "x-amz-copy-source"), *q, *slash;
	char buf[3 * STK_S3_KEY_MAX + 128];
	size_t n;

	if (!v)
		return STK_S3_ERR_INVALID_ARGUMENT;
	/* ?versionId= is split off before decoding: an encoded '?' belongs to the key */
	q = strstr(v, "?versionId=");
	n = q ? (size_t)(q - v) : strlen(v);
	if (q && strcmp(q + 11, "null") != 0)
		return fail(r, STK_S3_ERR_NOT_IMPLEMENTED, "Stoker keeps no object versions.");
	switch (stk_s3_uri_decode(v, n, 0, buf, sizeof(buf), &n)) {
	case 0:
		break;
	case -EILSEQ:
		return STK_S3_ERR_NUL_IN_NAME;
	default:
		goto bad;
	}
	v = buf[0] == '/' ? buf + 1 : buf;
	slash = strchr(v, '/');
	if (!slash || (size_t)(slash - v) > STK_S3_BUCKET_MAX)
		goto bad;
	memcpy(bucket, v, (size_t)(slash - v));
	bucket[slash - v] = 0;
	if (strlen(slash + 1) > STK_S3_KEY_MAX)
		return STK_S3_ERR_KEY_TOO_LONG;
	snprintf(key, STK_S3_KEY_MAX + 1, "%s", slash + 1);
	if (stk_s3_key_check(key))
		return STK_S3_ERR_INVALID_KEY;
	return STK_S3_OK;
bad:
	return fail(r, STK_S3_ERR_INVALID_ARGUMENT,
		    "Copy Source must mention the source bucket and key: sourcebucket/sourcekey");
}

/* Looks the copy source up and checks the copy conditions. */
static enum stk_s3_err open_source(struct stk_s3_req *r, struct stk_ll_attr *sb, char *skey,
				   struct stk_s3_obj *so)
{
	char sbucket[STK_S3_BUCKET_MAX + 1];
	enum stk_s3_err e;
	int rc;

	e = copy_source(r, sbucket, skey);
	if (e)
		return e;
	if (!r->key || stk_s3_keyline_access(&r->key->line, sbucket) < 1)
		return STK_S3_ERR_ACCESS_DENIED;
	rc = stk_s3_bucket_lookup(r->gw, sbucket, sb);
	if (rc)
		return rc == -ENOENT ? STK_S3_ERR_NO_SUCH_BUCKET
				     : store_err(r, "source bucket", rc);
	rc = stk_s3_obj_stat(r->gw, sb, skey, so);
	if (rc)
		return rc == -ENOENT ? STK_S3_ERR_NO_SUCH_KEY : store_err(r, "source", rc);
	return conditions(r, g_copy_conds, so->etag, so->attr.mtime_sec, 1);
}

/*
 * Copies [off, off+len) of object skey of bucket sb (as so describes it) into
 * r->tmp; hex MD5 into md5_hex. The source is opened anew (see stat_open).
 */
static enum stk_s3_err copy_into_tmp(struct stk_s3_req *r, const struct stk_ll_attr *sb,
				     const char *skey, struct stk_s3_obj *so, uint64_t off,
				     uint64_t len, char *md5_hex)
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	char *buf = malloc(r->gw->io_size);
	stk_file *f = NULL;
	uint8_t dig[EVP_MAX_MD_SIZE];
	unsigned dl = 0;
	enum stk_s3_err e = STK_S3_OK;
	int rc;

	if (!md || !buf) {
		e = STK_S3_ERR_SLOW_DOWN;
		goto out;
	}
	EVP_DigestInit_ex(md, EVP_md5(), NULL);
	if (len) {
		rc = stat_open(r, sb, skey, so, &f);
		if (!rc && (!f || off + len > so->attr.size))
			rc = -EAGAIN; /* the source changed size under the copy */
		if (!rc)
			rc = stk_s3_copy_data(r->gw, f, off, len, &r->tmp, md, buf);
		stk_s3_obj_release(r->gw, f);
		if (rc) {
			e = store_err(r, "copy", rc);
			goto out;
		}
	}
	rc = stk_s3_tmp_finish(r->gw, &r->tmp);
	if (rc) {
		e = store_err(r, "close", rc);
		goto out;
	}
	EVP_DigestFinal_ex(md, dig, &dl);
	stk_s3_hex(dig, dl, md5_hex);
out:
	EVP_MD_CTX_free(md);
	free(buf);
	return e;
}

static void copy_result(struct stk_s3_req *r, const char *root, const char *etag, int64_t mtime)
{
	xml_open(r, root);
	put_date(&r->out, "LastModified", mtime);
	stk_s3_buf_elem(&r->out, "ETag", etag);
	stk_s3_buf_fmt(&r->out, "</%s>", root);
}

static enum stk_s3_err op_copy_object(struct stk_s3_req *r)
{
	struct stk_s3_obj *so = malloc(sizeof(*so));
	struct stk_ll_attr sb;
	char skey[STK_S3_KEY_MAX + 1], md5[33];
	const char *dir = stk_s3_req_header(r, "x-amz-metadata-directive");
	int replace = 0, rc;
	enum stk_s3_err e;

	if (!so)
		return STK_S3_ERR_SLOW_DOWN;
	if (dir && strcmp(dir, "REPLACE") == 0)
		replace = 1;
	else if (dir && strcmp(dir, "COPY") != 0) {
		e = fail(r, STK_S3_ERR_INVALID_ARGUMENT, "Unknown metadata directive.");
		goto out;
	}
	e = open_source(r, &sb, skey, so);
	if (e)
		goto out;
	if (replace) {
		e = collect_meta(r, &r->rec);
		if (e)
			goto out;
	} else {
		memset(&r->rec, 0, sizeof(r->rec));
		if (so->have_rec) {
			memcpy(r->rec.content_type, so->rec.content_type,
			       sizeof(r->rec.content_type));
			memcpy(r->rec.headers, so->rec.headers, sizeof(r->rec.headers));
			r->rec.headers_len = so->rec.headers_len;
		} else {
			snprintf(r->rec.content_type, sizeof(r->rec.content_type), "%s",
				 STK_S3_DEFAULT_TYPE);
		}
	}
	if (sb.ino == r->bucket.ino && strcmp(skey, r->t.key) == 0) {
		if (!replace) {
			e = fail(r, STK_S3_ERR_INVALID_REQUEST,
				 "This copy request is illegal because it is trying to copy an "
				 "object to itself without changing the object's metadata, storage "
				 "class, website redirect location or encryption attributes.");
			goto out;
		}
		if (so->dir_marker) {
			e = STK_S3_ERR_INVALID_REQUEST;
			goto out;
		}
		/* Same object, new metadata: only the record changes. */
		snprintf(r->rec.etag, sizeof(r->rec.etag), "%s", so->etag);
		rc = stk_s3_obj_put_record(r->gw, &r->bucket, r->t.key, &so->attr, &r->rec);
		if (rc) {
			e = store_err(r, "record", rc);
			goto out;
		}
		copy_result(r, "CopyObjectResult", so->etag, so->attr.mtime_sec);
		goto out;
	}
	if (so->dir_marker || r->t.key[strlen(r->t.key) - 1] == '/') {
		if (!so->dir_marker || r->t.key[strlen(r->t.key) - 1] != '/') {
			e = fail(r, STK_S3_ERR_INVALID_REQUEST,
				 "A folder key (ending in '/') copies only to another folder key.");
			goto out;
		}
		rc = stk_s3_mkdir_marker(r->gw, &r->bucket, r->t.key);
		if (rc) {
			e = commit_err(r, rc);
			goto out;
		}
		copy_result(r, "CopyObjectResult", so->etag, time(NULL));
		goto out;
	}
	rc = stk_s3_tmp_create(r->gw, &r->bucket, 0, &r->tmp);
	if (rc) {
		e = store_err(r, "create temporary file", rc);
		goto out;
	}
	e = copy_into_tmp(r, &sb, skey, so, 0, so->attr.size, md5);
	if (e)
		goto out;
	snprintf(r->rec.etag, sizeof(r->rec.etag), "\"%s\"", md5);
	rc = stk_s3_tmp_commit(r->gw, &r->bucket, &r->tmp, r->t.key, &r->rec);
	if (rc) {
		e = commit_err(r, rc);
		goto out;
	}
	copy_result(r, "CopyObjectResult", r->rec.etag, r->tmp.attr.mtime_sec);
out:
	free(so);
	return e;
}

/* ---- multipart uploads ---- */

static enum stk_s3_err part_number(struct stk_s3_req *r)
{
	long n = param_uint(r, "partNumber", -1, 100000);

	if (n < 1 || n > STK_S3_MAX_PARTS)
		return fail(r, STK_S3_ERR_INVALID_ARGUMENT,
			    "Part number must be an integer between 1 and 10000, inclusive");
	r->part_number = (unsigned)n;
	return STK_S3_OK;
}

/* The upload named by ?uploadId, which must be for this key. */
static enum stk_s3_err open_upload(struct stk_s3_req *r, struct stk_s3_record *info)
{
	const char *id = stk_s3_param(&r->t, "uploadId");
	struct stk_s3_record *tmp = info ? info : malloc(sizeof(*tmp));
	int rc;

	if (!tmp)
		return STK_S3_ERR_SLOW_DOWN;
	rc = stk_s3_mpu_open(r->gw, &r->bucket, id ? id : "", &r->mpu_dir, tmp);
	if (!rc && strcmp(tmp->key, r->t.key) != 0)
		rc = -ENOENT;
	if (!info)
		free(tmp);
	if (rc == -ENOENT)
		return STK_S3_ERR_NO_SUCH_UPLOAD;
	return rc ? store_err(r, "upload", rc) : STK_S3_OK;
}

static enum stk_s3_err op_create_upload(struct stk_s3_req *r)
{
	char id[STK_S3_UPLOAD_ID_LEN + 1];
	enum stk_s3_err e;
	int rc;

	e = collect_meta(r, &r->rec);
	if (e)
		return e;
	rc = stk_s3_mpu_create(r->gw, &r->bucket, r->t.key, &r->rec, id);
	if (rc == -E2BIG)
		return STK_S3_ERR_METADATA_TOO_LARGE;
	if (rc)
		return store_err(r, "create upload", rc);
	xml_open(r, "InitiateMultipartUploadResult");
	stk_s3_buf_elem(&r->out, "Bucket", r->t.bucket);
	stk_s3_buf_elem(&r->out, "Key", r->t.key);
	stk_s3_buf_elem(&r->out, "UploadId", id);
	stk_s3_buf_str(&r->out, "</InitiateMultipartUploadResult>");
	return STK_S3_OK;
}

static enum stk_s3_err begin_part(struct stk_s3_req *r)
{
	enum stk_s3_err e = part_number(r);
	int rc;

	if (!e)
		e = open_upload(r, NULL);
	if (e)
		return e;
	rc = stk_s3_tmp_create(r->gw, &r->bucket, r->mpu_dir.ino, &r->tmp);
	if (rc)
		return store_err(r, "create part", rc);
	return STK_S3_OK;
}

static enum stk_s3_err finish_part(struct stk_s3_req *r)
{
	char etag[40];
	int rc;

	rc = stk_s3_tmp_finish(r->gw, &r->tmp);
	if (!rc)
		rc = stk_s3_mpu_put_part(r->gw, &r->mpu_dir, &r->tmp, r->part_number, r->body_md5);
	if (rc == -ENOENT)
		return STK_S3_ERR_NO_SUCH_UPLOAD; /* aborted meanwhile */
	if (rc)
		return store_err(r, "part", rc);
	snprintf(etag, sizeof(etag), "\"%s\"", r->body_md5);
	stk_s3_resp_header(r, "ETag", etag);
	return STK_S3_OK;
}

static enum stk_s3_err op_upload_part_copy(struct stk_s3_req *r)
{
	struct stk_s3_obj *so = malloc(sizeof(*so));
	struct stk_ll_attr sb;
	char skey[STK_S3_KEY_MAX + 1], md5[33], etag[40];
	const char *range = stk_s3_req_header(r, "x-amz-copy-source-range");
	uint64_t off = 0, len;
	enum stk_s3_err e;
	int rc;

	if (!so)
		return STK_S3_ERR_SLOW_DOWN;
	e = part_number(r);
	if (!e)
		e = open_upload(r, NULL);
	if (!e)
		e = open_source(r, &sb, skey, so);
	if (e)
		goto out;
	if (so->dir_marker) {
		e = STK_S3_ERR_NO_SUCH_KEY;
		goto out;
	}
	len = so->attr.size;
	if (range) {
		rc = stk_s3_copy_range_parse(range, so->attr.size, &off, &len);
		if (rc == -ERANGE) {
			/* not clamped as a GET's Range is: S3 refuses such a part */
			e = fail(r, STK_S3_ERR_INVALID_ARGUMENT,
				 "Range specified is not valid for source object of size: %llu",
				 (unsigned long long)so->attr.size);
			goto out;
		}
		if (rc) {
			e = fail(r, STK_S3_ERR_INVALID_ARGUMENT,
				 "The x-amz-copy-source-range value must be of the form "
				 "bytes=first-last where first and last are the zero-based offsets "
				 "of the first and last bytes to copy");
			goto out;
		}
	}
	rc = stk_s3_tmp_create(r->gw, &r->bucket, r->mpu_dir.ino, &r->tmp);
	if (rc) {
		e = store_err(r, "create part", rc);
		goto out;
	}
	e = copy_into_tmp(r, &sb, skey, so, off, len, md5);
	if (e)
		goto out;
	rc = stk_s3_mpu_put_part(r->gw, &r->mpu_dir, &r->tmp, r->part_number, md5);
	if (rc) {
		e = rc == -ENOENT ? STK_S3_ERR_NO_SUCH_UPLOAD : store_err(r, "part", rc);
		goto out;
	}
	snprintf(etag, sizeof(etag), "\"%s\"", md5);
	copy_result(r, "CopyPartResult", etag, r->tmp.attr.mtime_sec);
out:
	free(so);
	return e;
}

static int hex_to_bytes(const char *h, uint8_t *out, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int v = 0;
		for (int j = 0; j < 2; j++) {
			char c = h[2 * i + j];
			v <<= 4;
			if (c >= '0' && c <= '9')
				v |= c - '0';
			else if (c >= 'a' && c <= 'f')
				v |= c - 'a' + 10;
			else
				return -EINVAL;
		}
		out[i] = (uint8_t)v;
	}
	return h[2 * n] == 0 ? 0 : -EINVAL;
}

static enum stk_s3_err op_complete(struct stk_s3_req *r)
{
	struct stk_s3_part_ref *refs = NULL;
	struct stk_s3_part *parts = NULL;
	struct stk_s3_record *info = malloc(sizeof(*info));
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	char *buf = malloc(r->gw->io_size), hex[33], loc[STK_S3_KEY_MAX + 128];
	const char *host = stk_s3_req_header(r, "host");
	unsigned n = 0;
	uint8_t dig[EVP_MAX_MD_SIZE];
	unsigned dl = 0;
	enum stk_s3_err e = STK_S3_OK;
	int rc;

	if (!info || !md || !buf) {
		e = STK_S3_ERR_SLOW_DOWN;
		goto out;
	}
	e = open_upload(r, info);
	if (e)
		goto out;
	rc = stk_s3_xml_complete(r->xml.p ? r->xml.p : "", r->xml.len, &refs, &n);
	if (rc) {
		e = STK_S3_ERR_MALFORMED_XML;
		goto out;
	}
	parts = calloc(n, sizeof(*parts));
	if (!parts) {
		e = STK_S3_ERR_SLOW_DOWN;
		goto out;
	}
	EVP_DigestInit_ex(md, EVP_md5(), NULL);
	for (unsigned i = 0; i < n; i++) {
		uint8_t pm[16];
		const char *et;

		if (i && refs[i].number <= refs[i - 1].number) {
			e = STK_S3_ERR_INVALID_PART_ORDER;
			goto out;
		}
		rc = stk_s3_mpu_part(r->gw, &r->mpu_dir, refs[i].number, &parts[i]);
		if (rc == -ENOENT || (!rc && !same_etag(parts[i].etag, refs[i].etag))) {
			e = fail(r, STK_S3_ERR_INVALID_PART,
				 "Part %u could not be found or its ETag "
				 "does not match.",
				 refs[i].number);
			goto out;
		}
		if (rc) {
			e = store_err(r, "part", rc);
			goto out;
		}
		/* the part ETag, unquoted, is the hex MD5 the final ETag is made of */
		et = parts[i].etag + 1;
		memcpy(hex, et, 32);
		hex[32] = 0;
		if (hex_to_bytes(hex, pm, 16)) {
			e = STK_S3_ERR_INVALID_PART;
			goto out;
		}
		EVP_DigestUpdate(md, pm, 16);
	}
	for (unsigned i = 0; i + 1 < n; i++)
		if (parts[i].size < STK_S3_MIN_PART_SIZE) {
			e = fail(r, STK_S3_ERR_ENTITY_TOO_SMALL,
				 "Part %u is %llu bytes; every part but the last must be at least "
				 "5 MiB.",
				 parts[i].number, (unsigned long long)parts[i].size);
			goto out;
		}
	rc = stk_s3_tmp_create(r->gw, &r->bucket, 0, &r->tmp);
	if (rc) {
		e = store_err(r, "create temporary file", rc);
		goto out;
	}
	/* No server-side concatenation in Stoker yet: the parts' bytes are copied. */
	for (unsigned i = 0; i < n; i++) {
		stk_file *f = NULL;
		struct stk_s3_obj *po = malloc(sizeof(*po));
		if (!po) {
			e = STK_S3_ERR_SLOW_DOWN;
			goto out;
		}
		memset(po, 0, sizeof(*po));
		po->attr = parts[i].attr;
		po->parent_ino = parts[i].dir_ino;
		snprintf(po->name, sizeof(po->name), "p%05u", parts[i].number);
		rc = parts[i].size ? stk_s3_obj_open(r->gw, po, &f) : 0;
		free(po);
		if (rc) {
			e = rc == -ENOENT || rc == -ESTALE
				? fail(r, STK_S3_ERR_INVALID_PART,
				       "Part %u changed while completing.", parts[i].number)
				: store_err(r, "open part", rc);
			goto out;
		}
		rc = f ? stk_s3_copy_data(r->gw, f, 0, parts[i].size, &r->tmp, NULL, buf) : 0;
		stk_s3_obj_release(r->gw, f);
		if (rc) {
			e = store_err(r, "copy part", rc);
			goto out;
		}
	}
	rc = stk_s3_tmp_finish(r->gw, &r->tmp);
	if (rc) {
		e = store_err(r, "close", rc);
		goto out;
	}
	EVP_DigestFinal_ex(md, dig, &dl);
	stk_s3_hex(dig, dl, hex);
	r->rec = *info;
	r->rec.key[0] = 0;
	snprintf(r->rec.etag, sizeof(r->rec.etag), "\"%s-%u\"", hex, n);
	rc = stk_s3_tmp_commit(r->gw, &r->bucket, &r->tmp, r->t.key, &r->rec);
	if (rc) {
		e = commit_err(r, rc);
		goto out;
	}
	rc = stk_s3_mpu_remove(r->gw, &r->bucket, stk_s3_param(&r->t, "uploadId"));
	if (rc)
		stk_warn("s3 %s: removing upload %s: %s", r->reqid, stk_s3_param(&r->t, "uploadId"),
			 stk_strerror(rc));
	xml_open(r, "CompleteMultipartUploadResult");
	snprintf(loc, sizeof(loc), "http://%s/%s/%s", host ? host : "localhost", r->t.bucket,
		 r->t.key);
	stk_s3_buf_elem(&r->out, "Location", loc);
	stk_s3_buf_elem(&r->out, "Bucket", r->t.bucket);
	stk_s3_buf_elem(&r->out, "Key", r->t.key);
	stk_s3_buf_elem(&r->out, "ETag", r->rec.etag);
	stk_s3_buf_str(&r->out, "</CompleteMultipartUploadResult>");
out:
	free(refs);
	free(parts);
	free(info);
	free(buf);
	EVP_MD_CTX_free(md);
	return e;
}

static enum stk_s3_err op_abort(struct stk_s3_req *r)
{
	enum stk_s3_err e = open_upload(r, NULL);
	int rc;

	if (e)
		return e;
	rc = stk_s3_mpu_remove(r->gw, &r->bucket, stk_s3_param(&r->t, "uploadId"));
	if (rc && rc != -ENOENT)
		return store_err(r, "abort", rc);
	r->status = 204;
	return STK_S3_OK;
}

static enum stk_s3_err op_list_parts(struct stk_s3_req *r)
{
	struct stk_s3_part *p = NULL;
	struct stk_s3_buf *b = &r->out;
	long max = param_uint(r, "max-parts", 1000, 1000);
	long after = param_uint(r, "part-number-marker", 0, STK_S3_MAX_PARTS);
	unsigned n = 0;
	int truncated = 0, rc;
	enum stk_s3_err e;

	if (max < 0 || after < 0)
		return fail(r, STK_S3_ERR_INVALID_ARGUMENT,
			    "Invalid max-parts or part-number-marker.");
	e = open_upload(r, NULL);
	if (e)
		return e;
	rc = stk_s3_mpu_parts(r->gw, &r->mpu_dir, (unsigned)after, (unsigned)max, &p, &n,
			      &truncated);
	if (rc)
		return store_err(r, "list parts", rc);
	xml_open(r, "ListPartsResult");
	stk_s3_buf_elem(b, "Bucket", r->t.bucket);
	stk_s3_buf_elem(b, "Key", r->t.key);
	stk_s3_buf_elem(b, "UploadId", stk_s3_param(&r->t, "uploadId"));
	stk_s3_buf_str(
	    b,
	    "<Initiator><ID>stoker</ID><DisplayName>stoker</DisplayName></Initiator>" STK_S3_OWNER
	    "<StorageClass>STANDARD</StorageClass>");
	stk_s3_buf_fmt(b, "<PartNumberMarker>%ld</PartNumberMarker>", after);
	if (n)
		stk_s3_buf_fmt(b, "<NextPartNumberMarker>%u</NextPartNumberMarker>",
			       p[n - 1].number);
	stk_s3_buf_fmt(b, "<MaxParts>%ld</MaxParts><IsTruncated>%s</IsTruncated>", max,
		       truncated ? "true" : "false");
	for (unsigned i = 0; i < n; i++) {
		stk_s3_buf_fmt(b, "<Part><PartNumber>%u</PartNumber>", p[i].number);
		put_date(b, "LastModified", p[i].mtime);
		stk_s3_buf_elem(b, "ETag", p[i].etag);
		stk_s3_buf_fmt(b, "<Size>%llu</Size></Part>", (unsigned long long)p[i].size);
	}
	stk_s3_buf_str(b, "</ListPartsResult>");
	free(p);
	return STK_S3_OK;
}

static enum stk_s3_err op_list_uploads(struct stk_s3_req *r)
{
	const char *prefix = stk_s3_param(&r->t, "prefix");
	const char *delim = stk_s3_param(&r->t, "delimiter");
	const char *km = stk_s3_param(&r->t, "key-marker");
	const char *um = stk_s3_param(&r->t, "upload-id-marker");
	long max = param_uint(r, "max-uploads", 1000, 1000);
	struct stk_s3_buf *b = &r->out;
	struct stk_s3_upload_ent *u;
	unsigned n, shown = 0, last = 0, um_at = 0;
	int truncated = 0, rc, enc, have_um = 0;
	char last_cp[STK_S3_KEY_MAX + 1] = "";
	enum stk_s3_err e;

	enc = encoding_url(r, &e);
	if (e)
		return e;
	if (max < 0)
		return fail(r, STK_S3_ERR_INVALID_ARGUMENT, "Invalid max-uploads.");
	if (!prefix)
		prefix = "";
	if (delim && !*delim)
		delim = NULL;
	if (!km)
		km = "";
	rc = stk_s3_mpu_list(r->gw, &r->bucket, &u, &n);
	if (rc)
		return store_err(r, "list uploads", rc);
	/* Uploads of one key are listed by initiation time, not by ID: the marker
	 * upload is found by position, so that the next page starts right after it.
	 * An ID that is not there (aborted since) falls back to S3's rule: the key's
	 * uploads with greater IDs. */
	for (unsigned i = 0; um && *um && *km && i < n; i++)
		if (!strcmp(u[i].key, km) && !strcmp(u[i].id, um)) {
			um_at = i;
			have_um = 1;
			break;
		}
	xml_open(r, "ListMultipartUploadsResult");
	stk_s3_buf_elem(b, "Bucket", r->t.bucket);
	put_key(b, "KeyMarker", km, enc);
	stk_s3_buf_elem(b, "UploadIdMarker", um ? um : "");
	put_key(b, "Prefix", prefix, enc);
	if (delim)
		put_key(b, "Delimiter", delim, enc);
	stk_s3_buf_fmt(b, "<MaxUploads>%ld</MaxUploads>", max);
	if (enc)
		stk_s3_buf_str(b, "<EncodingType>url</EncodingType>");
	{
		struct stk_s3_buf items;
		stk_s3_buf_init(&items, 64u << 20);
		for (unsigned i = 0; i < n; i++) {
			int c = strcmp(u[i].key, km);
			const char *d;
			if (strncmp(u[i].key, prefix, strlen(prefix)) != 0)
				continue;
			if (c < 0)
				continue;
			if (c == 0 &&
			    (!um || !*um || (have_um ? i <= um_at : strcmp(u[i].id, um) <= 0)))
				continue;
			d = delim ? strstr(u[i].key + strlen(prefix), delim) : NULL;
			if (d) {
				size_t cl = (size_t)(d - u[i].key) + strlen(delim);
				int cm = strncmp(u[i].key, km, cl);
				if (strlen(last_cp) == cl && !strncmp(last_cp, u[i].key, cl))
					continue;
				/* a common prefix up to the key marker was on an earlier page
				 * (the marker is a key inside it, or the prefix itself) */
				if (*km && cm <= 0)
					continue;
				if (shown == (unsigned)max) {
					truncated = 1;
					break;
				}
				memcpy(last_cp, u[i].key, cl);
				last_cp[cl] = 0;
				stk_s3_buf_str(&items, "<CommonPrefixes>");
				put_key(&items, "Prefix", last_cp, enc);
				stk_s3_buf_str(&items, "</CommonPrefixes>");
				shown++;
				last = i;
				continue;
			}
			if (shown == (unsigned)max) {
				truncated = 1;
				break;
			}
			stk_s3_buf_str(&items, "<Upload>");
			put_key(&items, "Key", u[i].key, enc);
			stk_s3_buf_elem(&items, "UploadId", u[i].id);
			stk_s3_buf_str(&items, "<Initiator><ID>stoker</ID><DisplayName>stoker"
					       "</DisplayName></Initiator>" STK_S3_OWNER
					       "<StorageClass>STANDARD</StorageClass>");
			put_date(&items, "Initiated", u[i].initiated);
			stk_s3_buf_str(&items, "</Upload>");
			shown++;
			last = i;
		}
		stk_s3_buf_fmt(b, "<IsTruncated>%s</IsTruncated>", truncated ? "true" : "false");
		if (truncated && shown) {
			put_key(b, "NextKeyMarker", u[last].key, enc);
			stk_s3_buf_elem(b, "NextUploadIdMarker", u[last].id);
		}
		if (items.len)
			stk_s3_buf_add(b, items.p, items.len);
		if (items.err)
			b->err = items.err;
		stk_s3_buf_free(&items);
	}
	stk_s3_buf_str(b, "</ListMultipartUploadsResult>");
	stk_s3_mpu_list_free(u, n);
	return STK_S3_OK;
}

/* ---- dispatch ---- */

static enum stk_s3_err run(struct stk_s3_req *r)
{
	switch (r->op) {
	case STK_S3_OP_LIST_BUCKETS:
		return op_list_buckets(r);
	case STK_S3_OP_DELETE_BUCKET:
		return op_delete_bucket(r);
	case STK_S3_OP_HEAD_BUCKET:
		stk_s3_resp_header(r, "x-amz-bucket-region", r->gw->region);
		return STK_S3_OK;
	case STK_S3_OP_GET_LOCATION:
		return op_get_location(r);
	case STK_S3_OP_GET_VERSIONING:
		stk_s3_buf_str(&r->out,
			       XML_HEAD "<VersioningConfiguration xmlns=\"" STK_S3_NS "\"/>");
		return STK_S3_OK;
	case STK_S3_OP_GET_ACL:
		return op_get_acl(r);
	case STK_S3_OP_LIST_OBJECTS:
		return op_list_objects(r, 0);
	case STK_S3_OP_LIST_OBJECTS_V2:
		return op_list_objects(r, 1);
	case STK_S3_OP_LIST_UPLOADS:
		return op_list_uploads(r);
	case STK_S3_OP_PUT_MARKER:
		return op_put_marker(r);
	case STK_S3_OP_COPY_OBJECT:
		return op_copy_object(r);
	case STK_S3_OP_GET_OBJECT:
		return op_get_object(r, 0);
	case STK_S3_OP_HEAD_OBJECT:
		return op_get_object(r, 1);
	case STK_S3_OP_DELETE_OBJECT:
		return op_delete_object(r);
	case STK_S3_OP_CREATE_UPLOAD:
		return op_create_upload(r);
	case STK_S3_OP_UPLOAD_PART_COPY:
		return op_upload_part_copy(r);
	case STK_S3_OP_ABORT_UPLOAD:
		return op_abort(r);
	case STK_S3_OP_LIST_PARTS:
		return op_list_parts(r);
	default:
		return STK_S3_ERR_INTERNAL;
	}
}

/*
 * Whether the request's key may run its operation (docs/s3.md, "Users"): reads
 * of a bucket and its objects need read access to it, anything that changes one
 * (making or removing the bucket included) read and write. ListBuckets lists what
 * the key may read (op_list_buckets).
 */
static enum stk_s3_err authorize(struct stk_s3_req *r)
{
	int need;

	if (!r->key)
		return STK_S3_ERR_ACCESS_DENIED;
	switch (r->op) {
	case STK_S3_OP_LIST_BUCKETS:
		return STK_S3_OK;
	case STK_S3_OP_HEAD_BUCKET:
	case STK_S3_OP_GET_LOCATION:
	case STK_S3_OP_GET_VERSIONING:
	case STK_S3_OP_GET_ACL:
	case STK_S3_OP_LIST_OBJECTS:
	case STK_S3_OP_LIST_OBJECTS_V2:
	case STK_S3_OP_LIST_UPLOADS:
	case STK_S3_OP_GET_OBJECT:
	case STK_S3_OP_HEAD_OBJECT:
	case STK_S3_OP_LIST_PARTS:
		need = 1;
		break;
	default:
		need = 2;
		break;
	}
	if (stk_s3_keyline_access(&r->key->line, r->t.bucket) >= need)
		return STK_S3_OK;
	stk_info("s3 %s: %s on bucket %s refused to user %s", r->reqid, stk_s3_op_name(r->op),
		 r->t.bucket, r->key->line.user);
	return STK_S3_ERR_ACCESS_DENIED;
}

enum stk_s3_err stk_s3_op_begin(struct stk_s3_req *r)
{
	enum stk_s3_err e = authorize(r);
	int rc;

	if (e)
		return e;

	if (r->op != STK_S3_OP_LIST_BUCKETS && r->op != STK_S3_OP_CREATE_BUCKET) {
		rc = stk_s3_bucket_lookup(r->gw, r->t.bucket, &r->bucket);
		if (rc)
			return rc == -ENOENT ? STK_S3_ERR_NO_SUCH_BUCKET
					     : store_err(r, "bucket", rc);
	}
	switch (r->op) {
	case STK_S3_OP_PUT_OBJECT:
		return begin_put(r);
	case STK_S3_OP_UPLOAD_PART:
		return begin_part(r);
	case STK_S3_OP_COMPLETE_UPLOAD:
		stk_s3_buf_init(&r->xml, STK_S3_XML_LIMIT_COMPLETE);
		return open_upload(r, NULL);
	case STK_S3_OP_CREATE_BUCKET:
		stk_s3_buf_init(&r->xml, 64u << 10);
		return STK_S3_OK;
	case STK_S3_OP_DELETE_OBJECTS:
		stk_s3_buf_init(&r->xml, STK_S3_XML_LIMIT_DELETE);
		return STK_S3_OK;
	default:
		break;
	}
	return run(r);
}

enum stk_s3_err stk_s3_op_finish(struct stk_s3_req *r)
{
	switch (r->op) {
	case STK_S3_OP_PUT_OBJECT:
		return finish_put(r);
	case STK_S3_OP_UPLOAD_PART:
		return finish_part(r);
	case STK_S3_OP_COMPLETE_UPLOAD:
		return op_complete(r);
	case STK_S3_OP_CREATE_BUCKET:
		return op_create_bucket(r);
	case STK_S3_OP_DELETE_OBJECTS:
		return op_delete_objects(r);
	default:
		return STK_S3_ERR_INTERNAL;
	}
}
