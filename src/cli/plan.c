/*
 * `stoker plan`: a capacity and performance planner. From what a user knows of a
 * training workload (the data set and its growth, what preprocessing makes of it,
 * checkpoints, scratch, GPUs and their appetite) it works out the usable and raw
 * capacity, the bandwidth and IOPS the cluster must give, and how many nodes of a
 * given server profile that takes, printing each step's arithmetic so that a
 * reader can check it by hand.
 *
 * Sizes are decimal, as disks and data sets are sold (1T = 10^12 bytes; "Ti" for
 * binary). The defaults are the worked example of docs/plan.md: a 1 TB data set
 * expanded to 2 TB by preprocessing (both kept), 5 checkpoints of 20 GB, 200 GB of
 * scratch and 1.3 for overhead (file system, free space, imbalance): 4.29 TB
 * usable.
 */
#include "cli.h"

#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct plan {
	double dataset, expand, growth, years, ckpt, keep, scratch, overhead;
	int keep_raw;
	unsigned replicas, ec_k, ec_m; /* ec_k > 0: erasure coding k+m instead */
	double gpus, sample, rate, save_s;
	double node_cap, node_read, node_write, node_iops, fill;
	int json;
};

/*
 * A size: a decimal number with an optional unit, K M G T P (powers of 1000) or
 * Ki Mi Gi Ti Pi (of 1024), and an optional B. 0 or -1.
 */
static int parse_dsize(const char *s, double *out)
{
	static const char units[] = "KMGTP";
	char *end;
	double v = strtod(s, &end);
	const char *u;

	if (end == s || !(v >= 0) || !isfinite(v))
		return -1;
	if (*end && (u = strchr(units, *end & ~0x20)) != NULL) {
		double base = 1000;

		end++;
		if (*end == 'i') {
			base = 1024;
			end++;
		}
		v *= pow(base, (double)(u - units + 1));
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		return -1;
	*out = v;
	return 0;
}

static int parse_num(const char *s, double *out)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || *end || !(v >= 0) || !isfinite(v))
		return -1;
	*out = v;
	return 0;
}

/* "1.23 TB": bytes in the largest decimal unit that keeps it at or above 1. */
static const char *fmt(double b, char *buf, size_t len)
{
	static const char *u[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
	unsigned i = 0;

	while (b >= 1000 && i + 1 < sizeof(u) / sizeof(u[0])) {
		b /= 1000;
		i++;
	}
	snprintf(buf, len, "%.2f %s", b, u[i]);
	return buf;
}

enum {
	P_DATASET = 1000, P_EXPAND, P_NO_RAW, P_GROWTH, P_YEARS, P_CKPT, P_KEEP, P_SCRATCH,
	P_OVERHEAD, P_REPLICAS, P_EC, P_GPUS, P_SAMPLE, P_RATE, P_SAVE, P_NODE_CAP,
	P_NODE_READ, P_NODE_WRITE, P_NODE_IOPS, P_FILL, P_JSON,
};

static const struct option plan_opts[] = {
	{"dataset", required_argument, NULL, P_DATASET},
	{"expand", required_argument, NULL, P_EXPAND},
	{"no-raw", no_argument, NULL, P_NO_RAW},
	{"growth", required_argument, NULL, P_GROWTH},
	{"years", required_argument, NULL, P_YEARS},
	{"checkpoint", required_argument, NULL, P_CKPT},
	{"keep", required_argument, NULL, P_KEEP},
	{"scratch", required_argument, NULL, P_SCRATCH},
	{"overhead", required_argument, NULL, P_OVERHEAD},
	{"replicas", required_argument, NULL, P_REPLICAS},
	{"ec", required_argument, NULL, P_EC},
	{"gpus", required_argument, NULL, P_GPUS},
	{"sample", required_argument, NULL, P_SAMPLE},
	{"rate", required_argument, NULL, P_RATE},
	{"save-within", required_argument, NULL, P_SAVE},
	{"node-capacity", required_argument, NULL, P_NODE_CAP},
	{"node-read", required_argument, NULL, P_NODE_READ},
	{"node-write", required_argument, NULL, P_NODE_WRITE},
	{"node-iops", required_argument, NULL, P_NODE_IOPS},
	{"fill", required_argument, NULL, P_FILL},
	{"json", no_argument, NULL, P_JSON},
	{NULL, 0, NULL, 0},
};

/* One option into p. 0, or 2 after saying what is wrong. */
static int plan_opt(struct plan *p, int c, const char *v)
{
	double x = 0;
	int bad;

	switch (c) {
	case P_NO_RAW:
		p->keep_raw = 0;
		return 0;
	case P_JSON:
		p->json = 1;
		return 0;
	case P_EC: {
		unsigned k, m;
		char tail;

		if (sscanf(v, "%u+%u%c", &k, &m, &tail) != 2 || k < 1 || m < 1 || k + m > 32) {
			cli_err("plan", "bad --ec '%s': K+M data and parity blocks, such as 4+2", v);
			return 2;
		}
		p->ec_k = k;
		p->ec_m = m;
		return 0;
	}
	case P_DATASET:
	case P_CKPT:
	case P_SCRATCH:
	case P_SAMPLE:
	case P_NODE_CAP:
	case P_NODE_READ:
	case P_NODE_WRITE:
		bad = parse_dsize(v, &x);
		break;
	default:
		bad = parse_num(v, &x);
		break;
	}
	if (bad) {
		cli_err("plan", "bad value '%s' (a non-negative number%s)", v,
			c == P_DATASET || c == P_CKPT || c == P_SCRATCH || c == P_SAMPLE ||
				c == P_NODE_CAP || c == P_NODE_READ || c == P_NODE_WRITE
			    ? ", with a unit such as 20G or 1.5T"
			    : "");
		return 2;
	}
	switch (c) {
	case P_DATASET: p->dataset = x; break;
	case P_EXPAND: p->expand = x; break;
	case P_GROWTH: p->growth = x; break;
	case P_YEARS: p->years = x; break;
	case P_CKPT: p->ckpt = x; break;
	case P_KEEP: p->keep = x; break;
	case P_SCRATCH: p->scratch = x; break;
	case P_OVERHEAD: p->overhead = x; break;
	case P_GPUS: p->gpus = x; break;
	case P_SAMPLE: p->sample = x; break;
	case P_RATE: p->rate = x; break;
	case P_SAVE: p->save_s = x; break;
	case P_NODE_CAP: p->node_cap = x; break;
	case P_NODE_READ: p->node_read = x; break;
	case P_NODE_WRITE: p->node_write = x; break;
	case P_NODE_IOPS: p->node_iops = x; break;
	case P_FILL: p->fill = x; break;
	case P_REPLICAS: p->replicas = (unsigned)x; break;
	}
	if ((c == P_OVERHEAD && x < 1) || (c == P_FILL && (x <= 0 || x > 1)) ||
	    (c == P_REPLICAS && (x < 1 || x > 8 || x != floor(x))) ||
	    (c == P_SAVE && x <= 0) ||
	    ((c == P_NODE_CAP || c == P_NODE_READ || c == P_NODE_WRITE || c == P_NODE_IOPS) &&
	     x <= 0)) {
		cli_err("plan", "bad value '%s': --overhead is at least 1, --fill above 0 and at "
			"most 1, --replicas 1 to 8, --save-within and the --node-* figures above 0",
			v);
		return 2;
	}
	return 0;
}

/* "1.23 GB/s" */
static const char *per_s(double b, char *buf, size_t len)
{
	char f[24];

	snprintf(buf, len, "%s/s", fmt(b, f, sizeof(f)));
	return buf;
}

/* One line of the arithmetic: what was worked out (label, printf-style), then value. */
static void __attribute__((format(printf, 2, 3))) row(const char *value, const char *label, ...)
{
	char l[128];
	va_list ap;

	va_start(ap, label);
	vsnprintf(l, sizeof(l), label, ap);
	va_end(ap);
	printf("  %-52s %14s\n", l, value);
}

/* Nodes one figure needs: need / per_node, rounded up (0 when need is 0). */
static double nodes_for(double need, double per_node)
{
	return need > 0 ? ceil(need / per_node - 1e-9) : 0;
}

int cmd_plan(int argc, char **argv)
{
	/* docs/plan.md's worked example, and a common NVMe server of today */
	struct plan p = {
		.dataset = 1e12, .expand = 2, .keep_raw = 1, .ckpt = 20e9, .keep = 5,
		.scratch = 200e9, .overhead = 1.3, .replicas = 3, .gpus = 8, .sample = 115e3,
		.rate = 1000, .save_s = 60, .node_cap = 8 * 7.68e12, .node_read = 25e9,
		.node_write = 10e9, .node_iops = 1e6, .fill = 0.8,
	};
	double raw_ds, pre, ckpts, sum, usable, grow, usable_h, redund, rawcap, rd, iops, wr;
	double wr_disk, n_cap, n_rd, n_wr, n_iops, n_dom, nodes;
	const char *bound = "capacity";
	char a[32], b[32], c[32];
	int o, rc;

	optind = 1;
	while ((o = getopt_long(argc, argv, "", plan_opts, NULL)) != -1) {
		if (o == '?')
			return cli_usage("plan");
		rc = plan_opt(&p, o, optarg);
		if (rc)
			return rc;
	}
	if (optind < argc) {
		cli_err("plan", "unexpected argument '%s'", argv[optind]);
		return cli_usage("plan");
	}

	raw_ds = p.keep_raw ? p.dataset : 0;
	pre = p.dataset * p.expand;
	ckpts = p.ckpt * p.keep;
	sum = raw_ds + pre + ckpts + p.scratch;
	usable = sum * p.overhead;
	/* the data sets grow; checkpoints and scratch follow the model, not the data */
	grow = pow(1 + p.growth / 100, p.years);
	usable_h = ((raw_ds + pre) * grow + ckpts + p.scratch) * p.overhead;
	redund = p.ec_k ? (double)(p.ec_k + p.ec_m) / p.ec_k : (double)p.replicas;
	rawcap = usable_h * redund;
	rd = p.gpus * p.rate * p.sample;
	iops = p.gpus * p.rate;
	wr = p.ckpt / p.save_s;
	wr_disk = wr * redund; /* every copy (or parity block) lands on some disk */
	n_cap = nodes_for(rawcap, p.node_cap * p.fill);
	n_rd = nodes_for(rd, p.node_read);
	n_wr = nodes_for(wr_disk, p.node_write);
	n_iops = nodes_for(iops, p.node_iops);
	/* each copy or block of a chain on a node of its own */
	n_dom = p.ec_k ? p.ec_k + p.ec_m : p.replicas;
	nodes = n_cap;
	if (n_rd > nodes) {
		nodes = n_rd;
		bound = "read bandwidth";
	}
	if (n_wr > nodes) {
		nodes = n_wr;
		bound = "checkpoint write bandwidth";
	}
	if (n_iops > nodes) {
		nodes = n_iops;
		bound = "IOPS";
	}
	if (n_dom > nodes) {
		nodes = n_dom;
		bound = p.ec_k ? "one node per block of a stripe" : "one node per copy";
	}

	if (p.json) {
		printf("{\"usable_bytes\": %.0f, \"usable_bytes_at_horizon\": %.0f, "
		       "\"raw_bytes\": %.0f, \"read_bytes_per_s\": %.0f, \"read_iops\": %.0f, "
		       "\"checkpoint_write_bytes_per_s\": %.0f, \"disk_write_bytes_per_s\": %.0f, "
		       "\"nodes\": %.0f, \"bound_by\": \"%s\", \"nodes_for\": {\"capacity\": %.0f, "
		       "\"read\": %.0f, \"write\": %.0f, \"iops\": %.0f, \"failure_domains\": %.0f}}\n",
		       usable, usable_h, rawcap, rd, iops, wr, wr_disk, nodes, bound, n_cap, n_rd,
		       n_wr, n_iops, n_dom);
		return 0;
	}
	printf("Capacity\n");
	if (p.keep_raw)
		row(fmt(raw_ds, a, sizeof(a)), "data set, as it arrives");
	row(fmt(pre, a, sizeof(a)), "preprocessed: %s x %g", fmt(p.dataset, b, sizeof(b)),
	    p.expand);
	row(fmt(ckpts, a, sizeof(a)), "checkpoints: %g x %s", p.keep, fmt(p.ckpt, b, sizeof(b)));
	row(fmt(p.scratch, a, sizeof(a)), "scratch");
	row(fmt(sum, a, sizeof(a)), "sum");
	row(fmt(usable, a, sizeof(a)), "usable: sum x %g overhead", p.overhead);
	if (p.years > 0 && p.growth > 0)
		row(fmt(usable_h, a, sizeof(a)), "in %g years, data growing %g%%/year (x %.3f)",
		    p.years, p.growth, grow);
	if (p.ec_k)
		row(fmt(rawcap, a, sizeof(a)), "raw: usable x (%u+%u)/%u, erasure coded", p.ec_k,
		    p.ec_m, p.ec_k);
	else
		row(fmt(rawcap, a, sizeof(a)), "raw: usable x %u copies", p.replicas);
	printf("\nPerformance\n");
	row(per_s(rd, a, sizeof(a)), "read: %g GPUs x %g samples/s x %s", p.gpus, p.rate,
	    fmt(p.sample, b, sizeof(b)));
	snprintf(a, sizeof(a), "%.0f", iops);
	row(a, "read IOPS: %g GPUs x %g samples/s", p.gpus, p.rate);
	row(per_s(wr, a, sizeof(a)), "checkpoint write: %s in %g s", fmt(p.ckpt, b, sizeof(b)),
	    p.save_s);
	row(per_s(wr_disk, a, sizeof(a)), "onto the disks: x %g (every copy lands)", redund);
	printf("\nNodes (each: %s raw, filled to %g%%; reads %s/s; writes %s/s; %.0f IOPS)\n",
	       fmt(p.node_cap, a, sizeof(a)), p.fill * 100, fmt(p.node_read, b, sizeof(b)),
	       fmt(p.node_write, c, sizeof(c)), p.node_iops);
	snprintf(a, sizeof(a), "%.0f", n_cap);
	row(a, "capacity: %s / (%s x %g)", fmt(rawcap, b, sizeof(b)),
	    fmt(p.node_cap, c, sizeof(c)), p.fill);
	snprintf(a, sizeof(a), "%.0f", n_rd);
	row(a, "read: %s/s / %s/s", fmt(rd, b, sizeof(b)), fmt(p.node_read, c, sizeof(c)));
	snprintf(a, sizeof(a), "%.0f", n_wr);
	row(a, "write: %s/s / %s/s", fmt(wr_disk, b, sizeof(b)), fmt(p.node_write, c, sizeof(c)));
	snprintf(a, sizeof(a), "%.0f", n_iops);
	row(a, "IOPS: %.0f / %.0f", iops, p.node_iops);
	snprintf(a, sizeof(a), "%.0f", n_dom);
	row(a, "failure domains: %s", p.ec_k ? "a node per block of a stripe" : "a node per copy");
	printf("  => %.0f nodes (bound by %s)\n", nodes, bound);
	return 0;
}
