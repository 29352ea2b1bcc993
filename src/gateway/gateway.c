/*
 * `stoker gateway s3`: serves a cluster's namespace (or a folder of it) over the
 * S3 API until SIGINT or SIGTERM.
 *
 * Everything that can be wrong with the command line is found before the server
 * starts, each with one clear line: the options, the access keys (a file of
 * "ACCESS_KEY SECRET" lines, or STOKER_S3_ACCESS_KEY / STOKER_S3_SECRET_KEY;
 * without keys the gateway refuses to start rather than serve anonymously), the
 * TLS files, the cluster and the root folder. Then it runs in the foreground,
 * logging to stderr; `stoker up --s3` runs this same function.
 */
#include "s3.h"
#include "super.h"

#include "../cli/cli.h"

#include <errno.h>
#include <getopt.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../daemon/daemon.h"
#include "../common/log.h"
#include "../common/metrics.h"
#include "../daemon/metrics_http.h"
#include "../common/util.h"

#define GW_PEM_MAX (1u << 20)
#define GW_KEYS_MAX 4096
#define GW_SWEEP_EVERY_S 3600 /* how often leftovers of dead gateways are looked for */

/* Reads a whole small file (a PEM) into a NUL-terminated malloc'ed string. */
static int read_small_file(const char *path, char **out)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t n = 0;
	int rc = 0;

	if (!f)
		return -errno;
	buf = malloc(GW_PEM_MAX + 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	n = fread(buf, 1, GW_PEM_MAX + 1, f);
	if (ferror(f)) {
		rc = -EIO;
		goto out;
	}
	if (n > GW_PEM_MAX) {
		rc = -EFBIG;
		goto out;
	}
	buf[n] = 0;
	*out = buf;
	buf = NULL;
out:
	free(buf);
	fclose(f);
	return rc;
}

/* Adds a parsed key line; a user's ids become the credentials it acts with. */
static int add_key(struct stk_s3_gw *gw, const struct stk_s3_keyline *line)
{
	struct stk_s3_key *k;

	for (unsigned i = 0; i < gw->nkeys; i++)
		if (strcmp(gw->keys[i].line.id, line->id) == 0)
			return -EEXIST;
	if (gw->nkeys == GW_KEYS_MAX)
		return -E2BIG;
	k = realloc(gw->keys, (gw->nkeys + 1) * sizeof(*k));
	if (!k)
		return -ENOMEM;
	gw->keys = k;
	k = &gw->keys[gw->nkeys++];
	memset(k, 0, sizeof(*k));
	k->line = *line;
	k->cred.uid = line->uid;
	k->cred.gid = line->gid;
	return 0;
}

/*
 * A keys file: one key a line (s3_parse.h, stk_s3_keyline_parse: "ACCESS_KEY
 * SECRET", or a user's with user=, uid=, gid=, buckets= after it); blank lines
 * and '#' comments are skipped.
 */
static int load_keys(const char *cmd, struct stk_s3_gw *gw, const char *path)
{
	char *text = NULL, *p, *line_end;
	struct stk_s3_keyline line;
	unsigned lineno = 0;
	struct stat st;
	int rc;

	rc = read_small_file(path, &text);
	if (rc) {
		cli_err(cmd, "--keys %s: %s", path, stk_strerror(rc));
		return rc;
	}
	if (stat(path, &st) == 0 && (st.st_mode & 077))
		stk_warn("s3: %s is readable by others; secrets belong in a 0600 file", path);
	for (p = text; *p; p = line_end) {
		lineno++;
		line_end = strchr(p, '\n');
		if (line_end)
			*line_end++ = 0;
		else
			line_end = p + strlen(p);
		rc = stk_s3_keyline_parse(p, strlen(p), &line);
		if (rc == 1) {
			rc = 0;
			continue;
		}
		if (rc == 0)
			rc = add_key(gw, &line);
		OPENSSL_cleanse(&line, sizeof(line));
		if (rc) {
			cli_err(cmd,
				"--keys %s:%u: %s: expected \"ACCESS_KEY SECRET [user=NAME "
				"uid=U gid=G buckets=B:rw,B2:ro]\" (printable, keys and secrets at "
				"most 128 bytes)",
				path, lineno,
				rc == -EEXIST ? "this access key is on an earlier line too"
					      : "malformed");
			rc = -EINVAL;
			break;
		}
	}
	OPENSSL_cleanse(text, strlen(text));
	free(text);
	return rc;
}

static void raise_fd_limit(void)
{
	struct rlimit rl;

	/* every client connection is a descriptor: take what the hard limit allows */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* A --domain: a DNS name (letters, digits, '-', '.'), not starting or ending with '.'. */
static int domain_ok(const char *d)
{
	size_t n = strlen(d);

	if (n == 0 || n > 253 || d[0] == '.' || d[n - 1] == '.')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((d[i] >= 'a' && d[i] <= 'z') || (d[i] >= 'A' && d[i] <= 'Z') ||
		      (d[i] >= '0' && d[i] <= '9') || d[i] == '-' || d[i] == '.'))
			return 0;
	return 1;
}

static const struct option g_opts[] = {
    {"cluster", required_argument, NULL, 'c'},
    {"listen", required_argument, NULL, 'l'},
    {"tls-cert", required_argument, NULL, 'C'},
    {"tls-key", required_argument, NULL, 'K'},
    {"keys", required_argument, NULL, 'k'},
    {"root", required_argument, NULL, 'r'},
    {"region", required_argument, NULL, 'R'},
    {"threads", required_argument, NULL, 't'},
    {"max-conns", required_argument, NULL, 'm'},
    {"timeout", required_argument, NULL, 'T'},
    {"io-size", required_argument, NULL, 'i'},
    {"sweep-age", required_argument, NULL, 'a'},
    {"domain", required_argument, NULL, 'D'},
    {"metrics", required_argument, NULL, 'M'},
    {"key-file", required_argument, NULL, 'F'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_uint(const char *cmd, const char *opt, const char *v, uint64_t lo, uint64_t hi,
		      uint64_t *out, int size)
{
	int rc = size ? stk_parse_size(v, out) : stk_parse_u64(v, out);

	if (rc || *out < lo || *out > hi) {
		cli_err(cmd, "--%s %s: expected %s from %llu to %llu", opt, v,
			size ? "a size" : "a number", (unsigned long long)lo,
			(unsigned long long)hi);
		return -EINVAL;
	}
	return 0;
}

static int gateway_s3(int argc, char **argv)
{
	const char *cmd = "gateway";
	struct stk_client_opts copts = {.size = sizeof(copts)};
	const char *cluster = NULL, *listen = "127.0.0.1:9000", *cert_path = NULL;
	const char *key_path = NULL, *keys_path = NULL, *root = "/", *region = "us-east-1";
	const char *metrics = NULL;
	struct stk_metrics_http *mh = NULL;
	uint64_t threads = 16, max_conns = 4096, timeout = 60, io_size = 4u << 20;
	uint64_t sweep_age = 24 * 3600, next_sweep = 0;
	struct stk_s3_server_opts so;
	struct stk_s3_server *srv = NULL;
	struct stk_s3_gw gw;
	struct stat st;
	char *cert = NULL, *key = NULL;
	int c, rc, ret = 1;

	memset(&gw, 0, sizeof(gw));
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", g_opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			cluster = optarg;
			break;
		case 'F':
			copts.key_file = optarg;
			break;
		case 'l':
			listen = optarg;
			break;
		case 'C':
			cert_path = optarg;
			break;
		case 'K':
			key_path = optarg;
			break;
		case 'k':
			keys_path = optarg;
			break;
		case 'r':
			root = optarg;
			break;
		case 'R':
			region = optarg;
			break;
		case 't':
			if (parse_uint(cmd, "threads", optarg, 1, 1024, &threads, 0))
				return 2;
			break;
		case 'm':
			if (parse_uint(cmd, "max-conns", optarg, 1, 1000000, &max_conns, 0))
				return 2;
			break;
		case 'T':
			if (parse_uint(cmd, "timeout", optarg, 1, 86400, &timeout, 0))
				return 2;
			break;
		case 'i':
			if (parse_uint(cmd, "io-size", optarg, 64u << 10, 64u << 20, &io_size, 1))
				return 2;
			break;
		case 'a':
			if (parse_uint(cmd, "sweep-age", optarg, 1, 365 * 86400, &sweep_age, 0))
				return 2;
			break;
		case 'D':
			if (!domain_ok(optarg)) {
				cli_err(cmd,
					"--domain %s: expected a host name such as s3.example.com "
					"(no port, no scheme)",
					optarg);
				return 2;
			}
			if (gw.ndomains == STK_S3_DOMAINS_MAX) {
				cli_err(cmd, "--domain: at most %u", STK_S3_DOMAINS_MAX);
				return 2;
			}
			gw.domains[gw.ndomains++] = optarg;
			break;
		case 'M':
			metrics = optarg;
			break;
		default:
			return cli_usage(cmd);
		}
	}
	if (optind != argc)
		return cli_usage(cmd);
	if ((cert_path != NULL) != (key_path != NULL)) {
		cli_err(cmd, "--tls-cert and --tls-key go together");
		return 2;
	}
	if (strlen(region) >= sizeof(gw.region) || !*region) {
		cli_err(cmd, "--region %s: too long", region);
		return 2;
	}
	if (root[0] != '/' || strlen(root) >= sizeof(gw.root)) {
		cli_err(cmd, "--root %s: expected an absolute path in the cluster", root);
		return 2;
	}
	snprintf(gw.region, sizeof(gw.region), "%s", region);
	gw.io_size = (size_t)io_size;
	gw.skew_s = 15 * 60;
	pthread_mutex_init(&gw.open.lock, NULL);
	pthread_mutex_init(&gw.bcache.lock, NULL);

	if (keys_path) {
		if (load_keys(cmd, &gw, keys_path))
			goto out;
	} else {
		const char *id = getenv("STOKER_S3_ACCESS_KEY"),
			   *sec = getenv("STOKER_S3_SECRET_KEY");
		struct stk_s3_keyline line;
		char both[300];

		snprintf(both, sizeof(both), "%s %s", id ? id : "", sec ? sec : "");
		if (id && sec &&
		    (strchr(id, ' ') || strchr(sec, ' ') ||
		     stk_s3_keyline_parse(both, strlen(both), &line) || add_key(&gw, &line))) {
			cli_err(cmd,
				"STOKER_S3_ACCESS_KEY / STOKER_S3_SECRET_KEY: printable, at most "
				"128 bytes each");
			goto out;
		}
	}
	if (!gw.nkeys) {
		cli_err(cmd,
			"no access keys: give --keys FILE (lines \"ACCESS_KEY SECRET\") or set "
			"STOKER_S3_ACCESS_KEY and STOKER_S3_SECRET_KEY");
		goto out;
	}
	if (cert_path) {
		rc = read_small_file(cert_path, &cert);
		if (rc) {
			cli_err(cmd, "--tls-cert %s: %s", cert_path, stk_strerror(rc));
			goto out;
		}
		rc = read_small_file(key_path, &key);
		if (rc) {
			cli_err(cmd, "--tls-key %s: %s", key_path, stk_strerror(rc));
			goto out;
		}
	}

	stk_daemon_init("s3");
	rc = stk_connect(cluster, &copts, &gw.c);
	if (rc) {
		cli_err(cmd, "cluster %s: %s", cluster ? cluster : "(default)", stk_strerror(rc));
		goto out;
	}
	rc = stk_stat(gw.c, root, &st);
	if (!rc && !S_ISDIR(st.st_mode))
		rc = -ENOTDIR;
	if (rc) {
		cli_err(cmd, "--root %s: %s", root, stk_strerror(rc));
		goto out;
	}
	gw.root_ino = (uint64_t)st.st_ino;
	snprintf(gw.root, sizeof(gw.root), "%s", strcmp(root, "/") ? root : "");

	raise_fd_limit();
	if (metrics) {
		rc = stk_metrics_http_start(metrics, "s3", &mh);
		if (rc) {
			cli_err(cmd, "--metrics %s: %s", metrics, stk_strerror(rc));
			goto out;
		}
	}
	memset(&so, 0, sizeof(so));
	so.listen = listen;
	so.tls_cert_pem = cert;
	so.tls_key_pem = key;
	so.threads = (unsigned)threads;
	so.max_conns = (unsigned)max_conns;
	so.timeout_s = (unsigned)timeout;
	so.metrics = mh != NULL;
	rc = stk_s3_server_start(&gw, &so, &srv);
	if (rc) {
		cli_err(cmd, "--listen %s: %s", listen,
			rc == -EADDRINUSE ? "cannot listen there (in use, or a bad TLS certificate "
					    "or key)"
			: rc == -ENOTSUP  ? "this libmicrohttpd has no TLS"
					  : stk_strerror(rc));
		goto out;
	}
	stk_info("s3 gateway: serving %s%s over %s on port %u (%u threads, %u keys)",
		 stk_cluster_addr(gw.c), root, cert ? "https" : "http", stk_s3_server_port(srv),
		 so.threads, gw.nkeys);
	for (unsigned i = 0; i < gw.ndomains; i++)
		stk_info("s3 gateway: virtual-hosted style for BUCKET.%s", gw.domains[i]);
	if (mh)
		stk_info("s3 gateway: metrics on http://%s/metrics", stk_metrics_http_addr(mh));
	while (!stk_daemon_stopping()) {
		if (stk_now_ns() >= next_sweep) {
			rc = stk_s3_sweep(&gw, (int64_t)sweep_age);
			if (rc > 0)
				stk_info("s3 gateway: removed %d temporary files older than %llu s",
					 rc, (unsigned long long)sweep_age);
			next_sweep = stk_now_ns() + GW_SWEEP_EVERY_S * 1000000000ull;
		}
		stk_daemon_sleep_ms(1000);
	}
	stk_info("s3 gateway: stopping");
	ret = 0;
out:
	stk_s3_server_stop(srv);
	stk_metrics_http_stop(mh);
	if (gw.c)
		stk_disconnect(gw.c);
	if (gw.keys) {
		OPENSSL_cleanse(gw.keys, gw.nkeys * sizeof(*gw.keys));
		free(gw.keys);
	}
	free(cert);
	if (key) {
		OPENSSL_cleanse(key, strlen(key));
		free(key);
	}
	pthread_mutex_destroy(&gw.open.lock);
	pthread_mutex_destroy(&gw.bcache.lock);
	return ret;
}

int cmd_gateway(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "s3") == 0)
		return gateway_s3(argc - 1, argv + 1);
	if (argc >= 2 && strcmp(argv[1], "nfs") == 0)
		return stk_gateway_nfs(argc - 1, argv + 1);
	if (argc >= 2 && strcmp(argv[1], "smb") == 0)
		return stk_gateway_smb(argc - 1, argv + 1);
	if (argc >= 2 && strcmp(argv[1], "--help") != 0 && strcmp(argv[1], "-h") != 0)
		cli_err("gateway", "unknown gateway \"%s\" (there are: s3, nfs, smb)", argv[1]);
	return cli_usage("gateway");
}
