-- Eviction policies pushed into C as data: weights, linearized scores,
-- pool policies, reloads.
local policy = require "tinyloop.policy"

local function fake_model()
    local m = { pushed = {} }
    function m:set_evict_weights(w)
        self.pushed[#self.pushed + 1] = w
    end
    return m
end


local function fake_pool()
    local p = { policies = {} }
    function p:set_policy(x)
        self.policies[#self.policies + 1] = x
    end
    return p
end


describe("policy.eviction_weights()", function()
    it("passes a policy's weights through, missing ones as 0", function()
        local v = assert(policy.compile("return { kind = 'eviction', version = '1', weights = { hits = 2 } }", "e"))
        assert.same({ recency = 0, hits = 2, tokens = 0, depth = 0 }, policy.eviction_weights(v))
    end)

    it("linearizes a score-only policy", function()
        local v = assert(policy.compile([[return { kind = 'eviction', version = '1',
            score = function(n) return 2 * n.last_access + 3 * n.hits - n.n_tokens + 0.5 * n.start end }]], "e"))
        local w = policy.eviction_weights(v)
        assert.near(2, w.recency, 1e-9)
        assert.near(3, w.hits, 1e-9)
        assert.near(-1, w.tokens, 1e-9)
        assert.near(0.5, w.depth, 1e-9)
    end)
end)


describe("policy.eviction_runtime()", function()
    it("pushes each swapped-in version into the model and its pools", function()
        local m, p = fake_model(), fake_pool()
        local rt = policy.eviction_runtime(m, { kind = "eviction", pools = { p },
            source = "return { kind = 'eviction', version = 'a', weights = { recency = 1 }, pool_policy = 'lru' }" })
        assert.same({ { recency = 1, hits = 0, tokens = 0, depth = 0 } }, m.pushed)
        assert.same({ "lru" }, p.policies)
        assert.is_truthy(rt:set_source(
            "return { kind = 'eviction', version = 'b', weights = { tokens = 1 }, pool_policy = 'shortest' }"))
        assert.same({ recency = 0, hits = 0, tokens = 1, depth = 0 }, m.pushed[2])
        assert.same({ "lru", "shortest" }, p.policies)
    end)

    it("pushes nothing for a rejected version", function()
        local m = fake_model()
        local rt = policy.eviction_runtime(m, { source = "return { kind = 'eviction', version = 'a', weights = {} }" })
        assert.is_nil(rt:set_source("return { kind = 'eviction', version = 'b', score = function() return 'x' end }"))
        assert.equal(1, #m.pushed)
        assert.equal("a", rt.current.version)
    end)
end)
