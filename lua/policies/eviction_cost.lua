-- Eviction, cost-aware: keep what is expensive to recompute and used.
-- A node's recompute cost grows with its length and its depth (attention
-- over everything before it); its value is that cost times how often it is
-- hit, decayed by age. score(node) runs in the shadow simulator and the
-- REPL; C applies the linear weights (the runtime pushes them with
-- set_evict_weights): recent, hit, long entries stay; lowest goes first.
-- spill is plain data too: C reads min_tokens / min_hits when it evicts.
local AGE_HALF = 64          -- cache-clock ticks for the value to halve

local P = {
    kind = "eviction",
    version = "cost-1",
    weights = { recency = 1, hits = 8, tokens = 0.05, depth = 0.02 },
    pool_policy = "cost",
    -- With KV tiers (kv_dir, kv_host_mem) an evicted node spills down a
    -- tier unless it is shorter than this: a short tail costs less to
    -- prefill again than to read back (pushed with set_spill_policy).
    spill = { min_tokens = 32, min_hits = 0 },
}

function P.score(node)
    local cost = node.n_tokens * (1 + node.start / 512)
    local use = 1 + node.hits
    local age = math.max(0, (node.now or node.last_access) - node.last_access)
    return cost * use * 0.5 ^ (age / AGE_HALF) + node.last_access * 1e-3
end

function P.self_test()
    local hot = { n_tokens = 300, start = 0, hits = 10, last_access = 100, now = 100 }
    local cold = { n_tokens = 300, start = 0, hits = 0, last_access = 1, now = 100 }
    assert(P.score(hot) > P.score(cold), "a hot entry must outrank a cold one")
end

return P
