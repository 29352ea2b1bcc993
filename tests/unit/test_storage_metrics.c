/*
 * Unit test of storage metrics (storage/metrics.h): the reading of smartctl's JSON
 * (NVMe, ATA, a failing device, output with no health in it), and per-target
 * counting on real chunk stores: bytes, operations, errors, queue depth, latency,
 * and the figures the collector reads at scrape time; device health that goes
 * from known to unknown is hidden, not left stale.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/metrics.h"
#include "common/util.h"
#include "storage/chunk.h"
#include "storage/metrics.h"
#include "check.h"

/* Trimmed from `smartctl --json -H -A /dev/nvme0n1` (smartmontools 7.3). */
static const char nvme[] =
    "{\n  \"json_format_version\": [1, 0],\n  \"smartctl\": {\"exit_status\": 0},\n"
    "  \"device\": {\"name\": \"/dev/nvme0n1\", \"type\": \"nvme\"},\n"
    "  \"smart_status\": {\n    \"passed\": true,\n    \"nvme\": {\"value\": 0}\n  },\n"
    "  \"nvme_smart_health_information_log\": {\n    \"critical_warning\": 0,\n"
    "    \"temperature\": 41,\n    \"available_spare\": 100,\n    \"percentage_used\": 7,\n"
    "    \"data_units_read\": 123456,\n    \"media_errors\": 2,\n"
    "    \"num_err_log_entries\": 0\n  },\n"
    "  \"temperature\": {\n    \"current\": 41\n  },\n  \"power_on_time\": {\"hours\": 1000}\n}\n";

/* An ATA disk that fails its health check (compact output). */
static const char ata[] =
    "{\"smartctl\":{\"exit_status\":8},\"smart_status\":{\"passed\":false},"
    "\"ata_smart_attributes\":{\"table\":[{\"id\":5,\"name\":\"Reallocated_Sector_Ct\"}]},"
    "\"temperature\":{\"current\":38}}";

/* A device smartctl could open but that reports no health (a virtual disk). */
static const char none[] = "{\"smartctl\":{\"exit_status\":4},\"device\":{\"name\":\"/dev/vda\"}}";

static void test_smart_parse(void)
{
	struct stk_smart s;

	CHECK(stk_smart_parse(nvme, &s) == 0);
	CHECK(s.has_passed && s.passed == 1);
	CHECK(s.has_temp && s.temp_c == 41);
	CHECK(s.has_wear && s.wear > 0.0699 && s.wear < 0.0701);
	CHECK(s.has_media_errors && s.media_errors == 2);

	CHECK(stk_smart_parse(ata, &s) == 0);
	CHECK(s.has_passed && s.passed == 0);
	CHECK(s.has_temp && s.temp_c == 38);
	CHECK(!s.has_wear && !s.has_media_errors);

	CHECK(stk_smart_parse(none, &s) == -ENOENT);
	CHECK(!s.has_passed && !s.has_temp);
	CHECK(stk_smart_parse("", &s) == -ENOENT);
	CHECK(stk_smart_parse("{\"smart_status\": {\"passed\": maybe}}", &s) == -ENOENT);
}

static double sample(const char *text, const char *series)
{
	size_t n = strlen(series);

	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	return -1;
}

/*
 * Device health once known, then unknown: a round in which smartctl gives nothing
 * must take the figures away, not leave the last ones standing; a round that gives
 * fewer figures hides the missing ones.
 */
static void test_smart_absent(struct stk_storage_metrics *m)
{
	static const char healthy[] =
	    "stoker_device_smart_healthy{target=\"11\",device=\"/dev/fk\"}";
	static const char temp[] =
	    "stoker_device_temperature_celsius{target=\"11\",device=\"/dev/fk\"}";
	static const char wear[] = "stoker_device_wear_ratio{target=\"11\",device=\"/dev/fk\"}";
	struct stk_smart s;
	char *text;
	size_t tlen;

	CHECK(stk_metrics_render(&text, &tlen) == 0);
	CHECK(strstr(text, "stoker_device_") == NULL); /* never known: absent */
	free(text);

	CHECK(stk_smart_parse(nvme, &s) == 0);
	CHECK(stk_storage_metrics_smart_apply(m, 0, "/dev/fk", &s) == 0);
	CHECK(stk_metrics_render(&text, &tlen) == 0);
	CHECK(sample(text, healthy) == 1);
	CHECK(sample(text, temp) == 41);
	CHECK(sample(text, wear) > 0.069);
	free(text);

	/* smartctl fails: every figure goes, headers too */
	CHECK(stk_storage_metrics_smart_apply(m, 0, NULL, NULL) == 0);
	CHECK(stk_metrics_render(&text, &tlen) == 0);
	CHECK(strstr(text, "stoker_device_") == NULL);
	free(text);

	/* an answer without wear or media errors: those stay hidden, the rest is fresh */
	CHECK(stk_smart_parse(ata, &s) == 0);
	CHECK(stk_storage_metrics_smart_apply(m, 0, NULL, &s) == 0);
	CHECK(stk_metrics_render(&text, &tlen) == 0);
	CHECK(sample(text, healthy) == 0);
	CHECK(sample(text, temp) == 38);
	CHECK(strstr(text, "stoker_device_wear_ratio") == NULL);
	CHECK(strstr(text, "stoker_device_media_errors_total") == NULL);
	free(text);

	CHECK(stk_storage_metrics_smart_apply(m, 5, "/dev/fk", &s) == -EINVAL);
	CHECK(stk_storage_metrics_smart_apply(m, 1, NULL, &s) == -EINVAL); /* no device */
}

static void test_targets(void)
{
	char dir[64] = "", t1[96], t2[96];
	struct stk_chunk_store *cs[2] = {NULL, NULL};
	struct stk_storage_metrics *m = NULL;
	static char data[8192], back[8192];
	uint32_t len;
	uint64_t t0;
	long n;
	char *text;
	size_t tlen;

	CHECK_RC(check_tmpdir(dir, sizeof(dir), "smetrics"), 0);
	if (!dir[0])
		return;
	snprintf(t1, sizeof(t1), "%s/t1", dir);
	snprintf(t2, sizeof(t2), "%s/t2", dir);
	CHECK(stk_chunk_store_open(t1, &cs[0]) == 0);
	CHECK(stk_chunk_store_open(t2, &cs[1]) == 0);
	if (!cs[0] || !cs[1])
		goto out;
	CHECK(stk_chunk_store_set_id(cs[0], 11) == 0);
	CHECK(stk_chunk_store_set_id(cs[1], 12) == 0);
	/* No SMART checker thread: test_smart_absent() plays its part. */
	setenv("STOKER_SMARTCTL", "", 1);
	CHECK(stk_storage_metrics_create(cs, 2, &m) == 0);
	memset(data, 'x', sizeof(data));

	t0 = stk_storage_metrics_begin(m, cs[0]);
	len = 0;
	int rc = stk_chunk_write(cs[0], 5, 0, 1 << 20, 0, data, sizeof(data), NULL, 0, &len);
	stk_storage_metrics_end(m, cs[0], STK_TARGET_WRITE, t0, rc, sizeof(data));
	CHECK(rc == 0);
	t0 = stk_storage_metrics_begin(m, cs[0]);
	n = stk_chunk_read(cs[0], 5, 0, 0, back, sizeof(back), NULL);
	stk_storage_metrics_end(m, cs[0], STK_TARGET_READ, t0, n, n > 0 ? (uint64_t)n : 0);
	CHECK(n == (long)sizeof(back));
	/* a failed read is an error and moves no bytes; ENOSPC is not an I/O error */
	t0 = stk_storage_metrics_begin(m, cs[1]);
	stk_storage_metrics_end(m, cs[1], STK_TARGET_READ, t0, -EIO, 0);
	t0 = stk_storage_metrics_begin(m, cs[1]);
	stk_storage_metrics_end(m, cs[1], STK_TARGET_WRITE, t0, -ENOSPC, 4096);
	stk_storage_metrics_begin(m, cs[1]); /* still in flight */
	stk_storage_metrics_begin(NULL, cs[1]);

	CHECK(stk_metrics_render(&text, &tlen) == 0);
	CHECK(sample(text, "stoker_target_write_bytes_total{target=\"11\"}") == sizeof(data));
	CHECK(sample(text, "stoker_target_read_bytes_total{target=\"11\"}") == sizeof(back));
	CHECK(sample(text, "stoker_target_writes_total{target=\"11\"}") == 1);
	CHECK(sample(text, "stoker_target_reads_total{target=\"11\"}") == 1);
	CHECK(sample(text, "stoker_target_reads_total{target=\"12\"}") == 1);
	CHECK(sample(text, "stoker_target_write_bytes_total{target=\"12\"}") == 0);
	CHECK(sample(text, "stoker_target_io_errors_total{target=\"12\",op=\"read\"}") == 1);
	CHECK(sample(text, "stoker_target_io_errors_total{target=\"12\",op=\"write\"}") == 0);
	CHECK(sample(text, "stoker_target_inflight_requests{target=\"11\"}") == 0);
	CHECK(sample(text, "stoker_target_inflight_requests{target=\"12\"}") == 1);
	CHECK(sample(text, "stoker_target_io_duration_seconds_count{target=\"11\",op=\"write\"}") ==
	      1);
	CHECK(sample(text, "stoker_target_chunks{target=\"11\"}") == 1);
	CHECK(sample(text, "stoker_target_capacity_bytes{target=\"11\"}") > 0);
	/* both targets sit on one file system: the node counts it once, not twice */
	CHECK(sample(text, "stoker_node_capacity_bytes") ==
	      sample(text, "stoker_target_capacity_bytes{target=\"12\"}"));
	CHECK(sample(text, "stoker_node_capacity_bytes") ==
	      sample(text, "stoker_target_capacity_bytes{target=\"11\"}"));
	CHECK(sample(text, "stoker_node_used_bytes") > 0);
	CHECK(sample(text, "stoker_target_checksum_errors_total{target=\"11\"}") == 0);
	free(text);

	/* corrupt the chunk on disk: the read fails and the collector counts it */
	{
		char path[128];
		FILE *f;
		snprintf(path, sizeof(path), "%s/chunks/05/5/0", t1);
		f = fopen(path, "r+");
		CHECK(f != NULL);
		if (f) {
			fseek(f, 4096 + 100, SEEK_SET);
			fputc('y', f);
			fclose(f);
		}
		CHECK(stk_chunk_read(cs[0], 5, 0, 0, back, sizeof(back), NULL) == -EIO);
		CHECK(stk_metrics_render(&text, &tlen) == 0);
		CHECK(sample(text, "stoker_target_checksum_errors_total{target=\"11\"}") == 1);
		free(text);
	}
	test_smart_absent(m);
out:
	stk_storage_metrics_destroy(m);
	for (int i = 0; i < 2; i++)
		if (cs[i])
			stk_chunk_store_close(cs[i]);
	check_rm_rf(dir);
}

int main(void)
{
	CHECK_RUN(test_smart_parse);
	CHECK_RUN(test_targets);
	return check_done();
}
