-- Trace-driven eviction benchmark: a synthetic multi-tenant trace (20
-- tenants, Zipf popularity, system prompts of 200-1,500 tokens, multi-turn
-- sessions, salts per tenant) replayed against a small KV cache under LRU,
-- the seed's shortest-first and the cost-aware Lua policy
-- (lua/policies/eviction_*.lua). Reports hit rate and prefill tokens saved
-- per policy, and what the shadows (run beside the LRU live cache)
-- predicted for each policy against what it measures when switched to --
-- for whole runs and for a switch from LRU to cost-aware halfway through.
--
--   luajit tools/trace_bench.lua [--requests 400] [--tenants 20] [--kv-blocks 384]
--       [--seed 7] [--model PATH]   (default: a synthetic model from bin/tl-gen-model)
local root = (arg[0]:match("^(.*)/tools/[^/]*$") or ".")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path

local tl = require "tinyloop"
local policy = require "tinyloop.policy"
local trace = require "tinyloop.policy.trace"

local opts = { requests = 400, tenants = 20, ["kv-blocks"] = 384, seed = 7 }
local i = 1
while i <= #arg do
    local k = arg[i]:match("^%-%-(.+)$")
    if not k or arg[i + 1] == nil then
        io.stderr:write("usage: trace_bench.lua [--requests N] [--tenants N] [--kv-blocks N] [--seed N] [--model P]\n")
        os.exit(2)
    end
    opts[k] = tonumber(arg[i + 1]) or arg[i + 1]
    i = i + 2
end

local model_path = opts.model
if not model_path then
    model_path = os.tmpname() .. ".gguf"
    assert(os.execute("'" .. root .. "/bin/tl-gen-model' '" .. model_path
        .. "' --ctx 2048 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 320 >/dev/null") == 0,
        "tl-gen-model failed")
end

local function version(name)
    local f = assert(io.open(root .. "/lua/policies/" .. name .. ".lua", "rb"))
    local src = f:read("*a")
    f:close()
    return assert(policy.compile(src, name))
end

local NAMES = { "lru", "shortest", "cost" }
local V = { lru = version("eviction_lru"), shortest = version("eviction_shortest"), cost = version("eviction_cost") }

local function open_model()
    -- kv_mem: bytes for kv-blocks blocks; a block's size comes from a probe
    local probe = tl.Model(model_path, { max_seq_len = 2048 })
    local info = probe:info()
    local per_block = info.kv_bytes / info.kv_blocks_total
    probe:close()
    return tl.Model(model_path, { max_seq_len = 2048, kv_mem = math.floor(opts["kv-blocks"] * per_block) })
end

local reqs, tenants, op = trace.generate { tenants = opts.tenants, requests = opts.requests, seed = opts.seed,
                                           sys_min = 200, sys_max = 1500, ctx = 2048 }
local sys_tokens = 0
for _, t in ipairs(tenants) do
    sys_tokens = sys_tokens + #t.system
end
local m0 = open_model()
local info = m0:info()
m0:close()
print(string.format("trace: %d requests, %d tenants (Zipf 1.1), system prompts %d tokens in all; "
    .. "KV %d blocks of %d tokens x %d layers (%d positions)", #reqs, #tenants, sys_tokens,
    info.kv_blocks_total, info.kv_block_size, info.n_layer,
    info.kv_blocks_total / info.n_layer * info.kv_block_size))

local measured, predicted = {}, nil
for _, k in ipairs(NAMES) do
    local m = open_model()
    local r = trace.replay(m, reqs, tenants, op, { policy = V[k], shadows = k == "lru" and V or nil })
    m:close()
    measured[k] = r
    if k == "lru" then
        predicted = r.shadow
    end
end

print(string.format("\n%-10s %9s %14s %14s %10s %9s %8s", "policy", "hit_rate", "tokens_saved", "prompt_tokens",
    "evictions", "shadow", "seconds"))
for _, k in ipairs(NAMES) do
    local r = measured[k]
    print(string.format("%-10s %9.4f %14d %14d %10d %9.4f %8.2f", k, r.hit_rate, r.saved, r.prompt_tokens,
        r.evictions, predicted[k].hit_rate, r.seconds))
end
print("(shadow: the hit rate each policy's shadow predicted while LRU served live)")

-- A switch halfway: LRU serves the first half with shadows beside it, then
-- the cost-aware policy is swapped in; compare the second half.
local half = math.floor(#reqs / 2)
local m = open_model()
local sh = require("tinyloop.policy.shadow").new {
    capacity_blocks = math.floor(info.kv_blocks_total / info.n_layer), block_size = info.kv_block_size,
    policies = { cost = V.cost, lru = V.lru } }
local rt = policy.eviction_runtime(m, { source = V.lru.source, name = "eviction" })
local sim_before
local r = trace.replay(m, reqs, tenants, op, {
    shadow = sh,
    on_request = function(idx)
        if idx == half + 1 then
            assert(rt:set_source(V.cost.source))
            sim_before = sh:report()
        end
    end,
})
local after = sh:report()
local function second(name)
    local a, b = after[name], sim_before[name]
    return (a.hit_tokens - b.hit_tokens) / math.max(1, a.prompt_tokens - b.prompt_tokens)
end
print(string.format("\nswitch LRU -> cost at request %d (reload #%d, %s):", half + 1, rt:counters().serial,
    rt:counters().version))
print(string.format("  second half, predicted by the cost shadow: %.4f; measured live after the switch: %.4f;"
    .. " LRU shadow (had we not switched): %.4f", second("cost"), second("live"), second("lru")))
print(string.format("  whole run live hit rate %.4f, %d prefill tokens saved", r.hit_rate, r.saved))
m:close()
if not opts.model then
    os.remove(model_path)
end
