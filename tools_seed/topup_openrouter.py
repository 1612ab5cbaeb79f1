# topup_openrouter: a placeholder that says honestly it cannot do anything.
# Buying OpenRouter credit with USDC needs an on-chain payment (a signed
# transaction from the wallet), and Brainstem ships no signing key or flow.

NOT_IMPLEMENTED = (
    "not implemented: topping up OpenRouter from the wallet needs an on-chain "
    "payment flow that Brainstem does not ship; ask the operator"
)


def execute(args, ctx):
    return {"ok": False, "error": NOT_IMPLEMENTED}
