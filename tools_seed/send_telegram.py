# send_telegram: send a text message to the operator through a Telegram bot.
# The bot token must never appear in a result or an error message.

DEFAULT_API_BASE = "https://api.telegram.org"
MAX_TEXT_CHARS = 4096
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def redact(message, token):
    message = str(message)
    if token:
        message = message.replace(token, "***")
    return message


def is_object(value):
    # True for a JSON object. Duck-typed: the sandbox's builtins may lack `dict`.
    if value is None or isinstance(value, (str, int, float, bool)):
        return False
    try:
        value.items()
        return True
    except Exception:
        return False


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
        return {"ok": False, "error": "no chat_id given and secret TELEGRAM_CHAT_ID is not available"}

    api_base = args.get("api_base") or DEFAULT_API_BASE
    if not isinstance(api_base, str):
        raise ValueError("'api_base' must be a string")
    while api_base.endswith("/"):
        api_base = api_base[:-1]
    # The token travels in the URL path: only send it to Telegram itself or to
    # a Bot API server on this machine (self-hosted, or a test double).
    host = url_host(api_base)
    if not (host in LOOPBACK_HOSTS or (host == "api.telegram.org" and api_base.lower().startswith("https://"))):
        return {"ok": False, "error": "api_base must be https://api.telegram.org or a loopback URL"}

    url = api_base + "/bot" + token + "/sendMessage"
    try:
        response = ctx.fetch(url, method="POST", json={"chat_id": chat_id, "text": text}, timeout=10)
    except Exception as err:
        return {"ok": False, "error": "request to Telegram failed: " + redact(err, token)}

    body = response.get("json")
    status = response.get("status")
    if status != 200 or not is_object(body) or not body.get("ok"):
        description = ""
        if is_object(body):
            description = str(body.get("description") or "")
        if not description:
            description = "non-JSON or unexpected response"
        return {"ok": False, "error": "Telegram answered " + str(status) + ": " + redact(description, token)}

    result = body.get("result")
    message_id = None
    if is_object(result):
        message_id = result.get("message_id")
    return {"ok": True, "message_id": message_id}
