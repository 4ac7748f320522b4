-- Trace-driven: a small synthetic multi-tenant trace replayed against a
-- small KV cache under LRU, shortest-first and the cost-aware Lua policy;
-- the shadows' predictions (run beside the LRU live cache) must match what
-- each policy measures when switched to. The large version is
-- tools/trace_bench.lua.
local helpers = require "helpers"
local tl = require "tinyloop"
local policy = require "tinyloop.policy"
local trace = require "tinyloop.policy.trace"

local function version(name)
    return assert(policy.compile(helpers.read(helpers.root .. "/lua/policies/" .. name .. ".lua"), name))
end


describe("trace replay", function()
    local model_path
    setup(function()
        model_path = helpers.tmpdir() .. "/trace.gguf"
        local out, ok = helpers.run("'" .. helpers.root .. "/bin/tl-gen-model' '" .. model_path
            .. "' --ctx 1024 --dim 32 --layers 1 --heads 2 --kv-heads 1 --ff 64 --vocab 320")
        assert(ok, out)
    end)

    local OPTS = { tenants = 8, requests = 80, sys_min = 40, sys_max = 300, user_min = 8, user_max = 24,
                   ctx = 1024, max_turns = 5, seed = 3 }

    it("generates the same trace for the same seed", function()
        local a = trace.generate(OPTS)
        local b = trace.generate(OPTS)
        assert.same(a, b)
        assert.equal(80, #a)
    end)

    it("reports hit rates per policy and the shadows predict the switch", function()
        local reqs, tenants, op = trace.generate(OPTS)
        local names = { lru = "eviction_lru", shortest = "eviction_shortest", cost = "eviction_cost" }
        local shadows = {}
        for k, f in pairs(names) do
            shadows[k] = version(f)
        end
        local measured, predicted = {}, nil
        for _, k in ipairs { "lru", "shortest", "cost" } do
            -- 96 KV blocks of 16 tokens, one layer: far less than the trace's working set
            local m = tl.Model(model_path, { max_seq_len = 1024, kv_mem = 96 * 512 })
            local r = trace.replay(m, reqs, tenants, op, { policy = shadows[k], shadows = k == "lru" and shadows })
            m:close()
            assert.equal(0, r.failed)
            assert.is_true(r.evictions > 0)
            assert.is_true(r.hit_rate > 0.05 and r.hit_rate < 1)
            measured[k] = r
            if k == "lru" then
                predicted = r.shadow
                assert.equal(r.saved, predicted.live.hit_tokens)
            end
        end
        for k in pairs(names) do
            assert.is_true(math.abs(predicted[k].hit_rate - measured[k].hit_rate) < 0.02,
                string.format("%s: shadow %.3f, measured %.3f", k, predicted[k].hit_rate, measured[k].hit_rate))
        end
    end)
end)
