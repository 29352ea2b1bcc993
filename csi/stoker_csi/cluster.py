"""Which cluster a request is about, with which key, and the `stoker` commands.

A request names its cluster, in order of precedence, by the secret's `cluster`
(the StorageClass's provisioner, controller-expand and node-stage secrets), the
volume's context (`cluster`, a static volume), its volume id, or the driver's
default (`--cluster`, else $STOKER_CLUSTER). The key comes from the secret's `key`
(the key file's hex line), written to a 0600 file under the state folder, else
from the driver's `--key-file` or $STOKER_KEY_FILE (docs/security.md).

Volume ids. A volume the driver made is `dyn:stk://HOST:PORT/PATH`; only such ids
are ever deleted. A static volume (an existing folder) has any id its
PersistentVolume gives it, with its folder in the volume attributes (`path`), or
the id `stk://HOST:PORT/PATH` itself.
"""
import hashlib
import json
import os
import posixpath
import subprocess
import threading

DYN = "dyn:"


class Error(Exception):
    """A failure with the gRPC status code it maps to (a grpc.StatusCode name)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def url_of(addr):
    """stk://HOST:PORT from HOST:PORT or stk://HOST:PORT[/]."""
    a = addr.strip()
    if a.startswith("stk://"):
        a = a[len("stk://"):]
    a = a.rstrip("/")
    if not a or "/" in a or ":" not in a:
        raise Error("INVALID_ARGUMENT", "cluster address %r is not HOST:PORT" % addr)
    return "stk://" + a


def clean_path(path, what="path"):
    """An absolute folder path in the cluster, normalised; '..' is refused."""
    if not path or not path.startswith("/") or "\0" in path:
        raise Error("INVALID_ARGUMENT", "%s %r is not an absolute path" % (what, path))
    if ".." in path.split("/"):
        raise Error("INVALID_ARGUMENT", "%s %r holds '..'" % (what, path))
    return posixpath.normpath(path).replace("//", "/")


def split_url(s):
    """(url, path) of stk://HOST:PORT/PATH."""
    if not s.startswith("stk://"):
        raise ValueError(s)
    rest = s[len("stk://"):]
    addr, slash, path = rest.partition("/")
    return url_of(addr), clean_path("/" + path)


def dyn_id(url, path):
    return DYN + url + path


def parse_id(volume_id):
    """(url, path, dynamic) of a volume id this driver understands, else None."""
    dynamic = volume_id.startswith(DYN)
    s = volume_id[len(DYN):] if dynamic else volume_id
    try:
        url, path = split_url(s)
    except (ValueError, Error):
        return None
    return url, path, dynamic


class Clusters:
    """Resolves clusters and keys, and runs `stoker` and libstoker against them."""

    def __init__(self, stoker_bin, state_dir, default_cluster=None, key_file=None):
        self.stoker_bin = stoker_bin
        self.state_dir = state_dir
        self.default_url = url_of(default_cluster) if default_cluster else None
        self.default_key = key_file
        self._lock = threading.Lock()
        self._clients = {}

    def resolve(self, secrets=None, context=None, volume_id=""):
        """(url, key_file, path) for a request; path is None when nothing names one."""
        secrets = secrets or {}
        context = context or {}
        parsed = parse_id(volume_id) if volume_id else None
        path = None
        if context.get("path"):
            path = clean_path(context["path"])
        elif parsed:
            path = parsed[1]
        addr = secrets.get("cluster") or context.get("cluster") or \
            (parsed[0] if parsed else None) or self.default_url
        if not addr:
            raise Error("INVALID_ARGUMENT", "no cluster: give the secret a 'cluster', or "
                        "start the driver with --cluster")
        return url_of(addr), self.key_file(secrets), path

    def key_file(self, secrets):
        key = (secrets or {}).get("key")
        if not key:
            return self.default_key
        key = key.strip()
        if not key or any(c not in "0123456789abcdefABCDEF" for c in key):
            raise Error("INVALID_ARGUMENT", "the secret's 'key' is not the hex line of a "
                        "cluster key file")
        d = os.path.join(self.state_dir, "keys")
        os.makedirs(d, mode=0o700, exist_ok=True)
        name = os.path.join(d, hashlib.sha256(key.encode()).hexdigest()[:20] + ".key")
        if not os.path.exists(name):
            tmp = name + ".tmp%d" % os.getpid()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(key + "\n")
            os.rename(tmp, name)
        return name

    def env(self, url, key_file):
        env = dict(os.environ, STOKER_CLUSTER=url)
        if key_file:
            env["STOKER_KEY_FILE"] = key_file
        return env

    def run(self, url, key_file, *args, timeout=120):
        """Runs `stoker ARGS` against the cluster; Error(UNAVAILABLE or INTERNAL) when
        it fails, with its message."""
        p = subprocess.run([self.stoker_bin] + list(args), capture_output=True, text=True,
                           env=self.env(url, key_file), timeout=timeout)
        if p.returncode != 0:
            msg = (p.stderr.strip() or p.stdout.strip() or "exit %d" % p.returncode)
            code = "UNAVAILABLE" if "cannot reach" in msg or "refused" in msg else "INTERNAL"
            raise Error(code, "stoker %s: %s" % (" ".join(args), msg))
        return p.stdout

    def client(self, url, key_file):
        """A libstoker client (the `stoker` package) for the cluster, kept for reuse.
        The key reaches libstoker through $STOKER_KEY_FILE, read at connect time: the
        environment is set under a lock for that moment."""
        import stoker
        k = (url, key_file)
        with self._lock:
            c = self._clients.get(k)
            if c is not None:
                return c
            old = os.environ.get("STOKER_KEY_FILE")
            try:
                if key_file:
                    os.environ["STOKER_KEY_FILE"] = key_file
                c = stoker.connect(url)
            except OSError as e:
                raise Error("UNAVAILABLE", "cannot reach the cluster at %s: %s" % (url, e))
            finally:
                if old is None:
                    os.environ.pop("STOKER_KEY_FILE", None)
                else:
                    os.environ["STOKER_KEY_FILE"] = old
            self._clients[k] = c
            return c

    def quota(self, url, key_file, path):
        """The quota set on folder path itself (a dict of `stoker quota ls --json`), or
        None when it has none of its own."""
        out = json.loads(self.run(url, key_file, "quota", "ls", path, "--json") or "[]")
        for q in out:
            if q.get("path") == path:
                return q
        return None

    def set_quota(self, url, key_file, path, nbytes, inodes):
        self.run(url, key_file, "quota", "set", path, "--bytes", str(nbytes), "--inodes",
                 str(inodes))
