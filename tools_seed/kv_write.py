# kv_write: store a value under this tool's own namespace
# (tooldata:kv_write:{key}). Non-string values are stored as JSON text.

import json

MAX_KEY_CHARS = 200
MAX_VALUE_CHARS = 100000


def execute(args, ctx):
    key = args.get("key")
    if not isinstance(key, str) or not key.strip():
        raise ValueError("kv_write needs 'key' (a non-empty string)")
    key = key.strip()
    if len(key) > MAX_KEY_CHARS:
        raise ValueError("'key' is longer than " + str(MAX_KEY_CHARS) + " characters")
    if "value" not in args:
        raise ValueError("kv_write needs 'value'")
    value = args.get("value")
    if not isinstance(value, str):
        value = json.dumps(value)
    if len(value) > MAX_VALUE_CHARS:
        return {"ok": False,
                "error": "value is " + str(len(value)) + " characters; the limit is " + str(MAX_VALUE_CHARS)}
    ctx.kv.put(key, value)
    return {"ok": True, "key": key, "stored_as": "tooldata:kv_write:" + key}
