"""Operator settings: the environment (or an env file), never the store.

Operator policy never lives in the store. The agent can rewrite its own
config, but its budgets are clamped under the ceilings here, tools use only
the secrets bound here (and only towards the hosts they are bound to), and
fetch reaches private hosts only when they are listed here.

Load with :func:`load_settings`; ``BRAINSTEM_ENV_FILE`` names an optional
dotenv file whose values the real environment overrides. These settings and
their light half, :mod:`brainstem.core.environment`, are the only readers of
the environment and of that file.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from brainstem.core import environment, names
from brainstem.core.environment import default_store_url
from brainstem.core.errors import ConfigError
from brainstem.core.mcp_config import NO_SERVERS, MCPConfig, load_servers, secret_values
from brainstem.core.secrets import (
    BOT_TOKEN,
    LLM_KEY,
    LLM_KEY_NAME,
    LLM_KEYS,
    Binding,
    cleartext_ok,
    normalise_host,
    parse_bindings,
)

CommaList = Annotated[list[str], NoDecode]
TELEGRAM_API_DEFAULT = "https://api.telegram.org"
OPENROUTER_API = "https://openrouter.ai/api/v1"
OPENROUTER_HOST = "openrouter.ai"
NOT_OFFERED = "not offered by this server"  # a generic server's credit: there is no endpoint to ask
# Each LLM setting under its name and its older one: (field, older field, variable, older variable).
LLM_NAMES = (("llm_base_url", "openrouter_base_url", "BRAINSTEM_LLM_BASE_URL", "OPENROUTER_BASE_URL"),
             ("llm_api_key", "openrouter_api_key", LLM_KEY_NAME, LLM_KEY))
TELEGRAM_TOKEN_FORM = re.compile(r"[0-9]{1,20}:[A-Za-z0-9_-]{1,200}\Z")
TELEGRAM_CHAT_FORM = re.compile(r"-?[0-9]{1,20}\Z")


class Settings(BaseSettings):
    """Every operator setting, its environment variable, default and meaning."""

    # Read by the BRAINSTEM_* / OPENROUTER_* names only: with populate_by_name, pydantic-settings would also
    # take a field's bare name from the environment (Docker's HOSTNAME, another tool's KV_PREFIX or
    # MAX_DAILY_COST). Code that passes settings by field name goes through load_settings.
    model_config = SettingsConfigDict(extra="ignore", populate_by_name=False, case_sensitive=False)

    kv: str = Field(default_factory=default_store_url, validation_alias="BRAINSTEM_KV",
                    description="Store URL: redis://[:password@]host:port/db, sqlite:///relative.db "
                                "or sqlite:////absolute.db "
                                "(default: the embedded store in ~/.local/share/brainstem/brainstem.db)")
    kv_prefix: str | None = Field(None, validation_alias="BRAINSTEM_KV_PREFIX",
                           description="Agent name (keys under NAME:), so several agents can share one store, "
                                       "each confined to its own keys")
    llm_base_url: str = Field(OPENROUTER_API, validation_alias="BRAINSTEM_LLM_BASE_URL",
                              description="The LLM server: any OpenAI-compatible API (LiteLLM's proxy, vLLM, "
                                          "Ollama, OpenAI, a test double); a generic one, never asked for its "
                                          "credit, unless its host is openrouter.ai (docs/servers.md)")
    llm_api_key: SecretStr | None = Field(None, validation_alias="BRAINSTEM_LLM_API_KEY",
                                          description="The LLM server's key (the hard-coded tier-3 provider's)")
    openrouter_api_key: SecretStr | None = Field(None, validation_alias="OPENROUTER_API_KEY",
                                                 description="The older name of BRAINSTEM_LLM_API_KEY")
    openrouter_base_url: str = Field(OPENROUTER_API, validation_alias="OPENROUTER_BASE_URL",
                                     description="The older name of BRAINSTEM_LLM_BASE_URL: a server named by it "
                                                 "is treated as OpenRouter (its credit read from /key, "
                                                 "then /credits)")
    base_rpc_url: str = Field("https://mainnet.base.org", validation_alias="BASE_RPC_URL",
                              description="Base JSON-RPC endpoint for the USDC balance")
    wallet_address: str | None = Field(None, validation_alias="WALLET_ADDRESS",
                                       description="Wallet whose USDC balance on Base is ground truth "
                                                   "(read with web3: pip install 'brainstem[wallet]')")
    max_session_cost: float = Field(0.50, ge=0, validation_alias="BRAINSTEM_MAX_SESSION_COST",
                                    description="Ceiling in USD for one session; "
                                                "the agent's budget is clamped under it")
    max_daily_cost: float = Field(5.00, ge=0, validation_alias="BRAINSTEM_MAX_DAILY_COST",
                                  description="Ceiling in USD for all sessions of one UTC day")
    min_credit: float | None = Field(None, ge=0, allow_inf_nan=False, validation_alias="BRAINSTEM_MIN_CREDIT",
                                     description="Floor in USD on the LLM server's balance (read free, by the "
                                                 "runtime, from a server that offers one): below it no paid LLM "
                                                 "call is made, the session ends llm_no_credit and you are told "
                                                 "once (unset: no floor)")
    min_runway_days: float | None = Field(None, gt=0, allow_inf_nan=False, validation_alias="BRAINSTEM_MIN_RUNWAY_DAYS",
                                          description="Days: while the LLM balance would last fewer at the last 7 "
                                                      "days' mean spend, the runtime stretches the agent's sleep to "
                                                      "match (unset: never)")
    max_session_steps: int = Field(100, ge=0, validation_alias="BRAINSTEM_MAX_SESSION_STEPS",
                                   description="Ceiling on the steps one session may run")
    max_session_seconds: float = Field(1800, gt=0, validation_alias="BRAINSTEM_MAX_SESSION_SECONDS",
                                       description="Ceiling on one session's wall-clock time, in seconds")
    karma_retention_days: float = Field(30, gt=0, validation_alias="BRAINSTEM_KARMA_RETENTION_DAYS",
                                        description="Full karma is kept this many days; then only the "
                                                    "session_history summary remains")
    tool_secrets: CommaList = Field(default_factory=list, validation_alias="BRAINSTEM_TOOL_SECRETS",
                                    description="Secrets tools may use, each bound to the hosts it may reach: "
                                                "NAME@HOST (environment) or secret:NAME@HOST (store), comma list; "
                                                "a bare BRAINSTEM_LLM_API_KEY (or OPENROUTER_API_KEY) is bound "
                                                "to the LLM server's host")
    fetch_allow: CommaList = Field(default_factory=list, validation_alias="BRAINSTEM_FETCH_ALLOW",
                                   description="Extra hosts/CIDRs tool fetch may reach despite being private "
                                               "(comma list)")
    ground_truth_timeout: float = Field(10.0, gt=0, validation_alias="BRAINSTEM_GROUND_TRUTH_TIMEOUT",
                                        description="Seconds each balance check may take before it counts as unknown")

    llm_timeout: float = Field(120.0, gt=0, validation_alias="BRAINSTEM_LLM_TIMEOUT",
                               description="Seconds one LLM request may take")
    llm_max_attempts: int = Field(4, ge=1, le=10, validation_alias="BRAINSTEM_LLM_MAX_ATTEMPTS",
                                  description="Attempts per LLM request on 429/5xx/timeouts (exponential backoff)")
    llm_backoff: float = Field(1.0, ge=0, validation_alias="BRAINSTEM_LLM_BACKOFF",
                               description="First retry delay in seconds; doubles each retry, with jitter")

    tool_modes: CommaList = Field(default_factory=list, validation_alias="BRAINSTEM_TOOL_MODES",
                                  description="The least supervision a tool gets, whatever its meta says: "
                                              "NAME=supervised or NAME=manual, comma list; * for every tool, "
                                              "new for code whose exact bytes you have not approved under its "
                                              "name (brainstem tool pending)")

    @field_validator("min_credit", "min_runway_days", mode="before")
    @classmethod
    def _blank_number_is_unset(cls, v):
        return None if isinstance(v, str) and not v.strip() else v  # `BRAINSTEM_MIN_CREDIT=` in an env file

    @field_validator("tool_secrets", "fetch_allow", "tool_modes", mode="before")
    @classmethod
    def _split_commas(cls, v):
        if isinstance(v, str):
            return [part.strip() for part in v.split(",") if part.strip()]
        return v

    mcp_config: str | None = Field(None, validation_alias="BRAINSTEM_MCP_CONFIG",
                                   description="A JSON file of MCP servers ({\"mcpServers\": {NAME: {command, args, "
                                               "env} or {url, headers}}}) whose tools the agent may call as "
                                               "mcp__NAME__TOOL; their env and header values are secrets it never "
                                               "sees (docs/tools.md)")
    _mcp_cache: tuple[Any, MCPConfig] | None = PrivateAttr(None)

    dashboard_token: SecretStr | None = Field(None, validation_alias="BRAINSTEM_DASHBOARD_TOKEN",
                                              description="Token every dashboard request needs, loopback "
                                                          "included (16+ characters); unset, the dashboard makes "
                                                          "one and prints it once in the address to open")
    tool_write_quota: int = Field(10 * 1024 * 1024, ge=0, validation_alias="BRAINSTEM_TOOL_WRITE_QUOTA",
                                  description="Bytes one tool call may write to the store")
    session_write_quota: int = Field(50 * 1024 * 1024, ge=0, validation_alias="BRAINSTEM_SESSION_WRITE_QUOTA",
                                     description="Bytes all tool calls of one session may write to the store")
    review_max_per_session: int = Field(20, ge=0, validation_alias="BRAINSTEM_REVIEW_MAX_PER_SESSION",
                                        description="Runs of supervised tools one session may queue for review; "
                                                    "past it a supervised run is not run (review_dropped)")
    schedule_min_interval: int = Field(300, ge=1, validation_alias="BRAINSTEM_SCHEDULE_MIN_INTERVAL",
                                       description="Seconds: the shortest gap between two runs of a schedule the "
                                                   "agent writes (its schedule:ID keys); a faster one is refused. "
                                                   "Yours (brainstem schedule add) are not limited")
    schedule_max: int = Field(20, ge=0, validation_alias="BRAINSTEM_SCHEDULE_MAX",
                              description="Schedules the agent may have at once (yours are not counted); 0 lets "
                                          "it add none")
    deep_reflect_max_sessions: int = Field(100, ge=2, validation_alias="BRAINSTEM_DEEP_REFLECT_MAX_SESSIONS",
                                           description="Sessions: the longest the agent may put deep reflection "
                                                       "off (whatever its config:defaults or next_deep_reflect "
                                                       "say); it comes at most every 2nd session")
    deep_reflect_max_days: float = Field(30, gt=0, validation_alias="BRAINSTEM_DEEP_REFLECT_MAX_DAYS",
                                         description="Days: the longest the agent may put deep reflection off, "
                                                     "however few sessions it has")
    sandbox_pool: int = Field(4, ge=0, le=64, validation_alias="BRAINSTEM_SANDBOX_POOL",
                              description="Sandbox workers kept forked and locked down, ready for a session's next "
                                          "tool call (each still runs one call only); 0 forks each when its call "
                                          "comes. The process's, shared by its sessions: `brainstem wake` leaves "
                                          "none behind, `brainstem run` keeps them between sessions and gives "
                                          "them back when it stops")
    lease_seconds: float = Field(30.0, ge=1, le=300, validation_alias="BRAINSTEM_LEASE_SECONDS",
                                 description="The wake lease's period: a session renews its lease every third of "
                                             "it, and a dead host's agents are taken over within about two")
    hostname: str = Field("", validation_alias="BRAINSTEM_HOSTNAME",
                          description="This host's name in wake leases (default: the host name); set it where "
                                      "hosts share one name")
    # Named as their variables: pydantic-settings also reads a field's own name from the environment, and
    # a `telegram_bot_token` field would take an older TELEGRAM_BOT_TOKEN meant for BRAINSTEM_TOOL_SECRETS.
    brainstem_telegram_bot_token: SecretStr | None = Field(
        None, validation_alias="BRAINSTEM_TELEGRAM_BOT_TOKEN",
        description="Telegram bot token (from @BotFather): with the chat id, brainstem run polls the bot for the "
                    "operator's messages, and the runtime sends ctx.send_telegram's texts with it; never handed to "
                    "agent code")
    brainstem_telegram_chat_id: str | None = Field(
        None, validation_alias="BRAINSTEM_TELEGRAM_CHAT_ID",
        description="The operator's Telegram chat: only its texts reach the agent's inbox (texts from other chats "
                    "are counted, never shown); the only chat ctx.send_telegram sends to")
    brainstem_telegram_api_url: str = Field(
        TELEGRAM_API_DEFAULT, validation_alias="BRAINSTEM_TELEGRAM_API_URL",
        description="The Telegram Bot API (a self-hosted Bot API server, a test double) the runtime polls and "
                    "sends through")

    @field_validator("brainstem_telegram_bot_token", "brainstem_telegram_chat_id", "brainstem_telegram_api_url",
                     mode="before")
    @classmethod
    def _blank_is_unset(cls, v, info):
        if isinstance(v, str) and not v.strip():  # `BRAINSTEM_TELEGRAM_BOT_TOKEN=` in an env file: not set
            return TELEGRAM_API_DEFAULT if info.field_name == "brainstem_telegram_api_url" else None
        return v.strip() if isinstance(v, str) else v

    _llm_server: str = PrivateAttr("openrouter")

    @field_validator("llm_api_key", "openrouter_api_key", mode="before")
    @classmethod
    def _blank_key_is_unset(cls, v):
        return None if isinstance(v, str) and not v.strip() else v  # `OPENROUTER_API_KEY=` in an env file

    @model_validator(mode="after")
    def _check_bindings(self):
        self._resolve_llm()
        self._check_telegram()
        self.bindings()  # a malformed binding is a ConfigError (exit 2) at startup, not at the first tool run
        self._check_bot_token_unbound()
        self._check_secret_values()
        self.mode_floors()
        self.mcp_servers()  # a bad MCP file is one line at startup; a session reading it later records it
        self.prefix  # noqa: B018 -- a bad agent name is one line at startup too
        return self

    def _resolve_llm(self) -> None:
        """Both names of each LLM setting hold the one value given (the two given apart is an error), and
        the server's kind follows the name it was given by: OPENROUTER_BASE_URL names OpenRouter,
        BRAINSTEM_LLM_BASE_URL a generic server unless its host is openrouter.ai."""
        given = {f for f in self.model_fields_set if getattr(self, f) is not None}
        for new, old, new_var, old_var in LLM_NAMES:
            a, b = _plain(getattr(self, new)), _plain(getattr(self, old))
            if new in given and old in given and a != b:
                raise ConfigError(f"{new_var} and {old_var} are both set, to different values: they name one "
                                  f"setting, so set one of them ({new_var})")
            if new in given:
                setattr(self, old, getattr(self, new))
            elif old in given:
                setattr(self, new, getattr(self, old))
        host = normalise_host(urllib.parse.urlsplit(self.llm_base_url).hostname or "")
        named_openrouter = "openrouter_base_url" in given and "llm_base_url" not in given
        self._llm_server = "openrouter" if named_openrouter or host == OPENROUTER_HOST else "generic"

    @property
    def llm_server(self) -> str:
        """``openrouter`` (its credit read from /key, then /credits) or ``generic`` (an OpenAI-compatible
        server that offers no credit: never asked for one)."""
        return self._llm_server

    @property
    def llm_key(self) -> str | None:
        """The LLM server's key as text, or None when none is set."""
        return self.llm_api_key.get_secret_value() if self.llm_api_key is not None else None

    def _bound_value(self, b: Binding, given: Mapping[str, str]) -> str | None:
        """The value a binding of an environment secret hands over: the LLM key under either of its names."""
        if b.from_store:
            return None
        return self.llm_key if b.label in LLM_KEYS else given.get(b.label)

    @property
    def prefix(self) -> str:
        """The key prefix of the agent these settings select (``"NAME:"``, or ``""`` for the default
        agent): ``BRAINSTEM_KV_PREFIX``, else the store URL's ``?prefix=``."""
        return names.selected(self.kv, self.kv_prefix)

    @property
    def agent(self) -> str | None:
        """The name of the agent these settings select; None for the default agent."""
        return self.prefix[:-1] or None

    def mode_floors(self) -> dict[str, str]:
        """The operator's floor on each tool's mode (``*``: every tool), from ``BRAINSTEM_TOOL_MODES``."""
        out = {}
        for item in self.tool_modes:
            name, sep, mode = item.partition("=")
            name, mode = name.strip(), mode.strip()
            if not sep or not name or mode not in ("supervised", "manual", "automated"):
                raise ConfigError(f"BRAINSTEM_TOOL_MODES: {item!r} is not NAME=supervised or NAME=manual "
                                  "(* for every tool)")
            out[name] = mode
        return out

    def mcp_servers(self) -> MCPConfig:
        """The MCP servers of ``BRAINSTEM_MCP_CONFIG``, read again whenever the file changes (so a daemon's
        next session sees an edit); none when it is unset. A bad file is a one-line :class:`ConfigError`."""
        if not self.mcp_config:
            return NO_SERVERS
        path = Path(self.mcp_config).expanduser()
        try:
            st = path.stat()
            stamp: Any = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        if stamp is not None and self._mcp_cache is not None and self._mcp_cache[0] == stamp:
            return self._mcp_cache[1]
        found = load_servers(self.mcp_config)
        self._mcp_cache = (stamp, found)
        return found

    def bindings(self) -> dict[str, Binding]:
        """The operator's secret bindings, by label (``NAME`` or ``secret:NAME``). None holds the bot
        token: it is never bound (:meth:`_check_bot_token_unbound`)."""
        return parse_bindings(self.tool_secrets, self.llm_base_url)

    def _check_bot_token_unbound(self) -> None:
        """A binding that would hand the bot token to code, under its own name or another variable holding
        the same value, is a configuration error: code asks the runtime to send (``ctx.send_telegram``)."""
        token = self.telegram_bot_token.get_secret_value() if self.telegram_bot_token is not None else None
        given = environment.variables()
        for b in self.bindings().values():
            if b.label == BOT_TOKEN or (token and self._bound_value(b, given) == token):
                raise ConfigError(f"BRAINSTEM_TOOL_SECRETS binds {b.label}, which holds the Telegram bot token: "
                                  f"the bot token is never handed to agent code (tools send to the operator "
                                  f"with ctx.send_telegram); remove {b.label} from BRAINSTEM_TOOL_SECRETS")

    def _check_secret_values(self) -> None:
        """A bound environment secret must be printable ASCII: it goes into a header, URL or body as it is,
        and whether a request could go out must never depend on the value (a trailing newline, say)."""
        given = environment.variables()
        for b in self.bindings().values():
            value = self._bound_value(b, given)
            bad = next((c for c in value if not 32 <= ord(c) < 127), None) if value else None
            if bad is not None:
                raise ConfigError(f"BRAINSTEM_TOOL_SECRETS binds {b.label}, whose value holds {bad!r}: a secret "
                                  f"goes into a header or URL as it is, so it must be printable ASCII (a trailing "
                                  f"newline?); fix {b.label}")

    def public_settings(self) -> dict[str, str | None]:
        """Operator settings that are not credentials, handed as plain values to code that asks."""
        return {"BRAINSTEM_LLM_BASE_URL": self.llm_base_url, "OPENROUTER_BASE_URL": self.llm_base_url,
                "WALLET_ADDRESS": self.wallet_address,
                "BASE_RPC_URL": self.base_rpc_url, "TELEGRAM_CHAT_ID": self.telegram_chat_id,
                "TELEGRAM_API_URL": self.telegram_api_url.rstrip("/")}

    def allowed_secret_values(self) -> dict[str, str]:
        """The bound environment secrets that are set (in the environment or the env file), by name."""
        given = environment.variables()
        found = {b.label: self._bound_value(b, given) for b in self.bindings().values()}
        return {label: value for label, value in found.items() if value}

    def known_secrets(self) -> dict[str, str]:
        """Every secret value this process knows of, for redaction."""
        out = dict(self.allowed_secret_values())
        if self.llm_key:
            out.setdefault(LLM_KEY, self.llm_key)
        if self.dashboard_token is not None:
            out["BRAINSTEM_DASHBOARD_TOKEN"] = self.dashboard_token.get_secret_value()
        if self.telegram_bot_token is not None:
            out[BOT_TOKEN] = self.telegram_bot_token.get_secret_value()
            # The variable of an older setup, set as well and not bound, is not used, but it is still a secret.
            given = environment.variables().get("TELEGRAM_BOT_TOKEN")
            if given and given != out[BOT_TOKEN] and "TELEGRAM_BOT_TOKEN" not in out:
                out["TELEGRAM_BOT_TOKEN_UNUSED"] = given
        try:  # the MCP servers' env and header values: the operator's, never the agent's
            out.update(secret_values(self.mcp_servers()))
        except ConfigError:
            pass  # a file gone bad since startup: no server of it runs, so none of its values is handed anywhere
        return out

    # --- Telegram: the operator's chat with the agent ---

    @property
    def telegram_bot_token(self) -> SecretStr | None:
        return self.brainstem_telegram_bot_token

    @property
    def telegram_chat_id(self) -> str | None:
        return self.brainstem_telegram_chat_id

    @property
    def telegram_api_url(self) -> str:
        return self.brainstem_telegram_api_url

    @property
    def telegram_host(self) -> str:
        """The Telegram API's host (``BRAINSTEM_TELEGRAM_API_URL``): the only one the runtime sends the bot
        token to."""
        host = normalise_host(urllib.parse.urlsplit(self.telegram_api_url).hostname or "")
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            return host

    @property
    def telegram_polling(self) -> bool:
        """Whether ``brainstem run`` polls Telegram: the bot token and the operator's chat are both set."""
        return self.telegram_bot_token is not None and self.telegram_chat_id is not None

    def _check_telegram(self) -> None:
        """The Telegram settings, checked at startup; an error never shows the token."""
        token = self.telegram_bot_token.get_secret_value() if self.telegram_bot_token is not None else None
        if token is not None and not TELEGRAM_TOKEN_FORM.match(token):
            raise ConfigError("BRAINSTEM_TELEGRAM_BOT_TOKEN is not a bot token: @BotFather gives one of the form "
                              "123456789:AAE… (digits, a colon, then letters, digits, '_' and '-')")
        if self.telegram_chat_id is not None and not TELEGRAM_CHAT_FORM.match(self.telegram_chat_id):
            raise ConfigError(f"BRAINSTEM_TELEGRAM_CHAT_ID {self.telegram_chat_id[:40]!r} is not a chat id: a "
                              f"number such as 123456789 (a group's is negative: -1001234567890)")
        url = self.telegram_api_url
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port  # noqa: F841 -- a bad port is a ValueError here
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"BRAINSTEM_TELEGRAM_API_URL {url[:200]!r} is not an http(s) URL with a host, "
                              f"e.g. {TELEGRAM_API_DEFAULT}")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ConfigError("BRAINSTEM_TELEGRAM_API_URL has a user, query or fragment part: give the Bot API's "
                              f"base URL only, e.g. {TELEGRAM_API_DEFAULT}")
        if parts.scheme == "http" and not cleartext_ok(self.telegram_host):
            raise ConfigError(f"BRAINSTEM_TELEGRAM_API_URL {url[:200]!r} is plain http to a remote host: the bot "
                              f"token would cross the network in clear; use https (plain http only to loopback or "
                              f"private addresses)")


def _plain(value: Any) -> Any:
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def load_settings(**overrides) -> Settings:
    """Settings from the environment (and ``BRAINSTEM_ENV_FILE``); a bad value is one clear error."""
    env_file = environment.env_file()
    if env_file and not Path(env_file).is_file():
        raise ConfigError(f"BRAINSTEM_ENV_FILE names {env_file!r}, which is not a file")
    by_alias: dict[str, Any] = {}
    for name, value in overrides.items():
        field = Settings.model_fields.get(name)
        alias = field.validation_alias if field is not None else None
        by_alias[alias if isinstance(alias, str) else name] = value
    try:
        return Settings(_env_file=env_file, **by_alias)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = err.get("loc", ("?",))[0]
        raise ConfigError(f"setting {where}: {err['msg']} (got {err.get('input')!r})") from None


def settings_reference() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) for every setting: the table in docs/configuration.md is checked against this."""
    rows = []
    for name, f in Settings.model_fields.items():
        default = f.default if f.default_factory is None else ("(see meaning)" if name == "kv" else "")
        if isinstance(default, list):
            default = ""
        rows.append((str(f.validation_alias), "" if default is None else str(default), f.description or ""))
    return rows
