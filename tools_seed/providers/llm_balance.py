# Dynamic checker for the LLM credit left. Returns a number (USD) or None.
def check(ctx):
    key = ctx.secrets.get("OPENROUTER_API_KEY")
    if not key:
        return None
    base = (ctx.secrets.get("OPENROUTER_BASE_URL") or "https://openrouter.ai/api/v1").rstrip("/")
    r = ctx.fetch(base + "/key", headers={"Authorization": "Bearer " + key})
    data = (r["json"] or {}).get("data") or {}
    if r["status"] == 200 and data.get("limit_remaining") is not None:
        return data["limit_remaining"]
    r = ctx.fetch(base + "/credits", headers={"Authorization": "Bearer " + key})
    data = (r["json"] or {}).get("data") or {}
    if r["status"] == 200 and data.get("total_credits") is not None:
        return data["total_credits"] - data.get("total_usage", 0)
    return None
