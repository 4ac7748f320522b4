-- Eviction: shortest entry first (a full pool's default, docs/prefix-pool.md).
return {
    kind = "eviction",
    version = "shortest-1",
    weights = { recency = 0, hits = 0, tokens = 1, depth = 0 },
    pool_policy = "shortest",
    score = function(node)
        return node.n_tokens
    end,
}
