# check_or_balance: how much OpenRouter credit is left, in USD.
# First GET {base}/key (works with an ordinary key: data.limit_remaining);
# when that has no limit or fails, GET {base}/credits
# (data.total_credits - data.total_usage; needs a management key).
# api_key is a placeholder: the runtime puts the key into the Authorization
# header only for a host the operator bound OPENROUTER_API_KEY to, and refuses
# a request anywhere else before it is sent.

DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"


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


def data_of(response):
    body = response.get("json")
    if isinstance(body, dict) and isinstance(body.get("data"), dict):
        return body.get("data")
    return None


def get(ctx, url, api_key):
    # -> {"response": fetch result} or {"error": message}
    try:
        return {"response": ctx.fetch(url, headers={"Authorization": "Bearer " + api_key}, timeout=10)}
    except Exception as err:
        return {"error": str(err)}


def execute(args, ctx):
    api_key = ctx.secrets.get("OPENROUTER_API_KEY")
    if not api_key:
        return {"ok": False, "error": "secret OPENROUTER_API_KEY is not available to this tool"}

    base = args.get("base_url") or ctx.secrets.get("OPENROUTER_BASE_URL") or DEFAULT_BASE_URL
    if not isinstance(base, str):
        raise ValueError("'base_url' must be a string")
    while base.endswith("/"):
        base = base[:-1]
    lowered = base.lower()
    if not (lowered.startswith("https://") or lowered.startswith("http://")):
        return {"ok": False, "error": "base_url must be an http:// or https:// URL"}

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
