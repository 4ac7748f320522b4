-- Example eviction policy: protect long, shared, recently hit prefixes;
-- shed short one-off continuations first. C applies `weights` (pushed with
-- set_evict_weights, no callbacks); `score` is what the shadow simulator
-- runs with mode = "score" and what policy.eviction_weights linearizes
-- when a policy gives no weights.
local P = { kind = "eviction", version = "example-hot-prefix-1", pool_policy = "cost" }

P.weights = { recency = 1, hits = 16, tokens = 0.1, depth = 0.05 }

function P.score(node)
    local value = node.n_tokens * (1 + node.hits)
    if node.shareable then
        value = value * 4              -- the operator prompt serves everyone
    end
    return node.last_access + value * 0.01
end

function P.self_test()
    local shared = { n_tokens = 400, hits = 3, last_access = 10, shareable = true }
    local tail = { n_tokens = 20, hits = 0, last_access = 12, shareable = false }
    assert(P.score(shared) > P.score(tail), "a hot shared prefix outlives a cold tail")
end

return P
