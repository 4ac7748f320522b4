-- Eviction: least recently used first (the tree's default). Pushed into C
-- as weights: score = recency*last_access + hits*hits + tokens*n_tokens +
-- depth*start; the lowest score is evicted first.
return {
    kind = "eviction",
    version = "lru-1",
    weights = { recency = 1, hits = 0, tokens = 0, depth = 0 },
    pool_policy = "lru",
    score = function(node)
        return node.last_access
    end,
    self_test = function()
        assert(#"lru" == 3)
    end,
}
