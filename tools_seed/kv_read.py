# kv_read: read one or more keys from the agent's KV store (secret:* is never
# readable). JSON values are parsed; anything else comes back as text.

import json

MAX_KEYS = 50


def decode(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except Exception:
            return value
    return value


def check_key(key):
    if not isinstance(key, str) or not key:
        raise ValueError("keys must be non-empty strings")
    if key.startswith("secret:"):
        raise ValueError("kv_read cannot read secret:* keys")


def execute(args, ctx):
    if "keys" in args and args.get("keys") is not None:
        keys = args.get("keys")
        if isinstance(keys, (dict, str, int, float, bool)):
            raise ValueError("'keys' must be a list of key names")
        if len(keys) == 0:
            raise ValueError("'keys' is empty")
        if len(keys) > MAX_KEYS:
            raise ValueError("at most " + str(MAX_KEYS) + " keys per call")
        values = {}
        missing = []
        for key in keys:
            check_key(key)
            raw = ctx.kv.get(key)
            if raw is None:
                missing.append(key)
            values[key] = decode(raw)
        return {"ok": True, "values": values, "missing": missing}

    key = args.get("key")
    if key is None:
        raise ValueError("kv_read needs 'key' (a string) or 'keys' (a list)")
    check_key(key)
    raw = ctx.kv.get(key)
    return {"ok": True, "key": key, "found": raw is not None, "value": decode(raw)}
