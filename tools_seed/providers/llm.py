# Tier-1 LLM adapter: the agent may rewrite this (another provider, headers, routing).
# If it breaks, the runtime falls back to the last version that worked, then to
# its hard-coded OpenRouter client.


# ctx.secrets holds a placeholder for the key, never the key: the runtime puts the
# value in only on the way to the host the operator bound it to, and meters the
# request (model, max_tokens and cost are checked there, whatever this code says).
def call(request, ctx):
    key = ctx.secrets.get("OPENROUTER_API_KEY")
    if not key:
        raise RuntimeError("OPENROUTER_API_KEY is not granted to provider:llm (add it to BRAINSTEM_TOOL_SECRETS)")
    base = request.get("base_url") or "https://openrouter.ai/api/v1"
    body = {"model": request["model"], "messages": request["messages"], "max_tokens": request["max_tokens"]}
    if request.get("reasoning"):
        body["reasoning"] = request["reasoning"]
    if request.get("tools"):  # an agent step's tools, in the OpenAI function format
        body["tools"] = request["tools"]
        body["tool_choice"] = request.get("tool_choice") or "auto"
    r = ctx.fetch(base.rstrip("/") + "/chat/completions", method="POST", json=body,
                  headers={"Authorization": "Bearer " + key, "X-Title": "Brainstem"})
    if r["status"] != 200:
        raise RuntimeError("HTTP " + str(r["status"]) + ": " + r["text"][:200])
    data = r["json"]
    if data is None or not data.get("choices"):
        raise RuntimeError("response had no choices")
    choice = data["choices"][0]
    message = choice.get("message") or {}
    content = message.get("content") or ""
    usage = data.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    return {
        "content": content,
        "tool_calls": message.get("tool_calls") or [],
        "finish_reason": choice.get("finish_reason"),
        "usage": {
            "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0),
            "reasoning_tokens": details.get("reasoning_tokens", 0),
            "cost": usage.get("cost"),
        },
    }
