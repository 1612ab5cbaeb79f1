# send_telegram: send a text message to the operator through a Telegram bot.
# ctx.secrets holds a placeholder for the bot token, never the token: the
# runtime puts the token into the URL only for the host it is bound to (the
# Telegram API of BRAINSTEM_TELEGRAM_BOT_TOKEN, or an operator's
# TELEGRAM_BOT_TOKEN@api.telegram.org) and refuses a request anywhere else
# before it is sent. TELEGRAM_CHAT_ID (the operator's chat) and
# TELEGRAM_API_URL (the operator's Bot API) are plain values the runtime hands
# over when they are set.

DEFAULT_API_BASE = "https://api.telegram.org"
MAX_TEXT_CHARS = 4096


def execute(args, ctx):
    text = args.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("send_telegram needs 'text' (a non-empty string)")
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS - 1] + "…"

    token = ctx.secrets.get("TELEGRAM_BOT_TOKEN")
    if not token:
        return {"ok": False, "error": "secret TELEGRAM_BOT_TOKEN is not available to this tool"}

    chat_id = args.get("chat_id")
    if chat_id is None or chat_id == "":
        chat_id = ctx.secrets.get("TELEGRAM_CHAT_ID")
    if chat_id is None or chat_id == "":
        return {"ok": False, "error": "no chat_id given and TELEGRAM_CHAT_ID (the operator's chat) is not available"}

    api_base = args.get("api_base") or ctx.secrets.get("TELEGRAM_API_URL") or DEFAULT_API_BASE
    if not isinstance(api_base, str):
        raise ValueError("'api_base' must be a string")
    while api_base.endswith("/"):
        api_base = api_base[:-1]
    lowered = api_base.lower()
    if not (lowered.startswith("https://") or lowered.startswith("http://")):
        return {"ok": False, "error": "api_base must be an http:// or https:// URL"}

    url = api_base + "/bot" + token + "/sendMessage"
    try:
        response = ctx.fetch(url, method="POST", json={"chat_id": chat_id, "text": text}, timeout=10)
    except Exception as err:
        return {"ok": False, "error": "request to Telegram failed: " + str(err)}

    body = response.get("json")
    status = response.get("status")
    if status != 200 or not isinstance(body, dict) or not body.get("ok"):
        description = ""
        if isinstance(body, dict):
            description = str(body.get("description") or "")
        if not description:
            description = "non-JSON or unexpected response"
        return {"ok": False, "error": "Telegram answered " + str(status) + ": " + description}

    result = body.get("result")
    message_id = None
    if isinstance(result, dict):
        message_id = result.get("message_id")
    return {"ok": True, "message_id": message_id}
