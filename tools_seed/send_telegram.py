# send_telegram: send a text message to the operator on Telegram.
# The runtime sends it (ctx.send_telegram): this code never holds the bot
# token, not even a placeholder for it, and no chat but the operator's
# (BRAINSTEM_TELEGRAM_CHAT_ID) can be reached. When Telegram is not set up,
# or the message was not sent, the tool fails and says why.

MAX_TEXT_CHARS = 4096


def execute(args, ctx):
    text = args.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("send_telegram needs 'text' (a non-empty string)")
    for name in ("chat_id", "api_base"):
        if args.get(name) not in (None, ""):
            raise ValueError("send_telegram sends to the operator's chat only; '" + name + "' is not taken")
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS - 1] + "…"
    sent = ctx.send_telegram(text)
    return {"ok": True, "message_id": sent.get("message_id")}
