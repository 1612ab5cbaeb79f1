# check_or_balance: how much OpenRouter credit is left, in USD.
# First GET {base}/key (works with an ordinary key: data.limit_remaining);
# when that has no limit or fails, GET {base}/credits
# (data.total_credits - data.total_usage; needs a management key).

DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def as_number(value):
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except Exception:
            return None
    return None


def is_object(value):
    # True for a JSON object. Duck-typed: the sandbox's builtins may lack `dict`.
    if value is None or isinstance(value, (str, int, float, bool)):
        return False
    try:
        value.items()
        return True
    except Exception:
        return False


def data_of(response):
    body = response.get("json")
    if is_object(body) and is_object(body.get("data")):
        return body.get("data")
    return None


def url_host(url):
    # -> "host" of an http(s) URL with an optional numeric port, else None.
    # Refuses user-info, queries and fragments so the host cannot be disguised.
    lowered = url.lower()
    if lowered.startswith("https://"):
        rest = lowered[8:]
    elif lowered.startswith("http://"):
        rest = lowered[7:]
    else:
        return None
    for bad in ("@", "?", "#", "\\", " "):
        if bad in rest:
            return None
    hostport = rest.split("/")[0]
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            return None
        host = hostport[:end + 1]
        port = hostport[end + 1:]
    else:
        colon = hostport.find(":")
        if colon < 0:
            host = hostport
            port = ""
        else:
            host = hostport[:colon]
            port = hostport[colon:]
    if port != "" and not (port.startswith(":") and port[1:].isdigit()):
        return None
    if host == "":
        return None
    return host


def same_site(url, reference):
    # Same scheme and host (and port) as reference.
    host = url_host(url)
    scheme = reference.lower().split("://")[0] + "://"
    return host is not None and host == url_host(reference) and url.lower().startswith(scheme)


def get(ctx, url, api_key):
    # -> {"response": fetch result} or {"error": message without the key}
    try:
        return {"response": ctx.fetch(url, headers={"Authorization": "Bearer " + api_key}, timeout=10)}
    except Exception as err:
        return {"error": str(err).replace(api_key, "***")}


def execute(args, ctx):
    api_key = ctx.secrets.get("OPENROUTER_API_KEY")
    if not api_key:
        return {"ok": False, "error": "secret OPENROUTER_API_KEY is not available to this tool"}

    configured = ctx.secrets.get("OPENROUTER_BASE_URL") or DEFAULT_BASE_URL
    base = args.get("base_url") or configured
    if not isinstance(base, str):
        raise ValueError("'base_url' must be a string")
    while base.endswith("/"):
        base = base[:-1]
    # The key is sent as a Bearer token: only to OpenRouter, the operator's
    # configured endpoint (OPENROUTER_BASE_URL, when granted), or this machine.
    if not (url_host(base) in LOOPBACK_HOSTS or same_site(base, DEFAULT_BASE_URL) or same_site(base, configured)):
        return {"ok": False, "error": "base_url must be on openrouter.ai, the OPENROUTER_BASE_URL host, or loopback"}

    problems = []
    usage = None
    outcome = get(ctx, base + "/key", api_key)
    response = outcome.get("response")
    if response is None:
        problems.append("/key: " + outcome.get("error", "request failed"))
    elif response.get("status") != 200:
        problems.append("/key: HTTP " + str(response.get("status")))
    else:
        data = data_of(response)
        if data is None:
            problems.append("/key: response is not the expected JSON")
        else:
            usage = as_number(data.get("usage"))
            remaining = as_number(data.get("limit_remaining"))
            if remaining is not None:
                return {"ok": True, "balance": remaining, "source": "key"}
            problems.append("/key: key has no spending limit")

    outcome = get(ctx, base + "/credits", api_key)
    response = outcome.get("response")
    if response is None:
        problems.append("/credits: " + outcome.get("error", "request failed"))
    elif response.get("status") != 200:
        problems.append("/credits: HTTP " + str(response.get("status")))
    else:
        data = data_of(response)
        total = None
        used = None
        if data is not None:
            total = as_number(data.get("total_credits"))
            used = as_number(data.get("total_usage"))
        if total is None or used is None:
            problems.append("/credits: response is not the expected JSON")
        else:
            return {"ok": True, "balance": total - used, "source": "credits"}

    result = {"ok": False, "error": "could not read the OpenRouter balance (" + "; ".join(problems) + ")"}
    if usage is not None:
        result["key_usage"] = usage
    return result
