/*
 * mgmtd's table of training jobs (src/mgmtd/jobs.c): a report kept and updated,
 * a final one removing its job, jobs dropped after three missed reports, the bound
 * on the number of jobs, and every kind of malformed report refused with the table
 * left as it was.
 */
#include "check.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "mgmtd/jobs.h"

static char *report(const char *id, const char *name, double interval, const char *extra)
{
	static char buf[2048];

	snprintf(buf, sizeof(buf),
		 "{\"v\":1,\"id\":\"%s\",\"name\":\"%s\",\"host\":\"gpu1\",\"pid\":42,"
		 "\"interval_s\":%g,\"running_s\":10,\"steps\":5,\"samples\":500,"
		 "\"bytes\":65536,\"data_wait_s\":2.5,\"window_s\":5,\"data_wait_ratio\":0.25,"
		 "\"samples_per_s\":100,\"bytes_per_s\":1e6%s}",
		 id, name, interval, extra);
	return buf;
}

static int put(struct stk_mgmtd_jobs *j, const char *body, int64_t now)
{
	char err[256];

	return stk_mgmtd_jobs_report(j, body, strlen(body), NULL, now, err, sizeof(err));
}

static int test_keep_update_expire(void)
{
	struct stk_mgmtd_jobs *j;
	json_t *a, *e;

	REQUIRE(stk_mgmtd_jobs_create(0, NULL, 0, &j) == 0);
	a = stk_mgmtd_jobs_json(j, 0); /* an empty table: an empty list */
	CHECK(a && json_is_array(a) && json_array_size(a) == 0);
	json_decref(a);
	CHECK_RC(put(j, report("aaaaaaaa", "train", 2, ""), 1000), 0);
	CHECK_RC(put(j,
		     report("bbbbbbbb", "eval", 2,
			    ",\"rank\":3,\"checkpoint_saves\":2,\"checkpoint_save_s\":1.5,"
			    "\"checkpoint_save_bytes\":12345,\"checkpoint_save_ago_s\":4"),
		     1000),
		 0);
	a = stk_mgmtd_jobs_json(j, 2000);
	REQUIRE(a && json_array_size(a) == 2);
	e = json_array_get(a, 0); /* by name: eval first */
	CHECK(strcmp(json_string_value(json_object_get(e, "name")), "eval") == 0);
	CHECK_EQ(json_integer_value(json_object_get(e, "rank")), 3);
	CHECK_EQ(json_integer_value(json_object_get(e, "checkpoint_save_bytes")), 12345);
	/* the checkpoint's age goes on on mgmtd's clock: 4 s then, 5 s a second later */
	CHECK(json_real_value(json_object_get(e, "checkpoint_save_age_s")) == 5.0);
	CHECK(json_is_null(json_object_get(e, "checkpoint_load_age_s")));
	CHECK(json_is_true(json_object_get(e, "data_bound")));
	json_decref(a);
	/* an update replaces; 3 intervals without a report drop the job */
	CHECK_RC(put(j, report("aaaaaaaa", "train", 2, ""), 6000), 0);
	CHECK_EQ(stk_mgmtd_jobs_count(j, 6999), 2);
	CHECK_EQ(stk_mgmtd_jobs_count(j, 7001), 1); /* eval: last at 1000, timeout 6 s */
	CHECK_EQ(stk_mgmtd_jobs_count(j, 12001), 0);
	/* a final report removes at once */
	CHECK_RC(put(j, report("cccccccc", "x", 1, ""), 20000), 0);
	CHECK_EQ(stk_mgmtd_jobs_count(j, 20000), 1);
	CHECK_RC(put(j, report("cccccccc", "x", 1, ",\"final\":true"), 20100), 0);
	CHECK_EQ(stk_mgmtd_jobs_count(j, 20100), 0);
	/* a short interval still gets the minimum timeout */
	CHECK_RC(put(j, report("dddddddd", "x", 0.1, ""), 30000), 0);
	CHECK_EQ(stk_mgmtd_jobs_count(j, 30000 + STK_MGMTD_JOBS_MIN_TIMEOUT_MS), 1);
	CHECK_EQ(stk_mgmtd_jobs_count(j, 30001 + STK_MGMTD_JOBS_MIN_TIMEOUT_MS), 0);
	stk_mgmtd_jobs_destroy(j);
	return 0;
}

static int test_too_many(void)
{
	struct stk_mgmtd_jobs *j;
	char id[32];

	REQUIRE(stk_mgmtd_jobs_create(4, NULL, 0, &j) == 0);
	for (int i = 0; i < 4; i++) {
		snprintf(id, sizeof(id), "job%08d", i);
		CHECK_RC(put(j, report(id, "n", 10, ""), 0), 0);
	}
	CHECK_RC(put(j, report("job99999999", "n", 10, ""), 0), -ENOSPC);
	CHECK_RC(put(j, report("job00000001", "n", 10, ""), 1), 0); /* known ones update */
	CHECK_EQ(stk_mgmtd_jobs_count(j, 1), 4);
	/* once they are gone, room again */
	CHECK_RC(put(j, report("job99999999", "n", 10, ""), 40000), 0);
	CHECK_EQ(stk_mgmtd_jobs_count(j, 40000), 1);
	stk_mgmtd_jobs_destroy(j);
	return 0;
}

static int test_malformed(void)
{
	struct stk_mgmtd_jobs *j;
	char big[STK_MGMTD_JOBS_BODY_MAX + 2], name[STK_MGMTD_JOBS_NAME_MAX + 2], err[256];
	char *r;
	static const char *const bad[] = {
	    "",
	    "garbage",
	    "[1,2]",
	    "{\"v\":1}",
	    "{\"v\":2,\"id\":\"aaaaaaaa\"}",
	    "{\"v\":1,\"v\":1}",
	    "{\"v\":1,\"id\":\"aaaaaaaa\",\"name\":\"x\",\"host\":\"h\",\"pid\":1,"
	    "\"interval_s\":1,\"running_s\":1,\"steps\":1,\"samples\":1,\"bytes\":1,"
	    "\"data_wait_s\":1,\"window_s\":1,\"data_wait_ratio\":NaN,\"samples_per_s\":1,"
	    "\"bytes_per_s\":1}",
	};

	REQUIRE(stk_mgmtd_jobs_create(0, NULL, 0, &j) == 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK_RC(put(j, bad[i], 0), -EINVAL);
	/* each field checked: types, ranges, strings */
	CHECK_RC(put(j, report("aaaaaaaa", "x", 1, ",\"data_wait_ratio\":1.5"), 0), -EINVAL);
	CHECK_RC(put(j, report("bad id!!", "x", 1, ""), 0), -EINVAL);
	CHECK_RC(put(j, report("short", "x", 1, ""), 0), 0); /* 5 chars is fine */
	CHECK_RC(put(j, report("aaaaaaaa", "", 1, ""), 0), -EINVAL);
	CHECK_RC(put(j, report("aaaaaaaa", "a\\u0001b", 1, ""), 0), -EINVAL);
	CHECK_RC(put(j, report("aaaaaaaa", "x", 0, ""), 0), -EINVAL);
	CHECK_RC(put(j, report("aaaaaaaa", "x", 1e6, ""), 0), -EINVAL);
	CHECK_RC(put(j, report("aaaaaaaa", "x", 1, ",\"final\":1"), 0), -EINVAL);
	CHECK_RC(put(j, report("aaaaaaaa", "x", 1, ",\"checkpoint_saves\":-1"), 0), -EINVAL);
	CHECK_RC(put(j, report("aaaaaaaa", "x", 1, ",\"checkpoint_save_s\":\"1\""), 0), -EINVAL);
	r = report("aaaaaaaa", "x", 1, "");
	r[strlen(r) - 1] = 0; /* cut short */
	CHECK_RC(put(j, r, 0), -EINVAL);
	memset(name, 'n', sizeof(name) - 1);
	name[sizeof(name) - 1] = 0;
	CHECK_RC(put(j, report("aaaaaaaa", name, 1, ""), 0), -EINVAL);
	name[STK_MGMTD_JOBS_NAME_MAX] = 0;
	CHECK_RC(put(j, report("aaaaaaaa", name, 1, ""), 0), 0);
	memset(big, ' ', sizeof(big));
	CHECK_RC(stk_mgmtd_jobs_report(j, big, sizeof(big), NULL, 0, err, sizeof(err)), -E2BIG);
	CHECK(strstr(err, "at most") != NULL);
	/* with a reason in words */
	CHECK_RC(stk_mgmtd_jobs_report(j, "{\"v\":1}", 7, NULL, 0, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "\"id\" is missing") != NULL);
	CHECK_EQ(stk_mgmtd_jobs_count(j, 0), 2);
	stk_mgmtd_jobs_destroy(j);
	return 0;
}

/* The signature a job sends: hex HMAC-SHA256(key, label || body). */
static void sign(const uint8_t *key, size_t klen, const char *body, char hex[65])
{
	char msg[8192];
	uint8_t mac[32];
	unsigned int mlen = 0;
	size_t ll = strlen(STK_MGMTD_JOBS_SIGN_LABEL), bl = strlen(body);

	memcpy(msg, STK_MGMTD_JOBS_SIGN_LABEL, ll);
	memcpy(msg + ll, body, bl);
	HMAC(EVP_sha256(), key, (int)klen, (unsigned char *)msg, ll + bl, mac, &mlen);
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", mac[i]);
}

static int test_signed(void)
{
	struct stk_mgmtd_jobs *j;
	uint8_t key[32], other[32];
	char sig[65], err[256];
	const char *body;

	memset(key, 7, sizeof(key));
	memset(other, 8, sizeof(other));
	CHECK_RC(stk_mgmtd_jobs_create(0, key, 5, &j), -EINVAL); /* too short a key */
	REQUIRE(stk_mgmtd_jobs_create(0, key, sizeof(key), &j) == 0);
	body = report("aaaaaaaa", "signed", 5, "");
	CHECK_RC(stk_mgmtd_jobs_report(j, body, strlen(body), NULL, 0, err, sizeof(err)), -EACCES);
	CHECK(strstr(err, "STOKER_KEY_FILE") != NULL);
	sign(other, sizeof(other), body, sig);
	CHECK_RC(stk_mgmtd_jobs_report(j, body, strlen(body), sig, 0, err, sizeof(err)), -EACCES);
	CHECK_RC(stk_mgmtd_jobs_report(j, body, strlen(body), "zz", 0, err, sizeof(err)), -EACCES);
	sign(key, sizeof(key), body, sig);
	/* the signature covers the body: one byte more and it no longer matches */
	CHECK_RC(stk_mgmtd_jobs_report(j, body, strlen(body) - 1, sig, 0, err, sizeof(err)),
		 -EACCES);
	CHECK_EQ(stk_mgmtd_jobs_count(j, 0), 0);
	CHECK_RC(stk_mgmtd_jobs_report(j, body, strlen(body), sig, 0, err, sizeof(err)), 0);
	CHECK_EQ(stk_mgmtd_jobs_count(j, 0), 1);
	stk_mgmtd_jobs_destroy(j);
	return 0;
}

int main(void)
{
	/* each returns early (1) when a required step fails */
	test_keep_update_expire();
	test_too_many();
	test_malformed();
	test_signed();
	return check_done();
}
