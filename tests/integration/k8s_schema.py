"""An offline check of Kubernetes manifests against the API's own models.

`kubectl apply --dry-run=client` still asks a server for the API's schema, and no
server runs here. The Kubernetes Python client (Debian's python3-kubernetes) holds
a model class per API type, generated from the API's OpenAPI schema: each field's
JSON name and type, and which fields are required. This walks a manifest through
them: unknown fields (what kubectl's validation refuses), wrong types, and missing
required fields (the models' own constructors refuse those).
"""
import glob
import os
import re

import kubernetes.client as k8s
import yaml

GROUPS = {"v1", "apps/v1", "storage.k8s.io/v1", "rbac.authorization.k8s.io/v1"}


def load_dir(path):
    docs = []
    for name in sorted(glob.glob(os.path.join(path, "*.yaml"))):
        with open(name) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def _type_ok(value, t):
    if t == "str":
        return isinstance(value, str)
    if t == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "bool":
        return isinstance(value, bool)
    if t == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def _walk(value, t, where, out):
    m = re.match(r"list\[(.*)\]$", t)
    if m:
        if not isinstance(value, list):
            out.append("%s: a list expected" % where)
            return
        for i, v in enumerate(value):
            _walk(v, m.group(1), "%s[%d]" % (where, i), out)
        return
    m = re.match(r"dict\(str, (.*)\)$", t)
    if m:
        if not isinstance(value, dict):
            out.append("%s: a map expected" % where)
            return
        for key, v in value.items():
            _walk(v, m.group(1), "%s.%s" % (where, key), out)
        return
    cls = getattr(k8s, t, None)
    if cls is None:
        if t not in ("object", "datetime", "date") and not _type_ok(value, t):
            out.append("%s: %r is not a %s" % (where, value, t))
        return
    if not isinstance(value, dict):
        out.append("%s: an object (%s) expected" % (where, t))
        return
    by_json = {j: a for a, j in cls.attribute_map.items()}
    for key, v in value.items():
        if key not in by_json:
            out.append("%s: unknown field %r in %s" % (where, key, t))
            continue
        _walk(v, cls.openapi_types[by_json[key]], "%s.%s" % (where, key), out)


def check(doc):
    """The problems of one manifest (a dict), [] when it is valid."""
    api, kind = doc.get("apiVersion"), doc.get("kind")
    where = "%s/%s" % (kind, (doc.get("metadata") or {}).get("name"))
    if api not in GROUPS:
        return ["%s: apiVersion %r unknown" % (where, api)]
    t = "V1" + str(kind)
    if getattr(k8s, t, None) is None:
        return ["%s: kind %r unknown" % (where, kind)]
    out = []
    _walk(doc, t, where, out)
    if not out:
        try:
            k8s.ApiClient()._ApiClient__deserialize(doc, t)
        except (ValueError, TypeError) as e:
            out.append("%s: %s" % (where, e))
    return out
