/*
 * stoker qos: QoS limits per tenant (docs/qos.md).
 *
 *   qos set TENANT [--read-bw SIZE/s] [--write-bw SIZE/s] [--iops N] [--class C]
 *   qos set @default|@checkpoint [--read-bw ...] [--write-bw ...] [--iops N]
 *   qos ls [--json]
 *   qos rm TENANT
 *
 * each with [--cluster ADDR]. A tenant is a client key's name; its limits hold at
 * each storage node; --class caps the class its requests count as. "@default"
 * and "@checkpoint" are a class's own limits, shared by all tenants, that hold
 * while a higher class is served. SIZE takes binary units (100M is 100 MiB),
 * "/s" optional; N decimal ones (10k); "none" or 0 is no limit. `set` replaces
 * the tenant's limits (a limit not given is none). Errors print "stoker qos:
 * reason" and exit 1; a usage error exits 2.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

/* "100M", "100M/s", "1.5G"? no: integers with a binary unit; "none" or "0": 0. */
static int parse_rate(const char *s, uint64_t *out)
{
	char buf[32];
	size_t n = strlen(s);

	if (strcmp(s, "none") == 0) {
		*out = 0;
		return 0;
	}
	if (n >= 2 && strcmp(s + n - 2, "/s") == 0)
		n -= 2;
	if (n == 0 || n >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, n);
	buf[n] = 0;
	return stk_parse_size(buf, out);
}

/* A count with decimal units: "500", "10k", "2M"; "none": 0. */
static int parse_iops(const char *s, uint32_t *out)
{
	uint64_t v, mul = 1;
	char num[32];
	size_t n = strlen(s);

	if (strcmp(s, "none") == 0) {
		*out = 0;
		return 0;
	}
	if (n == 0 || n >= sizeof(num))
		return -EINVAL;
	memcpy(num, s, n + 1);
	if (tolower((unsigned char)num[n - 1]) == 'k')
		mul = 1000;
	else if (tolower((unsigned char)num[n - 1]) == 'm')
		mul = 1000000;
	if (mul != 1)
		num[--n] = 0;
	if (stk_parse_u64(num, &v))
		return -EINVAL;
	if (v > UINT32_MAX / mul)
		return -ERANGE;
	*out = (uint32_t)(v * mul);
	return 0;
}

static void rate_str(uint64_t v, char *buf, size_t len)
{
	char sz[32];

	if (!v)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%s/s", stk_format_size(v, sz, sizeof(sz)));
}

static int qos_ls(const char *cluster, int json)
{
	struct stk_qos_limits *l = NULL;
	uint32_t n = 0;
	int rc = stk_cluster_qos_list(cluster, &l, &n);

	if (rc) {
		cli_err("qos", "ls: %s", stk_strerror(rc));
		return 1;
	}
	if (json) {
		printf("[");
		for (uint32_t i = 0; i < n; i++) {
			const char *cls = stk_qos_class_name(l[i].max_class);

			/* names are [A-Za-z0-9._@-]: nothing to escape */
			printf("%s{\"tenant\": \"%s\", \"read_bw\": %llu, \"write_bw\": %llu, "
			       "\"iops\": %u, \"class\": ",
			       i ? ", " : "", l[i].tenant, (unsigned long long)l[i].read_bw,
			       (unsigned long long)l[i].write_bw, l[i].iops);
			printf(cls ? "\"%s\"}" : "null}", cls);
		}
		printf("]\n");
	} else {
		printf("%-20s %12s %12s %10s  %s\n", "TENANT", "READ", "WRITE", "IOPS", "CLASS");
		for (uint32_t i = 0; i < n; i++) {
			char rb[40], wb[40], io[16];

			rate_str(l[i].read_bw, rb, sizeof(rb));
			rate_str(l[i].write_bw, wb, sizeof(wb));
			if (l[i].iops)
				snprintf(io, sizeof(io), "%u", l[i].iops);
			else
				snprintf(io, sizeof(io), "-");
			printf("%-20s %12s %12s %10s  %s\n", l[i].tenant, rb, wb, io,
			       stk_qos_class_name(l[i].max_class)
				   ? stk_qos_class_name(l[i].max_class)
				   : "-");
		}
	}
	free(l);
	return 0;
}

int cmd_qos(int argc, char **argv)
{
	struct stk_qos_limits q;
	const char *cluster = NULL, *tenant = NULL, *verb = argc > 1 ? argv[1] : "";
	int json = 0, given = 0, rc;

	memset(&q, 0, sizeof(q));
	q.max_class = STK_QOS_CLASS_NONE;
	if (strcmp(verb, "set") && strcmp(verb, "ls") && strcmp(verb, "rm"))
		return cli_usage("qos");
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];

		if (strcmp(a, "--cluster") == 0 && i + 1 < argc) {
			cluster = argv[++i];
		} else if (strcmp(a, "--json") == 0 && strcmp(verb, "ls") == 0) {
			json = 1;
		} else if ((strcmp(a, "--read-bw") == 0 || strcmp(a, "--write-bw") == 0) &&
			   i + 1 < argc && strcmp(verb, "set") == 0) {
			uint64_t *dst = a[2] == 'r' ? &q.read_bw : &q.write_bw;

			if (parse_rate(argv[++i], dst)) {
				cli_err("qos", "%s: not a rate: '%s' (examples: 100M/s, 1G, none)",
					a, argv[i]);
				return 1;
			}
			given = 1;
		} else if (strcmp(a, "--iops") == 0 && i + 1 < argc && strcmp(verb, "set") == 0) {
			rc = parse_iops(argv[++i], &q.iops);
			if (rc) {
				cli_err("qos", "--iops: %s: '%s' (examples: 500, 10k, none)",
					rc == -ERANGE ? "too large" : "not a count", argv[i]);
				return 1;
			}
			given = 1;
		} else if (strcmp(a, "--class") == 0 && i + 1 < argc && strcmp(verb, "set") == 0) {
			rc = stk_qos_class_parse(argv[++i]);
			if (rc < 0) {
				cli_err("qos",
					"--class: '%s' is not a class (training-read, default, "
					"checkpoint)",
					argv[i]);
				return 1;
			}
			q.max_class = (uint8_t)rc;
			given = 1;
		} else if (!tenant && a[0] != '-' && strcmp(verb, "ls") != 0) {
			tenant = a;
		} else {
			cli_err("qos", "%s: unexpected argument '%s'", verb, a);
			return cli_usage("qos");
		}
	}
	if (strcmp(verb, "ls") == 0)
		return qos_ls(cluster, json);
	if (!tenant) {
		cli_err("qos", "%s needs a TENANT (a client key's name)", verb);
		return cli_usage("qos");
	}
	if (strlen(tenant) > STK_IDENT_NAME_MAX) {
		cli_err("qos", "%s: a tenant name has at most %u characters", tenant,
			STK_IDENT_NAME_MAX);
		return 1;
	}
	if (strcmp(verb, "rm") == 0) {
		rc = stk_cluster_qos_rm(cluster, tenant);
		if (rc == -ENOENT) {
			cli_err("qos", "rm: tenant '%s' has no limits (`stoker qos ls`)", tenant);
			return 1;
		}
		if (rc) {
			cli_err("qos", "rm: %s", stk_strerror(rc));
			return 1;
		}
		printf("qos %s: limits dropped\n", tenant);
		return 0;
	}
	if (!given) {
		cli_err("qos", "set %s needs --read-bw, --write-bw, --iops or --class", tenant);
		return cli_usage("qos");
	}
	if (tenant[0] == '@' && q.max_class != STK_QOS_CLASS_NONE) {
		cli_err("qos", "set %s: a class's own limits take no --class", tenant);
		return 1;
	}
	snprintf(q.tenant, sizeof(q.tenant), "%s", tenant);
	rc = stk_cluster_qos_set(cluster, &q);
	if (rc == -EINVAL) {
		cli_err("qos",
			"set: '%s' is not a tenant name (1 to %u letters, digits, '.', '_' or "
			"'-', as a client key's name) nor a class's (@default, @checkpoint)",
			tenant, STK_IDENT_NAME_MAX);
		return 1;
	}
	if (rc == -ENOSPC) {
		cli_err("qos", "set: %u tenants have limits already (`stoker qos rm` one first)",
			STK_QOS_TENANTS_MAX);
		return 1;
	}
	if (rc == -EPERM) {
		cli_err("qos", "set: this process holds a client key: only the cluster key's "
			       "holder sets limits");
		return 1;
	}
	if (rc) {
		cli_err("qos", "set: %s", stk_strerror(rc));
		return 1;
	}
	printf("qos %s set: storage nodes apply it within a few seconds\n", tenant);
	return 0;
}
