"""Every KV key name the runtime uses, in one place.

Names here are part of the external contract: operators and tools outside the
repo read them. Functions build the parameterised ones.
"""

SOUL = "soul"
WISDOM = "wisdom"
PROMPT_ORIENT = "prompt:orient"
PROMPT_REFLECT = "prompt:reflect"
PROMPT_DEEP = "prompt:deep"
PROMPT_SUBPLAN = "prompt:subplan"
CONFIG_DEFAULTS = "config:defaults"
CONFIG_MODELS = "config:models"
CONFIG_RESOURCES = "config:resources"
CONFIG_TOOL_REGISTRY = "config:tool_registry"
CONFIG_REFLEXES = "config:reflexes"  # JSON rules checked before orient (validated on every write)
WAKE_CONFIG = "wake_config"
LAST_REFLECT = "last_reflect"
SESSION_COUNTER = "session_counter"
SESSION_CURRENT = "session:current"  # the running session's breadcrumb: still there at the next wake, it died
SESSION_LAST_COMPLETED = "session:last_completed"
SESSION_LAST_STARTED = "session:last_started"
SESSION_HISTORY = "session_history"
DEEP_REFLECT_SCHEDULE = "deep_reflect_schedule"
PROVIDER_LLM_CODE = "provider:llm:code"
PROVIDER_LLM_META = "provider:llm:meta"
PROVIDER_LLM_LAST_WORKING_CODE = "provider:llm:last_working:code"
PROVIDER_LLM_LAST_WORKING_META = "provider:llm:last_working:meta"
PROVIDER_LLM_BALANCE_CODE = "provider:llm_balance:code"
PROVIDER_WALLET_BALANCE_CODE = "provider:wallet_balance:code"
WAKE_LOG = "wake_log"

# The runtime's own bookkeeping (runtime-owned: stats:*, history:*).
LAST_GROUND_TRUTH = "stats:last_ground_truth"  # what status shows of the balances
DAILY_COST = "stats:daily_cost"  # today's spend, across sessions
DAILY_SIMULATED_COST = "stats:daily_simulated_cost"  # today's cassette answers' cost: shown, never spent
COST_ANOMALIES = "stats:cost_anomalies"  # today's calls billed above their worst case
SPEND_DAYS = "stats:spend_days"  # each recent UTC day's spend (its total as last settled): the runway's mean
# The runtime's own read of the LLM credit, the floor holding (BRAINSTEM_MIN_CREDIT), the circuit breaker a 402
# opened, and the notice the operator was sent about them (once each time credit runs out)
LLM_CREDIT = "stats:llm_credit"
READS = "stats:reads"  # per-key read counts, for deep reflection's pruning
NOTES = "stats:notes"  # the agent's notes to its future self
REJECTED_SESSION_HISTORY = "stats:rejected_session_history"  # a history that could not be read whole
LAST_CLEAN_SNAPSHOT = "stats:last_clean_snapshot"  # what the last clean session ran with
AUTO_RESTORE_MARK = "stats:auto_restore"  # the failing streak auto-restore already answered
LAST_WORKING_DEEP = "stats:last_working_deep"  # what the last deep reflection that worked ran on
OPERATOR_WRITE_PREFIX = "stats:operator_write:"  # the operator's latest write of each versioned key
AGENT_SECRET_PREFIX = "stats:agent_secret:"  # digests of the values the agent wrote to each secret:* key
VERSIONS_PREFIX = "history:"  # history:{key} holds the previous versions of a self-modified key
UNLISTED_KARMA = "stats:unlisted_karma"  # karma with no history entry (dry runs, reflex wakes), for retention
REFLEX_STATE = "stats:reflexes"  # when each reflex last fired (its cooldown)
REPLAY_GATE = "stats:replay_gate"  # the last replay check of a change deep reflection proposed
REVIEW_COUNTER = "stats:review_counter"  # the last review item id handed out
OPERATOR_MODELS = "stats:operator_models"  # the price list the operator last wrote: the floor of every price
SECRET_REFUSALS = "stats:secret_refusals"  # how often code was stopped for sending a secret's value
INBOX = "inbox"  # a log: the operator's messages to the agent (brainstem tell, Telegram), JSON each
INBOX_NOTICES = "inbox:notices"  # a log: the agent's own messages for the operator (schedule results), JSON each
INBOX_REPLIES = "inbox:replies"  # a log: the agent's replies to inbox messages (plan reply steps), JSON each
INBOX_COUNTER = "stats:inbox_counter"  # the last inbox message id handed out
INBOX_READ = "stats:inbox_read"  # the highest inbox id shown to the agent in a session that ended
INBOX_URGENT = "stats:inbox_urgent"  # the highest urgent inbox id: above the read and shown marks, the agent is due
INBOX_SHOWN = "stats:inbox_shown"  # the highest inbox id put before the model (answered or not): wakes once
DAEMON_FAILING = "stats:daemon"  # why `brainstem run` cannot wake the agent, and since when; gone once a fire succeeds
DAEMON_SEEN = "stats:daemon_seen"  # the last `brainstem run` serving the agent: host, pid, when it last said so
TELEGRAM_STATE = "stats:telegram"  # the Bot API update offset, and texts from other chats (counted, never shown)
REVIEW_PREFIX = "review:"  # review:{id}: one run of a supervised tool, waiting for (or settled by) the operator
# approved:{code key}: the code the operator approved under that key (its bytes and their sha256)
APPROVED_PREFIX = "approved:"
# schedule:{id}: a scheduled action, JSON: one tool with a fixed input at set times, no model in between
SCHEDULE_PREFIX = "schedule:"
# stats:schedule_running:{id}: the run of a schedule under way (its run id, owner, scheduled time); still there
# with its run lease gone, the run died
SCHEDULE_RUNNING_PREFIX = "stats:schedule_running:"
SCHEDULE_PROBLEMS = "stats:schedule_problems"  # the values under schedule: reported as not schedules (key -> digest)
BOOKKEEPING_PREFIXES = ("stats:", VERSIONS_PREFIX, REVIEW_PREFIX, APPROVED_PREFIX)  # never in the agent's key index

WAKE_LEASE = "wake"  # a lease name (the store keeps leases apart from values): the session's lease
TELEGRAM_LEASE = "telegram"  # a lease name: the one process polling the agent's Telegram bot
SCHEDULE_CLAIM_LEASE = "schedule_claim:"  # + id, a lease name: the one process deciding a schedule's due run
SCHEDULE_RUN_LEASE = "schedule_run:"  # + id, a lease name: the schedule's run under way (no run overlaps it)

# While a session holds its wake lease, every write it makes through its store view is fenced: it goes
# through only if the lease is still the session's, checked by the store in the same atomic operation
# (``brainstem.store.fenced.FencedStore``). A session whose lease ran out, or was taken over by another
# host, so writes nothing at all. These keys are not the session's to fence: the daemon's log of its fires.
UNFENCED = frozenset({WAKE_LOG})


def karma(session_id: str) -> str:
    return f"karma:{session_id}"


def tool_code(name: str) -> str:
    return f"tool:{name}:code"


def tool_meta(name: str) -> str:
    return f"tool:{name}:meta"


def provider_code(name: str) -> str:
    return f"provider:{name}:code"


def code_key(name: str) -> str:
    """Where the code a mode floor calls ``name`` lives: ``notify`` -> ``tool:notify:code``,
    ``provider:llm`` -> ``provider:llm:code``."""
    return f"{name}:code" if name.startswith("provider:") else tool_code(name)


def code_name(key: str) -> str | None:
    """The name a mode floor uses for the code stored at ``key`` (``notify``, ``provider:llm``), or None
    when ``key`` holds no tool's or provider's code."""
    parts = key.split(":")
    if len(parts) == 3 and parts[0] in ("tool", "provider") and parts[2] == "code" and parts[1]:
        return parts[1] if parts[0] == "tool" else f"provider:{parts[1]}"
    return None


def approved(name: str) -> str:
    """The operator's approval of the code a mode floor calls ``name``."""
    return APPROVED_PREFIX + code_key(name)


def review_item(item_id: str) -> str:
    return f"{REVIEW_PREFIX}{item_id}"


def schedule(schedule_id: str) -> str:
    return f"{SCHEDULE_PREFIX}{schedule_id}"


def schedule_running(schedule_id: str) -> str:
    return f"{SCHEDULE_RUNNING_PREFIX}{schedule_id}"


def tooldata_prefix(name: str) -> str:
    return f"tooldata:{name}:"


SECRET_PREFIX = "secret:"


def secret(name: str) -> str:
    return f"{SECRET_PREFIX}{name}"


def operator_write(key: str) -> str:
    return f"{OPERATOR_WRITE_PREFIX}{key}"


def agent_secret_log(key: str) -> str:
    return f"{AGENT_SECRET_PREFIX}{key}"


def is_secret(key: str) -> bool:
    """Secrets are the operator's: the agent may write one, never read one (nor move it)."""
    return key.startswith(SECRET_PREFIX)


# Keys only the runtime writes. The agent changes them through the plan and
# reflection fields that the runtime validates and clamps (next_wake_config,
# next_deep_reflect...), never directly.
RUNTIME_OWNED = frozenset({
    SOUL, WAKE_CONFIG, LAST_REFLECT, SESSION_COUNTER, SESSION_HISTORY, DEEP_REFLECT_SCHEDULE, WAKE_LOG, INBOX,
})
RUNTIME_OWNED_PREFIXES = ("session:", "karma:", "history:", "stats:", "inbox:", REVIEW_PREFIX, APPROVED_PREFIX,
                          "provider:llm:last_working:", "provider:llm_balance:last_working:",
                          "provider:wallet_balance:last_working:")

# Writes to these keep the previous value, so the operator can roll them back.
PRIVILEGED_PREFIXES = ("config:", "prompt:", "tool:", "provider:")
PRIVILEGED_KEYS = frozenset({WISDOM})


def is_runtime_owned(key: str) -> bool:
    return key in RUNTIME_OWNED or key.startswith(RUNTIME_OWNED_PREFIXES)


def is_privileged(key: str) -> bool:
    return key in PRIVILEGED_KEYS or key.startswith(PRIVILEGED_PREFIXES)


def defines_agent(key: str) -> bool:
    """The keys that make the agent what it is (its soul, prompts, config, tools and adapters), as replay
    tests a change of them: a replay reads them as they are today, and its memory as the session saw it."""
    return key == SOUL or key.startswith(PRIVILEGED_PREFIXES)


# First segments of the default agent's own keys (``soul``, ``config:*``, ``karma:*``...). An agent
# sharing the store is named by its key prefix ``NAME:``, and no agent may be named one of these:
# its keys would be indistinguishable from the default agent's. Keys starting with one of them are
# also the default agent's without a registry lookup, which keeps its hot paths free of round trips.
DEFAULT_AGENT_SEGMENTS = frozenset({
    "soul", "wisdom", "prompt", "config", "tool", "tooldata", "provider", "secret", "session", "karma",
    "history", "stats", "wake_config", "wake_log", "last_reflect", "session_counter", "session_history",
    "deep_reflect_schedule", "review", "inbox", "approved", "schedule", "schedule_claim", "schedule_run",
})
