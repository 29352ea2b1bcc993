/*
 * The dashboard's Prometheus client (src/mgmtd/promq.c): query_range answers laid
 * onto the grid (values in their slots by time, gaps and NaN as NAN, times off the
 * grid dropped), refused answers, and a server that is not there.
 */
#include "check.h"

#include <math.h>

#include "mgmtd/promq.h"

static int parse(const char *body, double *out, unsigned n)
{
	char err[256];

	return stk_promq_parse(body, strlen(body), 1000000, 2000, n, out, err, sizeof(err));
}

static int test_grid(void)
{
	double v[5];

	/* slots 0, 2 and 3 (1000.0 s, 1004 s, 1006 s), 1 and 4 missing */
	CHECK_RC(parse("{\"status\":\"success\",\"data\":{\"resultType\":\"matrix\",\"result\":"
		       "[{\"metric\":{},\"values\":[[1000,\"1.5\"],[1004.0,\"NaN\"],"
		       "[1006,\"3e2\"],[1020,\"9\"],[990,\"9\"]]}]}}",
		       v, 5),
		 0);
	CHECK(v[0] == 1.5 && isnan(v[1]) && isnan(v[2]) && v[3] == 300 && isnan(v[4]));
	/* no series at all: every slot NAN */
	CHECK_RC(
	    parse("{\"status\":\"success\",\"data\":{\"resultType\":\"matrix\",\"result\":[]}}", v,
		  5),
	    0);
	for (int i = 0; i < 5; i++)
		CHECK(isnan(v[i]));
	return 0;
}

static int test_refused(void)
{
	double v[3];
	char err[256];

	CHECK_RC(parse("not json", v, 3), -EBADMSG);
	CHECK_RC(
	    parse("{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":[]}}", v,
		  3),
	    -EBADMSG);
	CHECK_RC(parse("{\"status\":\"success\",\"data\":{\"resultType\":\"matrix\",\"result\":"
		       "[{\"values\":[[1000,1.5]]}]}}",
		       v, 3),
		 -EBADMSG);
	CHECK_RC(parse("{\"status\":\"success\",\"data\":{\"resultType\":\"matrix\",\"result\":"
		       "[{\"values\":[[1000,\"x1\"]]}]}}",
		       v, 3),
		 -EBADMSG);
	const char *e = "{\"status\":\"error\",\"error\":\"parse error\"}";

	CHECK_RC(stk_promq_parse(e, strlen(e), 0, 1000, 3, v, err, sizeof(err)), -EIO);
	CHECK(strstr(err, "parse error") != NULL);
	return 0;
}

static int test_unreachable(void)
{
	struct stk_promq *q;
	double v[3];
	char err[256] = "";

	CHECK_RC(stk_promq_create("ftp://x", &q), -EINVAL);
	REQUIRE(stk_promq_create("http://127.0.0.1:1/", &q) == 0);
	CHECK_RC(stk_promq_range(q, "up", 0, 1000, 3, v, err, sizeof(err)), -ECONNREFUSED);
	CHECK(strstr(err, "http://127.0.0.1:1") != NULL);
	stk_promq_destroy(q);
	return 0;
}

int main(void)
{
	test_grid();
	test_refused();
	test_unreachable();
	return check_done();
}
