"""The production backend: Redis or a Redis Cluster (:mod:`.store`), reaching the server (:mod:`.client`),
its key layout and Lua scripts (:mod:`.scripts`) and its failures as the store's (:mod:`.errors`)."""

from brainstem.store.redis.store import RedisStore

__all__ = ["RedisStore"]
