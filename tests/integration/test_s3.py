"""The S3 gateway (`stoker gateway s3`) against real clients: boto3 for every
operation and error code, Debian's `aws` (s3 and s3api), `s3cmd`, and raw HTTP for
what clients never send (traversal keys, garbage, disconnects, streaming chunk
signatures). Objects and files are one: the same bytes through `stoker cat/put`.
"""
import base64
import datetime
import hashlib
import hmac
import http.client
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import zlib

import pytest

from conftest import STOKER, free_port, run

boto3 = pytest.importorskip("boto3")
import botocore  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

MiB = 1 << 20
AK, SK = "AKIDSTOKERTEST", "s3cr3t/with+odd=chars"
AK2, SK2 = "AKIDSECOND", "another-secret"
EMPTY_SHA = hashlib.sha256(b"").hexdigest()
AWS = "/usr/bin/aws"  # Debian's awscli, whatever comes first on PATH


class Gateway:
    """A `stoker gateway s3` on a free port, logging to a file."""

    def __init__(self, cluster, tmp_path, extra=(), tls=None, keys_text=None):
        self.cluster = cluster
        self.port = free_port()
        self.keys = tmp_path / "s3keys"
        self.keys.write_text(keys_text or "# test keys\n%s %s\n%s %s\n" % (AK, SK, AK2, SK2))
        os.chmod(self.keys, 0o600)
        self.logfile = str(tmp_path / ("gateway-%d.log" % self.port))
        self.scheme = "https" if tls else "http"
        self.endpoint = "%s://127.0.0.1:%d" % (self.scheme, self.port)
        args = [STOKER, "gateway", "s3", "--cluster", cluster.url, "--listen",
                "127.0.0.1:%d" % self.port, "--keys", str(self.keys), "--threads", "4",
                "--timeout", "5"] + list(extra)
        if tls:
            args += ["--tls-cert", tls[0], "--tls-key", tls[1]]
        self.log_fd = open(self.logfile, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log_fd, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, STOKER_LOG="debug"))
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("gateway exited %d:\n%s" % (self.proc.returncode, self.log()))
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("gateway did not listen:\n" + self.log())

    def log(self):
        with open(self.logfile, errors="replace") as f:
            return f.read()[-6000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("gateway ignored SIGTERM:\n" + self.log())
        self.log_fd.close()
        bad = [l for l in self.log().splitlines()
               if "ERROR: AddressSanitizer" in l or "runtime error:" in l or
               "ERROR: LeakSanitizer" in l]
        assert not bad, self.log()
        assert self.proc.returncode == 0, self.log()

    def client(self, ak=AK, sk=SK, **kw):
        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ak, aws_secret_access_key=sk,
            region_name="us-east-1", verify=kw.pop("verify", None),
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                          signature_version="s3v4", **kw))

    def raw(self, method, path, body=b"", headers=None, query=(), sign=True, ak=AK, sk=SK,
            when=None, payload_hash=None, raw_path=None):
        """One request over http.client (no URL normalisation), signed with our own
        SigV4 unless sign is False. Returns (status, headers, body)."""
        headers = dict(headers or {})
        headers["host"] = "127.0.0.1:%d" % self.port
        if sign:
            headers.update(sigv4(method, path, query, headers,
                                 payload_hash or hashlib.sha256(body).hexdigest(), ak, sk,
                                 when)[0])
        url = raw_path or urllib.parse.quote(path, safe="/~")
        if query:
            url += "?" + "&".join("%s=%s" % (urllib.parse.quote(k, safe="~"),
                                             urllib.parse.quote(v, safe="~"))
                                  for k, v in query)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, url, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()


def sigv4(method, path, query, headers, payload_hash, ak, sk, when=None, region="us-east-1"):
    """A small independent SigV4 signer (for requests boto3 will not make)."""
    t = when or datetime.datetime.utcnow()
    amz = t.strftime("%Y%m%dT%H%M%SZ")
    scope = "%s/%s/s3/aws4_request" % (amz[:8], region)
    h = {k.lower(): str(v) for k, v in headers.items()}
    h["x-amz-date"] = amz
    h["x-amz-content-sha256"] = payload_hash
    names = sorted(h)
    creq = "\n".join([
        method, urllib.parse.quote(path, safe="/~"),
        "&".join("%s=%s" % (urllib.parse.quote(k, safe="~"), urllib.parse.quote(v, safe="~"))
                 for k, v in sorted(query)),
        "".join("%s:%s\n" % (n, " ".join(h[n].split())) for n in names),
        ";".join(names), payload_hash])
    sts = "\n".join(["AWS4-HMAC-SHA256", amz, scope, hashlib.sha256(creq.encode()).hexdigest()])
    key = ("AWS4" + sk).encode()
    for part in (amz[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
    out = {"x-amz-date": amz, "x-amz-content-sha256": payload_hash,
           "Authorization": "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s"
           % (ak, scope, ";".join(names), sig)}
    return out, key, sig, amz, scope


@pytest.fixture
def gateway(cluster, tmp_path):
    g = Gateway(cluster, tmp_path)
    yield g
    g.stop()


@pytest.fixture
def s3(gateway):
    return gateway.client()


def code(exc):
    return exc.value.response["Error"]["Code"], \
        exc.value.response["ResponseMetadata"]["HTTPStatusCode"]


def md5(b):
    return '"%s"' % hashlib.md5(b).hexdigest()


def xml_code(body):
    s = body.decode(errors="replace")
    return s.split("<Code>")[1].split("</Code>")[0] if "<Code>" in s else s


# ---- buckets ----

def test_buckets(s3, cluster):
    assert s3.list_buckets()["Buckets"] == []
    s3.create_bucket(Bucket="alpha")
    s3.create_bucket(Bucket="beta",
                     CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["alpha", "beta"]
    assert s3.head_bucket(Bucket="alpha")["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_bucket_location(Bucket="alpha")["LocationConstraint"] is None
    # a bucket is a top-level folder
    assert sorted(cluster.cli("ls", "/").stdout.split()) == [b"alpha", b"beta"]
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket="alpha")
    assert code(e) == ("BucketAlreadyOwnedByYou", 409)
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket="Bad_Name")
    assert code(e) == ("InvalidBucketName", 400)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket="missing")
    assert code(e)[1] == 404
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket="missing")
    assert code(e) == ("NoSuchBucket", 404)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="missing", Key="k", Body=b"x")
    assert code(e) == ("NoSuchBucket", 404)
    s3.put_object(Bucket="alpha", Key="d/k", Body=b"x")
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket="alpha")
    assert code(e) == ("BucketNotEmpty", 409)
    s3.delete_object(Bucket="alpha", Key="d/k")
    s3.delete_bucket(Bucket="alpha")
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket="alpha")
    assert code(e) == ("NoSuchBucket", 404)
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["beta"]
    assert cluster.cli("ls", "/").stdout.split() == [b"beta"]


# ---- objects ----

def test_put_get_head_delete(s3, cluster):
    s3.create_bucket(Bucket="bkt")
    body = os.urandom(3 * MiB + 17)
    r = s3.put_object(Bucket="bkt", Key="dir/sub/obj.bin", Body=body, ContentType="image/jpeg",
                      Metadata={"owner": "alice", "Mixed-Case": "v"}, CacheControl="no-cache",
                      ContentDisposition="attachment")
    assert r["ETag"] == md5(body)
    o = s3.get_object(Bucket="bkt", Key="dir/sub/obj.bin")
    assert o["Body"].read() == body
    assert o["ETag"] == md5(body) and o["ContentLength"] == len(body)
    assert o["ContentType"] == "image/jpeg"
    assert o["Metadata"] == {"owner": "alice", "mixed-case": "v"}
    assert o["CacheControl"] == "no-cache" and o["ContentDisposition"] == "attachment"
    h = s3.head_object(Bucket="bkt", Key="dir/sub/obj.bin")
    assert h["ContentLength"] == len(body) and h["ETag"] == md5(body)
    assert h["Metadata"]["owner"] == "alice"
    # the object is the file, byte for byte
    assert cluster.cli("cat", "/bkt/dir/sub/obj.bin").stdout == body
    # empty object, overwrite
    s3.put_object(Bucket="bkt", Key="empty", Body=b"")
    assert s3.get_object(Bucket="bkt", Key="empty")["Body"].read() == b""
    assert s3.head_object(Bucket="bkt", Key="empty")["ETag"] == md5(b"")
    s3.put_object(Bucket="bkt", Key="empty", Body=b"now full")
    assert s3.get_object(Bucket="bkt", Key="empty")["Body"].read() == b"now full"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="bkt", Key="nope")
    assert code(e) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="bkt", Key="nope")
    assert code(e)[1] == 404
    # a folder is not an object
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="bkt", Key="dir")
    assert code(e) == ("NoSuchKey", 404)
    s3.delete_object(Bucket="bkt", Key="dir/sub/obj.bin")
    s3.delete_object(Bucket="bkt", Key="never-was")  # 204, as S3
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="bkt", Key="dir/sub/obj.bin")
    assert code(e)[1] == 404
    # the emptied folders went with it (the gateway's hidden folders stay)
    assert [n for n in cluster.cli("ls", "/bkt").stdout.split()
            if not n.startswith(b".stoker-")] == [b"empty"]


def test_range_and_conditionals(s3):
    s3.create_bucket(Bucket="bkt")
    body = bytes(range(256)) * 40
    etag = s3.put_object(Bucket="bkt", Key="k", Body=body)["ETag"]

    def get(**kw):
        return s3.get_object(Bucket="bkt", Key="k", **kw)

    o = get(Range="bytes=0-0")
    assert o["Body"].read() == body[:1] and o["ContentRange"] == "bytes 0-0/%d" % len(body)
    assert o["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert get(Range="bytes=100-199")["Body"].read() == body[100:200]
    assert get(Range="bytes=-10")["Body"].read() == body[-10:]
    assert get(Range="bytes=10000-")["Body"].read() == body[10000:]
    assert get(Range="bytes=10000-999999")["Body"].read() == body[10000:]
    with pytest.raises(ClientError) as e:
        get(Range="bytes=%d-" % len(body))
    assert code(e) == ("InvalidRange", 416)
    assert get(IfMatch=etag)["Body"].read() == body
    with pytest.raises(ClientError) as e:
        get(IfMatch='"0123"')
    assert code(e)[1] == 412
    with pytest.raises(ClientError) as e:
        get(IfNoneMatch=etag)
    assert code(e)[1] == 304
    assert get(IfNoneMatch='"other"')["Body"].read() == body
    future = datetime.datetime.utcnow() + datetime.timedelta(days=1)
    past = datetime.datetime.utcnow() - datetime.timedelta(days=1)
    with pytest.raises(ClientError) as e:
        get(IfModifiedSince=future)
    assert code(e)[1] == 304
    assert get(IfModifiedSince=past)["Body"].read() == body
    with pytest.raises(ClientError) as e:
        get(IfUnmodifiedSince=past)
    assert code(e)[1] == 412
    assert get(IfUnmodifiedSince=future)["Body"].read() == body
    # response-* overrides (what presigned download links use)
    o = get(ResponseContentType="text/csv", ResponseContentDisposition="inline")
    assert o["ContentType"] == "text/csv" and o["ContentDisposition"] == "inline"


# (no key is both an object and a folder: a file system cannot hold "a" and "a/b")
KEYS = ["a.b", "a/b", "a/c/d", "a/c/e", "a0", "a-", "ab/c", "b.", "b/x/y/z", "c d",
        "caf\u00e9", "z", "zz/top", "A", "_"]


def put_keys(s3, bucket, keys):
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())


def list_all_v2(s3, **kw):
    keys, prefixes, token = [], [], None
    while True:
        args = dict(kw)
        if token:
            args["ContinuationToken"] = token
        r = s3.list_objects_v2(Bucket="bkt", **args)
        keys += [c["Key"] for c in r.get("Contents", [])]
        prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        assert r["KeyCount"] == len(r.get("Contents", [])) + len(r.get("CommonPrefixes", []))
        if not r["IsTruncated"]:
            return keys, prefixes
        token = r["NextContinuationToken"]


def test_list_objects_order_and_pages(s3):
    s3.create_bucket(Bucket="bkt")
    put_keys(s3, "bkt", KEYS)
    # byte order, which walking folders naively gets wrong ("a.b" < "a/b" < "a0")
    want = sorted(KEYS, key=lambda k: k.encode())
    r = s3.list_objects_v2(Bucket="bkt")
    assert [c["Key"] for c in r["Contents"]] == want
    assert {c["Key"]: c["ETag"] for c in r["Contents"]} == {k: md5(k.encode()) for k in KEYS}
    assert all(c["Size"] == len(k.encode()) for c, k in zip(r["Contents"], want))
    for page in (1, 2, 3, 7):
        assert list_all_v2(s3, MaxKeys=page) == (want, [])
    # delimiter: folders roll up into common prefixes, also across pages
    keys, prefixes = list_all_v2(s3, Delimiter="/")
    assert keys == [k for k in want if "/" not in k]
    assert prefixes == ["a/", "ab/", "b/", "zz/"]
    for page in (1, 2):
        k2, p2 = list_all_v2(s3, Delimiter="/", MaxKeys=page)
        assert (sorted(k2 + p2)) == sorted(keys + prefixes)
    assert list_all_v2(s3, Prefix="a/") == (["a/b", "a/c/d", "a/c/e"], [])
    assert list_all_v2(s3, Prefix="a/", Delimiter="/") == (["a/b"], ["a/c/"])
    assert list_all_v2(s3, Prefix="a") == ([k for k in want if k.startswith("a")], [])
    assert list_all_v2(s3, Prefix="a/c/d") == (["a/c/d"], [])
    assert list_all_v2(s3, Prefix="nothing/here/") == ([], [])
    assert list_all_v2(s3, StartAfter="a/c/d") == (want[want.index("a/c/d") + 1:], [])
    # a delimiter other than '/'
    keys, prefixes = list_all_v2(s3, Delimiter=".")
    assert prefixes == ["a.", "b."] and "a.b" not in keys
    # v1 with markers, and encoding-type=url (boto3 asks for it and decodes)
    r = s3.list_objects(Bucket="bkt", MaxKeys=5)
    assert [c["Key"] for c in r["Contents"]] == want[:5] and r["IsTruncated"]
    r2 = s3.list_objects(Bucket="bkt", Marker=r["NextMarker"])
    assert [c["Key"] for c in r2["Contents"]] == want[5:]
    r = s3.list_objects(Bucket="bkt", Delimiter="/", MaxKeys=3)
    assert r["IsTruncated"]
    r2 = s3.list_objects(Bucket="bkt", Delimiter="/", Marker=r["NextMarker"])
    got = [c["Key"] for c in r.get("Contents", []) + r2.get("Contents", [])] + \
        [p["Prefix"] for p in r.get("CommonPrefixes", []) + r2.get("CommonPrefixes", [])]
    assert sorted(got) == sorted([k for k in want if "/" not in k] + ["a/", "ab/", "b/", "zz/"])
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket="bkt", ContinuationToken="!!not-a-token")
    assert code(e) == ("InvalidArgument", 400)
    # the gateway's own folders never show
    assert not [k for k in list_all_v2(s3)[0] if "stoker" in k]


def list_all_v1(s3, page=None, **kw):
    """Every key and common prefix of a v1 listing, page by page as S3 documents
    it: the next marker is NextMarker, or without a delimiter the last key."""
    keys, prefixes, marker = [], [], None
    for _ in range(100):
        args = dict(kw)
        if page:
            args["MaxKeys"] = page
        if marker:
            args["Marker"] = marker
        r = s3.list_objects(Bucket="bkt", **args)
        # encoded as S3 encodes it (encoding-type=url); botocore leaves v1's
        # Prefix undecoded (boto/boto3#3534)
        assert urllib.parse.unquote(r.get("Prefix", "")) == kw.get("Prefix", "")
        assert r.get("Marker", "") == (marker or "")
        got = [c["Key"] for c in r.get("Contents", [])]
        cps = [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        assert all(k.startswith(kw.get("Prefix", "")) for k in got + cps), (got, cps)
        if page:
            assert len(got) + len(cps) <= page
        keys += got
        prefixes += cps
        if not r["IsTruncated"]:
            return keys, prefixes
        marker = r.get("NextMarker") or got[-1]
    raise AssertionError("listing does not end")


def test_list_objects_v1_prefix(s3):
    s3.create_bucket(Bucket="bkt")
    put_keys(s3, "bkt", KEYS)
    want = sorted(KEYS, key=lambda k: k.encode())
    for page in (None, 1, 2, 5):
        assert list_all_v1(s3, page) == (want, [])
        assert list_all_v1(s3, page, Prefix="a/") == (["a/b", "a/c/d", "a/c/e"], [])
        assert list_all_v1(s3, page, Prefix="a") == ([k for k in want if k.startswith("a")],
                                                     [])
        assert list_all_v1(s3, page, Prefix="a/c/") == (["a/c/d", "a/c/e"], [])
        assert list_all_v1(s3, page, Prefix="a/c/d") == (["a/c/d"], [])
        assert list_all_v1(s3, page, Prefix="a/c/d/") == ([], [])
        assert list_all_v1(s3, page, Prefix="nothing") == ([], [])
        assert list_all_v1(s3, page, Prefix="caf\u00e9") == (["caf\u00e9"], [])
        assert list_all_v1(s3, page, Prefix="a/", Delimiter="/") == (["a/b"], ["a/c/"])
        assert list_all_v1(s3, page, Prefix="a", Delimiter="/") == \
            (["a-", "a.b", "a0"], ["a/", "ab/"])
        assert list_all_v1(s3, page, Prefix="b", Delimiter="/") == (["b."], ["b/"])
        assert list_all_v1(s3, page, Delimiter="/") == \
            ([k for k in want if "/" not in k], ["a/", "ab/", "b/", "zz/"])
    # a marker before, inside and after the prefix
    r = s3.list_objects(Bucket="bkt", Prefix="a/", Marker="a/b")
    assert [c["Key"] for c in r["Contents"]] == ["a/c/d", "a/c/e"]
    r = s3.list_objects(Bucket="bkt", Prefix="a/", Marker="a")
    assert [c["Key"] for c in r["Contents"]] == ["a/b", "a/c/d", "a/c/e"]
    r = s3.list_objects(Bucket="bkt", Prefix="a/", Marker="a0")
    assert "Contents" not in r and not r["IsTruncated"]
    # a common prefix as the marker: nothing under it comes again
    r = s3.list_objects(Bucket="bkt", Prefix="a", Delimiter="/", Marker="a/")
    assert [c["Key"] for c in r["Contents"]] == ["a0"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["ab/"]
    r = s3.list_objects(Bucket="bkt", Prefix="a/", Delimiter="/", MaxKeys=1)
    assert [c["Key"] for c in r["Contents"]] == ["a/b"] and r["IsTruncated"]
    assert r["NextMarker"] == "a/b"


def list_all_uploads(s3, page=None, **kw):
    """(key, upload id) of every upload and the common prefixes, page by page with
    NextKeyMarker / NextUploadIdMarker."""
    ups, prefixes, km, um = [], [], None, None
    for _ in range(100):
        args = dict(kw)
        if page:
            args["MaxUploads"] = page
        if km is not None:
            args["KeyMarker"] = km
            args["UploadIdMarker"] = um
        r = s3.list_multipart_uploads(Bucket="bkt", **args)
        got = [(u["Key"], u["UploadId"]) for u in r.get("Uploads", [])]
        cps = [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        assert r.get("Prefix", "") == kw.get("Prefix", "")
        if page:
            assert len(got) + len(cps) <= page
            assert r["MaxUploads"] == page
        ups += got
        prefixes += cps
        if not r["IsTruncated"]:
            return ups, prefixes
        km, um = r["NextKeyMarker"], r["NextUploadIdMarker"]
    raise AssertionError("listing does not end")


def test_list_multipart_uploads(s3):
    s3.create_bucket(Bucket="bkt")
    keys = ["a/1", "a/2", "a.x", "b", "b/c/d", "b/c/e", "c d", "z"]
    ids = {k: s3.create_multipart_upload(Bucket="bkt", Key=k)["UploadId"] for k in keys}
    # two more uploads of "a/2", initiated later and with a smaller ID than the
    # first: S3 lists one key's uploads by initiation time, so paging must not skip
    # them by comparing IDs
    time.sleep(1.1)
    while True:
        later = s3.create_multipart_upload(Bucket="bkt", Key="a/2")["UploadId"]
        if later < ids["a/2"]:
            break
        s3.abort_multipart_upload(Bucket="bkt", Key="a/2", UploadId=later)
    a2 = [ids["a/2"], later]
    every = [("a.x", ids["a.x"]), ("a/1", ids["a/1"])] + [("a/2", i) for i in a2] + \
        [(k, ids[k]) for k in ["b", "b/c/d", "b/c/e", "c d", "z"]]
    for page in (None, 1, 2, 3):
        assert list_all_uploads(s3, page) == (every, [])
        assert list_all_uploads(s3, page, Prefix="a/") == (every[1:4], [])
        assert list_all_uploads(s3, page, Prefix="b/c/") == (every[5:7], [])
        assert list_all_uploads(s3, page, Prefix="nothing") == ([], [])
        assert list_all_uploads(s3, page, Delimiter="/") == \
            ([every[0], every[4], every[7], every[8]], ["a/", "b/"])
        assert list_all_uploads(s3, page, Prefix="b", Delimiter="/") == \
            ([every[4]], ["b/"])
        assert list_all_uploads(s3, page, Prefix="b/", Delimiter="/") == ([], ["b/c/"])
        assert list_all_uploads(s3, page, Prefix="a/", Delimiter="/") == (every[1:4], [])
    # key-marker alone: keys after it; with upload-id-marker: that key's later uploads too
    r = s3.list_multipart_uploads(Bucket="bkt", KeyMarker="a/2")
    assert [u["Key"] for u in r["Uploads"]] == ["b", "b/c/d", "b/c/e", "c d", "z"]
    r = s3.list_multipart_uploads(Bucket="bkt", KeyMarker="a/2", UploadIdMarker=a2[0])
    assert [(u["Key"], u["UploadId"]) for u in r["Uploads"]][:2] == [("a/2", a2[1]),
                                                                     ("b", ids["b"])]
    assert r["KeyMarker"] == "a/2" and r["UploadIdMarker"] == a2[0]
    r = s3.list_multipart_uploads(Bucket="bkt", KeyMarker="b/", Delimiter="/")
    assert [u["Key"] for u in r["Uploads"]] == ["c d", "z"] and "CommonPrefixes" not in r
    r = s3.list_multipart_uploads(Bucket="bkt", MaxUploads=2)
    assert r["IsTruncated"] and (r["NextKeyMarker"], r["NextUploadIdMarker"]) == every[1]
    assert [(u["Key"], u["UploadId"]) for u in r["Uploads"]] == every[:2]
    # one key's uploads by initiation time (keys in key order: their times may go back)
    r = s3.list_multipart_uploads(Bucket="bkt", Prefix="a/2")
    assert [u["UploadId"] for u in r["Uploads"]] == a2
    assert [u["Initiated"] for u in r["Uploads"]] == sorted(u["Initiated"] for u in r["Uploads"])


def test_folder_markers(s3, cluster):
    s3.create_bucket(Bucket="bkt")
    s3.put_object(Bucket="bkt", Key="empty/dir/", Body=b"")
    assert cluster.cli("stat", "/bkt/empty/dir").stdout.count(b"directory") == 1
    r = s3.list_objects_v2(Bucket="bkt")
    assert [c["Key"] for c in r["Contents"]] == ["empty/dir/"]
    assert s3.head_object(Bucket="bkt", Key="empty/dir/")["ContentLength"] == 0
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="bkt", Key="empty/dir/", Body=b"data")
    assert code(e)[1] == 409
    # a key cannot be both an object and a folder on a file system
    s3.put_object(Bucket="bkt", Key="f", Body=b"x")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="bkt", Key="f/g", Body=b"x")
    assert code(e) == ("KeyConflict", 409)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="bkt", Key="empty", Body=b"x")
    assert code(e) == ("KeyConflict", 409)
    s3.delete_object(Bucket="bkt", Key="empty/dir/")
    assert [c["Key"] for c in s3.list_objects_v2(Bucket="bkt")["Contents"]] == ["f"]


def test_delete_objects(s3):
    s3.create_bucket(Bucket="bkt")
    put_keys(s3, "bkt", ["x/1", "x/2", "y", "z"])
    r = s3.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": "x/1"}, {"Key": "y"},
                                                          {"Key": "not-there"},
                                                          {"Key": "bad/../key"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["not-there", "x/1", "y"]
    assert [(e["Key"], e["Code"]) for e in r["Errors"]] == [("bad/../key", "InvalidArgument")]
    r = s3.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": "z"}], "Quiet": True})
    assert "Deleted" not in r
    assert [c["Key"] for c in s3.list_objects_v2(Bucket="bkt")["Contents"]] == ["x/2"]


def test_copy_object(s3):
    s3.create_bucket(Bucket="bkt")
    s3.create_bucket(Bucket="cbk")
    body = os.urandom(MiB + 5)
    s3.put_object(Bucket="bkt", Key="src", Body=body, ContentType="text/plain",
                  Metadata={"k": "v"})
    r = s3.copy_object(Bucket="cbk", Key="deep/copy", CopySource={"Bucket": "bkt", "Key": "src"})
    assert r["CopyObjectResult"]["ETag"] == md5(body)
    o = s3.get_object(Bucket="cbk", Key="deep/copy")
    assert o["Body"].read() == body and o["ContentType"] == "text/plain"
    assert o["Metadata"] == {"k": "v"}
    s3.copy_object(Bucket="bkt", Key="re", CopySource="bkt/src", MetadataDirective="REPLACE",
                   ContentType="app/x", Metadata={"n": "1"})
    h = s3.head_object(Bucket="bkt", Key="re")
    assert h["ContentType"] == "app/x" and h["Metadata"] == {"n": "1"}
    # onto itself: only with new metadata, and then only the metadata changes
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket="bkt", Key="src", CopySource="bkt/src")
    assert code(e) == ("InvalidRequest", 400)
    s3.copy_object(Bucket="bkt", Key="src", CopySource="bkt/src", MetadataDirective="REPLACE",
                   ContentType="text/html")
    h = s3.head_object(Bucket="bkt", Key="src")
    assert h["ContentType"] == "text/html" and h["ETag"] == md5(body)
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket="bkt", Key="x", CopySource="bkt/missing")
    assert code(e) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket="bkt", Key="x", CopySource="bkt/src", CopySourceIfMatch='"nope"')
    assert code(e)[1] == 412


# ---- multipart ----

def test_multipart(s3, cluster):
    s3.create_bucket(Bucket="bkt")
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(5 * MiB)]
    up = s3.create_multipart_upload(Bucket="bkt", Key="big/obj", ContentType="video/mp4",
                                    Metadata={"m": "1"})
    uid = up["UploadId"]
    etags = []
    for i, p in enumerate(parts):
        etags.append(s3.upload_part(Bucket="bkt", Key="big/obj", UploadId=uid, PartNumber=i + 1,
                                    Body=p)["ETag"])
    assert etags == [md5(p) for p in parts]
    # staged parts are never an object
    assert "Contents" not in s3.list_objects_v2(Bucket="bkt")
    with pytest.raises(ClientError):
        s3.head_object(Bucket="bkt", Key="big/obj")
    lp = s3.list_parts(Bucket="bkt", Key="big/obj", UploadId=uid)
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in lp["Parts"]] == \
        [(i + 1, etags[i], 5 * MiB) for i in range(3)]
    lp = s3.list_parts(Bucket="bkt", Key="big/obj", UploadId=uid, MaxParts=2)
    assert lp["IsTruncated"] and len(lp["Parts"]) == 2
    lp = s3.list_parts(Bucket="bkt", Key="big/obj", UploadId=uid,
                       PartNumberMarker=lp["NextPartNumberMarker"])
    assert [p["PartNumber"] for p in lp["Parts"]] == [3]
    ups = s3.list_multipart_uploads(Bucket="bkt")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in ups] == [("big/obj", uid)]
    # wrong ETag, wrong order, unknown upload
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket="bkt", Key="big/obj", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": etags[1]}]})
    assert code(e) == ("InvalidPart", 400)
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket="bkt", Key="big/obj", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": 2, "ETag": etags[1]}, {"PartNumber": 1, "ETag": etags[0]}]})
    assert code(e) == ("InvalidPartOrder", 400)
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket="bkt", Key="big/obj", UploadId="0" * 32, PartNumber=1, Body=b"x")
    assert code(e) == ("NoSuchUpload", 404)
    r = s3.complete_multipart_upload(Bucket="bkt", Key="big/obj", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": i + 1, "ETag": etags[i]} for i in range(3)]})
    want = '"%s-3"' % hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    assert r["ETag"] == want
    o = s3.get_object(Bucket="bkt", Key="big/obj")
    assert o["ETag"] == want and o["ContentType"] == "video/mp4" and o["Metadata"] == {"m": "1"}
    data = o["Body"].read()
    assert data == b"".join(parts)
    assert hashlib.sha256(cluster.cli("cat", "/bkt/big/obj").stdout).digest() == \
        hashlib.sha256(data).digest()
    assert s3.list_multipart_uploads(Bucket="bkt").get("Uploads", []) == []
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket="bkt", Key="big/obj", UploadId=uid)
    assert code(e) == ("NoSuchUpload", 404)


def test_multipart_small_part_copy_and_abort(s3):
    s3.create_bucket(Bucket="bkt")
    src = os.urandom(6 * MiB)
    s3.put_object(Bucket="bkt", Key="src", Body=src)
    uid = s3.create_multipart_upload(Bucket="bkt", Key="k")["UploadId"]
    e1 = s3.upload_part(Bucket="bkt", Key="k", UploadId=uid, PartNumber=1, Body=b"small")["ETag"]
    e2 = s3.upload_part(Bucket="bkt", Key="k", UploadId=uid, PartNumber=2, Body=b"last")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket="bkt", Key="k", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert code(e) == ("EntityTooSmall", 400)
    # replace part 1 by a copy of 5 MiB + 1 of src, part 2 by a range copy
    c1 = s3.upload_part_copy(Bucket="bkt", Key="k", UploadId=uid, PartNumber=1,
                             CopySource={"Bucket": "bkt", "Key": "src"},
                             CopySourceRange="bytes=0-%d" % (5 * MiB))
    c2 = s3.upload_part_copy(Bucket="bkt", Key="k", UploadId=uid, PartNumber=2,
                             CopySource={"Bucket": "bkt", "Key": "src"},
                             CopySourceRange="bytes=100-199")
    assert c2["CopyPartResult"]["ETag"] == md5(src[100:200])
    # a range past the source's end is refused, not clamped; malformed ones too
    for rng, msg in [("bytes=100-%d" % (6 * MiB), "source object of size: %d" % (6 * MiB)),
                     ("bytes=%d-%d" % (6 * MiB, 6 * MiB), "of size"),
                     ("bytes=5-2", "bytes=first-last"), ("bytes=-5", "bytes=first-last"),
                     ("bytes=5-", "bytes=first-last"), ("bytes=0-1,3-4", "bytes=first-last"),
                     ("0-1", "bytes=first-last"), ("bytes=0-99999999999999999999", "first-last")]:
        with pytest.raises(ClientError) as e:
            s3.upload_part_copy(Bucket="bkt", Key="k", UploadId=uid, PartNumber=3,
                                CopySource={"Bucket": "bkt", "Key": "src"},
                                CopySourceRange=rng)
        assert code(e) == ("InvalidArgument", 400), rng
        assert msg in e.value.response["Error"]["Message"], (rng, e.value.response)
    assert [p["PartNumber"] for p in s3.list_parts(Bucket="bkt", Key="k",
                                                   UploadId=uid)["Parts"]] == [1, 2]
    s3.complete_multipart_upload(Bucket="bkt", Key="k", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": c1["CopyPartResult"]["ETag"]},
                  {"PartNumber": 2, "ETag": c2["CopyPartResult"]["ETag"]}]})
    assert s3.get_object(Bucket="bkt", Key="k")["Body"].read() == src[:5 * MiB + 1] + src[100:200]
    uid = s3.create_multipart_upload(Bucket="bkt", Key="gone")["UploadId"]
    s3.upload_part(Bucket="bkt", Key="gone", UploadId=uid, PartNumber=1, Body=b"x")
    s3.abort_multipart_upload(Bucket="bkt", Key="gone", UploadId=uid)
    with pytest.raises(ClientError) as e:
        s3.abort_multipart_upload(Bucket="bkt", Key="gone", UploadId=uid)
    assert code(e) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError):
        s3.head_object(Bucket="bkt", Key="gone")
    # a bucket holding only an unfinished upload can go
    s3.create_bucket(Bucket="tmp")
    s3.create_multipart_upload(Bucket="tmp", Key="k")
    s3.delete_bucket(Bucket="tmp")


# ---- authentication ----

def test_auth_errors(gateway, s3):
    s3.create_bucket(Bucket="bkt")
    s3.put_object(Bucket="bkt", Key="k", Body=b"secret data")
    assert gateway.client(AK2, SK2).get_object(Bucket="bkt", Key="k")["Body"].read() == \
        b"secret data"
    with pytest.raises(ClientError) as e:
        gateway.client(AK, "wrong-secret").get_object(Bucket="bkt", Key="k")
    assert code(e) == ("SignatureDoesNotMatch", 403)
    with pytest.raises(ClientError) as e:
        gateway.client("AKIDUNKNOWN", SK).list_buckets()
    assert code(e) == ("InvalidAccessKeyId", 403)
    st, _, body = gateway.raw("GET", "/bkt/k", sign=False)
    assert (st, xml_code(body)) == (403, "AccessDenied")
    old = datetime.datetime.utcnow() - datetime.timedelta(hours=1)
    st, _, body = gateway.raw("GET", "/bkt/k", when=old)
    assert (st, xml_code(body)) == (403, "RequestTimeTooSkewed")
    st, _, body = gateway.raw("GET", "/bkt/k")
    assert (st, body) == (200, b"secret data")
    # the body must match the signed x-amz-content-sha256
    st, _, body = gateway.raw("PUT", "/bkt/k", body=b"tampered", payload_hash=EMPTY_SHA)
    assert (st, xml_code(body)) == (400, "XAmzContentSHA256Mismatch")
    st, _, body = gateway.raw("PUT", "/bkt/k", body=b"tampered",
                              headers={"Content-MD5": base64.b64encode(b"0" * 16).decode()})
    assert (st, xml_code(body)) == (400, "BadDigest")
    assert s3.get_object(Bucket="bkt", Key="k")["Body"].read() == b"secret data"
    st, _, body = gateway.raw("GET", "/bkt/k", headers={"Authorization": "AWS AKID:c2ln"},
                              sign=False)
    assert st in (400, 403)


def test_presigned_urls(gateway, s3):
    s3.create_bucket(Bucket="bkt")
    s3.put_object(Bucket="bkt", Key="dir/file name+x.txt", Body=b"shared")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "bkt",
                                                          "Key": "dir/file name+x.txt"},
                                    ExpiresIn=300)
    assert urllib.request.urlopen(url).read() == b"shared"
    bad = url.replace("Signature=", "Signature=0")[:-1]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad)
    assert e.value.code == 403
    put = s3.generate_presigned_url("put_object", Params={"Bucket": "bkt", "Key": "up"},
                                    ExpiresIn=300)
    req = urllib.request.Request(put, data=b"via presigned put", method="PUT")
    assert urllib.request.urlopen(req).status == 200
    assert s3.get_object(Bucket="bkt", Key="up")["Body"].read() == b"via presigned put"
    short = s3.generate_presigned_url("get_object", Params={"Bucket": "bkt", "Key": "up"},
                                      ExpiresIn=1)
    time.sleep(2.1)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(short)
    assert e.value.code == 403 and b"expired" in e.value.read()


def streaming_body(key, amz, scope, seed, chunks):
    out, prev = b"", seed
    for c in chunks + [b""]:
        sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz, scope, prev, EMPTY_SHA,
                         hashlib.sha256(c).hexdigest()])
        prev = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        out += b"%x;chunk-signature=%s\r\n%s\r\n" % (len(c), prev.encode(), c)
    return out


def test_streaming_chunked_signatures(gateway, s3):
    """STREAMING-AWS4-HMAC-SHA256-PAYLOAD, as aws-sdk clients send large PUTs."""
    s3.create_bucket(Bucket="bkt")
    chunks = [os.urandom(64 * 1024), os.urandom(64 * 1024), os.urandom(1000)]
    data = b"".join(chunks)

    def put(key, tamper=False):
        hdrs = {"host": "127.0.0.1:%d" % gateway.port, "content-encoding": "aws-chunked",
                "x-amz-decoded-content-length": str(len(data))}
        signed, skey, seed, amz, scope = sigv4("PUT", "/bkt/" + key, (), hdrs,
                                               "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", AK, SK)
        body = streaming_body(skey, amz, scope, seed, chunks)
        if tamper:  # flip one payload byte: its chunk signature no longer holds
            i = body.index(b"\r\n") + 10
            body = body[:i] + bytes([body[i] ^ 1]) + body[i + 1:]
        hdrs.update(signed)
        hdrs["content-length"] = str(len(body))
        return gateway.raw("PUT", "/bkt/" + key, body=body, headers=hdrs, sign=False)

    st, h, _ = put("streamed")
    assert st == 200 and h["ETag"] == md5(data)
    o = s3.get_object(Bucket="bkt", Key="streamed")
    assert o["Body"].read() == data and o.get("ContentEncoding") is None
    st, _, body = put("tampered", tamper=True)
    assert (st, xml_code(body)) == (403, "SignatureDoesNotMatch")
    with pytest.raises(ClientError):
        s3.head_object(Bucket="bkt", Key="tampered")


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def b64(b):
    return base64.b64encode(b).decode()


def test_flexible_checksums(gateway, s3):
    """x-amz-checksum-* as headers, and as aws-chunked trailers (newer SDKs)."""
    s3.create_bucket(Bucket="bkt")
    data = os.urandom(70000)
    good = {"x-amz-checksum-crc32": b64(zlib.crc32(data).to_bytes(4, "big")),
            "x-amz-checksum-crc32c": b64(crc32c(data).to_bytes(4, "big")),
            "x-amz-checksum-sha1": b64(hashlib.sha1(data).digest()),
            "x-amz-checksum-sha256": b64(hashlib.sha256(data).digest())}
    for name, value in good.items():
        st, _, body = gateway.raw("PUT", "/bkt/ck", body=data, headers={name: value})
        assert st == 200, (name, body)
        st, _, body = gateway.raw("PUT", "/bkt/ck", body=data + b"!", headers={name: value})
        assert (st, xml_code(body)) == (400, "BadDigest"), name
    # STREAMING-UNSIGNED-PAYLOAD-TRAILER: chunks without signatures, checksum last
    for crc, want in ((good["x-amz-checksum-crc32"], 200), (b64(b"\0\0\0\0"), 400)):
        body = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\nx-amz-checksum-crc32:%s\r\n\r\n" % (
            40000, data[:40000], len(data) - 40000, data[40000:], crc.encode())
        st, _, rb = gateway.raw(
            "PUT", "/bkt/trailer", body=body, payload_hash="STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            headers={"content-encoding": "aws-chunked", "x-amz-trailer": "x-amz-checksum-crc32",
                     "x-amz-decoded-content-length": str(len(data))})
        assert st == want, rb
    assert s3.get_object(Bucket="bkt", Key="trailer")["Body"].read() == data
    assert s3.get_object(Bucket="bkt", Key="ck")["Body"].read() == data


# ---- hostile input ----

def test_path_traversal_refused(gateway, s3, cluster):
    s3.create_bucket(Bucket="bkt")
    cluster.cli("put", "-", "/outside", input=b"keep me")
    for key in ["../outside", "a/../../outside", "a//b", "./a", "a/./b", "/lead", "a/..",
                ".stoker-meta/x", ".stoker-upload/x", "x" * 256, "a/" + "y" * 256,
                "k" * 1025]:
        st, _, body = gateway.raw("PUT", "/bkt/" + key, body=b"evil")
        assert st == 400, (key, st, body)
        assert xml_code(body) in ("InvalidArgument", "KeyTooLongError", "InvalidURI"), body
        st, _, body = gateway.raw("GET", "/bkt/" + key)
        assert st in (400, 404), (key, st)
    # encoded forms, sent exactly as written (no client normalisation) and signed
    # for what they decode to, so that the signature is not what refuses them
    for raw in ["/bkt/%2e%2e/outside", "/bkt/a%2f..%2f..%2foutside"]:
        st, _, body = gateway.raw("PUT", urllib.parse.unquote(raw), body=b"evil", raw_path=raw)
        assert (st, xml_code(body)) == (400, "InvalidArgument"), (raw, st, body)
    st, _, body = gateway.raw("PUT", "/bkt/x", body=b"evil", raw_path="/bkt/%")
    assert (st, xml_code(body)) == (400, "InvalidURI"), body
    # NUL: its own refusal (400 InvalidArgument saying so), in a key, a copy source and
    # a parameter. The same signer gets the same request without the NUL accepted.
    st, _, body = gateway.raw("PUT", "/bkt/a\x00b", body=b"evil", raw_path="/bkt/a%00b")
    assert (st, xml_code(body)) == (400, "InvalidArgument"), body
    assert b"NUL" in body, body
    st, _, body = gateway.raw("GET", "/bkt/a\x00b", raw_path="/bkt/a%00b")
    assert (st, xml_code(body)) == (400, "InvalidArgument"), body
    st, _, body = gateway.raw("GET", "/bkt", query=[("list-type", "2"), ("prefix", "a\x00")])
    assert (st, xml_code(body)) == (400, "InvalidArgument"), body
    st, _, body = gateway.raw("PUT", "/bkt/a01b", body=b"fine")
    assert st == 200, body
    st, _, body = gateway.raw("PUT", "/bkt/copy", headers={"x-amz-copy-source": "/bkt/a%00b"})
    assert (st, xml_code(body)) == (400, "InvalidArgument") and b"NUL" in body, body
    st, _, body = gateway.raw("PUT", "/bkt/copy", headers={"x-amz-copy-source": "/bkt/a01b"})
    assert st == 200, body
    s3.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": "a01b"}, {"Key": "copy"}]})
    st, _, body = gateway.raw("GET", "/../outside")
    assert st in (400, 404)
    assert cluster.cli("cat", "/outside").stdout == b"keep me"
    assert sorted(cluster.cli("ls", "/").stdout.split()) == [b"bkt", b"outside"]
    assert "Contents" not in s3.list_objects_v2(Bucket="bkt")


def test_malformed_xml(gateway, s3):
    s3.create_bucket(Bucket="bkt")
    uid = s3.create_multipart_upload(Bucket="bkt", Key="k")["UploadId"]
    for body in [b"<Delete><Object><Key>a</Key></Object>", b"not xml at all",
                 b"<Wrong><Object><Key>a</Key></Object></Wrong>",
                 b'<!DOCTYPE x [<!ENTITY a "aaaa">]><Delete><Object><Key>&a;</Key></Object>'
                 b'</Delete>']:
        st, _, rb = gateway.raw("POST", "/bkt", body=body, query=[("delete", "")])
        assert (st, xml_code(rb)) == (400, "MalformedXML"), (body, rb)
    for body in [b"<CompleteMultipartUpload></CompleteMultipartUpload>",
                 b"<CompleteMultipartUpload><Part><PartNumber>x</PartNumber><ETag>e</ETag>"
                 b"</Part></CompleteMultipartUpload>", b"<<<"]:
        st, _, rb = gateway.raw("POST", "/bkt/k", body=body, query=[("uploadId", uid)])
        assert (st, xml_code(rb)) == (400, "MalformedXML"), (body, rb)
    st, _, rb = gateway.raw("PUT", "/newbucket", body=b"<CreateBucketConfiguration>")
    assert (st, xml_code(rb)) == (400, "MalformedXML")


def put_headers(gateway, path, length):
    hdrs = {"host": "127.0.0.1:%d" % gateway.port, "content-length": str(length)}
    hdrs.update(sigv4("PUT", path, (), hdrs, "UNSIGNED-PAYLOAD", AK, SK)[0])
    return ("PUT %s HTTP/1.1\r\n" % path + "".join("%s: %s\r\n" % kv for kv in hdrs.items()) +
            "\r\n").encode()


def test_disconnect_mid_put_leaves_nothing(gateway, s3, cluster):
    s3.create_bucket(Bucket="bkt")
    s3.put_object(Bucket="bkt", Key="obj", Body=b"old version")
    for key in ("obj", "new"):
        sock = socket.create_connection(("127.0.0.1", gateway.port))
        sock.sendall(put_headers(gateway, "/bkt/" + key, 64 * MiB))
        sock.sendall(os.urandom(3 * MiB))
        time.sleep(0.3)
        sock.close()
    deadline = time.time() + 15
    while time.time() < deadline:
        if b"client went away" in open(gateway.logfile, "rb").read() and \
                cluster.cli("ls", "/bkt/.stoker-upload").stdout.strip() == b"":
            break
        time.sleep(0.2)
    assert cluster.cli("ls", "/bkt/.stoker-upload").stdout.strip() == b"", gateway.log()
    assert s3.get_object(Bucket="bkt", Key="obj")["Body"].read() == b"old version"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="bkt", Key="new")
    assert code(e)[1] == 404
    # a body shorter than its Content-Length, then a stalled client: others are served
    stalled = socket.create_connection(("127.0.0.1", gateway.port))
    stalled.sendall(b"GET /b/obj HTTP/1.1\r\nHost: x\r\n")
    assert s3.get_object(Bucket="bkt", Key="obj")["Body"].read() == b"old version"
    stalled.close()


def test_hostile_requests_leave_gateway_serving(gateway, s3):
    s3.create_bucket(Bucket="bkt")
    s3.put_object(Bucket="bkt", Key="k", Body=b"fine")
    junk = [b"\x00\x01\x02garbage\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " +
            b"a" * 300000 + b"\r\n\r\n", b"GET /" + b"b" * 20000 + b" HTTP/1.1\r\n\r\n",
            b"PUT /b/k HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            b"GET /b/k?" + b"&".join(b"p%d=1" % i for i in range(100)) + b" HTTP/1.1\r\n"
            b"Host: x\r\n\r\n"]
    for j in junk:
        s = socket.create_connection(("127.0.0.1", gateway.port))
        try:
            s.sendall(j)
            s.settimeout(2)
            s.recv(4096)
        except OSError:
            pass
        s.close()
    # many idle connections at once
    idle = [socket.create_connection(("127.0.0.1", gateway.port)) for _ in range(200)]
    assert s3.get_object(Bucket="bkt", Key="k")["Body"].read() == b"fine"
    for s in idle:
        s.close()
    assert gateway.proc.poll() is None


def test_overwrite_is_atomic_for_readers(s3):
    s3.create_bucket(Bucket="bkt")
    a, b = b"A" * (2 * MiB), b"B" * (2 * MiB + 1)
    s3.put_object(Bucket="bkt", Key="k", Body=a)
    stop, bad, reads = threading.Event(), [], [0]

    def reader():
        while not stop.is_set():
            try:
                got = s3.get_object(Bucket="bkt", Key="k")["Body"].read()
            except (ClientError, botocore.exceptions.BotoCoreError) as e:
                bad.append(repr(e))
                continue
            reads[0] += 1
            if got not in (a, b):
                bad.append("torn read of %d bytes" % len(got))

    ts = [threading.Thread(target=reader) for _ in range(2)]
    for t in ts:
        t.start()
    for i in range(12):
        s3.put_object(Bucket="bkt", Key="k", Body=b if i % 2 == 0 else a)
    stop.set()
    for t in ts:
        t.join()
    assert not bad, bad[:5]
    assert reads[0] > 0


def test_concurrent_puts_keep_bytes_and_record_together(gateway, s3):
    """Racing PUTs to one key: whoever wins, its bytes come with its own ETag and
    metadata (a record written apart from the rename could pair A's bytes with
    B's record, which then matches no file and loses the ETag and metadata). Each
    round sends all bodies but their last byte, then the last bytes at once, so
    the commits overlap. Readers meanwhile must always get bytes, ETag and
    metadata of one and the same PUT."""
    s3.create_bucket(Bucket="bkt")
    path = "/bkt/race/k"
    s3.put_object(Bucket="bkt", Key="race/k", Body=b"first", Metadata={"who": "first"})
    stop, bad, reads = threading.Event(), [], [0]

    etags = {md5(b"first"): "first"}

    def reader():
        # HEAD over one kept-alive connection: quick, so it often lands between
        # two steps of a commit
        conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
        while not stop.is_set():
            hdrs = {"host": "127.0.0.1:%d" % gateway.port}
            hdrs.update(sigv4("HEAD", path, (), hdrs, EMPTY_SHA, AK, SK)[0])
            conn.request("HEAD", path, headers=hdrs)
            r = conn.getresponse()
            r.read()
            reads[0] += 1
            etag, who = r.getheader("ETag"), r.getheader("x-amz-meta-who")
            if r.status != 200 or etag not in etags or etags[etag] != who:
                bad.append((r.status, etag, who))
        conn.close()

    sizes = {md5(b"first"): 5}

    def lister():
        # a listing racing the renames: each entry's ETag is the MD5 of the bytes
        # whose size it shows, never the fallback of a file replaced meanwhile
        while not stop.is_set():
            for c in s3.list_objects_v2(Bucket="bkt", Prefix="race/").get("Contents", []):
                reads[0] += 1
                if sizes.get(c["ETag"]) != c["Size"]:
                    bad.append(("list", c["ETag"], c["Size"]))

    readers = [threading.Thread(target=reader) for _ in range(2)] + \
        [threading.Thread(target=lister)]
    for t in readers:
        t.start()
    for rnd in range(12):
        bodies = {w: (b"%s-%d-" % (w.encode(), rnd)) * (100 + 7 * i)
                  for i, w in enumerate(["alpha", "beta", "gamma", "delta", "eps", "zeta"])}
        etags.update({md5(b): w for w, b in bodies.items()})
        sizes.update({md5(b): len(b) for b in bodies.values()})
        socks = {}
        for w, body in bodies.items():
            hdrs = {"host": "127.0.0.1:%d" % gateway.port, "content-length": str(len(body)),
                    "content-type": "text/x-" + w, "x-amz-meta-who": w}
            hdrs.update(sigv4("PUT", path, (), hdrs, "UNSIGNED-PAYLOAD", AK, SK)[0])
            socks[w] = socket.create_connection(("127.0.0.1", gateway.port))
            socks[w].sendall(("PUT %s HTTP/1.1\r\n" % path +
                              "".join("%s: %s\r\n" % kv for kv in hdrs.items()) +
                              "\r\n").encode() + body[:-1])
        time.sleep(0.1)
        for w, sock in socks.items():
            sock.sendall(bodies[w][-1:])
        for w, sock in socks.items():
            st, rb = read_response(sock)
            sock.close()
            assert st == 200, (w, st, rb)
        o = s3.get_object(Bucket="bkt", Key="race/k")
        body = o["Body"].read()
        who = o["Metadata"].get("who")
        assert who in bodies, (rnd, o["Metadata"], o["ETag"])
        assert body == bodies[who], (rnd, who)
        assert o["ETag"] == md5(body), (rnd, who, o["ETag"])
        assert o["ContentType"] == "text/x-" + who
        head = s3.head_object(Bucket="bkt", Key="race/k")
        assert (head["ETag"], head["Metadata"]) == (o["ETag"], {"who": who})
        listed = s3.list_objects_v2(Bucket="bkt", Prefix="race/")["Contents"]
        assert [(c["Key"], c["ETag"]) for c in listed] == [("race/k", md5(body))]
    stop.set()
    for t in readers:
        t.join()
    assert not bad, bad[:5]
    assert reads[0] > 0


def read_response(sock):
    """Status and body of one HTTP/1.1 response with a Content-Length."""
    sock.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), body


def test_delete_bucket_racing_a_put_loses_nothing(gateway, s3, cluster):
    """A PUT that lands while DeleteBucket runs: either the bucket is deleted and
    the PUT failed, or the delete answers BucketNotEmpty and the object, its
    metadata and every multipart upload in flight are intact. (Removing the hidden
    folders before knowing that the bucket could go destroyed the uploads.)"""
    outcomes = set()
    # delay: how long after the delete is sent the PUT's last byte goes (< 0: before)
    for rnd, delay in enumerate([-0.05, -0.01, -0.003, 0.0, 0.003, 0.01, 0.03, 0.1]):
        bucket = "race%d" % rnd
        s3.create_bucket(Bucket=bucket)
        uploads = sorted(s3.create_multipart_upload(Bucket=bucket, Key="up/%02d" % i)
                         ["UploadId"] for i in range(60))
        body = b"the object %d " % rnd * 1000
        sock = socket.create_connection(("127.0.0.1", gateway.port))
        path = "/%s/k" % bucket
        hdrs = {"host": "127.0.0.1:%d" % gateway.port, "content-length": str(len(body)),
                "x-amz-meta-round": str(rnd)}
        hdrs.update(sigv4("PUT", path, (), hdrs, "UNSIGNED-PAYLOAD", AK, SK)[0])
        sock.sendall(("PUT %s HTTP/1.1\r\n" % path +
                      "".join("%s: %s\r\n" % kv for kv in hdrs.items()) +
                      "\r\n").encode() + body[:-1])
        time.sleep(0.2)  # the PUT's temporary file exists
        res = {}

        def delete():
            try:
                s3.delete_bucket(Bucket=bucket)
                res["delete"] = "ok"
            except ClientError as e:
                res["delete"] = e.response["Error"]["Code"]

        t = threading.Thread(target=delete)
        if delay < 0:
            sock.sendall(body[-1:])
            time.sleep(-delay)
            t.start()
        else:
            t.start()
            time.sleep(delay)
            sock.sendall(body[-1:])
        put_status, put_body = read_response(sock)
        sock.close()
        t.join()
        outcomes.add((res["delete"], put_status))
        if res["delete"] == "ok":
            assert put_status != 200, (rnd, "the PUT succeeded into a deleted bucket")
            assert (put_status, xml_code(put_body)) == (404, "NoSuchBucket"), put_body
            with pytest.raises(ClientError) as ei:
                s3.head_bucket(Bucket=bucket)
            assert code(ei)[1] == 404
            assert bucket.encode() not in cluster.cli("ls", "/").stdout
        else:
            assert res["delete"] == "BucketNotEmpty", res
            assert put_status == 200, (rnd, put_status, put_body)
            o = s3.get_object(Bucket=bucket, Key="k")
            assert o["Body"].read() == body and o["ETag"] == md5(body)
            assert o["Metadata"] == {"round": str(rnd)}
            got = s3.list_multipart_uploads(Bucket=bucket)
            assert sorted(u["UploadId"] for u in got.get("Uploads", [])) == uploads, rnd
            listed = s3.list_objects_v2(Bucket=bucket)
            assert [c["Key"] for c in listed["Contents"]] == ["k"]
    # no folder of a deleted bucket is left in the root
    assert not [n for n in cluster.cli("ls", "/").stdout.split() if n.startswith(b".stoker")]
    print("outcomes", sorted(outcomes))


# ---- objects and files are one ----

def test_objects_are_files(s3, cluster, tmp_path):
    s3.create_bucket(Bucket="bkt")
    local = tmp_path / "f.bin"
    data = os.urandom(2 * MiB + 3)
    local.write_bytes(data)
    cluster.cli("mkdir", "-p", "/bkt/from/cli")
    cluster.cli("put", str(local), "/bkt/from/cli/f.bin")
    o = s3.get_object(Bucket="bkt", Key="from/cli/f.bin")
    assert o["Body"].read() == data
    etag = o["ETag"]
    listed = s3.list_objects_v2(Bucket="bkt")["Contents"]
    assert [(c["Key"], c["Size"], c["ETag"]) for c in listed] == \
        [("from/cli/f.bin", len(data), etag)]
    assert s3.head_object(Bucket="bkt", Key="from/cli/f.bin")["ETag"] == etag  # stable
    # an object rewritten through the native client: new bytes, a new ETag, no stale record
    s3.put_object(Bucket="bkt", Key="obj", Body=b"from s3", ContentType="text/x-s3")
    assert cluster.cli("cat", "/bkt/obj").stdout == b"from s3"
    cluster.cli("put", "-", "/bkt/obj", input=b"rewritten natively")
    o = s3.get_object(Bucket="bkt", Key="obj")
    assert o["Body"].read() == b"rewritten natively"
    assert o["ETag"] != md5(b"from s3") and o["ContentType"] != "text/x-s3"
    cluster.cli("rm", "/bkt/obj")
    with pytest.raises(ClientError):
        s3.head_object(Bucket="bkt", Key="obj")
    # a folder of objects removed natively leaves their records behind; the key
    # the folder had is free again all the same
    s3.put_object(Bucket="bkt", Key="gone/inner", Body=b"1")
    cluster.cli("rm", "-r", "/bkt/gone")
    s3.put_object(Bucket="bkt", Key="gone", Body=b"now an object")
    assert s3.get_object(Bucket="bkt", Key="gone")["Body"].read() == b"now an object"


def test_objects_are_files_through_the_mount(gateway, s3, mount):
    """The same bytes through `stoker mount` and through S3, both ways."""
    s3.create_bucket(Bucket="bkt")
    mnt = mount.path
    # a file written through the mount is an object
    data = os.urandom(3 * MiB + 5)
    os.makedirs(os.path.join(mnt, "bkt", "from", "mount"))
    with open(os.path.join(mnt, "bkt", "from", "mount", "f.bin"), "wb") as f:
        f.write(data)
    o = s3.get_object(Bucket="bkt", Key="from/mount/f.bin")
    assert o["Body"].read() == data and o["ContentLength"] == len(data)
    etag = o["ETag"]
    assert s3.head_object(Bucket="bkt", Key="from/mount/f.bin")["ETag"] == etag
    listed = s3.list_objects_v2(Bucket="bkt")["Contents"]
    assert [(c["Key"], c["Size"], c["ETag"]) for c in listed] == \
        [("from/mount/f.bin", len(data), etag)]
    r = s3.get_object(Bucket="bkt", Key="from/mount/f.bin", Range="bytes=1000-1999")
    assert r["Body"].read() == data[1000:2000]
    # an object PUT is a file with the same bytes, its record in an xattr
    body = os.urandom(MiB + 7)
    s3.put_object(Bucket="bkt", Key="put/obj.bin", Body=body, Metadata={"k": "v"})
    path = os.path.join(mnt, "bkt", "put", "obj.bin")
    with open(path, "rb") as f:
        assert f.read() == body
    assert os.path.getsize(path) == len(body)
    rec = os.getxattr(path, "user.stoker.s3")
    assert hashlib.md5(body).hexdigest().encode() in rec
    # anyone who may write the file may write that attribute too: a forged record
    # brings at most metadata, never other response headers
    os.setxattr(path, "user.stoker.s3", rec + b"set-cookie: evil=1\ncontent-length: 3\n"
                b"x-amz-meta-added: yes\n")
    st, h, got = gateway.raw("GET", "/bkt/put/obj.bin")
    assert st == 200 and got == body, (st, len(got))
    h = {k.lower(): v for k, v in h.items()}
    assert h["x-amz-meta-added"] == "yes" and h["x-amz-meta-k"] == "v"
    assert "set-cookie" not in h and h["content-length"] == str(len(body))
    # changed in place through the mount: S3 serves the new bytes, not the old ETag
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"changed")
    o = s3.get_object(Bucket="bkt", Key="put/obj.bin")
    assert o["Body"].read() == body[:10] + b"changed" + body[17:]
    assert o["ETag"] != md5(body) and o["Metadata"] == {}
    # renamed and removed through the mount
    os.rename(path, os.path.join(mnt, "bkt", "put", "moved.bin"))
    assert s3.get_object(Bucket="bkt", Key="put/moved.bin")["Body"].read()[:10] == body[:10]
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="bkt", Key="put/obj.bin")
    assert code(e)[1] == 404
    os.remove(os.path.join(mnt, "bkt", "from", "mount", "f.bin"))
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="bkt", Key="from/mount/f.bin")
    assert code(e) == ("NoSuchKey", 404)


def test_root_subdir(cluster, tmp_path):
    cluster.cli("mkdir", "-p", "/tenants/one")
    g = Gateway(cluster, tmp_path, extra=["--root", "/tenants/one"])
    try:
        s3 = g.client()
        s3.create_bucket(Bucket="inner")
        s3.put_object(Bucket="inner", Key="k", Body=b"scoped")
        assert cluster.cli("cat", "/tenants/one/inner/k").stdout == b"scoped"
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["inner"]
    finally:
        g.stop()
    p = run([STOKER, "gateway", "s3", "--cluster", cluster.url, "--listen", "127.0.0.1:0",
             "--keys", str(g.keys), "--root", "/no/such"], check=False)
    assert p.returncode == 1 and b"--root /no/such" in p.stderr
    p = run([STOKER, "gateway", "s3", "--cluster", cluster.url], check=False,
            env={k: v for k, v in os.environ.items() if not k.startswith("STOKER_S3")})
    assert p.returncode == 1 and b"no access keys" in p.stderr


def test_leftovers_of_a_dead_gateway_are_swept(cluster, tmp_path):
    cluster.cli("mkdir", "-p", "/swept/.stoker-upload")
    cluster.cli("put", "-", "/swept/.stoker-upload/u-left-by-a-crash", input=b"partial")
    time.sleep(2.1)  # older than --sweep-age 1 at a one-second mtime resolution
    g = Gateway(cluster, tmp_path, extra=["--sweep-age", "1"])
    try:
        deadline = time.time() + 10
        while time.time() < deadline and \
                b"removed 1 temporary files" not in open(g.logfile, "rb").read():
            time.sleep(0.1)
        assert b"removed 1 temporary files" in open(g.logfile, "rb").read(), g.log()
        assert cluster.cli("ls", "/swept/.stoker-upload").stdout.strip() == b""
    finally:
        g.stop()


def test_bounded_memory_large_object(s3, gateway, tmp_path):
    s3.create_bucket(Bucket="bkt")
    size = 160 * MiB
    src = tmp_path / "big"
    with open(src, "wb") as f:
        for i in range(size // MiB):
            f.write(bytes([i % 251]) * MiB)
    # The gateway's own memory (RssAnon), sampled through the upload and the download.
    # Not VmHWM: on a storage node the client maps the chunk files it reads
    # (short-circuit reads), and those page-cache pages count in RSS as RssFile.
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            with open("/proc/%d/status" % gateway.proc.pid) as f:
                anon = [int(l.split()[1]) for l in f if l.startswith("RssAnon")][0]
            peak[0] = max(peak[0], anon)
            done.wait(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        cfg = boto3.s3.transfer.TransferConfig(multipart_threshold=1 << 40, use_threads=False)
        s3.upload_file(str(src), "bkt", "big", Config=cfg)
        body = s3.get_object(Bucket="bkt", Key="big")["Body"]
        h = hashlib.sha256()
        for piece in iter(lambda: body.read(MiB), b""):
            h.update(piece)
    finally:
        done.set()
        sampler.join()
    with open(src, "rb") as f:
        assert h.hexdigest() == hashlib.file_digest(f, "sha256").hexdigest()
    assert 0 < peak[0] < 120 * 1024, \
        "gateway peak anonymous RSS %d KiB for a %d MiB object" % (peak[0], size // MiB)


# ---- real clients ----

def aws_env(tmp_path):
    cfg = tmp_path / "aws-config"
    cfg.write_text("[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n"
                   "  multipart_threshold = 8MB\n  multipart_chunksize = 5MB\n")
    return dict(os.environ, AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK,
                AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=str(cfg),
                AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"), AWS_EC2_METADATA_DISABLED="true",
                AWS_PAGER="")


@pytest.mark.skipif(not os.path.exists(AWS), reason="Debian's awscli is not installed")
def test_aws_cli(gateway, cluster, tmp_path):
    env = aws_env(tmp_path)

    def aws(*args, check=True):
        return run([AWS, "--endpoint-url", gateway.endpoint] + list(args), env=env, check=check,
                   timeout=120)

    aws("s3", "mb", "s3://cli")
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(100000), "big.bin": os.urandom(20 * MiB)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    aws("s3", "cp", str(src / "big.bin"), "s3://cli/one/big.bin")  # multipart, 4 parts
    assert cluster.cli("cat", "/cli/one/big.bin").stdout == files["big.bin"]
    aws("s3", "sync", str(src), "s3://cli/tree")
    ls = aws("s3", "ls", "--recursive", "s3://cli/tree/").stdout.decode()
    assert sorted(l.split()[-1] for l in ls.splitlines()) == \
        sorted("tree/" + n for n in files)
    out = tmp_path / "back"
    aws("s3", "sync", "s3://cli/tree", str(out))
    for name, data in files.items():
        assert (out / name).read_bytes() == data
    head = aws("s3api", "head-object", "--bucket", "cli", "--key", "one/big.bin").stdout
    assert b'-4\\"' in head  # md5-of-md5s of four parts
    aws("s3api", "put-object", "--bucket", "cli", "--key", "api.txt", "--body",
        str(src / "a.txt"), "--content-type", "text/plain")
    lo = aws("s3api", "list-objects-v2", "--bucket", "cli", "--prefix", "api").stdout
    assert b'"api.txt"' in lo
    aws("s3", "rm", "--recursive", "s3://cli/")
    aws("s3", "rb", "s3://cli")
    p = aws("s3", "ls", "s3://cli", check=False)
    assert p.returncode != 0 and b"NoSuchBucket" in p.stderr


@pytest.mark.skipif(shutil.which("s3cmd") is None, reason="s3cmd is not installed")
def test_s3cmd(gateway, cluster, tmp_path):
    cfg = tmp_path / "s3cfg"
    cfg.write_text("[default]\naccess_key = %s\nsecret_key = %s\nhost_base = 127.0.0.1:%d\n"
                   "host_bucket = 127.0.0.1:%d\nuse_https = False\nsignature_v2 = False\n"
                   "bucket_location = us-east-1\nmultipart_chunk_size_mb = 5\n"
                   % (AK, SK, gateway.port, gateway.port))

    def s3cmd(*args, check=True):
        return run(["s3cmd", "-c", str(cfg)] + list(args), check=check, timeout=120)

    s3cmd("mb", "s3://s3c")
    f = tmp_path / "file.dat"
    data = os.urandom(12 * MiB + 1)  # multipart with 5 MiB chunks
    f.write_bytes(data)
    s3cmd("put", str(f), "s3://s3c/dir/file.dat")
    s3cmd("put", str(tmp_path / "s3cfg"), "s3://s3c/small.cfg")
    assert cluster.cli("cat", "/s3c/dir/file.dat").stdout == data
    ls = s3cmd("ls", "--recursive", "s3://s3c").stdout.decode()
    assert "s3://s3c/dir/file.dat" in ls and "s3://s3c/small.cfg" in ls
    back = tmp_path / "back.dat"
    p = s3cmd("get", "s3://s3c/dir/file.dat", str(back))
    assert back.read_bytes() == data and b"do not match" not in p.stderr
    p = s3cmd("get", "s3://s3c/small.cfg", str(tmp_path / "back.cfg"))  # MD5 ETag: checked
    assert (tmp_path / "back.cfg").read_bytes() == cfg.read_bytes()
    assert b"do not match" not in p.stderr
    s3cmd("del", "s3://s3c/dir/file.dat", "s3://s3c/small.cfg")
    s3cmd("rb", "s3://s3c")
    assert cluster.cli("ls", "/").stdout.strip() == b""


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_tls(cluster, tmp_path):
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out",
         cert, "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"])
    g = Gateway(cluster, tmp_path, tls=(cert, key))
    try:
        s3 = g.client(verify=cert)
        s3.create_bucket(Bucket="tls")
        s3.put_object(Bucket="tls", Key="k", Body=b"over tls")
        assert s3.get_object(Bucket="tls", Key="k")["Body"].read() == b"over tls"
        ctx = ssl.create_default_context(cafile=cert)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(g.endpoint + "/tls/k", context=ctx)
        assert e.value.code == 403
        # plain HTTP to the TLS port gets no HTTP answer
        answered = None
        try:
            c = http.client.HTTPConnection("127.0.0.1", g.port, timeout=5)
            c.request("GET", "/")
            answered = c.getresponse().status
        except (http.client.HTTPException, OSError):
            pass
        assert answered is None, answered
    finally:
        g.stop()


# ---- virtual-hosted style ----

VDOMAIN = "s3.stoker.test"  # no DNS: the test process resolves it (and BUCKET.it) itself


@pytest.fixture
def vhost(cluster, tmp_path, monkeypatch):
    """A gateway serving BUCKET.s3.stoker.test, and getaddrinfo in this process
    answering loopback for those names (only they: everything else resolves as usual)."""
    real = socket.getaddrinfo

    def fake(host, *a, **kw):
        if isinstance(host, str) and (host == VDOMAIN or host.endswith("." + VDOMAIN)):
            host = "127.0.0.1"
        return real(host, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    g = Gateway(cluster, tmp_path, extra=["--domain", VDOMAIN, "--domain", "other.test"])
    yield g
    g.stop()


def vclient(g):
    return boto3.client(
        "s3", endpoint_url="http://%s:%d" % (VDOMAIN, g.port), aws_access_key_id=AK,
        aws_secret_access_key=SK, region_name="us-east-1",
        config=Config(s3={"addressing_style": "virtual"}, retries={"max_attempts": 1},
                      signature_version="s3v4"))


def vraw(g, method, host, path, body=b""):
    """A signed request with the given Host header, over a connection to loopback."""
    headers = {"host": host}
    headers.update(sigv4(method, path, (), headers, hashlib.sha256(body).hexdigest(), AK,
                         SK)[0])
    conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=30)
    try:
        conn.request(method, urllib.parse.quote(path, safe="/~"), body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_virtual_hosted_style(vhost, cluster):
    sent = []
    v = vclient(vhost)
    v.meta.events.register("before-send.s3",
                           lambda request, **kw: sent.append(
                               urllib.parse.urlsplit(request.url).netloc))
    v.create_bucket(Bucket="vbucket")
    body = os.urandom(300000)
    v.put_object(Bucket="vbucket", Key="dir/obj.bin", Body=body, Metadata={"k": "v"})
    # boto3 really put the bucket in the Host header, and SigV4 signed that
    assert sent == ["vbucket.%s:%d" % (VDOMAIN, vhost.port)] * 2, sent
    got = v.get_object(Bucket="vbucket", Key="dir/obj.bin")
    assert got["Body"].read() == body and got["Metadata"] == {"k": "v"}
    assert got["ETag"] == md5(body)
    assert v.get_object(Bucket="vbucket", Key="dir/obj.bin", Range="bytes=10-19")[
        "Body"].read() == body[10:20]
    listing = v.list_objects_v2(Bucket="vbucket", Prefix="dir/")
    assert [o["Key"] for o in listing["Contents"]] == ["dir/obj.bin"]
    assert [b["Name"] for b in v.list_buckets()["Buckets"]] == ["vbucket"]  # Host: the domain
    v.head_bucket(Bucket="vbucket")
    # the same object path-style, through the IP address, and as a file
    assert vhost.client().get_object(Bucket="vbucket", Key="dir/obj.bin")["Body"].read() == body
    assert cluster.cli("cat", "/vbucket/dir/obj.bin").stdout == body
    # copy and multipart, virtual style
    v.copy_object(Bucket="vbucket", Key="copy", CopySource={"Bucket": "vbucket",
                                                             "Key": "dir/obj.bin"})
    assert v.get_object(Bucket="vbucket", Key="copy")["Body"].read() == body
    up = v.create_multipart_upload(Bucket="vbucket", Key="mp")["UploadId"]
    etag = v.upload_part(Bucket="vbucket", Key="mp", UploadId=up, PartNumber=1,
                         Body=b"part one")["ETag"]
    v.complete_multipart_upload(Bucket="vbucket", Key="mp", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert v.get_object(Bucket="vbucket", Key="mp")["Body"].read() == b"part one"
    # a presigned URL for BUCKET.domain works when fetched with that Host
    url = urllib.parse.urlsplit(v.generate_presigned_url(
        "get_object", Params={"Bucket": "vbucket", "Key": "dir/obj.bin"}, ExpiresIn=300))
    assert url.netloc == "vbucket.%s:%d" % (VDOMAIN, vhost.port)
    conn = http.client.HTTPConnection("127.0.0.1", vhost.port, timeout=30)
    conn.request("GET", url.path + "?" + url.query, headers={"Host": url.netloc})
    r = conn.getresponse()
    assert r.status == 200 and r.read() == body
    conn.close()
    # the second domain, a fully qualified Host, and upper case in the domain part
    assert vraw(vhost, "GET", "vbucket.other.test:%d" % vhost.port, "/copy") == (200, body)
    assert vraw(vhost, "GET", "vbucket.S3.Stoker.Test.", "/copy") == (200, body)
    # a Host that is not under a domain is path-style
    st, b = vraw(vhost, "GET", "vbucket.elsewhere.test", "/vbucket/copy")
    assert (st, b) == (200, body)
    # bad bucket names in the Host header
    st, b = vraw(vhost, "GET", "Bad_Name!.%s" % VDOMAIN, "/k")
    assert st == 400 and xml_code(b) == "InvalidBucketName", b
    st, b = vraw(vhost, "GET", "%s.%s" % ("b" * 64, VDOMAIN), "/k")
    assert st == 400 and xml_code(b) == "InvalidBucketName", b
    st, b = vraw(vhost, "GET", "nosuch.%s" % VDOMAIN, "/k")
    assert st == 404 and xml_code(b) == "NoSuchBucket", b
    # a signature over a different Host does not pass
    headers = {"host": "vbucket.%s" % VDOMAIN}
    headers.update(sigv4("GET", "/copy", (), headers, EMPTY_SHA, AK, SK)[0])
    headers["host"] = "otherbucket.%s" % VDOMAIN
    conn = http.client.HTTPConnection("127.0.0.1", vhost.port, timeout=30)
    conn.request("GET", "/copy", headers=headers)
    r = conn.getresponse()
    assert r.status == 403 and xml_code(r.read()) == "SignatureDoesNotMatch"
    conn.close()
    v.delete_object(Bucket="vbucket", Key="copy")
    with pytest.raises(ClientError) as e:
        v.head_object(Bucket="vbucket", Key="copy")
    assert code(e)[1] == 404


def test_domain_option_checked(cluster, tmp_path):
    for bad in ("http://s3.example.com", "s3.example.com:9000", ".example.com", ""):
        p = run([STOKER, "gateway", "s3", "--cluster", cluster.url, "--domain", bad],
                check=False, timeout=60, env=dict(os.environ, STOKER_S3_ACCESS_KEY=AK,
                                                  STOKER_S3_SECRET_KEY=SK))
        assert p.returncode == 2 and b"--domain" in p.stderr, (bad, p.stderr)


# ---- metrics ----

PROMTOOL = shutil.which("promtool")


def scrape(addr, path="/metrics"):
    with urllib.request.urlopen("http://%s%s" % (addr, path), timeout=30) as r:
        return r.status, r.read().decode()


def samples(text):
    """{(name, frozenset(labels)): value} of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        pairs = frozenset(tuple(kv.split("=", 1)) for kv in
                          labels.rstrip("}").replace('"', "").split(",") if kv)
        out[(name, pairs)] = float(value)
    return out


def metric(m, name, **want):
    want = {k: str(v) for k, v in want.items()}
    return sum(v for (n, labels), v in m.items()
               if n == name and all(dict(labels).get(k) == w for k, w in want.items()))


def wait_metric(addr, name, cond, **want):
    """Scrapes until cond(value) holds (a request is counted when it has ended, just
    after the client has its answer); returns the last scrape."""
    deadline = time.time() + 30
    while True:
        m = samples(scrape(addr)[1])
        if cond(metric(m, name, **want)) or time.time() > deadline:
            return m
        time.sleep(0.1)


def test_metrics(cluster, tmp_path):
    maddr = "127.0.0.1:%d" % free_port()
    g = Gateway(cluster, tmp_path, extra=["--metrics", maddr])
    try:
        s3 = g.client()
        s3.create_bucket(Bucket="bkt")
        body = os.urandom(100000)
        s3.put_object(Bucket="bkt", Key="obj", Body=body)
        for _ in range(3):
            assert s3.get_object(Bucket="bkt", Key="obj")["Body"].read() == body
        with pytest.raises(ClientError):
            s3.get_object(Bucket="bkt", Key="missing")
        with pytest.raises(ClientError):
            g.client(sk="wrong").list_buckets()
        with pytest.raises(ClientError):
            g.client(ak="AKIDUNKNOWN").list_buckets()
        # a request that never finishes its headers, closed by the client
        s = socket.create_connection(("127.0.0.1", g.port))
        s.sendall(b"GET /bkt/obj HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.2)
        s.close()
        m = wait_metric(maddr, "stoker_client_errors_total", lambda v: v >= 1,
                        frontend="s3", error="ConnectionClosed")
        f = dict(frontend="s3")
        assert metric(m, "stoker_client_ops_total", op="CreateBucket", **f) == 1
        assert metric(m, "stoker_client_ops_total", op="PutObject", **f) == 1
        assert metric(m, "stoker_client_ops_total", op="GetObject", **f) == 4
        assert metric(m, "stoker_client_ops_total", op="DeleteObject", **f) == 0  # shown at 0
        assert metric(m, "stoker_client_errors_total", op="GetObject", error="NoSuchKey",
                      **f) == 1
        assert metric(m, "stoker_client_errors_total", error="SignatureDoesNotMatch", **f) == 1
        assert metric(m, "stoker_client_errors_total", error="InvalidAccessKeyId", **f) == 1
        assert metric(m, "stoker_client_errors_total", error="ConnectionClosed", **f) == 1
        assert metric(m, "stoker_client_errors_total", op="PutObject", **f) == 0
        assert metric(m, "stoker_client_write_bytes_total", op="PutObject", **f) >= len(body)
        assert metric(m, "stoker_client_read_bytes_total", op="GetObject",
                      **f) >= 3 * len(body)
        assert metric(m, "stoker_client_op_duration_seconds_count", op="GetObject", **f) == 4
        assert metric(m, "stoker_client_op_duration_seconds_bucket", op="GetObject", le="+Inf",
                      **f) == 4
        assert metric(m, "stoker_client_connections_opened_total", **f) >= 5
        held = [socket.create_connection(("127.0.0.1", g.port)) for _ in range(3)]
        m = wait_metric(maddr, "stoker_client_connections", lambda v: v >= 3, **f)
        assert metric(m, "stoker_client_connections", **f) >= 3
        for h in held:
            h.close()
        assert metric(m, "stoker_build_info", role="s3") == 1
        # Every request ran at least one callback on a loop thread, and a streamed GET
        # body more; each is one observation, none longer than the whole test.
        loop = {"loop": "s3-http"}
        calls = metric(m, "stoker_process_loop_callback_seconds_count", **loop)
        assert calls >= metric(m, "stoker_client_ops_total", **f), calls
        assert metric(m, "stoker_process_loop_callback_seconds_bucket", le="+Inf",
                      **loop) == calls
        assert 0 < metric(m, "stoker_process_loop_callback_seconds_sum", **loop) < 300
        m = wait_metric(maddr, "stoker_client_inflight_ops", lambda v: v == 0, **f)
        assert metric(m, "stoker_client_inflight_ops", **f) == 0
        status, text = scrape(maddr)
        assert status == 200
        assert scrape(maddr, "/healthz") == (200, "ok\n")
        if PROMTOOL:
            p = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(),
                               capture_output=True, timeout=60)
            assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    finally:
        g.stop()
    p = run([STOKER, "gateway", "s3", "--cluster", cluster.url, "--keys", str(g.keys),
             "--listen", "127.0.0.1:%d" % free_port(), "--metrics", "nonsense"],
            check=False, timeout=60)
    assert p.returncode != 0 and b"--metrics nonsense" in p.stderr, p.stderr


def test_up_s3_metrics_port(tmp_path):
    from conftest import pick_ports
    port = pick_ports()
    s3port = free_port()
    data = tmp_path / "d"
    p = run([STOKER, "up", "--data", str(data), "--daemon", "--port", str(port),
             "--s3", str(s3port)], check=False, timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("STOKER_S3")})
    try:
        assert p.returncode == 0, p.stderr
        maddr = "127.0.0.1:%d" % (port + 13)
        assert ("metrics on %s" % maddr).encode() in p.stdout, p.stdout
        # The metrics port opens before the gateway's S3 server (whose series
        # show from its start on): scraped early, the series are not there yet.
        want = 'stoker_client_ops_total{frontend="s3",op="GetObject"}'
        deadline = time.time() + 30
        while True:
            try:
                status, text = scrape(maddr)
                if want in text or time.time() > deadline:
                    break
            except OSError:
                if time.time() > deadline:
                    raise
            time.sleep(0.2)
        assert status == 200 and 'stoker_build_info{role="s3"' in text
        assert want in text
    finally:
        run([STOKER, "down", "--data", str(data)], check=False, timeout=120)


# ---- thousands of connections ----

@pytest.mark.serial  # its live phase must finish within --timeout: not beside other tests
def test_thousands_of_connections(cluster, tmp_path):
    """2,500 connections at once: idle ones, slow-loris headers, stalled PUT bodies and
    GETs whose reader never reads. Live clients are served correctly while all of them
    are held, and the gateway's timeout then frees every one (and the stalled PUTs'
    temporary files)."""
    import resource
    n_idle, n_loris, n_body, n_noread = 1200, 700, 300, 300
    total_held = n_idle + n_loris + n_body + n_noread
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = total_held + 1000
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, hard), max(want, hard)))
        except (ValueError, OSError):
            pytest.skip("cannot raise RLIMIT_NOFILE to %d" % want)
    maddr = "127.0.0.1:%d" % free_port()
    timeout = 20  # long enough for the live phase on a loaded machine, under ASan
    g = Gateway(cluster, tmp_path, extra=["--metrics", maddr, "--timeout", str(timeout),
                                          "--threads", "8"])
    held = []
    try:
        s3 = g.client()
        s3.create_bucket(Bucket="bkt")
        big = os.urandom(8 * MiB)  # more than the socket buffers hold
        s3.put_object(Bucket="bkt", Key="big", Body=big)

        def connect():
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", g.port))
            held.append(s)
            return s

        for _ in range(n_idle):
            connect()
        for i in range(n_loris):  # the request line and part of the headers, then nothing
            connect().sendall(b"GET /bkt/big HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow-%d: a" % i)
        for i in range(n_body):  # signed PUT headers and a few bytes of a 1 MiB body
            s = connect()
            s.sendall(put_headers(g, "/bkt/stalled-%d" % i, MiB) + b"x" * 1000)
        get = ("GET /bkt/big HTTP/1.1\r\n" + "".join(
            "%s: %s\r\n" % kv for kv in dict(
                {"host": "127.0.0.1:%d" % g.port},
                **sigv4("GET", "/bkt/big", (), {"host": "127.0.0.1:%d" % g.port}, EMPTY_SHA,
                        AK, SK)[0]).items()) + "\r\n").encode()
        for _ in range(n_noread):  # a GET of 8 MiB whose client reads nothing
            connect().sendall(get)
        m = wait_metric(maddr, "stoker_client_connections", lambda v: v >= total_held,
                        frontend="s3")
        assert metric(m, "stoker_client_connections", frontend="s3") >= total_held, \
            "the gateway did not accept them all:\n" + g.log()

        # live clients, while all of those are held
        errors = []

        def live(t):
            try:
                c = g.client()
                for i in range(10):
                    data = os.urandom(1000 + 977 * i + t)
                    c.put_object(Bucket="bkt", Key="live/%d/%d" % (t, i), Body=data)
                    got = c.get_object(Bucket="bkt", Key="live/%d/%d" % (t, i))["Body"].read()
                    assert got == data
                assert c.get_object(Bucket="bkt", Key="big", Range="bytes=1000-1999")[
                    "Body"].read() == big[1000:2000]
                keys = [o["Key"] for o in c.list_objects_v2(
                    Bucket="bkt", Prefix="live/%d/" % t)["Contents"]]
                assert len(keys) == 10
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))

        threads = [threading.Thread(target=live, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors and not any(t.is_alive() for t in threads), errors
        # served while they were held: none of them has timed out yet
        m = samples(scrape(maddr)[1])
        assert metric(m, "stoker_client_errors_total", frontend="s3",
                      error="RequestTimeout") == 0, "live phase outlasted --timeout"
        assert metric(m, "stoker_client_connections", frontend="s3") >= total_held

        # the gateway frees them: each connection is closed by the timeout
        m = wait_metric(maddr, "stoker_client_connections", lambda v: v < 50, frontend="s3")
        assert metric(m, "stoker_client_connections", frontend="s3") < 50
        for s in held[:n_idle:50] + held[n_idle:n_idle + n_loris:50] + \
                held[n_idle + n_loris:n_idle + n_loris + n_body:50]:
            s.settimeout(30)
            try:
                data = s.recv(65536)
                while data:  # an error answer may come first; then the close
                    data = s.recv(65536)
            except ConnectionResetError:
                pass
        assert metric(m, "stoker_client_errors_total", frontend="s3",
                      error="RequestTimeout") >= n_loris + n_body
        # the stalled PUTs left nothing, and the gateway serves on
        deadline = time.time() + 30
        while cluster.cli("ls", "/bkt/.stoker-upload").stdout.strip() and time.time() < deadline:
            time.sleep(0.2)
        assert cluster.cli("ls", "/bkt/.stoker-upload").stdout.strip() == b""
        with pytest.raises(ClientError) as e:
            s3.head_object(Bucket="bkt", Key="stalled-0")
        assert code(e)[1] == 404
        assert s3.get_object(Bucket="bkt", Key="live/0/0")["Body"].read()
    finally:
        for s in held:
            s.close()
        g.stop()


# ---- curl, and bodies that disagree with their Content-Length ----

@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl(gateway, s3, cluster, tmp_path):
    s3.create_bucket(Bucket="bkt")
    src = tmp_path / "up.bin"
    data = os.urandom(3 * MiB + 5)
    src.write_bytes(data)
    base = gateway.endpoint + "/bkt/"
    curl = ["curl", "-sS", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", "%s:%s" % (AK, SK),
            "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "--max-time", "120"]
    p = run(curl + ["-f", "-T", str(src), "-H", "Content-Type: image/x-test",
                    "-H", "x-amz-meta-from: curl", base + "from-curl.bin"])
    assert cluster.cli("cat", "/bkt/from-curl.bin").stdout == data
    head = s3.head_object(Bucket="bkt", Key="from-curl.bin")
    assert head["ContentType"] == "image/x-test" and head["Metadata"] == {"from": "curl"}
    assert head["ETag"] == md5(data)
    p = run(curl + ["-f", base + "from-curl.bin"])
    assert p.stdout == data
    p = run(curl + ["-f", "-r", "100-199", base + "from-curl.bin"])
    assert p.stdout == data[100:200]
    p = run(curl + ["-w", "%{http_code}", "-o", "/dev/null", base + "nope"])
    assert p.stdout == b"404"
    p = run(curl + [base + "nope"])
    assert xml_code(p.stdout) == "NoSuchKey"
    p = run(curl[:4] + ["--user", "%s:wrong" % AK, base + "from-curl.bin"])
    assert xml_code(p.stdout) == "SignatureDoesNotMatch"
    p = run(curl + ["-f", "-X", "DELETE", base + "from-curl.bin"])
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="bkt", Key="from-curl.bin")
    assert code(e)[1] == 404


def test_body_longer_or_shorter_than_content_length(gateway, s3, cluster):
    s3.create_bucket(Bucket="bkt")
    # longer: the object is the first Content-Length bytes; the rest is the next
    # "request", which is garbage and answered with an error on that connection
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.sendall(put_headers(gateway, "/bkt/long", 10) + b"0123456789EXTRA BYTES\r\n\r\n")
    sock.settimeout(30)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    sock.close()
    assert got.startswith(b"HTTP/1.1 200"), got
    assert s3.get_object(Bucket="bkt", Key="long")["Body"].read() == b"0123456789"
    assert b"HTTP/1.1 400" in got[12:], got  # the extra bytes, refused
    # shorter, and the client then waits: the --timeout (5 s here) closes it, nothing
    # is stored, and the connection's wait costs nobody else anything
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.sendall(put_headers(gateway, "/bkt/short", 1000) + b"x" * 400)
    assert s3.get_object(Bucket="bkt", Key="long")["Body"].read() == b"0123456789"
    sock.settimeout(60)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    sock.close()
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="bkt", Key="short")
    assert code(e)[1] == 404
    deadline = time.time() + 30
    while cluster.cli("ls", "/bkt/.stoker-upload").stdout.strip() and time.time() < deadline:
        time.sleep(0.2)
    assert cluster.cli("ls", "/bkt/.stoker-upload").stdout.strip() == b""
    # a signed payload shorter than the signature says is refused, not stored
    body = b"a" * 100
    st, _, b = gateway.raw("PUT", "/bkt/sig", body=body,
                           payload_hash=hashlib.sha256(body + b"more").hexdigest())
    assert st == 400 and xml_code(b) == "XAmzContentSHA256Mismatch", b
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="bkt", Key="sig")
    assert code(e)[1] == 404


def test_oversized_headers_refused(gateway, s3):
    s3.create_bucket(Bucket="bkt")
    s3.put_object(Bucket="bkt", Key="k", Body=b"fine")
    for req in (b"GET /bkt/k HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 300000 + b"\r\n\r\n",
                b"GET /bkt/k HTTP/1.1\r\nHost: x\r\n" +
                b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(4000)) + b"\r\n"):
        sock = socket.create_connection(("127.0.0.1", gateway.port))
        sock.settimeout(30)
        try:
            sock.sendall(req)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            status = sock.recv(64)
        except ConnectionResetError:
            status = b""
        sock.close()
        # libmicrohttpd answers 431 before any handler runs (or resets a sender that
        # keeps pushing); either way nothing of it reached the S3 code
        assert status.startswith(b"HTTP/1.1 431") or status == b"", status
    assert s3.get_object(Bucket="bkt", Key="k")["Body"].read() == b"fine"


# ---- users ----

def test_users_are_confined_to_their_buckets(cluster, tmp_path):
    """`stoker admin s3-user add`: each user's key reaches its own buckets only
    (listing, reading, writing, copying, deleting), read-only where given so, and
    acts as its uid/gid in the file system; the gateway's own key reaches all."""
    kf = tmp_path / "users.keys"

    def add(*args):
        out = run([STOKER, "admin", "s3-user", "add", *args, "--keys", str(kf)]).stdout.decode()
        return (re.search(r"access key (\S+)", out).group(1),
                re.search(r"secret key (\S+)", out).group(1))
    alice = add("alice", "--uid", "1000", "--gid", "1000", "--bucket", "alpha",
                "--bucket", "shared:ro")
    bob = add("bob", "--bucket", "beta:rw")
    assert oct(os.stat(kf).st_mode & 0o777) == "0o600"
    ls = run([STOKER, "admin", "s3-user", "ls", "--keys", str(kf)]).stdout.decode()
    assert "alpha:rw,shared:ro" in ls and "beta:rw" in ls and alice[1] not in ls, ls
    p = run([STOKER, "admin", "s3-user", "add", "bob", "--keys", str(kf)], check=False)
    assert p.returncode == 1 and b"already has a user bob" in p.stderr
    p = run([STOKER, "admin", "s3-user", "add", "eve", "--bucket", "Bad_Name", "--keys",
             str(kf)], check=False)
    assert p.returncode == 2 and b"is not a bucket name" in p.stderr

    gw = Gateway(cluster, tmp_path, keys_text="%s %s\n%s" % (AK, SK, kf.read_text()))
    try:
        admin, a, b = gw.client(), gw.client(*alice), gw.client(*bob)
        admin.create_bucket(Bucket="shared")
        admin.put_object(Bucket="shared", Key="readme", Body=b"for everyone")
        a.create_bucket(Bucket="alpha")
        a.put_object(Bucket="alpha", Key="x", Body=b"alice's")
        b.create_bucket(Bucket="beta")
        b.put_object(Bucket="beta", Key="y", Body=b"bob's")

        def names(c):
            return sorted(x["Name"] for x in c.list_buckets()["Buckets"])
        assert names(a) == ["alpha", "shared"]
        assert names(b) == ["beta"]
        assert names(admin) == ["alpha", "beta", "shared"]
        assert a.get_object(Bucket="shared", Key="readme")["Body"].read() == b"for everyone"
        assert b.get_object(Bucket="beta", Key="y")["Body"].read() == b"bob's"
        refused = [
            lambda: a.create_bucket(Bucket="gamma"),
            lambda: a.get_object(Bucket="beta", Key="y"),
            lambda: a.head_object(Bucket="beta", Key="y"),
            lambda: a.list_objects_v2(Bucket="beta"),
            lambda: a.put_object(Bucket="shared", Key="z", Body=b"no"),
            lambda: a.delete_object(Bucket="shared", Key="readme"),
            lambda: a.delete_bucket(Bucket="beta"),
            lambda: b.get_object(Bucket="alpha", Key="x"),
            lambda: b.copy_object(Bucket="beta", Key="c", CopySource={"Bucket": "alpha",
                                                                      "Key": "x"}),
            lambda: b.create_multipart_upload(Bucket="shared", Key="m"),
        ]
        for i, call in enumerate(refused):
            with pytest.raises(ClientError) as e:
                call()
            # HEAD has no body: only its status says so
            assert code(e)[1] == 403 and code(e)[0] in ("AccessDenied", "403"), (i, code(e))
        # nothing the refused calls aimed at changed
        assert admin.get_object(Bucket="shared", Key="readme")["Body"].read() == b"for everyone"
        assert "Contents" not in admin.list_objects_v2(Bucket="beta", Prefix="c")
        # alice's bucket and object are hers in the file system; bob's, the gateway's
        env = dict(os.environ, STOKER_CLUSTER=cluster.url)
        for path, uid in (("/alpha", 1000), ("/alpha/x", 1000), ("/beta/y", os.getuid())):
            st = run([STOKER, "stat", path], env=env).stdout.decode()
            assert re.search(r"Uid: %d\b" % uid, st), (path, st)
        assert run([STOKER, "cat", "/alpha/x"], env=env).stdout == b"alice's"
    finally:
        gw.stop()
