/*
 * The S3 client of `stoker sync` (src/cli/s3client.c): where its endpoint, keys and
 * region come from. The requests themselves are tested against the real gateway
 * (tests/integration/test_sync.py).
 */
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/s3client.h"

static char g_dir[PATH_MAX];

static void clear_env(void)
{
	static const char *const names[] = {
	    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",	"AWS_SESSION_TOKEN",
	    "AWS_REGION",	 "AWS_DEFAULT_REGION",		"AWS_ENDPOINT_URL",
	    "AWS_PROFILE",	 "AWS_SHARED_CREDENTIALS_FILE",
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		unsetenv(names[i]);
	setenv("HOME", g_dir, 1); /* no ~/.aws of the machine's */
}

/* Checks that a load succeeded; the test function returns when it did not. */
static int loaded(int rc)
{
	CHECK_EQ(rc, 0);
	return rc == 0;
}

static void test_keys_from_environment(void)
{
	struct cli_s3_conf c;
	char err[256];

	clear_env();
	setenv("AWS_ACCESS_KEY_ID", "AKENV", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "secret/with+odd=chars", 1);
	setenv("AWS_DEFAULT_REGION", "eu-west-3", 1);
	if (!loaded(cli_s3_conf_load("http://127.0.0.1:9000/", NULL, &c, err, sizeof(err))))
		return;
	CHECK(strcmp(c.access_key, "AKENV") == 0);
	CHECK(strcmp(c.secret_key, "secret/with+odd=chars") == 0);
	CHECK(strcmp(c.region, "eu-west-3") == 0);
	CHECK(strcmp(c.endpoint, "http://127.0.0.1:9000") == 0); /* trailing '/' dropped */
	CHECK(strcmp(c.host, "127.0.0.1:9000") == 0);
	CHECK(c.token[0] == 0);
	/* AWS_REGION wins over AWS_DEFAULT_REGION; no endpoint: AWS's for the region. */
	setenv("AWS_REGION", "ap-south-1", 1);
	if (!loaded(cli_s3_conf_load(NULL, NULL, &c, err, sizeof(err))))
		return;
	CHECK(strcmp(c.endpoint, "https://s3.ap-south-1.amazonaws.com") == 0);
	CHECK(strcmp(c.host, "s3.ap-south-1.amazonaws.com") == 0);
	setenv("AWS_ENDPOINT_URL", "https://s3.example.com", 1);
	if (!loaded(cli_s3_conf_load(NULL, NULL, &c, err, sizeof(err))))
		return;
	CHECK(strcmp(c.host, "s3.example.com") == 0);
}

static void test_keys_from_credentials_file(void)
{
	char file[PATH_MAX + 32], err[256];
	struct cli_s3_conf c;
	FILE *f;

	clear_env();
	snprintf(file, sizeof(file), "%s/creds", g_dir);
	f = fopen(file, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	fputs("# comment\n[default]\naws_access_key_id = AKDEF\naws_secret_access_key=skdef\n\n"
	      "[ other ]\n  aws_access_key_id =  AKOTHER  \r\naws_secret_access_key = sk other\n"
	      "aws_session_token = tok\n",
	      f);
	fclose(f);
	setenv("AWS_SHARED_CREDENTIALS_FILE", file, 1);
	if (!loaded(cli_s3_conf_load("http://h:1", NULL, &c, err, sizeof(err))))
		return;
	CHECK(strcmp(c.access_key, "AKDEF") == 0);
	CHECK(strcmp(c.secret_key, "skdef") == 0);
	CHECK(strcmp(c.region, "us-east-1") == 0);
	if (!loaded(cli_s3_conf_load("http://h:1", "other", &c, err, sizeof(err))))
		return;
	CHECK(strcmp(c.access_key, "AKOTHER") == 0);
	CHECK(strcmp(c.secret_key, "sk other") == 0);
	CHECK(strcmp(c.token, "tok") == 0);
	setenv("AWS_PROFILE", "other", 1);
	if (!loaded(cli_s3_conf_load("http://h:1", NULL, &c, err, sizeof(err))))
		return;
	CHECK(strcmp(c.access_key, "AKOTHER") == 0);
	/* --profile takes precedence over keys in the environment. */
	setenv("AWS_ACCESS_KEY_ID", "AKENV", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "skenv", 1);
	if (!loaded(cli_s3_conf_load("http://h:1", "default", &c, err, sizeof(err))))
		return;
	CHECK(strcmp(c.access_key, "AKDEF") == 0);
	/* A profile that is not there: no keys, said clearly. */
	CHECK_RC(cli_s3_conf_load("http://h:1", "nope", &c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "no S3 keys") != NULL && strstr(err, "[nope]") != NULL);
}

static void test_bad_endpoints_and_no_keys(void)
{
	static const char *const bad[] = {"ftp://h", "h:9000", "http://", "http://h/path",
					  "http://h?x=1"};
	struct cli_s3_conf c;
	char err[256];

	clear_env();
	setenv("AWS_ACCESS_KEY_ID", "AK", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "SK", 1);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK_RC(cli_s3_conf_load(bad[i], NULL, &c, err, sizeof(err)), -EINVAL);
		CHECK(strstr(err, "expected http://HOST") != NULL);
	}
	clear_env();
	CHECK_RC(cli_s3_conf_load("http://h:1", NULL, &c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "AWS_ACCESS_KEY_ID") != NULL);
}

int main(void)
{
	if (check_tmpdir(g_dir, sizeof(g_dir), "s3conf"))
		return 77;
	CHECK_RUN(test_keys_from_environment);
	CHECK_RUN(test_keys_from_credentials_file);
	CHECK_RUN(test_bad_endpoints_and_no_keys);
	return check_done();
}
