"""Karma event names: the flight recorder's vocabulary, in one place.

These strings are part of the external contract: operators grep karma for
them and their scripts rely on them, so a name never changes once released.
"""

SESSION_START = "session_start"
SESSION_END = "session_end"
CRASH_DETECTED = "crash_detected"
HISTORY_DAMAGED = "history_damaged"  # a session_history entry is not readable JSON (listed as damaged; once each)
LEASE_LOST = "lease_lost"  # the session's wake lease ran out or was taken over: it stopped, its end left to the next
GROUND_TRUTH = "ground_truth"
EFFORT = "effort"
BUDGET = "budget"
LLM_CALL = "llm_call"
LLM_ERROR = "llm_error"
PROVIDER_FALLBACK = "provider_fallback"
MODEL_FALLBACK = "model_fallback"
# A call no provider answered: its request (as an llm_call's), the error, and the fault and HTTP status when
# it was the provider's; replay gives the same request the same failure.
LLM_FAILED = "llm_failed"
PLAN = "plan"
ORIENT_PARSE_ERROR = "orient_parse_error"
STEP_START = "step_start"
STEP_COMPLETE = "step_complete"
STEP_SKIPPED = "step_skipped"
STEP_FAILED = "step_failed"
RETRY_FAILED = "retry_failed"
UNKNOWN_STEP_TYPE = "unknown_step_type"
AGENT_CALL_REJECTED = "agent_call_rejected"  # an agent step's tool call not run: a tool not offered, bad arguments
AGENT_WRAP_UP = "agent_wrap_up"  # an agent step asked for its answer: max_turns reached, or cost/time running low
TOOL_START = "tool_start"
TOOL_COMPLETE = "tool_complete"
TOOL_LOG = "tool_log"
# One MCP server's tools as a session listed them (their descriptions and input schemas, which were offered,
# which not and why), or why it could not be asked: once per server and session; replay offers the same.
MCP_TOOLS = "mcp_tools"
MCP_CONFIG_INVALID = "mcp_config_invalid"  # BRAINSTEM_MCP_CONFIG went bad after startup: no MCP tool this session
SECRET_NOT_GRANTED = "secret_not_granted"
SECRET_REFUSED = "secret_refused"  # a request would have carried a secret to a host it is not bound to
FETCH = "fetch"  # one ctx.fetch: method, scheme, host, port, path, status or error, bytes, ms, secrets put in
TELEGRAM_SENT = "telegram_sent"  # one ctx.send_telegram: chat, chars, bytes, message_id or error, ms
COST_ANOMALY = "cost_anomaly"  # a host reported more than the request could cost
USAGE_IMPLAUSIBLE = "usage_implausible"  # reported prompt tokens under a quarter of the estimate: priced at it
SPEND_OVERRUN = "spend_overrun"  # a request billed above the worst case reserved for it: booked as billed
SPEND_SETTLED = "spend_settled"  # a call's cost booked after the session's lease was lost (its llm_call refused)
QUOTA_EXCEEDED = "quota_exceeded"  # a tool write refused by the write quota
BUDGET_EXCEEDED = "budget_exceeded"
TRIPWIRE_FIRED = "tripwire_fired"
SUBPLAN_DEPTH_EXCEEDED = "subplan_depth_exceeded"
CONDITIONAL_NO_MATCH = "conditional_no_match"
TEMPLATE_MISSING_VARIABLE = "template_missing_variable"
KV_WRITE = "kv_write"
KV_WRITE_REFUSED = "kv_write_refused"
KV_OPERATIONS_REJECTED = "kv_operations_rejected"
REFLECT = "reflect"
REFLECT_PARSE_ERROR = "reflect_parse_error"
REFLECT_CALL_FAILED = "reflect_call_failed"  # the reflection's LLM call failed (provider, budget): no answer to parse
# The LLM endpoint failed for a reason that is the operator's or the provider's, not the agent's.
LLM_FAULT = "llm_fault"
# A wake kept from every paid LLM call: the credit below BRAINSTEM_MIN_CREDIT (cause "floor"), or the breaker a
# 402 opened still open (cause "breaker"); the credit read, the floor, when a paid try is allowed again.
CREDIT_FLOOR = "credit_floor"
# The 402 circuit breaker: "open" (a 402 tripped it), "probe" (its backoff passed: a paid try is allowed),
# "closed" (a free balance read showed credit again)
CREDIT_BREAKER = "credit_breaker"
OPERATOR_NOTICE = "operator_notice"  # the runtime told the operator something (inbox, Telegram): what and where
SLEEP_STRETCHED = "sleep_stretched"  # runway under BRAINSTEM_MIN_RUNWAY_DAYS: the sleep asked for, and slept
STORE_ERROR = "store_error"  # the store became unreachable mid-session
SIGNAL = "signal"  # SIGTERM/SIGINT received by a wake: the session stops and is recorded as interrupted
DEEP_REFLECT = "deep_reflect"
CONFIG_REJECTED = "config_rejected"
AUTO_RESTORE = "auto_restore"
FATAL_ERROR = "fatal_error"
# What replay needs to run a session again: orient's context as the session saw it (bounded by the
# memory caps in config:defaults; marks of untrusted text kept).
CONTEXT = "context"
TOOL_WOULD_DO = "tool_would_do"  # a tool call not made (a dry run, or a tool in manual mode), with its input
REVIEW_QUEUED = "review_queued"  # a supervised tool ran; its run waits in the review inbox
REVIEW_DROPPED = "review_dropped"  # a supervised run not run: its session queued all the review it may
REFLEX_FIRED = "reflex_fired"
REFLEX_SUPPRESSED = "reflex_suppressed"  # a reflex whose condition held, held back by its cooldown
REFLEX_FAILED = "reflex_failed"  # a reflex's tool is missing or failed: the wake goes on to orient
REPLAY_GATE = "replay_gate"  # deep reflection's proposed change, replayed on recent sessions before it applied
# At a session's end: each key its tools read from the store, as first read (``values``; null: absent),
# so a replay's tools read what they did; ``too_large`` instead past the bound of a context entry.
TOOL_READS = "tool_reads"
INBOX_SHOWN = "inbox_shown"  # the operator's unread messages (ids) put in the orient prompt
INBOX_READ = "inbox_read"  # at the end of a session whose orient call was answered: those messages marked read
# A reply step: the message answered, the text, whether it was kept (not in a dry run or a replay) and, for a
# message from Telegram, whether it was sent there.
INBOX_REPLY = "inbox_reply"
# One run of a schedule, or one decision not to run it: id, scheduled, outcome (see brainstem.state.schedules), cost.
SCHEDULE_RUN = "schedule_run"

ALL = frozenset(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str))
